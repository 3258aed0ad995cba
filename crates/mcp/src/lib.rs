//! ring0's MCP side: upstream connections and the downstream server, both protocol eras.
//!
//! ring0 serves MCP to any client (over stdio or Streamable HTTP) and is itself a client of the
//! MCP servers configured behind it. Every `tools/call` it receives becomes a round of the kernel:
//! validated against the tool's closed schema, authorized by the session's grants, committed to
//! the journal, dispatched, settled, and its result shaped before the client sees it. Upstream
//! tools are listed under their connection's alias (`alias__tool`), pinned by the hash of their
//! complete definition, and quarantined when that definition changes.
//!
//! This is the only crate that speaks MCP wire. It must never call a tool except through the
//! kernel, never let an upstream's annotations grant authority unless the upstream is configured
//! as trusted, and never forward an upstream's output to a client without shaping it.
//!
//! - [`gateway::Gateway`]: the catalog of built-in and upstream tools over one kernel, rebuilt
//!   when an upstream's listing changes;
//! - [`server::GatewayServer`]: one downstream MCP session (rmcp `ServerHandler`), served over
//!   stdio by [`serve_stdio`] or over HTTP by [`http::serve_http`];
//! - [`upstream::Upstream`]: one supervised upstream connection;
//! - [`pin`]: pins, the lock file, quarantine and approval; [`pin_review`]: the diff a person
//!   approving a definition sees, and the check that the server still serves it;
//! - [`lossless`]: tool listings and results as raw JSON past rmcp's typed model, over stdio and
//!   HTTP in both eras;
//! - [`project`]: the kernel's projection for MCP clients: every `tools/call` result is built
//!   from the call's receipt;
//! - [`route`]: per-call context (the client's relay, confirmation code, era) that travels with
//!   the call through the kernel;
//! - [`retry`]: what a client says about a call's identity across retries (idempotency key,
//!   scope);
//! - [`delivery`]: whether a call's result has left ring0 (stdio line flushed, HTTP body or SSE
//!   event sent), which decides whether an identical call is a retry or a repeat;
//! - [`tasks`]: background shell jobs and long upstream calls as MCP tasks;
//! - [`auth`]: who is calling over HTTP (static tokens, JWTs, protected-resource metadata);
//! - [`door`]: limits at the door: every client message checked before it is believed, the
//!   stdio transport, the HTTP listener's connection cap and timeouts, the session cap.

pub mod approval;
pub mod auth;
pub mod config;
pub mod delivery;
pub mod door;
pub mod forward;
pub mod gateway;
pub mod handoff;
pub mod http;
pub mod input;
pub mod limits;
pub mod log;
pub mod lossless;
pub mod mediate;
pub mod names;
pub mod passthrough;
pub mod pin;
pub mod pin_review;
pub mod project;
pub mod retry;
pub mod route;
pub mod rpc;
pub mod server;
pub mod stream_cut;
pub mod tasks;
pub mod trace;
pub mod upstream;

pub use config::{ToolOverride, UpstreamConfig};
pub use gateway::{Gateway, GatewayOptions};
pub use log::{Log, Severity};
pub use server::{GatewayServer, serve_stdio};
