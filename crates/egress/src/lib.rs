//! ring0's egress proxy: what a contained process reaches of the network.
//!
//! A sandboxed child runs in its own network namespace with only loopback. When its profile
//! allows egress, the sandbox opens a TCP listener on `127.0.0.1:<port>` inside that namespace
//! and hands it to ring0; [`EgressProxy::serve`] serves it. The child speaks HTTP CONNECT (for
//! HTTPS and any other TCP protocol) or plain HTTP with absolute URIs, as every `HTTP_PROXY`-aware
//! client does. For each request the proxy
//!
//! 1. reads one request head, within [`HEAD_BYTES_MAX`] and [`HEAD_TIMEOUT`];
//! 2. checks the destination against the [`EgressPolicy`] (exact host or `*.suffix`, port or
//!    `*`; nothing by default);
//! 3. resolves the name itself and refuses internal addresses (loopback, private, link-local…)
//!    unless the rule names them ([`address`]);
//! 4. hands the [`EgressDecision`] to the audit callback — a decision that cannot be recorded is
//!    a refusal — and only then connects (within [`CONNECT_TIMEOUT`]);
//! 5. tunnels bytes (CONNECT) or forwards the request with hop-by-hop headers removed, until
//!    both sides are done or [`IDLE_TIMEOUT`] passes with no traffic.
//!
//! A refusal is a `403` (or `400`, `431`, `501`, `502`, `503`) with an `X-Ring0-Egress-Reason`
//! header and a one-line body saying what was refused and why. At most [`CONNECTIONS_MAX`]
//! connections are served at once.
//!
//! ```no_run
//! use ring0_egress::{EgressPolicy, EgressProxy};
//! use std::sync::Arc;
//!
//! # async fn run(listener: std::net::TcpListener) -> std::io::Result<()> {
//! let policy = EgressPolicy::parse(&["crates.io:443", "*.crates.io:443"]).unwrap();
//! let proxy = EgressProxy::new(policy, Arc::new(|d: &ring0_egress::EgressDecision| {
//!     eprintln!("egress {:?} {} {}", d.verdict, d.method, d.target);
//!     Ok(())
//! }));
//! proxy.serve(listener, std::future::pending()).await
//! # }
//! ```

#![deny(missing_docs)]

pub mod address;
mod decision;
mod head;
mod policy;
mod proxy;

pub use address::{Resolve, SystemResolver};
pub use decision::{AuditFn, EgressDecision, Reason, Verdict};
pub use head::{HEAD_BYTES_MAX, HEADERS_MAX};
pub use policy::{
    AllowRule, EgressPolicy, HOST_BYTES_MAX, Host, HostPattern, PatternError, PortPattern,
    RULES_MAX, RuleMatch, Target,
};
pub use proxy::{
    CONNECT_TIMEOUT, CONNECTIONS_MAX, EgressLimits, EgressProxy, HEAD_TIMEOUT, IDLE_TIMEOUT,
    RELAY_BUFFER_BYTES, Serving,
};
