//! The Streamable HTTP endpoint at `/mcp` (axum over rmcp's Streamable HTTP service).
//!
//! rmcp's service speaks both protocol eras: the sessionful 2025-06-18 / 2025-11-25 protocol
//! (`initialize`, `Mcp-Session-Id`, SSE streams) and the stateless 2026-07-28 protocol
//! (per-request `_meta`, `server/discover`, the `Mcp-*` headers and their mismatch errors), and it
//! checks `Host` against DNS rebinding. ring0 configures it explicitly rather than trusting its
//! defaults: loopback hosts only unless configured, browser `Origin`s checked against the allowed
//! list (loopback origins by default; requests without an `Origin`, as non-browser clients send,
//! pass). With credentials configured (see [`crate::auth`]), a gate in front of the service
//! authenticates every request and serves it as its principal: the session a request creates
//! acts for that principal, and a sessionful session answers only requests of the principal
//! that opened it (any other gets 404, as for a session that does not exist). Stateless
//! 2026-07-28 requests each act for their own credential's principal. Without credentials,
//! only loopback addresses are served and every client is `local`.
//! Tool listings and results leave as the raw JSON ring0 built: a response layer replaces the
//! typed stand-ins rmcp serializes (see [`crate::lossless`]) and reports each result delivered
//! once its body or event has been sent (see [`crate::delivery`]). On the way in, a request
//! layer lifts `params.idempotencyKey`, which rmcp's model drops, into the request's `_meta`
//! (see [`crate::retry`]).

use crate::approval::Approvals;
use crate::auth::{AuthConfig, Authenticator, METADATA_PATH, Unauthenticated};
use crate::gateway::Gateway;
use crate::limits::REQUEST_BODY_BYTES_MAX;
use crate::log::Log;
use crate::lossless::RawStash;
use crate::server::GatewayServer;
use crate::tasks::TaskTable;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use ring0_core::Principal;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";
/// Most sessionful sessions whose owner is remembered; the oldest is forgotten beyond (its
/// client then gets 404 and initializes again, as the protocol has it).
pub const SESSION_OWNERS_MAX: usize = 4096;
/// The session header of the sessionful protocol.
const SESSION_HEADER: &str = "mcp-session-id";

/// How the HTTP endpoint is exposed.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub addr: SocketAddr,
    /// `[auth]`: static tokens, JWTs, the resource and its authorization servers.
    pub auth: AuthConfig,
    /// A bearer token (from `--token-env`) that authenticates as the local user.
    pub local_token: Option<String>,
    /// The directory relative paths of `auth` are resolved against (the config file's).
    pub config_dir: PathBuf,
    /// Accepted `Host` values besides the loopback names (for a non-loopback bind).
    pub extra_hosts: Vec<String>,
    /// Accepted browser origins besides loopback ones.
    pub extra_origins: Vec<String>,
    /// `[http]`: timeouts, the connection cap and the session cap (see [`crate::door`]).
    pub door: crate::door::DoorConfig,
    /// Liveness, readiness and metrics routes served beside `/mcp`, if any (see
    /// [`crate::door::operations`]).
    pub operations: Option<crate::door::operations::OperationsRoutes>,
    /// More routes a front end serves beside `/mcp` (the HTTP agent API): `gated` behind the
    /// same authentication (each request's `Principal` in its extensions), `open` to anyone;
    /// both Host-checked.
    pub mounted: Option<Mounted>,
    /// What this replica shares with the others on a PostgreSQL journal, if any: sessionful
    /// sessions served by every replica ([`crate::door::shared`]), `requestState`s sealed with
    /// the deployment's key and retries handed to the replica that parked their call
    /// ([`crate::handoff`]), this replica's endpoint advertised to the others.
    pub deployment: Option<Arc<dyn ring0_journal::Deployment>>,
}

/// Routes a front end mounts on the listener beside `/mcp`.
#[derive(Clone, Default)]
pub struct Mounted {
    /// Served behind the listener's authentication.
    pub gated: axum::Router,
    /// Served without credentials.
    pub open: axum::Router,
    /// The requests whose body a route reads as a stream under its own bounds (see
    /// [`crate::door::listener::StreamsBody`]).
    pub streams_body: Option<crate::door::listener::StreamsBody>,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted").finish_non_exhaustive()
    }
}

impl HttpOptions {
    /// Whether any credential is configured (without one, only loopback binds are served).
    pub fn has_credentials(&self) -> bool {
        self.local_token.is_some() || self.auth.has_credentials()
    }
}

tokio::task_local! {
    /// The principal of the HTTP request being served: set by [`gate`] around the MCP service,
    /// read where that service creates the request's session.
    static CALLER: Principal;
}

/// The id of the principal of the HTTP request being served, when called inside the gate.
pub(crate) fn caller() -> Option<String> {
    CALLER.try_with(|p| p.id.clone()).ok()
}

/// Which principal opened each sessionful session: a request naming a session must carry a
/// credential of the same principal.
#[derive(Default)]
struct SessionOwners {
    owners: Mutex<(HashMap<String, String>, VecDeque<String>)>,
}

impl SessionOwners {
    fn owner(&self, session: &str) -> Option<String> {
        self.owners.lock().expect("owners").0.get(session).cloned()
    }

    fn bind(&self, session: &str, principal: &str) {
        let mut guard = self.owners.lock().expect("owners");
        let (map, order) = &mut *guard;
        if map
            .insert(session.to_string(), principal.to_string())
            .is_none()
        {
            order.push_back(session.to_string());
        }
        while map.len() > SESSION_OWNERS_MAX {
            let Some(oldest) = order.pop_front() else {
                break;
            };
            map.remove(&oldest);
        }
    }

    fn forget(&self, session: &str) {
        let mut guard = self.owners.lock().expect("owners");
        let (map, order) = &mut *guard;
        if map.remove(session).is_some() {
            order.retain(|s| s != session);
        }
    }
}

/// What the gate in front of `/mcp` needs.
struct Gate {
    auth: Option<Arc<Authenticator>>,
    owners: SessionOwners,
    /// The sessions every replica shares: with them, each request's session is checked against
    /// its shared record, not this replica's memory.
    shared: Option<Arc<crate::door::shared::SharedSessions>>,
    /// With shared sessions: what ends with a session its client deleted through this gate.
    session_end: Option<crate::gateway::SessionEnd>,
    log: Log,
}

/// Whether session `id` may serve `principal`: its opener, by the shared record when there is
/// one (another replica may have opened or deleted it), else by this replica's memory.
async fn session_admits(gate: &Gate, id: &str, principal: &str) -> Result<bool, Response> {
    let owner = match &gate.shared {
        None => gate.owners.owner(id),
        Some(shared) => match shared.find(id).await {
            Ok(record) => record.map(|r| r.principal),
            Err(why) => {
                gate.log
                    .line(&format!("the shared session store is unavailable: {why}"));
                return Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    Body::from("ring0: the session store is unavailable; retry\n"),
                )
                    .into_response());
            }
        },
    };
    match owner {
        Some(owner) if owner == principal => Ok(true),
        Some(_) => {
            gate.log.line(&format!(
                "refused a request of principal {principal} for another principal's session"
            ));
            Ok(false)
        }
        None => {
            gate.owners.forget(id);
            Ok(false)
        }
    }
}

fn unauthorized(auth: &Authenticator, why: &Unauthenticated) -> Response {
    let text = match why {
        Unauthenticated::Missing => "ring0: a bearer credential is required\n".to_string(),
        Unauthenticated::Invalid(w) => format!("ring0: the bearer credential is not valid: {w}\n"),
    };
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, auth.challenge(why))],
        Body::from(text),
    )
        .into_response()
}

fn unknown_session() -> Response {
    (
        StatusCode::NOT_FOUND,
        Body::from("ring0: unknown session; initialize a new one\n"),
    )
        .into_response()
}

/// Authenticates a request to `/mcp`, binds sessionful sessions to the principal that opened
/// them, and serves the request as that principal.
async fn gate(gate: Arc<Gate>, mut request: Request, next: Next) -> Response {
    let principal = match &gate.auth {
        None => Principal::local(),
        Some(auth) => {
            let header = request
                .headers()
                .get(header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            let result = auth.authenticate(header).await;
            for problem in auth.take_problems() {
                gate.log.line(&format!("auth: {problem}"));
            }
            match result {
                Ok(p) => p,
                Err(why) => return unauthorized(auth, &why),
            }
        }
    };
    let session = request
        .headers()
        .get(SESSION_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if let Some(id) = &session {
        match session_admits(&gate, id, &principal.id).await {
            Ok(true) => {}
            Ok(false) => return unknown_session(),
            Err(unavailable) => return unavailable,
        }
    }
    let deleting = request.method() == Method::DELETE;
    let id = principal.id.clone();
    request.extensions_mut().insert(principal.clone());
    let response = CALLER.scope(principal, next.run(request)).await;
    match &session {
        None => {
            if let Some(opened) = response.headers().get(SESSION_HEADER)
                && let Ok(opened) = opened.to_str()
            {
                gate.owners.bind(opened, &id);
                gate.log
                    .line(&format!("HTTP session opened for principal {id}"));
            }
        }
        Some(old) => {
            let deleted = deleting && response.status().is_success();
            if response.status() == StatusCode::NOT_FOUND || deleted {
                gate.owners.forget(old);
            }
            if deleted && let Some(end) = &gate.session_end {
                end(crate::server::session_scope_of(old.as_bytes()));
            }
            if deleted && response.status() == StatusCode::ACCEPTED {
                // rmcp answers an ended session with 202; the session is gone, not pending,
                // and clients (the Python SDK among them) take only 200 or 204 for success.
                return StatusCode::NO_CONTENT.into_response();
            }
        }
    }
    response
}

/// Lifts `params.idempotencyKey` of a POSTed `tools/call` into its `_meta` before rmcp decodes
/// it (see [`crate::retry::lift_wire_fields`]). The body is read up to
/// [`REQUEST_BODY_BYTES_MAX`], the bound rmcp is given as well.
async fn lift_request(request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, REQUEST_BODY_BYTES_MAX).await {
        Ok(b) => b,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                Body::from(format!(
                    "ring0: the request body is larger than {REQUEST_BODY_BYTES_MAX} bytes or                      could not be read\n"
                )),
            )
                .into_response();
        }
    };
    let body = match crate::retry::lift_wire_bytes(&bytes) {
        Some(lifted) => {
            parts
                .headers
                .insert(header::CONTENT_LENGTH, lifted.len().into());
            Body::from(lifted)
        }
        None => Body::from(bytes),
    };
    next.run(Request::from_parts(parts, body)).await
}

/// The axum router serving `/mcp` (and, with credentials, the protected-resource metadata).
/// `auth`: the credentials every request must carry; `None` serves everyone as `local`.
pub fn router(
    gw: Gateway,
    approvals: Arc<Approvals>,
    options: &HttpOptions,
    auth: Option<Arc<Authenticator>>,
    log: Log,
    shutdown: CancellationToken,
) -> Result<axum::Router, String> {
    // The routes that authenticate themselves get the listener's authenticator.
    let self_auth = auth.clone();
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(options.extra_hosts.iter().cloned());
    let mut origins: Vec<String> = vec![
        "http://localhost:*".into(),
        "http://127.0.0.1:*".into(),
        "http://[::1]:*".into(),
    ];
    origins.extend(options.extra_origins.iter().cloned());
    let operations_hosts: Arc<[String]> = hosts.clone().into();
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_max_request_body_bytes(REQUEST_BODY_BYTES_MAX)
        .with_cancellation_token(shutdown.clone());
    let shared_sessions = options
        .deployment
        .as_ref()
        .map(|d| crate::door::shared::SharedSessions::new(d.clone(), &options.door, log.clone()));
    if let Some(shared) = &shared_sessions {
        config.session_store = Some(shared.clone());
    }
    let handoff = match &options.deployment {
        Some(d) => Some(Arc::new(crate::handoff::Handoff::new(
            gw.parked().clone(),
            d.clone(),
            log.clone(),
        )?)),
        None => None,
    };
    // One stash for every session: the response layer replaces the typed stand-ins the
    // sessions return by the raw results they stashed.
    let stash = RawStash::new();
    let sessions_stash = stash.clone();
    let tasks = TaskTable::new();
    if let Some(deployment) = &options.deployment {
        tasks.share(deployment.clone());
    }
    let shared = options.deployment.is_some();
    let session_end = gw.session_end().filter(|_| shared);
    let service = StreamableHttpService::new(
        move || {
            // Every request reaches the service through the gate, which names its principal;
            // a session without one is never created.
            let principal = CALLER.try_with(Principal::clone).map_err(|_| {
                std::io::Error::other("a session was requested without an authenticated principal")
            })?;
            let server = GatewayServer::new_session(gw.clone(), approvals.clone())
                .with_principal(principal)
                .with_raw_stash(sessions_stash.clone())
                .with_task_table(tasks.clone());
            // A shared session ends when its client deletes it, on whichever replica (the
            // gate reports it), not when one replica lets its copy go.
            Ok(if shared {
                server.ending_on_delete_only()
            } else {
                server
            })
        },
        crate::door::sessions::DoorSessions::start(&options.door, log.clone(), shutdown),
        config,
    );
    let resume_log = log.clone();
    let cuts = crate::stream_cut::CutStreams::default();
    let operations_gate = Arc::new(Gate {
        auth: auth.clone(),
        owners: SessionOwners::default(),
        shared: None,
        session_end: None,
        log: log.clone(),
    });
    let mounted_gate = Arc::new(Gate {
        auth: auth.clone(),
        owners: SessionOwners::default(),
        shared: None,
        session_end: None,
        log: log.clone(),
    });
    let gate_state = Arc::new(Gate {
        auth: auth.clone(),
        owners: SessionOwners::default(),
        shared: shared_sessions,
        session_end,
        log,
    });
    let mut app = axum::Router::new()
        .route_service(MCP_PATH, service)
        // Innermost: a cut ends rmcp's own stream, whose events then wait for the resume.
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            crate::stream_cut::layer(cuts.clone(), resume_log.clone(), req, next)
        }))
        .layer(middleware::from_fn(lift_request))
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            crate::lossless::rewrite_response(stash.clone(), req, next)
        }))
        // A retry of a call another replica parked goes there, once authenticated here.
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let handoff = handoff.clone();
            async move {
                match handoff {
                    Some(h) => crate::handoff::layer(h, req, next).await,
                    None => next.run(req).await,
                }
            }
        }))
        // Inside the gate: only an authenticated client's messages are read and answered.
        .layer(middleware::from_fn(crate::door::listener::admit_body))
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            gate(gate_state.clone(), req, next)
        }));
    if let Some(auth) = auth {
        let document = auth.metadata().to_string();
        let serve = move || {
            let document = document.clone();
            async move { ([(header::CONTENT_TYPE, "application/json")], document) }
        };
        app = app
            .route(METADATA_PATH, axum::routing::get(serve.clone()))
            .route(
                &format!("{METADATA_PATH}{MCP_PATH}"),
                axum::routing::get(serve),
            );
    }
    if let Some(mounted) = &options.mounted {
        use crate::door::operations::host_checked;
        let gated =
            mounted
                .gated
                .clone()
                .layer(middleware::from_fn(move |req: Request, next: Next| {
                    gate(mounted_gate.clone(), req, next)
                }));
        app = app
            .merge(host_checked(gated, operations_hosts.clone()))
            .merge(host_checked(mounted.open.clone(), operations_hosts.clone()));
    }
    if let Some(operations) = &options.operations {
        use crate::door::operations::host_checked;
        let gated =
            operations
                .gated
                .clone()
                .layer(middleware::from_fn(move |req: Request, next: Next| {
                    gate(operations_gate.clone(), req, next)
                }));
        if let Some(build) = &operations.self_authenticated {
            app = app.merge(host_checked(build(self_auth), operations_hosts.clone()));
        }
        app = app
            .merge(host_checked(gated, operations_hosts.clone()))
            .merge(host_checked(operations.open.clone(), operations_hosts));
    }
    Ok(app)
}

/// Binds and serves until `shutdown` is cancelled. Returns the bound address through `bound`.
/// Without any credential, only a loopback address is served.
pub async fn serve_http(
    gw: Gateway,
    approvals: Arc<Approvals>,
    options: HttpOptions,
    log: Log,
    shutdown: CancellationToken,
    bound: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    if !options.addr.ip().is_loopback() && !options.has_credentials() {
        return Err(format!(
            "{} is not a loopback address: serving beyond this machine needs credentials \
             ([auth] tokens or jwt, or --token-env)",
            options.addr
        ));
    }
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|e| format!("binding {}: {e}", options.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let auth = if options.has_credentials() {
        let default_resource = format!("http://{addr}{MCP_PATH}");
        let auth = Authenticator::new(
            &options.auth,
            options.local_token.clone(),
            &options.config_dir,
            &default_resource,
        )
        .await?;
        for problem in auth.take_problems() {
            log.line(&format!("auth: {problem}"));
        }
        log.line(&format!(
            "HTTP clients must authenticate; resource {} (metadata at {})",
            auth.resource(),
            auth.metadata_url()
        ));
        Some(Arc::new(auth))
    } else {
        None
    };
    if let Some(deployment) = &options.deployment {
        join_deployment(&gw, deployment.as_ref(), addr, &log).await?;
    }
    bound(addr);
    let app = router(gw, approvals, &options, auth, log.clone(), shutdown.clone())?;
    // ring0's own accept loop: connection cap, header and body timeouts (see crate::door).
    let streams = options.mounted.as_ref().and_then(|m| m.streams_body);
    crate::door::listener::serve_streaming(listener, app, &options.door, streams, log, shutdown)
        .await
}

/// The `requestState` key's purpose in the shared journal.
const REQUEST_STATE_KEY: &str = "mcp-request-state";

/// Seals `requestState`s with the deployment's shared key from now on and tells the other
/// replicas where this one listens. Without the shared key nothing is served: a state another
/// replica could not check would strand its call.
async fn join_deployment(
    gw: &Gateway,
    deployment: &dyn ring0_journal::Deployment,
    addr: SocketAddr,
    log: &Log,
) -> Result<(), String> {
    let key = deployment
        .shared_key(REQUEST_STATE_KEY)
        .await
        .map_err(|e| format!("the deployment's requestState key: {e}"))?;
    gw.parked()
        .share(crate::input::Seal::new(&key, deployment.replica()));
    if addr.ip().is_unspecified() {
        log.line(&format!(
            "listening on {addr}, an address other replicas cannot reach: retries of calls \
             parked here are not handed here from other replicas"
        ));
        return Ok(());
    }
    deployment
        .advertise(&format!("http://{addr}"))
        .await
        .map_err(|e| format!("advertising this replica's endpoint: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_owners_are_bounded_forgetting_the_oldest_first() {
        let owners = SessionOwners::default();
        for i in 0..SESSION_OWNERS_MAX + 2 {
            owners.bind(&format!("s{i}"), "alice");
        }
        assert_eq!(owners.owner("s0"), None);
        assert_eq!(owners.owner("s1"), None);
        assert_eq!(owners.owner("s2").as_deref(), Some("alice"));
        let last = format!("s{}", SESSION_OWNERS_MAX + 1);
        assert_eq!(owners.owner(&last).as_deref(), Some("alice"));
        owners.forget(&last);
        assert_eq!(owners.owner(&last), None);
    }

    #[test]
    fn a_session_keeps_the_principal_that_opened_it() {
        let owners = SessionOwners::default();
        owners.bind("s", "alice");
        owners.bind("s", "alice");
        assert_eq!(owners.owner("s").as_deref(), Some("alice"));
        assert_eq!(owners.owners.lock().unwrap().1.len(), 1);
    }
}
