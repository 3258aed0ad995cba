//! The HTTP listener: ring0's own accept loop over hyper, so that what a socket may cost is
//! ring0's decision rather than a default.
//!
//! - **Connection cap.** At most `connections_max` connections are open. At the cap, a new
//!   connection closes the oldest one that is not serving a request (half-open, still sending
//!   its headers, or idle between keep-alive requests) before it is served; only when every
//!   connection is serving one is the new connection refused (closed at once). Thousands of
//!   half-open connections therefore push each other out while a client that sends its request
//!   is served.
//! - **Header-read timeout.** A connection that has not sent a request's headers within
//!   `header_read_timeout_ms` of being accepted (or of its previous response) is closed
//!   (hyper's own timer).
//! - **Body-read timeout and size.** A request body must arrive within `body_read_timeout_ms`
//!   (408 otherwise) and be at most [`CLIENT_MESSAGE_BYTES_MAX`] (413).
//! - `accept` failing (descriptors exhausted) pauses [`ACCEPT_RETRY_DELAY`] instead of spinning.

use super::DoorConfig;
use crate::limits::{ACCEPT_RETRY_DELAY, CLIENT_MESSAGE_BYTES_MAX, SHUTDOWN_GRACE};
use crate::log::Log;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

/// One open connection, as the cap sees it.
struct Conn {
    /// Requests it is serving now (a response still streaming counts).
    serving: AtomicUsize,
    /// Cancelled to close it.
    shed: CancellationToken,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Conns {
    open: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next: AtomicU64,
}

impl Conns {
    /// Room for one more connection: `Some` (its number and state) when admitted, after closing
    /// the oldest connection not serving a request if the cap is reached; `None` when every
    /// open connection is serving.
    fn admit(&self, max: usize) -> Option<(u64, Arc<Conn>)> {
        let mut open = self.open.lock().expect("connections");
        if open.len() >= max {
            let idle = open
                .iter()
                .find(|(_, c)| c.serving.load(Ordering::Acquire) == 0)
                .map(|(n, _)| *n)?;
            if let Some(c) = open.remove(&idle) {
                c.shed.cancel();
            }
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            serving: AtomicUsize::new(0),
            shed: CancellationToken::new(),
        });
        open.insert(n, conn.clone());
        Some((n, conn))
    }

    fn remove(&self, n: u64) {
        self.open.lock().expect("connections").remove(&n);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.lock().expect("connections").len()
    }
}

/// Counts one request as served until its response body is dropped.
struct Serving(Arc<Conn>);

impl Serving {
    fn new(conn: &Arc<Conn>) -> Self {
        conn.serving.fetch_add(1, Ordering::AcqRel);
        Self(conn.clone())
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.serving.fetch_sub(1, Ordering::AcqRel);
    }
}

fn plain(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = status;
    r
}

/// Which requests' bodies a route reads as a stream, under bounds of its own (an idle timeout,
/// a duration and a size), instead of whole within the listener's.
pub type StreamsBody = fn(&axum::http::request::Parts) -> bool;

/// Reads a request's body within the timeout and the size bound, then hands the request on; a
/// body `streams` names is handed on as it arrives.
async fn serve_one(
    mut app: axum::Router,
    request: Request<hyper::body::Incoming>,
    body_timeout: Duration,
    streams: Option<StreamsBody>,
    serving: Serving,
) -> Response<Body> {
    let (parts, body) = request.into_parts();
    if streams.is_some_and(|streams| streams(&parts)) {
        let response = match app.call(Request::from_parts(parts, Body::new(body))).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        return counted(response, serving);
    }
    let read = axum::body::to_bytes(Body::new(body), CLIENT_MESSAGE_BYTES_MAX);
    let bytes = match tokio::time::timeout(body_timeout, read).await {
        Err(_) => {
            return plain(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "ring0: the request body did not arrive within {} ms\n",
                    body_timeout.as_millis()
                ),
            );
        }
        Ok(Err(e)) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "ring0: the request body could not be read within {CLIENT_MESSAGE_BYTES_MAX} bytes: {e}\n"
                ),
            );
        }
        Ok(Ok(bytes)) => bytes,
    };
    let request = Request::from_parts(parts, Body::from(bytes));
    let response = match app.call(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    counted(response, serving)
}

/// The connection counts as serving until the response (an SSE stream, maybe) is done.
fn counted(response: Response<Body>, serving: Serving) -> Response<Body> {
    response.map(|inner| {
        Body::new(Counted {
            inner,
            _serving: serving,
        })
    })
}

/// A response body that keeps its connection counted as serving until it is dropped; frames
/// and size pass through unchanged (a sized body keeps its `Content-Length`).
struct Counted {
    inner: Body,
    _serving: Serving,
}

impl http_body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A middleware (inside the authentication gate) that puts every POSTed message through
/// [`super::admit`]: what it refuses is answered here and never reaches rmcp — a parse error or
/// an invalid request with 400 and the JSON-RPC error, anything else (bad params, a repeated
/// argument key) with 200 and the JSON-RPC response.
pub async fn admit_body(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response<Body> {
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, CLIENT_MESSAGE_BYTES_MAX).await {
        Ok(b) => b,
        Err(e) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("ring0: the request body could not be read: {e}\n"),
            );
        }
    };
    match super::admit(&bytes) {
        super::Admission::Answer(answer) => {
            let code = answer
                .pointer("/error/code")
                .and_then(serde_json::Value::as_i64);
            let status = match code {
                Some(crate::rpc::code::PARSE_ERROR | crate::rpc::code::INVALID_REQUEST) => {
                    StatusCode::BAD_REQUEST
                }
                _ => StatusCode::OK,
            };
            let mut r = Response::new(Body::from(answer.to_string()));
            *r.status_mut() = status;
            r.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            );
            r
        }
        super::Admission::Message(_) | super::Admission::Dropped => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
    }
}

/// Serves `app` on `listener` under `config` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    config: &DoorConfig,
    log: Log,
    shutdown: CancellationToken,
) -> Result<(), String> {
    serve_streaming(listener, app, config, None, log, shutdown).await
}

/// [`serve`], handing the bodies `streams` names on as they arrive.
pub async fn serve_streaming(
    listener: TcpListener,
    app: axum::Router,
    config: &DoorConfig,
    streams: Option<StreamsBody>,
    log: Log,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let conns = Arc::new(Conns::default());
    let mut refused_logged = false;
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    log.line(&format!("HTTP: accepting a connection failed: {e}; retrying"));
                    tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let Some((n, conn)) = conns.admit(config.connections_max) else {
            if !refused_logged {
                log.line(&format!(
                    "HTTP: {} connections are serving requests; refusing new ones until one finishes",
                    config.connections_max
                ));
                refused_logged = true;
            }
            drop(tcp);
            continue;
        };
        refused_logged = false;
        // Without TCP_NODELAY, Nagle's algorithm and the peer's delayed ACK hold small
        // responses back by tens of milliseconds.
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let body_timeout = config.body_read_timeout();
        let header_timeout = config.header_read_timeout();
        let conns = conns.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let state = conn.clone();
            let service = hyper::service::service_fn(move |request| {
                let serving = Serving::new(&state);
                let app = app.clone();
                async move {
                    Ok::<_, Infallible>(
                        serve_one(app, request, body_timeout, streams, serving).await,
                    )
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            let connection = builder.serve_connection(TokioIo::new(tcp), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = conn.shed.cancelled() => {}
                _ = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
                }
            }
            conns.remove(n);
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_connection_not_serving_makes_room() {
        let conns = Conns::default();
        let (a, ca) = conns.admit(2).unwrap();
        let _busy = Serving::new(&ca);
        let (b, cb) = conns.admit(2).unwrap();
        let (c, _) = conns.admit(2).unwrap();
        assert!(cb.shed.is_cancelled(), "the idle one is closed");
        assert!(!ca.shed.is_cancelled(), "the serving one is kept");
        assert_eq!(conns.len(), 2);
        assert!(b < c && a < b);
    }

    #[test]
    fn when_every_connection_is_serving_a_new_one_is_refused() {
        let conns = Conns::default();
        let (_, c) = conns.admit(1).unwrap();
        let _busy = Serving::new(&c);
        assert!(conns.admit(1).is_none());
    }
}
