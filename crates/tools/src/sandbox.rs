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

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Longest accepted path argument, in bytes (Linux `PATH_MAX`).
pub const PATH_BYTES_MAX: usize = 4096;
/// Longest accepted path component, in bytes (Linux `NAME_MAX`).
pub const NAME_BYTES_MAX: usize = 255;

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
    /// each one beneath the root as well).
    pub fn open_parent(&self, create: bool) -> Result<(Dir, String), SandboxError> {
        let (parent, name) = self.split_name()?;
        let dir = open_dir_beneath(&self.root.dir, &parent, create)
            .map_err(|e| SandboxError::io(&self.given, e))?;
        Ok((dir, name))
    }

    /// Opens this path as a directory beneath the root.
    pub fn open_dir(&self) -> Result<Dir, SandboxError> {
        open_dir_beneath(&self.root.dir, &self.rel, false)
            .map_err(|e| SandboxError::io(&self.given, e))
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

fn open_dir_beneath(root: &Dir, rel: &Path, create: bool) -> io::Result<Dir> {
    if rel.as_os_str().is_empty() {
        return root.try_clone();
    }
    if create {
        root.create_dir_all(rel)?;
    }
    root.open_dir(rel)
}

/// The roots of one workspace.
#[derive(Debug)]
pub struct Sandbox {
    workspace: PathBuf,
    roots: Vec<Root>,
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
        Ok(Self { workspace, roots })
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
