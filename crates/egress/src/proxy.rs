//! Serving a listener: one request per client connection, judged, audited, then tunnelled
//! (CONNECT) or forwarded (plain HTTP).
//!
//! Each connection is read up to one request head ([`crate::head`]), within a time and size
//! bound. The destination is checked against the policy, resolved by ring0 and its address
//! checked ([`crate::address`]); the decision goes to the audit callback before anything is
//! connected, and a refusal is answered with a status, an `X-Ring0-Egress-Reason` header and a
//! one-line reason. A plain HTTP request is forwarded in origin form with hop-by-hop headers
//! removed and `Connection: close` on both sides, so every request the client sends comes
//! through this check: a second request needs a new connection.

use crate::address::{Resolve, SystemResolver, is_internal};
use crate::decision::{AuditFn, EgressDecision, Reason, Verdict};
use crate::head::{self, Field, HeadError, RequestHead};
use crate::policy::{EgressPolicy, Host, RuleMatch, Target};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

/// Time a client has to send a whole request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time to resolve a name and connect to one of its addresses.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A tunnel or a forwarded exchange with no bytes either way for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Client connections served at once (tunnels included); one more is answered 503.
pub const CONNECTIONS_MAX: usize = 64;
/// Bytes relayed per read, per direction.
pub const RELAY_BUFFER_BYTES: usize = 16 * 1024;

/// The bounds a proxy works within; the defaults are the constants above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressLimits {
    /// See [`HEAD_TIMEOUT`].
    pub head_timeout: Duration,
    /// See [`CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
    /// See [`IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
    /// See [`CONNECTIONS_MAX`].
    pub connections_max: usize,
}

impl Default for EgressLimits {
    fn default() -> Self {
        Self {
            head_timeout: HEAD_TIMEOUT,
            connect_timeout: CONNECT_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            connections_max: CONNECTIONS_MAX,
        }
    }
}

/// An egress proxy over one policy. Cheap to clone; [`EgressProxy::serve`] runs it.
#[derive(Clone)]
pub struct EgressProxy {
    inner: Arc<Inner>,
}

struct Inner {
    policy: EgressPolicy,
    audit: AuditFn,
    resolver: Arc<dyn Resolve>,
    limits: EgressLimits,
    slots: Arc<Semaphore>,
}

/// A refusal on its way to the client and the audit log.
struct Refusal {
    reason: Reason,
    message: String,
    rule: Option<String>,
    address: Option<SocketAddr>,
}

impl Refusal {
    fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            rule: None,
            address: None,
        }
    }
}

/// What the request asks for, once read.
enum Ask {
    Tunnel,
    Forward {
        head: RequestHead,
        path: String,
        body_bytes: u64,
    },
}

impl EgressProxy {
    /// A proxy allowing what `policy` allows, handing every decision to `audit`, resolving with
    /// the system resolver, within the default limits.
    pub fn new(policy: EgressPolicy, audit: AuditFn) -> Self {
        Self::build(
            policy,
            audit,
            Arc::new(SystemResolver),
            EgressLimits::default(),
        )
    }

    /// The same proxy resolving names with `resolver`.
    pub fn with_resolver(self, resolver: Arc<dyn Resolve>) -> Self {
        let inner = &self.inner;
        Self::build(
            inner.policy.clone(),
            inner.audit.clone(),
            resolver,
            inner.limits,
        )
    }

    /// The same proxy within `limits`.
    pub fn with_limits(self, limits: EgressLimits) -> Self {
        let inner = &self.inner;
        Self::build(
            inner.policy.clone(),
            inner.audit.clone(),
            inner.resolver.clone(),
            limits,
        )
    }

    fn build(
        policy: EgressPolicy,
        audit: AuditFn,
        resolver: Arc<dyn Resolve>,
        limits: EgressLimits,
    ) -> Self {
        let slots = Arc::new(Semaphore::new(limits.connections_max.max(1)));
        Self {
            inner: Arc::new(Inner {
                policy,
                audit,
                resolver,
                limits,
                slots,
            }),
        }
    }

    /// Serves `listener` (a socket a sandbox handed over, e.g. from an `OwnedFd` with
    /// `TcpListener::from`) until `shutdown` completes; then every open connection is closed.
    /// Must run inside a tokio runtime. Fails only when the listener cannot be used.
    pub async fn serve(
        &self,
        listener: std::net::TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => {
                    // A failed accept (a peer that reset at once, descriptors exhausted) ends
                    // that connection only.
                    let Ok((client, _)) = accepted else { continue };
                    let inner = self.inner.clone();
                    connections.spawn(async move { inner.connection(client).await });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        // No new connection is taken while the open ones are closed.
        drop(listener);
        connections.shutdown().await;
        Ok(())
    }
}

/// A proxy serving one listener in the background ([`EgressProxy::spawn`]). Dropping it stops
/// the serving and closes every connection it opened.
#[derive(Debug)]
pub struct Serving {
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl EgressProxy {
    /// Serves `listener` on `runtime` until the returned [`Serving`] is dropped (tie it to the
    /// life of the process whose listener it is). Fails only when the listener cannot be used.
    pub fn spawn(
        &self,
        runtime: &tokio::runtime::Handle,
        listener: std::net::TcpListener,
    ) -> io::Result<Serving> {
        listener.set_nonblocking(true)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let proxy = self.clone();
        runtime.spawn(async move {
            // Ends when the sender is dropped (or sends).
            let _ = proxy
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Serving { _stop: stop })
    }
}

impl Inner {
    async fn connection(self: Arc<Self>, mut client: TcpStream) {
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            let refusal = Refusal::new(
                Reason::Busy,
                format!(
                    "{} connections are open, the most served at once",
                    self.limits.connections_max
                ),
            );
            self.refuse(&mut client, "", "", refusal).await;
            return;
        };
        let mut buf = Vec::new();
        let read = timeout(
            self.limits.head_timeout,
            head::read_head(&mut client, &mut buf),
        )
        .await;
        let head_len = match read {
            Ok(Ok(len)) => len,
            Ok(Err(HeadError::Closed | HeadError::Io(_))) if buf.is_empty() => return,
            Ok(Err(e)) => return self.refuse(&mut client, "", "", head_refusal(e)).await,
            Err(_) => {
                let message = format!(
                    "no complete request head within {} s",
                    self.limits.head_timeout.as_secs()
                );
                let refusal = Refusal::new(Reason::MalformedRequest, message);
                return self.refuse(&mut client, "", "", refusal).await;
            }
        };
        let request = match head::parse_request(&buf[..head_len]) {
            Ok(request) => request,
            Err(e) => return self.refuse(&mut client, "", "", head_refusal(e)).await,
        };
        let method = request.method.clone();
        let (target, ask) = match read_ask(request) {
            Ok(read) => read,
            Err((target, refusal)) => {
                return self.refuse(&mut client, &method, &target, refusal).await;
            }
        };
        let shown = target.to_string();
        let (addresses, rule) = match self.decide(&target).await {
            Ok(decided) => decided,
            Err(refusal) => return self.refuse(&mut client, &method, &shown, refusal).await,
        };
        let allowed = decision(
            Verdict::Allowed,
            &method,
            &shown,
            Reason::Allowed,
            "allowed",
        )
        .rule(Some(rule))
        .address(addresses.first().copied());
        if let Err(e) = (self.audit)(&allowed) {
            let refusal = Refusal::new(
                Reason::AuditFailed,
                format!("the decision could not be audited: {e}"),
            );
            return self
                .refuse_unaudited(&mut client, &method, &shown, &refusal)
                .await;
        }
        let upstream = match self.connect(&addresses).await {
            Ok(upstream) => upstream,
            Err(e) => {
                let text = format!(
                    "ring0 egress: {method} {shown} was allowed, but connecting failed: {e}\n"
                );
                let _ = answer(&mut client, 502, "Bad Gateway", "connect_failed", &text).await;
                return;
            }
        };
        let rest = buf.split_off(head_len);
        let _ = match ask {
            Ask::Tunnel => self.tunnel(client, upstream, &rest).await,
            Ask::Forward {
                head,
                path,
                body_bytes,
            } => {
                self.forward(client, upstream, &target, head, &path, body_bytes, &rest)
                    .await
            }
        };
    }

    /// The policy's rule, the resolution and the address check.
    async fn decide(&self, target: &Target) -> Result<(Vec<SocketAddr>, String), Refusal> {
        let rule = match self.policy.check(target) {
            RuleMatch::Allowed(rule) => rule,
            RuleMatch::PortNotAllowed => {
                return Err(Refusal::new(
                    Reason::PortNotAllowed,
                    format!(
                        "port {} of {} is not in the allow-list",
                        target.port, target.host
                    ),
                ));
            }
            RuleMatch::HostNotAllowed => {
                return Err(Refusal::new(
                    Reason::HostNotAllowed,
                    format!("host {} is not in the allow-list", target.host),
                ));
            }
        };
        let candidates = match &target.host {
            Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
            Host::Name(name) => {
                let resolved = timeout(
                    self.limits.connect_timeout,
                    self.resolver.resolve(name, target.port),
                )
                .await;
                match resolved {
                    Ok(Ok(found)) if !found.is_empty() => found,
                    Ok(Ok(_)) => return Err(resolve_refusal(name, "no addresses")),
                    Ok(Err(e)) => return Err(resolve_refusal(name, &e.to_string())),
                    Err(_) => return Err(resolve_refusal(name, "timed out")),
                }
            }
        };
        let (permitted, internal): (Vec<SocketAddr>, Vec<SocketAddr>) = candidates
            .into_iter()
            .take(crate::address::ADDRESSES_MAX)
            .partition(|a| !is_internal(a.ip()) || rule.names_address(a.ip()));
        if permitted.is_empty() {
            let first = internal[0];
            return Err(Refusal {
                reason: Reason::InternalAddress,
                message: format!(
                    "{} resolves to the internal address {}, which rule {rule} does not name \
                     (allow it by its address, or localhost for loopback)",
                    target.host,
                    first.ip()
                ),
                rule: Some(rule.to_string()),
                address: Some(first),
            });
        }
        Ok((permitted, rule.to_string()))
    }

    async fn connect(&self, addresses: &[SocketAddr]) -> io::Result<TcpStream> {
        let deadline = Instant::now() + self.limits.connect_timeout;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address to connect to");
        for address in addresses {
            match tokio::time::timeout_at(deadline, TcpStream::connect(address)).await {
                Ok(Ok(stream)) => return Ok(stream),
                Ok(Err(e)) => last = io::Error::new(e.kind(), format!("{address}: {e}")),
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no connection within {} s",
                            self.limits.connect_timeout.as_secs()
                        ),
                    ));
                }
            }
        }
        Err(last)
    }

    async fn tunnel(
        &self,
        mut client: TcpStream,
        mut upstream: TcpStream,
        early: &[u8],
    ) -> io::Result<()> {
        client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await?;
        // Bytes the client sent right behind its CONNECT belong to the tunnel.
        upstream.write_all(early).await?;
        relay(&mut client, &mut upstream, self.limits.idle_timeout).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        mut client: TcpStream,
        mut upstream: TcpStream,
        target: &Target,
        request: RequestHead,
        path: &str,
        body_bytes: u64,
        early: &[u8],
    ) -> io::Result<()> {
        let idle = self.limits.idle_timeout;
        let mut out = format!("{} {path} HTTP/1.1\r\n", request.method).into_bytes();
        // The Host the server sees is the destination that was checked, never the client's own
        // (RFC 9112 §3.2.2), so a name-based server cannot be steered to another site.
        let fields: Vec<&Field> = head::end_to_end(&request.fields)
            .into_iter()
            .filter(|f| {
                !f.name.eq_ignore_ascii_case("expect") && !f.name.eq_ignore_ascii_case("host")
            })
            .collect();
        let host = match target.port {
            80 => target.host.to_string(),
            _ => target.to_string(),
        };
        out.extend_from_slice(format!("Host: {host}\r\n").as_bytes());
        head::write_fields(&mut out, &fields);
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        upstream.write_all(&out).await?;
        let early_body = &early[..early.len().min(body_bytes as usize)];
        upstream.write_all(early_body).await?;
        let mut body = (&mut client).take(body_bytes - early_body.len() as u64);
        copy_idle(&mut body, &mut upstream, idle).await?;
        let mut buf = Vec::new();
        let head_len = match timeout(idle, head::read_head(&mut upstream, &mut buf)).await {
            Ok(Ok(len)) => len,
            Ok(Err(e)) => {
                let text =
                    format!("ring0 egress: the response of {target} could not be read: {e}\n");
                return answer(&mut client, 502, "Bad Gateway", "bad_response", &text).await;
            }
            Err(_) => {
                let text = format!(
                    "ring0 egress: no response from {target} within {} s\n",
                    idle.as_secs()
                );
                return answer(
                    &mut client,
                    504,
                    "Gateway Timeout",
                    "response_timeout",
                    &text,
                )
                .await;
            }
        };
        let response = match head::parse_response(&buf[..head_len]) {
            Ok(response) => response,
            Err(e) => {
                let text = format!("ring0 egress: the response of {target} is not HTTP/1.x: {e}\n");
                return answer(&mut client, 502, "Bad Gateway", "bad_response", &text).await;
            }
        };
        let mut out = format!("HTTP/1.1 {} {}\r\n", response.code, response.reason).into_bytes();
        // The body is relayed as it comes until the server closes, so its framing header stays.
        let fields = head::end_to_end_keeping(&response.fields, &["transfer-encoding"]);
        head::write_fields(&mut out, &fields);
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        client.write_all(&out).await?;
        client.write_all(&buf[head_len..]).await?;
        copy_idle(&mut upstream, &mut client, idle).await?;
        client.shutdown().await
    }

    /// Audits a refusal, then answers it.
    async fn refuse(&self, client: &mut TcpStream, method: &str, target: &str, refusal: Refusal) {
        let record = decision(
            Verdict::Denied,
            method,
            target,
            refusal.reason,
            &refusal.message,
        )
        .rule(refusal.rule.clone())
        .address(refusal.address);
        // A refusal that cannot be recorded is still a refusal.
        let _ = (self.audit)(&record);
        self.refuse_unaudited(client, method, target, &refusal)
            .await;
    }

    async fn refuse_unaudited(
        &self,
        client: &mut TcpStream,
        method: &str,
        target: &str,
        refusal: &Refusal,
    ) {
        let (code, text) = refusal.reason.status();
        let what = match (method, target) {
            ("", "") => "the request".to_string(),
            (m, "") => m.to_string(),
            (m, t) => format!("{m} {t}"),
        };
        let body = format!("ring0 egress: refused {what}: {}\n", refusal.message);
        let _ = answer(client, code, text, refusal.reason.as_str(), &body).await;
    }
}

/// Reads what the request asks for: a CONNECT target, or an absolute `http://` URI.
fn read_ask(request: RequestHead) -> Result<(Target, Ask), (String, Refusal)> {
    if request.method.eq_ignore_ascii_case("CONNECT") {
        let target = Target::parse_authority(&request.target).ok_or_else(|| {
            let message = format!(
                "CONNECT target {:?} is not host:port",
                clip(&request.target)
            );
            (
                clip(&request.target),
                Refusal::new(Reason::MalformedRequest, message),
            )
        })?;
        return Ok((target, Ask::Tunnel));
    }
    let raw = request.target.clone();
    let lower = raw.to_ascii_lowercase();
    let Some(rest) = lower.starts_with("http://").then(|| &raw[7..]) else {
        let message = if lower.starts_with("https://") {
            "an https:// URI goes through CONNECT (the proxy does not terminate TLS)".to_string()
        } else {
            format!(
                "{:?} is not an absolute http:// URI (a proxy request names its destination)",
                clip(&raw)
            )
        };
        return Err((clip(&raw), Refusal::new(Reason::Unsupported, message)));
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let malformed = |what: String| (clip(&raw), Refusal::new(Reason::MalformedRequest, what));
    if authority.contains('@') {
        return Err(malformed("a URI with user information is refused".into()));
    }
    let target = Target::parse_authority_or(authority, 80).ok_or_else(|| {
        malformed(format!(
            "{:?} is not a host with an optional port",
            clip(authority)
        ))
    })?;
    let path = match path.split('#').next().unwrap_or_default() {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    if head::field(&request.fields, "transfer-encoding").is_some() {
        let message = "a request body with Transfer-Encoding is not forwarded; send Content-Length";
        return Err((
            target.to_string(),
            Refusal::new(Reason::Unsupported, message),
        ));
    }
    let lengths: Vec<&Field> = request
        .fields
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case("content-length"))
        .collect();
    let body_bytes = match lengths.as_slice() {
        [] => 0,
        [one] => std::str::from_utf8(&one.value)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                (
                    target.to_string(),
                    Refusal::new(Reason::MalformedRequest, "Content-Length is not a number"),
                )
            })?,
        _ => {
            let message = "more than one Content-Length";
            return Err((
                target.to_string(),
                Refusal::new(Reason::MalformedRequest, message),
            ));
        }
    };
    Ok((
        target,
        Ask::Forward {
            head: request,
            path,
            body_bytes,
        },
    ))
}

/// A request's own text in a message, cut to a readable length.
fn clip(text: &str) -> String {
    const SHOWN_BYTES_MAX: usize = 256;
    text.chars()
        .scan(0, |used, c| {
            *used += c.len_utf8();
            (*used <= SHOWN_BYTES_MAX).then_some(c)
        })
        .collect()
}

fn head_refusal(e: HeadError) -> Refusal {
    match e {
        HeadError::TooLarge => Refusal::new(Reason::HeadersTooLarge, e.to_string()),
        other => Refusal::new(Reason::MalformedRequest, other.to_string()),
    }
}

fn resolve_refusal(name: &str, why: &str) -> Refusal {
    Refusal::new(
        Reason::ResolveFailed,
        format!("{name} could not be resolved: {why}"),
    )
}

fn decision(
    verdict: Verdict,
    method: &str,
    target: &str,
    reason: Reason,
    message: &str,
) -> EgressDecision {
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    EgressDecision {
        at_ms,
        verdict,
        reason,
        method: method.to_string(),
        target: target.to_string(),
        rule: None,
        address: None,
        message: message.to_string(),
    }
}

impl EgressDecision {
    fn rule(mut self, rule: Option<String>) -> Self {
        self.rule = rule;
        self
    }
    fn address(mut self, address: Option<SocketAddr>) -> Self {
        self.address = address;
        self
    }
}

/// Writes a complete response with a text body and closes the connection.
async fn answer(
    client: &mut TcpStream,
    code: u16,
    text: &str,
    reason: &str,
    body: &str,
) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {code} {text}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nX-Ring0-Egress-Reason: {reason}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    client.write_all(head.as_bytes()).await?;
    client.write_all(body.as_bytes()).await?;
    client.shutdown().await
}

fn idle_error(idle: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("idle for {} s", idle.as_secs()),
    )
}

/// Copies until `from` ends, failing when a read or a write waits longer than `idle`.
async fn copy_idle<R, W>(from: &mut R, to: &mut W, idle: Duration) -> io::Result<()>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut buf = vec![0u8; RELAY_BUFFER_BYTES];
    loop {
        let n = timeout(idle, from.read(&mut buf))
            .await
            .map_err(|_| idle_error(idle))??;
        if n == 0 {
            return Ok(());
        }
        timeout(idle, to.write_all(&buf[..n]))
            .await
            .map_err(|_| idle_error(idle))??;
    }
}

/// Relays both ways until both sides have finished sending, or nothing moved for `idle`.
async fn relay(a: &mut TcpStream, b: &mut TcpStream, idle: Duration) -> io::Result<()> {
    let (mut a_read, mut a_write) = a.split();
    let (mut b_read, mut b_write) = b.split();
    let mut a_buf = vec![0u8; RELAY_BUFFER_BYTES];
    let mut b_buf = vec![0u8; RELAY_BUFFER_BYTES];
    let (mut a_open, mut b_open) = (true, true);
    while a_open || b_open {
        tokio::select! {
            read = a_read.read(&mut a_buf), if a_open => {
                let n = read?;
                if n == 0 {
                    a_open = false;
                    b_write.shutdown().await?;
                } else {
                    timeout(idle, b_write.write_all(&a_buf[..n])).await.map_err(|_| idle_error(idle))??;
                }
            }
            read = b_read.read(&mut b_buf), if b_open => {
                let n = read?;
                if n == 0 {
                    b_open = false;
                    a_write.shutdown().await?;
                } else {
                    timeout(idle, a_write.write_all(&b_buf[..n])).await.map_err(|_| idle_error(idle))??;
                }
            }
            _ = tokio::time::sleep(idle) => return Err(idle_error(idle)),
        }
    }
    Ok(())
}
