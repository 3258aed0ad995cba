//! `read_file`, `list_dir`, `glob` and `write_file`.

use crate::page::{self, PAGE_ENTRIES_MAX, PAGE_JSON_BYTES_MAX, json_len};
use crate::sandbox::{Access, SandboxError};
use crate::walk::{self, Flow, Kind, WalkOptions};
use crate::{Workspace, args_of, not_applied};
use async_trait::async_trait;
use ring0_core::text::truncate_utf8;
use ring0_core::{Authority, Effect, Observation, Settlement, Strategy, ToolSpec};
use ring0_kernel::{CallContext, ProbeFinding, Tool, ToolError};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest `max_bytes` of one `read_file` call.
pub const READ_BYTES_MAX: u64 = 1024 * 1024;
/// Default `max_bytes` of `read_file`.
pub const READ_BYTES_DEFAULT: u64 = 64 * 1024;
/// Default most bytes of file text one `read_file` result carries, measured as JSON (escaped),
/// so the result always fits the kernel's projection limit. The rest is one `next_offset` away.
pub const READ_TEXT_BYTES_DEFAULT: usize = 32 * 1024;
/// Largest file `write_file` writes.
pub const WRITE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Model-visible budget of the listing tools' results.
const LISTING_BUDGET_BYTES: usize = 48 * 1024;

/// A sandbox refusal as a tool error; a protected path's carries its `kind` in a structured
/// observation (`{"error": {"kind": "protected_path", ...}}`) for the caller to act on.
pub(crate) fn sandbox_err(e: SandboxError) -> ToolError {
    let message = e.to_string();
    match e.code() {
        Some(kind) => ToolError::not_applied(message.clone()).with_observation(Observation::json(
            json!({"error": {"kind": kind, "message": message}}),
        )),
        None => ToolError::not_applied(message),
    }
}

/// The longest prefix of `text` (ending on a character boundary) whose JSON string form takes at
/// most `budget` bytes. Counted per byte: an escaped ASCII byte takes 2 or 6, every other byte 1
/// (a multi-byte character takes as many bytes escaped as raw).
pub(crate) fn json_prefix(text: &str, budget: usize) -> &str {
    let bytes = text.as_bytes();
    let mut used = 0usize;
    for (i, &b) in bytes.iter().enumerate() {
        used += match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        };
        if used > budget {
            return truncate_utf8(text, i);
        }
    }
    text
}

// ---------------------------------------------------------------------------------------------

pub struct ReadFile {
    pub(crate) ws: Arc<Workspace>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    #[serde(default)]
    offset_bytes: u64,
    #[serde(default = "read_default")]
    max_bytes: u64,
}

fn read_default() -> u64 {
    READ_BYTES_DEFAULT
}

impl ReadFile {
    pub fn spec(&self) -> ToolSpec {
        ToolSpec::read(
            "read_file",
            "Read a UTF-8 text file of the workspace. Returns the text from `offset_bytes`, at most \
             `max_bytes` of it, and `next_offset` when there is more.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to the workspace, or absolute inside a granted root."},
                    "offset_bytes": {"type": "integer", "minimum": 0, "default": 0},
                    "max_bytes": {"type": "integer", "minimum": 1, "maximum": READ_BYTES_MAX, "default": READ_BYTES_DEFAULT}
                },
                "required": ["path"]
            }),
        )
        .observation_budget_bytes(self.ws.read_text_bytes_max + 4096)
        .deterministic(false)
    }

    /// Reads without the kernel, for hosts and benchmarks.
    pub fn read(&self, path: &str, offset: u64, max_bytes: u64) -> Result<Observation, ToolError> {
        let ws = &self.ws;
        let located = ws.sandbox.locate(path, Access::Read).map_err(sandbox_err)?;
        let (dir, name) = located.open_parent(false).map_err(sandbox_err)?;
        let file = dir
            .open(&name)
            .map_err(|e| sandbox_err(SandboxError::io(path, e)))?;
        located.check_file(&file).map_err(sandbox_err)?;
        let meta = file
            .metadata()
            .map_err(|e| sandbox_err(SandboxError::io(path, e)))?;
        if !meta.is_file() {
            return Err(ToolError::not_applied(format!(
                "{path:?} is not a regular file{}",
                if meta.is_dir() {
                    " (it is a directory: use list_dir)"
                } else {
                    ""
                }
            )));
        }
        let size = meta.len();
        let max_bytes = max_bytes.clamp(1, READ_BYTES_MAX);
        let mut file = file.into_std();
        file.seek(SeekFrom::Start(offset.min(size)))
            .map_err(|e| ToolError::not_applied(format!("{path:?}: {e}")))?;
        let mut buf = Vec::with_capacity(max_bytes.min(size.saturating_sub(offset)) as usize);
        (&mut file)
            .take(max_bytes)
            .read_to_end(&mut buf)
            .map_err(|e| ToolError::not_applied(format!("{path:?}: {e}")))?;
        let valid = match std::str::from_utf8(&buf) {
            Ok(text) => text,
            // A character cut by `max_bytes` at the end is left for the next read.
            Err(e) if e.error_len().is_none() => {
                std::str::from_utf8(&buf[..e.valid_up_to()]).unwrap_or_default()
            }
            Err(e) => {
                return Err(ToolError::not_applied(format!(
                    "{path:?} is not UTF-8 text (invalid byte at offset {}); it may be binary",
                    offset + e.valid_up_to() as u64
                )));
            }
        };
        // Keep the longest prefix whose JSON form fits the text budget.
        let text = json_prefix(valid, ws.read_text_bytes_max);
        let next = offset + text.len() as u64;
        let eof = next >= size;
        let mut structured = json!({
            "path": located.display(ws.sandbox.workspace()),
            "size_bytes": size,
            "offset_bytes": offset,
            "bytes_returned": text.len(),
            "eof": eof,
        });
        if !eof {
            structured["next_offset"] = json!(next);
            if (text.len() as u64) < max_bytes.min(size - offset.min(size)) {
                structured["note"] = json!(format!(
                    "result cut to {} bytes of text to fit the observation budget; continue at next_offset",
                    text.len()
                ));
            }
        }
        let mut obs = Observation::text(text);
        obs.structured = Some(structured);
        obs.truncated = !eof;
        Ok(obs)
    }
}

#[async_trait]
impl Tool for ReadFile {
    async fn call(&self, _ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let a: ReadArgs = args_of(args)?;
        let this = ReadFile {
            ws: self.ws.clone(),
        };
        tokio::task::spawn_blocking(move || this.read(&a.path, a.offset_bytes, a.max_bytes))
            .await
            .map_err(|e| not_applied(format!("read_file failed: {e}")))?
    }
}

// ---------------------------------------------------------------------------------------------

pub struct ListDir {
    pub(crate) ws: Arc<Workspace>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default = "dot")]
    path: String,
    #[serde(default)]
    hidden: bool,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    cursor: Option<String>,
}

fn dot() -> String {
    ".".into()
}

fn listing_schema(extra: Value) -> Value {
    let mut props = json!({
        "hidden": {"type": "boolean", "default": false, "description": "Include names starting with '.'."},
        "limit": {"type": "integer", "minimum": 1, "maximum": PAGE_ENTRIES_MAX, "description": "Entries per page (at most 200)."},
        "cursor": {"type": "string", "description": "next_cursor of the previous page."}
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        props[k] = v.clone();
    }
    props
}

impl ListDir {
    pub fn spec(&self) -> ToolSpec {
        ToolSpec::read(
            "list_dir",
            "List a directory of the workspace (respects .gitignore), sorted by name, a page at a time.",
            json!({
                "type": "object",
                "properties": listing_schema(json!({"path": {"type": "string", "default": "."}})),
            }),
        )
        .observation_budget_bytes(LISTING_BUDGET_BYTES)
    }
}

#[async_trait]
impl Tool for ListDir {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let tag = page::query_tag(&args);
        let a: ListArgs = args_of(args)?;
        let ws = self.ws.clone();
        tokio::task::spawn_blocking(move || {
            let resume = page::resume(&ws.cursors, &ctx.scope, a.cursor.as_deref(), &tag)?;
            let located = ws
                .sandbox
                .locate(&a.path, Access::Read)
                .map_err(sandbox_err)?;
            let dir = located.open_dir().map_err(sandbox_err)?;
            let limit = ring0_shape::cursor::clamp_page_size(a.limit, PAGE_ENTRIES_MAX).size;
            let mut entries = Vec::new();
            let mut json_bytes = 0usize;
            let mut more = false;
            let after = resume.as_ref().map(|r| PathBuf::from(&r.after));
            let stats = walk::walk(
                dir,
                &located.rel,
                WalkOptions {
                    hidden: a.hidden,
                    gitignore: true,
                    recursive: false,
                },
                after.as_deref(),
                &ws.sandbox.guard().listing(),
                |e| {
                    let size = json_len(e.name) + 64;
                    if entries.len() == limit || json_bytes + size > PAGE_JSON_BYTES_MAX {
                        more = true;
                        return Flow::Stop;
                    }
                    json_bytes += size;
                    let size = match e.kind {
                        Kind::File => e.parent.metadata(e.name).ok().map(|m| m.len()),
                        _ => None,
                    };
                    entries.push(json!({"name": e.name, "kind": e.kind, "size_bytes": size}));
                    Flow::Continue
                },
            );
            let mut out = json!({
                "path": located.display(ws.sandbox.workspace()),
                "entries": entries,
            });
            if more {
                let last = entries_last_name(&out);
                page::attach_cursor(&mut out, &ws.cursors, &ctx.scope, &tag, &last, 0);
            }
            if stats.dirs_unreadable > 0 || stats.entries_skipped_limit > 0 {
                out["skipped"] = json!(stats);
            }
            Ok(Observation::json(out))
        })
        .await
        .map_err(|e| not_applied(format!("list_dir failed: {e}")))?
    }
}

fn entries_last_name(out: &Value) -> String {
    out["entries"]
        .as_array()
        .and_then(|a| a.last())
        .and_then(|e| e["name"].as_str().or(e["path"].as_str()))
        .unwrap_or_default()
        .to_string()
}

// ---------------------------------------------------------------------------------------------

pub struct Glob {
    pub(crate) ws: Arc<Workspace>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GlobArgs {
    pattern: String,
    #[serde(default = "dot")]
    path: String,
    #[serde(default)]
    hidden: bool,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    cursor: Option<String>,
}

/// Longest glob pattern.
const GLOB_PATTERN_BYTES_MAX: usize = 1024;

impl Glob {
    pub fn spec(&self) -> ToolSpec {
        ToolSpec::read(
            "glob",
            "Find files of the workspace whose path (relative to `path`) matches a glob such as \
             `src/**/*.rs` (respects .gitignore), sorted, a page at a time.",
            json!({
                "type": "object",
                "properties": listing_schema(json!({
                    "pattern": {"type": "string", "maxLength": GLOB_PATTERN_BYTES_MAX},
                    "path": {"type": "string", "default": "."}
                })),
                "required": ["pattern"]
            }),
        )
        .observation_budget_bytes(LISTING_BUDGET_BYTES)
    }
}

#[async_trait]
impl Tool for Glob {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let tag = page::query_tag(&args);
        let a: GlobArgs = args_of(args)?;
        let ws = self.ws.clone();
        tokio::task::spawn_blocking(move || {
            let matcher = globset::GlobBuilder::new(&a.pattern)
                .literal_separator(true)
                .build()
                .map_err(|e| ToolError::not_applied(format!("pattern {:?}: {e}", a.pattern)))?
                .compile_matcher();
            let resume = page::resume(&ws.cursors, &ctx.scope, a.cursor.as_deref(), &tag)?;
            let located = ws
                .sandbox
                .locate(&a.path, Access::Read)
                .map_err(sandbox_err)?;
            let dir = located.open_dir().map_err(sandbox_err)?;
            let limit = ring0_shape::cursor::clamp_page_size(a.limit, PAGE_ENTRIES_MAX).size;
            let mut matches: Vec<Value> = Vec::new();
            let mut json_bytes = 0usize;
            let shown = located.display(ws.sandbox.workspace());
            let mut last = String::new();
            let mut more = false;
            let after = resume.as_ref().map(|r| PathBuf::from(&r.after));
            let stats = walk::walk(
                dir,
                &located.rel,
                WalkOptions {
                    hidden: a.hidden,
                    gitignore: true,
                    recursive: true,
                },
                after.as_deref(),
                &ws.sandbox.guard().listing(),
                |e| {
                    if e.kind == Kind::Dir || !matcher.is_match(e.rel) {
                        return Flow::Continue;
                    }
                    let rel = e.rel.to_string_lossy().into_owned();
                    let size = json_len(&rel) + json_len(&shown) + 48;
                    if matches.len() == limit || json_bytes + size > PAGE_JSON_BYTES_MAX {
                        more = true;
                        return Flow::Stop;
                    }
                    json_bytes += size;
                    matches.push(json!({"path": join_display(&shown, &rel), "kind": e.kind}));
                    last = rel;
                    Flow::Continue
                },
            );
            let mut out = json!({"matches": matches});
            if more {
                page::attach_cursor(&mut out, &ws.cursors, &ctx.scope, &tag, &last, 0);
            }
            if stats.dirs_unreadable > 0
                || stats.entries_skipped_limit > 0
                || stats.depth_limited > 0
            {
                out["skipped"] = json!(stats);
            }
            Ok(Observation::json(out))
        })
        .await
        .map_err(|e| not_applied(format!("glob failed: {e}")))?
    }
}

/// `base` (as displayed) joined with a path relative to it.
pub(crate) fn join_display(base: &str, rel: &str) -> String {
    if base == "." {
        rel.to_string()
    } else {
        Path::new(base).join(rel).to_string_lossy().into_owned()
    }
}

// ---------------------------------------------------------------------------------------------

pub struct WriteFile {
    pub(crate) ws: Arc<Workspace>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
    #[serde(default)]
    overwrite: bool,
    #[serde(default)]
    create_dirs: bool,
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// fsyncs a directory. Directory handles may be opened `O_PATH`, which cannot be synced, so the
/// directory is opened again for reading, beneath itself.
pub(crate) fn sync_dir(dir: &cap_std::fs::Dir) -> std::io::Result<()> {
    dir.open(".")?.into_std().sync_all()
}

/// Writes `content` as `name` in `dir` atomically: a temporary file beside it, written and
/// fsynced, then renamed over the name (or, when `replace` is false, renamed only if the name is
/// still free — `renameat2(RENAME_NOREPLACE)`), then the directory fsynced.
pub(crate) fn write_atomic(
    dir: &cap_std::fs::Dir,
    name: &str,
    content: &[u8],
    replace: bool,
) -> std::io::Result<()> {
    let tmp = format!(".{name}.ring0-{}.tmp", uuid::Uuid::new_v4().simple());
    let tmp = if tmp.len() > crate::sandbox::NAME_BYTES_MAX {
        format!(".ring0-{}.tmp", uuid::Uuid::new_v4().simple())
    } else {
        tmp
    };
    let result = (|| {
        let mut options = cap_std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        let file = dir.open_with(&tmp, &options)?;
        let mut file = file.into_std();
        file.write_all(content)?;
        file.sync_all()?;
        drop(file);
        if replace {
            // Single names relative to one open directory: rename never follows a symlink
            // at either end, so a symlink named `name` is replaced, not written through.
            rustix::fs::renameat(dir, &tmp, dir, name).map_err(std::io::Error::from)?;
        } else {
            rustix::fs::renameat_with(dir, &tmp, dir, name, rustix::fs::RenameFlags::NOREPLACE)
                .map_err(std::io::Error::from)?;
        }
        // The rename is done: the call's effect has happened. The directory fsync only makes it
        // durable sooner; its failure must not be reported as "not applied".
        let _ = sync_dir(dir);
        Ok(())
    })();
    if result.is_err() {
        let _ = dir.remove_file(&tmp);
    }
    result
}

/// Whether `name` exists in `dir`; refused when it is a directory, or exists and `overwrite`
/// is not set.
fn refuse_existing(dir: &cap_std::fs::Dir, name: &str, a: &WriteArgs) -> Result<bool, ToolError> {
    match dir.symlink_metadata(name) {
        Ok(m) if m.is_dir() => Err(ToolError::not_applied(format!(
            "{:?} is a directory",
            a.path
        ))),
        Ok(_) if !a.overwrite => Err(ToolError::not_applied(format!(
            "{:?} exists; pass overwrite: true to replace it",
            a.path
        ))),
        Ok(_) => Ok(true),
        Err(_) => Ok(false),
    }
}

impl WriteFile {
    pub fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "write_file",
            "Write a whole text file in the workspace, atomically. Replacing an existing file needs \
             `overwrite: true`; missing parent directories need `create_dirs: true`.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string", "maxLength": WRITE_BYTES_MAX},
                    "overwrite": {"type": "boolean", "default": false},
                    "create_dirs": {"type": "boolean", "default": false}
                },
                "required": ["path", "content"]
            }),
        )
        .effect(Effect::Idempotent)
        .authority(Authority::A1)
        .strategy(&[Strategy::Exploitation])
        .conflict_key("file:{path}")
        .settlement(Settlement::Probe)
    }

    fn current_hash(&self, path: &str) -> Option<Option<String>> {
        let located = self.ws.sandbox.locate(path, Access::Read).ok()?;
        let (dir, name) = located.open_parent(false).ok()?;
        match dir.read(&name) {
            Ok(bytes) => Some(Some(sha256_hex(&bytes))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(None),
            Err(_) => None,
        }
    }
}

#[async_trait]
impl Tool for WriteFile {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let a: WriteArgs = args_of(args)?;
        let ws = self.ws.clone();
        tokio::task::spawn_blocking(move || {
            if a.content.len() > WRITE_BYTES_MAX {
                return Err(ToolError::not_applied(format!(
                    "content of {} bytes exceeds {WRITE_BYTES_MAX}",
                    a.content.len()
                )));
            }
            let located = ws.sandbox.locate(&a.path, Access::Write).map_err(sandbox_err)?;
            // The sandbox judges the path before the checkpoint reads it; a missing parent that
            // `create_dirs` makes is made only after the checkpoint recorded its absence.
            let opened = match located.open_parent(false) {
                Ok(opened) => Some(opened),
                Err(SandboxError::Io { source, .. })
                    if a.create_dirs && source.kind() == std::io::ErrorKind::NotFound =>
                {
                    None
                }
                Err(e) => return Err(sandbox_err(e)),
            };
            if let Some((dir, name)) = &opened {
                refuse_existing(dir, name, &a)?;
            }
            let shown = [located.display(ws.sandbox.workspace())];
            ws.checkpoint_before(&ctx.scope, &shown)?;
            let (dir, name) = match opened {
                Some(opened) => opened,
                None => located.open_parent(true).map_err(sandbox_err)?,
            };
            let existed = refuse_existing(&dir, &name, &a)?;
            let written = write_atomic(&dir, &name, a.content.as_bytes(), a.overwrite);
            ws.checkpoint_after(&shown);
            written.map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    ToolError::not_applied(format!(
                        "{:?} was created by someone else meanwhile; pass overwrite: true to replace it",
                        a.path
                    ))
                } else {
                    // The temporary file is removed and rename is atomic: nothing was changed.
                    ToolError::not_applied(format!("{:?}: {e}", a.path))
                }
            })?;
            Ok(Observation::json(json!({
                "path": located.display(ws.sandbox.workspace()),
                "bytes_written": a.content.len(),
                "replaced": existed,
                "sha256": sha256_hex(a.content.as_bytes()),
            })))
        })
        .await
        .map_err(|e| ToolError::unknown(format!("write_file failed: {e}")))?
    }

    async fn snapshot(&self, args: &Value) -> Option<Value> {
        let path = args.get("path")?.as_str()?;
        Some(json!({"before": self.current_hash(path)?}))
    }

    async fn probe(&self, args: &Value, snapshot: Option<&Value>) -> ProbeFinding {
        let (Some(path), Some(content)) = (
            args.get("path").and_then(Value::as_str),
            args.get("content").and_then(Value::as_str),
        ) else {
            return ProbeFinding::Indeterminate("arguments lack path or content".into());
        };
        let Some(now) = self.current_hash(path) else {
            return ProbeFinding::Indeterminate(format!("{path:?} cannot be read"));
        };
        let wanted = sha256_hex(content.as_bytes());
        if now.as_deref() == Some(wanted.as_str()) {
            return crate::applied(Observation::json(json!({
                "path": path, "bytes_written": content.len(), "sha256": wanted, "confirmed_by": "probe"
            })));
        }
        match snapshot.and_then(|s| s.get("before")) {
            Some(before) if *before == json!(now) => ProbeFinding::Unchanged,
            _ => ProbeFinding::Indeterminate(format!(
                "{path:?} holds neither the intended content nor what it held before the call"
            )),
        }
    }
}
