//! Signing keys kept in files: read, or created once by the first process that needs one (32
//! random bytes from the system, mode 0600), so what they sign — the spill store's sealed
//! handles, paging cursors, approval links, the console's form tokens — stays valid across
//! processes and restarts.
//!
//! Creation is safe against a concurrent opener: the key is written whole under a private
//! temporary name and then hard-linked into place, so every opener either wins the link or
//! reads the winner's key, never a partial one. A file that is not exactly [`KEY_BYTES`] long
//! is an error, never silently replaced (that would invalidate everything signed with it).

use std::fs;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of a key.
pub const KEY_BYTES: usize = 32;

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The key at `path`, created there first if there is none. The error is the file system's
/// (the caller names the path), or `InvalidData` for a file that is not a key.
pub fn load_or_create(path: &Path) -> io::Result<[u8; KEY_BYTES]> {
    match read(path) {
        Ok(key) => return Ok(key),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut key = [0u8; KEY_BYTES];
    getrandom::fill(&mut key).map_err(|e| io::Error::other(e.to_string()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let temp = path.with_file_name(format!(".{name}.partial-{}-{n}", std::process::id()));
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options
        .open(&temp)
        .and_then(|mut f| f.write_all(&key).and_then(|()| f.sync_all()));
    let linked = written.and_then(|()| fs::hard_link(&temp, path));
    let _ = fs::remove_file(&temp);
    match linked {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read(path),
        Err(e) => Err(e),
    }
}

fn read(path: &Path) -> io::Result<[u8; KEY_BYTES]> {
    let bytes = fs::read(path)?;
    bytes.try_into().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the key is not {KEY_BYTES} bytes"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_created_private_once_and_read_back_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signing.key");
        let first = load_or_create(&path).unwrap();
        assert_eq!(load_or_create(&path).unwrap(), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "no temporary file is left");
    }

    #[test]
    fn concurrent_openers_agree_on_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared.key");
        let keys: Vec<[u8; KEY_BYTES]> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| load_or_create(&path).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]));
    }

    #[test]
    fn a_file_that_is_not_a_key_is_an_error_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short.key");
        fs::write(&path, b"short").unwrap();
        let err = load_or_create(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(fs::read(&path).unwrap(), b"short");
    }
}
