//! What a person approving a quarantined definition sees and what is checked first
//! (`ring0 approve-tool`).
//!
//! - [`diff`]: the approved definition against the waiting one — description, schemas,
//!   annotations, everything the pin covers — as a unified line diff of their pretty-printed
//!   JSON (`similar`), every string cleaned of escape codes and invisible characters, bounded by
//!   [`DIFF_LINES_MAX`].
//! - [`refresh`]: asks the upstream what it serves now (one connection and listing, through the
//!   same pin book the gateway uses), so that the waiting list holds only definitions the server
//!   still serves: a definition the server has reverted or replaced since is no longer waiting
//!   and cannot be approved.

use crate::config::UpstreamConfig;
use crate::log::Log;
use crate::pin::{PINNED_DIR, PendingPin, PinBook, PinKind};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Most diff lines shown for one definition; the rest are counted.
pub const DIFF_LINES_MAX: usize = 400;
/// Longest wait for the upstream's listing in [`refresh`].
pub const REFRESH_WAIT: Duration = Duration::from_secs(30);

fn definition(state_dir: &Path, pin: &str) -> Option<Value> {
    let path = state_dir
        .join(PINNED_DIR)
        .join(format!("{}.json", pin.trim_start_matches("sha256:")));
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Every string of `v` cleaned for a terminal (escape codes, control and invisible characters
/// removed; newlines kept as `\n` so one string stays one line).
fn cleaned(v: &Value) -> Value {
    match v {
        Value::String(s) => {
            let mut counts = ring0_shape::Cleaned::default();
            let text = ring0_shape::clean_text(s, &ring0_shape::FramingDefense::off(), &mut counts);
            Value::String(text)
        }
        Value::Array(items) => Value::Array(items.iter().map(cleaned).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), cleaned(v))).collect())
        }
        other => other.clone(),
    }
}

fn pretty(v: Option<&Value>) -> String {
    v.map(|v| serde_json::to_string_pretty(&cleaned(v)).unwrap_or_default() + "\n")
        .unwrap_or_default()
}

/// The diff from `approved` (the pin in the lock, if any) to the waiting definition `p`.
pub fn diff(state_dir: &Path, approved: Option<&str>, p: &PendingPin) -> String {
    let old = approved.and_then(|pin| definition(state_dir, pin));
    let Some(new) = definition(state_dir, &p.pin) else {
        return format!("(the waiting definition {} is not on disk)\n", p.pin);
    };
    let (old_text, new_text) = (pretty(old.as_ref()), pretty(Some(&new)));
    let header = match (approved, &old) {
        (Some(pin), Some(_)) => format!("--- approved {pin}\n+++ waiting {}\n", p.pin),
        (Some(pin), None) => format!(
            "--- approved {pin} (its definition is not on disk; the whole new one follows)\n+++ waiting {}\n",
            p.pin
        ),
        (None, _) => format!("--- (never approved)\n+++ waiting {}\n", p.pin),
    };
    let diff = similar::TextDiff::from_lines(&old_text, &new_text);
    let body = diff.unified_diff().context_radius(3).to_string();
    let lines: Vec<&str> = body.lines().collect();
    let mut out = header;
    for line in lines.iter().take(DIFF_LINES_MAX) {
        out.push_str(line);
        out.push('\n');
    }
    if lines.len() > DIFF_LINES_MAX {
        out.push_str(&format!(
            "… {} more diff lines not shown\n",
            lines.len() - DIFF_LINES_MAX
        ));
    }
    out
}

/// The pin the lock holds for `p`'s tool or prompt, if any.
pub fn approved_pin(workspace: &Path, p: &PendingPin) -> Option<String> {
    let text = std::fs::read_to_string(workspace.join(crate::pin::LOCK_FILE)).ok()?;
    let lock: toml::Table = toml::from_str(&text).ok()?;
    let table = match p.kind {
        PinKind::Tool => "tools",
        PinKind::Prompt => "prompts",
    };
    lock.get("upstreams")?
        .get(&p.alias)?
        .get(table)?
        .get(&p.tool)?
        .as_str()
        .map(str::to_string)
}

/// Connects to `config`'s upstream once (a stdio server in `sandbox`, as `ring0 serve` starts
/// it) and lists it through the workspace's pin book, which rewrites the waiting list of that
/// upstream from what it serves now.
pub async fn refresh(
    config: &UpstreamConfig,
    workspace: &Path,
    state_dir: &Path,
    sandbox: ring0_exec::Sandbox,
    log: Log,
) -> Result<(), String> {
    let pins = Arc::new(PinBook::open(workspace, state_dir)?);
    let http_client = match config.url {
        Some(_) => Some(crate::upstream::http::client()?),
        None => None,
    };
    let secrets = crate::upstream::secrets::resolve(config, workspace)
        .map_err(|e| format!("upstream {:?}: {e}", config.alias))?;
    crate::upstream::secrets::register(&secrets, &log);
    let upstream = crate::upstream::Upstream::new(
        config.clone(),
        pins,
        log,
        http_client,
        Arc::new(|| {}),
        crate::upstream::WorkspaceView {
            roots: Vec::new(),
            workspace: workspace.to_path_buf(),
            spill: None,
            sandbox,
            audit: None,
        },
    );
    upstream.start();
    let deadline = tokio::time::Instant::now() + REFRESH_WAIT;
    while upstream.listing().is_none() {
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "upstream {:?} did not list its tools within {}s: what it serves now is unknown, \
                 so nothing is approved",
                config.alias,
                REFRESH_WAIT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
