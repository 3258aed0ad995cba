//! Operating ring0: what a person who runs it for others reads from the outside.
//!
//! - [`metrics`]: Prometheus metrics named `ring0_*` (decisions, held approvals, intents by
//!   state, settlements, shaping, the repeat guard, upstreams, stage latencies), counted from
//!   the kernel's events and the policy's audit entries, and read from the journal and the
//!   gateway at scrape time.
//! - [`Operations`]: `/metrics`, `/healthz` (the process serves) and `/readyz` (the journal
//!   answers and every upstream not declared `optional` is connected), as routes on the MCP
//!   listener
//!   ([`Operations::routes`]) or on an address of their own for a stdio deployment
//!   ([`Operations::serve`]).
//! - [`approvals`]: `ring0 approve` / `ring0 deny` as a channel of a running server, beside
//!   the MCP client's.
//! - [`telemetry`]: where the kernel's and the gateway's `tracing` spans and events go: log
//!   lines on stderr (text or JSON), and traces over OTLP/HTTP when configured.
//! - [`operator`]: a person's settlement of what the journal could not settle (`ring0 journal
//!   resolve | compensate`), and [`control`], the channel that carries it to a running server.
//! - [`held`]: durable approvals — a held call recorded in the journal, decided there once,
//!   released after a restart — and [`webhook`], the channel that POSTs signed, one-time,
//!   expiring approve/deny links.
//! - [`console`]: the web console at `/console` for operators: held calls, dead letters, the
//!   journal.
//!
//! ```no_run
//! # async fn example(gateway: ring0_mcp::Gateway) {
//! use std::sync::Arc;
//! let metrics = Arc::new(ring0_ops::metrics::Metrics::new(std::time::Duration::from_secs(300)));
//! // The metrics observe the kernel (`GatewayOptions::observer`) and the audit log's tap; then:
//! let operations = Arc::new(ring0_ops::Operations::new(metrics, gateway));
//! let text = operations.render_metrics().await;
//! assert!(text.contains("ring0_calls_total") || text.contains("# EOF"));
//! # }
//! ```

pub mod approvals;
pub mod console;
pub mod control;
pub mod held;
pub mod html;
pub mod metrics;
pub mod operator;
pub mod telemetry;
pub mod webhook;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics::{Metrics, Snapshot, UpstreamVitals};
use ring0_mcp::Gateway;
use ring0_mcp::door::operations::{OperationsRoutes, host_checked};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Where metrics are served.
pub const METRICS_PATH: &str = "/metrics";
/// Liveness: 200 while the process serves HTTP.
pub const HEALTH_PATH: &str = "/healthz";
/// Readiness: 200 when the journal answers and every upstream not declared optional is
/// connected, else 503.
pub const READY_PATH: &str = "/readyz";
/// How long a scrape or a readiness probe waits for the journal before it says so.
pub const JOURNAL_CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// The content type of the Prometheus text exposition (OpenMetrics, which prometheus-client
/// writes: counters end in `_total` and the text ends in `# EOF`).
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The operations endpoints of one running ring0.
pub struct Operations {
    metrics: Arc<Metrics>,
    gateway: Gateway,
}

/// What `/readyz` found.
#[derive(Debug)]
pub struct Readiness {
    /// `None` when the journal answered, else why not.
    pub journal_problem: Option<String>,
    /// Each upstream as readiness sees it.
    pub upstreams: Vec<UpstreamReadiness>,
}

/// One upstream as readiness sees it.
#[derive(Debug)]
pub struct UpstreamReadiness {
    /// The upstream's alias.
    pub alias: String,
    /// Connected now.
    pub up: bool,
    /// Declared `optional = true`: ring0 is ready without it.
    pub optional: bool,
}

impl Readiness {
    /// Ready: the journal answers and no upstream ring0 needs is down (an optional one may
    /// be).
    pub fn is_ready(&self) -> bool {
        self.journal_problem.is_none() && self.upstreams.iter().all(|u| u.up || u.optional)
    }

    fn to_json(&self) -> serde_json::Value {
        let upstreams: serde_json::Map<String, serde_json::Value> = self
            .upstreams
            .iter()
            .map(|u| {
                let state = match (u.up, u.optional) {
                    (true, _) => "up",
                    (false, false) => "down",
                    (false, true) => "down (optional)",
                };
                (u.alias.clone(), json!(state))
            })
            .collect();
        json!({
            "ready": self.is_ready(),
            "journal": match &self.journal_problem {
                None => json!("ok"),
                Some(why) => json!(why),
            },
            "upstreams": upstreams,
        })
    }
}

impl Operations {
    pub fn new(metrics: Arc<Metrics>, gateway: Gateway) -> Self {
        Self { metrics, gateway }
    }

    /// The journal's records per state, within [`JOURNAL_CHECK_TIMEOUT`].
    async fn intents(&self) -> Result<Option<Vec<(ring0_core::IntentState, u64)>>, String> {
        let journal = self.gateway.journal().clone();
        match tokio::time::timeout(JOURNAL_CHECK_TIMEOUT, journal.count_by_state()).await {
            Ok(Ok(counts)) => Ok(counts),
            Ok(Err(e)) => Err(format!("the journal did not answer: {e}")),
            Err(_) => Err(format!(
                "the journal did not answer within {} ms",
                JOURNAL_CHECK_TIMEOUT.as_millis()
            )),
        }
    }

    fn upstreams(&self) -> Vec<UpstreamVitals> {
        self.gateway
            .upstreams()
            .iter()
            .map(|up| UpstreamVitals {
                alias: up.alias().to_string(),
                connected: up.is_connected(),
                starts: up.starts(),
            })
            .collect()
    }

    /// The Prometheus exposition now.
    pub async fn render_metrics(&self) -> String {
        let snapshot = Snapshot {
            intents: self.intents().await.ok().flatten(),
            upstreams: self.upstreams(),
        };
        self.metrics.render(&snapshot)
    }

    /// Whether ring0 can take calls now, and if not, why.
    pub async fn readiness(&self) -> Readiness {
        Readiness {
            journal_problem: self.intents().await.err(),
            upstreams: self
                .gateway
                .upstreams()
                .iter()
                .map(|up| UpstreamReadiness {
                    alias: up.alias().to_string(),
                    up: up.is_connected(),
                    optional: up.config.optional,
                })
                .collect(),
        }
    }

    /// The routes for the MCP listener: `/healthz` and `/readyz` open, `/metrics` behind the
    /// listener's authentication.
    pub fn routes(self: &Arc<Self>) -> OperationsRoutes {
        let open = axum::Router::new()
            .route(HEALTH_PATH, axum::routing::get(health))
            .route(READY_PATH, axum::routing::get(ready))
            .with_state(self.clone());
        let gated = axum::Router::new()
            .route(METRICS_PATH, axum::routing::get(scrape))
            .with_state(self.clone());
        OperationsRoutes {
            open,
            gated,
            self_authenticated: None,
        }
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `addr` of their own (a stdio deployment,
    /// which has no HTTP listener), until `shutdown`. The address must be a loopback one: these
    /// routes carry no authentication of their own. `bound` is told the address bound.
    pub async fn serve(
        self: Arc<Self>,
        addr: SocketAddr,
        log: ring0_mcp::Log,
        shutdown: CancellationToken,
        bound: impl FnOnce(SocketAddr),
    ) -> Result<(), String> {
        if !addr.ip().is_loopback() {
            return Err(format!(
                "the metrics address {addr} is not a loopback address: it serves without \
                 credentials; serve beyond this machine through `ring0 serve --http` with [auth]"
            ));
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("binding the metrics address {addr}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        bound(local);
        let routes = self.routes();
        let hosts: Arc<[String]> =
            vec!["localhost".into(), "127.0.0.1".into(), "::1".into()].into();
        let app = host_checked(routes.open.merge(routes.gated), hosts);
        let door = ring0_mcp::door::DoorConfig::default();
        ring0_mcp::door::listener::serve(listener, app, &door, log, shutdown).await
    }
}

async fn health() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        json!({"status": "ok"}).to_string(),
    )
        .into_response()
}

async fn ready(State(ops): State<Arc<Operations>>) -> Response {
    let readiness = ops.readiness().await;
    let status = if readiness.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        readiness.to_json().to_string(),
    )
        .into_response()
}

async fn scrape(State(ops): State<Arc<Operations>>) -> Response {
    (
        [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
        ops.render_metrics().await,
    )
        .into_response()
}
