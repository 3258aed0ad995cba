//! Letting a downstream response stream close mid-call, for clients that resume it (SEP-1699).
//!
//! A sessionful server of 2025-11-25 may close the SSE stream of a POST before the response,
//! once it sent an event id; the client then polls: it opens a GET with `Last-Event-ID` and is
//! sent the rest. rmcp's Streamable HTTP service already keeps every event of a request's stream
//! and replays them on such a GET; what it lacks is a way for a handler to close the POST stream.
//!
//! This layer gives one: for a POST of a session whose protocol version is 2025-11-25 or later
//! (the clients that must poll), it puts a [`StreamCut`] into the request's extensions, where the
//! handler finds it (`http::request::Parts` in its context), and ends the response stream at an
//! event boundary when the cut is made — only after an event with an id went out, so the client
//! has something to resume from. The handler keeps running; what it sends after the cut waits in
//! rmcp's cache for the client's GET. rmcp forgets a request's stream once its response is sent,
//! so a call whose stream was cut holds its response until the client resumed
//! ([`StreamCut::wait_for_resume`], at most [`STREAM_RESUME_WAIT`]). ring0 makes the cut when an
//! upstream closes its own stream mid-call ([`crate::route::Downstream::poll_later`]), so its
//! client sees what it would have seen of the server directly.

use crate::log::Log;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// The first protocol version whose clients resume a stream the server closed (SEP-1699).
pub const POLLING_PROTOCOL_VERSION_MIN: &str = "2025-11-25";
/// Longest a call whose stream was cut holds its response for the client to resume. Past it the
/// response is sent to a stream nobody reads (the call's receipt stays in the journal).
pub const STREAM_RESUME_WAIT: Duration = Duration::from_secs(30);
/// Cut streams remembered at once for their resume; the oldest is forgotten beyond (its call
/// then waits out [`STREAM_RESUME_WAIT`]).
pub const CUT_STREAMS_MAX: usize = 1024;

/// Ends one POST's response stream at the next event boundary (see the module docs).
#[derive(Clone, Default)]
pub struct StreamCut {
    cut: CancellationToken,
    resumed: CancellationToken,
}

impl StreamCut {
    /// Asks for the stream to end; the client resumes it with `Last-Event-ID`.
    pub fn cut(&self) {
        self.cut.cancel();
    }

    /// The cut the layer attached to a request, if its client can resume.
    pub fn of(parts: &http::request::Parts) -> Option<Self> {
        parts.extensions.get::<Self>().cloned()
    }

    /// When the stream was cut, waits until the client resumed it (at most
    /// [`STREAM_RESUME_WAIT`]), so that what is sent next reaches the resumed stream.
    pub async fn wait_for_resume(&self) {
        if self.cut.is_cancelled() {
            let _ = tokio::time::timeout(STREAM_RESUME_WAIT, self.resumed.cancelled()).await;
        }
    }
}

/// A cut stream's key: its session and the last event id its client saw.
type CutKey = (String, String);

/// Streams that were cut, by [`CutKey`], until their client resumes them (oldest first in the
/// queue, for the bound).
#[derive(Clone, Default)]
pub struct CutStreams(Arc<Mutex<CutTable>>);

#[derive(Default)]
struct CutTable {
    by_key: HashMap<CutKey, StreamCut>,
    order: VecDeque<CutKey>,
}

impl CutStreams {
    fn remember(&self, key: CutKey, cut: StreamCut) {
        let mut table = self.0.lock().expect("cut streams");
        if table.by_key.insert(key.clone(), cut).is_none() {
            table.order.push_back(key);
        }
        while table.by_key.len() > CUT_STREAMS_MAX {
            let Some(oldest) = table.order.pop_front() else {
                break;
            };
            table.by_key.remove(&oldest);
        }
    }

    fn take(&self, key: &CutKey) -> Option<StreamCut> {
        let mut table = self.0.lock().expect("cut streams");
        let cut = table.by_key.remove(key)?;
        table.order.retain(|k| k != key);
        Some(cut)
    }
}

/// Whether a request's client resumes a stream the server closes: a POST of a session (it
/// names one) at [`POLLING_PROTOCOL_VERSION_MIN`] or later that accepts an event stream.
fn resumes(request: &Request) -> bool {
    let headers = request.headers();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    request.method() == Method::POST
        && text("mcp-session-id").is_some()
        && text("mcp-protocol-version")
            .is_some_and(|v| v.len() == 10 && v >= POLLING_PROTOCOL_VERSION_MIN)
        && text(header::ACCEPT.as_str()).is_some_and(|a| a.contains("text/event-stream"))
}

/// The layer in front of rmcp's service (see the module docs).
pub async fn layer(cuts: CutStreams, log: Log, mut request: Request, next: Next) -> Response {
    let header_text = |request: &Request, name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let session = header_text(&request, "mcp-session-id");
    if request.method() == Method::GET
        && let (Some(session), Some(last)) = (&session, header_text(&request, "last-event-id"))
    {
        log.line(&format!(
            "a client resumes its response stream after event {last:?}"
        ));
        let resumed = cuts.take(&(session.clone(), last));
        // rmcp attaches the new stream before it answers the GET: only then may the call
        // whose stream this is send what it held back.
        let response = next.run(request).await;
        if let Some(cut) = resumed {
            cut.resumed.cancel();
        }
        return response;
    }
    let (true, Some(session)) = (resumes(&request), session) else {
        return next.run(request).await;
    };
    let cut = StreamCut::default();
    request.extensions_mut().insert(cut.clone());
    let response = next.run(request).await;
    let is_stream = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    if !is_stream {
        return response;
    }
    let (parts, body) = response.into_parts();
    let events = Cutting {
        inner: Box::pin(body.into_data_stream()),
        cut_made: Box::pin(cut.cut.clone().cancelled_owned()),
        cut,
        last_id: None,
        ended: false,
        session,
        cuts,
    };
    Response::from_parts(parts, Body::from_stream(events))
}

/// A response body that ends when its cut is made, once an event id was sent.
struct Cutting {
    inner: Pin<Box<dyn Stream<Item = Result<Bytes, axum::Error>> + Send>>,
    cut_made: Pin<Box<WaitForCancellationFutureOwned>>,
    cut: StreamCut,
    /// The last event id that went out: the client resumes from it.
    last_id: Option<String>,
    ended: bool,
    session: String,
    cuts: CutStreams,
}

/// The id of an SSE frame's event (its `id:` line), if it has one.
fn event_id(frame: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(frame).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("id:"))
        .map(|id| id.trim_start_matches(' ').to_string())
        .filter(|id| !id.is_empty())
}

impl Stream for Cutting {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        // rmcp writes one event per frame, so ending between frames ends between events.
        if let Some(last) = self.last_id.clone()
            && self.cut_made.as_mut().poll(cx).is_ready()
        {
            self.ended = true;
            let (cuts, cut) = (self.cuts.clone(), self.cut.clone());
            cuts.remember((self.session.clone(), last), cut);
            return Poll::Ready(None);
        }
        let next = self.inner.poll_next_unpin(cx);
        if let Poll::Ready(Some(Ok(frame))) = &next
            && let Some(id) = event_id(frame)
        {
            self.last_id = Some(id);
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(version: &str, session: bool, accept: &str) -> Request {
        let mut b = Request::builder()
            .method(Method::POST)
            .uri("/mcp")
            .header("mcp-protocol-version", version)
            .header("accept", accept);
        if session {
            b = b.header("mcp-session-id", "s");
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn only_sessions_of_a_polling_era_that_take_event_streams_are_cut() {
        let sse = "application/json, text/event-stream";
        assert!(resumes(&post("2025-11-25", true, sse)));
        assert!(!resumes(&post("2025-06-18", true, sse)));
        assert!(!resumes(&post("2025-03-26", true, sse)));
        assert!(!resumes(&post("2025-11-25", false, sse)));
        assert!(!resumes(&post("2025-11-25", true, "application/json")));
        assert!(!resumes(&post("garbage-version", true, sse)));
    }

    #[tokio::test]
    async fn a_cut_ends_the_stream_after_an_event_with_an_id_and_is_resumed_from_it() {
        let frames: Vec<Result<Bytes, axum::Error>> = vec![
            Ok(Bytes::from_static(b"data: no id yet\n\n")),
            Ok(Bytes::from_static(b"id: 0/0\nretry: 3000\ndata:\n\n")),
            Ok(Bytes::from_static(b"id: 1/0\ndata: {\"later\":1}\n\n")),
        ];
        let cut = StreamCut::default();
        cut.cut();
        let cuts = CutStreams::default();
        let mut events = Cutting {
            inner: Box::pin(futures::stream::iter(frames)),
            cut_made: Box::pin(cut.cut.clone().cancelled_owned()),
            cut: cut.clone(),
            last_id: None,
            ended: false,
            session: "s".into(),
            cuts: cuts.clone(),
        };
        let mut seen = Vec::new();
        while let Some(frame) = events.next().await {
            seen.push(frame.unwrap());
        }
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen[1].starts_with(b"id: 0/0"));
        let resumed = cuts.take(&("s".into(), "0/0".into())).expect("remembered");
        resumed.resumed.cancel();
        // The call's response was held for the resume, which has come.
        tokio::time::timeout(Duration::from_secs(1), cut.wait_for_resume())
            .await
            .expect("no wait once resumed");
        assert!(cuts.take(&("s".into(), "0/0".into())).is_none());
    }

    #[tokio::test]
    async fn a_stream_never_cut_holds_nothing_back() {
        tokio::time::timeout(
            Duration::from_secs(1),
            StreamCut::default().wait_for_resume(),
        )
        .await
        .expect("no wait without a cut");
    }
}
