//! The local control channel of a running `ring0 serve`: how `ring0 journal resolve` and
//! `ring0 journal compensate` act on a journal the server holds (its SQLite journal admits one
//! writing process, the server).
//!
//! The channel is a directory in the state directory (`control/`, private to the user, as the
//! approvals directory is): the command writes `<id>.request.json` ([`ControlRequest`]); the
//! server looks every [`CONTROL_POLL_INTERVAL`], carries out at most [`REQUESTS_PER_PASS_MAX`]
//! requests a pass through the same functions the command would run ([`crate::operator`]),
//! writes `<id>.answer.json` ([`ControlAnswer`]) and removes the request. The command waits
//! for the answer at most [`ANSWER_WAIT`] and removes it. Only a process that can write the
//! user's state directory can ask — the same trust as `ring0 approve`. Nothing here changes
//! the journal except through [`crate::operator`].

use crate::operator;
use ring0_journal::PersonFinding;
use ring0_mcp::Gateway;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The control directory's name inside the state directory.
pub const CONTROL_DIR: &str = "control";
/// How often the server looks for requests. A person's command is not latency sensitive.
pub const CONTROL_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Most requests carried out in one pass; the rest wait for the next.
pub const REQUESTS_PER_PASS_MAX: usize = 16;
/// How long a command waits for the server's answer: a compensation runs a tool, bounded by
/// its own timeout, so this is generous.
pub const ANSWER_WAIT: Duration = Duration::from_secs(120);
/// Largest request or answer file read.
const CONTROL_FILE_BYTES_MAX: u64 = 64 * 1024;
/// A request older than this is stale (its command gave up) and is removed unanswered.
const REQUEST_STALE: Duration = Duration::from_secs(300);

/// What a person asks of the running server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum ControlRequest {
    /// `ring0 journal resolve ID --applied|--not-applied`.
    Resolve {
        intent: String,
        applied: bool,
        #[serde(default)]
        note: String,
    },
    /// `ring0 journal compensate ID`.
    Compensate {
        intent: String,
        #[serde(default)]
        note: String,
    },
}

/// The server's answer: what happened, as the command prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlAnswer {
    pub ok: bool,
    pub message: String,
}

/// The control directory of a state directory.
pub fn control_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(CONTROL_DIR)
}

fn request_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.request.json"))
}

fn answer_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.answer.json"))
}

/// Request ids are `op_` and hex digits, so one never names a path outside the directory.
fn valid_request_id(id: &str) -> bool {
    id.len() <= 64
        && id
            .strip_prefix("op_")
            .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", uuid::Uuid::new_v4().simple()));
    let written = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut f = options.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(CONTROL_FILE_BYTES_MAX)
        .read_to_end(&mut bytes)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn create_private(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Asks the server that holds the journal, and waits for its answer (at most [`ANSWER_WAIT`]).
/// `Ok` carries the server's message for a done action, `Err` its reason for a refused one.
pub async fn ask(state_dir: &Path, request: &ControlRequest) -> Result<String, String> {
    let dir = control_dir(state_dir);
    create_private(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let id = format!("op_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
    let bytes = serde_json::to_vec(request).map_err(|e| e.to_string())?;
    let request_file = request_path(&dir, &id);
    write_atomic(&request_file, &bytes).map_err(|e| format!("{}: {e}", request_file.display()))?;
    let answer_file = answer_path(&dir, &id);
    let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
    let answer = loop {
        if let Some(answer) = read_json::<ControlAnswer>(&answer_file) {
            break Some(answer);
        }
        if tokio::time::Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(CONTROL_POLL_INTERVAL).await;
    };
    let _ = std::fs::remove_file(&request_file);
    let _ = std::fs::remove_file(&answer_file);
    match answer {
        Some(ControlAnswer { ok: true, message }) => Ok(message),
        Some(ControlAnswer { ok: false, message }) => Err(message),
        None => Err(format!(
            "the running ring0 serve holds the journal but did not answer within {} s; \
             stop it and run this command again",
            ANSWER_WAIT.as_secs()
        )),
    }
}

/// Serves the control directory of `state_dir` for `gateway` until `shutdown`.
pub async fn serve(
    state_dir: PathBuf,
    gateway: Gateway,
    log: ring0_mcp::Log,
    shutdown: CancellationToken,
) {
    let dir = control_dir(&state_dir);
    if let Err(e) = create_private(&dir) {
        log.line(&format!(
            "control directory {}: {e}; `ring0 journal resolve|compensate` cannot reach this server",
            dir.display()
        ));
        return;
    }
    let mut pass = tokio::time::interval(CONTROL_POLL_INTERVAL);
    pass.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = pass.tick() => {}
        }
        for (id, request) in pending(&dir) {
            let answer = carry_out(&gateway, request).await;
            log.line(&format!("control {id}: {}", answer.message));
            if let Err(e) = write_atomic(
                &answer_path(&dir, &id),
                &serde_json::to_vec(&answer).unwrap_or_default(),
            ) {
                log.line(&format!(
                    "control {id}: the answer could not be written: {e}"
                ));
            }
            let _ = std::fs::remove_file(request_path(&dir, &id));
        }
    }
}

/// The requests waiting, oldest first, at most [`REQUESTS_PER_PASS_MAX`]; stale and unreadable
/// ones are removed (a malformed request is answered, so its command does not wait in vain).
fn pending(dir: &Path) -> Vec<(String, ControlRequest)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(std::time::SystemTime, String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_suffix(".request.json")?.to_string();
            let modified = e.metadata().and_then(|m| m.modified()).ok()?;
            valid_request_id(&id).then_some((modified, id, e.path()))
        })
        .filter(|(_, id, _)| !answer_path(dir, id).exists())
        .collect();
    found.sort();
    let mut out = Vec::new();
    for (modified, id, path) in found.into_iter().take(REQUESTS_PER_PASS_MAX) {
        if modified.elapsed().is_ok_and(|age| age > REQUEST_STALE) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        match read_json::<ControlRequest>(&path) {
            Some(request) => out.push((id, request)),
            None => {
                let answer = ControlAnswer {
                    ok: false,
                    message: "the request could not be read".into(),
                };
                let _ = write_atomic(
                    &answer_path(dir, &id),
                    &serde_json::to_vec(&answer).unwrap_or_default(),
                );
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out
}

/// Carries out one request on the serving generation.
pub async fn carry_out(gateway: &Gateway, request: ControlRequest) -> ControlAnswer {
    let done = match request {
        ControlRequest::Resolve {
            intent,
            applied,
            note,
        } => resolve(gateway, &intent, applied, &note).await,
        ControlRequest::Compensate { intent, note } => {
            let generation = gateway.generation();
            match operator::parse_intent_id(&intent) {
                Ok(id) => operator::compensate(
                    &generation.kernel,
                    Some(generation.gate.clone()),
                    id,
                    &note,
                )
                .await
                .map(|c| describe_compensation(&c)),
                Err(e) => Err(e),
            }
        }
    };
    match done {
        Ok(message) => ControlAnswer { ok: true, message },
        Err(message) => ControlAnswer { ok: false, message },
    }
}

async fn resolve(
    gateway: &Gateway,
    intent: &str,
    applied: bool,
    note: &str,
) -> Result<String, String> {
    let id = operator::parse_intent_id(intent)?;
    let finding = if applied {
        PersonFinding::Applied
    } else {
        PersonFinding::NotApplied
    };
    let record = operator::resolve(gateway.journal().as_ref(), id, finding, note).await?;
    Ok(describe_resolution(&record))
}

/// What the command prints after a resolution.
pub fn describe_resolution(record: &ring0_journal::IntentRecord) -> String {
    let next = match record.state {
        ring0_core::IntentState::Acked => "an identical retry is answered with this receipt",
        _ => "an identical retry runs the call again",
    };
    format!(
        "intent {} ({}) is {}: {next}",
        record.id, record.tool, record.state
    )
}

/// What the command prints after a compensation.
pub fn describe_compensation(c: &operator::Compensation) -> String {
    format!(
        "intent {} ({}) is {}: {} {}{}",
        c.record.id,
        c.record.tool,
        c.record.state,
        c.tool,
        if c.ran_now {
            "undid its effect"
        } else {
            "had already undone its effect"
        },
        c.intent
            .as_deref()
            .map(|i| format!(" (intent {i})"))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_cannot_name_paths() {
        assert!(valid_request_id("op_0123abcd"));
        for bad in ["", "op_", "../x", "op_../../etc", "xx_12", "op_12/3"] {
            assert!(!valid_request_id(bad), "{bad}");
        }
    }

    #[test]
    fn requests_round_trip_and_refuse_unknown_fields() {
        let r = ControlRequest::Resolve {
            intent: "x".into(),
            applied: true,
            note: String::new(),
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<ControlRequest>(&text).unwrap(), r);
        assert!(
            serde_json::from_str::<ControlRequest>(
                r#"{"action":"resolve","intent":"x","applied":true,"grant":"all"}"#
            )
            .is_err()
        );
    }
}
