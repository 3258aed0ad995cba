//! W3C trace context on the MCP wire, and the span of a `tools/call`.
//!
//! A client may say which trace its request belongs to: `traceparent` (and `tracestate`) in
//! the request's `_meta`, as the MCP semantic conventions of OpenTelemetry place them, or in
//! the HTTP request's headers. The call's span ([`call_span`]) continues that trace, and each
//! upstream `tools/call` ring0 sends carries the context of the span it was sent from (the
//! kernel's `dispatch`) in its own `_meta` ([`upstream_meta`]), and over Streamable HTTP in
//! the request's `traceparent` / `tracestate` headers too ([`upstream_headers`]), so the
//! upstream's spans join the same trace.
//!
//! Spans here are `tracing` spans; whether they become OpenTelemetry spans, and where they
//! are exported, is decided by the host's subscriber (`ring0-ops`). Without one, nothing is
//! parented or propagated. A trace context grants nothing: it is read only to link spans,
//! checked strictly ([`TraceParent::parse`]) and bounded ([`TRACESTATE_BYTES_MAX`]); one
//! that does not parse starts a new trace.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use serde_json::{Map, Value};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `_meta` key (and HTTP header) carrying the W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The `_meta` key (and HTTP header) carrying the W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";
/// The longest `tracestate` accepted and passed on (the W3C limit a vendor must propagate);
/// a longer one is dropped whole, the `traceparent` kept.
pub const TRACESTATE_BYTES_MAX: usize = 512;
/// `traceparent` is `00-` + 32 + `-` + 16 + `-` + 2 characters.
const TRACEPARENT_BYTES: usize = 55;

/// A parsed W3C trace context: the remote parent of a span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    trace_id: TraceId,
    span_id: SpanId,
    flags: TraceFlags,
    state: Option<String>,
}

impl TraceParent {
    /// Parses `traceparent` (version `00`; a later version's first 55 characters, as the W3C
    /// specification asks) and, when it is bounded and printable, `tracestate`. `None` for
    /// anything malformed, an all-zero id, or version `ff`.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let tp = traceparent.trim();
        let version = tp.get(0..2)?;
        let exact = version == "00" && tp.len() == TRACEPARENT_BYTES;
        let later = version != "00"
            && version != "ff"
            && tp.len() >= TRACEPARENT_BYTES
            && (tp.len() == TRACEPARENT_BYTES || tp.as_bytes()[TRACEPARENT_BYTES] == b'-');
        if !(exact || later) || !is_lower_hex(version) {
            return None;
        }
        let mut parts = tp[..TRACEPARENT_BYTES].split('-');
        let (_, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, len: usize| s.len() == len && is_lower_hex(s);
        if !(hex(trace, 32) && hex(span, 16) && hex(flags, 2)) {
            return None;
        }
        let trace_id = TraceId::from_hex(trace)
            .ok()
            .filter(|t| *t != TraceId::INVALID)?;
        let span_id = SpanId::from_hex(span)
            .ok()
            .filter(|s| *s != SpanId::INVALID)?;
        let flags =
            TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8());
        let state = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= TRACESTATE_BYTES_MAX)
            .filter(|s| s.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .map(str::to_string);
        Some(Self {
            trace_id,
            span_id,
            flags,
            state,
        })
    }

    /// The first valid context among the request's `_meta` objects, then its HTTP headers.
    pub fn of_request(
        metas: &[Map<String, Value>],
        headers: Option<&http::HeaderMap>,
    ) -> Option<Self> {
        let from_meta = metas.iter().find_map(|m| {
            let tp = m.get(TRACEPARENT)?.as_str()?;
            Self::parse(tp, m.get(TRACESTATE).and_then(Value::as_str))
        });
        from_meta.or_else(|| {
            let headers = headers?;
            let tp = headers.get(TRACEPARENT)?.to_str().ok()?;
            let ts = headers.get(TRACESTATE).and_then(|v| v.to_str().ok());
            Self::parse(tp, ts)
        })
    }

    /// The 32 hex digits of the trace id.
    pub fn trace_id(&self) -> String {
        self.trace_id.to_string()
    }

    fn span_context(&self) -> SpanContext {
        let state = self
            .state
            .as_deref()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        SpanContext::new(self.trace_id, self.span_id, self.flags, true, state)
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Makes `span` a child of the remote `parent`. A subscriber without OpenTelemetry (or none)
/// has nothing to parent, which is not an error.
pub fn adopt(span: &Span, parent: &TraceParent) {
    let cx = opentelemetry::Context::new().with_remote_span_context(parent.span_context());
    let _ = span.set_parent(cx);
}

/// The W3C context of `span` as `_meta` entries (`traceparent`, and `tracestate` when there
/// is one), or nothing when the span is not traced.
pub fn context_of(span: &Span) -> Vec<(&'static str, String)> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return Vec::new();
    }
    let mut out = vec![(
        TRACEPARENT,
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8() & TraceFlags::SAMPLED.to_u8()
        ),
    )];
    let state = sc.trace_state().header();
    if !state.is_empty() && state.len() <= TRACESTATE_BYTES_MAX {
        out.push((TRACESTATE, state));
    }
    out
}

/// Adds the current span's trace context to an upstream request's `_meta`, replacing any
/// the request had: the upstream's parent is ring0's span, never what a client said.
pub fn upstream_meta(meta: &mut Map<String, Value>) {
    meta.remove(TRACEPARENT);
    meta.remove(TRACESTATE);
    for (key, value) in context_of(&Span::current()) {
        meta.insert(key.into(), Value::String(value));
    }
}

/// The W3C headers of a request ring0 sends an HTTP upstream: the trace context its `_meta`
/// carries ([`upstream_meta`] put ring0's own span there) as `traceparent` and `tracestate`, so
/// that proxies and servers that read the headers, not the body, join the same trace. Nothing
/// when the request carries no context or one that does not parse (never a header value that
/// was not checked).
pub fn upstream_headers(message: &Value) -> Vec<(&'static str, String)> {
    let Some(meta) = message.pointer("/params/_meta").and_then(Value::as_object) else {
        return Vec::new();
    };
    let Some(traceparent) = meta.get(TRACEPARENT).and_then(Value::as_str) else {
        return Vec::new();
    };
    let tracestate = meta.get(TRACESTATE).and_then(Value::as_str);
    let Some(parsed) = TraceParent::parse(traceparent, tracestate) else {
        return Vec::new();
    };
    let mut out = vec![(TRACEPARENT, traceparent.trim().to_string())];
    if let Some(state) = parsed.state {
        out.push((TRACESTATE, state));
    }
    out
}

/// What the MCP span of one `tools/call` is made of.
pub struct CallSpanInput<'a> {
    /// The tool the client named.
    pub tool: &'a str,
    /// The JSON-RPC request id.
    pub request_id: &'a str,
    /// The MCP session (its `Mcp-Session-Id`), when the request belongs to one.
    pub session_id: Option<&'a str>,
    /// The protocol version the client speaks.
    pub protocol_version: Option<&'a str>,
    /// Who the call acts for.
    pub principal: &'a str,
    /// `pipe` for stdio, `tcp` for HTTP.
    pub transport: &'static str,
}

/// The server span of one `tools/call`, on the MCP and GenAI semantic conventions: named
/// `tools/call {tool}`, the parent of the kernel's stage spans. The round fills in the intent
/// ([`record_receipt`]).
pub fn call_span(input: &CallSpanInput<'_>) -> Span {
    // The values are only evaluated when a subscriber wants the span.
    tracing::info_span!(
        "tools/call",
        otel.name = %format_args!("tools/call {}", input.tool),
        otel.kind = "server",
        mcp.method.name = "tools/call",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = input.tool,
        jsonrpc.request.id = input.request_id,
        mcp.session.id = input.session_id,
        mcp.protocol.version = input.protocol_version,
        network.transport = input.transport,
        ring0.principal = input.principal,
        ring0.intent.id = tracing::field::Empty,
        ring0.intent.state = tracing::field::Empty,
        ring0.disposition = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// What the round made of the call, on its span: the intent answering it and its state, how
/// it was answered, and the refusal's kind or the failure (never a message or a result).
pub fn record_receipt(span: &Span, receipt: &ring0_core::Receipt) {
    use ring0_core::receipt::CallOutcome;
    if let Some(id) = &receipt.intent_id {
        span.record("ring0.intent.id", id.as_str());
    }
    if let Some(state) = receipt.state {
        span.record("ring0.intent.state", state.as_str());
    }
    span.record("ring0.disposition", disposition(receipt.disposition));
    let error = match &receipt.outcome {
        CallOutcome::Completed { observation } if observation.is_error => Some("tool_error"),
        CallOutcome::Completed { .. } => None,
        CallOutcome::Failed {
            uncertain: true, ..
        } => Some("outcome_unknown"),
        CallOutcome::Failed { .. } => Some("tool_error"),
        CallOutcome::Rejected { rejection } => Some(rejection.status.as_str()),
    };
    if let Some(kind) = error {
        span.record("error.type", kind);
        span.record("otel.status_code", "ERROR");
    }
}

fn disposition(d: ring0_core::receipt::Disposition) -> &'static str {
    use ring0_core::receipt::Disposition as D;
    match d {
        D::Dispatched => "dispatched",
        D::Replayed => "replayed",
        D::Memoized => "memoized",
        D::Recovered => "recovered",
        D::Rejected => "rejected",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_is_read_and_anything_else_is_not() {
        let tp = TraceParent::parse(GOOD, Some("vendor=abc")).unwrap();
        assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.state.as_deref(), Some("vendor=abc"));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad, None), None, "{bad:?}");
        }
        // A later version may append fields after a dash.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-whatever";
        assert!(TraceParent::parse(later, None).is_some());
    }

    #[test]
    fn an_oversized_or_unprintable_tracestate_is_dropped_and_the_parent_kept() {
        let long = "k=".to_string() + &"v".repeat(TRACESTATE_BYTES_MAX);
        assert_eq!(TraceParent::parse(GOOD, Some(&long)).unwrap().state, None);
        assert_eq!(
            TraceParent::parse(GOOD, Some("k=\u{7}v")).unwrap().state,
            None
        );
    }

    #[test]
    fn meta_wins_over_the_http_header() {
        let mut meta = Map::new();
        meta.insert(TRACEPARENT.into(), Value::String(GOOD.into()));
        let mut headers = http::HeaderMap::new();
        headers.insert(
            TRACEPARENT,
            "00-11111111111111111111111111111111-2222222222222222-01"
                .parse()
                .unwrap(),
        );
        let tp = TraceParent::of_request(&[meta], Some(&headers)).unwrap();
        assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let tp = TraceParent::of_request(&[], Some(&headers)).unwrap();
        assert_eq!(tp.trace_id(), "11111111111111111111111111111111");
    }

    #[test]
    fn an_upstream_request_s_headers_carry_the_trace_context_of_its_meta_when_it_parses() {
        let request = |meta: Value| {
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                               "params": {"name": "t", "_meta": meta}})
        };
        let headers = upstream_headers(&request(serde_json::json!({
            TRACEPARENT: GOOD, TRACESTATE: "vendor=abc"
        })));
        assert_eq!(
            headers,
            vec![
                (TRACEPARENT, GOOD.to_string()),
                (TRACESTATE, "vendor=abc".to_string())
            ]
        );
        for meta in [
            serde_json::json!({}),
            serde_json::json!({TRACEPARENT: "00-zz\r\nx: y"}),
            serde_json::json!({TRACEPARENT: 7}),
        ] {
            assert!(upstream_headers(&request(meta)).is_empty());
        }
        let unprintable = upstream_headers(&request(serde_json::json!({
            TRACEPARENT: GOOD, TRACESTATE: "k=v\nx"
        })));
        assert_eq!(unprintable, vec![(TRACEPARENT, GOOD.to_string())]);
    }

    #[test]
    fn without_a_traced_span_nothing_is_sent_upstream() {
        let mut meta = Map::new();
        meta.insert(TRACEPARENT.into(), Value::String(GOOD.into()));
        upstream_meta(&mut meta);
        assert!(
            meta.get(TRACEPARENT).is_none(),
            "a client's context is never passed through"
        );
    }
}
