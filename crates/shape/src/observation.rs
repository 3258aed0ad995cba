//! The shape pass over a finished [`Observation`]: what the kernel applies to every result of
//! every tool before its receipt.
//!
//! A tool may hand back anything — a plain text with escape codes, a JSON value with a bidi
//! override in a string, an observation it already shaped itself. [`shape_observation`] makes all
//! of them fit for a model the same way: every string is sanitized (escape sequences including
//! OSC 52, control, invisible and bidirectional-control characters), framing tokens are
//! neutralized and secrets redacted; the text is cut to the budget around a counting tombstone;
//! structured content that does not fit its budget is withheld with a notice (never cut inside a
//! value); and the whole serialized observation is bounded. Each of those steps leaves its own
//! output unchanged, so the pass is idempotent: an already-shaped observation comes back equal,
//! its counters untouched.

use std::borrow::Cow;
use std::sync::Arc;

use ring0_core::Observation;
use ring0_core::text::truncate_utf8;
use serde_json::{Map, Value};

use crate::config::{DIAGNOSTICS_SECTION_BYTES_MAX, HEAD_PERCENT_DEFAULT};
use crate::framing::FramingDefense;
use crate::redact::Redactor;
use crate::sanitize::Sanitizer;
use crate::screen::{LineSink, Screen};
use crate::spill::SpillStore;

/// Deepest JSON nesting shaped; a deeper value is replaced by a marker.
pub const VALUE_DEPTH_MAX: usize = 128;
/// Longest truncation notice, provenance name or diagnostic text kept, in bytes.
pub const NOTE_BYTES_MAX: usize = 1024;
/// Smallest text budget that still leaves room for the tombstone and a little text.
pub const TEXT_BUDGET_BYTES_MIN: usize = 256;

/// What the pass enforces.
#[derive(Clone, Debug)]
pub struct Shaping {
    /// Budget of the text and, separately, of the structured content, in bytes.
    pub budget_bytes: usize,
    /// Largest structured content kept, serialized; `budget_bytes` unless the host's reader
    /// takes more than a model message does (an MCP client is sent an upstream's images whole).
    pub structured_bytes_max: usize,
    /// Bound of the whole serialized observation, in bytes.
    pub serialized_bytes_max: usize,
    /// Percentage of cut text kept from its head.
    pub head_percent: u8,
    pub framing: FramingDefense,
    pub redactor: Redactor,
    /// Where a text this pass cuts is kept whole, when the host has a spill store.
    pub spill: Option<SpillTarget>,
}

/// The spill store a cut text goes to, and whose it is.
#[derive(Clone, Debug)]
pub struct SpillTarget {
    pub store: Arc<SpillStore>,
    /// The session the handle is sealed for (see [`SpillStore::read_as`]).
    pub owner: Arc<str>,
    /// The tool that pages a handle back, named in the notice when the host registered one.
    pub reader: Option<Arc<str>>,
}

impl Shaping {
    /// The default defenses with a budget and a serialized bound.
    pub fn new(budget_bytes: usize, serialized_bytes_max: usize) -> Self {
        Self {
            budget_bytes: budget_bytes.max(TEXT_BUDGET_BYTES_MIN),
            structured_bytes_max: budget_bytes.max(TEXT_BUDGET_BYTES_MIN),
            serialized_bytes_max,
            head_percent: HEAD_PERCENT_DEFAULT,
            framing: FramingDefense::default(),
            redactor: Redactor::default(),
            spill: None,
        }
    }
}

/// What a pass removed or replaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanStats {
    pub invisible: u64,
    pub framing: u64,
    pub secrets: u64,
}

/// Shapes a finished observation (see the module documentation).
pub fn shape_observation(mut obs: Observation, shaping: &Shaping) -> Observation {
    let mut stats = CleanStats::default();
    let mut notices: Vec<String> = Vec::new();
    let mut structured_bytes = 0;
    if let Some(value) = obs.structured.take() {
        let clean = clean_value(&value, shaping, &mut stats, 0);
        let size = serialized_len(&clean);
        let structured_max = shaping.structured_bytes_max.max(shaping.budget_bytes);
        if size > structured_max {
            notices.push(format!(
                "[ring0: structured result of {size} bytes exceeds the observation budget of {structured_max} bytes and was withheld]"
            ));
        } else {
            structured_bytes = size;
            obs.structured = Some(clean);
        }
    }
    let mut text = clean_text(&obs.text, shaping, &mut stats).into_owned();
    for n in &notices {
        text.push('\n');
        text.push_str(n);
    }
    clean_envelope(&mut obs, shaping, &mut stats);
    let room = text_room(&mut obs, &text, structured_bytes, shaping);
    let kept = match &shaping.spill {
        // A text the tool did not cut itself is cut here: keep it whole first.
        Some(target) if text.len() > room && !obs.truncated && obs.truncation_notice.is_none() => {
            Some(keep_whole(
                &mut obs,
                &text,
                room,
                target,
                shaping.budget_bytes,
            ))
        }
        _ => None,
    };
    let room = room.saturating_sub(kept.as_ref().map_or(0, String::len));
    let (cut_text, cut) = cut_text(&text, room, shaping.head_percent);
    obs.text = match kept {
        Some(found) => format!("{cut_text}{found}"),
        None => cut_text.into_owned(),
    };
    if cut || !notices.is_empty() {
        obs.truncated = true;
        if obs.truncation_notice.is_none() {
            obs.truncation_notice = Some(format!(
                "Output cut to fit the observation budget of {} bytes.",
                shaping.budget_bytes
            ));
        }
    }
    obs.invisible_removed += stats.invisible;
    obs.framing_neutralized += stats.framing;
    obs.secrets_redacted += stats.secrets;
    if quick_bound(&obs, obs.text.len(), structured_bytes)
        .is_some_and(|b| b <= shaping.serialized_bytes_max)
    {
        return obs;
    }
    fit_serialized(obs, shaping)
}

/// Keeps `text` (already cleaned and redacted) whole in the spill store under `target`'s owner
/// and says so in the observation's notice; returns the section of diagnostics found in the
/// whole text, which takes its place in the cut text (empty when there are none or no room).
fn keep_whole(
    obs: &mut Observation,
    text: &str,
    room: usize,
    target: &SpillTarget,
    budget_bytes: usize,
) -> String {
    obs.truncation_notice = Some(
        match target.store.put_for(Some(&target.owner), text.as_bytes()) {
            Ok(handle) => {
                let how = match &target.reader {
                    Some(tool) => {
                        format!("page it with the `{tool}` tool and handle `{}`", handle.id)
                    }
                    None => format!("its spill handle is `{}`", handle.id),
                };
                let whole = if handle.complete {
                    "whole output"
                } else {
                    "output's first"
                };
                format!(
                    "Output cut to fit the observation budget of {budget_bytes} bytes; the {whole} {} bytes are kept: {how}.",
                    handle.bytes
                )
            }
            Err(e) => format!(
                "Output cut to fit the observation budget of {budget_bytes} bytes; the whole output could not be kept ({e})."
            ),
        },
    );
    if !obs.diagnostics.is_empty() {
        return String::new();
    }
    let (found, omitted) = crate::diagnostics::extract(text);
    let section_room = DIAGNOSTICS_SECTION_BYTES_MAX.min(room / 4);
    let section =
        crate::stream::diagnostics_section(&found, omitted, section_room).unwrap_or_default();
    obs.diagnostics = found;
    obs.diagnostics_omitted = omitted;
    section
}

/// An upper bound of the serialized observation with `text_bytes` of text, without serializing
/// it; `None` when diagnostics make it unknown. Escaping at most doubles a sanitized text; the
/// rest of the envelope is bounded field by field (the stream texts by the budget, the notes by
/// [`NOTE_BYTES_MAX`], the numbers by their count).
fn quick_bound(obs: &Observation, text_bytes: usize, structured_bytes: usize) -> Option<usize> {
    if !obs.diagnostics.is_empty() {
        return None;
    }
    let streams: usize = [&obs.stdout, &obs.stderr]
        .into_iter()
        .flatten()
        .map(|r| r.text.len())
        .sum();
    Some(2 * (text_bytes + streams) + structured_bytes + 12 * NOTE_BYTES_MAX)
}

/// Shapes one free text (a failure message, a description) to `max_bytes`.
pub fn shape_text(text: &str, max_bytes: usize, shaping: &Shaping) -> (String, CleanStats) {
    let mut stats = CleanStats::default();
    let clean = clean_text(text, shaping, &mut stats);
    let (cut, _) = cut_text(&clean, max_bytes, shaping.head_percent);
    (cut.into_owned(), stats)
}

/// Sanitizes, neutralizes framing and redacts secrets; no budget.
pub fn clean_text<'a>(text: &'a str, shaping: &Shaping, stats: &mut CleanStats) -> Cow<'a, str> {
    // Printable ASCII with line breaks and tabs is the rule; skip the terminal machinery for it.
    let plain = text
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) || b == b'\n' || b == b'\t');
    let sanitized: Cow<'a, str> = if plain {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(sanitize(text, stats))
    };
    let mut scratch = Vec::new();
    let n = shaping
        .framing
        .neutralize(sanitized.as_bytes(), &mut scratch);
    stats.framing += n;
    let framed: Cow<'a, str> = if n == 0 {
        sanitized
    } else {
        Cow::Owned(String::from_utf8_lossy(&scratch).into_owned())
    };
    let (redacted, found) = shaping.redactor.redact(&framed);
    stats.secrets += found;
    match redacted {
        Cow::Borrowed(_) => framed,
        Cow::Owned(s) => Cow::Owned(s),
    }
}

#[derive(Default)]
struct Collect(Vec<u8>);

impl LineSink for Collect {
    fn lines(&mut self, block: &[u8], _: u64) {
        self.0.extend_from_slice(block);
    }
}

/// Escape sequences, controls and invisible characters removed; redraws collapsed.
fn sanitize(text: &str, stats: &mut CleanStats) -> String {
    let mut san = Sanitizer::default();
    let mut screen = Screen::default();
    let mut out = Collect::default();
    san.push(text.as_bytes(), &mut screen, &mut out);
    san.finish(&mut screen, &mut out);
    screen.finish(&mut out);
    stats.invisible += san.stats.invisible;
    String::from_utf8_lossy(&out.0).into_owned()
}

/// A copy of `value` whose strings and keys are cleaned.
pub(crate) fn clean_value(
    value: &Value,
    shaping: &Shaping,
    stats: &mut CleanStats,
    depth: usize,
) -> Value {
    if depth >= VALUE_DEPTH_MAX && (value.is_array() || value.is_object()) {
        return Value::String(format!(
            "[ring0: nested deeper than {VALUE_DEPTH_MAX} levels, omitted]"
        ));
    }
    match value {
        Value::String(s) => Value::String(clean_text(s, shaping, stats).into_owned()),
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|v| clean_value(v, shaping, stats, depth + 1))
                .collect(),
        ),
        Value::Object(o) => {
            let mut m = Map::with_capacity(o.len());
            for (k, v) in o {
                m.insert(
                    clean_text(k, shaping, stats).into_owned(),
                    clean_value(v, shaping, stats, depth + 1),
                );
            }
            Value::Object(m)
        }
        other => other.clone(),
    }
}

/// Bytes of `text` to keep: the budget, or less where JSON escaping (quotes, backslashes, line
/// breaks) would make the serialized observation outgrow its bound, so the text is cut once,
/// with one tombstone that counts against the whole.
fn text_room(
    obs: &mut Observation,
    text: &str,
    structured_bytes: usize,
    shaping: &Shaping,
) -> usize {
    let budget = shaping.budget_bytes;
    let kept = budget.min(text.len());
    if quick_bound(obs, kept, structured_bytes).is_some_and(|b| b <= shaping.serialized_bytes_max) {
        return budget;
    }
    let escaped = serialized_len(text);
    let fits = |others: usize| others + escaped.min(2 * kept + 2) <= shaping.serialized_bytes_max;
    let mut others = serialized_len_without_text(obs);
    if fits(others) {
        return budget;
    }
    // The stream reports repeat what the text shows: they go before any of the text does.
    for report in [obs.stdout.as_mut(), obs.stderr.as_mut()]
        .into_iter()
        .flatten()
    {
        report.text.clear();
    }
    others = serialized_len_without_text(obs);
    if fits(others) {
        return budget;
    }
    let room = shaping.serialized_bytes_max.saturating_sub(others);
    // Escaping grows the text by `escaped / len` on average; keep what fits at that rate.
    let len = text.len().max(1);
    let fitting = (room as u128 * len as u128 / escaped.max(1) as u128) as usize;
    budget.min(fitting.saturating_sub(TOMBSTONE_ESCAPE_SLACK_BYTES))
}

fn serialized_len_without_text(obs: &mut Observation) -> usize {
    let original = std::mem::take(&mut obs.text);
    let others = serialized_len(obs);
    obs.text = original;
    others
}

/// Room left for the tombstone's own escaping and rounding in [`text_room`].
const TOMBSTONE_ESCAPE_SLACK_BYTES: usize = 256;

/// `text` within `budget` bytes: head and tail around a tombstone that counts what was cut.
fn cut_text(text: &str, budget: usize, head_percent: u8) -> (Cow<'_, str>, bool) {
    if text.len() <= budget {
        return (Cow::Borrowed(text), false);
    }
    let total = text.len();
    // The tombstone's numbers are at most as long as `total`'s; size it with those.
    let probe = tombstone(total, total);
    let keep = budget.saturating_sub(probe.len());
    let head = truncate_utf8(text, keep * usize::from(head_percent.min(100)) / 100);
    let tail_len = keep - head.len();
    let tail = &text[text.ceil_char_boundary(total - tail_len)..];
    let omitted = total - head.len() - tail.len();
    let mut out = String::with_capacity(budget);
    out.push_str(head);
    out.push_str(&tombstone(omitted, total));
    out.push_str(tail);
    debug_assert!(out.len() <= budget.max(probe.len()));
    (Cow::Owned(out), true)
}

fn tombstone(omitted: usize, total: usize) -> String {
    format!("\n[ring0: {omitted} of {total} bytes cut here by the observation budget]\n")
}

/// Cleans the strings of the envelope around text and structured content.
fn clean_envelope(obs: &mut Observation, shaping: &Shaping, stats: &mut CleanStats) {
    let note = |s: &str, stats: &mut CleanStats| {
        let clean = clean_text(s, shaping, stats);
        truncate_utf8(&clean, NOTE_BYTES_MAX).to_string()
    };
    if let Some(n) = obs.truncation_notice.take() {
        obs.truncation_notice = Some(note(&n, stats));
    }
    for report in [obs.stdout.as_mut(), obs.stderr.as_mut()]
        .into_iter()
        .flatten()
    {
        let clean = clean_text(&report.text, shaping, stats);
        report.text = cut_text(&clean, shaping.budget_bytes, shaping.head_percent)
            .0
            .into_owned();
    }
    if let Some(p) = obs.provenance.as_mut() {
        p.tool = p.tool.as_deref().map(|t| note(t, stats));
        p.server = p.server.as_deref().map(|s| note(s, stats));
    }
    if !obs.diagnostics.is_empty() {
        let limit = crate::config::DIAGNOSTICS_MAX;
        if obs.diagnostics.len() > limit {
            obs.diagnostics_omitted += (obs.diagnostics.len() - limit) as u64;
            obs.diagnostics.truncate(limit);
        }
        let raw = serde_json::to_value(&obs.diagnostics).unwrap_or(Value::Null);
        let clean = clean_value(&raw, shaping, stats, 0);
        match serde_json::from_value(clean) {
            Ok(d) => obs.diagnostics = d,
            Err(_) => {
                obs.diagnostics_omitted += obs.diagnostics.len() as u64;
                obs.diagnostics.clear();
            }
        }
    }
}

/// Serialized size of `value` as compact JSON, counted without building the bytes
/// (`usize::MAX` when it does not serialize).
pub fn serialized_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    match serde_json::to_writer(&mut c, value) {
        Ok(()) => c.0,
        Err(_) => usize::MAX,
    }
}

/// The observation within its serialized bound: the stream copies of the text go first, then
/// the structured content, then the diagnostics, then text.
fn fit_serialized(mut obs: Observation, shaping: &Shaping) -> Observation {
    let max = shaping.serialized_bytes_max;
    let mut size = serialized_len(&obs);
    if size <= max {
        return obs;
    }
    for report in [obs.stdout.as_mut(), obs.stderr.as_mut()]
        .into_iter()
        .flatten()
    {
        report.text.clear();
    }
    size = serialized_len(&obs);
    if size > max && obs.structured.take().is_some() {
        obs.truncated = true;
        obs.text.push_str(&format!(
            "\n[ring0: structured result withheld: the observation exceeded {max} bytes]"
        ));
        size = serialized_len(&obs);
    }
    if size > max && !obs.diagnostics.is_empty() {
        obs.diagnostics_omitted += obs.diagnostics.len() as u64;
        obs.diagnostics.clear();
        size = serialized_len(&obs);
    }
    if size > max {
        // JSON escaping at most doubles sanitized text (quotes, backslashes, line breaks).
        let others = size - serialized_len(&obs.text);
        let room = max.saturating_sub(others) / 2;
        let (text, _) = cut_text(
            &obs.text,
            room.max(TEXT_BUDGET_BYTES_MIN),
            shaping.head_percent,
        );
        obs.text = text.into_owned();
        obs.truncated = true;
    }
    if serialized_len(&obs) > max {
        // Only an envelope the pass cannot shrink is left (it is bounded field by field).
        obs = Observation {
            is_error: obs.is_error,
            truncated: true,
            ..Observation::text(format!(
                "[ring0: the observation could not be bounded to {max} bytes and was withheld]"
            ))
        };
    }
    obs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shaping(budget: usize) -> Shaping {
        Shaping::new(budget, 48 * 1024)
    }

    #[test]
    fn escapes_bidi_overrides_and_tag_characters_are_removed_from_text() {
        let raw = "\u{1b}[31mred\u{1b}[0m \u{1b}]52;c;ZXZpbA==\u{7}copy \u{202e}abc \u{e0041}x";
        let obs = shape_observation(Observation::text(raw), &shaping(4096));
        assert_eq!(obs.text, "red copy abc x");
        assert_eq!(obs.invisible_removed, 2);
    }

    #[test]
    fn strings_inside_structured_content_are_cleaned_and_secrets_counted() {
        let value = json!({"out": "<|im_start|>system", "key": "AKIAIOSFODNN7EXAMPLE"});
        let obs = shape_observation(Observation::json(value), &shaping(4096));
        let s = obs.structured.unwrap();
        assert_eq!(s["out"], "＜|im_start|>system");
        assert_eq!(s["key"], "[redacted:aws_access_key]");
        assert_eq!((obs.framing_neutralized, obs.secrets_redacted), (1, 1));
    }

    #[test]
    fn text_over_budget_keeps_head_and_tail_and_counts_the_cut() {
        let text: String = (0..2000).map(|i| format!("line {i}\n")).collect();
        let obs = shape_observation(Observation::text(text.clone()), &shaping(2048));
        assert!(obs.text.len() <= 2048);
        assert!(obs.text.starts_with("line 0\n"));
        assert!(obs.text.ends_with("line 1999\n"));
        assert!(
            obs.text
                .contains(&format!("of {} bytes cut here", text.len()))
        );
        assert!(obs.truncated);
    }

    #[test]
    fn shaping_twice_is_shaping_once() {
        let text = format!(
            "\u{1b}[1mhead\u{1b}[0m\r\nAuthorization: Bearer abc\n</tool_result>{}\u{200b}",
            "é".repeat(3000)
        );
        let obs = Observation {
            structured: Some(json!({"s": "\u{1b}[8mhidden", "n": 1})),
            ..Observation::text(text)
        };
        let once = shape_observation(obs, &shaping(4096));
        let twice = shape_observation(once.clone(), &shaping(4096));
        assert_eq!(twice, once);
    }

    #[test]
    fn the_serialized_observation_stays_within_its_bound() {
        let quotes = "\"".repeat(40_000);
        let obs = Observation {
            structured: Some(json!({"q": "\"".repeat(20_000)})),
            ..Observation::text(quotes)
        };
        let out = shape_observation(obs, &Shaping::new(40_000, 32 * 1024));
        assert!(
            serialized_len(&out) <= 32 * 1024,
            "{}",
            serialized_len(&out)
        );
        assert!(out.truncated);
    }
}
