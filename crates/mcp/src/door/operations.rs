//! The operations routes an operator's tools reach beside `/mcp`: liveness, readiness and
//! metrics, served by a front end that builds them (`ring0-ops`) on the same listener.
//!
//! Two kinds, with different doors: [`OperationsRoutes::open`] (`/healthz`, `/readyz`) answer
//! anyone who reaches the listener, since they tell nothing about calls and a probe carries no
//! credential; [`OperationsRoutes::gated`] (`/metrics`) pass the same authentication as `/mcp`;
//! [`OperationsRoutes::self_authenticated`] (the console) are handed the listener's
//! authenticator and check each request themselves (a bearer header, or a session cookie).
//! Both check the `Host` header against the names the MCP endpoint accepts, so a web page
//! cannot read them through a DNS-rebound name.

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header;
use std::sync::Arc;

/// Builds routes that authenticate each request themselves, from the listener's
/// authenticator (`None` when the listener serves without credentials, every client `local`):
/// the web console, whose browsers carry a session cookie rather than a bearer header.
pub type SelfAuthenticated =
    Arc<dyn Fn(Option<Arc<crate::auth::Authenticator>>) -> axum::Router + Send + Sync>;

/// The routes an operations host adds to the HTTP listener.
#[derive(Clone, Default)]
pub struct OperationsRoutes {
    /// Served without credentials: liveness and readiness.
    pub open: axum::Router,
    /// Served behind the listener's authentication: metrics.
    pub gated: axum::Router,
    /// Served with the listener's authenticator, each request authenticated by the routes
    /// themselves (see [`SelfAuthenticated`]).
    pub self_authenticated: Option<SelfAuthenticated>,
}

impl std::fmt::Debug for OperationsRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperationsRoutes").finish_non_exhaustive()
    }
}

/// Refuses a request whose `Host` (without its port) is not one of `hosts` with 421
/// (Misdirected Request): what the routes answer is meant for the names ring0 serves.
pub fn host_checked(router: axum::Router, hosts: Arc<[String]>) -> axum::Router {
    router.layer(middleware::from_fn(move |request: Request, next: Next| {
        let hosts = hosts.clone();
        async move {
            if host_allowed(&request, &hosts) {
                next.run(request).await
            } else {
                misdirected()
            }
        }
    }))
}

fn host_allowed(request: &Request, hosts: &[String]) -> bool {
    let Some(host) = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let name = host_name(host);
    hosts.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// The name of a `Host` value: `[::1]:8080` → `::1`, `localhost:80` → `localhost`.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

fn misdirected() -> Response {
    (
        StatusCode::MISDIRECTED_REQUEST,
        "this Host is not served here\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_lose_their_port_and_brackets() {
        assert_eq!(host_name("localhost:8080"), "localhost");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("[::1]:9"), "::1");
        assert_eq!(host_name("[::1]"), "::1");
    }
}
