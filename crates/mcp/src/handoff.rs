//! Handing a request to the replica that holds its call.
//!
//! Several `ring0 serve --http` replicas on one PostgreSQL journal sit behind a load balancer,
//! which may send a client's next request anywhere. A 2026-07-28 retry that answers an
//! `input_required` question must reach the round that asked it, which waits on the replica
//! that parked it (an upstream's question is an open request to that replica). The retry's
//! sealed `requestState` names that replica ([`crate::input::Seal`]); when it is another, live
//! one, this layer sends the request there as it came — the same method, body and credential —
//! and returns that replica's response as its own. The other replica authenticates and checks
//! the retry as if the client had reached it directly, so handing over grants nothing.
//!
//! Only a state whose seal is sound is handed over (a forged one is refused here, by the
//! ordinary path). A request that was handed over once is never handed over again
//! ([`HANDOFF_HEADER`]), and one whose replica stopped (its lease lapsed, or it cannot be
//! reached) is served here, which refuses it naming that replica, so the client calls again
//! from the start. Where each replica is reached is the endpoint it advertised in the shared
//! journal (`ring0_journal::Deployment::advertise`).

use crate::input::Parked;
use crate::limits::{HANDOFF_CONNECT_TIMEOUT, HANDOFF_WAIT, REQUEST_BODY_BYTES_MAX};
use crate::log::Log;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ring0_journal::Deployment;
use serde_json::Value;
use std::sync::Arc;

/// Marks a request one replica handed to another: it is served where it lands.
pub const HANDOFF_HEADER: &str = "x-ring0-handoff";

/// Request headers a handed-over request keeps: what the receiving replica checks and reads.
const KEPT_HEADERS: &[&str] = &[
    "authorization",
    "content-type",
    "accept",
    "mcp-protocol-version",
    "mcp-session-id",
    "mcp-method",
    "mcp-name",
    "traceparent",
    "tracestate",
    "origin",
];

/// What the layer needs: the parked calls' seal, the shared journal and a client.
#[derive(Clone)]
pub struct Handoff {
    parked: Parked,
    deployment: Arc<dyn Deployment>,
    client: reqwest::Client,
    log: Log,
}

impl Handoff {
    pub fn new(parked: Parked, deployment: Arc<dyn Deployment>, log: Log) -> Result<Self, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .connect_timeout(HANDOFF_CONNECT_TIMEOUT)
            .timeout(HANDOFF_WAIT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("building the handoff client: {e}"))?;
        Ok(Self {
            parked,
            deployment,
            client,
            log,
        })
    }

    /// The replica a POSTed body's `requestState` names, when it is sound and another one.
    fn owner_of(&self, body: &[u8]) -> Option<u64> {
        // Most requests carry no state: skip the parse.
        memchr::memmem::find(body, b"requestState")?;
        let message: Value = serde_json::from_slice(body).ok()?;
        if message.get("method").and_then(Value::as_str) != Some("tools/call") {
            return None;
        }
        let state = message.pointer("/params/requestState")?.as_str()?;
        self.parked.elsewhere(state)
    }

    /// Sends the request to `endpoint` and returns its response, or `None` when it could not
    /// be reached (the request is then served here).
    async fn send(
        &self,
        endpoint: &str,
        path: &str,
        parts: &axum::http::request::Parts,
        body: bytes::Bytes,
    ) -> Option<Response> {
        let mut request = self
            .client
            .post(format!("{endpoint}{path}"))
            .header(HANDOFF_HEADER, "1")
            .body(body);
        for name in KEPT_HEADERS {
            for value in parts.headers.get_all(*name) {
                request = request.header(*name, value.clone());
            }
        }
        let answer = match request.send().await {
            Ok(a) => a,
            Err(e) => {
                self.log
                    .line(&format!("handing a retry to {endpoint} failed: {e}"));
                return None;
            }
        };
        let mut response = Response::builder().status(answer.status().as_u16());
        for (name, value) in answer.headers() {
            let name = name.as_str();
            let kept =
                name == "content-type" || name == "cache-control" || name.starts_with("mcp-");
            if kept && let Ok(name) = HeaderName::from_bytes(name.as_bytes()) {
                response = response.header(name, value.as_bytes());
            }
        }
        response.body(Body::from_stream(answer.bytes_stream())).ok()
    }
}

/// The layer: a POSTed `tools/call` retry whose `requestState` another live replica parked
/// goes to that replica; everything else passes on unchanged.
pub async fn layer(handoff: Arc<Handoff>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST || request.headers().contains_key(HANDOFF_HEADER) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, REQUEST_BODY_BYTES_MAX).await {
        Ok(b) => b,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                Body::from(format!(
                    "ring0: the request body is larger than {REQUEST_BODY_BYTES_MAX} bytes or could not be read\n"
                )),
            )
                .into_response();
        }
    };
    if let Some(replica) = handoff.owner_of(&bytes) {
        match handoff.deployment.endpoint(replica).await {
            Ok(Some(endpoint)) => {
                let path = parts.uri.path().to_string();
                if let Some(response) = handoff.send(&endpoint, &path, &parts, bytes.clone()).await
                {
                    return response;
                }
            }
            Ok(None) => {}
            Err(e) => handoff
                .log
                .line(&format!("finding replica {replica} for a retry: {e}")),
        }
    }
    let mut parts = parts;
    parts
        .headers
        .insert(header::CONTENT_LENGTH, bytes.len().into());
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
