//! `tools/call` latency and throughput through ring0 versus directly to the same upstream, and
//! versus mcp-proxy, measured in the same run.
//!
//! ```text
//! cargo build --release -p ring0 -p ring0-mcp --bins
//! bash scripts/install-mcp-peers.sh
//! target/release/ring0-mcp-bench [--calls N] [--concurrency C]
//! ```
//!
//! For each upstream — ring0-mcp-fixture's `echo` (rmcp) and server-everything's `echo`, each
//! run both as a stdio server and as a Streamable HTTP server — it measures N sequential calls
//! (after a warm-up) on every path, then C calls in flight at once for throughput:
//!
//! - direct over stdio and direct over HTTP: the baselines;
//! - ring0 with a stdio or an HTTP client, in front of the upstream over stdio or over HTTP;
//! - mcp-proxy in its two modes: an HTTP server in front of the stdio upstream, and a stdio
//!   server in front of the HTTP upstream.
//!
//! A path's added latency is its latency minus the direct path over the transport it uses to
//! reach the upstream: what putting the gateway in front of that server costs. Every client
//! speaks the protocol version ring0 speaks to its upstreams, so a server that behaves
//! differently per version is measured the same way on every path. It prints p50/p99 latency,
//! the added p50/p99, calls per second, and ring0's added p50 as a fraction of mcp-proxy's for
//! the two topologies both can serve (target: at most 1/10). For the HTTP client it also prints
//! the floor: one bare HTTP exchange (the fixture's `POST /echo`, no MCP), which any gateway
//! serving HTTP clients adds to the direct stdio path. `--only TEXT` and `--upstream
//! TEXT` narrow the run to some paths, for profiling.

use ring0_mcp::Log;
use ring0_mcp::rpc::{InboundHandler, RpcPeer};
use ring0_mcp::upstream::{UPSTREAM_PROTOCOL_VERSION, http, stdio};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Quiet;

#[async_trait::async_trait]
impl InboundHandler for Quiet {
    fn notification(&self, _: &str, _: Option<Value>, _: Option<u64>) {}
    async fn request(&self, _: &str, _: Option<Value>, _: Option<u64>) -> Result<Value, Value> {
        Ok(json!({}))
    }
}

enum Conn {
    Stdio(#[allow(dead_code)] stdio::StdioConnection),
    Http(http::HttpConnection),
}

async fn connect_stdio(command: &str, args: &[String], cwd: Option<&Path>) -> (Arc<RpcPeer>, Conn) {
    let mut env = BTreeMap::new();
    for k in ["PATH", "HOME"] {
        if let Ok(v) = std::env::var(k) {
            env.insert(k.to_string(), v);
        }
    }
    let spec = stdio::StdioSpec {
        command: command.into(),
        args: args.to_vec(),
        env,
        cwd: cwd.map(Path::to_path_buf),
        // The gateway's own overhead is measured here; `cargo bench -p ring0-exec` measures
        // the sandbox's.
        sandbox: ring0_exec::Sandbox::off(),
    };
    let c = stdio::spawn("bench", &spec, Arc::new(Quiet), Log::discard()).expect("spawn");
    (c.peer.clone(), Conn::Stdio(c))
}

async fn connect_http(url: &str) -> (Arc<RpcPeer>, Conn) {
    let spec = http::HttpSpec {
        url: url.into(),
        headers: BTreeMap::new(),
    };
    let c = http::connect(
        "bench",
        &spec,
        http::client().expect("client"),
        Arc::new(Quiet),
        Log::discard(),
    );
    (c.peer.clone(), Conn::Http(c))
}

async fn initialize(peer: &Arc<RpcPeer>, conn: &Conn) {
    let init = peer
        .request(
            "initialize",
            Some(
                json!({"protocolVersion": UPSTREAM_PROTOCOL_VERSION, "capabilities": {},
                        "clientInfo": {"name": "ring0-mcp-bench", "version": "1"}}),
            ),
        )
        .await
        .expect("initialize");
    if let Conn::Http(c) = conn {
        c.set_protocol_version(
            init["protocolVersion"]
                .as_str()
                .unwrap_or(UPSTREAM_PROTOCOL_VERSION),
        );
    }
    peer.notify("notifications/initialized", None)
        .expect("initialized");
}

struct Stats {
    p50: Duration,
    p99: Duration,
    per_sec: f64,
}

async fn measure(
    peer: &Arc<RpcPeer>,
    tool: &str,
    arg: &str,
    calls: usize,
    concurrency: usize,
) -> Stats {
    let call = |i: usize| {
        let peer = peer.clone();
        let params = json!({"name": tool, "arguments": {arg: format!("message {i}")}});
        async move {
            let r = peer
                .request("tools/call", Some(params))
                .await
                .expect("tools/call");
            assert!(
                r.get("isError") != Some(&Value::Bool(true)),
                "call failed: {r}"
            );
        }
    };
    for i in 0..calls.min(100) {
        call(i).await;
    }
    let mut lat = Vec::with_capacity(calls);
    for i in 0..calls {
        let t = Instant::now();
        call(i).await;
        lat.push(t.elapsed());
    }
    lat.sort();
    let started = Instant::now();
    let mut done = 0;
    while done < calls {
        let batch: Vec<_> = (0..concurrency.min(calls - done))
            .map(|i| call(done + i))
            .collect();
        done += batch.len();
        futures::future::join_all(batch).await;
    }
    Stats {
        p50: lat[lat.len() / 2],
        p99: lat[(lat.len() * 99 / 100).min(lat.len() - 1)],
        per_sec: calls as f64 / started.elapsed().as_secs_f64(),
    }
}

/// p50 of `calls` sequential POSTs of a `tools/call`-sized JSON body to `url`, which answers
/// with the body: the HTTP exchange alone, with the client the MCP paths use.
async fn exchange_p50(url: &str, calls: usize) -> Duration {
    let client = http::client().expect("client");
    let body = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "message 1"}}}))
    .expect("body");
    let post = || async {
        let r = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .expect("POST /echo");
        assert!(r.status().is_success(), "POST /echo: {}", r.status());
        r.bytes().await.expect("echo body")
    };
    for _ in 0..calls.min(100) {
        post().await;
    }
    let mut lat = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        post().await;
        lat.push(t.elapsed());
    }
    lat.sort();
    lat[lat.len() / 2]
}

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `server` (which listens on `port`, output discarded), measures `tool` over MCP at
/// `/mcp` on that port, and stops it.
async fn measure_http_server(
    mut server: Command,
    port: u16,
    tool: &str,
    arg: &str,
    calls: usize,
    concurrency: usize,
) -> Stats {
    let served = Served(
        server
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("an HTTP MCP server"),
    );
    wait_for_port(port).await;
    let (peer, conn) = connect_http(&format!("http://127.0.0.1:{port}/mcp")).await;
    initialize(&peer, &conn).await;
    let stats = measure(&peer, tool, arg, calls, concurrency).await;
    drop(conn);
    drop(served);
    stats
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn wait_for_port(port: u16) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nothing listens on port {port}");
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let calls = opt("--calls", 2000);
    // `--only TEXT` measures, besides the direct baselines, only the paths whose label ("ring0
    // HTTP→stdio", "mcp-proxy stdio→HTTP", …) contains TEXT; `--upstream TEXT` only the upstreams
    // whose name contains it. For profiling one path.
    let text_opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let only = text_opt("--only");
    let only_upstream = text_opt("--upstream");
    let wanted = move |path: &str, client: &str, upstream: &str| {
        only.as_deref()
            .is_none_or(|o| format!("{path} {client}→{upstream}").contains(o))
    };
    let concurrency = opt("--concurrency", 16);
    let exe = std::env::current_exe().expect("exe");
    let bin_dir = exe.parent().expect("bin dir").to_path_buf();
    let ring0 = bin_dir.join("ring0");
    let fixture = bin_dir.join("ring0-mcp-fixture");
    let root = bin_dir.join("..").join("..");
    let peers = std::env::var_os("MCP_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/mcp-peers"));
    let node = peers.join("node/node_modules/.bin/node");
    let everything =
        peers.join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let proxy = peers.join("proxy/bin/mcp-proxy");
    for p in [&ring0, &fixture, &node, &proxy] {
        assert!(
            p.exists(),
            "{} is missing (build with --bins; run scripts/install-mcp-peers.sh)",
            p.display()
        );
    }
    struct Upstream {
        label: &'static str,
        command: String,
        stdio_args: Vec<String>,
        /// Arguments that make the same program serve Streamable HTTP, for the direct HTTP
        /// baseline and the paths with an HTTP upstream ("{port}" stands for the port, which
        /// is also in the environment as `PORT`).
        http_args: Vec<String>,
        tool: &'static str,
        arg: &'static str,
        /// Whether its HTTP server also answers `POST /echo` with the body (no MCP).
        echo_route: bool,
    }
    let everything_path = everything.display().to_string();
    let upstreams = vec![
        Upstream {
            label: "rmcp echo (ring0-mcp-fixture)",
            command: fixture.display().to_string(),
            stdio_args: vec![],
            http_args: vec!["--http".into(), "127.0.0.1:{port}".into()],
            tool: "echo",
            arg: "text",
            echo_route: true,
        },
        Upstream {
            label: "server-everything echo",
            command: node.display().to_string(),
            stdio_args: vec![everything_path.clone(), "stdio".into()],
            http_args: vec![everything_path.clone(), "streamableHttp".into()],
            tool: "echo",
            arg: "message",
            echo_route: false,
        },
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        println!(
            "tools/call, {calls} sequential calls (p50/p99 latency) then {calls} with \
             {concurrency} in flight (calls/s)\n"
        );
        // What one HTTP exchange costs on this machine, without MCP: measured on the first
        // upstream that answers `POST /echo` (ring0-mcp-fixture), used for every upstream.
        let mut bare_http: Option<Duration> = None;
        for up in upstreams {
            if only_upstream.as_deref().is_some_and(|o| !up.label.contains(o)) {
                continue;
            }
            println!("== {}", up.label);
            // Serves the upstream over Streamable HTTP on a fresh port.
            let serve_http = |port: u16| {
                let mut cmd = Command::new(&up.command);
                for a in &up.http_args {
                    cmd.arg(a.replace("{port}", &port.to_string()));
                }
                cmd.env("PORT", port.to_string());
                Served(
                    cmd.stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("upstream over HTTP"),
                )
            };
            // ring0's configuration in front of the upstream over stdio or at `url`.
            let ring0_workspace = |url: Option<&str>| {
                let work = tempfile::tempdir().expect("tempdir");
                let transport = match url {
                    Some(url) => format!("url = {url:?}\n"),
                    None => {
                        let args: Vec<String> =
                            up.stdio_args.iter().map(|a| format!("{a:?}")).collect();
                        format!(
                            "command = {:?}\nargs = [{}]\nenv = [\"PATH\", \"HOME\"]\n",
                            up.command,
                            args.join(", ")
                        )
                    }
                };
                std::fs::write(
                    work.path().join("ring0.toml"),
                    format!(
                        "defaults = false\n[[grants]]\nname = \"bench\"\ntools = [\"b__*\"]\nceiling = \"A0\"\n\n\
                         [[upstreams]]\nalias = \"b\"\n{transport}\
                         [upstreams.tools.\"*\"]\neffect = \"nullipotent\"\nauthority = \"A0\"\n\
                         strategy = [\"exploration\"]\n"
                    ),
                )
                .expect("config");
                work
            };
            let qualified = format!("b__{}", up.tool);
            let mut rows: Vec<Row> = Vec::new();

            // Direct, over each transport: the baselines.
            let (peer, conn) = connect_stdio(&up.command, &up.stdio_args, None).await;
            initialize(&peer, &conn).await;
            let direct_stdio = measure(&peer, up.tool, up.arg, calls, concurrency).await;
            drop(conn);
            let upstream_port = free_port();
            let _upstream_http = serve_http(upstream_port);
            wait_for_port(upstream_port).await;
            let upstream_url = format!("http://127.0.0.1:{upstream_port}/mcp");
            let (peer, conn) = connect_http(&upstream_url).await;
            initialize(&peer, &conn).await;
            let direct_http = measure(&peer, up.tool, up.arg, calls, concurrency).await;
            drop(conn);
            if bare_http.is_none() && up.echo_route {
                bare_http = Some(
                    exchange_p50(&format!("http://127.0.0.1:{upstream_port}/echo"), calls).await,
                );
            }
            rows.push(Row::new("direct", "stdio", "-", direct_stdio, None));
            rows.push(Row::new("direct", "HTTP", "-", direct_http, None));
            let bases = [
                (rows[0].stats.p50, rows[0].stats.p99),
                (rows[1].stats.p50, rows[1].stats.p99),
            ];
            // What a gateway adds: its path minus the direct path over the transport it uses to
            // reach the upstream (the upstream's own transport cost is paid either way).
            let base = |upstream: &str| bases[usize::from(upstream != "stdio")];

            // ring0, stdio client, upstream over stdio and over HTTP.
            for upstream in ["stdio", "HTTP"] {
                if !wanted("ring0", "stdio", upstream) {
                    continue;
                }
                let url = (upstream == "HTTP").then_some(upstream_url.as_str());
                let work = ring0_workspace(url);
                let (peer, conn) =
                    connect_stdio(&ring0.display().to_string(), &["serve".into()], Some(work.path()))
                        .await;
                initialize(&peer, &conn).await;
                let stats = measure(&peer, &qualified, up.arg, calls, concurrency).await;
                drop(conn);
                let b = base(upstream);
                rows.push(Row::new("ring0", "stdio", upstream, stats, Some(b)));
            }
            // ring0, HTTP client, upstream over stdio and over HTTP.
            for upstream in ["stdio", "HTTP"] {
                if !wanted("ring0", "HTTP", upstream) {
                    continue;
                }
                let url = (upstream == "HTTP").then_some(upstream_url.as_str());
                let work = ring0_workspace(url);
                let port = free_port();
                let mut server = Command::new(&ring0);
                server
                    .args(["serve", "--http", &format!("127.0.0.1:{port}")])
                    .current_dir(work.path());
                let stats =
                    measure_http_server(server, port, &qualified, up.arg, calls, concurrency)
                        .await;
                let b = base(upstream);
                rows.push(Row::new("ring0", "HTTP", upstream, stats, Some(b)));
            }

            // mcp-proxy in its two modes: an HTTP server in front of the stdio upstream, and a
            // stdio server in front of the HTTP upstream.
            if wanted("mcp-proxy", "HTTP", "stdio") {
            let port = free_port();
            let mut cmd = Command::new(&proxy);
            cmd.args(["--port", &port.to_string(), "--host", "127.0.0.1", "--", &up.command])
                .args(&up.stdio_args);
            let stats = measure_http_server(cmd, port, up.tool, up.arg, calls, concurrency).await;
            let b = base("stdio");
            rows.push(Row::new("mcp-proxy", "HTTP", "stdio", stats, Some(b)));
            }
            if wanted("mcp-proxy", "stdio", "HTTP") {
            let proxy_args = vec![
                "--transport".to_string(),
                "streamablehttp".into(),
                upstream_url.clone(),
            ];
            let (peer, conn) = connect_stdio(&proxy.display().to_string(), &proxy_args, None).await;
            initialize(&peer, &conn).await;
            let stats = measure(&peer, up.tool, up.arg, calls, concurrency).await;
            drop(conn);
            let b = base("HTTP");
            rows.push(Row::new("mcp-proxy", "stdio", "HTTP", stats, Some(b)));
            }

            println!(
                "{:<10} {:>7} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9}",
                "path", "client", "upstream", "p50 µs", "p99 µs", "+p50 µs", "+p99 µs", "calls/s"
            );
            for r in &rows {
                println!(
                    "{:<10} {:>7} {:>9} {:>8.0} {:>8.0} {:>8} {:>8} {:>9.0}",
                    r.path,
                    r.client,
                    r.upstream,
                    us(r.stats.p50),
                    us(r.stats.p99),
                    r.added.map_or("-".into(), |(p50, _)| format!("{p50:.0}")),
                    r.added.map_or("-".into(), |(_, p99)| format!("{p99:.0}")),
                    r.stats.per_sec
                );
            }
            let added = |path: &str, client: &str, upstream: &str| {
                rows.iter()
                    .find(|r| r.path == path && r.client == client && r.upstream == upstream)
                    .and_then(|r| r.added)
                    .map(|(p50, _)| p50)
            };
            println!("ring0 added p50 / mcp-proxy added p50, same client and upstream transports (target ≤ 0.100):");
            for (client, upstream) in [("HTTP", "stdio"), ("stdio", "HTTP")] {
                let (Some(ours), Some(theirs)) =
                    (added("ring0", client, upstream), added("mcp-proxy", client, upstream))
                else {
                    continue;
                };
                println!(
                    "  {client} client, {upstream} upstream: {ours:.0} µs / {theirs:.0} µs = {:.3}",
                    ours.max(0.0) / theirs.max(1.0)
                );
                // An HTTP front adds at least one HTTP exchange to the direct stdio path,
                // however little the gateway itself does.
                if client == "HTTP"
                    && let Some(bare) = bare_http
                {
                    println!(
                        "    floor: one HTTP exchange without MCP (POST /echo) takes {:.0} µs p50 \
                         here, so no HTTP front can be under {:.3} of mcp-proxy's {theirs:.0} µs",
                        us(bare),
                        us(bare) / theirs.max(1.0)
                    );
                }
            }
            println!();
        }
    });
}

/// One measured path: who serves the client, over which transports, and its latency over the
/// direct path to the upstream over the same upstream transport.
struct Row {
    path: &'static str,
    client: &'static str,
    upstream: &'static str,
    stats: Stats,
    /// Added p50 and p99 in µs over the direct path over the same upstream transport.
    added: Option<(f64, f64)>,
}

impl Row {
    fn new(
        path: &'static str,
        client: &'static str,
        upstream: &'static str,
        stats: Stats,
        base: Option<(Duration, Duration)>,
    ) -> Self {
        let added = base.map(|(p50, p99)| (us(stats.p50) - us(p50), us(stats.p99) - us(p99)));
        Self {
            path,
            client,
            upstream,
            stats,
            added,
        }
    }
}
