//! Whether a call's result has left ring0.
//!
//! The kernel answers an identical call whose predecessor's result never reached the client
//! with that result (a retry), and runs it again once the result was delivered (a repeat). ring0
//! learns of a delivery only where the bytes leave: a [`Delivery`] rides with the result in the
//! response's [`crate::lossless::RawStash`] entry and fires
//! - over stdio, after the response line was written and flushed to stdout ([`StdioTransport`]);
//! - over Streamable HTTP, when the JSON body's last frame was taken by the HTTP connection
//!   ([`DeliveringBody`]) or the connection asked for more after the SSE event carrying the result
//!   (`crate::lossless`'s SSE rewrite);
//! - for a task, when `tasks/get` hands its result to the client.
//!
//! A connection that drops before that point leaves the result undelivered, so the client's
//! retry is answered with it rather than run again. A delivery that is never reported errs on
//! the side of a replay, never of a second effect.

use axum::body::Bytes;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Reports that one result reached its client. Dropped unfired, nothing is reported.
pub struct Delivery(Box<dyn FnOnce() + Send + Sync>);

impl Delivery {
    pub fn new(on_delivered: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self(Box::new(on_delivered))
    }

    /// The result has left ring0.
    pub fn delivered(self) {
        (self.0)()
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Delivery")
    }
}

/// A `tools/call`'s answer (its result, or the question it waits on) and, for a result, the
/// delivery to report once it has left ring0.
#[derive(Debug)]
pub struct Answer {
    pub value: serde_json::Value,
    pub delivery: Option<Delivery>,
}

impl From<serde_json::Value> for Answer {
    fn from(value: serde_json::Value) -> Self {
        Self {
            value,
            delivery: None,
        }
    }
}

/// A JSON response body that reports its result delivered once the HTTP connection has taken its
/// last frame. Its length is known, so the connection ends the body after that frame and drops
/// it: the drop after the frame was taken is the delivery. A connection that closed before never
/// takes the frame.
pub struct DeliveringBody {
    data: Option<Bytes>,
    len: u64,
    delivery: Option<Delivery>,
}

impl DeliveringBody {
    pub fn new(data: Bytes, delivery: Delivery) -> Self {
        Self {
            len: data.len() as u64,
            data: Some(data),
            delivery: Some(delivery),
        }
    }

    fn sent(&mut self) {
        if self.data.is_none()
            && let Some(d) = self.delivery.take()
        {
            d.delivered();
        }
    }
}

impl http_body::Body for DeliveringBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.data.take() {
            Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
            None => {
                self.sent();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

impl Drop for DeliveringBody {
    fn drop(&mut self) {
        self.sent();
    }
}

/// The stdio transport: rmcp's line transport over stdin/stdout, with `params.idempotencyKey`
/// lifted into `_meta` on the way in (see [`crate::retry`]) and, on the way out, the typed
/// stand-ins of tool listings and results replaced by their raw JSON (see [`crate::lossless`]),
/// each result's [`Delivery`] reported once its line was written and flushed.
pub struct StdioTransport<R, W>
where
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    inner: rmcp::transport::async_rw::AsyncRwTransport<rmcp::RoleServer, LiftingReader<R>, W>,
    stash: std::sync::Arc<crate::lossless::RawStash>,
}

impl<R, W> StdioTransport<R, W>
where
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    pub fn new(read: R, write: W, stash: std::sync::Arc<crate::lossless::RawStash>) -> Self {
        Self {
            inner: rmcp::transport::async_rw::AsyncRwTransport::new_server(
                LiftingReader::new(read),
                write,
            ),
            stash,
        }
    }
}

impl<R, W> rmcp::transport::Transport<rmcp::RoleServer> for StdioTransport<R, W>
where
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<rmcp::RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let (item, delivery) = substitute(&self.stash, item);
        let sending = self.inner.send(item);
        async move {
            sending.await?;
            // rmcp's line writer flushes every message it sends.
            if let Some(d) = delivery {
                d.delivered();
            }
            Ok(())
        }
    }

    fn receive(
        &mut self,
    ) -> impl Future<Output = Option<rmcp::service::RxJsonRpcMessage<rmcp::RoleServer>>> + Send
    {
        self.inner.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// A response carrying a typed stand-in, with the raw JSON in its place and the result's
/// delivery; any other message unchanged.
fn substitute(
    stash: &crate::lossless::RawStash,
    item: rmcp::service::TxJsonRpcMessage<rmcp::RoleServer>,
) -> (
    rmcp::service::TxJsonRpcMessage<rmcp::RoleServer>,
    Option<Delivery>,
) {
    use rmcp::model::{JsonRpcMessage, ServerResult};
    let JsonRpcMessage::Response(response) = &item else {
        return (item, None);
    };
    if !matches!(
        response.result,
        ServerResult::CallToolResult(_) | ServerResult::ListToolsResult(_)
    ) {
        return (item, None);
    }
    let Ok(mut value) = serde_json::to_value(&response.result) else {
        return (item, None);
    };
    let (changed, delivery) = stash.substitute_once_delivering(&mut value);
    if !changed {
        return (item, delivery);
    }
    let id = response.id.clone();
    let result = ServerResult::CustomResult(rmcp::model::CustomResult(value));
    (JsonRpcMessage::response(result, id), delivery)
}

/// Stdin with `params.idempotencyKey` of every `tools/call` line lifted into `_meta` (see
/// [`crate::retry::lift_wire_fields`]). Lines without the field pass through as they came; so
/// does a line longer than [`crate::limits::STDIO_LINE_BYTES_MAX`], for rmcp to refuse.
pub struct LiftingReader<R> {
    inner: R,
    /// The line being read (up to its newline).
    line: Vec<u8>,
    /// Bytes ready for the reader, from `out_at` on.
    out: Vec<u8>,
    out_at: usize,
    /// The current line outgrew the bound: pass its bytes through until it ends.
    passthrough: bool,
    eof: bool,
}

/// Bytes read from stdin at a time.
const STDIO_READ_CHUNK_BYTES: usize = 64 * 1024;

impl<R> LiftingReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            line: Vec::new(),
            out: Vec::new(),
            out_at: 0,
            passthrough: false,
            eof: false,
        }
    }

    fn finish_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        let body = line.strip_suffix(b"\n").unwrap_or(&line);
        match crate::retry::lift_wire_bytes(body) {
            Some(mut lifted) => {
                lifted.push(b'\n');
                self.out.extend_from_slice(&lifted);
            }
            None => self.out.extend_from_slice(&line),
        }
    }

    fn take_bytes(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let newline = memchr::memchr(b'\n', bytes);
            let take = newline.map_or(bytes.len(), |i| i + 1);
            let (part, rest) = bytes.split_at(take);
            bytes = rest;
            if self.passthrough {
                self.out.extend_from_slice(part);
                if newline.is_some() {
                    self.passthrough = false;
                }
                continue;
            }
            self.line.extend_from_slice(part);
            if newline.is_some() {
                self.finish_line();
            } else if self.line.len() > crate::limits::STDIO_LINE_BYTES_MAX {
                self.out.append(&mut self.line);
                self.passthrough = true;
            }
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for LiftingReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.out_at < this.out.len() {
                let n = (this.out.len() - this.out_at).min(buf.remaining());
                buf.put_slice(&this.out[this.out_at..this.out_at + n]);
                this.out_at += n;
                if this.out_at == this.out.len() {
                    this.out.clear();
                    this.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = vec![0u8; STDIO_READ_CHUNK_BYTES];
            let mut read = tokio::io::ReadBuf::new(&mut chunk);
            std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let filled = read.filled();
            if filled.is_empty() {
                // An unterminated last line is passed on as it came.
                this.eof = true;
                let rest = std::mem::take(&mut this.line);
                this.out.extend_from_slice(&rest);
                continue;
            }
            let filled = filled.to_vec();
            this.take_bytes(&filled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;

    fn counted() -> (Delivery, Arc<AtomicUsize>) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        (
            Delivery::new(move || {
                m.fetch_add(1, Ordering::SeqCst);
            }),
            n,
        )
    }

    #[test]
    fn a_body_dropped_before_its_frame_was_taken_is_not_delivered() {
        let (d, n) = counted();
        drop(DeliveringBody::new(Bytes::from_static(b"{}"), d));
        assert_eq!(n.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_body_whose_frame_was_taken_is_delivered_once() {
        use http_body_util_free::collect;
        let (d, n) = counted();
        let body = DeliveringBody::new(Bytes::from_static(b"{\"a\":1}"), d);
        assert_eq!(collect(body).await, b"{\"a\":1}");
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    /// Polls a body to its end, as a connection does.
    mod http_body_util_free {
        use super::*;
        pub async fn collect(mut body: DeliveringBody) -> Vec<u8> {
            let mut out = Vec::new();
            loop {
                let frame =
                    std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx))
                        .await;
                match frame {
                    Some(Ok(f)) => out.extend_from_slice(&f.into_data().unwrap()),
                    _ => break,
                }
                if http_body::Body::is_end_stream(&body) {
                    break;
                }
            }
            drop(body);
            out
        }
    }

    #[tokio::test]
    async fn stdin_lines_have_the_params_key_lifted_and_others_pass_unchanged() {
        let input = b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":1}\n\
            {\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"t\",\"idempotencyKey\":\"k\"}}\n\
            tail-without-newline"
            .to_vec();
        let mut reader = LiftingReader::new(std::io::Cursor::new(input));
        let mut out = String::new();
        reader.read_to_string(&mut out).await.unwrap();
        let lines: Vec<&str> = out.split('\n').collect();
        assert_eq!(
            lines[0],
            "{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":1}"
        );
        let call: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(
            call["params"]["_meta"][crate::retry::LIFTED_KEY_META_KEY],
            "k"
        );
        assert_eq!(lines[2], "tail-without-newline");
    }
}
