//! `apply_patch`: one patch adds, updates, moves and deletes several files, all or none.
//!
//! The format:
//!
//! ```text
//! *** Begin Patch
//! *** Add File: docs/new.md
//! +first line
//! +second line
//! *** Update File: src/lib.rs
//! *** Move to: src/core.rs
//! @@ fn main() {
//!  context line
//! -removed line
//! +added line
//! *** Delete File: old.txt
//! *** End Patch
//! ```
//!
//! In an update, each hunk (`@@`, optionally followed by a header line) is a run of context
//! (` `), removed (`-`) and added (`+`) lines. Its anchor — the context and removed lines, in
//! order — must occur in the file exactly once, as whole lines; a header narrows the search to
//! lines after the one line equal to it; `*** End of File` after a hunk pins it to the end. A
//! missing or ambiguous anchor is an error naming the file, the hunk and the number of matches,
//! and nothing is written. Hunks are matched against the file as it was, and may not overlap.
//!
//! Application stages every new content as a temporary file beside its target (written and
//! fsynced) before the first rename; then renames them into place in order, keeping what is
//! needed to undo each step. If a step fails, the steps already taken are undone and the call
//! reports that nothing changed. If undoing fails too, the call reports an unknown outcome and
//! the kernel settles it with [`Tool::probe`], which compares every touched file's hash with the
//! expected result and with the snapshot taken before dispatch.

use crate::files::{sha256_hex, sync_dir, write_atomic};
use crate::sandbox::{Access, SandboxError};
use crate::{Workspace, args_of};
use async_trait::async_trait;
use cap_std::fs::Dir;
use ring0_core::{Authority, Effect, Observation, Settlement, Strategy, ToolSpec};
use ring0_kernel::{CallContext, ProbeFinding, Tool, ToolError};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Largest patch text.
pub const PATCH_BYTES_MAX: usize = 1024 * 1024;
/// Most files one patch touches.
pub const PATCH_FILES_MAX: usize = 64;
/// Largest file an update reads.
pub const PATCH_FILE_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Bytes of unified diff returned; the rest is counted.
pub const DIFF_BYTES_MAX: usize = 32 * 1024;

/// One line of a hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HunkLine {
    Context(String),
    Remove(String),
    Add(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Hunk {
    header: String,
    lines: Vec<HunkLine>,
    end_of_file: bool,
}

/// One file operation of a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Add {
        path: String,
        content: String,
    },
    Delete {
        path: String,
    },
    Update {
        path: String,
        move_to: Option<String>,
        hunks: Vec<Hunk>,
    },
}

/// A patch that does not parse or does not apply. The text says where; the kind, when there is
/// one a caller may act on (`protected_path`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PatchError(pub String, pub Option<&'static str>);

fn perr(msg: impl Into<String>) -> PatchError {
    PatchError(msg.into(), None)
}

fn sandbox_perr(e: SandboxError) -> PatchError {
    PatchError(e.to_string(), e.code())
}

impl PatchError {
    fn into_tool_error(self, suffix: &str) -> ToolError {
        let message = format!("{}{suffix}", self.0);
        match self.1 {
            Some(kind) => ToolError::not_applied(message.clone()).with_observation(
                Observation::json(json!({"error": {"kind": kind, "message": message}})),
            ),
            None => ToolError::not_applied(message),
        }
    }
}

fn parse(text: &str) -> Result<Vec<Op>, PatchError> {
    if text.len() > PATCH_BYTES_MAX {
        return Err(perr(format!(
            "patch of {} bytes exceeds {PATCH_BYTES_MAX}",
            text.len()
        )));
    }
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let mut i = 0;
    while i < lines.len() && lines[i].trim().is_empty() {
        i += 1;
    }
    if lines.get(i).map(|l| l.trim()) != Some("*** Begin Patch") {
        return Err(perr("the patch must start with `*** Begin Patch`"));
    }
    i += 1;
    let mut ops = Vec::new();
    let mut ended = false;
    while i < lines.len() {
        let line = lines[i];
        let lineno = i + 1;
        if line.trim() == "*** End Patch" {
            ended = true;
            i += 1;
            break;
        }
        if let Some(path) = line.strip_prefix("*** Add File: ") {
            i += 1;
            let mut content = String::new();
            while i < lines.len() && !lines[i].starts_with("*** ") {
                let Some(added) = lines[i].strip_prefix('+') else {
                    return Err(perr(format!(
                        "line {}: every line of an added file starts with '+'",
                        i + 1
                    )));
                };
                content.push_str(added);
                content.push('\n');
                i += 1;
            }
            ops.push(Op::Add {
                path: path.trim().to_string(),
                content,
            });
        } else if let Some(path) = line.strip_prefix("*** Delete File: ") {
            ops.push(Op::Delete {
                path: path.trim().to_string(),
            });
            i += 1;
        } else if let Some(path) = line.strip_prefix("*** Update File: ") {
            i += 1;
            let mut move_to = None;
            if let Some(dest) = lines.get(i).and_then(|l| l.strip_prefix("*** Move to: ")) {
                move_to = Some(dest.trim().to_string());
                i += 1;
            }
            let mut hunks: Vec<Hunk> = Vec::new();
            while i < lines.len() {
                let l = lines[i];
                if l == "*** End of File" {
                    match hunks.last_mut() {
                        Some(h) => h.end_of_file = true,
                        None => {
                            return Err(perr(format!(
                                "line {}: `*** End of File` before any hunk",
                                i + 1
                            )));
                        }
                    }
                    i += 1;
                    continue;
                }
                if l.starts_with("*** ") {
                    break;
                }
                if let Some(header) = l.strip_prefix("@@") {
                    hunks.push(Hunk {
                        header: header.trim().to_string(),
                        ..Hunk::default()
                    });
                    i += 1;
                    continue;
                }
                if hunks.is_empty() {
                    hunks.push(Hunk::default());
                }
                let hunk = hunks.last_mut().expect("pushed above");
                let parsed = match l.chars().next() {
                    Some(' ') => HunkLine::Context(l[1..].to_string()),
                    Some('-') => HunkLine::Remove(l[1..].to_string()),
                    Some('+') => HunkLine::Add(l[1..].to_string()),
                    // An empty line inside a hunk is an empty context line whose space was lost.
                    None => HunkLine::Context(String::new()),
                    Some(_) => {
                        return Err(perr(format!(
                            "line {}: a hunk line starts with ' ', '-' or '+', found {l:?}",
                            i + 1
                        )));
                    }
                };
                hunk.lines.push(parsed);
                i += 1;
            }
            // Trailing empty context lines are the patch's own final newline, not content.
            for h in &mut hunks {
                while h.lines.last() == Some(&HunkLine::Context(String::new())) {
                    h.lines.pop();
                }
            }
            if hunks.iter().all(|h| h.lines.is_empty()) && move_to.is_none() {
                return Err(perr(format!(
                    "line {lineno}: update of {} has no hunks",
                    path.trim()
                )));
            }
            ops.push(Op::Update {
                path: path.trim().to_string(),
                move_to,
                hunks,
            });
        } else if line.trim().is_empty() {
            i += 1;
        } else {
            return Err(perr(format!(
                "line {lineno}: expected `*** Add File: `, `*** Update File: `, `*** Delete File: ` or `*** End Patch`, found {line:?}"
            )));
        }
    }
    if !ended {
        return Err(perr("the patch must end with `*** End Patch`"));
    }
    if lines[i..].iter().any(|l| !l.trim().is_empty()) {
        return Err(perr("text after `*** End Patch`"));
    }
    if ops.is_empty() {
        return Err(perr("the patch changes no file"));
    }
    if ops.len() > PATCH_FILES_MAX {
        return Err(perr(format!(
            "the patch touches {} files; at most {PATCH_FILES_MAX} are allowed",
            ops.len()
        )));
    }
    Ok(ops)
}

/// Applies the hunks of one update to `content`, or says which hunk fails and why.
fn apply_hunks(path: &str, content: &str, hunks: &[Hunk]) -> Result<String, PatchError> {
    let crlf = content.contains("\r\n");
    let trailing_newline = content.is_empty() || content.ends_with('\n');
    let body = content.strip_suffix('\n').unwrap_or(content);
    let lines: Vec<&str> = if content.is_empty() {
        Vec::new()
    } else {
        body.split('\n')
            .map(|l| {
                if crlf {
                    l.strip_suffix('\r').unwrap_or(l)
                } else {
                    l
                }
            })
            .collect()
    };
    // (start, removed count, replacement) per hunk, against the original lines.
    let mut edits: Vec<(usize, usize, Vec<String>, usize)> = Vec::new();
    for (n, hunk) in hunks.iter().enumerate() {
        let label = format!("{path}: hunk {}", n + 1);
        let old: Vec<&str> = hunk
            .lines
            .iter()
            .filter_map(|l| match l {
                HunkLine::Context(s) | HunkLine::Remove(s) => Some(s.as_str()),
                HunkLine::Add(_) => None,
            })
            .collect();
        let new: Vec<String> = hunk
            .lines
            .iter()
            .filter_map(|l| match l {
                HunkLine::Context(s) | HunkLine::Add(s) => Some(s.clone()),
                HunkLine::Remove(_) => None,
            })
            .collect();
        let mut from = 0;
        if !hunk.header.is_empty() {
            let at: Vec<usize> = lines
                .iter()
                .enumerate()
                .filter(|(_, l)| l.trim() == hunk.header)
                .map(|(i, _)| i)
                .collect();
            if at.len() != 1 {
                return Err(perr(format!(
                    "{label}: header {:?} matches {} lines; it must match exactly one",
                    hunk.header,
                    at.len()
                )));
            }
            from = at[0] + 1;
        }
        let start = if old.is_empty() {
            if hunk.end_of_file || (hunk.header.is_empty() && lines.is_empty()) {
                lines.len()
            } else if !hunk.header.is_empty() {
                from
            } else {
                return Err(perr(format!(
                    "{label}: only adds lines and gives no context or header to place them"
                )));
            }
        } else {
            let found: Vec<usize> = (from..=lines.len().saturating_sub(old.len()))
                .filter(|&i| i + old.len() <= lines.len() && lines[i..i + old.len()] == old[..])
                .filter(|&i| !hunk.end_of_file || i + old.len() == lines.len())
                .collect();
            if found.len() != 1 {
                return Err(perr(format!(
                    "{label}: anchor starting {:?} matches {} times; it must match exactly once{}",
                    old[0],
                    found.len(),
                    if found.is_empty() {
                        " (context and removed lines must equal the file's lines exactly)"
                    } else {
                        " (add context lines to make it unique)"
                    }
                )));
            }
            found[0]
        };
        edits.push((start, old.len(), new, n + 1));
    }
    edits.sort_by_key(|e| (e.0, e.3));
    for pair in edits.windows(2) {
        if pair[0].0 + pair[0].1 > pair[1].0 {
            return Err(perr(format!(
                "{path}: hunks {} and {} overlap",
                pair[0].3, pair[1].3
            )));
        }
    }
    let mut out: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
    for (start, removed, new, _) in edits.into_iter().rev() {
        out.splice(start..start + removed, new);
    }
    let eol = if crlf { "\r\n" } else { "\n" };
    let mut text = out.join(eol);
    if !out.is_empty() && trailing_newline {
        text.push_str(eol);
    }
    Ok(text)
}

/// One file change, planned against the file's current content.
struct Change {
    /// Path as shown in results (relative to the workspace).
    shown: String,
    /// Destination shown, for moves.
    shown_to: Option<String>,
    /// Directory and name the new content goes to (None for a delete).
    target: Option<(Dir, String)>,
    /// Directory and name removed (delete, or the source of a move).
    source: Option<(Dir, String)>,
    old: Option<String>,
    new: Option<String>,
}

/// The planned patch: each change and the unified diff.
struct Plan {
    changes: Vec<Change>,
    diff: String,
}

fn read_text(dir: &Dir, name: &str, shown: &str) -> Result<Option<String>, PatchError> {
    match dir.symlink_metadata(name) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(perr(format!("{shown}: {e}"))),
        Ok(m) if m.is_dir() => return Err(perr(format!("{shown} is a directory"))),
        Ok(m) if m.len() > PATCH_FILE_BYTES_MAX as u64 => {
            return Err(perr(format!(
                "{shown} is {} bytes; at most {PATCH_FILE_BYTES_MAX} can be patched",
                m.len()
            )));
        }
        Ok(_) => {}
    }
    let bytes = dir.read(name).map_err(|e| perr(format!("{shown}: {e}")))?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| perr(format!("{shown} is not UTF-8 text")))
}

fn diff_of(a: &str, b: &str, old: Option<&str>, new: Option<&str>) -> String {
    let old_text = old.unwrap_or("");
    let new_text = new.unwrap_or("");
    let a = if old.is_some() {
        format!("a/{a}")
    } else {
        "/dev/null".into()
    };
    let b = if new.is_some() {
        format!("b/{b}")
    } else {
        "/dev/null".into()
    };
    similar::TextDiff::from_lines(old_text, new_text)
        .unified_diff()
        .context_radius(3)
        .header(&a, &b)
        .to_string()
}

impl Workspace {
    fn locate_parent(&self, path: &str, create: bool) -> Result<(Dir, String, String), PatchError> {
        let located = self
            .sandbox
            .locate(path, Access::Write)
            .map_err(sandbox_perr)?;
        let shown = located.display(self.sandbox.workspace());
        let (dir, name) = located.open_parent(create).map_err(|e| match e {
            SandboxError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                perr(format!("{path}: its directory does not exist"))
            }
            other => sandbox_perr(other),
        })?;
        Ok((dir, name, shown))
    }

    /// Plans `ops` against the files as they are now. Creates missing parent directories of
    /// added or moved files only when `create_dirs` (the real application, not a dry run).
    fn plan(&self, ops: &[Op], create_dirs: bool) -> Result<Plan, PatchError> {
        let mut changes = Vec::new();
        let mut touched: BTreeSet<String> = BTreeSet::new();
        let mut claim = |shown: &str| {
            if touched.insert(shown.to_string()) {
                Ok(())
            } else {
                Err(perr(format!("{shown} is changed twice in one patch")))
            }
        };
        for op in ops {
            match op {
                Op::Add { path, content } => {
                    let (dir, name, shown) = match self.locate_parent(path, create_dirs) {
                        Err(e) if !create_dirs && e.1.is_none() => {
                            // Dry run: the directory would be created.
                            let located = self
                                .sandbox
                                .locate(path, Access::Write)
                                .map_err(|e| perr(e.to_string()))?;
                            let shown = located.display(self.sandbox.workspace());
                            claim(&shown)?;
                            changes.push(Change {
                                shown,
                                shown_to: None,
                                target: None,
                                source: None,
                                old: None,
                                new: Some(content.clone()),
                            });
                            continue;
                        }
                        other => other?,
                    };
                    claim(&shown)?;
                    if dir.symlink_metadata(&name).is_ok() {
                        return Err(perr(format!("{shown}: cannot add, it already exists")));
                    }
                    changes.push(Change {
                        shown,
                        shown_to: None,
                        target: Some((dir, name)),
                        source: None,
                        old: None,
                        new: Some(content.clone()),
                    });
                }
                Op::Delete { path } => {
                    let (dir, name, shown) = self.locate_parent(path, false)?;
                    claim(&shown)?;
                    let old = read_text(&dir, &name, &shown)?.ok_or_else(|| {
                        perr(format!("{shown}: cannot delete, it does not exist"))
                    })?;
                    changes.push(Change {
                        shown,
                        shown_to: None,
                        target: None,
                        source: Some((dir, name)),
                        old: Some(old),
                        new: None,
                    });
                }
                Op::Update {
                    path,
                    move_to,
                    hunks,
                } => {
                    let (dir, name, shown) = self.locate_parent(path, false)?;
                    claim(&shown)?;
                    let old = read_text(&dir, &name, &shown)?.ok_or_else(|| {
                        perr(format!("{shown}: cannot update, it does not exist"))
                    })?;
                    let new = apply_hunks(&shown, &old, hunks)?;
                    match move_to {
                        Some(dest) => {
                            let (ddir, dname, dshown) = match self.locate_parent(dest, create_dirs)
                            {
                                Err(e) if !create_dirs && e.1.is_none() => {
                                    let located = self
                                        .sandbox
                                        .locate(dest, Access::Write)
                                        .map_err(|e| perr(e.to_string()))?;
                                    let dshown = located.display(self.sandbox.workspace());
                                    claim(&dshown)?;
                                    changes.push(Change {
                                        shown,
                                        shown_to: Some(dshown),
                                        target: None,
                                        source: Some((dir, name)),
                                        old: Some(old),
                                        new: Some(new),
                                    });
                                    continue;
                                }
                                other => other?,
                            };
                            claim(&dshown)?;
                            if ddir.symlink_metadata(&dname).is_ok() {
                                return Err(perr(format!(
                                    "{shown}: cannot move to {dshown}, it already exists"
                                )));
                            }
                            changes.push(Change {
                                shown,
                                shown_to: Some(dshown),
                                target: Some((ddir, dname)),
                                source: Some((dir, name)),
                                old: Some(old),
                                new: Some(new),
                            });
                        }
                        None => {
                            let same =
                                dir.try_clone().map_err(|e| perr(format!("{shown}: {e}")))?;
                            changes.push(Change {
                                shown,
                                shown_to: None,
                                target: Some((same, name.clone())),
                                source: None,
                                old: Some(old),
                                new: Some(new),
                            });
                        }
                    }
                }
            }
        }
        let mut diff = String::new();
        for c in &changes {
            let to = c.shown_to.as_deref().unwrap_or(&c.shown);
            diff.push_str(&diff_of(&c.shown, to, c.old.as_deref(), c.new.as_deref()));
        }
        Ok(Plan { changes, diff })
    }

    /// The hash of every path a plan touches, as it is now: shown path → sha256 or null.
    fn hashes_now(&self, shown_paths: &[String]) -> Map<String, Value> {
        let mut out = Map::new();
        for shown in shown_paths {
            let value = self
                .sandbox
                .locate(shown, Access::Read)
                .ok()
                .and_then(|l| l.open_parent(false).ok())
                .map(|(dir, name)| match dir.read(&name) {
                    Ok(bytes) => json!(sha256_hex(&bytes)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Value::Null,
                    Err(e) => json!(format!("unreadable: {e}")),
                })
                .unwrap_or(Value::Null);
            out.insert(shown.clone(), value);
        }
        out
    }
}

/// What was done, so it can be undone.
enum Done {
    Created {
        dir: Dir,
        name: String,
    },
    Replaced {
        dir: Dir,
        name: String,
        old: String,
    },
    Removed {
        dir: Dir,
        name: String,
        backup: String,
    },
}

/// Test seam: called before commit step `index` (0-based) touching `path`; an error there makes
/// that step fail, as a full disk or a concurrent change would.
pub type FaultHook = Arc<dyn Fn(usize, &str) -> std::io::Result<()> + Send + Sync>;

fn commit(plan: Plan, fault: Option<&FaultHook>) -> Result<(), ToolError> {
    // Stage every new content beside its target first; failing here changes nothing.
    let mut staged: Vec<Option<String>> = Vec::new();
    let cleanup = |staged: &[Option<String>], changes: &[Change]| {
        for (tmp, c) in staged.iter().zip(changes) {
            if let (Some(tmp), Some((dir, _))) = (tmp, &c.target) {
                let _ = dir.remove_file(tmp);
            }
        }
    };
    for c in &plan.changes {
        match (&c.target, &c.new) {
            (Some((dir, _)), Some(new)) => {
                let tmp = format!(".ring0-patch-{}.tmp", uuid::Uuid::new_v4().simple());
                let staged_ok = (|| {
                    use std::io::Write;
                    let mut options = cap_std::fs::OpenOptions::new();
                    options.write(true).create_new(true);
                    let mut f = dir.open_with(&tmp, &options)?.into_std();
                    f.write_all(new.as_bytes())?;
                    f.sync_all()
                })();
                if let Err(e) = staged_ok {
                    let _ = dir.remove_file(&tmp);
                    cleanup(&staged, &plan.changes);
                    return Err(ToolError::not_applied(format!(
                        "{}: {e}; nothing was changed",
                        c.shown
                    )));
                }
                staged.push(Some(tmp));
            }
            _ => staged.push(None),
        }
    }
    let mut done: Vec<Done> = Vec::new();
    let mut failure: Option<String> = None;
    for (index, (c, tmp)) in plan.changes.iter().zip(&staged).enumerate() {
        let step = (|| -> std::io::Result<()> {
            if let Some(hook) = fault {
                hook(index, &c.shown)?;
            }
            if let (Some((dir, name)), Some(tmp)) = (&c.target, tmp) {
                if c.source.is_none() && c.old.is_some() {
                    // Update in place: replace, remembering the old content.
                    rustix::fs::renameat(dir, tmp, dir, name).map_err(std::io::Error::from)?;
                    done.push(Done::Replaced {
                        dir: dir.try_clone()?,
                        name: name.clone(),
                        old: c.old.clone().unwrap_or_default(),
                    });
                } else {
                    // Add, or the destination of a move: never clobber.
                    rustix::fs::renameat_with(
                        dir,
                        tmp,
                        dir,
                        name,
                        rustix::fs::RenameFlags::NOREPLACE,
                    )
                    .map_err(std::io::Error::from)?;
                    done.push(Done::Created {
                        dir: dir.try_clone()?,
                        name: name.clone(),
                    });
                }
            }
            if let Some((dir, name)) = &c.source {
                // Delete, or the source of a move: set aside, removed once everything succeeded.
                let backup = format!(".ring0-patch-{}.bak", uuid::Uuid::new_v4().simple());
                rustix::fs::renameat(dir, name, dir, &backup).map_err(std::io::Error::from)?;
                done.push(Done::Removed {
                    dir: dir.try_clone()?,
                    name: name.clone(),
                    backup,
                });
            }
            Ok(())
        })();
        if let Err(e) = step {
            failure = Some(format!("{}: {e}", c.shown));
            break;
        }
    }
    let Some(failure) = failure else {
        for d in &done {
            match d {
                Done::Removed { dir, backup, .. } => {
                    let _ = dir.remove_file(backup);
                    let _ = sync_dir(dir);
                }
                Done::Created { dir, .. } | Done::Replaced { dir, .. } => {
                    let _ = sync_dir(dir);
                }
            }
        }
        return Ok(());
    };
    cleanup(&staged, &plan.changes);
    // Undo in reverse order.
    let mut undo_errors = Vec::new();
    for d in done.into_iter().rev() {
        let undone = match &d {
            Done::Created { dir, name } => dir.remove_file(name),
            Done::Replaced { dir, name, old } => write_atomic(dir, name, old.as_bytes(), true),
            Done::Removed { dir, name, backup } => {
                rustix::fs::renameat(dir, backup, dir, name).map_err(std::io::Error::from)
            }
        };
        if let Err(e) = undone {
            undo_errors.push(e.to_string());
        }
    }
    if undo_errors.is_empty() {
        Err(ToolError::not_applied(format!(
            "{failure}; every change already made was undone, nothing was changed"
        )))
    } else {
        Err(ToolError::unknown(format!(
            "{failure}; undoing the changes already made failed too ({}): the files may be partly patched",
            undo_errors.join("; ")
        )))
    }
}

pub struct ApplyPatch {
    pub(crate) ws: Arc<Workspace>,
    pub(crate) fault: Option<FaultHook>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchArgs {
    patch: String,
    #[serde(default)]
    dry_run: bool,
}

/// The diff cut so that its JSON form takes at most [`DIFF_BYTES_MAX`] bytes, and the bytes left
/// out.
fn bounded_diff(diff: &str) -> (String, usize) {
    let kept = crate::files::json_prefix(diff, DIFF_BYTES_MAX);
    (kept.to_string(), diff.len() - kept.len())
}

/// Bytes of JSON the list of changed files may take; past it the rest are counted.
const FILES_JSON_BYTES_MAX: usize = 8 * 1024;

/// The changed files, as many as fit [`FILES_JSON_BYTES_MAX`], and how many were left out.
fn bounded_files(files: Vec<Value>) -> (Vec<Value>, usize) {
    let mut used = 0;
    let total = files.len();
    let kept: Vec<Value> = files
        .into_iter()
        .take_while(|f| {
            used += f.to_string().len() + 1;
            used <= FILES_JSON_BYTES_MAX
        })
        .collect();
    let omitted = total - kept.len();
    (kept, omitted)
}

impl ApplyPatch {
    /// Installs a fault hook for commit steps (tests of atomicity).
    #[doc(hidden)]
    pub fn with_fault(mut self, hook: FaultHook) -> Self {
        self.fault = Some(hook);
        self
    }

    pub fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "apply_patch",
            "Apply a patch that adds, updates, moves and deletes files, all or none. Format: \
             `*** Begin Patch`, then `*** Add File: PATH` (lines starting with '+'), `*** Delete \
             File: PATH`, or `*** Update File: PATH` (optional `*** Move to: PATH`) with hunks \
             introduced by `@@` holding context (' '), removed ('-') and added ('+') lines, then \
             `*** End Patch`. Each hunk's context and removed lines must match the file exactly \
             once. `dry_run: true` returns the diff without writing.",
            json!({
                "type": "object",
                "properties": {
                    "patch": {"type": "string", "maxLength": PATCH_BYTES_MAX},
                    "dry_run": {"type": "boolean", "default": false}
                },
                "required": ["patch"]
            }),
        )
        .effect(Effect::NonIdempotent)
        .authority(Authority::A1)
        .strategy(&[Strategy::Exploitation])
        .settlement(Settlement::Probe)
        .observation_budget_bytes(DIFF_BYTES_MAX + 8 * 1024)
    }

    fn touched(plan: &Plan) -> Vec<String> {
        let mut paths = Vec::new();
        for c in &plan.changes {
            paths.push(c.shown.clone());
            if let Some(to) = &c.shown_to {
                paths.push(to.clone());
            }
        }
        paths
    }

    /// Expected hashes after the plan: shown path → sha256 or null.
    fn expected(plan: &Plan) -> Map<String, Value> {
        let mut out = Map::new();
        for c in &plan.changes {
            match &c.shown_to {
                Some(to) => {
                    out.insert(c.shown.clone(), Value::Null);
                    out.insert(
                        to.clone(),
                        json!(sha256_hex(c.new.as_deref().unwrap_or("").as_bytes())),
                    );
                }
                None => {
                    out.insert(
                        c.shown.clone(),
                        c.new
                            .as_deref()
                            .map_or(Value::Null, |n| json!(sha256_hex(n.as_bytes()))),
                    );
                }
            }
        }
        out
    }
}

fn summary(plan: &Plan) -> Vec<Value> {
    plan.changes
        .iter()
        .map(|c| {
            let op = match (&c.old, &c.new, &c.shown_to) {
                (None, Some(_), _) => "add",
                (Some(_), None, _) => "delete",
                (_, _, Some(_)) => "move",
                _ => "update",
            };
            let mut v = json!({"op": op, "path": c.shown});
            if let Some(to) = &c.shown_to {
                v["to"] = json!(to);
            }
            v
        })
        .collect()
}

#[async_trait]
impl Tool for ApplyPatch {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let a: PatchArgs = args_of(args)?;
        let ws = self.ws.clone();
        let fault = self.fault.clone();
        tokio::task::spawn_blocking(move || {
            let ops = parse(&a.patch).map_err(|e| e.into_tool_error(""))?;
            if !a.dry_run {
                // Checkpointed from a preview: planning for real creates missing directories.
                let preview = ws
                    .plan(&ops, false)
                    .map_err(|e| e.into_tool_error("; nothing was written"))?;
                ws.checkpoint_before(&ctx.scope, &ApplyPatch::touched(&preview))?;
            }
            let plan = ws
                .plan(&ops, !a.dry_run)
                .map_err(|e| e.into_tool_error("; nothing was written"))?;
            let (files, files_omitted) = bounded_files(summary(&plan));
            let (diff, omitted) = bounded_diff(&plan.diff);
            if !a.dry_run {
                let touched = ApplyPatch::touched(&plan);
                let committed = commit(plan, fault.as_ref());
                // Whatever the commit left (applied, or undone after a failure) is ring0's doing.
                ws.checkpoint_after(&touched);
                committed?;
            }
            let mut out = json!({
                "applied": !a.dry_run,
                "dry_run": a.dry_run,
                "files": files,
                "diff": diff,
            });
            if omitted > 0 {
                out["diff_bytes_omitted"] = json!(omitted);
            }
            if files_omitted > 0 {
                out["files_omitted"] = json!(files_omitted);
            }
            Ok(Observation::json(out))
        })
        .await
        .map_err(|e| ToolError::unknown(format!("apply_patch failed: {e}")))?
    }

    async fn snapshot(&self, args: &Value) -> Option<Value> {
        let patch = args.get("patch")?.as_str()?.to_string();
        let ws = self.ws.clone();
        tokio::task::spawn_blocking(move || {
            let ops = parse(&patch).ok()?;
            let plan = ws.plan(&ops, false).ok()?;
            let paths = ApplyPatch::touched(&plan);
            Some(json!({
                "before": ws.hashes_now(&paths),
                "after": ApplyPatch::expected(&plan),
            }))
        })
        .await
        .ok()
        .flatten()
    }

    async fn probe(&self, args: &Value, snapshot: Option<&Value>) -> ProbeFinding {
        if args.get("dry_run") == Some(&Value::Bool(true)) {
            return crate::applied(Observation::json(
                json!({"applied": false, "dry_run": true}),
            ));
        }
        let Some(snapshot) = snapshot else {
            return ProbeFinding::Indeterminate(
                "no snapshot was taken before dispatch (the patch did not apply then)".into(),
            );
        };
        let (Some(before), Some(after)) = (
            snapshot.get("before").and_then(Value::as_object),
            snapshot.get("after").and_then(Value::as_object),
        ) else {
            return ProbeFinding::Indeterminate("the snapshot is malformed".into());
        };
        let paths: Vec<String> = before.keys().cloned().collect();
        let ws = self.ws.clone();
        let now = tokio::task::spawn_blocking(move || ws.hashes_now(&paths))
            .await
            .unwrap_or_default();
        if now == *after {
            return crate::applied(Observation::json(json!({
                "applied": true,
                "confirmed_by": "probe: every touched file has the expected content",
                "files": after.keys().collect::<Vec<_>>(),
            })));
        }
        if now == *before {
            return ProbeFinding::Unchanged;
        }
        let differing: Vec<&String> = now
            .iter()
            .filter(|(k, v)| after.get(*k) != Some(*v))
            .map(|(k, _)| k)
            .collect();
        ProbeFinding::Indeterminate(format!(
            "the patch is partly applied: {} do not hold the expected content",
            differing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_operation() {
        let ops = parse(
            "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** Delete File: b.txt\n*** Update File: c.txt\n*** Move to: d.txt\n@@\n x\n-y\n+z\n*** End Patch\n",
        )
        .unwrap();
        assert_eq!(ops.len(), 3);
        assert!(
            matches!(&ops[0], Op::Add { path, content } if path == "a.txt" && content == "hi\n")
        );
        assert!(
            matches!(&ops[2], Op::Update { move_to: Some(d), hunks, .. } if d == "d.txt" && hunks[0].lines.len() == 3)
        );
    }

    #[test]
    fn refuses_a_patch_without_its_frame() {
        assert!(parse("*** Add File: a\n+x\n").is_err());
        assert!(parse("*** Begin Patch\n*** Add File: a\n+x\n").is_err());
    }

    #[test]
    fn hunk_replaces_its_unique_anchor() {
        let hunks = vec![Hunk {
            header: String::new(),
            lines: vec![
                HunkLine::Context("b".into()),
                HunkLine::Remove("c".into()),
                HunkLine::Add("C".into()),
            ],
            end_of_file: false,
        }];
        assert_eq!(
            apply_hunks("f", "a\nb\nc\nd\n", &hunks).unwrap(),
            "a\nb\nC\nd\n"
        );
    }

    #[test]
    fn crlf_files_keep_their_line_endings() {
        let hunks = vec![Hunk {
            header: String::new(),
            lines: vec![HunkLine::Remove("b".into()), HunkLine::Add("B".into())],
            end_of_file: false,
        }];
        assert_eq!(
            apply_hunks("f", "a\r\nb\r\n", &hunks).unwrap(),
            "a\r\nB\r\n"
        );
    }

    #[test]
    fn header_places_a_pure_insertion() {
        let hunks = vec![Hunk {
            header: "fn main() {".into(),
            lines: vec![HunkLine::Add("    init();".into())],
            end_of_file: false,
        }];
        assert_eq!(
            apply_hunks("f", "fn main() {\n}\n", &hunks).unwrap(),
            "fn main() {\n    init();\n}\n"
        );
    }
}
