//! The files of one journal and what their errors mean.
//!
//! A journal is `<db>` (the SQLite database and its WAL), `<db>.lock` (the exclusive `flock`
//! that makes its opener the only writer process) and `<db>.spill/` (arguments too large to
//! store inline, one file per SHA-256 digest). [`Files`] names them and maps every SQLite and
//! I/O error to the [`JournalError`] a caller acts on: a full disk or quota is
//! [`JournalError::Full`] (nothing recorded, so nothing dispatched), a damaged file is
//! [`JournalError::Corrupt`] (reported, never repaired).

use crate::JournalError;
use crate::decide;
use rusqlite::ErrorCode;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};

/// The files of one journal.
#[derive(Debug, Clone)]
pub(crate) struct Files {
    pub(crate) db: PathBuf,
    pub(crate) spill: PathBuf,
}

impl Files {
    pub(crate) fn new(db: &Path) -> Self {
        let mut spill = db.as_os_str().to_owned();
        spill.push(".spill");
        Self {
            db: db.to_path_buf(),
            spill: PathBuf::from(spill),
        }
    }

    fn lock_path(&self) -> PathBuf {
        let mut p = self.db.as_os_str().to_owned();
        p.push(".lock");
        PathBuf::from(p)
    }

    pub(crate) fn corrupt(&self, detail: impl Into<String>) -> JournalError {
        JournalError::Corrupt {
            path: self.db.clone(),
            detail: detail.into(),
        }
    }

    /// Maps a SQLite error: full → [`JournalError::Full`], corrupt → [`JournalError::Corrupt`].
    pub(crate) fn sql(&self, e: rusqlite::Error) -> JournalError {
        match e.sqlite_error_code() {
            Some(ErrorCode::DiskFull) => JournalError::Full(e.to_string()),
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
                self.corrupt(e.to_string())
            }
            _ => JournalError::Storage(format!("{}: {e}", self.db.display())),
        }
    }

    pub(crate) fn io(&self, what: &str, path: &Path, e: std::io::Error) -> JournalError {
        match e.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                JournalError::Full(format!("{what} {}: {e}", path.display()))
            }
            _ => JournalError::Storage(format!("{what} {}: {e}", path.display())),
        }
    }
}

/// Takes `<db>.lock` for this process: [`JournalError::Locked`] (naming the holder's pid) if
/// another open holds it. The OS drops the lock when the process dies.
pub(crate) fn acquire_lock(files: &Files) -> Result<File, JournalError> {
    let path = files.lock_path();
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| files.io("opening lock file", &path, e))?;
    match file.try_lock() {
        Ok(()) => {
            // Who holds it, for the next opener's error message; the lock itself is the flock.
            let _ = file.set_len(0);
            let _ = write!(file, "{}", std::process::id());
            Ok(file)
        }
        Err(fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            Err(JournalError::Locked {
                path: files.db.clone(),
                holder: if holder.is_empty() {
                    String::new()
                } else {
                    format!(" (pid {holder})")
                },
            })
        }
        Err(fs::TryLockError::Error(e)) => Err(files.io("locking", &path, e)),
    }
}

/// Stores large arguments as `<spill>/<sha256>`: written to a temporary name, fsynced, renamed,
/// and the directory fsynced, so a committed record never names a missing or partial file.
pub(crate) fn spill(files: &Files, sha: &str, bytes: &[u8]) -> Result<(), JournalError> {
    let target = files.spill.join(sha);
    if target.exists() {
        return Ok(());
    }
    let tmp = files.spill.join(format!("{sha}.tmp"));
    let mut f = File::create(&tmp).map_err(|e| files.io("creating spill file", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| files.io("writing spill file", &tmp, e))?;
    fs::rename(&tmp, &target).map_err(|e| files.io("renaming spill file", &target, e))?;
    File::open(&files.spill)
        .and_then(|d| d.sync_all())
        .map_err(|e| files.io("syncing spill directory", &files.spill, e))?;
    Ok(())
}

/// Reads spilled arguments back, checking their length and digest against the row that names
/// them: a missing or different file is corruption of record `id`.
pub(crate) fn read_spill(
    files: &Files,
    id: &str,
    sha: &str,
    len: i64,
) -> Result<String, JournalError> {
    let path = files.spill.join(sha);
    let bytes = fs::read(&path).map_err(|e| {
        files.corrupt(format!(
            "record {id}: spilled arguments {} unreadable: {e}",
            path.display()
        ))
    })?;
    if bytes.len() as i64 != len || decide::sha256_hex(&bytes) != sha {
        return Err(files.corrupt(format!(
            "record {id}: spilled arguments {} do not match their digest",
            path.display()
        )));
    }
    String::from_utf8(bytes)
        .map_err(|_| files.corrupt(format!("record {id}: spilled arguments are not UTF-8")))
}
