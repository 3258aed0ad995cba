//! Who is calling `ring0 serve --http`: static tokens and JWTs name principals, requests
//! without a valid credential get 401 with a pointer to the protected-resource metadata, and a
//! session answers only the principal that opened it. Driven through the real binary, with raw
//! HTTP where the exact status and headers matter and the Python MCP SDK client where a real
//! client's session matters.

mod common;

use base64::Engine;
use common::*;
use ring::rand::SystemRandom;
use ring::signature::{self as sig, KeyPair};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

const ISSUER: &str = "https://id.ring0.test";
const RESOURCE: &str = "https://ring0.test/mcp";
const METADATA_URL: &str = "https://ring0.test/.well-known/oauth-protected-resource/mcp";

/// A running `ring0 serve --http` whose log lines are kept.
struct Served {
    server: HttpServer,
    log: Arc<Mutex<Vec<String>>>,
}

impl Served {
    /// Whether ring0 logs a line containing `needle` (waiting up to [`HTTP_WAIT`]: the line is
    /// written before the response leaves, but read from the pipe by another thread).
    fn log_has(&self, needle: &str) -> bool {
        let deadline = std::time::Instant::now() + HTTP_WAIT;
        loop {
            if self.log.lock().unwrap().iter().any(|l| l.contains(needle)) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

fn serve(dir: &Path, envs: &[(&str, &str)], args: &[&str]) -> Served {
    let mut cmd = serve_http_command(dir);
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let lines = log.clone();
    let server = start_http_with(cmd, move |line| {
        lines.lock().unwrap().push(line.to_string())
    });
    Served { server, log }
}

fn init_body() -> Value {
    initialize_request(1, "2025-06-18")
}

fn list_body() -> Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// One raw GET; returns the head and body.
fn get_raw(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(HTTP_WAIT)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.to_string(), body.to_string())
}

fn two_token_config(dir: &Path) {
    std::fs::write(
        dir.join("ring0.toml"),
        format!(
            "defaults = false\n[[grants]]\nname = \"read\"\ntools = [\"read_file\", \"list_dir\"]\nceiling = \"A0\"\n\n\
             [auth]\nresource = {RESOURCE:?}\n\n\
             {}\n{}",
            token_table("alice", "alice-token", "groups = [\"eng\"]\n"),
            token_table("bob-laptop", "bob-token", "principal = \"bob\"\n")
        ),
    )
    .unwrap();
    std::fs::write(dir.join("hello.txt"), "hello from the workspace\n").unwrap();
}

fn run_py(peers: &Path, url: &str, token: &str, mode: &str) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_auth.py");
    python_report(
        Command::new(python(peers))
            .arg(&script)
            .args([url, token, mode]),
    )
}

// ---- static tokens ----

#[test]
fn two_static_tokens_authenticate_two_principals_through_the_python_sdk() {
    let Some(peers) = peers() else { return };
    let dir = tempfile::tempdir().unwrap();
    two_token_config(dir.path());
    let s = serve(dir.path(), &[], &[]);
    for (token, principal) in [("alice-token", "alice"), ("bob-token", "bob")] {
        let seen = run_py(&peers, &s.server.url(), token, "legacy");
        assert_eq!(seen["read"]["is_error"], false, "{seen}");
        assert!(
            seen["read"]["text"]
                .as_str()
                .unwrap()
                .contains("hello from the workspace"),
            "{seen}"
        );
        assert!(
            s.log_has(&format!("HTTP session opened for principal {principal}")),
            "{:?}",
            s.log.lock().unwrap()
        );
    }
    // Without a token the SDK's session does not get as far as listing tools.
    let refused = run_py(&peers, &s.server.url(), "-", "legacy");
    assert!(refused.get("tools").is_none(), "{refused}");
    assert!(refused["error"].is_string(), "{refused}");
}

#[test]
fn a_session_answers_only_the_principal_that_opened_it() {
    let dir = tempfile::tempdir().unwrap();
    two_token_config(dir.path());
    let s = serve(dir.path(), &[], &[]);
    let addr = &s.server.addr;
    let alice = bearer("alice-token");
    let bob = bearer("bob-token");
    let (head, _) = post_raw(addr, &[("Authorization", &alice)], &init_body());
    assert_eq!(status(&head), 200, "{head}");
    let session = header(&head, "mcp-session-id")
        .expect("a session id")
        .to_string();
    let with = |auth: &str| {
        post_raw(
            addr,
            &[
                ("Authorization", auth),
                ("Mcp-Session-Id", &session),
                ("MCP-Protocol-Version", "2025-06-18"),
            ],
            &list_body(),
        )
    };
    // Bob holding Alice's session id is told the session does not exist.
    let (head, body) = with(&bob);
    assert_eq!(status(&head), 404, "{head}\n{body}");
    assert!(!body.contains("read_file"), "{body}");
    assert!(s.log_has("refused a request of principal bob for another principal's session"));
    // A session id nobody opened is as unknown.
    let (head, _) = post_raw(
        addr,
        &[("Authorization", &alice), ("Mcp-Session-Id", "made-up")],
        &list_body(),
    );
    assert_eq!(status(&head), 404, "{head}");
    // Alice's own session still answers her.
    let (head, body) = with(&alice);
    assert_eq!(status(&head), 200, "{head}\n{body}");
    assert!(body.contains("read_file"), "{body}");
}

#[test]
fn a_missing_or_unknown_token_gets_401_pointing_at_the_metadata() {
    let dir = tempfile::tempdir().unwrap();
    two_token_config(dir.path());
    let s = serve(dir.path(), &[], &[]);
    let (head, _) = post_raw(&s.server.addr, &[], &init_body());
    assert_eq!(status(&head), 401, "{head}");
    assert_eq!(
        header(&head, "www-authenticate"),
        Some(format!("Bearer resource_metadata=\"{METADATA_URL}\"").as_str())
    );
    let (head, _) = post_raw(
        &s.server.addr,
        &[("Authorization", &bearer("guess"))],
        &init_body(),
    );
    assert_eq!(status(&head), 401, "{head}");
    let challenge = header(&head, "www-authenticate").unwrap();
    assert!(challenge.contains(METADATA_URL), "{challenge}");
    assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");
    // A stateless 2026-07-28 request is authenticated on its own, like every request.
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {},
                      "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}});
    let list =
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": meta}});
    let stateless = [
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/list"),
    ];
    let (head, _) = post_raw(&s.server.addr, &stateless, &list);
    assert_eq!(status(&head), 401, "{head}");
    let auth = bearer("bob-token");
    let mut with_token = stateless.to_vec();
    with_token.push(("Authorization", &auth));
    let (head, body) = post_raw(&s.server.addr, &with_token, &list);
    assert_eq!(status(&head), 200, "{head}\n{body}");
    assert!(body.contains("read_file"), "{body}");
}

#[test]
fn the_protected_resource_metadata_names_the_resource_and_its_issuer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        format!(
            "[auth]\nresource = {RESOURCE:?}\nauthorization_servers = [{ISSUER:?}]\n\n\
             {}",
            token_table("ci", "t", "")
        ),
    )
    .unwrap();
    let s = serve(dir.path(), &[], &[]);
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let (head, body) = get_raw(&s.server.addr, path);
        assert_eq!(status(&head), 200, "{path}: {head}");
        let body = if head.to_ascii_lowercase().contains("chunked") {
            dechunk(&body)
        } else {
            body
        };
        let doc: Value = serde_json::from_str(&body).expect("JSON metadata");
        assert_eq!(doc["resource"], RESOURCE);
        assert_eq!(doc["authorization_servers"], json!([ISSUER]));
        assert_eq!(doc["bearer_methods_supported"], json!(["header"]));
    }
}

#[test]
fn the_token_env_token_still_authenticates_as_the_local_user() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(
        dir.path(),
        &[("RING0_TEST_TOKEN", "s3cret")],
        &["--token-env", "RING0_TEST_TOKEN"],
    );
    let (head, _) = post_raw(&s.server.addr, &[], &init_body());
    assert_eq!(status(&head), 401, "{head}");
    assert!(
        header(&head, "www-authenticate")
            .unwrap()
            .contains("resource_metadata=")
    );
    let (head, _) = post_raw(
        &s.server.addr,
        &[("Authorization", &bearer("s3cret"))],
        &init_body(),
    );
    assert_eq!(status(&head), 200, "{head}");
    assert!(s.log_has("HTTP session opened for principal local"));
}

#[test]
fn without_credentials_a_non_loopback_bind_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(ring0())
        .args(["serve", "--http", "0.0.0.0:0", "--allow-host", "ring0.test"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs credentials"), "{err}");
}

// ---- ring0 token add ----

#[test]
fn token_add_prints_a_token_once_stores_its_hash_and_the_token_then_authenticates() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(ring0())
        .args([
            "token",
            "add",
            "ci",
            "--principal",
            "ci-bot",
            "--group",
            "automation",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let token = stdout.trim();
    assert_eq!(
        stdout.lines().count(),
        1,
        "only the token on stdout: {stdout}"
    );
    assert!(token.len() >= 40, "{token}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains(token),
        "the token is printed once: {stderr}"
    );
    let config = std::fs::read_to_string(dir.path().join("ring0.toml")).unwrap();
    assert!(!config.contains(token), "{config}");
    assert!(config.contains(&sha256_hex(token)), "{config}");
    assert!(config.contains("principal = \"ci-bot\""), "{config}");
    // The embedded defaults came along: the shell grant is still there.
    assert!(config.contains("name = \"shell\""), "{config}");
    // A second token of the same name is refused and leaves the file alone.
    let again = Command::new(ring0())
        .args(["token", "add", "ci"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("used twice"));
    assert!(again.stdout.is_empty());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ring0.toml")).unwrap(),
        config
    );

    let s = serve(dir.path(), &[], &[]);
    let (head, _) = post_raw(&s.server.addr, &[], &init_body());
    assert_eq!(status(&head), 401, "{head}");
    let (head, body) = post(
        &s.server.addr,
        &[("Authorization", &bearer(token))],
        &init_body(),
    );
    assert!(head.contains(" 200 "), "{head}\n{body}");
    assert!(s.log_has("HTTP session opened for principal ci-bot"));
}

// ---- JWTs ----

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

struct Issuer {
    key: sig::EcdsaKeyPair,
}

impl Issuer {
    fn new() -> Self {
        let rng = SystemRandom::new();
        let alg = &sig::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = sig::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        Self {
            key: sig::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap(),
        }
    }

    fn jwks(&self, kid: &str) -> Value {
        let point = self.key.public_key().as_ref();
        json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
                          "x": b64(&point[1..33]), "y": b64(&point[33..65])}]})
    }

    fn token(&self, header: Value, claims: &Value) -> String {
        let message = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = self
            .key
            .sign(&SystemRandom::new(), message.as_bytes())
            .unwrap();
        format!("{message}.{}", b64(signature.as_ref()))
    }
}

fn claims() -> Value {
    json!({"iss": ISSUER, "aud": RESOURCE, "sub": "carol", "exp": now() + 600,
           "groups": ["eng"]})
}

fn jwt_server(issuer: &Issuer) -> (tempfile::TempDir, Served) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("jwks.json"), issuer.jwks("k1").to_string()).unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        format!(
            "defaults = false\n[[grants]]\nname = \"read\"\ntools = [\"read_file\"]\nceiling = \"A0\"\n\n\
             [auth]\nresource = {RESOURCE:?}\nauthorization_servers = [{ISSUER:?}]\n\n\
             [auth.jwt]\nissuer = {ISSUER:?}\njwks_file = \"jwks.json\"\ngroups_claim = \"groups\"\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("hello.txt"), "hello from the workspace\n").unwrap();
    let s = serve(dir.path(), &[], &[]);
    (dir, s)
}

#[test]
fn a_valid_jwt_opens_a_session_for_its_subject_in_both_eras() {
    let Some(peers) = peers() else { return };
    let issuer = Issuer::new();
    let (_dir, s) = jwt_server(&issuer);
    let token = issuer.token(json!({"alg": "ES256", "kid": "k1"}), &claims());
    for mode in ["legacy", "2026-07-28"] {
        let seen = run_py(&peers, &s.server.url(), &token, mode);
        assert_eq!(seen["read"]["is_error"], false, "{mode}: {seen}");
        assert!(
            seen["read"]["text"]
                .as_str()
                .unwrap()
                .contains("hello from the workspace"),
            "{mode}: {seen}"
        );
    }
    assert!(s.log_has("HTTP session opened for principal carol"));
}

#[test]
fn jwts_that_fail_verification_each_get_401_with_the_challenge() {
    let issuer = Issuer::new();
    let (_dir, s) = jwt_server(&issuer);
    let header = json!({"alg": "ES256", "kid": "k1"});
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims();
        f(&mut c);
        c
    };
    let mut cases: Vec<(&str, String)> = vec![
        (
            "wrong audience",
            issuer.token(
                header.clone(),
                &with(&|c| c["aud"] = json!("https://other.test/mcp")),
            ),
        ),
        (
            "wrong issuer",
            issuer.token(
                header.clone(),
                &with(&|c| c["iss"] = json!("https://evil.test")),
            ),
        ),
        (
            "expired",
            issuer.token(header.clone(), &with(&|c| c["exp"] = json!(now() - 3600))),
        ),
        (
            "unknown kid",
            issuer.token(json!({"alg": "ES256", "kid": "k9"}), &claims()),
        ),
        (
            "another issuer's key",
            Issuer::new().token(header.clone(), &claims()),
        ),
    ];
    let good = issuer.token(header.clone(), &claims());
    let (message, signature) = good.rsplit_once('.').unwrap();
    let mut raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .unwrap();
    raw[10] ^= 0x40;
    cases.push(("bad signature", format!("{message}.{}", b64(&raw))));
    let none = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "kid": "k1"}).to_string().as_bytes()),
        b64(claims().to_string().as_bytes())
    );
    cases.push(("alg none", none));
    for (what, token) in &cases {
        let (head, body) = post_raw(
            &s.server.addr,
            &[("Authorization", &bearer(token))],
            &init_body(),
        );
        assert_eq!(status(&head), 401, "{what}: {head}\n{body}");
        let challenge = header_of(&head);
        assert!(
            challenge.starts_with(&format!("Bearer resource_metadata=\"{METADATA_URL}\"")),
            "{what}: {challenge}"
        );
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
    }
    // The good token passes, so each refusal above was for its own flaw.
    let (head, _) = post_raw(
        &s.server.addr,
        &[("Authorization", &bearer(&good))],
        &init_body(),
    );
    assert_eq!(status(&head), 200, "{head}");
}

fn header_of(head: &str) -> String {
    header(head, "www-authenticate")
        .unwrap_or_default()
        .to_string()
}

// ---- upstreams ----

/// The header recorder upstream, killed when dropped.
struct Recorder {
    child: std::process::Child,
    url: String,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_recorder(record: &Path) -> Recorder {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/header_recorder.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .arg(record)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .expect("the recorder's address")
        .to_string();
    Recorder { child, url }
}

#[test]
fn a_clients_token_never_reaches_an_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("upstream-requests.jsonl");
    let recorder = start_recorder(&record);
    let config = one_upstream_config(
        "rec",
        "[\"rec__*\"]",
        "A0",
        "rec",
        &format!(
            "url = {:?}\nheaders = {{ X-Upstream-Key = \"configured\" }}",
            recorder.url
        ),
        "",
    );
    std::fs::write(
        dir.path().join("ring0.toml"),
        format!(
            "{config}\n{}",
            token_table("alice", "alice-client-secret", "")
        ),
    )
    .unwrap();
    let s = serve(dir.path(), &[], &[]);
    let auth = bearer("alice-client-secret");
    let (head, _) = post_raw(&s.server.addr, &[("Authorization", &auth)], &init_body());
    assert_eq!(status(&head), 200, "{head}");
    let session = header(&head, "mcp-session-id").unwrap().to_string();
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "rec__ping", "arguments": {}}});
    let (head, reply) = post(
        &s.server.addr,
        &[
            ("Authorization", &auth),
            ("Mcp-Session-Id", &session),
            ("MCP-Protocol-Version", "2025-06-18"),
        ],
        &call,
    );
    assert!(head.contains(" 200 "), "{head}");
    assert_eq!(reply["result"]["content"][0]["text"], "pong", "{reply}");
    let requests: Vec<Value> = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let forwarded = requests
        .iter()
        .find(|r| r["method"] == "tools/call")
        .expect("the call reached the upstream");
    assert_eq!(forwarded["headers"]["x-upstream-key"], "configured");
    for r in &requests {
        assert!(r["headers"].get("authorization").is_none(), "{r}");
        assert!(!r.to_string().contains("alice-client-secret"), "{r}");
    }
}
