//! Approvals: a person decides whether a held call runs.
//!
//! The policy builds an [`ApprovalRequest`] — the whole prepared arguments, their rendering for a
//! person (escaped and bounded, see [`crate::render_args`]), a human-readable summary, why it is
//! held, and the fingerprint of the exact prepared arguments — and asks its [`Approver`]. An
//! approval names the fingerprint it approves; the policy runs the call only when that
//! fingerprint is the call's own, so an approval can never be carried over to changed
//! arguments. When the grant's `approval_scope` offers it ([`ApprovalRequest::remember`]), the
//! person may answer "allow for this session" ([`ApprovalOutcome::ApprovedForSession`]): identical
//! calls (same principal, session, tool and fingerprint) then run without asking again. The
//! policy bounds the wait by the approval timeout whatever the approver does.
//!
//! [`DirectoryApprover`] is the terminal channel: one JSON file per pending request in a
//! directory (`.ring0/approvals/<id>.request.json`); `ring0 approve <id>` / `ring0 deny <id>` from
//! another terminal write `<id>.decision.json` ([`decide_pending`]), and the waiting process picks
//! it up. Other channels (a chat message, an MCP elicitation) implement [`Approver`] the same way.
//! Beside each request, `<id>.waiter.json` names the waiting process (its pid and start time):
//! a request whose process is gone (killed before it could remove its files) or whose deadline
//! passed is expired — removed when listed, and refused when decided — so nobody "approves" a
//! call that can no longer run.

use async_trait::async_trait;
use ring0_core::Authority;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Default time a held call waits for a person.
pub const APPROVAL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);
/// Longest accepted approval timeout.
pub const APPROVAL_TIMEOUT_MAX: Duration = Duration::from_secs(24 * 60 * 60);
/// Longest human-readable summary of a held call: the arguments as shown, and room for the
/// tool, the reason and the digest.
pub const SUMMARY_BYTES_MAX: usize = crate::show::ARGS_SHOWN_BYTES_MAX + 1024;
/// Longest approval id.
pub const APPROVAL_ID_BYTES_MAX: usize = 64;
/// How often [`DirectoryApprover`] looks for a decision file. A person's answer is not latency
/// sensitive; the wait itself is bounded by the approval timeout.
pub const APPROVAL_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Largest request or decision file read: a request holds the whole arguments (at most
/// `ring0_core::limits` 256 KiB, up to six bytes per byte once escaped as JSON) and their
/// bounded rendering.
const APPROVAL_FILE_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// A call held for a person's decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// Unique id of this request (`ap_` and hex digits).
    pub id: String,
    pub tool: String,
    pub authority: Authority,
    pub call_id: String,
    /// The principal the call acts for.
    #[serde(default)]
    pub principal: String,
    pub scope: String,
    pub session_id: String,
    /// Fingerprint of the exact prepared arguments. An approval binds to it.
    pub args_hash: String,
    /// The whole prepared arguments (`ring0 approve --show ID` renders them).
    #[serde(default)]
    pub args: Value,
    /// The arguments as a person is shown them: escaped, and whole unless `args_whole` is false
    /// (then cut at [`crate::ARGS_SHOWN_BYTES_MAX`], saying where the whole is shown).
    #[serde(default)]
    pub args_shown: String,
    #[serde(default)]
    pub args_whole: bool,
    /// Why the call is held (A3, or a grant that requires approval).
    pub reason: String,
    /// At most [`SUMMARY_BYTES_MAX`] bytes: tool, authority, reason, digest, arguments as shown.
    pub summary: String,
    /// Offered "allow for this session": how long identical calls would then run without
    /// asking (`"this session"`, `"this session, for 30m"`). `None`: only this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remember: Option<String>,
    pub created_at_ms: u64,
    /// The request lapses at this time (Unix milliseconds).
    pub deadline_ms: u64,
}

/// A person's answer (or its absence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ApprovalOutcome {
    /// Approved — for the arguments with this fingerprint.
    Approved {
        args_hash: String,
    },
    /// Approved for these arguments, and for identical calls for the rest of the session (or
    /// the grant's duration). Counts as [`ApprovalOutcome::Approved`] when the request did not
    /// offer it.
    ApprovedForSession {
        args_hash: String,
    },
    Denied {
        reason: String,
    },
    /// Nobody decided here and now: the person answers out of band (a confirmation code given
    /// to the model) and the call is made again. `next` says how.
    Pending {
        next: String,
    },
    /// No answer before the deadline.
    TimedOut,
}

/// Asks a person. Implementations return when the person answered, or [`ApprovalOutcome::TimedOut`]
/// at `request.deadline_ms`; the policy also cuts the wait at the deadline whatever happens.
#[async_trait]
pub trait Approver: Send + Sync {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalOutcome;

    /// [`Approver::decide`] for a call whose host attached per-call context (for an approver
    /// that asks the person through the channel the call came by). Defaults to `decide`.
    async fn decide_for(
        &self,
        request: &ApprovalRequest,
        _extensions: &ring0_kernel::CallExtensions,
    ) -> ApprovalOutcome {
        self.decide(request).await
    }
}

/// Why a decision could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error(
        "approval id {0:?} is not valid: ids are `ap_` followed by lowercase hex digits, as printed"
    )]
    InvalidId(String),
    #[error("no pending approval {id:?} in {dir}")]
    NotPending { id: String, dir: PathBuf },
    #[error("approval {id:?} expired: {why}")]
    Expired { id: String, why: String },
    #[error("approval {id:?} was already decided")]
    AlreadyDecided { id: String },
    #[error(
        "approval {id:?} does not offer \"allow for this session\": its grant's approval_scope is \"once\""
    )]
    RememberNotOffered { id: String },
    #[error("{path}: {why}")]
    Io { path: PathBuf, why: String },
}

/// Whether `id` has the form of an approval id (so it can never name a path outside the
/// approvals directory).
pub fn valid_approval_id(id: &str) -> bool {
    id.len() <= APPROVAL_ID_BYTES_MAX
        && id.strip_prefix("ap_").is_some_and(|hex| {
            !hex.is_empty()
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

pub(crate) fn new_approval_id() -> String {
    format!("ap_{}", &uuid::Uuid::new_v4().simple().to_string()[..16])
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Cuts `text` to at most `max` bytes on a character boundary, saying how much was left out.
pub(crate) fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let note_room = 40;
    let cut = text.floor_char_boundary(max.saturating_sub(note_room));
    format!("{}… ({} more bytes)", &text[..cut], text.len() - cut)
}

/// The decision `ring0 approve` / `ring0 deny` writes next to a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecisionFile {
    pub id: String,
    pub approve: bool,
    /// The fingerprint the person approved (copied from the request they saw).
    pub args_hash: String,
    /// "Allow for this session": identical calls run without asking again.
    #[serde(default)]
    pub remember: bool,
    #[serde(default)]
    pub reason: String,
    pub decided_at_ms: u64,
}

fn request_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.request.json"))
}

fn decision_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.decision.json"))
}

fn waiter_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.waiter.json"))
}

/// The process waiting for a request's decision: its pid and start time (clock ticks since
/// boot, `/proc/<pid>/stat` field 22), so a reused pid is not taken for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Waiter {
    pid: u32,
    started: Option<u64>,
}

impl Waiter {
    fn this_process() -> Self {
        let pid = std::process::id();
        Self {
            pid,
            started: process_start(pid),
        }
    }

    /// Whether the process is still there. Where the start time cannot be read (not Linux),
    /// only the deadline expires a request.
    fn alive(&self) -> bool {
        match (self.started, process_start(self.pid)) {
            (Some(recorded), Some(now)) => recorded == now,
            (Some(_), None) => !cfg!(target_os = "linux"),
            (None, _) => true,
        }
    }
}

fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is parenthesized and may hold spaces; fields after it are
    // plain. Field 22 is the 20th after the closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Why the pending request `request` in `dir` can no longer be decided, if it cannot.
fn expiry(dir: &Path, request: &ApprovalRequest) -> Option<String> {
    if now_ms() >= request.deadline_ms {
        return Some("its wait for a decision ended".into());
    }
    let waiter: Waiter = read_json(&waiter_path(dir, &request.id))?;
    (!waiter.alive()).then(|| {
        format!(
            "the process that asked (pid {}) is gone; make the call again",
            waiter.pid
        )
    })
}

/// Removes an expired request's files.
fn forget(dir: &Path, id: &str) {
    let _ = std::fs::remove_file(request_path(dir, id));
    let _ = std::fs::remove_file(decision_path(dir, id));
    let _ = std::fs::remove_file(waiter_path(dir, id));
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> ApprovalError {
    ApprovalError::Io {
        path: path.to_path_buf(),
        why: e.to_string(),
    }
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename), so a reader never sees
/// half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ApprovalError> {
    let tmp = path.with_extension(format!("tmp{}", uuid::Uuid::new_v4().simple()));
    let result = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        // Requests summarize arguments, which may be private.
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
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| io_err(path, e))
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    use std::io::Read;
    let f = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    f.take(APPROVAL_FILE_BYTES_MAX)
        .read_to_end(&mut bytes)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Pending requests in `dir`, oldest first.
pub fn list_pending(dir: &Path) -> Vec<ApprovalRequest> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<ApprovalRequest> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_suffix(".request.json")?;
            if !valid_approval_id(id) || decision_path(dir, id).exists() {
                return None;
            }
            let request: ApprovalRequest = read_json(&e.path())?;
            if expiry(dir, &request).is_some() {
                forget(dir, id);
                return None;
            }
            Some(request)
        })
        .collect();
    out.sort_by_key(|r| r.created_at_ms);
    out
}

/// The pending request `id` in `dir` (for `ring0 approve --show`).
pub fn read_pending(dir: &Path, id: &str) -> Result<ApprovalRequest, ApprovalError> {
    if !valid_approval_id(id) {
        return Err(ApprovalError::InvalidId(id.to_string()));
    }
    read_json(&request_path(dir, id)).ok_or_else(|| ApprovalError::NotPending {
        id: id.to_string(),
        dir: dir.to_path_buf(),
    })
}

/// A person's answer to one pending request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approve: bool,
    /// "Allow for this session" (refused unless the request offers it).
    pub remember: bool,
    pub reason: String,
}

/// Records a person's decision on pending request `id` in `dir` and returns the request.
/// The decision carries the fingerprint of the request it answers.
pub fn decide_pending(
    dir: &Path,
    id: &str,
    decision_made: &Decision,
) -> Result<ApprovalRequest, ApprovalError> {
    let request = read_pending(dir, id)?;
    if let Some(why) = expiry(dir, &request) {
        forget(dir, id);
        return Err(ApprovalError::Expired {
            id: id.to_string(),
            why,
        });
    }
    if decision_made.remember && request.remember.is_none() {
        return Err(ApprovalError::RememberNotOffered { id: id.to_string() });
    }
    let (approve, reason) = (decision_made.approve, decision_made.reason.as_str());
    let decision = decision_path(dir, id);
    if decision.exists() {
        return Err(ApprovalError::AlreadyDecided { id: id.to_string() });
    }
    let file = ApprovalDecisionFile {
        id: id.to_string(),
        approve,
        args_hash: request.args_hash.clone(),
        remember: approve && decision_made.remember,
        reason: bounded(reason, SUMMARY_BYTES_MAX),
        decided_at_ms: now_ms(),
    };
    let bytes = serde_json::to_vec_pretty(&file).map_err(|e| io_err(&decision, e))?;
    write_atomic(&decision, &bytes)?;
    Ok(request)
}

/// Told about each request once it is pending.
type RequestHook = Box<dyn Fn(&ApprovalRequest) + Send + Sync>;

/// The terminal approval channel: request files in a directory, decisions written by
/// `ring0 approve` / `ring0 deny`.
pub struct DirectoryApprover {
    dir: PathBuf,
    /// Called once per request when it is written, e.g. to tell the person at the terminal.
    notify: Option<RequestHook>,
}

impl DirectoryApprover {
    /// Requests go to `dir` (created, private, if missing).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            notify: None,
        }
    }

    /// Calls `notify` with each request once it is pending.
    pub fn on_request(mut self, notify: impl Fn(&ApprovalRequest) + Send + Sync + 'static) -> Self {
        self.notify = Some(Box::new(notify));
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn cleanup(&self, id: &str) {
        forget(&self.dir, id);
    }
}

#[async_trait]
impl Approver for DirectoryApprover {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        if !valid_approval_id(&request.id) {
            return ApprovalOutcome::Denied {
                reason: "invalid approval id".into(),
            };
        }
        let written = (|| {
            std::fs::create_dir_all(&self.dir).map_err(|e| io_err(&self.dir, e))?;
            set_private(&self.dir);
            // The waiter first: a request is never listed without the process it belongs to.
            let waiter = waiter_path(&self.dir, &request.id);
            let bytes =
                serde_json::to_vec(&Waiter::this_process()).map_err(|e| io_err(&waiter, e))?;
            write_atomic(&waiter, &bytes)?;
            let bytes = serde_json::to_vec_pretty(request)
                .map_err(|e| io_err(&request_path(&self.dir, &request.id), e))?;
            write_atomic(&request_path(&self.dir, &request.id), &bytes)
        })();
        if let Err(e) = written {
            return ApprovalOutcome::Denied {
                reason: format!("the approval request could not be written: {e}"),
            };
        }
        // Removes the request (and any decision) however this wait ends — decided, timed out,
        // or dropped because the policy's own deadline passed first.
        let _cleanup = Cleanup {
            approver: self,
            id: &request.id,
        };
        if let Some(notify) = &self.notify {
            notify(request);
        }
        let decision = decision_path(&self.dir, &request.id);
        loop {
            if let Some(d) = read_json::<ApprovalDecisionFile>(&decision) {
                break if d.id != request.id {
                    ApprovalOutcome::Denied {
                        reason: "the decision names another request".into(),
                    }
                } else if d.approve && d.remember {
                    ApprovalOutcome::ApprovedForSession {
                        args_hash: d.args_hash,
                    }
                } else if d.approve {
                    ApprovalOutcome::Approved {
                        args_hash: d.args_hash,
                    }
                } else {
                    ApprovalOutcome::Denied {
                        reason: if d.reason.is_empty() {
                            "denied".into()
                        } else {
                            d.reason
                        },
                    }
                };
            }
            if now_ms() >= request.deadline_ms {
                break ApprovalOutcome::TimedOut;
            }
            tokio::time::sleep(APPROVAL_POLL_INTERVAL).await;
        }
    }
}

struct Cleanup<'a> {
    approver: &'a DirectoryApprover,
    id: &'a str,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        self.approver.cleanup(self.id);
    }
}

#[cfg(unix)]
fn set_private(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
}

#[cfg(not(unix))]
fn set_private(_dir: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_whose_process_is_gone_expires_and_cannot_be_approved() {
        let dir = tempfile::tempdir().unwrap();
        let id = "ap_00c0ffee";
        let request = ApprovalRequest {
            id: id.into(),
            tool: "shell".into(),
            authority: Authority::A3,
            call_id: "c".into(),
            principal: "local".into(),
            scope: "s".into(),
            session_id: "s".into(),
            args_hash: "h".into(),
            args: serde_json::json!({}),
            args_shown: "{}".into(),
            args_whole: true,
            reason: "A3".into(),
            summary: "shell".into(),
            remember: None,
            created_at_ms: now_ms(),
            deadline_ms: now_ms() + 60_000,
        };
        let write = |waiter: &Waiter| {
            write_atomic(
                &waiter_path(dir.path(), id),
                &serde_json::to_vec(waiter).unwrap(),
            )
            .unwrap();
            write_atomic(
                &request_path(dir.path(), id),
                &serde_json::to_vec(&request).unwrap(),
            )
            .unwrap();
        };
        write(&Waiter::this_process());
        assert_eq!(
            list_pending(dir.path()).len(),
            1,
            "a live waiter's request is pending"
        );
        let gone = Waiter {
            pid: std::process::id(),
            started: Waiter::this_process().started.map(|t| t + 1).or(Some(1)),
        };
        write(&gone);
        let decision = Decision {
            approve: true,
            remember: false,
            reason: String::new(),
        };
        if cfg!(target_os = "linux") {
            let err = decide_pending(dir.path(), id, &decision).unwrap_err();
            assert!(matches!(err, ApprovalError::Expired { .. }), "{err}");
            assert!(list_pending(dir.path()).is_empty());
            assert!(!request_path(dir.path(), id).exists());
        }
    }

    #[test]
    fn ids_cannot_name_paths() {
        assert!(valid_approval_id("ap_0123abcd"));
        for bad in [
            "",
            "ap_",
            "../x",
            "ap_../../etc",
            "ap_ABC",
            "xx_12",
            "ap_12/3",
        ] {
            assert!(!valid_approval_id(bad), "{bad}");
        }
        assert!(valid_approval_id(&new_approval_id()));
    }

    #[test]
    fn bounded_text_says_what_was_cut() {
        let long = "é".repeat(3000);
        let cut = bounded(&long, 100);
        assert!(cut.len() <= 100 + 30, "{}", cut.len());
        assert!(cut.contains("more bytes"));
        assert_eq!(bounded("short", 100), "short");
    }
}
