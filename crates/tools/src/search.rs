//! `search`: a regular expression over the workspace's files, with line numbers, a page at a
//! time.
//!
//! The walk (through directory handles, `.gitignore` respected) opens each file beneath its
//! parent handle and hands the open file to a small pool of searcher threads (`grep-searcher`
//! with a `grep-regex` matcher, binary files skipped at the first NUL byte as ripgrep does). Results
//! are put back in walk order, so pages are deterministic and a cursor resumes after the last
//! (path, line) returned. At most [`OPEN_FILES_IN_FLIGHT`] files are open at once.

use crate::files::join_display;
use crate::page::{self, PAGE_ENTRIES_MAX, PAGE_JSON_BYTES_MAX, json_len};
use crate::sandbox::Access;
use crate::walk::{self, Flow, Kind, WalkOptions};
use crate::{Workspace, args_of, not_applied};
use async_trait::async_trait;
use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::Bytes;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use ring0_core::text::truncate_utf8;
use ring0_core::{Observation, ToolSpec};
use ring0_kernel::{CallContext, Tool, ToolError};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

/// Longest pattern accepted.
pub const PATTERN_BYTES_MAX: usize = 1024;
/// Bytes of a matching line shown; longer lines are cut, saying so.
pub const LINE_BYTES_MAX: usize = 240;
/// Files open at once (queued for or being searched).
pub const OPEN_FILES_IN_FLIGHT: usize = 64;
/// Matches kept per file per page (the rest come on the next page).
const FILE_MATCHES_MAX: usize = PAGE_ENTRIES_MAX;
/// Compiled regex size limit.
const REGEX_SIZE_BYTES_MAX: usize = 10 * 1024 * 1024;

pub struct Search {
    pub(crate) ws: Arc<Workspace>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    pattern: String,
    #[serde(default = "dot")]
    path: String,
    #[serde(default)]
    glob: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    fixed_strings: bool,
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

/// One matching line.
struct Hit {
    line: u64,
    text: String,
}

fn cut_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim_end_matches(['\n', '\r']);
    if text.len() <= LINE_BYTES_MAX {
        return text.to_string();
    }
    let kept = truncate_utf8(text, LINE_BYTES_MAX);
    format!("{kept}… [{} more bytes]", text.len() - kept.len())
}

/// The query, compiled.
pub struct Query {
    matcher: grep_regex::RegexMatcher,
    glob: Option<globset::GlobMatcher>,
    hidden: bool,
}

impl Query {
    pub fn new(
        pattern: &str,
        glob: Option<&str>,
        case_insensitive: bool,
        fixed_strings: bool,
        hidden: bool,
    ) -> Result<Self, String> {
        if pattern.len() > PATTERN_BYTES_MAX {
            return Err(format!(
                "pattern of {} bytes exceeds {PATTERN_BYTES_MAX}",
                pattern.len()
            ));
        }
        let matcher = RegexMatcherBuilder::new()
            .case_insensitive(case_insensitive)
            .fixed_strings(fixed_strings)
            .size_limit(REGEX_SIZE_BYTES_MAX)
            .build(pattern)
            .map_err(|e| format!("pattern {pattern:?}: {e}"))?;
        let glob = glob
            .map(|g| {
                globset::GlobBuilder::new(g)
                    .literal_separator(false)
                    .build()
                    .map(|g| g.compile_matcher())
                    .map_err(|e| format!("glob {g:?}: {e}"))
            })
            .transpose()?;
        Ok(Self {
            matcher,
            glob,
            hidden,
        })
    }
}

/// A page of results.
pub struct SearchPage {
    /// (path relative to the start, hits) in walk order.
    pub files: Vec<(String, Vec<(u64, String)>)>,
    pub files_searched: u64,
    pub binary_skipped: u64,
    /// Where the next page starts, if there is more.
    pub next: Option<(String, u64)>,
    pub stats: walk::WalkStats,
}

/// Searches beneath `start`, resuming after `(path, line)`, returning at most `limit` matches.
pub fn search_dir(
    start: cap_std::fs::Dir,
    base: &Path,
    query: &Query,
    resume: Option<(String, u64)>,
    limit: usize,
    workers: usize,
    protected: &crate::sandbox::Listing,
) -> SearchPage {
    let stop = AtomicBool::new(false);
    // How far results have been consumed in walk order. The walk stays at most
    // OPEN_FILES_IN_FLIGHT files ahead of it, so results waiting to be put in order (behind one
    // slow file) stay bounded too.
    let consumed = (std::sync::Mutex::new(0u64), std::sync::Condvar::new());
    let (file_tx, file_rx) =
        mpsc::sync_channel::<(u64, String, std::fs::File)>(OPEN_FILES_IN_FLIGHT);
    let file_rx = std::sync::Mutex::new(file_rx);
    let (hit_tx, hit_rx) = mpsc::channel::<(u64, String, Result<Vec<Hit>, bool>)>();
    let resume_path = resume.as_ref().map(|(p, _)| PathBuf::from(p));
    let resume_line = resume.as_ref().map_or(0, |(_, n)| *n);
    let mut page = SearchPage {
        files: Vec::new(),
        files_searched: 0,
        binary_skipped: 0,
        next: None,
        stats: walk::WalkStats::default(),
    };
    std::thread::scope(|scope| {
        // Producer: the walk, opening each candidate beneath its parent handle.
        let producer = scope.spawn(|| {
            // Moved in, so the workers see the channel close when the walk ends.
            let file_tx = file_tx;
            let mut seq = 0u64;
            walk::walk(
                start,
                base,
                WalkOptions {
                    hidden: query.hidden,
                    gitignore: true,
                    recursive: true,
                },
                None,
                protected,
                |e| {
                    if stop.load(Ordering::Relaxed) {
                        return Flow::Stop;
                    }
                    if e.kind != Kind::File {
                        return Flow::Continue;
                    }
                    if let Some(after) = &resume_path
                        && e.rel < after.as_path()
                    {
                        return Flow::Continue;
                    }
                    if let Some(glob) = &query.glob
                        && !glob.is_match(e.rel)
                        && !glob.is_match(e.name)
                    {
                        return Flow::Continue;
                    }
                    // Opened beneath the parent handle: a name swapped for a symlink that
                    // leads out is refused here.
                    let Ok(file) = e.parent.open(e.name) else {
                        return Flow::Continue;
                    };
                    let rel = e.rel.to_string_lossy().into_owned();
                    {
                        let mut done = consumed.0.lock().unwrap_or_else(|p| p.into_inner());
                        while seq >= *done + OPEN_FILES_IN_FLIGHT as u64 {
                            if stop.load(Ordering::Relaxed) {
                                return Flow::Stop;
                            }
                            done = consumed
                                .1
                                .wait_timeout(done, std::time::Duration::from_millis(50))
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                    }
                    if file_tx.send((seq, rel, file.into_std())).is_err() {
                        return Flow::Stop;
                    }
                    seq += 1;
                    Flow::Continue
                },
            )
        });
        for _ in 0..workers.max(1) {
            let hit_tx = hit_tx.clone();
            let file_rx = &file_rx;
            let stop = &stop;
            let resume_path = &resume_path;
            scope.spawn(move || {
                let mut searcher = SearcherBuilder::new()
                    .line_number(true)
                    .binary_detection(BinaryDetection::quit(b'\x00'))
                    .build();
                loop {
                    let next = file_rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok((seq, rel, file)) = next else { break };
                    if stop.load(Ordering::Relaxed) {
                        let _ = hit_tx.send((seq, rel, Err(false)));
                        continue;
                    }
                    let skip_to = if resume_path.as_deref() == Some(Path::new(&rel)) {
                        resume_line
                    } else {
                        0
                    };
                    let mut hits = Vec::new();
                    let result = searcher.search_file(
                        &query.matcher,
                        &file,
                        Bytes(|line, bytes| {
                            if line > skip_to {
                                hits.push(Hit {
                                    line,
                                    text: cut_line(bytes),
                                });
                            }
                            Ok(hits.len() < FILE_MATCHES_MAX + 1)
                        }),
                    );
                    let binary = result.is_ok() && hits.is_empty() && file_is_binary_prefix(&file);
                    let _ = hit_tx.send((seq, rel, if binary { Err(true) } else { Ok(hits) }));
                }
            });
        }
        drop(hit_tx);
        // Consumer: results in walk order until the page is full.
        let mut pending: BTreeMap<u64, (String, Result<Vec<Hit>, bool>)> = BTreeMap::new();
        let mut want = 0u64;
        let mut count = 0usize;
        let mut json_bytes = 0usize;
        while let Ok((seq, rel, hits)) = hit_rx.recv() {
            pending.insert(seq, (rel, hits));
            while let Some((rel, hits)) = pending.remove(&want) {
                want += 1;
                *consumed.0.lock().unwrap_or_else(|p| p.into_inner()) = want;
                consumed.1.notify_all();
                if page.next.is_some() {
                    continue;
                }
                let hits = match hits {
                    Ok(hits) => hits,
                    Err(binary) => {
                        page.files_searched += u64::from(binary);
                        page.binary_skipped += u64::from(binary);
                        continue;
                    }
                };
                page.files_searched += 1;
                let mut kept = Vec::new();
                for hit in hits {
                    let size = json_len(&rel) + json_len(&hit.text) + 32;
                    if count == limit || json_bytes + size > PAGE_JSON_BYTES_MAX {
                        let (last_line, last_rel) = match kept.last() {
                            Some((line, _)) => (*line, rel.clone()),
                            None => match page.files.last() {
                                Some((p, h)) => {
                                    (h.last().map_or(0, |x: &(u64, String)| x.0), p.clone())
                                }
                                None => (hit.line - 1, rel.clone()),
                            },
                        };
                        page.next = Some((last_rel, last_line));
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                    count += 1;
                    json_bytes += size;
                    kept.push((hit.line, hit.text));
                }
                if !kept.is_empty() {
                    page.files.push((rel, kept));
                }
            }
        }
        page.stats = producer.join().unwrap_or_default();
    });
    page
}

/// Whether the searcher stopped on a NUL byte (binary detection) — checked only for files with
/// no match, by looking for a NUL in the first 8 KiB.
fn file_is_binary_prefix(file: &std::fs::File) -> bool {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 8192];
    let n = file.read_at(&mut buf, 0).unwrap_or(0);
    buf[..n].contains(&0)
}

impl Search {
    pub fn spec(&self) -> ToolSpec {
        ToolSpec::read(
            "search",
            "Search the workspace's text files for a regular expression (Rust regex syntax; \
             `fixed_strings` for a literal). Respects .gitignore, skips binary files. Returns \
             matching lines with line numbers, at most 200 a page.",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "maxLength": PATTERN_BYTES_MAX},
                    "path": {"type": "string", "default": ".", "description": "Directory to search in."},
                    "glob": {"type": "string", "description": "Only files whose path or name matches, e.g. `*.rs`."},
                    "case_insensitive": {"type": "boolean", "default": false},
                    "fixed_strings": {"type": "boolean", "default": false},
                    "hidden": {"type": "boolean", "default": false},
                    "limit": {"type": "integer", "minimum": 1, "maximum": PAGE_ENTRIES_MAX},
                    "cursor": {"type": "string"}
                },
                "required": ["pattern"]
            }),
        )
        .observation_budget_bytes(PAGE_JSON_BYTES_MAX + 8 * 1024)
        .timeout_ms(120_000)
    }
}

#[async_trait]
impl Tool for Search {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let tag = page::query_tag(&args);
        let a: SearchArgs = args_of(args)?;
        let ws = self.ws.clone();
        tokio::task::spawn_blocking(move || {
            let query = Query::new(
                &a.pattern,
                a.glob.as_deref(),
                a.case_insensitive,
                a.fixed_strings,
                a.hidden,
            )
            .map_err(ToolError::not_applied)?;
            let resume = page::resume(&ws.cursors, &ctx.scope, a.cursor.as_deref(), &tag)?;
            let located = ws
                .sandbox
                .locate(&a.path, Access::Read)
                .map_err(crate::files::sandbox_err)?;
            let dir = located.open_dir().map_err(crate::files::sandbox_err)?;
            let limit = ring0_shape::cursor::clamp_page_size(a.limit, PAGE_ENTRIES_MAX).size;
            let page = search_dir(
                dir,
                &located.rel,
                &query,
                resume.map(|r| (r.after, r.line)),
                limit,
                ws.search_workers,
                &ws.sandbox.guard().listing(),
            );
            let shown = located.display(ws.sandbox.workspace());
            let matches: Vec<Value> = page
                .files
                .iter()
                .flat_map(|(rel, hits)| {
                    let path = join_display(&shown, rel);
                    hits.iter()
                        .map(move |(line, text)| json!({"path": path, "line": line, "text": text}))
                })
                .collect();
            let mut out = json!({
                "matches": matches,
                "files_searched": page.files_searched,
            });
            if page.binary_skipped > 0 {
                out["binary_files_skipped"] = json!(page.binary_skipped);
            }
            if let Some((after, line)) = &page.next {
                page::attach_cursor(&mut out, &ws.cursors, &ctx.scope, &tag, after, *line);
            }
            let s = page.stats;
            if s.dirs_unreadable > 0 || s.entries_skipped_limit > 0 || s.depth_limited > 0 {
                out["skipped"] = json!(s);
            }
            Ok(Observation::json(out))
        })
        .await
        .map_err(|e| not_applied(format!("search failed: {e}")))?
    }
}
