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

/// A response carrying a typed stand-in, with the raw JSON in its place and the result's
/// delivery; any other message unchanged.
pub(crate) fn substitute(
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

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
}
