//! The Streamable HTTP endpoint at `/mcp` (axum over rmcp's Streamable HTTP service).
//!
//! rmcp's service speaks both protocol eras: the sessionful 2025-06-18 / 2025-11-25 protocol
//! (`initialize`, `Mcp-Session-Id`, SSE streams) and the stateless 2026-07-28 protocol
//! (per-request `_meta`, `server/discover`, the `Mcp-*` headers and their mismatch errors), and it
//! checks `Host` against DNS rebinding. ring0 configures it explicitly rather than trusting its
//! defaults: loopback hosts only unless configured, browser `Origin`s checked against the allowed
//! list (loopback origins by default; requests without an `Origin`, as non-browser clients send,
//! pass), and an optional bearer token checked here before the request reaches the service.
//! Tool listings and results leave as the raw JSON ring0 built: a response layer replaces the
//! typed stand-ins rmcp serializes (see [`crate::lossless`]).

use crate::approval::Approvals;
use crate::gateway::Gateway;
use crate::lossless::RawStash;
use crate::server::GatewayServer;
use crate::tasks::TaskTable;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";

/// How the HTTP endpoint is exposed.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub addr: SocketAddr,
    /// Required `Authorization: Bearer` token, if any.
    pub bearer_token: Option<String>,
    /// Accepted `Host` values besides the loopback names (for a non-loopback bind).
    pub extra_hosts: Vec<String>,
    /// Accepted browser origins besides loopback ones.
    pub extra_origins: Vec<String>,
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn check_bearer(token: Arc<String>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(t) if constant_time_eq(t.as_bytes(), token.as_bytes()) => next.run(request).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Body::from("ring0: a valid bearer token is required\n"),
        )
            .into_response(),
    }
}

/// The axum router serving `/mcp`.
pub fn router(
    gw: Gateway,
    approvals: Arc<Approvals>,
    options: &HttpOptions,
    shutdown: CancellationToken,
) -> axum::Router {
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(options.extra_hosts.iter().cloned());
    let mut origins: Vec<String> = vec![
        "http://localhost:*".into(),
        "http://127.0.0.1:*".into(),
        "http://[::1]:*".into(),
    ];
    origins.extend(options.extra_origins.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_cancellation_token(shutdown);
    // One stash for every session: the response layer replaces the typed stand-ins the
    // sessions return by the raw results they stashed.
    let stash = RawStash::new();
    let sessions_stash = stash.clone();
    let tasks = TaskTable::new();
    let service = StreamableHttpService::new(
        move || {
            Ok(GatewayServer::new_session(gw.clone(), approvals.clone())
                .with_raw_stash(sessions_stash.clone())
                .with_task_table(tasks.clone()))
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let mut app = axum::Router::new()
        .route_service(MCP_PATH, service)
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            crate::lossless::rewrite_response(stash.clone(), req, next)
        }));
    if let Some(token) = &options.bearer_token {
        let token = Arc::new(token.clone());
        app = app.layer(middleware::from_fn(move |req: Request, next: Next| {
            check_bearer(token.clone(), req, next)
        }));
    }
    app
}

/// Binds and serves until `shutdown` is cancelled. Returns the bound address through `bound`.
pub async fn serve_http(
    gw: Gateway,
    approvals: Arc<Approvals>,
    options: HttpOptions,
    shutdown: CancellationToken,
    bound: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|e| format!("binding {}: {e}", options.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    bound(addr);
    let app = router(gw, approvals, &options, shutdown.clone());
    // Without TCP_NODELAY, Nagle's algorithm and the peer's delayed ACK hold small responses
    // back by tens of milliseconds.
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(|e| format!("serving HTTP: {e}"))
}
