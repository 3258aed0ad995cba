//! Sandbox profiles chosen per grant, as a user meets them through `ring0 call shell`: a grant
//! runs its calls in the profile it names; a call the sandbox stopped (`sandbox_denied`) is told
//! the wider profile its grant offers, and runs in it only after a person approves the call that
//! asks for it (`ring0 approve` from another terminal); a profile the grant does not offer is
//! refused before anyone is asked.

mod common;

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// How long a test waits for a held call to be announced.
const HOLD_WAIT: Duration = Duration::from_secs(60);

/// A workspace with ring0's config in it and a directory beside it that profile `outside` may
/// write (no other profile may).
struct Scene {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
}

impl Scene {
    /// The grant `contained` (shell, A1) with `grant_keys` added to it.
    fn new(grant_keys: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let ws = root.join("ws");
        let outside = root.join("outside");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(
            ws.join("ring0.toml"),
            format!(
                "[workspace]\nstate_dir = \".ring0\"\n\n\
                 [[grants]]\nname = \"contained\"\ntools = [\"shell\"]\nceiling = \"A1\"\n{grant_keys}\n\n\
                 [sandbox.profiles.outside]\nwrite = [{:?}]\n",
                outside.display().to_string()
            ),
        )
        .unwrap();
        Self {
            _dir: dir,
            ws,
            outside,
        }
    }

    fn ring0(&self) -> Command {
        let mut cmd = Command::new(common::ring0());
        cmd.current_dir(&self.ws);
        cmd
    }

    fn call(&self, args: &Value) -> Output {
        self.ring0()
            .args(["call", "shell", &args.to_string()])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `touch` of a file outside the workspace, in the profile `profile` asks for.
    fn touch_outside(&self, profile: Option<&str>) -> Value {
        let mut args = json!({"argv": ["touch", self.target().display().to_string()]});
        if let Some(p) = profile {
            args["sandbox_profile"] = json!(p);
        }
        args
    }

    fn target(&self) -> PathBuf {
        self.outside.join("written")
    }

    /// The decisions of the audit log.
    fn audit(&self) -> Vec<Value> {
        let log = std::fs::read_to_string(self.ws.join(".ring0/audit.jsonl")).unwrap_or_default();
        log.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

fn receipt(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn message(receipt: &Value) -> String {
    receipt["outcome"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Starts the call, waits until it is held, and returns the running call and the request id
/// `ring0 call` printed for the person.
fn held_call(s: &Scene, args: &Value) -> (std::process::Child, String) {
    let mut call = s
        .ring0()
        .args(["call", "shell", &args.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = common::held_request_id(&mut call, HOLD_WAIT);
    (call, id)
}

fn decide(s: &Scene, verb: &str, id: &str) {
    let out = s.ring0().args([verb, id]).output().unwrap();
    assert!(
        out.status.success(),
        "ring0 {verb} {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_grant_runs_its_shell_calls_in_the_profile_it_names() {
    let narrow = Scene::new("");
    let r = receipt(&narrow.call(&narrow.touch_outside(None)));
    assert!(message(&r).starts_with("sandbox_denied"), "{r:#}");
    assert!(!narrow.target().exists());

    let wide = Scene::new("sandbox = \"outside\"");
    let r = receipt(&wide.call(&wide.touch_outside(None)));
    assert_eq!(r["outcome"]["kind"], "completed", "{r:#}");
    assert!(wide.target().exists(), "the grant's profile lets it write");
}

#[test]
fn a_denied_call_is_told_the_wider_profile_its_grant_offers() {
    let s = Scene::new("sandbox_wider = \"outside\"");
    let r = receipt(&s.call(&s.touch_outside(None)));
    let text = message(&r);
    assert!(text.starts_with("sandbox_denied"), "{r:#}");
    assert!(text.contains("\"sandbox_profile\": \"outside\""), "{text}");
    assert_eq!(
        r["outcome"]["observation"]["structured"]["wider_profile"], "outside",
        "{r:#}"
    );
    assert!(!s.target().exists());
}

#[test]
fn the_wider_profile_runs_the_call_once_a_person_approves_it() {
    let s = Scene::new("sandbox_wider = \"outside\"");
    let (call, id) = held_call(&s, &s.touch_outside(Some("outside")));
    assert!(!s.target().exists(), "nothing runs before the approval");
    decide(&s, "approve", &id);
    let out = call.wait_with_output().unwrap();
    let r = receipt(&out);
    assert_eq!(r["outcome"]["kind"], "completed", "{r:#}");
    assert!(
        s.target().exists(),
        "the approved call ran in the wider profile"
    );
    let audit = s.audit();
    let held: Vec<&Value> = audit.iter().filter(|e| e["decision"] == "held").collect();
    assert_eq!(held.len(), 1, "{held:#?}");
    assert_eq!(held[0]["rule"], "sandbox_wider:contained");
}

#[test]
fn a_person_who_says_no_leaves_the_outside_unchanged() {
    let s = Scene::new("sandbox_wider = \"outside\"");
    let (call, id) = held_call(&s, &s.touch_outside(Some("outside")));
    decide(&s, "deny", &id);
    let r = receipt(&call.wait_with_output().unwrap());
    assert_eq!(r["status"], "approval_denied", "{r:#}");
    assert!(!s.target().exists());
}

#[test]
fn a_profile_the_grant_does_not_offer_is_refused_before_anyone_is_asked() {
    let s = Scene::new("sandbox_wider = \"workspace\"");
    let r = receipt(&s.call(&s.touch_outside(Some("outside"))));
    assert_eq!(r["status"], "policy_denied", "{r:#}");
    let why = r["message"].as_str().unwrap_or_default();
    assert!(why.contains("does not offer"), "{why}");
    assert!(!s.target().exists());
    assert!(
        s.audit().iter().all(|e| e["decision"] != "held"),
        "nobody was asked"
    );
}

#[test]
fn a_grant_naming_an_unknown_profile_is_a_config_error_naming_the_key() {
    let s = Scene::new("sandbox = \"nowhere\"");
    let out = s.call(&json!({"argv": ["true"]}));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("grants[0].sandbox"), "{err}");
    assert!(err.contains("nowhere"), "{err}");
}
