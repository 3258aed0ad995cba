//! ring0's state directory: where it is, how it is created, and the manifest that makes a
//! replaced or truncated journal or audit log a refusal at start instead of a silent fresh one.
//!
//! By default the state lives outside the workspace, in `$XDG_STATE_HOME/ring0/<workspace id>/`
//! (`$HOME/.local/state/ring0/<workspace id>/` when `XDG_STATE_HOME` is unset), where the
//! workspace id is the workspace directory's name and a short hash of its canonical path. A
//! workspace that already holds a legacy `.ring0/` state directory keeps using it, with a
//! warning: the tools cannot reach it either way (it is a protected path).
//!
//! The state directory and its subdirectories are created 0700, its files 0600. `state.json`
//! (the manifest) records the journal's and the audit log's file identity (device, inode) and the
//! audit log's length; at start a journal or audit log that is missing, replaced, emptied, shorter
//! than recorded or unreadable while the manifest names it is refused with how to reset.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The legacy state directory, inside the workspace.
pub const LEGACY_STATE_DIR: &str = ".ring0";
/// The journal, in the state directory.
pub const JOURNAL_FILE: &str = "journal.db";

/// With a PostgreSQL journal, the file in the state directory that names its database in the
/// journal file's place (what the manifest ties the directory to).
pub const POSTGRES_MARKER_FILE: &str = "journal.postgres";
/// The manifest, in the state directory.
pub const MANIFEST_FILE: &str = "state.json";
/// Largest manifest read.
const MANIFEST_BYTES_MAX: u64 = 64 * 1024;
/// Longest readable part of a workspace id (the directory's name, sanitized).
const WORKSPACE_NAME_CHARS_MAX: usize = 48;
/// Hex digits of the path hash in a workspace id.
const WORKSPACE_HASH_HEX: usize = 12;
/// Subdirectories made private with the state directory.
const STATE_SUBDIRS: &[&str] = &["approvals", "jobs", "pinned", "spill"];
/// Version of the manifest's format.
const MANIFEST_VERSION: u32 = 1;

/// The state directory chosen, and whether it is the legacy one.
pub struct Choice {
    /// The state directory, absolute (its existing part canonicalized).
    pub dir: PathBuf,
    /// It is the legacy `.ring0` inside the workspace.
    pub legacy: bool,
}

/// Picks the state directory: the flag, else the configuration, else a legacy `.ring0` in the
/// workspace, else the default. Refuses one that is, or contains, the workspace.
pub fn choose(
    flag: Option<PathBuf>,
    configured: Option<PathBuf>,
    workspace: &Path,
) -> Result<Choice, String> {
    let legacy_dir = workspace.join(LEGACY_STATE_DIR);
    let (dir, legacy) = match flag.or(configured) {
        Some(dir) => (dir, false),
        None if legacy_dir.is_dir() => (legacy_dir, true),
        None => (default_state_dir(workspace)?, false),
    };
    let dir = absolute(&dir);
    if workspace.starts_with(&dir) {
        return Err(format!(
            "{} is the workspace or contains it; ring0's state must be a directory of its own",
            dir.display()
        ));
    }
    Ok(Choice { dir, legacy })
}

/// `dir` with its existing part canonicalized (symlinks resolved), so it can be compared with
/// the workspace and protected by what it really is.
fn absolute(dir: &Path) -> PathBuf {
    let mut existing = dir.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if let Ok(real) = fs::canonicalize(&existing) {
            return rest.iter().rev().fold(real, |p, n| p.join(n));
        }
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => return dir.to_path_buf(),
        }
    }
}

/// `$XDG_STATE_HOME/ring0/<id>` (an absolute `XDG_STATE_HOME` only, as the XDG specification
/// says), else `$HOME/.local/state/ring0/<id>`.
pub fn default_state_dir(workspace: &Path) -> Result<PathBuf, String> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|home| home.join(".local/state"))
        })
        .ok_or(
            "neither XDG_STATE_HOME nor HOME is set to an absolute path: name a state directory with --state-dir or [workspace] state_dir",
        )?;
    Ok(base.join("ring0").join(workspace_id(workspace)))
}

/// The directory's name (letters, digits, `.`, `_`, `-`; at most 48) and 12 hex digits of the
/// SHA-256 of its canonical path: readable, and distinct for two workspaces of the same name.
pub fn workspace_id(workspace: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let name: String = workspace
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(WORKSPACE_NAME_CHARS_MAX)
        .collect();
    let name = name.trim_start_matches('.');
    let hash = Sha256::digest(workspace.as_os_str().as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}",
        if name.is_empty() { "workspace" } else { name },
        &hex[..WORKSPACE_HASH_HEX]
    )
}

/// The warning printed when the legacy `.ring0` in the workspace is used.
pub fn legacy_warning(state_dir: &Path, workspace: &Path) -> String {
    let target = default_state_dir(workspace)
        .map(|d| d.display().to_string())
        .unwrap_or_else(|_| "a directory outside the workspace".into());
    format!(
        "using the legacy state directory {} inside the workspace (the tools cannot reach it); to move it out: mv {} {target} (with no ring0 running), or set [workspace] state_dir",
        state_dir.display(),
        state_dir.display(),
    )
}

/// Creates the state directory and its subdirectories private (0700), tightening an existing
/// one that is more open.
pub fn prepare(state_dir: &Path) -> Result<(), String> {
    let fail = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .map_err(|e| fail(state_dir, e))?;
    for dir in std::iter::once(state_dir.to_path_buf())
        .chain(STATE_SUBDIRS.iter().map(|s| state_dir.join(s)))
    {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| fail(&dir, e))?;
        let meta = fs::metadata(&dir).map_err(|e| fail(&dir, e))?;
        if meta.permissions().mode() & 0o077 != 0 {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| fail(&dir, e))?;
        }
    }
    Ok(())
}

/// Creates `path` empty and private (0600) if it does not exist, so whatever opens it next
/// (SQLite, which gives its `-wal` and `-shm` files the same mode) keeps it private.
pub fn create_private(path: &Path) -> Result<(), String> {
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Writes the marker naming the PostgreSQL database this state directory's journal is in, once:
/// an existing marker is kept (replacing it would read as a replaced journal to the manifest).
pub fn write_postgres_marker(marker: &Path, database: &str) -> Result<(), String> {
    if marker.exists() {
        return Ok(());
    }
    create_private(marker)?;
    fs::write(marker, format!("{database}\n")).map_err(|e| format!("{}: {e}", marker.display()))
}

/// Creates the journal's files private before the journal opens them: the database (SQLite
/// gives its `-wal` and `-shm` the database's mode), its lock file and its spill directory.
pub fn create_journal_files(journal: &Path) -> Result<(), String> {
    create_private(journal)?;
    create_private(&PathBuf::from(format!("{}.lock", journal.display())))?;
    let spill = PathBuf::from(format!("{}.spill", journal.display()));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&spill)
        .map_err(|e| format!("{}: {e}", spill.display()))
}

/// A file's identity as the manifest records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Identity {
    dev: u64,
    ino: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditEntry {
    path: PathBuf,
    id: Identity,
    bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFile {
    version: u32,
    journal: Identity,
    audit: AuditEntry,
}

/// The manifest of one state directory, checked at start and recorded once the journal and
/// audit log are open.
pub struct Manifest {
    path: PathBuf,
    journal: PathBuf,
    audit: PathBuf,
    /// What was recorded at start (after the checks passed); only then is the audit log's
    /// length recorded again on drop, and only while both files are still the ones recorded.
    recorded: Option<ManifestFile>,
}

fn reset_hint(state_dir: &Path) -> String {
    format!(
        "ring0 will not start over silently. To start afresh deliberately (losing the record of past calls), move the state directory {} away",
        state_dir.display()
    )
}

fn identity(meta: &fs::Metadata) -> Identity {
    Identity {
        dev: meta.dev(),
        ino: meta.ino(),
    }
}

impl Drop for Manifest {
    /// Records the audit log's length as this process leaves it, so a later truncation shows.
    fn drop(&mut self) {
        let Some(at_start) = &self.recorded else {
            return;
        };
        if let Ok(now) = self.current()
            && now.journal == at_start.journal
            && now.audit.id == at_start.audit.id
            && now.audit.bytes >= at_start.audit.bytes
        {
            let _ = self.write(&now);
        }
    }
}

impl Manifest {
    /// Checks the journal and the audit log against the manifest, if there is one. With none
    /// (a new state directory, or one from before the manifest), whatever is there is adopted.
    pub fn check(state_dir: &Path, journal: &Path, audit: &Path) -> Result<Self, String> {
        let manifest = Self {
            path: state_dir.join(MANIFEST_FILE),
            journal: journal.to_path_buf(),
            audit: audit.to_path_buf(),
            recorded: None,
        };
        let Some(recorded) = manifest.read()? else {
            return Ok(manifest);
        };
        let hint = || reset_hint(state_dir);
        let journal_meta = fs::metadata(journal).map_err(|e| {
            format!(
                "the journal {} is gone or unreadable ({e}), though {} records it; {}",
                journal.display(),
                manifest.path.display(),
                hint()
            )
        })?;
        if identity(&journal_meta) != recorded.journal {
            return Err(format!(
                "the journal {} was replaced (it is not the file {} records); {}",
                journal.display(),
                manifest.path.display(),
                hint()
            ));
        }
        let wal_bytes = fs::metadata(format!("{}-wal", journal.display())).map_or(0, |m| m.len());
        if journal_meta.len() == 0 && wal_bytes == 0 {
            return Err(format!(
                "the journal {} was emptied; {}",
                journal.display(),
                hint()
            ));
        }
        fs::File::open(journal)
            .map_err(|e| format!("the journal {} is unreadable: {e}", journal.display()))?;
        if recorded.audit.path != audit {
            // The configuration names another audit log: a person changed it.
            tracing::warn!(
                "the audit log is now {} (it was {})",
                audit.display(),
                recorded.audit.path.display()
            );
            return Ok(manifest);
        }
        let audit_meta = fs::metadata(audit).map_err(|e| {
            format!(
                "the audit log {} is gone or unreadable ({e}), though {} records it; {}",
                audit.display(),
                manifest.path.display(),
                hint()
            )
        })?;
        if identity(&audit_meta) != recorded.audit.id {
            return Err(format!(
                "the audit log {} was replaced (it is not the file {} records); {}",
                audit.display(),
                manifest.path.display(),
                hint()
            ));
        }
        if audit_meta.len() < recorded.audit.bytes {
            return Err(format!(
                "the audit log {} was truncated ({} bytes, {} recorded); {}",
                audit.display(),
                audit_meta.len(),
                recorded.audit.bytes,
                hint()
            ));
        }
        fs::File::open(audit)
            .map_err(|e| format!("the audit log {} is unreadable: {e}", audit.display()))?;
        Ok(manifest)
    }

    fn read(&self) -> Result<Option<ManifestFile>, String> {
        use std::io::Read;
        let file = match fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        let mut text = String::new();
        file.take(MANIFEST_BYTES_MAX)
            .read_to_string(&mut text)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        let parsed: ManifestFile = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is damaged ({e}); {}",
                self.path.display(),
                reset_hint(self.path.parent().unwrap_or(Path::new(".")))
            )
        })?;
        if parsed.version != MANIFEST_VERSION {
            return Err(format!(
                "{} has version {}, this ring0 knows {MANIFEST_VERSION}",
                self.path.display(),
                parsed.version
            ));
        }
        Ok(Some(parsed))
    }

    /// Records the journal's and audit log's identity and the audit log's length now
    /// (atomically: a temporary file renamed over the manifest), and again when dropped.
    pub fn record(&mut self) -> Result<(), String> {
        let now = self.current()?;
        self.write(&now)?;
        self.recorded = Some(now);
        Ok(())
    }

    fn current(&self) -> Result<ManifestFile, String> {
        let fail = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        let journal = fs::metadata(&self.journal).map_err(|e| fail(&self.journal, e))?;
        let audit = fs::metadata(&self.audit).map_err(|e| fail(&self.audit, e))?;
        Ok(ManifestFile {
            version: MANIFEST_VERSION,
            journal: identity(&journal),
            audit: AuditEntry {
                path: self.audit.clone(),
                id: identity(&audit),
                bytes: audit.len(),
            },
        })
    }

    fn write(&self, file: &ManifestFile) -> Result<(), String> {
        let fail = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        let mut text = serde_json::to_string_pretty(file).map_err(|e| e.to_string())?;
        text.push('\n');
        let tmp = self.path.with_extension("json.tmp");
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| fail(&tmp, e))?;
        out.write_all(text.as_bytes())
            .and_then(|()| out.sync_all())
            .map_err(|e| fail(&tmp, e))?;
        fs::rename(&tmp, &self.path).map_err(|e| fail(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_ids_are_readable_and_distinct() {
        let a = workspace_id(Path::new("/home/u/projects/app"));
        let b = workspace_id(Path::new("/srv/other/app"));
        assert!(a.starts_with("app-") && b.starts_with("app-"), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a.len(), "app-".len() + WORKSPACE_HASH_HEX);
        let odd = workspace_id(Path::new("/x/.hidden dir!"));
        assert!(odd.starts_with("hidden_dir_-"), "{odd}");
    }

    #[test]
    fn a_state_dir_containing_the_workspace_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        fs::create_dir(&ws).unwrap();
        let ws = fs::canonicalize(&ws).unwrap();
        assert!(choose(Some(ws.clone()), None, &ws).is_err());
        assert!(choose(Some(dir.path().to_path_buf()), None, &ws).is_err());
        let ok = choose(Some(dir.path().join("state")), None, &ws).unwrap();
        assert!(!ok.legacy);
    }
}
