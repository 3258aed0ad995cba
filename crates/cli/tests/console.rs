//! The web console at `/console`, end to end in headless Chromium (Debian's `chromium`, driven
//! by playwright-core): an operator sees the call held for approval — its argument holding a
//! script shown as text, never run — approves it and sees it run (counted by the upstream
//! fixture), and marks a dead letter not applied; approves a quarantined upstream tool after
//! seeing its definition's diff; watches a background job's output arrive on its page, kept
//! live by ring0's own script; a principal without the operator role is refused. The pages'
//! screenshots are saved (see `screenshots`); those in docs/console/ come from this test.

mod common;

use common::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);
const CHROMIUM: &str = "/usr/bin/chromium";
/// An argument a model could send to get script into a person's browser.
const INJECTED: &str = "<script>window.__pwned=1</script>";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Where the pages' screenshots are saved: the build's temporary directory, or the directory
/// `RING0_CONSOLE_SCREENSHOTS` names (`docs/console` refreshes the documentation's; relative to
/// the repository), so a test run leaves the working tree as it was.
fn screenshots() -> PathBuf {
    match std::env::var_os("RING0_CONSOLE_SCREENSHOTS") {
        Some(dir) => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(dir),
        None => Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots"),
    }
}

/// `fx__append` held for approval, `fx__append_lane` not; alice is an operator, bob is not.
fn workspace(peers: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[workspace]\nstate_dir = \".ring0\"\n\n\
         [approval]\ntimeout_secs = 600\n\n\
         [console]\noperators = [\"alice\"]\n\n\
         [[grants]]\nname = \"held\"\ntools = [\"fx__append\"]\nceiling = \"A2\"\napproval = true\n\
         approval_scope = \"session\"\n\n\
         [[grants]]\nname = \"lanes\"\ntools = [\"fx__append_lane\"]\nceiling = \"A2\"\n\n\
         [[grants]]\nname = \"patches\"\ntools = [\"apply_patch\"]\nceiling = \"A1\"\napproval = true\n\n\
         [[upstreams]]\nalias = \"fx\"\ncommand = {:?}\nargs = [{:?}, \"--dir\", {:?}]\n\n\
         [upstreams.tools.append]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n\n\
         [upstreams.tools.append_lane]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n\n{}",
        python(peers).display().to_string(),
        fixtures().join("effect_upstream.py").display().to_string(),
        dir.path().display().to_string(),
        alice_and_bob_tokens(),
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    dir
}

fn client(peers: &Path, server: &HttpServer, tool: &str, args: Value, key: &str) -> Command {
    let mut cmd = Command::new(python(peers));
    cmd.arg(fixtures().join("py_client_settle.py"))
        .args([&server.url(), tool, &args.to_string(), key])
        .env("CLIENT_TOKEN", "alice-token")
        .env("HOME", test_home());
    cmd
}

fn browser(peers: &Path, server: &HttpServer, token: &str, scenario: &str) -> Value {
    browser_with(peers, server, token, scenario, "")
}

/// [`browser`] with the scenario's extra argument.
fn browser_with(
    peers: &Path,
    server: &HttpServer,
    token: &str,
    scenario: &str,
    extra: &str,
) -> Value {
    let shots = screenshots();
    std::fs::create_dir_all(&shots).unwrap();
    let out = Command::new(peers.join("node/node_modules/.bin/node"))
        .arg(fixtures().join("console_browser.js"))
        .arg(peers.join("node/node_modules/playwright-core"))
        .args([
            &format!("http://{}", server.addr),
            token,
            &shots.display().to_string(),
            scenario,
            extra,
        ])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|_| panic!("the browser script said:\n{stdout}\n{}", text(&out.stderr)));
    assert!(report.get("error").is_none(), "{report}");
    report
}

fn effects(dir: &Path, line: &str) -> usize {
    std::fs::read_to_string(dir.join("effects.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == line)
        .count()
}

fn kill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn an_operator_approves_a_held_call_and_settles_a_dead_letter_in_the_browser() {
    let Some(peers) = peers() else { return };
    if !Path::new(CHROMIUM).exists() {
        return skip_or_fail("no /usr/bin/chromium").unwrap_or(());
    }
    let dir = workspace(&peers);
    let mut cmd = serve_http_command(dir.path());
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let server = start_http(cmd);

    // A dead letter: the service fails before acting, and ring0 cannot know it did not act.
    let dead = python_report(&mut client(
        &peers,
        &server,
        "fx__append_lane",
        json!({"text": "late-order", "lane": "x", "fail_until": "never"}),
        "key-dead",
    ));
    assert_eq!(dead["is_error"], true, "{dead}");
    // A held call whose argument carries a script; its client never answers.
    let held = client(
        &peers,
        &server,
        "fx__append",
        json!({"text": INJECTED}),
        "key-held",
    )
    .arg("--never-answer")
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();

    let seen = browser(&peers, &server, "alice-token", "operator");
    kill(held);
    let pending = seen["pending_text"].as_str().unwrap_or("");
    assert!(pending.contains(INJECTED), "shown as text: {seen}");
    assert_eq!(seen["script_elements"], 0, "{seen}");
    assert_eq!(seen["pwned"], false, "never run: {seen}");
    assert_eq!(seen["dead_letters"], 1, "{seen}");

    // The approved call runs, once.
    let deadline = Instant::now() + WAIT;
    while effects(dir.path(), INJECTED) < 1 {
        assert!(Instant::now() < deadline, "the approved call never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(effects(dir.path(), INJECTED), 1);
    assert_eq!(effects(dir.path(), "late-order"), 0);
    let journal = seen["journal_text"].as_str().unwrap_or("");
    assert!(journal.contains("fx__append_lane"), "{seen}");
    assert!(journal.contains("marked it not applied"), "{seen}");
    for shot in ["pending.png", "after.png", "journal.png"] {
        assert!(screenshots().join(shot).exists(), "{shot} saved");
    }
}

#[test]
fn a_principal_without_the_operator_role_is_refused_the_console() {
    let Some(peers) = peers() else { return };
    if !Path::new(CHROMIUM).exists() {
        return skip_or_fail("no /usr/bin/chromium").unwrap_or(());
    }
    let dir = workspace(&peers);
    let mut cmd = serve_http_command(dir.path());
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let server = start_http(cmd);
    let seen = browser(&peers, &server, "bob-token", "outsider");
    assert_eq!(seen["status"], 403, "{seen}");
    assert!(
        seen["text"]
            .as_str()
            .unwrap_or("")
            .contains("operator role"),
        "{seen}"
    );
}

#[test]
fn a_console_form_posted_without_its_token_is_refused() {
    use std::io::{Read, Write};
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let mut cmd = serve_http_command(dir.path());
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let server = start_http(cmd);
    let body = "csrf=0000";
    let mut s = std::net::TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let request = format!(
        "POST /console/approvals/ap_00/approve HTTP/1.1\r\nHost: {}\r\n\
         Authorization: Bearer alice-token\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        server.addr,
        body.len()
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, rest) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    assert_eq!(status(head), 403, "{out}");
    assert!(rest.contains("token is not valid"), "{out}");
}

/// Serves `ring0 serve` (stdio) once at `stage` of the mediated fixture and lists its tools, so
/// that its definitions are pinned (the first stage) or quarantined (a changed one).
fn list_at_stage(dir: &Path, stage: &str) {
    use std::io::Write;
    let mut cmd = Command::new(ring0());
    cmd.arg("serve")
        .current_dir(dir)
        .env("FIXTURE_STAGE", stage)
        .stderr(Stdio::null());
    let (mut child, mut stdin, messages) = spawn_stdio_json(cmd);
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    while messages.recv_timeout(WAIT).expect("ring0 answers")["id"] != 2 {}
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn an_operator_approves_a_quarantined_tool_after_seeing_its_diff() {
    let Some(peers) = peers() else { return };
    if !Path::new(CHROMIUM).exists() {
        return skip_or_fail("no /usr/bin/chromium").unwrap_or(());
    }
    let dir = tempfile::tempdir().unwrap();
    let transport = format!(
        "command = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\", \"FIXTURE_STAGE\"]\n",
        fixtures()
            .join("mediated_upstream.py")
            .display()
            .to_string()
    );
    let config = one_upstream_config("fixture", r#"["fx__*"]"#, "A3", "fx", &transport, "");
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    list_at_stage(dir.path(), "v1");
    let mut cmd = serve_http_command(dir.path());
    cmd.env("FIXTURE_STAGE", "v2")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let server = start_http(cmd);

    let seen = browser(&peers, &server, "", "tools");
    let before = seen["before"].as_str().unwrap_or("");
    assert!(before.contains("fx__send_mail"), "{seen}");
    assert!(
        before.contains("bcc"),
        "the diff shows the added parameter: {seen}"
    );
    let pin = seen["pin"].as_str().unwrap_or("");
    assert!(pin.starts_with("sha256:"), "{seen}");
    // Only the definition approved leaves the list; the other change still waits.
    let after = seen["after"].as_str().unwrap_or("");
    assert!(!after.contains("fx__send_mail"), "{seen}");
    assert!(after.contains("fx__greet"), "{seen}");
    let lock = std::fs::read_to_string(dir.path().join("ring0.lock")).unwrap();
    assert!(
        lock.contains(pin),
        "exactly the definition shown was approved"
    );
    assert!(screenshots().join("tools.png").exists());
}

#[test]
fn a_held_patch_is_shown_to_the_operator_as_a_diff() {
    let Some(peers) = peers() else { return };
    if !Path::new(CHROMIUM).exists() {
        return skip_or_fail("no /usr/bin/chromium").unwrap_or(());
    }
    let dir = workspace(&peers);
    std::fs::write(dir.path().join("notes.txt"), "one\n").unwrap();
    let mut cmd = serve_http_command(dir.path());
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let server = start_http(cmd);
    let patch =
        "*** Begin Patch\n*** Update File: notes.txt\n@@\n-one\n+two <b>bold</b>\n*** End Patch\n";
    let held = client(
        &peers,
        &server,
        "apply_patch",
        json!({"patch": patch}),
        "key-patch",
    )
    .arg("--never-answer")
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let seen = browser(&peers, &server, "alice-token", "diff");
    kill(held);
    assert_eq!(seen["added"], json!(["+two <b>bold</b>"]), "{seen}");
    assert_eq!(seen["deleted"], json!(["-one"]), "{seen}");
    assert_eq!(
        seen["bold_elements"], 0,
        "markup in a patch is text: {seen}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "one\n",
        "nothing ran"
    );
    assert!(screenshots().join("diff.png").exists());
}

#[test]
fn an_operator_allows_a_held_call_for_its_session_and_the_identical_call_runs_unasked() {
    let Some(peers) = peers() else { return };
    if !Path::new(CHROMIUM).exists() {
        return skip_or_fail("no /usr/bin/chromium").unwrap_or(());
    }
    let dir = workspace(&peers);
    let mut cmd = serve_http_command(dir.path());
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let server = start_http(cmd);
    let mut calls = client(
        &peers,
        &server,
        "fx__append",
        json!({"text": "twice"}),
        "key-s",
    );
    let calls = calls
        .args(["--never-answer", "--twice"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = browser(&peers, &server, "alice-token", "session");
    assert!(
        seen["label"]
            .as_str()
            .unwrap_or("")
            .contains("this session"),
        "{seen}"
    );
    // The client's second, identical call is not held again: both calls end, both ran.
    let deadline = Instant::now() + WAIT;
    let mut calls = calls;
    while calls.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the identical call was held again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = calls.wait_with_output().unwrap();
    let report: Value = serde_json::from_str(text(&out.stdout).lines().last().unwrap_or(""))
        .unwrap_or_else(|_| panic!("{}", text(&out.stdout)));
    assert_eq!(report["is_error"], false, "{report}");
    assert_eq!(report["second"]["is_error"], false, "{report}");
    assert_eq!(effects(dir.path(), "twice"), 2);
}

/// `shell` contained (A1) without approval, alice an operator.
fn jobs_workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[workspace]\nstate_dir = \".ring0\"\n\n\
         [console]\noperators = [\"alice\"]\n\n\
         [[grants]]\nname = \"contained\"\ntools = [\"shell\", \"job_*\"]\nceiling = \"A1\"\nshell = true\n\n{}",
        alice_and_bob_tokens(),
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    dir
}

#[test]
fn an_operator_watches_a_background_jobs_output_arrive_on_its_console_page() {
    let Some(peers) = peers() else { return };
    if !Path::new(CHROMIUM).exists() {
        return skip_or_fail("no /usr/bin/chromium").unwrap_or(());
    }
    let dir = jobs_workspace();
    let ws = dir.path().canonicalize().unwrap();
    let mut cmd = serve_http_command(&ws);
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let server = start_http(cmd);
    // The job prints a line, waits for the browser to create `release`, prints markup and a
    // last line; detached, it outlives the client's session.
    let script = format!(
        "echo first line; while [ ! -e release ]; do sleep 0.05; done; echo '{INJECTED} <b>bold</b>'; echo last line"
    );
    let started = python_report(&mut client(
        &peers,
        &server,
        "shell",
        json!({"argv": ["sh", "-c", script], "background": true, "detached": true}),
        "key-job",
    ));
    assert_eq!(started["is_error"], false, "{started}");
    let release = ws.join("release");
    let seen = browser_with(
        &peers,
        &server,
        "alice-token",
        "jobs",
        &release.display().to_string(),
    );
    let list = seen["list_text"].as_str().unwrap_or("");
    assert!(list.contains("sh -c"), "the command is listed: {seen}");
    let before = seen["tail_before"].as_str().unwrap_or("");
    assert!(before.contains("first line"), "{seen}");
    assert!(!before.contains("last line"), "{seen}");
    assert_ne!(seen["state_before"], "COMPLETED", "{seen}");
    let after = seen["tail_after"].as_str().unwrap_or("");
    assert!(
        after.contains("last line"),
        "arrived without a reload: {seen}"
    );
    assert!(after.contains(INJECTED), "output is shown as text: {seen}");
    assert_eq!(seen["bold_elements"], 0, "{seen}");
    assert_eq!(seen["pwned"], false, "{seen}");
    assert_eq!(seen["state_after"], "COMPLETED", "{seen}");
    assert_eq!(seen["exit_after"], "exit 0", "{seen}");
    assert_eq!(seen["live"], "finished", "{seen}");
    assert!(seen.get("console_errors").is_none(), "{seen}");
    // The page runs one script, ring0's own, by a nonce made for the response.
    let csp = seen["csp"].as_str().unwrap_or("");
    let nonces = seen["script_nonces"].as_array().unwrap();
    assert_eq!(nonces.len(), 1, "{seen}");
    let nonce = nonces[0].as_str().unwrap_or("");
    assert!(nonce.len() >= 32, "{seen}");
    assert!(
        csp.contains(&format!("script-src 'nonce-{nonce}'")),
        "{csp}"
    );
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    assert!(!csp.contains("script-src 'unsafe"), "{csp}");
    for shot in ["jobs.png", "job.png"] {
        assert!(screenshots().join(shot).exists(), "{shot} saved");
    }
}

#[test]
fn an_operator_signs_in_with_the_form_acts_and_signs_out_and_a_non_operator_is_refused() {
    let Some(peers) = peers() else { return };
    if !Path::new(CHROMIUM).exists() {
        return skip_or_fail("no /usr/bin/chromium").unwrap_or(());
    }
    let dir = workspace(&peers);
    let mut cmd = serve_http_command(dir.path());
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let server = start_http(cmd);
    let held = client(
        &peers,
        &server,
        "fx__append",
        json!({"text": "signed-in"}),
        "key-login",
    )
    .arg("--never-answer")
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    // No bearer header: the browser has only the form.
    let seen = browser_with(&peers, &server, "", "login", "alice-token bob-token");
    kill(held);
    let login_url = format!("http://{}/console/login", server.addr);
    assert_eq!(seen["unsigned_url"], login_url.as_str(), "{seen}");
    assert_eq!(seen["outsider_status"], 403, "{seen}");
    assert!(
        seen["outsider_text"]
            .as_str()
            .unwrap_or("")
            .contains("operator role"),
        "{seen}"
    );
    assert_eq!(
        seen["outsider_cookies"], 0,
        "no session for a non-operator: {seen}"
    );
    assert_eq!(seen["wrong_status"], 401, "{seen}");
    assert_eq!(
        seen["signed_url"],
        format!("http://{}/console", server.addr).as_str(),
        "{seen}"
    );
    let cookies = seen["cookies"].as_array().unwrap();
    assert_eq!(cookies.len(), 1, "{seen}");
    let cookie = &cookies[0];
    assert_eq!(cookie["name"], "ring0_console");
    assert_eq!(cookie["httpOnly"], true, "{seen}");
    assert_eq!(cookie["sameSite"], "Strict", "{seen}");
    assert_eq!(cookie["path"], "/console", "{seen}");
    let value = cookie["value"].as_str().unwrap_or("");
    assert_eq!(value.len(), 64, "an opaque random id: {seen}");
    assert!(!value.contains("alice"), "never the token: {seen}");
    assert_eq!(seen["script_cookie"], "", "no script reads it: {seen}");
    // The signed-in operator's approval ran the call, once.
    let deadline = Instant::now() + WAIT;
    while effects(dir.path(), "signed-in") < 1 {
        assert!(Instant::now() < deadline, "the approved call never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(effects(dir.path(), "signed-in"), 1);
    assert_eq!(seen["signed_out_cookies"], 0, "{seen}");
    assert_eq!(
        seen["old_cookie_url"],
        login_url.as_str(),
        "the session ended on the server: {seen}"
    );
    assert!(screenshots().join("login.png").exists());
}

/// One raw request to the server; returns the response's head and body.
fn raw(server: &HttpServer, request: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, rest) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.to_string(), rest.to_string())
}

#[test]
fn a_sign_in_posted_from_another_origin_is_refused_and_gets_no_cookie() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let mut cmd = serve_http_command(dir.path());
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let server = start_http(cmd);
    let sign_in = |origin: &str| {
        let body = "token=alice-token";
        raw(
            &server,
            &format!(
                "POST /console/login HTTP/1.1\r\nHost: {}\r\nOrigin: {origin}\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                server.addr,
                body.len()
            ),
        )
    };
    let (head, body) = sign_in("http://evil.example");
    assert_eq!(status(&head), 403, "{head}\n{body}");
    assert!(header(&head, "set-cookie").is_none(), "{head}");
    let (head, _) = sign_in(&format!("http://{}", server.addr));
    assert_eq!(status(&head), 303, "{head}");
    let cookie = header(&head, "set-cookie").unwrap_or("");
    assert!(cookie.starts_with("ring0_console="), "{head}");
    assert!(!cookie.contains("Secure"), "plain HTTP: {head}");
    // Behind a proxy that terminated TLS the cookie is Secure.
    let body = "token=alice-token";
    let (head, _) = raw(
        &server,
        &format!(
            "POST /console/login HTTP/1.1\r\nHost: {}\r\nX-Forwarded-Proto: https\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            server.addr,
            body.len()
        ),
    );
    assert!(
        header(&head, "set-cookie")
            .unwrap_or("")
            .ends_with("; Secure"),
        "{head}"
    );
    // Without a credential or a session, a page sends the browser to sign in; a form is refused.
    let (head, _) = raw(
        &server,
        &format!(
            "GET /console HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            server.addr
        ),
    );
    assert_eq!(status(&head), 303, "{head}");
    assert_eq!(header(&head, "location"), Some("/console/login"), "{head}");
}
