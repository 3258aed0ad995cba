//! The audit trail: one record per authorization decision.
//!
//! Each record names the decision, the rule that fired, the tool, the call and the fingerprint of
//! the prepared arguments. The arguments themselves are recorded only when the host asks for it
//! (they may hold secrets). [`JsonlAudit`] appends one JSON line per record to a file;
//! [`MemoryAudit`] keeps them for tests and embedding hosts.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

/// Appends JSON lines to a file (created private if missing). Each record is one `write` on a
/// file opened for appending, so concurrent writers never interleave within a line.
pub struct JsonlAudit {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl JsonlAudit {
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let mut options = std::fs::OpenOptions::new();
        options.append(true).create(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let file = options.open(&path)?;
        Ok(Self {
            path,
            file: Mutex::new(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn line_of(entry: &AuditEntry) -> Result<Vec<u8>, String> {
    let mut line = serde_json::to_vec(entry).map_err(|e| e.to_string())?;
    if line.len() > AUDIT_LINE_BYTES_MAX {
        let mut slim = entry.clone();
        slim.args = Some(Value::String(format!(
            "[arguments of {} bytes left out of the audit line; see args_hash]",
            line.len()
        )));
        slim.reason = crate::approval::bounded(&slim.reason, 1024);
        line = serde_json::to_vec(&slim).map_err(|e| e.to_string())?;
    }
    line.push(b'\n');
    Ok(line)
}

impl AuditSink for JsonlAudit {
    fn record(&self, entry: &AuditEntry) -> Result<(), String> {
        let line = line_of(entry)?;
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(&line)
            .map_err(|e| format!("audit log {}: {e}", self.path.display()))
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
