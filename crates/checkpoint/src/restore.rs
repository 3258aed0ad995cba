//! Restoring: the target state of every path, the check against changes made outside ring0,
//! then the changes in an order that works (files out, directories out deepest first,
//! directories in shallowest first, files in).

use crate::state::{PathState, read_state};
use crate::{CHANGED_SHOWN_MAX, CheckpointError, Checkpoints, Index, tree};
use cap_std::fs::{Permissions, PermissionsExt};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RestoreReport {
    /// The checkpoint restored.
    pub id: String,
    /// The checkpoints undone (it and every later one), oldest first.
    pub undone: Vec<String>,
    /// Paths given back their content (files and symlinks).
    pub written: Vec<String>,
    /// Directories created again.
    pub dirs_created: Vec<String>,
    /// Paths removed (created after the checkpoint).
    pub removed: Vec<String>,
    /// Paths restored although they had changed outside ring0 (`force`).
    pub overwritten_outside_changes: Vec<String>,
    /// Directories that could not be removed because they still hold something a checkpoint
    /// does not cover (ignored files).
    pub dirs_kept: Vec<String>,
}

/// One path to change: what is there, what goes there.
struct Change {
    path: String,
    now: PathState,
    target: PathState,
}

pub(crate) fn restore(
    store: &Checkpoints,
    index: &mut Index,
    id: &str,
    force: bool,
) -> Result<RestoreReport, CheckpointError> {
    let all = store.load_all()?;
    let first = all
        .iter()
        .position(|c| c.id == id)
        .ok_or_else(|| CheckpointError::NotFound(id.to_string()))?;
    let undone = &all[first..];
    // Undo the latest first: what an earlier checkpoint recorded wins.
    let mut view: BTreeMap<String, PathState> = BTreeMap::new();
    if undone.iter().any(|c| c.tree) {
        for path in tree::list(&store.workspace, &store.skip)? {
            let state = read_state(&store.root, &path, None)?;
            view.insert(path, state);
        }
    }
    for checkpoint in undone.iter().rev() {
        if checkpoint.tree {
            for (path, state) in view.iter_mut() {
                if !checkpoint.paths.contains_key(path) {
                    *state = PathState::Absent;
                }
            }
        }
        for (path, before) in &checkpoint.paths {
            view.insert(path.clone(), before.clone());
        }
    }
    let mut changes = Vec::new();
    for (path, target) in view {
        let now = read_state(&store.root, &path, None)?;
        if now != target {
            changes.push(Change { path, now, target });
        }
    }
    let outside: Vec<&Change> = changes
        .iter()
        .filter(|c| index.known.get(&c.path).unwrap_or(&PathState::Absent) != &c.now)
        .collect();
    if !outside.is_empty() && !force {
        return Err(changed_outside(&outside, index));
    }
    let mut report = RestoreReport {
        id: id.to_string(),
        undone: undone.iter().map(|c| c.id.clone()).collect(),
        overwritten_outside_changes: outside.iter().map(|c| c.path.clone()).collect(),
        ..RestoreReport::default()
    };
    // Every blob is read back and checked before the first change.
    for change in &changes {
        if let PathState::File { sha256, .. } = &change.target {
            store.blobs.get(sha256)?;
        }
    }
    apply(store, &changes, &mut report)?;
    for change in &changes {
        let state = read_state(&store.root, &change.path, None)?;
        index.known.insert(change.path.clone(), state);
    }
    for checkpoint in undone {
        let path = store.checkpoint_path(&checkpoint.id);
        std::fs::remove_file(&path).map_err(|e| CheckpointError::io(&path, e))?;
    }
    store.blobs.retain(&crate::blobs_of(&all[..first]));
    Ok(report)
}

fn changed_outside(outside: &[&Change], index: &Index) -> CheckpointError {
    let shown = outside
        .iter()
        .take(CHANGED_SHOWN_MAX)
        .map(|c| {
            let expected = index.known.get(&c.path).unwrap_or(&PathState::Absent);
            format!(
                "{} (ring0 left a {}, now a different {})",
                c.path,
                expected.kind(),
                c.now.kind()
            )
        })
        .collect::<Vec<_>>();
    let more = outside.len().saturating_sub(CHANGED_SHOWN_MAX);
    let mut shown = shown.join(", ");
    if more > 0 {
        shown.push_str(&format!(" and {more} more"));
    }
    CheckpointError::ChangedOutside {
        count: outside.len(),
        shown,
        paths: outside.iter().map(|c| c.path.clone()).collect(),
    }
}

fn is_dir(state: &PathState) -> bool {
    matches!(state, PathState::Dir { .. })
}

fn is_leaf(state: &PathState) -> bool {
    matches!(state, PathState::File { .. } | PathState::Symlink { .. })
}

fn depth(path: &str) -> usize {
    path.matches('/').count()
}

fn apply(
    store: &Checkpoints,
    changes: &[Change],
    report: &mut RestoreReport,
) -> Result<(), CheckpointError> {
    let root = &store.root;
    // Files and symlinks that go away or become something else.
    for c in changes
        .iter()
        .filter(|c| is_leaf(&c.now) && !is_leaf(&c.target))
    {
        root.remove_file(&c.path)
            .map_err(|e| CheckpointError::workspace(&c.path, e))?;
        if c.target == PathState::Absent {
            report.removed.push(c.path.clone());
        }
    }
    // Directories that go away, deepest first.
    let mut gone: Vec<&Change> = changes
        .iter()
        .filter(|c| is_dir(&c.now) && !is_dir(&c.target))
        .collect();
    gone.sort_by_key(|c| std::cmp::Reverse(depth(&c.path)));
    for c in gone {
        match root.remove_dir(&c.path) {
            Ok(()) => report.removed.push(c.path.clone()),
            Err(_) if c.target == PathState::Absent => report.dirs_kept.push(c.path.clone()),
            Err(e) => return Err(CheckpointError::workspace(&c.path, e)),
        }
    }
    // Directories that come back (or change mode), shallowest first.
    let mut dirs: Vec<&Change> = changes.iter().filter(|c| is_dir(&c.target)).collect();
    dirs.sort_by_key(|c| depth(&c.path));
    for c in dirs {
        let PathState::Dir { mode } = c.target else {
            unreachable!("filtered to directories")
        };
        if !is_dir(&c.now) {
            root.create_dir_all(&c.path)
                .map_err(|e| CheckpointError::workspace(&c.path, e))?;
            report.dirs_created.push(c.path.clone());
        }
        root.set_permissions(&c.path, Permissions::from_mode(mode))
            .map_err(|e| CheckpointError::workspace(&c.path, e))?;
    }
    // Files and symlinks that come back.
    for c in changes.iter().filter(|c| is_leaf(&c.target)) {
        write_leaf(store, &c.path, &c.target)?;
        report.written.push(c.path.clone());
    }
    Ok(())
}

/// Puts a file or symlink at `path`: made under a temporary name beside it, then renamed over
/// whatever is there (a rename replaces a symlink, never writes through it).
fn write_leaf(store: &Checkpoints, path: &str, target: &PathState) -> Result<(), CheckpointError> {
    let root = &store.root;
    let err = |e| CheckpointError::workspace(path, e);
    let (parent, name) = match path.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => (".", path),
    };
    root.create_dir_all(parent).map_err(err)?;
    let dir = root.open_dir(parent).map_err(err)?;
    let tmp = format!(
        ".{name}.ring0-restore-{}.tmp",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let made = match target {
        PathState::File { sha256, mode, .. } => (|| {
            let content = store.blobs.get(sha256)?;
            let mut options = cap_std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            let mut file = dir.open_with(&tmp, &options).map_err(err)?.into_std();
            file.write_all(&content).map_err(err)?;
            file.sync_all().map_err(err)?;
            dir.set_permissions(&tmp, Permissions::from_mode(*mode))
                .map_err(err)?;
            Ok(())
        })(),
        PathState::Symlink { target } => dir.symlink_contents(target, &tmp).map_err(err),
        other => unreachable!("a leaf, not a {}", other.kind()),
    };
    let renamed = made.and_then(|()| dir.rename(&tmp, &dir, name).map_err(err));
    if renamed.is_err() {
        let _ = dir.remove_file(&tmp);
    }
    renamed
}
