//! The audit trail: one record per authorization decision.
//!
//! Each record names the decision, the rule that fired, the principal, the session and scope, the
//! tool, the call and the fingerprint of the prepared arguments. The arguments themselves are
//! recorded only when the host asks for it (they may hold secrets). [`JsonlAudit`] appends one
//! JSON line per record to a file; [`MemoryAudit`] keeps them for tests and embedding hosts.
//!
//! # The hash chain
//!
//! Every line of a [`JsonlAudit`] file holds `prev`: the SHA-256 (lowercase hex) of the previous
//! line's bytes, without its newline. The first line's `prev` is [`AUDIT_GENESIS`] (64 zeros).
//! An edited, inserted, deleted or moved line therefore breaks the link of the line after it.
//! Cutting lines off the end breaks no link, so the writer also keeps a head file beside the
//! log (`<log>.head`: line count, byte length and hash of the last line, replaced atomically
//! after every append); a log shorter than its head, or whose last line is not the one the head
//! names, is refused at open and reported by [`verify_chain`] (`ring0 audit verify`). The chain
//! continues across restarts: [`JsonlAudit::open`] reads the last line and links to it.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::{BufRead, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The `prev` of a log's first line.
pub const AUDIT_GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Longest audit line; longer arguments are replaced by a note (the fingerprint stays).
pub const AUDIT_LINE_BYTES_MAX: usize = 64 * 1024;

/// What was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditDecision {
    Allowed,
    Denied,
    /// Held for a person's approval.
    Held,
    Approved,
    ApprovalDenied,
    ApprovalTimeout,
    /// The held call went back to the model unanswered: a person approves it out of band
    /// (e.g. by handing over a confirmation code) and the model calls again.
    ApprovalRequired,
    /// Over a rate limit.
    RateLimited,
}

/// One decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at_ms: u64,
    pub decision: AuditDecision,
    /// The rule that fired (`grant:files`, `ceiling:files`, `rule:files[0]`, `default_deny`, …).
    pub rule: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    pub tool: String,
    pub call_id: String,
    /// The principal the call acts for.
    pub principal: String,
    pub scope: String,
    pub session_id: String,
    pub args_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    /// The prepared arguments, only when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
}

/// Where decisions go. `record` failing makes the decision a denial (fail closed).
pub trait AuditSink: Send + Sync {
    fn record(&self, entry: &AuditEntry) -> Result<(), String>;
}

/// Appends hash-chained JSON lines to a file (created private if missing), keeping its head file
/// current (see the module docs). Each record is one `write` on a file opened for appending,
/// made under the file's exclusive lock, so processes sharing the log extend one chain.
pub struct JsonlAudit {
    path: PathBuf,
    inner: Mutex<Chain>,
}

/// The open log and where its chain stands.
struct Chain {
    file: std::fs::File,
    head: Head,
}

/// What `<log>.head` records about the log's end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Head {
    pub lines: u64,
    pub bytes: u64,
    /// SHA-256 of the last line ([`AUDIT_GENESIS`] for an empty log).
    pub last: String,
}

impl Head {
    fn empty() -> Self {
        Self {
            lines: 0,
            bytes: 0,
            last: AUDIT_GENESIS.into(),
        }
    }
}

/// The head file of the log at `path`.
pub fn head_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".head");
    path.with_file_name(name)
}

fn line_hash(line: &[u8]) -> String {
    let digest = Sha256::digest(line);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn private_options() -> std::fs::OpenOptions {
    let mut options = std::fs::OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options
}

impl JsonlAudit {
    /// Opens (or creates) the log at `path` and continues its chain. A log that does not match
    /// its head file — cut short, or its last line changed — is refused with the reason.
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = private_options()
            .append(true)
            .create(true)
            .read(true)
            .open(&path)?;
        let head = current_head(&mut file, &path)?;
        Ok(Self {
            path,
            inner: Mutex::new(Chain { file, head }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn invalid(path: &Path, why: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "audit log {}: {why}; `ring0 audit verify` shows where",
            path.display()
        ),
    )
}

/// Where the chain of the open log stands, checked against its head file.
fn current_head(file: &mut std::fs::File, path: &Path) -> std::io::Result<Head> {
    let len = file.metadata()?.len();
    let recorded = read_head(path)?;
    let Some(recorded) = recorded else {
        if len > 0 {
            // A log without a head (written before heads existed): its last line anchors it.
            let (lines, last) = scan_lines(file)?;
            return Ok(Head {
                lines,
                bytes: len,
                last,
            });
        }
        return Ok(Head::empty());
    };
    if len < recorded.bytes {
        return Err(invalid(
            path,
            format!(
                "it is {len} bytes but its head records {} bytes: it was cut short",
                recorded.bytes
            ),
        ));
    }
    if recorded.bytes == 0 {
        return if len == 0 {
            Ok(recorded)
        } else {
            Err(invalid(path, "its head records an empty log"))
        };
    }
    let last = line_ending_at(file, recorded.bytes)?;
    if line_hash(&last) != recorded.last {
        return Err(invalid(
            path,
            format!("line {} is not the line its head records", recorded.lines),
        ));
    }
    if len == recorded.bytes {
        return Ok(recorded);
    }
    // Lines appended after the head was last written (a crash between the two writes).
    let (lines, last) = scan_lines(file)?;
    Ok(Head {
        lines,
        bytes: len,
        last,
    })
}

fn read_head(path: &Path) -> std::io::Result<Option<Head>> {
    match std::fs::read(head_path(path)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| invalid(path, format!("its head file is unreadable ({e})"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The line (without its newline) that ends at byte `end` of `file`.
fn line_ending_at(file: &mut std::fs::File, end: u64) -> std::io::Result<Vec<u8>> {
    let mut start = end.saturating_sub(1);
    let mut buf = [0u8; 1];
    // Lines are bounded by AUDIT_LINE_BYTES_MAX, so this walks back at most that far.
    while start > 0 && end - start <= AUDIT_LINE_BYTES_MAX as u64 + 1 {
        file.seek(SeekFrom::Start(start - 1))?;
        file.read_exact(&mut buf)?;
        if buf[0] == b'\n' {
            break;
        }
        start -= 1;
    }
    let mut line = vec![0u8; usize::try_from(end - start).unwrap_or(0)];
    file.seek(SeekFrom::Start(start))?;
    file.read_exact(&mut line)?;
    if line.last() == Some(&b'\n') {
        line.pop();
    }
    Ok(line)
}

/// Counts the lines of `file` and hashes the last one.
fn scan_lines(file: &mut std::fs::File) -> std::io::Result<(u64, String)> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = std::io::BufReader::new(&*file);
    let (mut lines, mut last) = (0u64, AUDIT_GENESIS.to_string());
    let mut line = Vec::new();
    while reader.read_until(b'\n', &mut line)? > 0 {
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        lines += 1;
        last = line_hash(&line);
        line.clear();
    }
    Ok((lines, last))
}

/// One line of the log: the chain link, then the record.
#[derive(Serialize)]
struct Linked<'a> {
    prev: &'a str,
    #[serde(flatten)]
    entry: &'a AuditEntry,
}

fn line_of(entry: &AuditEntry, prev: &str) -> Result<Vec<u8>, String> {
    let mut line = serde_json::to_vec(&Linked { prev, entry }).map_err(|e| e.to_string())?;
    if line.len() > AUDIT_LINE_BYTES_MAX {
        let mut slim = entry.clone();
        slim.args = Some(Value::String(format!(
            "[arguments of {} bytes left out of the audit line; see args_hash]",
            line.len()
        )));
        slim.reason = crate::approval::bounded(&slim.reason, 1024);
        line = serde_json::to_vec(&Linked { prev, entry: &slim }).map_err(|e| e.to_string())?;
    }
    Ok(line)
}

/// Writes `head` beside the log at `path`, atomically (temporary file, rename).
fn write_head(path: &Path, head: &Head) -> std::io::Result<()> {
    let target = head_path(path);
    let tmp = target.with_extension("head.tmp");
    let bytes = serde_json::to_vec(head).map_err(std::io::Error::other)?;
    let mut f = private_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all(&bytes)?;
    std::fs::rename(&tmp, &target)
}

impl JsonlAudit {
    /// Appends one line while holding the file's exclusive lock, first catching up with lines
    /// another process appended since this one last wrote, so that processes sharing a log
    /// extend one chain.
    fn append(&self, chain: &mut Chain, entry: &AuditEntry) -> std::io::Result<()> {
        if chain.file.metadata()?.len() != chain.head.bytes {
            chain.head = current_head(&mut chain.file, &self.path)?;
        }
        let line = line_of(entry, &chain.head.last).map_err(std::io::Error::other)?;
        let mut bytes = line.clone();
        bytes.push(b'\n');
        chain.file.write_all(&bytes)?;
        let head = Head {
            lines: chain.head.lines + 1,
            bytes: chain.head.bytes + bytes.len() as u64,
            last: line_hash(&line),
        };
        write_head(&self.path, &head)?;
        chain.head = head;
        Ok(())
    }
}

impl AuditSink for JsonlAudit {
    fn record(&self, entry: &AuditEntry) -> Result<(), String> {
        let mut chain = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let fail = |e: std::io::Error| format!("audit log {}: {e}", self.path.display());
        chain.file.lock().map_err(fail)?;
        let appended = self.append(&mut chain, entry);
        let _ = chain.file.unlock();
        appended.map_err(fail)
    }
}

/// How an intact log ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainReport {
    pub lines: u64,
    /// SHA-256 of the last line.
    pub last: String,
    /// Whether a head file anchored the end (without one, lines cut off the end go unnoticed).
    pub anchored: bool,
}

/// The first broken or missing link of a log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {why}")]
pub struct ChainBreak {
    /// 1-based line number (for a log cut short: the first line that is missing).
    pub line: u64,
    pub why: String,
}

/// Checks every link of the log at `path` and its head file. `Err` names the first broken or
/// missing link; an unreadable file is a break at line 0.
pub fn verify_chain(path: &Path) -> Result<ChainReport, ChainBreak> {
    let io = |e: std::io::Error| ChainBreak {
        line: 0,
        why: format!("{}: {e}", path.display()),
    };
    let head = read_head(path).map_err(io)?;
    let file = std::fs::File::open(path).map_err(io)?;
    let mut reader = std::io::BufReader::new(file);
    let (mut number, mut prev) = (0u64, AUDIT_GENESIS.to_string());
    let mut line = Vec::new();
    while reader.read_until(b'\n', &mut line).map_err(io)? > 0 {
        number += 1;
        if line.pop() != Some(b'\n') {
            return Err(ChainBreak {
                line: number,
                why: "the line has no end: the log was cut in the middle of it".into(),
            });
        }
        check_link(&line, &prev).map_err(|why| ChainBreak { line: number, why })?;
        if head
            .as_ref()
            .is_some_and(|h| h.lines == number && h.last != line_hash(&line))
        {
            return Err(ChainBreak {
                line: number,
                why: "this is the log's last recorded line, and it was changed".into(),
            });
        }
        prev = line_hash(&line);
        line.clear();
    }
    if let Some(h) = &head
        && h.lines > number
    {
        return Err(ChainBreak {
            line: number + 1,
            why: format!(
                "missing: the log ends after {number} lines but its head records {} lines; lines were cut off the end",
                h.lines
            ),
        });
    }
    Ok(ChainReport {
        lines: number,
        last: prev,
        anchored: head.is_some(),
    })
}

/// Whether one line links to the line before it.
fn check_link(line: &[u8], prev: &str) -> Result<(), String> {
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| format!("not a JSON record ({e}): the line was edited"))?;
    match value.get("prev").and_then(Value::as_str) {
        Some(p) if p == prev => Ok(()),
        Some(_) if prev == AUDIT_GENESIS => Err(
            "the first line does not start the chain: lines before it were deleted".into(),
        ),
        Some(_) => Err(
            "its `prev` is not the SHA-256 of the line before it: a line was edited, deleted, inserted or moved here"
                .into(),
        ),
        None => Err("no `prev` link".into()),
    }
}

/// Most records [`MemoryAudit`] keeps; older ones are dropped first and counted.
pub const MEMORY_AUDIT_ENTRIES_MAX: usize = 65_536;

/// Keeps the most recent records in memory.
#[derive(Default)]
pub struct MemoryAudit {
    entries: Mutex<(std::collections::VecDeque<AuditEntry>, u64)>,
}

impl MemoryAudit {
    pub fn new() -> Self {
        Self::default()
    }

    /// The records kept, oldest first.
    pub fn entries(&self) -> Vec<AuditEntry> {
        let guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        guard.0.iter().cloned().collect()
    }

    /// Records dropped to stay within [`MEMORY_AUDIT_ENTRIES_MAX`].
    pub fn dropped(&self) -> u64 {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

impl AuditSink for MemoryAudit {
    fn record(&self, entry: &AuditEntry) -> Result<(), String> {
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if guard.0.len() == MEMORY_AUDIT_ENTRIES_MAX {
            guard.0.pop_front();
            guard.1 += 1;
        }
        guard.0.push_back(entry.clone());
        Ok(())
    }
}

/// The decisions of ring0's egress proxy as records of this trail, for the session whose
/// contained process made the requests: `tool` is `egress`, `decision` allowed or denied,
/// `rule` the allow rule that decided (`egress:<reason>` for a refusal no rule decided),
/// `reason` the proxy's sentence, `args_hash` the SHA-256 of the method and destination, and
/// `args` the whole decision (it holds no secret: method, destination, address, reason).
/// A record the sink refuses refuses the request (the proxy fails closed on it).
pub fn egress_audit(
    sink: std::sync::Arc<dyn AuditSink>,
    principal: String,
    scope: String,
    session_id: String,
) -> ring0_egress::AuditFn {
    std::sync::Arc::new(move |decision: &ring0_egress::EgressDecision| {
        sink.record(&egress_entry(decision, &principal, &scope, &session_id))
    })
}

/// What ring0 did to something an upstream server said before any client saw it (a definition
/// or text cleaned or cut, a definition pinned, reported or quarantined), as an audit record.
/// `source` is the upstream (`upstream:ALIAS`), `subject` what it said (`tool fs__read`,
/// `prompt …`, `resources/read`), `rule` the mediation (`mediate:cleaned`, `pin:quarantined`, …)
/// and `what` the account of it, which the record's digest covers.
pub fn mediation_entry(
    source: &str,
    subject: &str,
    rule: &str,
    decision: AuditDecision,
    what: &str,
) -> AuditEntry {
    AuditEntry {
        at_ms: crate::approval::now_ms(),
        decision,
        rule: rule.to_string(),
        reason: what.to_string(),
        tool: subject.to_string(),
        call_id: String::new(),
        principal: source.to_string(),
        scope: String::new(),
        session_id: String::new(),
        args_hash: line_hash(what.as_bytes()),
        approval_id: None,
        args: None,
    }
}

/// One egress decision as an audit record (see [`egress_audit`]).
pub fn egress_entry(
    decision: &ring0_egress::EgressDecision,
    principal: &str,
    scope: &str,
    session_id: &str,
) -> AuditEntry {
    let allowed = decision.verdict == ring0_egress::Verdict::Allowed;
    let rule = match (&decision.rule, allowed) {
        (Some(rule), true) => format!("egress:{rule}"),
        _ => format!("egress:{}", decision.reason.as_str()),
    };
    let destination = format!("{} {}", decision.method, decision.target);
    AuditEntry {
        at_ms: decision.at_ms,
        decision: if allowed {
            AuditDecision::Allowed
        } else {
            AuditDecision::Denied
        },
        rule,
        reason: decision.message.clone(),
        tool: "egress".into(),
        call_id: String::new(),
        principal: principal.to_string(),
        scope: scope.to_string(),
        session_id: session_id.to_string(),
        args_hash: line_hash(destination.as_bytes()),
        approval_id: None,
        args: serde_json::to_value(decision).ok(),
    }
}
