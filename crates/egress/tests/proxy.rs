//! The egress proxy as a client inside a sandbox sees it: real sockets on loopback, an origin
//! server that echoes what reached it, and the audit callback's records.

use async_trait::async_trait;
use ring0_egress::{
    EgressDecision, EgressLimits, EgressPolicy, EgressProxy, HEAD_BYTES_MAX, Reason, Resolve,
    Verdict,
};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// A resolver with fixed answers; any other name fails.
struct FixedResolver(HashMap<String, Vec<SocketAddr>>);

#[async_trait]
impl Resolve for FixedResolver {
    async fn resolve(&self, name: &str, _port: u16) -> io::Result<Vec<SocketAddr>> {
        self.0
            .get(name)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name"))
    }
}

struct Proxy {
    addr: SocketAddr,
    decisions: Arc<Mutex<Vec<EgressDecision>>>,
    _stop: oneshot::Sender<()>,
}

impl Proxy {
    fn decisions(&self) -> Vec<EgressDecision> {
        self.decisions.lock().unwrap().clone()
    }
}

async fn proxy_with(rules: &[String], names: &[(&str, SocketAddr)], limits: EgressLimits) -> Proxy {
    let decisions = Arc::new(Mutex::new(Vec::new()));
    let seen = decisions.clone();
    let policy = EgressPolicy::parse(rules).unwrap();
    let resolver = FixedResolver(
        names
            .iter()
            .map(|(n, a)| (n.to_string(), vec![*a]))
            .collect(),
    );
    let proxy = EgressProxy::new(
        policy,
        Arc::new(move |d: &EgressDecision| {
            seen.lock().unwrap().push(d.clone());
            Ok(())
        }),
    )
    .with_resolver(Arc::new(resolver))
    .with_limits(limits);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        proxy
            .serve(listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Proxy {
        addr,
        decisions,
        _stop: stop,
    }
}

async fn proxy(rules: &[String]) -> Proxy {
    proxy_with(rules, &[], EgressLimits::default()).await
}

/// An origin server answering each connection's request with its head and body as the body,
/// plus a hop-by-hop header the proxy must drop. Counts the connections it accepted.
async fn origin() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                    let n = conn.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                while buf.len() < head_end + length {
                    let n = conn.read(&mut chunk).await.unwrap();
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = &buf[..head_end + length];
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nKeep-Alive: timeout=5\r\nX-Origin: yes\r\n\r\n",
                    body.len()
                );
                conn.write_all(response.as_bytes()).await.unwrap();
                conn.write_all(body).await.unwrap();
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr, accepted)
}

/// Sends `request` to the proxy and reads everything until it closes.
async fn exchange(proxy: SocketAddr, request: &[u8]) -> String {
    let mut conn = TcpStream::connect(proxy).await.unwrap();
    conn.write_all(request).await.unwrap();
    let mut out = Vec::new();
    conn.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Opens a CONNECT tunnel and returns the stream after the proxy's `200`.
async fn tunnel(proxy: SocketAddr, target: &str) -> TcpStream {
    let mut conn = TcpStream::connect(proxy).await.unwrap();
    conn.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(
            conn.read(&mut byte).await.unwrap(),
            1,
            "proxy closed: {head:?}"
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    conn
}

fn status(response: &str) -> &str {
    response.split(' ').nth(1).unwrap_or_default()
}

#[tokio::test]
async fn connect_to_an_allowed_host_tunnels_bytes_both_ways() {
    let (origin, _) = origin().await;
    let proxy = proxy(&[format!("127.0.0.1:{}", origin.port())]).await;
    let mut conn = tunnel(proxy.addr, &origin.to_string()).await;
    conn.write_all(b"GET /through-the-tunnel HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    conn.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    assert!(out.contains("GET /through-the-tunnel HTTP/1.1"), "{out}");
    let decisions = proxy.decisions();
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].verdict, Verdict::Allowed);
    assert_eq!(decisions[0].method, "CONNECT");
    assert_eq!(decisions[0].address, Some(origin));
}

#[tokio::test]
async fn plain_http_is_forwarded_in_origin_form_without_hop_by_hop_headers() {
    let (origin, _) = origin().await;
    let proxy = proxy(&[format!("127.0.0.1:{}", origin.port())]).await;
    let request = format!(
        "POST http://{origin}/echo?q=1 HTTP/1.1\r\nHost: elsewhere.example\r\nProxy-Authorization: Basic c2VjcmV0\r\n\
         Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\nContent-Length: 5\r\n\r\nhello"
    );
    let out = exchange(proxy.addr, request.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let body = body.to_lowercase();
    assert!(body.starts_with("post /echo?q=1 http/1.1\r\n"), "{body}");
    assert!(
        body.contains("x-keep: 2") && body.ends_with("hello"),
        "{body}"
    );
    assert!(body.contains("connection: close"), "{body}");
    for dropped in ["proxy-authorization", "x-drop", "keep-alive"] {
        assert!(
            !body.contains(dropped),
            "{dropped} reached the origin: {body}"
        );
    }
    assert!(head.contains("X-Origin: yes"), "{head}");
    assert!(
        !head.contains("Keep-Alive"),
        "a hop-by-hop response header came back: {head}"
    );
    assert_eq!(proxy.decisions()[0].method, "POST");
}

#[tokio::test]
async fn a_host_outside_the_allow_list_is_refused_with_a_reason() {
    let (origin, accepted) = origin().await;
    let proxy = proxy_with(
        &["crates.io:443".into()],
        &[("elsewhere.test", origin)],
        EgressLimits::default(),
    )
    .await;
    let out = exchange(proxy.addr, b"CONNECT elsewhere.test:443 HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&out), "403", "{out}");
    assert!(
        out.contains("X-Ring0-Egress-Reason: host_not_allowed"),
        "{out}"
    );
    assert!(
        out.contains("host elsewhere.test is not in the allow-list"),
        "{out}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    assert_eq!(proxy.decisions()[0].reason, Reason::HostNotAllowed);
}

#[tokio::test]
async fn a_port_outside_the_allow_list_is_refused() {
    let (origin, accepted) = origin().await;
    let proxy = proxy(&[format!("127.0.0.1:{}", origin.port())]).await;
    let other = if origin.port() == 65535 {
        1
    } else {
        origin.port() + 1
    };
    let out = exchange(
        proxy.addr,
        format!("GET http://127.0.0.1:{other}/ HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(status(&out), "403", "{out}");
    assert!(out.contains("port_not_allowed"), "{out}");
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_name_that_resolves_to_an_internal_address_is_refused() {
    let (origin, accepted) = origin().await;
    let proxy = proxy_with(
        &["*.example.test:*".into()],
        &[("metadata.example.test", origin)],
        EgressLimits::default(),
    )
    .await;
    let out = exchange(
        proxy.addr,
        format!(
            "CONNECT metadata.example.test:{} HTTP/1.1\r\n\r\n",
            origin.port()
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(status(&out), "403", "{out}");
    assert!(out.contains("internal_address"), "{out}");
    assert!(out.contains("internal address 127.0.0.1"), "{out}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the proxy connected anyway"
    );
    let decision = &proxy.decisions()[0];
    assert_eq!(decision.reason, Reason::InternalAddress);
    assert_eq!(decision.address, Some(origin));
}

#[tokio::test]
async fn a_localhost_rule_allows_exactly_that_loopback_port() {
    let (origin, _) = origin().await;
    let proxy = proxy_with(
        &[format!("localhost:{}", origin.port())],
        &[("localhost", origin)],
        EgressLimits::default(),
    )
    .await;
    let mut conn = tunnel(proxy.addr, &format!("localhost:{}", origin.port())).await;
    conn.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut out = String::new();
    conn.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let other = exchange(
        proxy.addr,
        format!("CONNECT localhost:{} HTTP/1.1\r\n\r\n", origin.port() ^ 1).as_bytes(),
    )
    .await;
    assert!(other.contains("port_not_allowed"), "{other}");
}

#[tokio::test]
async fn malformed_requests_are_answered_400_and_audited() {
    let proxy = proxy(&["crates.io:443".into()]).await;
    for request in [
        &b"NOT HTTP AT ALL\r\n\r\n"[..],
        b"CONNECT crates.io HTTP/1.1\r\n\r\n",
        b"GET http://user@crates.io/ HTTP/1.1\r\n\r\n",
        b"CONNECT cr\xc3\xa4tes.io:443 HTTP/1.1\r\n\r\n",
    ] {
        let out = exchange(proxy.addr, request).await;
        assert_eq!(status(&out), "400", "{out}");
        assert!(out.contains("malformed_request"), "{out}");
    }
    let decisions = proxy.decisions();
    assert_eq!(decisions.len(), 4);
    assert!(decisions.iter().all(|d| d.verdict == Verdict::Denied));
}

#[tokio::test]
async fn oversized_headers_are_answered_431() {
    let proxy = proxy(&["crates.io:443".into()]).await;
    let mut request = b"CONNECT crates.io:443 HTTP/1.1\r\nX-Big: ".to_vec();
    request.extend(std::iter::repeat_n(b'a', HEAD_BYTES_MAX + 1));
    request.extend_from_slice(b"\r\n\r\n");
    let out = exchange(proxy.addr, &request).await;
    assert_eq!(status(&out), "431", "{out}");
    assert_eq!(proxy.decisions()[0].reason, Reason::HeadersTooLarge);
}

#[tokio::test]
async fn forms_the_proxy_does_not_carry_are_refused_501() {
    let proxy = proxy(&["crates.io:*".into()]).await;
    for request in [
        &b"GET https://crates.io/ HTTP/1.1\r\n\r\n"[..],
        b"GET /relative HTTP/1.1\r\nHost: crates.io\r\n\r\n",
        b"POST http://crates.io/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ] {
        let out = exchange(proxy.addr, request).await;
        assert_eq!(status(&out), "501", "{out}");
    }
}

#[tokio::test]
async fn the_audit_callback_sees_every_decision_in_order() {
    let (origin, _) = origin().await;
    let proxy = proxy(&[format!("127.0.0.1:{}", origin.port())]).await;
    let allowed = format!("GET http://{origin}/ HTTP/1.1\r\n\r\n");
    exchange(proxy.addr, allowed.as_bytes()).await;
    exchange(proxy.addr, b"CONNECT crates.io:443 HTTP/1.1\r\n\r\n").await;
    exchange(proxy.addr, b"garbage\r\n\r\n").await;
    let reasons: Vec<Reason> = proxy.decisions().iter().map(|d| d.reason).collect();
    assert_eq!(
        reasons,
        [
            Reason::Allowed,
            Reason::HostNotAllowed,
            Reason::MalformedRequest
        ]
    );
}

#[tokio::test]
async fn a_decision_the_audit_refuses_is_not_carried_out() {
    let (origin, accepted) = origin().await;
    let policy = EgressPolicy::parse(&[format!("127.0.0.1:{}", origin.port())]).unwrap();
    let proxy = EgressProxy::new(
        policy,
        Arc::new(|_: &EgressDecision| Err("disk full".into())),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { proxy.serve(listener, std::future::pending()).await });
    let out = exchange(
        addr,
        format!("CONNECT {origin} HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(status(&out), "403", "{out}");
    assert!(
        out.contains("audit_failed") && out.contains("disk full"),
        "{out}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn connections_past_the_limit_are_answered_503() {
    let (origin, _) = origin().await;
    let limits = EgressLimits {
        connections_max: 1,
        ..EgressLimits::default()
    };
    let proxy = proxy_with(&[format!("127.0.0.1:{}", origin.port())], &[], limits).await;
    let _held = tunnel(proxy.addr, &origin.to_string()).await;
    let out = exchange(proxy.addr, b"CONNECT crates.io:443 HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&out), "503", "{out}");
    assert!(out.contains("busy"), "{out}");
}

#[tokio::test]
async fn an_idle_tunnel_is_closed() {
    let (origin, _) = origin().await;
    let limits = EgressLimits {
        idle_timeout: Duration::from_millis(100),
        ..EgressLimits::default()
    };
    let proxy = proxy_with(&[format!("127.0.0.1:{}", origin.port())], &[], limits).await;
    let mut conn = tunnel(proxy.addr, &origin.to_string()).await;
    let mut rest = Vec::new();
    // The origin waits for a request that never comes; the proxy ends the tunnel.
    conn.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
}

/// curl, as an `HTTP_PROXY`-aware program inside a sandbox would use the proxy: `-x` for plain
/// HTTP and `-p -x` for a CONNECT tunnel.
async fn curl(proxy: SocketAddr, args: &[&str]) -> (bool, String) {
    let mut command = tokio::process::Command::new("curl");
    command
        .args(["-sS", "--max-time", "20", "-x", &format!("http://{proxy}")])
        .args(args);
    let out = command.output().await.expect("curl is installed");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn curl_reaches_an_allowed_origin_directly_and_through_a_tunnel() {
    let (origin, _) = origin().await;
    let proxy = proxy(&[format!("127.0.0.1:{}", origin.port())]).await;
    let url = format!("http://{origin}/via-curl");
    let (ok, out) = curl(proxy.addr, &[&url]).await;
    assert!(ok && out.starts_with("GET /via-curl HTTP/1.1"), "{out}");
    let (ok, out) = curl(proxy.addr, &["-p", &url]).await;
    assert!(ok && out.starts_with("GET /via-curl HTTP/1.1"), "{out}");
    let methods: Vec<String> = proxy.decisions().into_iter().map(|d| d.method).collect();
    assert_eq!(methods, ["GET", "CONNECT"]);
}

#[tokio::test]
async fn curl_is_told_why_a_host_is_refused() {
    let proxy = proxy(&["crates.io:443".into()]).await;
    let (_, out) = curl(proxy.addr, &["-i", "http://example.com/"]).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(
        out.contains("refused GET example.com:80: host example.com is not in the allow-list"),
        "{out}"
    );
}

#[tokio::test]
async fn a_spawned_proxy_stops_serving_when_its_handle_is_dropped() {
    let (origin, _) = origin().await;
    let policy = EgressPolicy::parse(&[format!("127.0.0.1:{}", origin.port())]).unwrap();
    let proxy = EgressProxy::new(policy, Arc::new(|_: &EgressDecision| Ok(())));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = proxy
        .spawn(&tokio::runtime::Handle::current(), listener)
        .unwrap();
    let mut held = tunnel(addr, &origin.to_string()).await;
    drop(serving);
    // The open tunnel is closed with the proxy, and the listener is gone.
    let mut rest = Vec::new();
    let _ = held.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
    assert!(TcpStream::connect(addr).await.is_err());
}
