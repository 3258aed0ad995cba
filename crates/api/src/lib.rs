//! The HTTP agent API of `ring0 serve --http`: model turns in, tool results out, for agents in
//! any language.
//!
//! Under `/v1`, on the same listener and behind the same bearer credentials as `/mcp`, a host
//! creates a session (its grants narrowed from its principal's), registers its own tools with
//! their runtime metadata, and hands ring0 each model turn in the provider's format (OpenAI
//! Chat Completions, OpenAI Responses, Anthropic Messages). Built-in and upstream tools run
//! inside ring0 through the kernel; host tools come back as pending actions (the prepared
//! arguments, the intent, its idempotency key, a deadline) that the host runs and reports; a
//! call a person must approve comes back pending as `approval_required`. Everything the kernel
//! does applies: validation errors the model can correct, authorization, approvals, epochs, the
//! journal, replay on retry, the repeat guard. The OpenAPI 3.1 document, generated from this
//! code, is served at `/v1/openapi.json`.
//!
//! The crate speaks HTTP and JSON only: MCP wire stays in `ring0-mcp`, whose gateway
//! (generation of tools, journal, grants) it runs over. It never runs a tool except through a
//! kernel round, and nothing a host says about a tool grants it authority: the operator's
//! grants decide, and a session's own grants only narrow them.
//!
//! - [`Api`]: the sessions and the routes ([`Api::routes`]);
//! - [`HostApprovals`]: the approval channel that asks an API call's host;
//! - `model`: every request and response body; `error`: the refusal envelope;
//! - `reads`: the calling principal's intents in the journal; `approvals`: its held calls, and
//!   an operator's decision of one; `jobs`: the background jobs a session's calls started;
//! - `limits`: every bound.

#![deny(missing_docs)]

pub mod approvals;
mod board;
pub mod error;
mod events;
mod host;
pub mod jobs;
pub mod limits;
pub mod model;
pub mod reads;
mod routes;
mod session;
mod turn;

pub use host::HostApprovals;

use axum::routing::{get, post};
use std::sync::Arc;
use utoipa::OpenApi;

/// The path prefix of the API.
pub const API_PREFIX: &str = "/v1";
/// Where the OpenAPI document is served.
pub const OPENAPI_PATH: &str = "/v1/openapi.json";

/// What the API runs over.
pub struct ApiOptions {
    /// The gateway whose tools, journal and grants every session uses.
    pub gateway: ring0_mcp::Gateway,
    /// Where shaped-away output is kept (read back with `read_spill`).
    pub spill: Option<Arc<ring0_shape::SpillStore>>,
    /// Sees every event of every API session (an operations host's metrics).
    pub observer: Option<Arc<dyn ring0_kernel::EventObserver>>,
    /// Whether a principal has the operator role, and so may decide held calls
    /// (`POST /v1/approvals/{id}`). `None`: nobody has it over the API.
    pub is_operator: Option<IsOperator>,
    /// Reads the background jobs of a session's scope (`GET /v1/sessions/{id}/jobs`). `None`:
    /// this server runs none, and every list is empty.
    pub jobs: Option<jobs::JobsOfScope>,
}

/// Whether a principal has the operator role.
pub type IsOperator = Arc<dyn Fn(&ring0_core::Principal) -> bool + Send + Sync>;

pub(crate) struct Inner {
    pub parts: session::KernelParts,
    pub sessions: session::Sessions,
    pub is_operator: IsOperator,
    pub jobs: Option<jobs::JobsOfScope>,
}

/// The API: its sessions and routes. Cheap to clone.
#[derive(Clone)]
pub struct Api {
    pub(crate) inner: Arc<Inner>,
}

/// The API's routes, split by the door each needs.
pub struct ApiRoutes {
    /// Behind the listener's authentication: the principal is read from the request.
    pub gated: axum::Router,
    /// Served to anyone who reaches the listener: the OpenAPI document.
    pub open: axum::Router,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "ring0 agent API", description = "Model turns in, tool results out: every call mediated by ring0's kernel."),
    paths(
        routes::create_session, routes::delete_session, routes::put_tools, routes::get_tools,
        routes::post_turn, routes::post_turn_stream, routes::get_turn, routes::post_outcomes, routes::events,
        reads::list_intents, reads::get_intent,
        approvals::list_approvals, approvals::decide_approval, jobs::list_jobs,
    ),
    modifiers(&BearerAuth),
    security(("bearer" = []), ()),
)]
struct ApiDoc;

/// Declares the bearer credential (`Authorization: Bearer …`) the listener checks.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// Whether a request is a streamed turn, whose body the listener hands on as it arrives: the
/// route reads it under bounds of its own (`limits::STREAM_*`).
pub fn streams_body(parts: &http::request::Parts) -> bool {
    parts.method == http::Method::POST
        && parts
            .uri
            .path()
            .strip_prefix("/v1/sessions/")
            .and_then(|rest| rest.strip_suffix("/turns/stream"))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

impl Api {
    /// The API over `options`' gateway.
    pub fn new(options: ApiOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                parts: session::KernelParts {
                    gateway: options.gateway,
                    spill: options.spill,
                    observer: options.observer,
                },
                sessions: Default::default(),
                is_operator: options.is_operator.unwrap_or_else(|| Arc::new(|_| false)),
                jobs: options.jobs,
            }),
        }
    }

    /// The OpenAPI 3.1 document of the API.
    pub fn openapi() -> serde_json::Value {
        serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serializes")
    }

    /// The routes, to be served on the MCP listener.
    pub fn routes(&self) -> ApiRoutes {
        let gated = axum::Router::new()
            .route("/v1/sessions", post(routes::create_session))
            .route(
                "/v1/sessions/{id}",
                axum::routing::delete(routes::delete_session),
            )
            .route(
                "/v1/sessions/{id}/tools",
                get(routes::get_tools).put(routes::put_tools),
            )
            .route("/v1/sessions/{id}/turns", post(routes::post_turn))
            .route(
                "/v1/sessions/{id}/turns/stream",
                post(routes::post_turn_stream),
            )
            .route("/v1/sessions/{id}/turns/{turn}", get(routes::get_turn))
            .route(
                "/v1/sessions/{id}/turns/{turn}/outcomes",
                post(routes::post_outcomes),
            )
            .route("/v1/sessions/{id}/events", get(routes::events))
            .route("/v1/sessions/{id}/jobs", get(jobs::list_jobs))
            .route("/v1/intents", get(reads::list_intents))
            .route("/v1/intents/{id}", get(reads::get_intent))
            .route("/v1/approvals", get(approvals::list_approvals))
            .route("/v1/approvals/{id}", post(approvals::decide_approval))
            .route("/v1/{*rest}", axum::routing::any(routes::no_route))
            .method_not_allowed_fallback(routes::no_method)
            .with_state(self.clone());
        let document = Self::openapi().to_string();
        let open = axum::Router::new().route(
            OPENAPI_PATH,
            get(move || {
                let document = document.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        document,
                    )
                }
            }),
        );
        ApiRoutes { gated, open }
    }
}
