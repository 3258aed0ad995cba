//! Egress of contained processes, as a user meets it: `ring0 call shell` in a sandbox profile
//! with `network = "proxy"` reaches what the profile's `allow` rules name through ring0's egress
//! proxy (its variables are set for the command), is refused the rest with a 403 from the proxy,
//! and every decision lands in ring0's audit log, under the principal, session and scope of the
//! call. A stdio upstream server whose profile says `network = "proxy"` gets the same, recorded
//! under `upstream:ALIAS`.

mod common;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};

/// The scope the calls run in: the proxy's audit records carry it.
const SCOPE: &str = "egress-scope-41";
/// What the test's HTTP server answers.
const SERVED_BODY: &str = "egress-reached-7c1e";

/// A workspace whose shell runs in profile `net` with `allow`.
struct Scene {
    _dir: tempfile::TempDir,
    ws: PathBuf,
}

impl Scene {
    fn new(allow: &[String]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().canonicalize().unwrap();
        let allow: Vec<String> = allow.iter().map(|r| format!("{r:?}")).collect();
        std::fs::write(
            ws.join("ring0.toml"),
            format!(
                "[workspace]\nstate_dir = \".ring0\"\n\n\
                 [[grants]]\nname = \"contained\"\ntools = [\"shell\"]\nceiling = \"A1\"\nshell = true\n\n\
                 [sandbox]\ntools = {{ shell = \"net\" }}\n\n\
                 [sandbox.profiles.net]\nnetwork = \"proxy\"\nallow = [{}]\n",
                allow.join(", ")
            ),
        )
        .unwrap();
        Self { _dir: dir, ws }
    }

    fn call(&self, args: &Value) -> Output {
        Command::new(env!("CARGO_BIN_EXE_ring0"))
            .current_dir(&self.ws)
            .args(["call", "--scope", SCOPE, "shell", &args.to_string()])
            .output()
            .unwrap()
    }

    /// Runs `script` through the `shell` tool; returns the receipt.
    fn shell(&self, script: &str) -> Value {
        let out = self.call(&json!({"command": script, "timeout_ms": 30_000}));
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {text}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// The egress records of the audit log.
    fn egress_audit(&self) -> Vec<Value> {
        let log = std::fs::read_to_string(self.ws.join(".ring0/audit.jsonl")).unwrap_or_default();
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["tool"] == "egress")
            .collect()
    }
}

/// What the command printed, stdout and stderr.
fn text(receipt: &Value) -> String {
    receipt["outcome"]["observation"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A loopback HTTP server answering every request with [`SERVED_BODY`], on a thread.
fn http_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{SERVED_BODY}",
                SERVED_BODY.len()
            );
        }
    });
    port
}

/// A loopback port with a listener the test holds (so nothing else takes it) that no rule allows.
fn unallowed_port() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// `curl` through the proxy the command's variables name, printing the status it got.
fn curl(url: &str) -> String {
    format!("curl -sS --max-time 20 -x \"$http_proxy\" -w ' status=%{{http_code}}' {url}")
}

fn decisions<'a>(records: &'a [Value], destination: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["args"]["target"].as_str() == Some(destination))
        .collect()
}

#[test]
fn an_allowed_loopback_port_is_reached_through_the_proxy_and_audited() {
    let port = http_server();
    let s = Scene::new(&[format!("127.0.0.1:{port}")]);
    let r = s.shell(&curl(&format!("http://127.0.0.1:{port}/hello")));
    let out = text(&r);
    assert!(out.contains(SERVED_BODY), "{r:#}");
    assert!(out.contains("status=200"), "{r:#}");

    let audit = s.egress_audit();
    let ours = decisions(&audit, &format!("127.0.0.1:{port}"));
    assert_eq!(ours.len(), 1, "{audit:#?}");
    assert_eq!(ours[0]["decision"], "allowed", "{audit:#?}");
    assert_eq!(ours[0]["rule"], format!("egress:127.0.0.1:{port}"));
    assert_eq!(ours[0]["scope"], SCOPE, "{audit:#?}");
    assert_eq!(ours[0]["principal"], "local", "{audit:#?}");
    assert!(
        ours[0]["session_id"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "the record names the call's session: {audit:#?}"
    );
}

#[test]
fn a_background_job_reaches_the_proxy_and_is_audited_under_its_call() {
    let port = http_server();
    let s = Scene::new(&[format!("127.0.0.1:{port}")]);
    let mut serve = serve(&s);
    let started = serve.call(
        "shell",
        json!({"command": curl(&format!("http://127.0.0.1:{port}/job")), "background": true}),
    );
    let job = job_handle(&started);
    let waited = serve.call("job_wait", json!({"job": job, "timeout_ms": 60_000}));
    assert!(waited.to_string().contains(SERVED_BODY), "{waited:#}");
    drop(serve);

    let audit = s.egress_audit();
    let ours = decisions(&audit, &format!("127.0.0.1:{port}"));
    assert_eq!(ours.len(), 1, "{audit:#?}");
    assert_eq!(ours[0]["decision"], "allowed", "{audit:#?}");
    assert_eq!(ours[0]["principal"], "local", "{audit:#?}");
    assert!(
        ours[0]["session_id"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "the record names the session of the call that started the job: {audit:#?}"
    );
}

#[test]
fn a_port_no_rule_allows_is_refused_with_403_and_both_decisions_are_audited() {
    let port = http_server();
    let (outside, refused) = unallowed_port();
    let s = Scene::new(&[format!("127.0.0.1:{port}")]);
    let r = s.shell(&format!(
        "{}; echo; {}",
        curl(&format!("http://127.0.0.1:{port}/")),
        curl(&format!("http://127.0.0.1:{refused}/"))
    ));
    let out = text(&r);
    assert!(out.contains(SERVED_BODY), "{r:#}");
    assert!(out.contains("status=403"), "{r:#}");
    assert!(
        outside.accept().is_err(),
        "the port no rule allows was reached"
    );

    let audit = s.egress_audit();
    let allowed = decisions(&audit, &format!("127.0.0.1:{port}"));
    let denied = decisions(&audit, &format!("127.0.0.1:{refused}"));
    assert_eq!(allowed.len(), 1, "{audit:#?}");
    assert_eq!(allowed[0]["decision"], "allowed");
    assert_eq!(denied.len(), 1, "{audit:#?}");
    assert_eq!(denied[0]["decision"], "denied");
}

#[test]
fn a_name_no_rule_allows_is_refused_without_being_resolved() {
    let port = http_server();
    let s = Scene::new(&[format!("127.0.0.1:{port}")]);
    let r = s.shell(&format!(
        "{}; echo; getent hosts example.com; echo getent=$?",
        curl("http://unlisted.example.com/")
    ));
    let out = text(&r);
    assert!(out.contains("status=403"), "{r:#}");
    // The process itself resolves nothing: its namespace has no network but the proxy's port.
    assert!(out.contains("getent=2"), "{r:#}");

    let audit = s.egress_audit();
    let denied = decisions(&audit, "unlisted.example.com:80");
    assert_eq!(denied.len(), 1, "{audit:#?}");
    assert_eq!(denied[0]["decision"], "denied");
    assert!(
        denied[0]["args"]["address"].is_null(),
        "an unlisted name was resolved: {audit:#?}"
    );
}

#[test]
fn an_allow_rule_without_a_port_is_a_config_error_naming_the_key() {
    let s = Scene::new(&["example.com".to_owned()]);
    let out = s.call(&json!({"argv": ["true"]}));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sandbox.profiles.net.allow[0]"), "{err}");
    assert!(err.contains("has no port"), "{err}");
}

/// `ring0 serve` over stdio in the scene's workspace.
fn serve(s: &Scene) -> common::Serve {
    let mut cmd = Command::new(common::ring0());
    cmd.current_dir(&s.ws).arg("serve");
    common::Serve::start(cmd)
}

/// The job handle (`job_…`) a background `shell` call answered with.
fn job_handle(result: &Value) -> String {
    let text = result.to_string();
    let rest = text
        .split("job_")
        .nth(1)
        .unwrap_or_else(|| panic!("no job handle: {result:#}"));
    let id: String = rest
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    format!("job_{id}")
}

// ---- A stdio upstream server in a `network = "proxy"` profile ----

/// An MCP server (Python SDK) whose tool fetches a URL with `urllib`, which honours the proxy
/// variables the sandbox sets.
const FETCH_SERVER: &str = r#"
import urllib.error, urllib.request
from mcp.server.mcpserver import MCPServer
app = MCPServer("web")
@app.tool()
def fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return f"status={r.status} body={r.read().decode()}"
    except urllib.error.HTTPError as e:
        return f"status={e.code} body={e.read().decode()}"
    except Exception as e:
        return f"error={e!r}"
app.run()
"#;

/// `ring0 serve` (stdio) with the fetch server as upstream `web`, in profile `net` allowing
/// `allow`; returns the text of each `web__fetch` result and the workspace.
fn fetch_through_upstream(allow: &str, urls: &[String]) -> Option<(Vec<String>, Scene)> {
    let peers = common::peers()?;
    let s = Scene::new(&[]);
    std::fs::write(s.ws.join("fetch.py"), FETCH_SERVER).unwrap();
    let config = format!(
        "{}\n[sandbox]\nupstreams = {{ web = \"net\" }}\n\n\
         [sandbox.profiles.net]\nnetwork = \"proxy\"\nallow = [{allow:?}]\n",
        common::one_upstream_config(
            "up",
            "[\"web__*\"]",
            "A0",
            "web",
            &format!(
                "command = {:?}\nargs = [{:?}]",
                common::python(&peers).display().to_string(),
                s.ws.join("fetch.py").display().to_string(),
            ),
            "",
        )
    );
    std::fs::write(s.ws.join("ring0.toml"), config).unwrap();
    let mut serve = serve(&s);
    serve.wait_for_tool("web__fetch");
    let out = urls
        .iter()
        .map(|url| serve.call("web__fetch", json!({"url": url})).to_string())
        .collect();
    drop(serve);
    Some((out, s))
}

#[test]
fn a_stdio_upstream_in_a_proxy_profile_reaches_what_it_allows_and_is_refused_the_rest() {
    let port = http_server();
    let (_outside, refused) = unallowed_port();
    let urls = [
        format!("http://127.0.0.1:{port}/allowed"),
        format!("http://127.0.0.1:{refused}/refused"),
    ];
    let Some((results, s)) = fetch_through_upstream(&format!("127.0.0.1:{port}"), &urls) else {
        return;
    };
    assert!(results[0].contains("status=200"), "{}", results[0]);
    assert!(results[0].contains(SERVED_BODY), "{}", results[0]);
    assert!(results[1].contains("status=403"), "{}", results[1]);
    assert!(
        results[1].contains("not in the allow-list") || results[1].contains("port"),
        "{}",
        results[1]
    );

    let audit = s.egress_audit();
    let allowed = decisions(&audit, &format!("127.0.0.1:{port}"));
    let denied = decisions(&audit, &format!("127.0.0.1:{refused}"));
    assert_eq!(allowed.len(), 1, "{audit:#?}");
    assert_eq!(allowed[0]["decision"], "allowed", "{audit:#?}");
    assert_eq!(allowed[0]["principal"], "upstream:web", "{audit:#?}");
    assert_eq!(denied.len(), 1, "{audit:#?}");
    assert_eq!(denied[0]["decision"], "denied", "{audit:#?}");
}
