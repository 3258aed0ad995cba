//! Tool definitions and results as raw JSON past rmcp's typed model.
//!
//! rmcp's typed `Tool` and `CallToolResult` drop what they do not model (a tool's `execution`,
//! new annotation hints, unknown top-level fields, content items of an unknown type), yet rmcp
//! is what speaks the protocol: sessions, SSE, era negotiation, the `Mcp-*` header checks. Its
//! Streamable HTTP service only accepts a typed `ServerHandler`, so ring0 keeps rmcp for all of
//! that and carries the raw JSON around it:
//!
//! 1. the handler builds the raw result, adapts it to the request's protocol era
//!    ([`adapt_to_era`]), puts it in the [`RawStash`] and returns rmcp a typed stand-in whose
//!    `_meta` names the stash entry ([`RAW_META_KEY`]);
//! 2. on the way out, the stand-in is replaced by the stashed JSON: over stdio in the transport
//!    ([`crate::door::stdio::DoorStdio`]); over HTTP in [`rewrite_response`], for `application/json` bodies and, event
//!    by event as they stream, for SSE `data:` events (events without the marker pass through
//!    untouched).
//!
//! The stand-in is the best typed rendering of the same result, so a response whose entry is gone
//! (evicted under [`RAW_STASH_ENTRIES_MAX`] / [`RAW_STASH_BYTES_MAX`], or older than
//! [`RAW_STASH_TTL`]) is still a valid result. Entries stay until they expire rather than being
//! consumed at first use, because rmcp may replay a cached SSE event to a client that resumes a
//! stream. Entry ids are random (128 bits): a marker an upstream forges names nothing.
//!
//! The stash is an encoding step of the response, not a path around the kernel: what it holds
//! is the call's result after projection (the kernel's projection of its receipt, see
//! [`crate::project`]), and its key travels inside the very response it belongs to, so two
//! clients' results cannot meet in it the way two calls with one call id could in a table keyed
//! by it. Carrying the raw JSON inside the stand-in instead (no stash) would send every result
//! through rmcp's serializer twice, and would leave a client whose event is past the HTTP
//! layer's bound with the wrapper rather than a valid typed result.

use crate::delivery::{DeliveringBody, Delivery};
use crate::limits::{
    CATALOG_TTL_MS, RAW_STASH_BYTES_MAX, RAW_STASH_ENTRIES_MAX, RAW_STASH_TTL, SSE_EVENT_BYTES_MAX,
};
use axum::body::Body;
use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::Stream;
use serde_json::{Map, Value, json};
use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

/// `_meta` key of a typed stand-in: the id of the raw JSON that replaces it.
pub const RAW_META_KEY: &str = "io.ring0/raw";

/// Which result a raw value is, for the era rules that differ between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawKind {
    ListTools,
    CallTool,
}

/// Adapts a raw result to the protocol era of the request it answers, as rmcp does for typed
/// results: 2026-07-28 requires `resultType`; older eras must not see `"complete"` there, nor a
/// non-object `outputSchema` or `structuredContent` (a non-object structured value moves to the
/// first text item, unless that item already holds it).
pub fn adapt_to_era(mut raw: Value, kind: RawKind, modern: bool) -> Value {
    let Some(obj) = raw.as_object_mut() else {
        return raw;
    };
    if modern {
        obj.entry("resultType")
            .or_insert_with(|| Value::String("complete".into()));
        if kind == RawKind::ListTools {
            // ring0 announces every change of its catalog (`list_changed`), so its listing may
            // be cached; `private`: what a listing holds depends on the caller's grants.
            obj.insert("ttlMs".into(), json!(CATALOG_TTL_MS));
            obj.insert("cacheScope".into(), json!("private"));
        }
        return raw;
    }
    if obj.get("resultType").and_then(Value::as_str) == Some("complete") {
        obj.remove("resultType");
    }
    match kind {
        RawKind::ListTools => {
            if let Some(tools) = obj.get_mut("tools").and_then(Value::as_array_mut) {
                for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
                    let object_schema = tool
                        .get("outputSchema")
                        .map(|s| s.get("type").and_then(Value::as_str) == Some("object"));
                    if object_schema == Some(false) {
                        tool.remove("outputSchema");
                    }
                }
            }
        }
        RawKind::CallTool => {
            if obj.get("structuredContent").is_some_and(|s| !s.is_object())
                && let Some(value) = obj.remove("structuredContent")
            {
                let content = obj
                    .entry("content")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Some(items) = content.as_array_mut() {
                    let already = items
                        .first()
                        .and_then(|i| i.get("text"))
                        .and_then(Value::as_str)
                        .and_then(|t| serde_json::from_str::<Value>(t).ok())
                        .is_some_and(|v| v == value);
                    if !already {
                        items.insert(0, json!({"type": "text", "text": value.to_string()}));
                    }
                }
            }
        }
    }
    raw
}

struct Entry {
    /// `None` for a result larger than the whole budget: its stand-in is answered, and the entry
    /// only carries the result's delivery.
    value: Option<Arc<Value>>,
    bytes: usize,
    at: Instant,
    /// Reported when the response carrying the result has left ring0 (see [`crate::delivery`]).
    delivery: Mutex<Option<Delivery>>,
}

#[derive(Default)]
struct StashInner {
    entries: HashMap<String, Entry>,
    /// Ids oldest first (an id whose entry is gone is skipped).
    order: VecDeque<String>,
    bytes: usize,
}

impl StashInner {
    fn evict_oldest(&mut self) {
        while let Some(id) = self.order.pop_front() {
            if let Some(e) = self.entries.remove(&id) {
                self.bytes -= e.bytes;
                return;
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some(id) = self.order.front() {
            match self.entries.get(id) {
                Some(e) if now.duration_since(e.at) < RAW_STASH_TTL => return,
                Some(_) => self.evict_oldest(),
                // Taken already: only its place in the order is left.
                None => {
                    self.order.pop_front();
                }
            }
        }
    }
}

/// Raw results waiting to replace their typed stand-ins, bounded in count, bytes and age.
pub struct RawStash {
    inner: Mutex<StashInner>,
    entries_max: usize,
    bytes_max: usize,
}

impl RawStash {
    /// A stash with the default bounds ([`RAW_STASH_ENTRIES_MAX`], [`RAW_STASH_BYTES_MAX`]).
    pub fn new() -> Arc<Self> {
        Self::with_limits(RAW_STASH_ENTRIES_MAX, RAW_STASH_BYTES_MAX)
    }

    pub fn with_limits(entries_max: usize, bytes_max: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(StashInner::default()),
            entries_max: entries_max.max(1),
            bytes_max,
        })
    }

    /// Keeps `raw` and returns its id. Older entries make room; one larger than the whole
    /// budget is not kept (its stand-in is answered).
    pub fn put(&self, raw: Value) -> Option<String> {
        self.put_delivering(raw, None)
    }

    /// [`RawStash::put`] with the result's delivery, reported by the response that carries it
    /// out. A result larger than the budget keeps only its delivery (its stand-in is answered).
    fn put_delivering(&self, raw: Value, delivery: Option<Delivery>) -> Option<String> {
        let mut bytes = serde_json::to_vec(&raw).map(|v| v.len()).unwrap_or(0);
        let value = if bytes > self.bytes_max {
            delivery.as_ref()?;
            bytes = 0;
            None
        } else {
            Some(Arc::new(raw))
        };
        let id = uuid::Uuid::new_v4().simple().to_string();
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.expire(now);
        if inner.order.len() > 2 * self.entries_max {
            let StashInner { order, entries, .. } = &mut *inner;
            order.retain(|id| entries.contains_key(id));
        }
        while !inner.entries.is_empty()
            && (inner.entries.len() >= self.entries_max || inner.bytes + bytes > self.bytes_max)
        {
            inner.evict_oldest();
        }
        inner.bytes += bytes;
        inner.order.push_back(id.clone());
        inner.entries.insert(
            id.clone(),
            Entry {
                value,
                bytes,
                at: now,
                delivery: Mutex::new(delivery),
            },
        );
        Some(id)
    }

    /// The entry's raw JSON (`None` inside when only its delivery is kept) and its delivery,
    /// which only the first response to carry the entry takes.
    #[allow(clippy::type_complexity)]
    fn get(&self, id: &str) -> Option<(Option<Arc<Value>>, Option<Delivery>)> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.expire(Instant::now());
        inner.entries.get(id).map(|e| {
            let delivery = e.delivery.lock().unwrap_or_else(|p| p.into_inner()).take();
            (e.value.clone(), delivery)
        })
    }

    #[allow(clippy::type_complexity)]
    fn take(&self, id: &str) -> Option<(Option<Arc<Value>>, Option<Delivery>)> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let entry = inner.entries.remove(id)?;
        inner.bytes -= entry.bytes;
        let delivery = entry
            .delivery
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        Some((entry.value, delivery))
    }

    /// Number of entries kept (for tests of the bounds).
    pub fn len(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stashes `raw` (already adapted to the era) and returns the typed stand-in: `fallback`
    /// (the best typed rendering) with the marker in its `_meta`.
    pub fn stand_in(&self, raw: Value, fallback: Value) -> Value {
        self.stand_in_delivering(raw, fallback, None)
    }

    /// [`RawStash::stand_in`] for a call's result, whose `delivery` the response that carries
    /// it out reports.
    pub fn stand_in_delivering(
        &self,
        raw: Value,
        mut fallback: Value,
        delivery: Option<Delivery>,
    ) -> Value {
        if let Some(id) = self.put_delivering(raw, delivery)
            && let Some(obj) = fallback.as_object_mut()
        {
            let meta = obj
                .entry("_meta")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(m) = meta.as_object_mut() {
                m.insert(RAW_META_KEY.into(), Value::String(id));
            }
        }
        fallback
    }

    /// Replaces a typed stand-in result by its raw JSON. Fields rmcp added to the stand-in for
    /// the era (cache hints of 2026-07-28 listings) are kept where the raw result has none.
    /// Returns whether `result` changed.
    pub fn substitute(&self, result: &mut Value) -> bool {
        self.substitute_with(result, false).0
    }

    /// [`RawStash::substitute`], forgetting the entry: for a transport that never sends a
    /// response twice (stdio).
    pub fn substitute_once(&self, result: &mut Value) -> bool {
        self.substitute_with(result, true).0
    }

    /// [`RawStash::substitute_once`], handing over the result's delivery for the transport to
    /// report once the response is out.
    pub fn substitute_once_delivering(&self, result: &mut Value) -> (bool, Option<Delivery>) {
        self.substitute_with(result, true)
    }

    fn substitute_with(&self, result: &mut Value, forget: bool) -> (bool, Option<Delivery>) {
        let Some(id) = result
            .get("_meta")
            .and_then(|m| m.get(RAW_META_KEY))
            .and_then(Value::as_str)
        else {
            return (false, None);
        };
        let entry = if forget { self.take(id) } else { self.get(id) };
        let Some((raw, delivery)) = entry else {
            return (false, None);
        };
        let Some(raw) = raw else {
            // Only the delivery was kept: the stand-in goes out, without the marker.
            if let Some(meta) = result.get_mut("_meta").and_then(Value::as_object_mut) {
                meta.remove(RAW_META_KEY);
            }
            return (true, delivery);
        };
        let mut out = (*raw).clone();
        if let (Some(out), Some(typed)) = (out.as_object_mut(), result.as_object()) {
            for (k, v) in typed {
                if k != "_meta" && !out.contains_key(k) {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
        *result = out;
        (true, delivery)
    }

    /// Substitutes in one serialized JSON-RPC message; `None` when it has nothing to replace.
    /// The result's delivery comes with the new bytes, for the body to report once sent.
    fn rewrite_message(&self, text: &[u8]) -> Option<(Vec<u8>, Option<Delivery>)> {
        memchr::memmem::find(text, RAW_META_KEY.as_bytes())?;
        let mut message: Value = serde_json::from_slice(text).ok()?;
        message.get("id")?;
        let result = message.get_mut("result")?;
        let (changed, delivery) = self.substitute_with(result, false);
        if !changed {
            return None;
        }
        Some((serde_json::to_vec(&message).ok()?, delivery))
    }

    /// Substitutes in one SSE event (its lines, without the blank line that ends it).
    fn rewrite_event(&self, event: &[u8]) -> Option<(Vec<u8>, Option<Delivery>)> {
        memchr::memmem::find(event, RAW_META_KEY.as_bytes())?;
        let text = std::str::from_utf8(event).ok()?;
        let mut data = String::new();
        let mut others: Vec<&str> = Vec::new();
        let mut has_data = false;
        for line in text.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if let Some(d) = line.strip_prefix("data:") {
                if has_data {
                    data.push('\n');
                }
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
                has_data = true;
            } else if !line.is_empty() {
                others.push(line);
            }
        }
        let (rewritten, delivery) = self.rewrite_message(data.as_bytes())?;
        let mut out = Vec::with_capacity(rewritten.len() + 64);
        for line in others {
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(&rewritten);
        out.push(b'\n');
        Some((out, delivery))
    }
}

/// The SSE body of one response with stand-ins replaced event by event. Only an event that is
/// still incomplete is held (at most [`SSE_EVENT_BYTES_MAX`]; a longer one is passed on as it is,
/// with its stand-in); a chunk of complete events without the marker is passed on unchanged.
struct SseRewrite<S> {
    inner: S,
    stash: Arc<RawStash>,
    pending: BytesMut,
    /// The current event outgrew the buffer: pass bytes through until it ends.
    passthrough: bool,
    done: bool,
    /// Deliveries of results in the chunk last handed to the connection: reported when it asks
    /// for more, which it does once it has taken that chunk.
    sent: Vec<Delivery>,
}

/// Offset just past the first event end (a blank line) at or after `from`, and its length.
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = memchr::memmem::find(buf, b"\n\n").map(|i| (i, 2));
    let crlf = memchr::memmem::find(buf, b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

impl<S> SseRewrite<S> {
    /// Everything complete in `pending`, rewritten where it carries the marker.
    fn drain_complete(&mut self) -> Option<Bytes> {
        let mut out = BytesMut::new();
        while let Some((at, sep)) = event_end(&self.pending) {
            let event = self.pending.split_to(at + sep);
            if self.passthrough {
                self.passthrough = false;
                out.extend_from_slice(&event);
                continue;
            }
            match self.stash.rewrite_event(&event[..at]) {
                Some((new, delivery)) => {
                    self.sent.extend(delivery);
                    out.extend_from_slice(&new);
                    out.extend_from_slice(b"\n");
                }
                None => out.extend_from_slice(&event),
            }
        }
        if self.pending.len() > SSE_EVENT_BYTES_MAX
            || (self.passthrough && !self.pending.is_empty())
        {
            self.passthrough = true;
            out.extend_from_slice(&self.pending.split());
        }
        (!out.is_empty()).then(|| out.freeze())
    }
}

impl<S, E> Stream for SseRewrite<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        for delivery in this.sent.drain(..) {
            delivery.delivered();
        }
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(chunk))) => {
                    // Fast path: nothing held, and the chunk is whole events without the marker.
                    if this.pending.is_empty()
                        && !this.passthrough
                        && (chunk.ends_with(b"\n\n") || chunk.ends_with(b"\r\n\r\n"))
                        && memchr::memmem::find(&chunk, RAW_META_KEY.as_bytes()).is_none()
                    {
                        return Poll::Ready(Some(Ok(chunk)));
                    }
                    this.pending.extend_from_slice(&chunk);
                    if let Some(out) = this.drain_complete() {
                        return Poll::Ready(Some(Ok(out)));
                    }
                }
                Poll::Ready(None) => {
                    this.done = true;
                    if !this.pending.is_empty() {
                        return Poll::Ready(Some(Ok(this.pending.split().freeze())));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}

/// Middleware of the `/mcp` route: replaces typed stand-ins in the response by their raw JSON.
pub async fn rewrite_response(stash: Arc<RawStash>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if content_type.starts_with("text/event-stream") {
        let (parts, body) = response.into_parts();
        let stream = SseRewrite {
            inner: body.into_data_stream(),
            stash,
            pending: BytesMut::new(),
            passthrough: false,
            done: false,
            sent: Vec::new(),
        };
        return Response::from_parts(parts, Body::from_stream(stream));
    }
    if content_type.starts_with("application/json") {
        let (mut parts, body) = response.into_parts();
        // A JSON response is one message rmcp already holds whole in memory.
        let bytes = match axum::body::to_bytes(body, usize::MAX).await {
            Ok(b) => b,
            Err(e) => {
                return Response::builder()
                    .status(500)
                    .body(Body::from(format!("ring0: reading the response: {e}")))
                    .unwrap_or_default();
            }
        };
        return match stash.rewrite_message(&bytes) {
            Some((new, delivery)) => {
                parts.headers.remove(header::CONTENT_LENGTH);
                let body = match delivery {
                    Some(d) => Body::new(DeliveringBody::new(Bytes::from(new), d)),
                    None => Body::from(new),
                };
                Response::from_parts(parts, body)
            }
            None => Response::from_parts(parts, Body::from(bytes)),
        };
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool_with_unknown_fields() -> Value {
        json!({"tools": [{"name": "t", "inputSchema": {"type": "object"},
                          "execution": {"taskSupport": "optional"},
                          "annotations": {"readOnlyHint": true, "futureHint": 3},
                          "x-vendor": {"kept": true}}]})
    }

    #[test]
    fn a_stand_in_is_replaced_by_the_raw_json_with_era_fields_kept() {
        let stash = RawStash::new();
        let raw = adapt_to_era(tool_with_unknown_fields(), RawKind::ListTools, true);
        let typed = json!({"tools": [{"name": "t", "inputSchema": {"type": "object"}}],
                           "ttlMs": 0, "cacheScope": "private"});
        let mut result = stash.stand_in(raw, typed);
        assert!(stash.substitute(&mut result));
        assert_eq!(result["tools"][0]["execution"]["taskSupport"], "optional");
        assert_eq!(result["tools"][0]["annotations"]["futureHint"], 3);
        assert_eq!(result["resultType"], "complete");
        assert_eq!(result["ttlMs"], CATALOG_TTL_MS);
        assert_eq!(result["cacheScope"], "private");
        assert!(result.get("_meta").is_none(), "{result}");
    }

    #[test]
    fn older_eras_get_no_result_type_and_object_structured_content() {
        let raw = json!({"resultType": "complete", "content": [], "structuredContent": [1, 2]});
        let out = adapt_to_era(raw, RawKind::CallTool, false);
        assert!(out.get("resultType").is_none());
        assert!(out.get("structuredContent").is_none());
        assert_eq!(out["content"][0]["text"], "[1,2]");
    }

    #[test]
    fn a_stdio_substitution_forgets_its_entry() {
        let stash = RawStash::new();
        let mut result = stash.stand_in(json!({"content": [], "x": 1}), json!({"content": []}));
        assert!(stash.substitute_once(&mut result));
        assert_eq!(result["x"], 1);
        assert!(stash.is_empty());
    }

    #[test]
    fn a_forged_marker_names_nothing() {
        let stash = RawStash::new();
        let mut result = json!({"content": [], "_meta": {RAW_META_KEY: "0123"}});
        let before = result.clone();
        assert!(!stash.substitute(&mut result));
        assert_eq!(result, before);
    }

    #[test]
    fn the_stash_is_bounded_in_entries_and_keeps_the_newest() {
        let stash = RawStash::with_limits(8, 1 << 20);
        let ids: Vec<String> = (0..20).filter_map(|i| stash.put(json!({"n": i}))).collect();
        assert_eq!(stash.len(), 8);
        assert!(stash.get(&ids[19]).is_some());
        assert!(stash.get(&ids[0]).is_none());
    }

    #[test]
    fn taken_entries_do_not_cost_live_ones_their_place() {
        let stash = RawStash::with_limits(4, 1 << 20);
        let first = stash.put(json!(1)).unwrap();
        let kept = stash.put(json!(2)).unwrap();
        assert!(stash.take(&first).is_some());
        for i in 0..2 {
            stash.put(json!(i + 3));
        }
        assert!(stash.get(&kept).is_some());
        assert_eq!(stash.len(), 3);
    }

    #[test]
    fn the_stash_is_bounded_in_bytes() {
        let stash = RawStash::with_limits(100, 64);
        for _ in 0..10 {
            stash.put(Value::String("x".repeat(20)));
        }
        // Each entry is 22 bytes serialized: two fit in 64.
        assert_eq!(stash.len(), 2);
    }

    #[test]
    fn a_result_larger_than_the_whole_budget_is_not_kept() {
        let stash = RawStash::with_limits(100, 64);
        assert!(stash.put(Value::String("x".repeat(100))).is_none());
        assert!(stash.is_empty());
    }

    async fn sse(stash: &Arc<RawStash>, chunks: Vec<&'static [u8]>) -> Vec<u8> {
        let inner = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::convert::Infallible>(Bytes::from_static(c))),
        );
        let rewrite = SseRewrite {
            inner,
            stash: stash.clone(),
            pending: BytesMut::new(),
            passthrough: false,
            done: false,
            sent: Vec::new(),
        };
        let out: Vec<Result<Bytes, _>> = futures::StreamExt::collect::<Vec<_>>(rewrite).await;
        out.into_iter().flat_map(|c| c.unwrap().to_vec()).collect()
    }

    #[tokio::test]
    async fn sse_events_split_across_chunks_are_rewritten_and_others_pass_unchanged() {
        let stash = RawStash::new();
        let id = stash
            .put(json!({"content": [{"type": "widget", "w": 1}]}))
            .unwrap();
        let event = format!(
            "id: 0/1\ndata: {{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{{\"content\":[],\"_meta\":{{\"{RAW_META_KEY}\":\"{id}\"}}}}}}\n\n"
        );
        let event: &'static [u8] = Box::leak(event.into_bytes().into_boxed_slice());
        let (a, b) = event.split_at(20);
        let out = sse(&stash, vec![b"data:\n\n", b": keep-alive\n\n", a, b]).await;
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("data:\n\n: keep-alive\n\nid: 0/1\ndata: "),
            "{text}"
        );
        let data = text.split("data: ").nth(1).unwrap().trim();
        let message: Value = serde_json::from_str(data).unwrap();
        assert_eq!(message["result"]["content"][0]["type"], "widget");
        assert_eq!(message["id"], 3);
    }

    fn counted() -> (Delivery, Arc<std::sync::atomic::AtomicUsize>) {
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let m = n.clone();
        let d = Delivery::new(move || {
            m.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        (d, n)
    }

    fn result_event(stash: &RawStash, delivery: Delivery) -> Bytes {
        let marked = stash.stand_in_delivering(
            json!({"content": []}),
            json!({"content": []}),
            Some(delivery),
        );
        let id = marked["_meta"][RAW_META_KEY].as_str().unwrap().to_string();
        Bytes::from(format!(
            "data: {{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{\"content\":[],\"_meta\":{{\"{RAW_META_KEY}\":\"{id}\"}}}}}}\n\n"
        ))
    }

    fn rewrite(
        stash: &Arc<RawStash>,
        chunk: Bytes,
    ) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + Unpin {
        SseRewrite {
            inner: futures::stream::iter(vec![Ok(chunk)]),
            stash: stash.clone(),
            pending: BytesMut::new(),
            passthrough: false,
            done: false,
            sent: Vec::new(),
        }
    }

    #[tokio::test]
    async fn an_sse_result_is_delivered_once_the_connection_asks_for_more_after_its_event() {
        use futures::StreamExt;
        let stash = RawStash::new();
        let (delivery, fired) = counted();
        let mut events = rewrite(&stash, result_event(&stash, delivery));
        assert!(events.next().await.is_some());
        assert_eq!(fired.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(events.next().await.is_none());
        assert_eq!(fired.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_sse_stream_dropped_before_its_result_event_was_taken_delivers_nothing() {
        use futures::StreamExt;
        let stash = RawStash::new();
        let (delivery, fired) = counted();
        let mut events = rewrite(&stash, result_event(&stash, delivery));
        let _event = events.next().await;
        drop(events);
        assert_eq!(fired.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[test]
    fn a_result_too_large_to_keep_still_carries_its_delivery() {
        let stash = RawStash::with_limits(100, 16);
        let (delivery, fired) = counted();
        let mut out = stash.stand_in_delivering(
            Value::String("x".repeat(64)),
            json!({"content": []}),
            Some(delivery),
        );
        let (changed, delivery) = stash.substitute_once_delivering(&mut out);
        assert!(changed);
        assert!(out["_meta"].get(RAW_META_KEY).is_none(), "{out}");
        delivery.unwrap().delivered();
        assert_eq!(fired.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
