//! The path sandbox: every file a tool touches is reached through a directory handle.
//!
//! A [`Sandbox`] holds one open `cap_std::fs::Dir` per root (the workspace and any extra read or
//! write roots). A path from a model is first checked for what no file system name may hold (NUL
//! bytes, overlong paths or names), then assigned to a root: a relative path is taken relative to
//! the workspace, and the root is the one whose directory contains it by path components (so
//! `/workspace-evil` is never inside `/workspace`). That assignment only picks a handle; it grants
//! nothing. The remainder is then opened *beneath* the handle — `openat2(RESOLVE_BENEATH)` where
//! the kernel has it, cap-std's own component-by-component resolution elsewhere — so `..` that
//! climbs out, absolute symlinks, symlinks that point out of the root and `/proc/self/root`-style
//! magic links are refused by the kernel at the moment of use. Because the check *is* the open,
//! swapping a directory for a symlink between one call's steps gains nothing: each step resolves
//! again beneath the root, and mutations work on an already open parent directory handle.
//!
//! ring0's own files are *protected paths* ([`ProtectedPaths`]): the configuration file, the lock
//! file and the state directory. Whatever the roots grant, no tool reaches them. They are told
//! apart by file identity (device and inode), never by path strings, so a symlink, `..`, a hard
//! link or a bind mount leads to the same refusal: a directory handle is refused when it or any
//! of its ancestors (walked up through `..` from the handle itself) is a protected directory; a
//! name is refused when (its parent's identity, the name) is where a protected file lives or
//! would be created; an existing file is refused when its identity is a protected file's, or,
//! for a file with several links, any file's beneath the state directory. Identities are read
//! again at every check, so a protected file replaced by a rename is still protected.

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt};
use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::{DirEntryExt, MetadataExt as StdMetadataExt};
use std::path::{Component, Path, PathBuf};

/// Longest accepted path argument, in bytes (Linux `PATH_MAX`).
pub const PATH_BYTES_MAX: usize = 4096;
/// Longest accepted path component, in bytes (Linux `NAME_MAX`).
pub const NAME_BYTES_MAX: usize = 255;
/// Most ancestors walked up from a directory handle when checking it against the protected
/// directories; a deeper directory is refused (it cannot be shown to lie outside them).
pub const ANCESTORS_MAX: usize = 1024;
/// Most entries of the state directory read to find a file with several links among them; when
/// the state directory holds more, such a file is refused (it cannot be shown to be elsewhere).
pub const STATE_ENTRIES_SCANNED_MAX: usize = 8192;
/// Deepest nesting of the state directory read by that scan.
const STATE_SCAN_DEPTH_MAX: usize = 8;
/// The `kind` of a refusal of a protected path, in tool errors and rejections.
pub const PROTECTED_PATH_CODE: &str = "protected_path";

/// Why a path was refused or could not be used. Every variant names the path as the caller gave
/// it.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("path is empty")]
    Empty,
    #[error("path {path:?} contains a NUL byte")]
    Nul { path: String },
    #[error("path of {bytes} bytes exceeds {PATH_BYTES_MAX}")]
    TooLong { bytes: usize },
    #[error("path {path:?} has a component longer than {NAME_BYTES_MAX} bytes")]
    NameTooLong { path: String },
    #[error("path {path:?} is outside every root this session may {access} (roots: {roots})")]
    OutsideRoots {
        path: String,
        access: &'static str,
        roots: String,
    },
    #[error("path {path:?} is in a read-only root; writing there is not granted")]
    ReadOnly { path: String },
    #[error("path {path:?} escapes its root (through `..` or a symlink); access refused")]
    Escape { path: String },
    #[error("path {path:?} does not name a file")]
    NotAFileName { path: String },
    #[error(
        "path {path:?} is ring0's own (its configuration, lock file or state directory); no tool may read, list or change it"
    )]
    Protected { path: String },
    #[error("{path:?}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl SandboxError {
    /// Wraps an I/O error from an operation beneath a root. cap-std reports an attempted escape
    /// as `PermissionDenied` with its own message; it is named as such.
    pub fn io(path: &str, source: io::Error) -> Self {
        let text = source.to_string();
        if text.contains("outside of the filesystem") || text.contains("escape") {
            return Self::Escape {
                path: path.to_string(),
            };
        }
        // openat2(RESOLVE_BENEATH) reports an escape as EXDEV.
        if source.raw_os_error() == Some(18) {
            return Self::Escape {
                path: path.to_string(),
            };
        }
        Self::Io {
            path: path.to_string(),
            source,
        }
    }
}

impl SandboxError {
    /// A machine-readable kind, for the errors a caller may act on.
    pub fn code(&self) -> Option<&'static str> {
        matches!(self, Self::Protected { .. }).then_some(PROTECTED_PATH_CODE)
    }
}

/// What a tool means to do at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl Access {
    fn verb(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// One root: an open directory, the absolute path it was opened at (for choosing roots and for
/// messages only), and whether writing beneath it is granted.
#[derive(Debug)]
pub struct Root {
    path: PathBuf,
    dir: Dir,
    writable: bool,
}

impl Root {
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn dir(&self) -> &Dir {
        &self.dir
    }
    pub fn writable(&self) -> bool {
        self.writable
    }
}

/// A path assigned to a root: the root and the path relative to it (possibly empty: the root).
#[derive(Debug)]
pub struct Located<'a> {
    pub root: &'a Root,
    pub rel: PathBuf,
    /// The path as the caller gave it, for messages.
    pub given: String,
    guard: &'a Guard,
}

impl Located<'_> {
    /// The path relative to the workspace when it lies in it, else absolute — how results name
    /// files back to the model.
    pub fn display(&self, workspace: &Path) -> String {
        display_path(&self.root.path.join(&self.rel), workspace)
    }

    /// Splits into the parent directory (relative to the root) and a final file name.
    pub fn split_name(&self) -> Result<(PathBuf, String), SandboxError> {
        let name = match self.rel.components().next_back() {
            Some(Component::Normal(name)) => name.to_string_lossy().into_owned(),
            _ => {
                return Err(SandboxError::NotAFileName {
                    path: self.given.clone(),
                });
            }
        };
        let parent = self.rel.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok((parent, name))
    }

    /// Opens the parent directory beneath the root (`create` makes missing directories,
    /// each one beneath the root as well). Refused as [`SandboxError::Protected`] when the
    /// parent lies in a protected directory or the name is (or links to) a protected file —
    /// checked before any directory is created.
    pub fn open_parent(&self, create: bool) -> Result<(Dir, String), SandboxError> {
        let (parent, name) = self.split_name()?;
        let dir = self.open_checked(&parent, create)?;
        self.guard.check_entry(&dir, &name, &self.given)?;
        Ok((dir, name))
    }

    /// Opens this path as a directory beneath the root; refused when it is, or lies in, a
    /// protected directory.
    pub fn open_dir(&self) -> Result<Dir, SandboxError> {
        self.open_checked(&self.rel, false)
    }

    /// Refuses an open file whose identity is protected (a read checks what it opened).
    pub fn check_file(&self, file: &cap_std::fs::File) -> Result<(), SandboxError> {
        let meta = file
            .metadata()
            .map_err(|e| SandboxError::io(&self.given, e))?;
        self.guard.check_identity(&meta, &self.given)
    }

    fn open_checked(&self, rel: &Path, create: bool) -> Result<Dir, SandboxError> {
        let io = |e| SandboxError::io(&self.given, e);
        let root = &self.root.dir;
        if rel.as_os_str().is_empty() {
            let dir = root.try_clone().map_err(io)?;
            self.guard.check_dir(&dir, &self.given)?;
            return Ok(dir);
        }
        match root.open_dir(rel) {
            Ok(dir) => {
                self.guard.check_dir(&dir, &self.given)?;
                Ok(dir)
            }
            Err(e) if create && e.kind() == io::ErrorKind::NotFound => self.create_dirs(rel),
            Err(e) => Err(io(e)),
        }
    }

    /// Creates the missing directories of `rel` one name at a time beneath the deepest one that
    /// exists, checking each parent and name before it is made, so a refused path leaves
    /// nothing behind. Only plain names are created (never through `..`).
    fn create_dirs(&self, rel: &Path) -> Result<Dir, SandboxError> {
        let io = |e| SandboxError::io(&self.given, e);
        let parts: Vec<Component<'_>> = rel.components().collect();
        let mut existing = parts.len();
        let mut dir = loop {
            if existing == 0 {
                break self.root.dir.try_clone().map_err(io)?;
            }
            existing -= 1;
            let prefix: PathBuf = parts[..existing].iter().collect();
            if prefix.as_os_str().is_empty() {
                break self.root.dir.try_clone().map_err(io)?;
            }
            match self.root.dir.open_dir(&prefix) {
                Ok(dir) => break dir,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(e)),
            }
        };
        self.guard.check_dir(&dir, &self.given)?;
        for part in &parts[existing..] {
            let Component::Normal(name) = part else {
                return Err(SandboxError::Escape {
                    path: self.given.clone(),
                });
            };
            let name = name.to_string_lossy();
            self.guard.check_entry(&dir, &name, &self.given)?;
            match dir.create_dir(&*name) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(e)),
            }
            dir = dir.open_dir(&*name).map_err(io)?;
            self.guard.check_dir(&dir, &self.given)?;
        }
        Ok(dir)
    }
}

/// A file's identity: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    fn of(meta: &cap_std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
    fn of_std(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: StdMetadataExt::dev(meta),
            ino: StdMetadataExt::ino(meta),
        }
    }
}

/// ring0's own paths, which no tool may touch whatever the roots grant. Absolute paths from the
/// operator's configuration (never from a model); they need not exist yet.
#[derive(Debug, Clone, Default)]
pub struct ProtectedPaths {
    /// Files (the configuration file, the lock file): their names where they are or would be
    /// created, and their contents wherever they are linked.
    pub files: Vec<PathBuf>,
    /// Directories (the state directory): everything beneath them, by whatever path.
    pub dirs: Vec<PathBuf>,
}

/// The protected identities at one moment: read again for every check.
#[derive(Debug, Default)]
struct Marks {
    dirs: Vec<FileId>,
    files: Vec<FileId>,
    /// (parent directory, name) of every protected path.
    names: Vec<(FileId, OsString)>,
}

/// What the state directories hold, for recognizing a hard link to one of their files.
#[derive(Debug, Default)]
pub struct StateScan {
    ids: HashSet<FileId>,
    /// Every entry was read (the scan stayed within its bounds).
    complete: bool,
}

/// The protected paths and how each check consults them.
#[derive(Debug, Default)]
pub struct Guard {
    paths: ProtectedPaths,
}

impl Guard {
    fn marks(&self) -> Marks {
        let mut marks = Marks::default();
        let all = self.paths.files.iter().map(|p| (p, false));
        for (path, is_dir) in all.chain(self.paths.dirs.iter().map(|p| (p, true))) {
            if let Ok(meta) = std::fs::metadata(path) {
                let id = FileId::of_std(&meta);
                if is_dir || meta.is_dir() {
                    marks.dirs.push(id);
                } else {
                    marks.files.push(id);
                }
            }
            if let (Some(parent), Some(name)) = (path.parent(), path.file_name())
                && let Ok(meta) = std::fs::metadata(parent)
            {
                marks
                    .names
                    .push((FileId::of_std(&meta), name.to_os_string()));
            }
        }
        marks
    }

    /// Reads the state directories' entries (bounded).
    pub fn scan_state(&self) -> StateScan {
        let mut scan = StateScan {
            ids: HashSet::new(),
            complete: true,
        };
        let mut pending: Vec<(PathBuf, usize)> =
            self.paths.dirs.iter().map(|d| (d.clone(), 0)).collect();
        let mut seen = 0usize;
        while let Some((dir, depth)) = pending.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            let dev = StdMetadataExt::dev(&meta);
            scan.ids.insert(FileId::of_std(&meta));
            let Ok(entries) = std::fs::read_dir(&dir) else {
                scan.complete = false;
                continue;
            };
            for entry in entries {
                let Ok(entry) = entry else {
                    scan.complete = false;
                    continue;
                };
                seen += 1;
                if seen > STATE_ENTRIES_SCANNED_MAX {
                    scan.complete = false;
                    return scan;
                }
                scan.ids.insert(FileId {
                    dev,
                    ino: entry.ino(),
                });
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    if depth + 1 > STATE_SCAN_DEPTH_MAX {
                        scan.complete = false;
                    } else {
                        pending.push((entry.path(), depth + 1));
                    }
                }
            }
        }
        scan
    }

    fn refuse(given: &str) -> SandboxError {
        SandboxError::Protected {
            path: given.to_string(),
        }
    }

    /// Refuses `dir` when it or an ancestor is a protected directory. The walk goes up through
    /// `..` from the handle itself, so it sees where the directory really is.
    pub fn check_dir(&self, dir: &Dir, given: &str) -> Result<(), SandboxError> {
        if self.paths.dirs.is_empty() {
            return Ok(());
        }
        let marks = self.marks();
        self.check_dir_with(&marks, dir, given)
    }

    fn check_dir_with(&self, marks: &Marks, dir: &Dir, given: &str) -> Result<(), SandboxError> {
        use rustix::fs::{Mode, OFlags};
        if marks.dirs.is_empty() {
            return Ok(());
        }
        let io = |e: rustix::io::Errno| SandboxError::io(given, io::Error::from(e));
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let mut current = rustix::fs::openat(dir, ".", flags, Mode::empty()).map_err(io)?;
        for _ in 0..ANCESTORS_MAX {
            let stat = rustix::fs::fstat(&current).map_err(io)?;
            let id = FileId {
                dev: stat.st_dev,
                ino: stat.st_ino,
            };
            if marks.dirs.contains(&id) {
                return Err(Self::refuse(given));
            }
            let parent = rustix::fs::openat(&current, "..", flags, Mode::empty()).map_err(io)?;
            let up = rustix::fs::fstat(&parent).map_err(io)?;
            if (up.st_dev, up.st_ino) == (stat.st_dev, stat.st_ino) {
                return Ok(());
            }
            current = parent;
        }
        Err(Self::refuse(given))
    }

    /// Refuses the entry `name` of `parent`: a parent in a protected directory, a protected
    /// name, or an existing file (followed through symlinks beneath `parent`) that is protected.
    pub fn check_entry(&self, parent: &Dir, name: &str, given: &str) -> Result<(), SandboxError> {
        if self.paths.files.is_empty() && self.paths.dirs.is_empty() {
            return Ok(());
        }
        let marks = self.marks();
        self.check_dir_with(&marks, parent, given)?;
        let parent_id = FileId::of(
            &parent
                .dir_metadata()
                .map_err(|e| SandboxError::io(given, e))?,
        );
        if marks
            .names
            .iter()
            .any(|(dir, n)| *dir == parent_id && n.as_os_str() == name)
        {
            return Err(Self::refuse(given));
        }
        let followed = parent.metadata(name);
        let escapes = followed.is_err();
        for meta in [parent.symlink_metadata(name), followed]
            .into_iter()
            .flatten()
        {
            self.check_identity_with(&marks, &meta, given)?;
        }
        // A symlink that leads out of the root (an absolute one) is refused by the open anyway;
        // followed here without the root's confinement only to name the refusal for what it is
        // when it leads to a protected file. Nothing is read through it.
        if let Ok(stat) = rustix::fs::statat(parent, name, rustix::fs::AtFlags::empty()) {
            let id = FileId {
                dev: stat.st_dev,
                ino: stat.st_ino,
            };
            if marks.files.contains(&id)
                || marks.dirs.contains(&id)
                || (escapes && self.scan_state().ids.contains(&id))
            {
                return Err(Self::refuse(given));
            }
        }
        Ok(())
    }

    /// Refuses a file or directory whose identity is protected.
    pub fn check_identity(
        &self,
        meta: &cap_std::fs::Metadata,
        given: &str,
    ) -> Result<(), SandboxError> {
        if self.paths.files.is_empty() && self.paths.dirs.is_empty() {
            return Ok(());
        }
        self.check_identity_with(&self.marks(), meta, given)
    }

    fn check_identity_with(
        &self,
        marks: &Marks,
        meta: &cap_std::fs::Metadata,
        given: &str,
    ) -> Result<(), SandboxError> {
        let id = FileId::of(meta);
        if marks.files.contains(&id) || marks.dirs.contains(&id) {
            return Err(Self::refuse(given));
        }
        if meta.is_file() && meta.nlink() > 1 {
            let scan = self.scan_state();
            if !scan.complete || scan.ids.contains(&id) {
                return Err(Self::refuse(given));
            }
        }
        Ok(())
    }

    /// What a walk needs to leave protected entries out, read once per walk.
    pub fn listing(&self) -> Listing {
        if self.paths.files.is_empty() && self.paths.dirs.is_empty() {
            return Listing::default();
        }
        Listing {
            active: true,
            marks: self.marks(),
            state: self.scan_state(),
        }
    }
}

/// The protected identities as one walk sees them: entries matching them are left out.
#[derive(Debug, Default)]
pub struct Listing {
    active: bool,
    marks: Marks,
    state: StateScan,
}

impl Listing {
    /// Whether the entry `name` of `parent` (whose identity is `parent_id`; `ino` and
    /// `plain_file` from the directory listing) is protected, or leads to something protected (a
    /// symlink is followed beneath `parent`).
    pub fn hides(
        &self,
        parent: &Dir,
        parent_id: Option<FileId>,
        name: &str,
        ino: u64,
        plain_file: bool,
    ) -> bool {
        if !self.active {
            return false;
        }
        let Some(parent_id) = parent_id else {
            return true;
        };
        if self
            .marks
            .names
            .iter()
            .any(|(dir, n)| *dir == parent_id && n.as_os_str() == name)
        {
            return true;
        }
        let hidden = |id: &FileId| {
            self.marks.files.contains(id)
                || self.marks.dirs.contains(id)
                || self.state.ids.contains(id)
        };
        if hidden(&FileId {
            dev: parent_id.dev,
            ino,
        }) {
            return true;
        }
        // Symlinks, mount points, and (when the state scan was cut short) files with several
        // links: their identity is only known from their metadata.
        if plain_file && self.state.complete {
            return false;
        }
        let Ok(link) = parent.symlink_metadata(name) else {
            return true;
        };
        let needs_target = link.file_type().is_symlink()
            || link.is_dir()
            || (!self.state.complete && link.nlink() > 1);
        if !needs_target {
            return false;
        }
        if !self.state.complete && link.is_file() && link.nlink() > 1 {
            return true;
        }
        match parent.metadata(name) {
            Ok(target) => {
                hidden(&FileId::of(&target))
                    || (!self.state.complete && target.is_file() && target.nlink() > 1)
            }
            // A dangling or escaping symlink leads nowhere a tool could follow.
            Err(_) => false,
        }
    }

    /// The identity of a directory handle, for [`Listing::hides`].
    pub fn id_of(dir: &Dir) -> Option<FileId> {
        dir.dir_metadata().ok().map(|m| FileId::of(&m))
    }
}

/// Renders `path` relative to the workspace when inside it (by components), else as is.
pub fn display_path(path: &Path, workspace: &Path) -> String {
    match path.strip_prefix(workspace) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_string(),
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => path.to_string_lossy().into_owned(),
    }
}

/// The roots of one workspace.
#[derive(Debug)]
pub struct Sandbox {
    workspace: PathBuf,
    roots: Vec<Root>,
    guard: Guard,
}

impl Sandbox {
    /// Opens the workspace (readable, and writable when `workspace_writable`) and extra roots.
    /// Each path is canonicalized once, here, from the operator's configuration.
    pub fn open(
        workspace: &Path,
        read_roots: &[PathBuf],
        write_roots: &[PathBuf],
    ) -> io::Result<Self> {
        let workspace = std::fs::canonicalize(workspace)?;
        let mut roots: Vec<Root> = Vec::new();
        let mut add = |path: &Path, writable: bool| -> io::Result<()> {
            let abs = if path.is_absolute() {
                path.to_path_buf()
            } else {
                workspace.join(path)
            };
            let abs = std::fs::canonicalize(&abs)
                .map_err(|e| io::Error::new(e.kind(), format!("root {}: {e}", abs.display())))?;
            if let Some(existing) = roots.iter_mut().find(|r| r.path == abs) {
                existing.writable |= writable;
                return Ok(());
            }
            let dir = Dir::open_ambient_dir(&abs, ambient_authority())
                .map_err(|e| io::Error::new(e.kind(), format!("root {}: {e}", abs.display())))?;
            roots.push(Root {
                path: abs,
                dir,
                writable,
            });
            Ok(())
        };
        for root in write_roots {
            add(root, true)?;
        }
        for root in read_roots {
            add(root, false)?;
        }
        Ok(Self {
            workspace,
            roots,
            guard: Guard::default(),
        })
    }

    /// Protects `paths` from every tool (see [`ProtectedPaths`]).
    pub fn protect(mut self, paths: ProtectedPaths) -> Self {
        self.guard = Guard { paths };
        self
    }

    /// The checks of the protected paths.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The canonical workspace path: relative paths start here.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    pub fn roots(&self) -> &[Root] {
        &self.roots
    }

    /// Checks `given` and assigns it to a root for `access`.
    pub fn locate(&self, given: &str, access: Access) -> Result<Located<'_>, SandboxError> {
        if given.is_empty() {
            return Err(SandboxError::Empty);
        }
        if given.contains('\0') {
            return Err(SandboxError::Nul {
                path: given.to_string(),
            });
        }
        if given.len() > PATH_BYTES_MAX {
            return Err(SandboxError::TooLong { bytes: given.len() });
        }
        let path = Path::new(given);
        if path
            .components()
            .any(|c| c.as_os_str().len() > NAME_BYTES_MAX)
        {
            return Err(SandboxError::NameTooLong {
                path: given.to_string(),
            });
        }
        let full = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.workspace.join(path)
        };
        // The deepest root containing the path by components. A root that does not grant the
        // access is skipped, so a write under a read-only root is refused even when a writable
        // root lies deeper elsewhere.
        let best = self
            .roots
            .iter()
            .filter_map(|r| full.strip_prefix(&r.path).ok().map(|rel| (r, rel)))
            .max_by_key(|(r, _)| r.path.components().count());
        let Some((root, rel)) = best else {
            return Err(SandboxError::OutsideRoots {
                path: given.to_string(),
                access: access.verb(),
                roots: self.describe_roots(access),
            });
        };
        if access == Access::Write && !root.writable {
            return Err(SandboxError::ReadOnly {
                path: given.to_string(),
            });
        }
        Ok(Located {
            root,
            rel: rel
                .components()
                .filter(|c| *c != Component::CurDir)
                .collect(),
            given: given.to_string(),
            guard: &self.guard,
        })
    }

    fn describe_roots(&self, access: Access) -> String {
        let names: Vec<String> = self
            .roots
            .iter()
            .filter(|r| access == Access::Read || r.writable)
            .map(|r| display_path(&r.path, &self.workspace))
            .collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace with a state directory inside it, and the sandbox protecting it and a config
    /// file that does not exist yet.
    fn sandbox() -> (tempfile::TempDir, Sandbox) {
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(ws.join("state/deep")).unwrap();
        std::fs::write(ws.join("state/deep/key"), "k").unwrap();
        std::fs::create_dir(ws.join("src")).unwrap();
        let sandbox = Sandbox::open(&ws, &[], &[PathBuf::from(".")])
            .unwrap()
            .protect(ProtectedPaths {
                files: vec![ws.join("ring0.toml")],
                dirs: vec![ws.join("state")],
            });
        (dir, sandbox)
    }

    fn protected<T: std::fmt::Debug>(r: Result<T, SandboxError>) -> bool {
        matches!(r, Err(SandboxError::Protected { .. }))
    }

    #[test]
    fn a_directory_beneath_a_protected_one_is_refused_by_walking_up_from_its_handle() {
        let (_dir, sb) = sandbox();
        let deep = sb.locate("state/deep", Access::Read).unwrap();
        assert!(protected(deep.open_dir()));
        let via_dots = sb.locate("src/../state/deep", Access::Read).unwrap();
        assert!(protected(via_dots.open_dir()));
        assert!(sb.locate("src", Access::Read).unwrap().open_dir().is_ok());
    }

    #[test]
    fn a_protected_name_is_refused_before_it_exists_and_nothing_is_created() {
        let (dir, sb) = sandbox();
        let config = sb.locate("ring0.toml", Access::Write).unwrap();
        assert!(protected(config.open_parent(false)));
        let inside = sb.locate("state/new/file", Access::Write).unwrap();
        assert!(protected(inside.open_parent(true)));
        assert!(!dir.path().join("state/new").exists());
        let ordinary = sb.locate("src/a/b/file", Access::Write).unwrap();
        assert!(ordinary.open_parent(true).is_ok());
        assert!(dir.path().join("src/a/b").is_dir());
    }

    #[test]
    fn the_refusal_names_its_kind() {
        let (_dir, sb) = sandbox();
        let err = sb
            .locate("ring0.toml", Access::Write)
            .unwrap()
            .open_parent(false)
            .unwrap_err();
        assert_eq!(err.code(), Some(PROTECTED_PATH_CODE));
        assert!(err.to_string().contains("ring0.toml"), "{err}");
    }
}
