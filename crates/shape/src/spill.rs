//! The spill store: full raw output kept on disk, named by its SHA-256, paged back on request.
//!
//! The shaped observation is a bounded view; the spill keeps what the view left out, so a model
//! that needs line 40,000 can ask for it instead of re-running the command. Files are named by the
//! hex SHA-256 of their content (identical outputs share one file) in one configured directory.
//! The store has a total size cap: after each new file, the oldest files are removed until the
//! store fits. A single spill is capped too; a stream beyond it is kept up to the cap and its
//! handle says `complete: false`.
//!
//! Handles are validated before use (`sha256:` and 64 lowercase hex digits), so a handle can never
//! name a path outside the store.
//!
//! A spill written for an owner (a session's scope) gets a sealed handle: `sha256:<hex>.<mac>`,
//! the MAC an HMAC-SHA256 of the owner and the hash under the store's key (32 random bytes in the
//! store's `.key`, created with the store, mode 0600). [`SpillStore::read_as`] pages a sealed
//! handle only for the owner it was sealed for; any other owner, a forged MAC or an unsealed
//! handle is answered as unknown, so one session can neither read nor confirm another's output.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hmac::{Hmac, KeyInit, Mac};
use ring0_core::observation::SpillHandle;
use sha2::{Digest, Sha256};

/// Default size cap of a whole store.
pub const SPILL_STORE_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;
/// Default size cap of one spilled stream.
pub const SPILL_FILE_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// Largest page `read_spill` returns.
pub const SPILL_PAGE_BYTES_MAX: usize = 64 * 1024;

/// Bytes of the store's sealing key.
pub const SPILL_KEY_BYTES: usize = crate::keyfile::KEY_BYTES;
/// Bytes of the MAC a sealed handle carries (hex-encoded in the handle).
pub const SPILL_MAC_BYTES: usize = 16;

const HANDLE_PREFIX: &str = "sha256:";
const TEMP_PREFIX: &str = ".partial-";
const KEY_FILE: &str = ".key";

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A content-addressed directory of spilled outputs.
#[derive(Debug)]
pub struct SpillStore {
    dir: PathBuf,
    store_bytes_max: u64,
    file_bytes_max: u64,
    key: [u8; SPILL_KEY_BYTES],
}

/// What went wrong with the spill store.
#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    #[error("spill handle {0:?} is not of the form sha256:<64 lowercase hex digits>")]
    BadHandle(String),
    #[error("spill {0} is not in the store (never written, or evicted by the size cap)")]
    NotFound(String),
    #[error("spill handle {0:?} is not known to this session")]
    Unknown(String),
    #[error("spill store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One page of a spilled stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillPage {
    /// Offset of the first byte returned.
    pub offset: u64,
    /// Raw bytes (not shaped; pass them through `shape_bytes` to show them to a model).
    pub bytes: Vec<u8>,
    /// Size of the whole spill.
    pub total_bytes: u64,
    /// No bytes follow this page.
    pub eof: bool,
}

impl SpillPage {
    /// Offset to ask for next.
    pub fn next_offset(&self) -> u64 {
        self.offset + self.bytes.len() as u64
    }
}

impl SpillStore {
    /// A store in `dir` (created if missing) with the default caps.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, SpillError> {
        Self::with_limits(dir, SPILL_STORE_BYTES_DEFAULT, SPILL_FILE_BYTES_DEFAULT)
    }

    /// A store with explicit caps.
    pub fn with_limits(
        dir: impl Into<PathBuf>,
        store_bytes_max: u64,
        file_bytes_max: u64,
    ) -> Result<Self, SpillError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| SpillError::Io {
            path: dir.clone(),
            source,
        })?;
        let key = load_or_create_key(&dir)?;
        Ok(Self {
            dir,
            store_bytes_max,
            file_bytes_max: file_bytes_max.min(store_bytes_max),
            key,
        })
    }

    /// The MAC binding `hex` to `owner`, hex-encoded.
    fn mac(&self, owner: &str, hex_digest: &str) -> String {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        mac.update(&(owner.len() as u64).to_be_bytes());
        mac.update(owner.as_bytes());
        mac.update(hex_digest.as_bytes());
        hex(&mac.finalize().into_bytes()[..SPILL_MAC_BYTES])
    }

    /// The handle of spill `hex` sealed for `owner` (plain without one).
    fn handle_for(&self, owner: Option<&str>, hex_digest: &str) -> String {
        match owner {
            Some(owner) => format!(
                "{HANDLE_PREFIX}{hex_digest}.{}",
                self.mac(owner, hex_digest)
            ),
            None => format!("{HANDLE_PREFIX}{hex_digest}"),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts a spill; write the raw stream into it and [`SpillWriter::finish`] it.
    pub fn writer(self: &Arc<Self>) -> Result<SpillWriter, SpillError> {
        self.writer_for(None)
    }

    /// Starts a spill whose handle is sealed for `owner` (see the module documentation).
    pub fn writer_for(self: &Arc<Self>, owner: Option<&str>) -> Result<SpillWriter, SpillError> {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = self
            .dir
            .join(format!("{TEMP_PREFIX}{}-{n}", std::process::id()));
        // Spilled output is the user's alone (0600).
        let mut options = fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(&path).map_err(|source| SpillError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(SpillWriter {
            store: Arc::clone(self),
            path,
            file: Some(BufWriter::with_capacity(64 * 1024, file)),
            hasher: Sha256::new(),
            bytes: 0,
            complete: true,
            error: None,
            owner: owner.map(str::to_string),
        })
    }

    /// Stores a whole value at once (used for oversized structured content).
    pub fn put(self: &Arc<Self>, bytes: &[u8]) -> Result<SpillHandle, SpillError> {
        self.put_for(None, bytes)
    }

    /// Stores a whole value at once, its handle sealed for `owner`.
    pub fn put_for(
        self: &Arc<Self>,
        owner: Option<&str>,
        bytes: &[u8],
    ) -> Result<SpillHandle, SpillError> {
        let mut w = self.writer_for(owner)?;
        w.write(bytes);
        w.finish()
    }

    /// Reads a page of a handle sealed for `owner`. Any other handle — sealed for someone else,
    /// forged, or unsealed — is [`SpillError::Unknown`], whether or not its spill exists.
    pub fn read_as(
        &self,
        owner: &str,
        handle: &str,
        offset: u64,
        len: usize,
    ) -> Result<SpillPage, SpillError> {
        let (hex_digest, mac) = parse_handle(handle)?;
        let Some(mac) = mac else {
            return Err(SpillError::Unknown(handle.to_string()));
        };
        let expected = self.mac(owner, hex_digest);
        // Both are fixed-length lowercase hex; compare without an early exit.
        let same = expected.len() == mac.len()
            && expected
                .bytes()
                .zip(mac.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(SpillError::Unknown(handle.to_string()));
        }
        self.read_hex(handle, hex_digest, offset, len)
    }

    /// Reads up to `len` bytes (at most [`SPILL_PAGE_BYTES_MAX`]) from `offset`, whoever the
    /// handle was sealed for (the operator's view; a model's goes through [`Self::read_as`]).
    pub fn read(&self, handle: &str, offset: u64, len: usize) -> Result<SpillPage, SpillError> {
        let (hex_digest, _) = parse_handle(handle)?;
        self.read_hex(handle, hex_digest, offset, len)
    }

    fn read_hex(
        &self,
        handle: &str,
        hex: &str,
        offset: u64,
        len: usize,
    ) -> Result<SpillPage, SpillError> {
        let path = self.dir.join(hex);
        let mut file = File::open(&path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => SpillError::NotFound(handle.to_string()),
            _ => SpillError::Io {
                path: path.clone(),
                source,
            },
        })?;
        let io_err = |source| SpillError::Io {
            path: path.clone(),
            source,
        };
        let total_bytes = file.metadata().map_err(io_err)?.len();
        let offset = offset.min(total_bytes);
        file.seek(SeekFrom::Start(offset)).map_err(io_err)?;
        let want = len.min(SPILL_PAGE_BYTES_MAX);
        let mut bytes = Vec::with_capacity(want);
        file.take(want as u64)
            .read_to_end(&mut bytes)
            .map_err(io_err)?;
        let eof = offset + bytes.len() as u64 >= total_bytes;
        Ok(SpillPage {
            offset,
            bytes,
            total_bytes,
            eof,
        })
    }

    /// Removes the oldest spills until the store fits its cap, never `keep`.
    fn evict(&self, keep: &Path) -> io::Result<()> {
        let mut files = Vec::new();
        let mut total = 0u64;
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if parse_hex(name).is_none() {
                continue;
            }
            let meta = entry.metadata()?;
            total += meta.len();
            let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            files.push((modified, meta.len(), entry.path()));
        }
        if total <= self.store_bytes_max {
            return Ok(());
        }
        files.sort();
        for (_, len, path) in files {
            if total <= self.store_bytes_max {
                break;
            }
            if path == keep {
                continue;
            }
            match fs::remove_file(&path) {
                Ok(()) => total -= len,
                Err(e) if e.kind() == io::ErrorKind::NotFound => total -= len,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Reads a page of a spill, whoever it was sealed for.
pub fn read_spill(
    store: &SpillStore,
    handle: &str,
    offset: u64,
    len: usize,
) -> Result<SpillPage, SpillError> {
    store.read(handle, offset, len)
}

/// A spill being written. Writing never fails loudly: an I/O error stops the copy and is
/// reported by [`SpillWriter::finish`], while shaping goes on.
pub struct SpillWriter {
    store: Arc<SpillStore>,
    path: PathBuf,
    file: Option<BufWriter<File>>,
    hasher: Sha256,
    bytes: u64,
    complete: bool,
    error: Option<io::Error>,
    owner: Option<String>,
}

impl SpillWriter {
    /// Appends raw bytes, up to the store's per-file cap.
    pub fn write(&mut self, data: &[u8]) {
        let room = self.store.file_bytes_max - self.bytes;
        let take = (data.len() as u64).min(room) as usize;
        if take < data.len() {
            self.complete = false;
        }
        let data = &data[..take];
        if data.is_empty() {
            return;
        }
        let Some(file) = self.file.as_mut() else {
            return;
        };
        if let Err(e) = file.write_all(data) {
            self.error = Some(e);
            self.file = None;
            return;
        }
        self.hasher.update(data);
        self.bytes += data.len() as u64;
    }

    /// Bytes of memory held (the write buffer).
    pub fn buffered_bytes(&self) -> usize {
        self.file.as_ref().map_or(0, BufWriter::capacity)
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Names the file by its hash (keeping an existing identical one) and applies the store cap.
    pub fn finish(mut self) -> Result<SpillHandle, SpillError> {
        let path = self.path.clone();
        let io_err = |source| SpillError::Io {
            path: path.clone(),
            source,
        };
        if let Some(e) = self.error.take() {
            let _ = fs::remove_file(&self.path);
            return Err(io_err(e));
        }
        if let Some(mut file) = self.file.take() {
            file.flush().map_err(io_err)?;
        }
        let hex = hex(&self.hasher.clone().finalize());
        let target = self.store.dir.join(&hex);
        if target.exists() {
            fs::remove_file(&self.path).map_err(io_err)?;
        } else {
            fs::rename(&self.path, &target).map_err(io_err)?;
        }
        self.store.evict(&target).map_err(io_err)?;
        Ok(SpillHandle {
            id: self.store.handle_for(self.owner.as_deref(), &hex),
            bytes: self.bytes,
            complete: self.complete,
        })
    }
}

impl Drop for SpillWriter {
    fn drop(&mut self) {
        // An abandoned writer leaves no partial file behind.
        if self.file.is_some() {
            self.file = None;
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The hash of a handle and its MAC, if sealed.
fn parse_handle(handle: &str) -> Result<(&str, Option<&str>), SpillError> {
    let bad = || SpillError::BadHandle(handle.to_string());
    let rest = handle.strip_prefix(HANDLE_PREFIX).ok_or_else(bad)?;
    let (digest, mac) = match rest.split_once('.') {
        Some((digest, mac)) => (digest, Some(mac)),
        None => (rest, None),
    };
    let digest = parse_hex(digest).ok_or_else(bad)?;
    if let Some(mac) = mac
        && !(mac.len() == SPILL_MAC_BYTES * 2
            && mac
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    {
        return Err(bad());
    }
    Ok((digest, mac))
}

/// The store's sealing key: read from `.key`, or created there (0600) by the first opener.
fn load_or_create_key(dir: &Path) -> Result<[u8; SPILL_KEY_BYTES], SpillError> {
    let path = dir.join(KEY_FILE);
    crate::keyfile::load_or_create(&path).map_err(|source| SpillError::Io { path, source })
}

fn parse_hex(s: &str) -> Option<&str> {
    (s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(s)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spill_is_named_by_its_sha256_and_pages_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SpillStore::open(dir.path()).unwrap());
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let h = store.put(&data).unwrap();
        assert_eq!(h.id, format!("sha256:{}", hex(&Sha256::digest(&data))));
        assert!(h.complete);
        let mut back = Vec::new();
        let mut offset = 0;
        loop {
            let page = read_spill(&store, &h.id, offset, 50_000).unwrap();
            back.extend_from_slice(&page.bytes);
            offset = page.next_offset();
            if page.eof {
                break;
            }
        }
        assert_eq!(back, data);
    }

    #[test]
    fn a_sealed_handle_pages_only_for_its_owner() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SpillStore::open(dir.path()).unwrap());
        let h = store.put_for(Some("session-a"), b"secret output").unwrap();
        let page = store.read_as("session-a", &h.id, 0, 100).unwrap();
        assert_eq!(page.bytes, b"secret output");
        assert!(matches!(
            store.read_as("session-b", &h.id, 0, 100),
            Err(SpillError::Unknown(_))
        ));
        // The bare hash, or the hash with another MAC, is no way around the seal.
        let (bare, mac) = h.id.split_once('.').unwrap();
        assert!(matches!(
            store.read_as("session-b", bare, 0, 100),
            Err(SpillError::Unknown(_))
        ));
        let flipped = format!(
            "{bare}.{}",
            mac.replace(&mac[..1], if &mac[..1] == "0" { "1" } else { "0" })
        );
        assert!(matches!(
            store.read_as("session-a", &flipped, 0, 100),
            Err(SpillError::Unknown(_))
        ));
    }

    #[test]
    fn a_reopened_store_keeps_its_key_so_handles_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let h = Arc::new(SpillStore::open(dir.path()).unwrap())
            .put_for(Some("s"), b"kept")
            .unwrap();
        let again = SpillStore::open(dir.path()).unwrap();
        assert_eq!(again.read_as("s", &h.id, 0, 10).unwrap().bytes, b"kept");
        let other = tempfile::tempdir().unwrap();
        std::fs::copy(
            dir.path().join(
                h.id.split_once('.')
                    .unwrap()
                    .0
                    .trim_start_matches(HANDLE_PREFIX),
            ),
            other.path().join(
                h.id.split_once('.')
                    .unwrap()
                    .0
                    .trim_start_matches(HANDLE_PREFIX),
            ),
        )
        .unwrap();
        let foreign = SpillStore::open(other.path()).unwrap();
        assert!(matches!(
            foreign.read_as("s", &h.id, 0, 10),
            Err(SpillError::Unknown(_))
        ));
    }

    #[cfg(unix)]
    #[test]
    fn the_key_is_private_to_its_user() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        SpillStore::open(dir.path()).unwrap();
        let mode = fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_page_is_capped_at_the_page_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SpillStore::open(dir.path()).unwrap());
        let h = store.put(&vec![b'x'; SPILL_PAGE_BYTES_MAX * 2]).unwrap();
        let page = store.read(&h.id, 0, usize::MAX).unwrap();
        assert_eq!(page.bytes.len(), SPILL_PAGE_BYTES_MAX);
        assert!(!page.eof);
    }

    #[test]
    fn a_handle_that_is_not_a_hash_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SpillStore::open(dir.path()).unwrap());
        let err = store.read("sha256:../../etc/passwd", 0, 10).unwrap_err();
        assert!(matches!(err, SpillError::BadHandle(_)));
    }

    #[test]
    fn a_stream_beyond_the_file_cap_is_kept_up_to_it_and_marked_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SpillStore::with_limits(dir.path(), 1 << 20, 1000).unwrap());
        let h = store.put(&[b'a'; 5000]).unwrap();
        assert_eq!(h.bytes, 1000);
        assert!(!h.complete);
    }

    #[test]
    fn the_store_cap_evicts_the_oldest_spills() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SpillStore::with_limits(dir.path(), 2500, 1000).unwrap());
        let age = |h: &SpillHandle, secs: u64| {
            let path = dir.path().join(h.id.trim_start_matches(HANDLE_PREFIX));
            let file = File::options().write(true).open(path).unwrap();
            file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
                .unwrap();
        };
        let first = store.put(&[b'1'; 1000]).unwrap();
        age(&first, 1_000);
        let second = store.put(&[b'2'; 1000]).unwrap();
        age(&second, 2_000);
        let third = store.put(&[b'3'; 1000]).unwrap();
        assert!(matches!(
            store.read(&first.id, 0, 10),
            Err(SpillError::NotFound(_))
        ));
        assert!(store.read(&third.id, 0, 10).is_ok());
    }
}
