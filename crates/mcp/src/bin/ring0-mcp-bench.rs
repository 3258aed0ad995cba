//! `tools/call` latency and throughput through ring0 versus directly to the same upstream, and
//! versus mcp-proxy, measured in the same run.
//!
//! ```text
//! cargo build --release -p ring0 -p ring0-mcp --bins
//! bash scripts/install-mcp-peers.sh
//! target/release/ring0-mcp-bench [--calls N] [--concurrency C]
//! ```
//!
//! For each upstream — ring0-mcp-fixture's `echo` (rmcp) and server-everything's `echo` — it
//! measures N sequential calls (after a warm-up) on four paths: the upstream directly over stdio
//! (the baseline), ring0 over stdio, ring0 over Streamable HTTP, and mcp-proxy over Streamable
//! HTTP, each proxy in front of the same stdio upstream; then C calls in flight at once for
//! throughput. It prints p50/p99 latency, the added p50/p99 over the baseline, calls per second,
//! and ring0's added p50 as a fraction of mcp-proxy's (target: at most 1/10).

use ring0_mcp::Log;
use ring0_mcp::rpc::{InboundHandler, RpcPeer};
use ring0_mcp::upstream::{http, stdio};
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
            Some(json!({"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "ring0-mcp-bench", "version": "1"}})),
        )
        .await
        .expect("initialize");
    if let Conn::Http(c) = conn {
        c.set_protocol_version(init["protocolVersion"].as_str().unwrap_or("2025-06-18"));
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

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
    let upstreams: Vec<(&str, String, Vec<String>, &str, &str)> = vec![
        (
            "rmcp echo (ring0-mcp-fixture)",
            fixture.display().to_string(),
            vec![],
            "echo",
            "text",
        ),
        (
            "server-everything echo",
            node.display().to_string(),
            vec![everything.display().to_string(), "stdio".into()],
            "echo",
            "message",
        ),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        println!("tools/call, {calls} sequential calls (p50/p99 latency) then {calls} with {concurrency} in flight (calls/s)\n");
        for (label, command, cargs, tool, arg) in upstreams {
            println!("== {label}");
            // One workspace per ring0 process: each holds its journal's writer lock.
            let work = tempfile::tempdir().expect("tempdir");
            let work_http = tempfile::tempdir().expect("tempdir");
            let args_toml: Vec<String> = cargs.iter().map(|a| format!("{a:?}")).collect();
            for w in [work.path(), work_http.path()] {
            std::fs::write(
                w.join("ring0.toml"),
                format!(
                    "[[grants]]\nname = \"bench\"\ntools = [\"b__*\"]\nceiling = \"A0\"\n\n[[upstreams]]\nalias = \"b\"\ncommand = {command:?}\nargs = [{}]\nenv = [\"PATH\", \"HOME\"]\n[upstreams.tools.\"*\"]\neffect = \"nullipotent\"\nauthority = \"A0\"\nstrategy = [\"exploration\"]\n",
                    args_toml.join(", ")
                ),
            )
            .expect("config");
            }
            let mut rows: Vec<(String, Stats)> = Vec::new();

            let (peer, conn) = connect_stdio(&command, &cargs, None).await;
            initialize(&peer, &conn).await;
            rows.push(("direct (stdio)".into(), measure(&peer, tool, arg, calls, concurrency).await));
            drop(conn);

            let (peer, conn) = connect_stdio(&ring0.display().to_string(), &["serve".into()], Some(work.path())).await;
            initialize(&peer, &conn).await;
            let qualified = format!("b__{tool}");
            rows.push(("ring0 (stdio)".into(), measure(&peer, &qualified, arg, calls, concurrency).await));
            drop(conn);

            let port = free_port();
            let _server = Served(
                Command::new(&ring0)
                    .args(["serve", "--http", &format!("127.0.0.1:{port}")])
                    .current_dir(work_http.path())
                    .stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null())
                    .spawn().expect("ring0 serve --http"),
            );
            wait_for_port(port).await;
            let (peer, conn) = connect_http(&format!("http://127.0.0.1:{port}/mcp")).await;
            initialize(&peer, &conn).await;
            rows.push(("ring0 (HTTP)".into(), measure(&peer, &qualified, arg, calls, concurrency).await));
            drop(conn);
            drop(_server);

            let port = free_port();
            let mut cmd = Command::new(&proxy);
            cmd.args(["--port", &port.to_string(), "--host", "127.0.0.1", "--", &command]).args(&cargs);
            let _proxy = Served(cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("mcp-proxy"));
            wait_for_port(port).await;
            let (peer, conn) = connect_http(&format!("http://127.0.0.1:{port}/mcp")).await;
            initialize(&peer, &conn).await;
            rows.push(("mcp-proxy (HTTP)".into(), measure(&peer, tool, arg, calls, concurrency).await));
            drop(conn);
            drop(_proxy);

            let base = (rows[0].1.p50, rows[0].1.p99);
            println!("{:<18} {:>10} {:>10} {:>12} {:>12} {:>10}", "path", "p50 µs", "p99 µs", "+p50 µs", "+p99 µs", "calls/s");
            for (name, s) in &rows {
                println!(
                    "{:<18} {:>10.0} {:>10.0} {:>12.0} {:>12.0} {:>10.0}",
                    name, us(s.p50), us(s.p99),
                    us(s.p50) - us(base.0), us(s.p99) - us(base.1), s.per_sec
                );
            }
            let added = |i: usize| (us(rows[i].1.p50) - us(base.0)).max(1.0);
            println!(
                "ring0 added p50 / mcp-proxy added p50: stdio {:.3}, HTTP {:.3} (target ≤ 0.100)\n",
                added(1) / added(3),
                added(2) / added(3)
            );
        }
    });
}
