//! What the proxy decided about one request, as the audit callback receives it.

use serde::Serialize;
use std::net::SocketAddr;
use std::sync::Arc;

/// Allowed or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The request was carried out.
    Allowed,
    /// The request was refused.
    Denied,
}

/// Why a request was allowed or refused; its `as_str` is the `reason` of the audit record and
/// of the `X-Ring0-Egress` header of a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// A rule allows the host and port, and the address passed the check.
    Allowed,
    /// No rule names the host.
    HostNotAllowed,
    /// A rule names the host, none its port.
    PortNotAllowed,
    /// The name resolved only to internal addresses, and the rule does not name them.
    InternalAddress,
    /// The name did not resolve (in time).
    ResolveFailed,
    /// The request could not be read as HTTP/1.x.
    MalformedRequest,
    /// The request head exceeded the header limits.
    HeadersTooLarge,
    /// A form the proxy does not carry: an `https://` absolute URI (use CONNECT), an
    /// origin-form request, a chunked request body.
    Unsupported,
    /// Every connection slot is taken.
    Busy,
    /// The audit callback refused the record; the request is refused with it.
    AuditFailed,
}

impl Reason {
    /// The reason's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Allowed => "allowed",
            Reason::HostNotAllowed => "host_not_allowed",
            Reason::PortNotAllowed => "port_not_allowed",
            Reason::InternalAddress => "internal_address",
            Reason::ResolveFailed => "resolve_failed",
            Reason::MalformedRequest => "malformed_request",
            Reason::HeadersTooLarge => "headers_too_large",
            Reason::Unsupported => "unsupported",
            Reason::Busy => "busy",
            Reason::AuditFailed => "audit_failed",
        }
    }

    /// The HTTP status of a refusal for this reason.
    pub fn status(self) -> (u16, &'static str) {
        match self {
            Reason::Allowed => (200, "OK"),
            Reason::HostNotAllowed | Reason::PortNotAllowed | Reason::InternalAddress => {
                (403, "Forbidden")
            }
            Reason::AuditFailed => (403, "Forbidden"),
            Reason::ResolveFailed => (502, "Bad Gateway"),
            Reason::MalformedRequest => (400, "Bad Request"),
            Reason::HeadersTooLarge => (431, "Request Header Fields Too Large"),
            Reason::Unsupported => (501, "Not Implemented"),
            Reason::Busy => (503, "Service Unavailable"),
        }
    }
}

/// One decision: one per request the proxy reads (or fails to read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EgressDecision {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Allowed or refused.
    pub verdict: Verdict,
    /// Why.
    pub reason: Reason,
    /// `CONNECT`, or the method of a plain HTTP request; empty when none could be read.
    pub method: String,
    /// The destination as the client named it (`host:port`); empty when none could be read.
    pub target: String,
    /// The rule that allowed the request (or that named the host of an internal address).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The address connected to (allowed), or the internal address refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<SocketAddr>,
    /// A sentence for a person: what was refused and why.
    pub message: String,
}

/// Receives every decision before it takes effect. An error refuses the request (a decision
/// that cannot be recorded is not carried out).
pub type AuditFn = Arc<dyn Fn(&EgressDecision) -> Result<(), String> + Send + Sync>;
