//! apply_patch through the kernel: exact-once anchors, all-or-none application across files,
//! dry runs, and settlement of an ambiguous outcome by its probe.

mod common;

use async_trait::async_trait;
use common::{Env, failure, structured, workspace};
use ring0_core::{Authority, Observation, ProviderFormat};
use ring0_kernel::{
    CallContext, GrantTable, Kernel, ProbeFinding, RoundOptions, Session, SessionConfig, Tool,
    ToolError,
};
use ring0_tools::ApplyPatch;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn patch(body: &str) -> Value {
    json!({"patch": format!("*** Begin Patch\n{body}*** End Patch\n")})
}

#[tokio::test]
async fn ambiguous_anchor_is_refused_naming_the_hunk_and_the_count() {
    let env = Env::new();
    env.write("a.txt", "x = 1\ny = 2\nx = 1\n");
    let (r, is_error) = env
        .call(
            "apply_patch",
            patch("*** Update File: a.txt\n@@\n-x = 1\n+x = 3\n"),
        )
        .await;
    assert!(is_error);
    let why = failure(&r);
    assert!(
        why.contains("a.txt: hunk 1") && why.contains("matches 2 times"),
        "{why}"
    );
    assert_eq!(env.read("a.txt").unwrap(), "x = 1\ny = 2\nx = 1\n");
}

#[tokio::test]
async fn missing_anchor_is_refused_and_nothing_is_written() {
    let env = Env::new();
    env.write("a.txt", "one\ntwo\n");
    env.write("b.txt", "three\n");
    let (r, is_error) = env
        .call(
            "apply_patch",
            patch("*** Update File: a.txt\n@@\n-one\n+ONE\n*** Update File: b.txt\n@@\n-four\n+FOUR\n"),
        )
        .await;
    assert!(is_error);
    let why = failure(&r);
    assert!(
        why.contains("b.txt: hunk 1") && why.contains("matches 0 times"),
        "{why}"
    );
    assert!(why.contains("nothing was written"), "{why}");
    assert_eq!(
        env.read("a.txt").unwrap(),
        "one\ntwo\n",
        "the first file is untouched too"
    );
}

#[tokio::test]
async fn dry_run_returns_the_diff_and_writes_nothing() {
    let env = Env::new();
    env.write("a.txt", "one\ntwo\n");
    let (r, is_error) = env
        .call(
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Update File: a.txt\n@@\n one\n-two\n+TWO\n*** Add File: new/b.txt\n+hello\n*** End Patch\n", "dry_run": true}),
        )
        .await;
    assert!(!is_error, "{r}");
    let out = structured(&r);
    assert_eq!(out["applied"], false);
    let diff = out["diff"].as_str().unwrap();
    assert!(
        diff.contains("--- a/a.txt") && diff.contains("-two") && diff.contains("+TWO"),
        "{diff}"
    );
    assert!(
        diff.contains("+++ b/new/b.txt") && diff.contains("+hello"),
        "{diff}"
    );
    assert_eq!(env.read("a.txt").unwrap(), "one\ntwo\n");
    assert!(
        !env.path("new").exists(),
        "not even the directory was created"
    );
}

#[tokio::test]
async fn one_patch_adds_updates_moves_and_deletes() {
    let env = Env::new();
    env.write("src/lib.rs", "fn a() {}\nfn b() {}\n");
    env.write("old.txt", "bye\n");
    env.write("mv.txt", "move me\n");
    let (r, is_error) = env
        .call(
            "apply_patch",
            patch(concat!(
                "*** Add File: docs/new.md\n+# New\n",
                "*** Update File: src/lib.rs\n@@\n fn a() {}\n-fn b() {}\n+fn b() { a() }\n",
                "*** Update File: mv.txt\n*** Move to: moved/mv.txt\n@@\n-move me\n+moved\n",
                "*** Delete File: old.txt\n",
            )),
        )
        .await;
    assert!(!is_error, "{r}");
    assert_eq!(env.read("docs/new.md").unwrap(), "# New\n");
    assert_eq!(
        env.read("src/lib.rs").unwrap(),
        "fn a() {}\nfn b() { a() }\n"
    );
    assert_eq!(env.read("moved/mv.txt").unwrap(), "moved\n");
    assert!(env.read("mv.txt").is_none() && env.read("old.txt").is_none());
    let files = structured(&r)["files"].as_array().unwrap().len();
    assert_eq!(files, 4);
    let leftovers: Vec<_> = std::fs::read_dir(&env.ws)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("ring0-patch"))
        .collect();
    assert!(leftovers.is_empty(), "no staging files left: {leftovers:?}");
}

fn session_with(tool: Arc<dyn Tool>, spec: ring0_core::ToolSpec) -> Session {
    let kernel = Kernel::builder()
        .tool(spec, tool)
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A1)))
        .build();
    kernel.open_session(SessionConfig::new("test"))
}

async fn run(session: &Session, args: Value) -> Value {
    let turn = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_p", "name": "apply_patch", "input": args}
    ]});
    let out = session
        .handle_turn(ProviderFormat::Anthropic, &turn, &RoundOptions::default())
        .await
        .unwrap();
    serde_json::to_value(&out.round.receipts[0]).unwrap()
}

fn three_files(ws: &Path) {
    std::fs::write(ws.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(ws.join("c.txt"), "gamma\n").unwrap();
}

const THREE_FILE_PATCH: &str = concat!(
    "*** Begin Patch\n",
    "*** Update File: a.txt\n@@\n-alpha\n+ALPHA\n",
    "*** Add File: b.txt\n+beta\n",
    "*** Delete File: c.txt\n",
    "*** End Patch\n"
);

#[tokio::test]
async fn third_file_failing_during_application_leaves_every_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    three_files(&ws);
    let tool = ring0_tools::apply_patch_tool(workspace(&ws, &dir.path().join("state"))).with_fault(
        Arc::new(|step, path| {
            if step == 2 {
                Err(std::io::Error::other(format!("injected failure at {path}")))
            } else {
                Ok(())
            }
        }),
    );
    let spec = tool.spec();
    let session = session_with(Arc::new(tool), spec);
    let receipt = run(&session, json!({"patch": THREE_FILE_PATCH})).await;
    assert_eq!(
        receipt["state"], "FAILED",
        "a clean failure, known not applied: {receipt}"
    );
    let message = receipt["outcome"]["message"].as_str().unwrap();
    assert!(
        message.contains("injected failure at c.txt") && message.contains("undone"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "alpha\n"
    );
    assert!(!ws.join("b.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join("c.txt")).unwrap(),
        "gamma\n"
    );
    let names: Vec<_> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "no staging or backup files remain: {names:?}"
    );
}

/// Wraps apply_patch so that an attempt can pretend the connection dropped: `plan[i]` says what
/// attempt `i` does — apply and report an unknown outcome, report unknown without applying, or
/// behave normally.
#[derive(Clone, Copy)]
enum Attempt {
    ApplyThenLose,
    LoseWithoutApplying,
    Normal,
    ApplyFirstFileThenLose,
}

struct Flaky {
    inner: ApplyPatch,
    plan: Vec<Attempt>,
    attempts: AtomicUsize,
}

#[async_trait]
impl Tool for Flaky {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let n = self.attempts.fetch_add(1, Ordering::SeqCst);
        match self.plan.get(n).copied().unwrap_or(Attempt::Normal) {
            Attempt::Normal => self.inner.call(ctx, args).await,
            Attempt::ApplyThenLose => {
                self.inner.call(ctx, args).await?;
                Err(ToolError::unknown("connection lost after sending"))
            }
            Attempt::LoseWithoutApplying => {
                Err(ToolError::unknown("connection lost before the reply"))
            }
            Attempt::ApplyFirstFileThenLose => {
                let first = json!({"patch": "*** Begin Patch\n*** Update File: a.txt\n@@\n-alpha\n+ALPHA\n*** End Patch\n"});
                self.inner.call(ctx, first).await?;
                Err(ToolError::unknown("crashed midway"))
            }
        }
    }
    async fn snapshot(&self, args: &Value) -> Option<Value> {
        self.inner.snapshot(args).await
    }
    async fn probe(&self, args: &Value, snapshot: Option<&Value>) -> ProbeFinding {
        self.inner.probe(args, snapshot).await
    }
}

fn flaky_session(
    plan: Vec<Attempt>,
) -> (tempfile::TempDir, std::path::PathBuf, Session, Arc<Flaky>) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    three_files(&ws);
    let inner = ring0_tools::apply_patch_tool(workspace(&ws, &dir.path().join("state")));
    let spec = inner.spec();
    let flaky = Arc::new(Flaky {
        inner,
        plan,
        attempts: AtomicUsize::new(0),
    });
    let session = session_with(flaky.clone(), spec);
    (dir, ws, session, flaky)
}

#[tokio::test]
async fn probe_settles_an_unknown_outcome_that_was_applied() {
    let (_dir, ws, session, flaky) = flaky_session(vec![Attempt::ApplyThenLose]);
    let receipt = run(&session, json!({"patch": THREE_FILE_PATCH})).await;
    assert_eq!(receipt["state"], "ACKED", "{receipt}");
    assert_eq!(receipt["disposition"], "recovered");
    assert_eq!(
        flaky.attempts.load(Ordering::SeqCst),
        1,
        "never re-dispatched"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "ALPHA\n"
    );
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "beta\n");
    assert!(!ws.join("c.txt").exists());
}

#[tokio::test]
async fn probe_finding_nothing_changed_lets_the_patch_run_once() {
    let (_dir, ws, session, flaky) = flaky_session(vec![Attempt::LoseWithoutApplying]);
    let receipt = run(&session, json!({"patch": THREE_FILE_PATCH})).await;
    assert_eq!(receipt["state"], "ACKED", "{receipt}");
    assert_eq!(
        flaky.attempts.load(Ordering::SeqCst),
        2,
        "one re-dispatch after the probe"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "ALPHA\n"
    );
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "beta\n");
}

#[tokio::test]
async fn partly_applied_patch_is_left_for_a_person() {
    let (_dir, ws, session, flaky) = flaky_session(vec![Attempt::ApplyFirstFileThenLose]);
    let receipt = run(&session, json!({"patch": THREE_FILE_PATCH})).await;
    assert_eq!(receipt["state"], "DEAD_LETTER", "{receipt}");
    assert_eq!(
        flaky.attempts.load(Ordering::SeqCst),
        1,
        "a partial result is never retried"
    );
    let timeline = receipt["timeline"].to_string();
    assert!(
        timeline.contains("partly applied") && timeline.contains("b.txt"),
        "{timeline}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "ALPHA\n"
    );
    assert!(ws.join("c.txt").exists());
}

#[tokio::test]
async fn a_huge_diff_is_cut_to_what_the_model_may_see() {
    let env = Env::new();
    let body: String = (0..3000)
        .map(|i| format!("+line {i} \u{1}\u{1}\u{1}\"\"\n"))
        .collect();
    let (r, is_error) = env
        .call("apply_patch", json!({"patch": format!("*** Begin Patch\n*** Add File: big.txt\n{body}*** End Patch\n"), "dry_run": true}))
        .await;
    assert!(!is_error, "{r}");
    assert!(r.to_string().len() <= 64 * 1024);
    assert!(structured(&r)["diff_bytes_omitted"].as_u64().unwrap() > 0);
}
