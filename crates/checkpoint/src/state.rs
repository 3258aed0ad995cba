//! What a workspace path holds, and the content-addressed blobs that keep file contents.

use crate::{CheckpointError, FILE_BYTES_MAX};
use cap_std::fs::{Dir, PermissionsExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// What one path holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PathState {
    /// Nothing.
    Absent,
    /// A regular file: its content's SHA-256 (lowercase hex), size and permission bits.
    File {
        /// SHA-256 of the content, lowercase hex: the blob's name.
        sha256: String,
        /// Size in bytes.
        bytes: u64,
        /// Permission bits (`0o7777` of the mode).
        mode: u32,
    },
    /// A symbolic link and the target it holds (never followed).
    Symlink {
        /// The link's content.
        target: String,
    },
    /// A directory and its permission bits.
    Dir {
        /// Permission bits (`0o7777` of the mode).
        mode: u32,
    },
}

impl PathState {
    /// A short word for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            PathState::Absent => "absent",
            PathState::File { .. } => "file",
            PathState::Symlink { .. } => "symlink",
            PathState::Dir { .. } => "directory",
        }
    }
}

/// The blob store: `blobs/<first two hex digits>/<sha256>`, each written once.
pub(crate) struct Blobs {
    dir: PathBuf,
}

impl Blobs {
    pub(crate) fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub(crate) fn path(&self, sha256: &str) -> PathBuf {
        self.dir.join(&sha256[..2]).join(sha256)
    }

    /// Keeps `content` under its hash (a blob already there is left alone).
    pub(crate) fn put(&self, sha256: &str, content: &[u8]) -> io::Result<()> {
        let path = self.path(sha256);
        if path.exists() {
            return Ok(());
        }
        let parent = path.parent().expect("a blob path has a parent");
        std::fs::create_dir_all(parent)?;
        write_private_atomic(&path, content)
    }

    /// The content of a blob, checked against its hash.
    pub(crate) fn get(&self, sha256: &str) -> Result<Vec<u8>, CheckpointError> {
        let path = self.path(sha256);
        let content = std::fs::read(&path).map_err(|e| CheckpointError::io(&path, e))?;
        if sha256_hex(&content) != sha256 {
            return Err(CheckpointError::Corrupt(format!(
                "blob {} does not hold the content it is named for",
                path.display()
            )));
        }
        Ok(content)
    }

    /// Removes every blob not in `keep`; returns how many were removed.
    pub(crate) fn retain(&self, keep: &std::collections::HashSet<String>) -> usize {
        let mut removed = 0;
        let Ok(shards) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        for shard in shards.flatten() {
            let Ok(blobs) = std::fs::read_dir(shard.path()) else {
                continue;
            };
            for blob in blobs.flatten() {
                let name = blob.file_name().to_string_lossy().into_owned();
                if !keep.contains(&name) && std::fs::remove_file(blob.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes a file of ring0's state: a private temporary beside it, fsynced, renamed over it.
pub(crate) fn write_private_atomic(path: &Path, content: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(content)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// What `rel` holds beneath `root`, reading a file's content when `content` is given (bounded
/// by [`FILE_BYTES_MAX`]).
pub(crate) fn read_state(
    root: &Dir,
    rel: &str,
    content: Option<&mut Vec<u8>>,
) -> Result<PathState, CheckpointError> {
    let meta = match root.symlink_metadata(rel) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(PathState::Absent),
        // A parent that is a file (`a/b` where `a` is a file) holds nothing at `rel` either.
        Err(e) if e.raw_os_error() == Some(20) => return Ok(PathState::Absent),
        Err(e) => return Err(CheckpointError::workspace(rel, e)),
    };
    let mode = meta.permissions().mode() & 0o7777;
    if meta.is_symlink() {
        let target = root
            .read_link_contents(rel)
            .map_err(|e| CheckpointError::workspace(rel, e))?;
        let target = target.into_os_string().into_string().map_err(|_| {
            CheckpointError::Unsupported(format!("{rel}: a symlink target that is not UTF-8"))
        })?;
        return Ok(PathState::Symlink { target });
    }
    if meta.is_dir() {
        return Ok(PathState::Dir { mode });
    }
    if !meta.is_file() {
        return Err(CheckpointError::Unsupported(format!(
            "{rel}: neither a file, a directory nor a symlink"
        )));
    }
    if meta.len() > FILE_BYTES_MAX {
        return Err(CheckpointError::TooLarge(format!(
            "{rel} holds {} bytes, more than the {FILE_BYTES_MAX} one checkpointed file may",
            meta.len()
        )));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    let file = root
        .open(rel)
        .map_err(|e| CheckpointError::workspace(rel, e))?;
    file.into_std()
        .take(FILE_BYTES_MAX + 1)
        .read_to_end(&mut buf)
        .map_err(|e| CheckpointError::workspace(rel, e))?;
    let state = PathState::File {
        sha256: sha256_hex(&buf),
        bytes: buf.len() as u64,
        mode,
    };
    if let Some(out) = content {
        *out = buf;
    }
    Ok(state)
}
