//! Workspace checkpoints: what the workspace held before a session's mutations, and putting it
//! back.
//!
//! Before a session's first mutation ring0 opens a *checkpoint*; before each mutation it records
//! there what the paths the mutation touches hold ([`Checkpoints::before`]: file contents as
//! SHA-256-named blobs, symlinks, directories, and absence), or the whole workspace tree for a
//! command whose effects are not known in advance ([`Checkpoints::snapshot_tree`]). After the
//! mutation it records what ring0 left there ([`Checkpoints::after`], [`Checkpoints::after_tree`]).
//! A path's first record in a checkpoint is the one kept: the checkpoint holds the workspace as
//! it was when the session started changing it.
//!
//! [`Checkpoints::restore`] undoes a checkpoint and every later one: the touched paths go back to
//! what they held, and after a tree checkpoint every path created since (that `.gitignore` does
//! not ignore) is removed. It refuses, naming the paths, when one it would change holds
//! something else than what ring0 last saw or left there — a change made outside ring0 — unless
//! forced. The checkpoints it undid are dropped, with the blobs nothing else needs.
//!
//! Everything lives under the directory given to [`Checkpoints::open`] (ring0's state directory,
//! never the workspace): `blobs/`, one `cp-NNNNNN.json` per checkpoint, `index.json` (the
//! sequence and what each path last held) and `lock` (processes sharing the state take turns).
//! Workspace files are read and written beneath a directory handle of the workspace; `.git` and
//! the paths given to [`Checkpoints::skip`] are never recorded in a tree.
//!
//! ```no_run
//! use ring0_checkpoint::Checkpoints;
//!
//! let checkpoints = Checkpoints::open("/var/lib/ring0/ws/checkpoints", "/srv/ws")?;
//! let id = checkpoints.before("scope", &["src/main.rs"])?;
//! std::fs::write("/srv/ws/src/main.rs", "fn main() {}\n")?;
//! checkpoints.after(&["src/main.rs"])?;
//! checkpoints.restore(&id, false)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod restore;
mod state;
mod tree;

pub use restore::RestoreReport;
pub use state::PathState;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use serde::{Deserialize, Serialize};
use state::{Blobs, read_state, write_private_atomic};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// The store's directory inside ring0's state directory.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// Largest file a checkpoint records; a mutation touching a larger one cannot be checkpointed.
pub const FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Most paths a tree checkpoint records (files, directories and symlinks).
pub const TREE_PATHS_MAX: usize = 50_000;
/// Most bytes of file content one tree checkpoint reads.
pub const TREE_BYTES_MAX: u64 = 512 * 1024 * 1024;
/// Checkpoints kept by default; opening one more drops the oldest (and the blobs only it
/// needed), so the store does not grow without end.
pub const CHECKPOINTS_KEPT_DEFAULT: usize = 256;
/// Most paths one mutation's record names.
pub const PATHS_PER_RECORD_MAX: usize = 4096;
/// Most paths a refusal names (the rest are counted).
pub const CHANGED_SHOWN_MAX: usize = 32;
/// Checkpoint files in the store's directory start with this.
const CHECKPOINT_PREFIX: &str = "cp-";

/// Why a checkpoint could not be recorded, listed or restored.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A path argument that is not relative to the workspace, or climbs out of it.
    #[error("{0:?} is not a path inside the workspace")]
    OutsideWorkspace(String),
    /// Over a size bound.
    #[error("{0}")]
    TooLarge(String),
    /// Something a checkpoint does not record (a device, a socket, a non-UTF-8 name).
    #[error("cannot be checkpointed: {0}")]
    Unsupported(String),
    /// No checkpoint has this id.
    #[error("no checkpoint {0:?} (ring0 checkpoint ls lists them)")]
    NotFound(String),
    /// Paths changed outside ring0 since it last saw them; restoring would lose those changes.
    #[error(
        "{count} path(s) changed outside ring0 since it last wrote them: {shown}; restoring would overwrite those changes (pass --force to restore anyway)"
    )]
    ChangedOutside {
        /// How many.
        count: usize,
        /// The first [`CHANGED_SHOWN_MAX`], with what ring0 expected and what is there.
        shown: String,
        /// The paths, all of them.
        paths: Vec<String>,
    },
    /// A stored record or blob that does not read back as written.
    #[error("checkpoint store damaged: {0}")]
    Corrupt(String),
    /// Walking the workspace failed.
    #[error("walking the workspace: {0}")]
    Walk(String),
    /// An I/O error, with the path it concerns.
    #[error("{path}: {source}")]
    Io {
        /// The path (in the store, or relative to the workspace).
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl CheckpointError {
    fn io(path: &Path, source: io::Error) -> Self {
        Self::Io {
            path: path.display().to_string(),
            source,
        }
    }
    fn workspace(rel: &str, source: io::Error) -> Self {
        Self::Io {
            path: rel.to_string(),
            source,
        }
    }
}

/// One checkpoint, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// `cp-NNNNNN`, in the order checkpoints were opened.
    pub id: String,
    /// The position in that order.
    pub seq: u64,
    /// When it was opened, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// The scope of the session that opened it.
    pub scope: String,
    /// The ring0 process that opened it (with the scope, the session).
    pub run: String,
    /// Whether it holds the whole tree (a path it does not name was absent).
    pub tree: bool,
    /// What each path held before the session first touched it.
    pub paths: BTreeMap<String, PathState>,
}

/// The store's index: the sequence and what each path last held as ring0 saw or left it.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Index {
    next_seq: u64,
    known: BTreeMap<String, PathState>,
}

/// The checkpoints of one workspace.
pub struct Checkpoints {
    dir: PathBuf,
    workspace: PathBuf,
    root: Dir,
    skip: tree::Skip,
    blobs: Blobs,
    /// This process: sessions of different processes never share a checkpoint.
    run: String,
    /// How many checkpoints are kept (at least 1).
    kept_max: usize,
    /// The open checkpoint of each scope in this process.
    open: Mutex<HashMap<String, String>>,
}

impl Checkpoints {
    /// The checkpoints kept in `dir` (created private if missing) of the workspace at
    /// `workspace`.
    pub fn open(
        dir: impl Into<PathBuf>,
        workspace: impl AsRef<Path>,
    ) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        create_private_dir(&dir)?;
        let workspace = workspace.as_ref();
        let workspace = workspace
            .canonicalize()
            .map_err(|e| CheckpointError::io(workspace, e))?;
        let root = Dir::open_ambient_dir(&workspace, ambient_authority())
            .map_err(|e| CheckpointError::io(&workspace, e))?;
        Ok(Self {
            blobs: Blobs::new(dir.join("blobs")),
            skip: tree::Skip::new(std::slice::from_ref(&dir)),
            dir,
            workspace,
            root,
            run: uuid::Uuid::new_v4().simple().to_string()[..12].to_string(),
            kept_max: CHECKPOINTS_KEPT_DEFAULT,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// Also never records these files and directories in a tree (ring0's configuration, lock
    /// file and state directory when they lie inside the workspace).
    pub fn skip(mut self, paths: &[PathBuf]) -> Self {
        let mut all = paths.to_vec();
        all.push(self.dir.clone());
        self.skip = tree::Skip::new(&all);
        self
    }

    /// Keeps at most `kept_max` checkpoints (at least 1) instead of
    /// [`CHECKPOINTS_KEPT_DEFAULT`].
    pub fn keep(mut self, kept_max: usize) -> Self {
        self.kept_max = kept_max.max(1);
        self
    }

    /// The workspace, canonical.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// Records what `paths` (relative to the workspace) and their missing parent directories
    /// hold, in the checkpoint of the session with `scope` (opened now if this is its first
    /// mutation), unless that checkpoint already holds them. Returns the checkpoint's id.
    pub fn before(&self, scope: &str, paths: &[&str]) -> Result<String, CheckpointError> {
        let paths = self.recordable(with_parents(paths)?);
        self.locked(|store, index| {
            let mut checkpoint = store.session_checkpoint(scope, index)?;
            for path in &paths {
                store.record(&mut checkpoint, index, path)?;
            }
            store.save(&checkpoint)?;
            Ok(checkpoint.id)
        })
    }

    /// Records what `paths` (and their parent directories) hold now, as ring0 left them.
    pub fn after(&self, paths: &[&str]) -> Result<(), CheckpointError> {
        let paths = self.recordable(with_parents(paths)?);
        self.locked(|store, index| {
            for path in &paths {
                index
                    .known
                    .insert(path.clone(), read_state(&store.root, path, None)?);
            }
            Ok(())
        })
    }

    /// Records the whole tree in the session's checkpoint (opened now if needed), for a command
    /// whose effects are not known in advance; refused past [`TREE_PATHS_MAX`] paths or
    /// [`TREE_BYTES_MAX`] bytes. Returns the checkpoint's id.
    pub fn snapshot_tree(&self, scope: &str) -> Result<String, CheckpointError> {
        self.locked(|store, index| {
            let paths = tree::list(&store.workspace, &store.skip)?;
            let mut checkpoint = store.session_checkpoint(scope, index)?;
            let mut read_bytes = 0u64;
            for path in &paths {
                if let Some(PathState::File { bytes, .. }) = store.record(&mut checkpoint, index, path)? {
                    read_bytes += bytes;
                    if read_bytes > TREE_BYTES_MAX {
                        return Err(CheckpointError::TooLarge(format!(
                            "the workspace holds more than the {TREE_BYTES_MAX} bytes a tree checkpoint may record"
                        )));
                    }
                }
            }
            checkpoint.tree = true;
            store.save(&checkpoint)?;
            Ok(checkpoint.id)
        })
    }

    /// Records the whole tree as ring0 left it, after a command checkpointed with
    /// [`Checkpoints::snapshot_tree`] (paths it removed included).
    pub fn after_tree(&self, scope: &str) -> Result<(), CheckpointError> {
        self.locked(|store, index| {
            let mut paths = tree::list(&store.workspace, &store.skip)?;
            if let Some(checkpoint) = store.find_open(scope)? {
                paths.extend(checkpoint.paths.into_keys());
            }
            for path in paths {
                let state = read_state(&store.root, &path, None)?;
                index.known.insert(path, state);
            }
            Ok(())
        })
    }

    /// Every checkpoint, oldest first.
    pub fn list(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        self.locked(|store, _| store.load_all())
    }

    /// Puts the workspace back as it was before checkpoint `id` (undoing it and every later
    /// one). Refused with [`CheckpointError::ChangedOutside`] when a path it would change was
    /// changed outside ring0 since, unless `force`.
    pub fn restore(&self, id: &str, force: bool) -> Result<RestoreReport, CheckpointError> {
        self.locked(|store, index| {
            let report = restore::restore(store, index, id, force)?;
            store.open.lock().expect("checkpoint map poisoned").clear();
            Ok(report)
        })
    }

    /// The paths neither skipped themselves nor beneath a skipped directory (`paths` holds
    /// every parent before its children).
    fn recordable(&self, paths: Vec<String>) -> Vec<String> {
        let mut skipped: Vec<String> = Vec::new();
        paths
            .into_iter()
            .filter(|path| {
                let under = skipped.iter().any(|s| {
                    path.strip_prefix(s.as_str())
                        .is_some_and(|r| r.starts_with('/'))
                });
                if under || self.skip.holds(&self.root, path) {
                    skipped.push(path.clone());
                    return false;
                }
                true
            })
            .collect()
    }

    /// Runs `f` holding the store's lock, with its index (written back when `f` succeeds).
    fn locked<T>(
        &self,
        f: impl FnOnce(&Self, &mut Index) -> Result<T, CheckpointError>,
    ) -> Result<T, CheckpointError> {
        let lock_path = self.dir.join("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| CheckpointError::io(&lock_path, e))?;
        lock.lock()
            .map_err(|e| CheckpointError::io(&lock_path, e))?;
        let index_path = self.dir.join("index.json");
        let mut index: Index = match std::fs::read(&index_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| CheckpointError::Corrupt(format!("{}: {e}", index_path.display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Index::default(),
            Err(e) => return Err(CheckpointError::io(&index_path, e)),
        };
        let out = f(self, &mut index)?;
        let bytes = serde_json::to_vec(&index).expect("the index serializes");
        write_private_atomic(&index_path, &bytes)
            .map_err(|e| CheckpointError::io(&index_path, e))?;
        Ok(out)
    }

    /// The session's open checkpoint, or a new one.
    fn session_checkpoint(
        &self,
        scope: &str,
        index: &mut Index,
    ) -> Result<Checkpoint, CheckpointError> {
        if let Some(checkpoint) = self.find_open(scope)? {
            return Ok(checkpoint);
        }
        self.drop_oldest(self.kept_max - 1)?;
        index.next_seq += 1;
        let seq = index.next_seq;
        let checkpoint = Checkpoint {
            id: format!("{CHECKPOINT_PREFIX}{seq:06}"),
            seq,
            created_ms: now_ms(),
            scope: scope.to_string(),
            run: self.run.clone(),
            tree: false,
            paths: BTreeMap::new(),
        };
        self.open
            .lock()
            .expect("checkpoint map poisoned")
            .insert(scope.to_string(), checkpoint.id.clone());
        Ok(checkpoint)
    }

    /// Drops the oldest checkpoints until at most `kept` remain, with the blobs only they
    /// needed.
    fn drop_oldest(&self, kept: usize) -> Result<(), CheckpointError> {
        let all = self.load_all()?;
        if all.len() <= kept {
            return Ok(());
        }
        let (dropped, remaining) = all.split_at(all.len() - kept);
        for checkpoint in dropped {
            let path = self.checkpoint_path(&checkpoint.id);
            std::fs::remove_file(&path).map_err(|e| CheckpointError::io(&path, e))?;
        }
        self.blobs.retain(&blobs_of(remaining));
        Ok(())
    }

    fn find_open(&self, scope: &str) -> Result<Option<Checkpoint>, CheckpointError> {
        let id = self
            .open
            .lock()
            .expect("checkpoint map poisoned")
            .get(scope)
            .cloned();
        match id {
            Some(id) => self.load(&id).map(Some).or_else(|e| match e {
                // Restored (and dropped) meanwhile by another process: the next mutation opens
                // a new one.
                CheckpointError::NotFound(_) => Ok(None),
                other => Err(other),
            }),
            None => Ok(None),
        }
    }

    /// Records `path` in `checkpoint` unless it holds it already; returns the state recorded.
    fn record(
        &self,
        checkpoint: &mut Checkpoint,
        index: &mut Index,
        path: &str,
    ) -> Result<Option<PathState>, CheckpointError> {
        if checkpoint.paths.contains_key(path) {
            return Ok(None);
        }
        let mut content = Vec::new();
        let state = read_state(&self.root, path, Some(&mut content))?;
        if let PathState::File { sha256, .. } = &state {
            self.blobs
                .put(sha256, &content)
                .map_err(|e| CheckpointError::io(&self.blobs.path(sha256), e))?;
        }
        checkpoint.paths.insert(path.to_string(), state.clone());
        index.known.insert(path.to_string(), state.clone());
        Ok(Some(state))
    }

    fn checkpoint_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn save(&self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let path = self.checkpoint_path(&checkpoint.id);
        let bytes = serde_json::to_vec(checkpoint).expect("a checkpoint serializes");
        write_private_atomic(&path, &bytes).map_err(|e| CheckpointError::io(&path, e))
    }

    fn load(&self, id: &str) -> Result<Checkpoint, CheckpointError> {
        let valid = id.strip_prefix(CHECKPOINT_PREFIX).is_some_and(|n| {
            !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit())
        });
        if !valid {
            return Err(CheckpointError::NotFound(id.to_string()));
        }
        let path = self.checkpoint_path(id);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CheckpointError::NotFound(id.to_string()));
            }
            Err(e) => return Err(CheckpointError::io(&path, e)),
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| CheckpointError::Corrupt(format!("{}: {e}", path.display())))
    }

    fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        let entries =
            std::fs::read_dir(&self.dir).map_err(|e| CheckpointError::io(&self.dir, e))?;
        let mut all = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| CheckpointError::io(&self.dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(id) = name
                .strip_suffix(".json")
                .filter(|n| n.starts_with(CHECKPOINT_PREFIX))
            {
                all.push(self.load(id)?);
            }
        }
        all.sort_by_key(|c| c.seq);
        Ok(all)
    }
}

/// The blobs `checkpoints` need.
fn blobs_of(checkpoints: &[Checkpoint]) -> std::collections::HashSet<String> {
    checkpoints
        .iter()
        .flat_map(|c| c.paths.values())
        .filter_map(|s| match s {
            PathState::File { sha256, .. } => Some(sha256.clone()),
            _ => None,
        })
        .collect()
}

/// The paths, checked to be relative and inside the workspace, with every parent directory.
fn with_parents(paths: &[&str]) -> Result<Vec<String>, CheckpointError> {
    if paths.len() > PATHS_PER_RECORD_MAX {
        return Err(CheckpointError::TooLarge(format!(
            "{} paths in one record, more than {PATHS_PER_RECORD_MAX}",
            paths.len()
        )));
    }
    let mut out = std::collections::BTreeSet::new();
    for given in paths {
        let mut parts = Vec::new();
        for component in Path::new(given).components() {
            match component {
                Component::Normal(part) => parts.push(
                    part.to_str()
                        .ok_or_else(|| CheckpointError::OutsideWorkspace(given.to_string()))?,
                ),
                Component::CurDir => {}
                _ => return Err(CheckpointError::OutsideWorkspace(given.to_string())),
            }
        }
        if parts.is_empty() {
            return Err(CheckpointError::OutsideWorkspace(given.to_string()));
        }
        for end in 1..=parts.len() {
            out.insert(parts[..end].join("/"));
        }
    }
    Ok(out.into_iter().collect())
}

fn create_private_dir(dir: &Path) -> Result<(), CheckpointError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| CheckpointError::io(dir, e))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
