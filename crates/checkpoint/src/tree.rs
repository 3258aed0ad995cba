//! The workspace tree as a checkpoint sees it: every path `.gitignore` rules keep, without
//! `.git` and ring0's own directories, within [`crate::TREE_PATHS_MAX`].

use crate::{CheckpointError, TREE_PATHS_MAX};
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Files and directories a tree never records (nor enters), by identity (device, inode).
#[derive(Debug, Clone, Default)]
pub(crate) struct Skip(HashSet<(u64, u64)>);

impl Skip {
    pub(crate) fn new(dirs: &[PathBuf]) -> Self {
        Self(
            dirs.iter()
                .filter_map(|d| std::fs::metadata(d).ok())
                .map(|m| (m.dev(), m.ino()))
                .collect(),
        )
    }
}

impl Skip {
    /// Whether `rel` beneath `root` is one of the skipped files or directories.
    pub(crate) fn holds(&self, root: &cap_std::fs::Dir, rel: &str) -> bool {
        use cap_std::fs::MetadataExt as _;
        root.symlink_metadata(rel)
            .is_ok_and(|m| self.0.contains(&(m.dev(), m.ino())))
    }
}

/// Paths of the tree, relative to the workspace, sorted.
pub(crate) fn list(workspace: &Path, skip: &Skip) -> Result<Vec<String>, CheckpointError> {
    let skip = skip.clone();
    let walk = ignore::WalkBuilder::new(workspace)
        .hidden(false)
        .parents(true)
        .ignore(true)
        .git_ignore(true)
        .git_exclude(true)
        // The person's global excludes differ between machines; a checkpoint must not.
        .git_global(false)
        .require_git(false)
        .follow_links(false)
        .filter_entry(move |entry| {
            if entry.file_name() == ".git" {
                return false;
            }
            entry
                .metadata()
                .map(|m| !skip.0.contains(&(m.dev(), m.ino())))
                .unwrap_or(false)
        })
        .build();
    let mut paths = Vec::new();
    for entry in walk {
        let entry = entry.map_err(|e| CheckpointError::Walk(e.to_string()))?;
        let Ok(rel) = entry.path().strip_prefix(workspace) else {
            continue;
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        let rel = rel.to_str().ok_or_else(|| {
            CheckpointError::Unsupported(format!("{}: a name that is not UTF-8", rel.display()))
        })?;
        if paths.len() == TREE_PATHS_MAX {
            return Err(CheckpointError::TooLarge(format!(
                "the workspace holds more than {TREE_PATHS_MAX} paths a tree checkpoint may record"
            )));
        }
        paths.push(rel.to_string());
    }
    paths.sort();
    Ok(paths)
}
