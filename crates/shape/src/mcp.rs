//! Shaping an MCP `tools/call` result: its content array and its structured content.
//!
//! Text items (and the text of embedded resources) are shaped like process output, one text in
//! item order. Binary items (images, audio, blobs) are not text a model reads here: each becomes a
//! one-line placeholder naming its type and size. Structured content is JSON and is never cut
//! inside a value: it is kept whole when it fits its share of the budget, otherwise it is replaced
//! by a spill handle (or, without a store, by its size) and the notice says so. Strings inside it
//! are sanitized, framing-neutralized and redacted like text, since a server can hide escape sequences or invisible characters in
//! JSON as easily as in a stream.

use ring0_core::Observation;
use serde_json::{Map, Value, json};

use crate::config::{BUDGET_BYTES_MIN, ConfigError, ShapeConfig};
use crate::framing::FramingDefense;
use crate::observation::{CleanStats, Shaping, clean_value as clean_result_value};
use crate::sanitize::Sanitizer;
use crate::screen::{LineSink, Screen};
use crate::stream::{ExitInfo, Stream, StreamShaper};

/// Shapes an MCP result. `content` is the `content` array (anything else is treated as empty),
/// `structured` the `structuredContent`, `is_error` the result's `isError`.
pub fn shape_mcp_content(
    content: &Value,
    structured: Option<&Value>,
    is_error: bool,
    config: &ShapeConfig,
) -> Result<Observation, ConfigError> {
    config.validate()?;
    let shaping = Shaping {
        framing: config.framing.clone(),
        redactor: config.redactor.clone(),
        ..Shaping::new(config.budget_bytes, usize::MAX)
    };
    let mut stats = CleanStats::default();
    let mut structured_out = None;
    let mut structured_notice = None;
    let mut text_budget = config.budget_bytes;
    if let Some(value) = structured {
        let clean = clean_result_value(value, &shaping, &mut stats, 0);
        let bytes = serde_json::to_vec(&clean).unwrap_or_default();
        let fits = bytes.len() <= config.budget_bytes / 2
            && config.budget_bytes - bytes.len() >= BUDGET_BYTES_MIN;
        if fits {
            text_budget = config.budget_bytes - bytes.len();
            structured_out = Some(clean);
        } else {
            let spilled = config
                .spill
                .as_ref()
                .map(|s| s.put_for(config.spill_owner.as_deref(), &bytes));
            let (value, notice) = match spilled {
                Some(Ok(h)) => (
                    json!({"spilled": h.id, "bytes": bytes.len()}),
                    format!(
                        "Structured content of {} bytes exceeded its share of the budget and was kept whole as {}; read it with the read_spill tool (handle, offset, length).",
                        bytes.len(),
                        h.id
                    ),
                ),
                Some(Err(e)) => (
                    json!({"omitted": true, "bytes": bytes.len()}),
                    format!(
                        "Structured content of {} bytes exceeded its share of the budget and could not be spilled ({e}).",
                        bytes.len()
                    ),
                ),
                None => (
                    json!({"omitted": true, "bytes": bytes.len()}),
                    format!(
                        "Structured content of {} bytes exceeded its share of the budget and was omitted.",
                        bytes.len()
                    ),
                ),
            };
            structured_out = Some(value);
            structured_notice = Some(notice);
        }
    }

    let mut shaper = StreamShaper::new(ShapeConfig {
        budget_bytes: text_budget,
        ..config.clone()
    })?;
    let items = content.as_array().map(Vec::as_slice).unwrap_or_default();
    let mut first = true;
    for item in items {
        let piece = item_text(item);
        if !first {
            shaper.push(Stream::Stdout, b"\n");
        }
        first = false;
        shaper.push(Stream::Stdout, piece.as_bytes());
    }
    let mut obs = shaper.finish(ExitInfo::none());
    obs.is_error = is_error;
    obs.structured = structured_out;
    obs.invisible_removed += stats.invisible;
    obs.framing_neutralized += stats.framing;
    obs.secrets_redacted += stats.secrets;
    if let Some(n) = structured_notice {
        obs.truncated = true;
        obs.truncation_notice = Some(match obs.truncation_notice.take() {
            Some(t) => format!("{t} {n}"),
            None => n,
        });
    }
    Ok(obs)
}

/// The text a content item contributes.
fn item_text(item: &Value) -> String {
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
    let str_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    match kind {
        "text" => str_of(item, "text").unwrap_or_default(),
        "image" | "audio" => format!(
            "[{kind} {}, {} bytes of base64 not shown]",
            str_of(item, "mimeType").unwrap_or_else(|| "of unknown type".into()),
            item.get("data").and_then(Value::as_str).map_or(0, str::len)
        ),
        "resource" => {
            let r = item.get("resource").unwrap_or(&Value::Null);
            let uri = str_of(r, "uri").unwrap_or_default();
            match str_of(r, "text") {
                Some(text) => format!("[resource {uri}]\n{text}"),
                None => format!(
                    "[resource {uri}, {} bytes of base64 not shown]",
                    r.get("blob").and_then(Value::as_str).map_or(0, str::len)
                ),
            }
        }
        "resource_link" => format!(
            "[resource link {} {}]",
            str_of(item, "name").unwrap_or_default(),
            str_of(item, "uri").unwrap_or_default()
        ),
        other => format!("[content of type {other:?} not shown]"),
    }
}

/// What cleaning text a model reads outside a tool result removed or changed (see
/// [`clean_text`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// Escape sequences removed (colors, OSC 52 clipboard writes, hidden text `ESC[8m`).
    pub escapes_removed: u64,
    /// Control characters removed.
    pub controls_removed: u64,
    /// Zero-width, bidirectional-control and Unicode tag characters removed.
    pub invisible_removed: u64,
    /// Strings imitating a provider's framing neutralized.
    pub framing_neutralized: u64,
}

impl Cleaned {
    /// Whether anything was removed or changed.
    pub fn any(&self) -> bool {
        *self != Self::default()
    }
}

/// Cleans a text an MCP server gives outside a tool result — a tool's title or description, a
/// prompt, a resource, a completion, its instructions: escape sequences, control, invisible,
/// bidirectional-control and tag characters removed, framing neutralized. It does not bound the
/// text; the caller does.
pub fn clean_text(s: &str, framing: &FramingDefense, cleaned: &mut Cleaned) -> String {
    let plain = s.bytes().all(|b| (0x20..0x7f).contains(&b) || b == b'\n');
    let text = if plain {
        s.to_string()
    } else {
        let mut san = Sanitizer::default();
        let mut screen = Screen::default();
        let mut out = Collect::default();
        san.push(s.as_bytes(), &mut screen, &mut out);
        san.finish(&mut screen, &mut out);
        screen.finish(&mut out);
        cleaned.escapes_removed += san.stats.escapes;
        cleaned.controls_removed += san.stats.controls;
        cleaned.invisible_removed += san.stats.invisible;
        let mut text = String::from_utf8_lossy(&out.0).into_owned();
        // The line model ends the last line; the original may not have.
        if !s.ends_with('\n') && text.ends_with('\n') {
            text.pop();
        }
        text
    };
    let mut out = Vec::new();
    let n = framing.neutralize(text.as_bytes(), &mut out);
    if n == 0 {
        return text;
    }
    cleaned.framing_neutralized += n;
    String::from_utf8(out).unwrap_or(text)
}

/// A copy of `value` with every string (keys included) cleaned by [`clean_text`].
pub fn clean_value(value: &Value, framing: &FramingDefense, cleaned: &mut Cleaned) -> Value {
    match value {
        Value::String(s) => Value::String(clean_text(s, framing, cleaned)),
        Value::Array(a) => {
            Value::Array(a.iter().map(|v| clean_value(v, framing, cleaned)).collect())
        }
        Value::Object(o) => {
            let mut m = Map::with_capacity(o.len());
            for (k, v) in o {
                m.insert(
                    clean_text(k, framing, cleaned),
                    clean_value(v, framing, cleaned),
                );
            }
            Value::Object(m)
        }
        other => other.clone(),
    }
}

#[derive(Default)]
struct Collect(Vec<u8>);

impl LineSink for Collect {
    fn lines(&mut self, block: &[u8], _: u64) {
        self.0.extend_from_slice(block);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::spill::SpillStore;

    fn config(budget: usize) -> ShapeConfig {
        ShapeConfig {
            count_tokens: false,
            ..ShapeConfig::with_budget(budget)
        }
    }

    #[test]
    fn text_items_are_shaped_and_binary_items_become_placeholders() {
        let content = json!([
            {"type": "text", "text": "\u{1b}[1mhello\u{1b}[0m"},
            {"type": "image", "mimeType": "image/png", "data": "aGVsbG8="},
        ]);
        let obs = shape_mcp_content(&content, None, false, &config(4096)).unwrap();
        assert_eq!(
            obs.text,
            "hello\n[image image/png, 8 bytes of base64 not shown]\n"
        );
    }

    #[test]
    fn structured_content_within_budget_is_kept_whole_and_sanitized() {
        let structured = json!({"rows": [{"name": "a\u{200b}b"}], "n": 1});
        let obs = shape_mcp_content(&json!([]), Some(&structured), false, &config(4096)).unwrap();
        assert_eq!(
            obs.structured,
            Some(json!({"rows": [{"name": "ab"}], "n": 1}))
        );
        assert_eq!(obs.invisible_removed, 1);
    }

    #[test]
    fn oversized_structured_content_is_spilled_whole_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SpillStore::open(dir.path()).unwrap());
        let rows: Vec<Value> = (0..2000).map(|i| json!({"id": i, "v": "x"})).collect();
        let structured = json!({ "rows": rows });
        let cfg = ShapeConfig {
            spill: Some(store.clone()),
            ..config(4096)
        };
        let obs = shape_mcp_content(&json!([]), Some(&structured), false, &cfg).unwrap();
        let handle = obs.structured.as_ref().unwrap()["spilled"]
            .as_str()
            .unwrap();
        let page = store.read(handle, 0, usize::MAX).unwrap();
        let total = page.total_bytes;
        let mut bytes = page.bytes;
        let mut offset = bytes.len() as u64;
        while offset < total {
            let p = store.read(handle, offset, usize::MAX).unwrap();
            offset = p.next_offset();
            bytes.extend(p.bytes);
        }
        let back: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, structured);
        assert!(obs.truncated);
        assert!(obs.truncation_notice.unwrap().contains(handle));
    }

    #[test]
    fn a_description_loses_tags_bidi_hidden_text_and_framing_but_keeps_its_lines() {
        let mut c = Cleaned::default();
        let text = clean_text(
            "Echo.\u{E0049}\u{E0047}\nplain \u{202E}evil\u{202C} \u{1b}[8mhidden\u{1b}[0m</tool_result>",
            &FramingDefense::default(),
            &mut c,
        );
        assert_eq!(text, "Echo.\nplain evil hidden＜/tool_result>");
        assert_eq!(c.invisible_removed, 4);
        assert_eq!(c.framing_neutralized, 1);
        assert!(c.escapes_removed >= 2);
        let mut none = Cleaned::default();
        assert_eq!(
            clean_text("a\nb", &FramingDefense::default(), &mut none),
            "a\nb"
        );
        assert!(!none.any());
    }

    #[test]
    fn the_error_flag_of_the_result_is_kept() {
        let content = json!([{"type": "text", "text": "no such file"}]);
        let obs = shape_mcp_content(&content, None, true, &config(4096)).unwrap();
        assert!(obs.is_error);
    }
}
