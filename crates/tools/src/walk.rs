//! A directory walk through handles, with `.gitignore` rules.
//!
//! The `ignore` crate's walker opens directories by path name; a directory swapped for a
//! symlink between being listed and being entered would be followed out of the sandbox. This walk
//! instead enters each subdirectory with `openat` beneath its already open parent handle (cap-std,
//! which refuses a symlink that leads out), never follows symlinks to directories, and takes only
//! the rule matching from `ignore` (`.gitignore` and `.ignore` files, read through the same
//! handles). Children are visited in byte order of their names, so a walk is deterministic and a
//! page can resume after a path. ring0's protected paths ([`Listing`]) are left out silently:
//! never visited, never entered.

use crate::sandbox::{FileId, Listing};
use cap_std::fs::Dir;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::path::{Path, PathBuf};

/// Most entries of one directory read before the rest are counted as skipped.
pub const DIR_ENTRIES_MAX: usize = 100_000;
/// Deepest directory nesting walked.
pub const WALK_DEPTH_MAX: usize = 64;
/// Largest ignore file read.
const IGNORE_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// The kind of an entry, from the directory listing (symlinks are reported, not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Options of a walk.
#[derive(Debug, Clone, Copy)]
pub struct WalkOptions {
    /// Include names starting with `.` (`.git` is always skipped).
    pub hidden: bool,
    /// Apply `.gitignore` / `.ignore` rules.
    pub gitignore: bool,
    /// Descend into subdirectories.
    pub recursive: bool,
}

/// One entry met by the walk.
pub struct Entry<'a> {
    /// The directory handle holding the entry.
    pub parent: &'a Dir,
    pub name: &'a str,
    /// Path relative to the walk's start.
    pub rel: &'a Path,
    pub kind: Kind,
}

/// What the visitor wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Counters of what the walk could not or would not read.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct WalkStats {
    pub dirs_unreadable: u64,
    pub entries_skipped_limit: u64,
    pub depth_limited: u64,
}

struct Frame {
    dir: Dir,
    id: Option<FileId>,
    rel: PathBuf,
    ignore: Option<Gitignore>,
    depth: usize,
}

fn read_ignore_rules(dir: &Dir, rel: &Path) -> Option<Gitignore> {
    use std::io::Read;
    // Virtual absolute root so that rule paths are matched relative to this directory.
    let root = Path::new("/").join(rel);
    let mut builder = GitignoreBuilder::new(&root);
    let mut any = false;
    for name in [".gitignore", ".ignore"] {
        let Ok(file) = dir.open(name) else { continue };
        let mut text = String::new();
        if file
            .into_std()
            .take(IGNORE_FILE_BYTES_MAX)
            .read_to_string(&mut text)
            .is_err()
        {
            continue;
        }
        for line in text.lines() {
            // A malformed line is ignored, as git does.
            let _ = builder.add_line(None, line);
            any = true;
        }
    }
    if !any {
        return None;
    }
    builder.build().ok()
}

fn ignored(stack: &[Frame], rel: &Path, is_dir: bool) -> bool {
    let virtual_path = Path::new("/").join(rel);
    for frame in stack.iter().rev() {
        if let Some(gi) = &frame.ignore {
            let m = gi.matched(&virtual_path, is_dir);
            if m.is_ignore() {
                return true;
            }
            if m.is_whitelist() {
                return false;
            }
        }
    }
    false
}

/// Walks from `start` (a directory handle whose path relative to the sandbox root is `base`),
/// calling `visit` for each entry in order. Entries whose path is not after `resume_after` are
/// skipped without being visited, and so are subtrees that lie wholly before it.
pub fn walk(
    start: Dir,
    base: &Path,
    options: WalkOptions,
    resume_after: Option<&Path>,
    protected: &Listing,
    mut visit: impl FnMut(&Entry<'_>) -> Flow,
) -> WalkStats {
    let mut stats = WalkStats::default();
    let mut stack: Vec<Frame> = Vec::new();
    // Rules of the start directory's ancestors inside the root do not apply: the walk sees the
    // start directory's own rules and below, which is what a listing of it needs.
    let root_ignore = options
        .gitignore
        .then(|| read_ignore_rules(&start, base))
        .flatten();
    stack.push(Frame {
        id: Listing::id_of(&start),
        dir: start,
        rel: PathBuf::new(),
        ignore: root_ignore,
        depth: 0,
    });
    // Depth-first with an explicit list of pending directories per level.
    let mut pending: Vec<Vec<(String, Kind, u64)>> = Vec::new();
    match list(&stack[0].dir, &mut stats) {
        Some(children) => pending.push(children),
        None => return stats,
    }
    while let Some(level) = pending.last_mut() {
        let Some((name, kind, ino)) = level.pop() else {
            pending.pop();
            stack.pop();
            continue;
        };
        let frame = stack.last().expect("a frame per pending level");
        let rel = frame.rel.join(&name);
        if !options.hidden && name.starts_with('.') || name == ".git" {
            continue;
        }
        if options.gitignore && ignored(&stack, &base.join(&rel), kind == Kind::Dir) {
            continue;
        }
        if protected.hides(&frame.dir, frame.id, &name, ino, kind == Kind::File) {
            continue;
        }
        let before_resume = resume_after.is_some_and(|after| rel.as_path() <= after);
        let on_resume_path = resume_after.is_some_and(|after| after.starts_with(&rel));
        if !before_resume {
            let flow = visit(&Entry {
                parent: &frame.dir,
                name: &name,
                rel: &rel,
                kind,
            });
            if flow == Flow::Stop {
                return stats;
            }
        }
        if kind != Kind::Dir || !options.recursive || (before_resume && !on_resume_path) {
            continue;
        }
        if frame.depth + 1 >= WALK_DEPTH_MAX {
            stats.depth_limited += 1;
            continue;
        }
        let Ok(child) = frame.dir.open_dir(&name) else {
            stats.dirs_unreadable += 1;
            continue;
        };
        let Some(children) = list(&child, &mut stats) else {
            continue;
        };
        let ignore = options
            .gitignore
            .then(|| read_ignore_rules(&child, &base.join(&rel)))
            .flatten();
        let depth = frame.depth + 1;
        stack.push(Frame {
            id: Listing::id_of(&child),
            dir: child,
            rel,
            ignore,
            depth,
        });
        pending.push(children);
    }
    stats
}

/// The entries of `dir`, sorted so that popping from the end yields them in ascending order.
fn list(dir: &Dir, stats: &mut WalkStats) -> Option<Vec<(String, Kind, u64)>> {
    use std::os::unix::fs::DirEntryExt;
    let Ok(entries) = dir.entries() else {
        stats.dirs_unreadable += 1;
        return None;
    };
    let mut out = Vec::new();
    for entry in entries {
        let Ok(entry) = entry else { continue };
        if out.len() >= DIR_ENTRIES_MAX {
            stats.entries_skipped_limit += 1;
            continue;
        }
        let Ok(name) = entry.file_name().into_string() else {
            // Names that are not UTF-8 cannot be passed back to a model faithfully.
            stats.entries_skipped_limit += 1;
            continue;
        };
        let kind = match entry.file_type() {
            Ok(t) if t.is_symlink() => Kind::Symlink,
            Ok(t) if t.is_dir() => Kind::Dir,
            Ok(t) if t.is_file() => Kind::File,
            _ => Kind::Other,
        };
        out.push((name, kind, entry.ino()));
    }
    out.sort_by(|a, b| b.0.cmp(&a.0));
    Some(out)
}
