//! Forwarding an upstream's `tools/call` result: lossless in structure, shaped in content.
//!
//! The result object travels as the server sent it — `_meta`, `isError`, fields ring0 does not
//! know — except for what a model reads, which goes through `ring0-shape`:
//! - each text item (and the text of an embedded resource) is sanitized and cut to its share of
//!   the observation budget, with a counting tombstone, on its own so item boundaries survive;
//! - binary items (images, audio, blobs) are kept whole up to [`BINARY_CONTENT_BYTES_MAX`] and
//!   otherwise replaced by a text placeholder naming their type and size;
//! - `structuredContent` is kept whole (strings sanitized) when it fits the budget, and otherwise
//!   replaced by a spill handle or its size — JSON is never cut inside a value;
//! - when the tool declared an `outputSchema`, `structuredContent` must be present and valid:
//!   otherwise the result becomes an error result that says why;
//! - a result still larger than [`FORWARDED_RESULT_BYTES_MAX`] (the journal keeps it) keeps what
//!   a model reads and loses binary items and the fields ring0 does not model, saying so.
//!
//! The [`Observation`] holds the shaped text of every item in order (what a reader of the
//! journal sees) and, as its payload (`structured`), the shaped result object: what the MCP
//! client receives, through the kernel's projection ([`crate::project`]).

use crate::limits::{BINARY_CONTENT_BYTES_MAX, FORWARDED_RESULT_BYTES_MAX};
use jsonschema::Validator;
use ring0_core::Observation;
use ring0_core::observation::Provenance;
use ring0_shape::config::BUDGET_BYTES_MIN;
use ring0_shape::{ShapeConfig, SpillStore, shape_bytes, shape_mcp_content};
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// Room the shaper's notices and tombstones need on top of a text it does not cut.
const NOTICE_ROOM_BYTES: usize = 640;
/// Unknown content items larger than this (serialized) are replaced by a placeholder.
const UNKNOWN_ITEM_BYTES_MAX: usize = 4096;

/// Shaping settings for one call.
#[derive(Clone)]
pub struct ForwardConfig {
    pub budget_bytes: usize,
    pub spill: Option<Arc<SpillStore>>,
    pub provenance: Provenance,
    /// Whose result this is (the calling session's scope): spill handles are sealed for it.
    pub owner: Option<Arc<str>>,
}

impl ForwardConfig {
    /// This configuration for one call of the session with scope `owner`.
    pub fn for_owner(&self, owner: &Arc<str>) -> Self {
        Self {
            owner: Some(owner.clone()),
            ..self.clone()
        }
    }
}

/// `may_cut`: whether the input can exceed the budget. Only then is the spill store passed: the
/// shaper opens a spill file per stream up front, which costs more than shaping a short text.
fn shape_config(budget: usize, cfg: &ForwardConfig, may_cut: bool) -> ShapeConfig {
    ShapeConfig {
        budget_bytes: budget.clamp(BUDGET_BYTES_MIN, ring0_shape::config::BUDGET_BYTES_MAX),
        spill: if may_cut { cfg.spill.clone() } else { None },
        spill_owner: cfg.owner.clone(),
        // Token counting costs more than the rest of forwarding; the gateway's results carry
        // byte counts instead.
        count_tokens: false,
        provenance: Some(cfg.provenance.clone()),
        ..ShapeConfig::default()
    }
}

/// Shapes one text; the shaper ends text with a newline, which an MCP text item did not have.
fn shape_text(text: &str, budget: usize, cfg: &ForwardConfig) -> (String, Option<String>) {
    let may_cut = text.len() + NOTICE_ROOM_BYTES > budget;
    let obs = match shape_bytes(text.as_bytes(), &shape_config(budget, cfg, may_cut)) {
        Ok(o) => o,
        Err(e) => return (format!("[ring0: this text could not be shaped: {e}]"), None),
    };
    let mut out = obs.text;
    if !obs.truncated && !text.ends_with('\n') && out.ends_with('\n') {
        out.pop();
    }
    (out, obs.truncation_notice)
}

/// The budget of each text, in item order: texts that fit an equal share keep their size, the
/// rest share what is left. `None` when there are too many texts to give each the shaper's
/// minimum: they are then merged into one.
fn text_budgets(lens: &[usize], budget: usize) -> Option<Vec<usize>> {
    let total: usize = lens.iter().map(|l| l + NOTICE_ROOM_BYTES).sum();
    if total <= budget {
        return Some(lens.iter().map(|l| l + NOTICE_ROOM_BYTES).collect());
    }
    if lens.len() * BUDGET_BYTES_MIN > budget {
        return None;
    }
    let mut out = vec![0; lens.len()];
    let mut left = budget;
    let mut open: Vec<usize> = (0..lens.len()).collect();
    loop {
        let share = left / open.len().max(1);
        let (fits, big): (Vec<usize>, Vec<usize>) = open
            .iter()
            .partition(|&&i| lens[i] + NOTICE_ROOM_BYTES <= share);
        if fits.is_empty() {
            for &i in &big {
                out[i] = share.max(BUDGET_BYTES_MIN);
            }
            return Some(out);
        }
        for &i in &fits {
            out[i] = lens[i] + NOTICE_ROOM_BYTES;
            left -= out[i];
        }
        if big.is_empty() {
            return Some(out);
        }
        open = big;
    }
}

fn binary_placeholder(kind: &str, mime: Option<&str>, bytes: usize) -> Value {
    json!({"type": "text", "text": format!(
        "[{kind} {}, {bytes} bytes of base64 over ring0's limit of {BINARY_CONTENT_BYTES_MAX}; not forwarded]",
        mime.unwrap_or("of unknown type")
    )})
}

/// Shapes an upstream result: the observation of the call, with the result object as payload.
pub fn forward(raw: &Value, output_schema: Option<&Validator>, cfg: &ForwardConfig) -> Observation {
    let Some(obj) = raw.as_object() else {
        return error_result("the server's tools/call result is not a JSON object", cfg);
    };
    let mut out: Map<String, Value> = obj.clone();
    let mut is_error = obj.get("isError").and_then(Value::as_bool).unwrap_or(false);
    let mut extra_errors: Vec<String> = Vec::new();

    // Output schema: checked before shaping, on what the server sent.
    if let Some(validator) = output_schema
        && !is_error
    {
        match obj.get("structuredContent") {
            None => extra_errors.push(
                "the tool declares an outputSchema but the server returned no structuredContent"
                    .into(),
            ),
            Some(value) => {
                let errors: Vec<String> = validator
                    .iter_errors(value)
                    .take(8)
                    .map(|e| format!("{}: {e}", e.instance_path()))
                    .collect();
                if !errors.is_empty() {
                    extra_errors.push(format!(
                        "the server's structuredContent does not match the tool's outputSchema: {}",
                        errors.join("; ")
                    ));
                }
            }
        }
        if !extra_errors.is_empty() {
            is_error = true;
            out.remove("structuredContent");
        }
    }

    // Structured content: whole or spilled, strings sanitized.
    let mut notices: Vec<String> = Vec::new();
    // What the client's text must say about the structured content (its spill handle).
    let mut structured_notes: Vec<String> = Vec::new();
    if let Some(sc) = out.get("structuredContent").cloned() {
        let fits = serde_json::to_vec(&sc)
            .map(|b| b.len())
            .unwrap_or(usize::MAX)
            <= cfg.budget_bytes;
        let shaped = shape_mcp_content(
            &Value::Array(vec![]),
            Some(&sc),
            is_error,
            &shape_config(
                if fits {
                    cfg.budget_bytes * 2 + BUDGET_BYTES_MIN
                } else {
                    cfg.budget_bytes
                },
                cfg,
                !fits,
            ),
        );
        match shaped {
            Ok(o) => {
                let stand_in = o.truncation_notice.is_some();
                if let Some(n) = o.truncation_notice {
                    notices.push(n.clone());
                    structured_notes.push(n);
                }
                match (o.structured, output_schema) {
                    // A stand-in (spill handle or size) the tool's outputSchema refuses would make
                    // a validating client reject the whole result: none is sent, and the result
                    // is an error result that says why, so the client skips the schema check.
                    (Some(s), Some(validator)) if stand_in && !validator.is_valid(&s) => {
                        out.remove("structuredContent");
                        is_error = true;
                        structured_notes.push(
                            "its stand-in does not match the tool's outputSchema, so this result \
                             carries no structuredContent and is marked isError; the server's \
                             value is unchanged in the spill store"
                                .into(),
                        );
                    }
                    (Some(s), _) => {
                        out.insert("structuredContent".into(), s);
                    }
                    (None, _) => {}
                }
            }
            Err(e) => {
                out.remove("structuredContent");
                if output_schema.is_some() {
                    is_error = true;
                }
                let n = format!("structured content could not be shaped: {e}");
                notices.push(n.clone());
                structured_notes.push(n);
            }
        }
    }

    // Content items.
    let items: Vec<Value> = obj
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let text_of = |item: &Value| -> Option<String> {
        match item.get("type").and_then(Value::as_str) {
            Some("text") => item.get("text").and_then(Value::as_str).map(str::to_string),
            Some("resource") => item
                .pointer("/resource/text")
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => None,
        }
    };
    let lens: Vec<usize> = items
        .iter()
        .filter_map(|i| text_of(i).map(|t| t.len()))
        .collect();
    let budgets = text_budgets(&lens, cfg.budget_bytes);
    let mut shaped_items: Vec<Value> = Vec::with_capacity(items.len());
    let mut journal_text: Vec<String> = Vec::new();
    let mut truncated = false;
    match budgets {
        None => {
            // Too many texts to shape one by one within budget: one merged, shaped text.
            let o = shape_mcp_content(
                &Value::Array(items.clone()),
                None,
                is_error,
                &shape_config(cfg.budget_bytes, cfg, true),
            );
            let text = o.as_ref().map(|o| o.text.clone()).unwrap_or_default();
            truncated = o.as_ref().is_ok_and(|o| o.truncated);
            if let Ok(Some(n)) = o.map(|o| o.truncation_notice) {
                notices.push(n);
            }
            notices.push(format!(
                "{} content items were merged into one text to fit the budget",
                items.len()
            ));
            journal_text.push(text.clone());
            shaped_items.push(json!({"type": "text", "text": text}));
        }
        Some(budgets) => {
            let mut next_budget = budgets.into_iter();
            let mut binary_left = BINARY_CONTENT_BYTES_MAX;
            for item in items {
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                if let Some(text) = text_of(&item) {
                    let budget = next_budget.next().unwrap_or(BUDGET_BYTES_MIN);
                    let (shaped, notice) = shape_text(&text, budget, cfg);
                    if let Some(n) = notice {
                        truncated = true;
                        notices.push(n);
                    }
                    let mut item = item;
                    if kind == "text" {
                        item["text"] = Value::String(shaped.clone());
                        journal_text.push(shaped);
                    } else {
                        let uri = item
                            .pointer("/resource/uri")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string();
                        item["resource"]["text"] = Value::String(shaped.clone());
                        journal_text.push(format!("[resource {uri}]\n{shaped}"));
                    }
                    shaped_items.push(item);
                    continue;
                }
                match kind.as_str() {
                    "image" | "audio" | "resource" => {
                        let (data, mime) = if kind == "resource" {
                            (
                                item.pointer("/resource/blob"),
                                item.pointer("/resource/mimeType"),
                            )
                        } else {
                            (item.get("data"), item.get("mimeType"))
                        };
                        let bytes = data.and_then(Value::as_str).map_or(0, str::len);
                        let mime = mime.and_then(Value::as_str);
                        if bytes <= binary_left {
                            binary_left -= bytes;
                            journal_text.push(format!(
                                "[{kind} {}, {bytes} bytes of base64]",
                                mime.unwrap_or("of unknown type")
                            ));
                            shaped_items.push(item);
                        } else {
                            truncated = true;
                            let p = binary_placeholder(&kind, mime, bytes);
                            journal_text.push(p["text"].as_str().unwrap_or("").to_string());
                            shaped_items.push(p);
                        }
                    }
                    "resource_link" => {
                        journal_text.push(format!(
                            "[resource link {} {}]",
                            item.get("name").and_then(Value::as_str).unwrap_or(""),
                            item.get("uri").and_then(Value::as_str).unwrap_or("")
                        ));
                        shaped_items.push(item);
                    }
                    other => {
                        let size = serde_json::to_vec(&item).map_or(usize::MAX, |b| b.len());
                        if size <= UNKNOWN_ITEM_BYTES_MAX {
                            journal_text.push(format!("[content of type {other:?}]"));
                            shaped_items.push(item);
                        } else {
                            truncated = true;
                            let text =
                                format!("[content of type {other:?}, {size} bytes, not forwarded]");
                            journal_text.push(text.clone());
                            shaped_items.push(json!({"type": "text", "text": text}));
                        }
                    }
                }
            }
        }
    }
    for e in extra_errors.iter().chain(&structured_notes) {
        shaped_items.push(json!({"type": "text", "text": format!("[ring0: {e}]")}));
        journal_text.push(format!("[ring0: {e}]"));
    }
    out.insert("content".into(), Value::Array(shaped_items));
    if is_error {
        out.insert("isError".into(), Value::Bool(true));
    }
    let bytes = serde_json::to_vec(&out).map_or(usize::MAX, |b| b.len());
    if bytes > FORWARDED_RESULT_BYTES_MAX {
        let notice = format!(
            "the result's {bytes} bytes exceed ring0's limit of {FORWARDED_RESULT_BYTES_MAX} for \
             one result; its binary items and the fields ring0 does not model were left out"
        );
        out = within_result_bound(out, &notice);
        notices.push(notice);
        truncated = true;
    }
    let notice = (!notices.is_empty()).then(|| notices.join(" "));
    Observation {
        text: journal_text.join("\n"),
        structured: Some(Value::Object(out)),
        is_error,
        truncated: truncated || notice.is_some(),
        truncation_notice: notice,
        provenance: Some(cfg.provenance.clone()),
        ..Observation::default()
    }
}

/// What a result too large to keep whole keeps: its text and small items, its structured
/// content and `isError`; binary items become a text placeholder saying why.
fn within_result_bound(mut out: Map<String, Value>, why: &str) -> Map<String, Value> {
    let items = match out.remove("content") {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    let content: Vec<Value> = items
        .into_iter()
        .map(|item| {
            let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
            let small =
                serde_json::to_vec(&item).map_or(usize::MAX, |b| b.len()) <= UNKNOWN_ITEM_BYTES_MAX;
            if kind == "text" || item.pointer("/resource/text").is_some() || small {
                item
            } else {
                json!({"type": "text", "text": format!("[{kind} content left out: {why}]")})
            }
        })
        .collect();
    let mut kept = Map::new();
    kept.insert("content".into(), Value::Array(content));
    for key in ["structuredContent", "isError"] {
        if let Some(v) = out.remove(key) {
            kept.insert(key.into(), v);
        }
    }
    kept
}

fn error_result(message: &str, cfg: &ForwardConfig) -> Observation {
    Observation {
        structured: Some(json!({"content": [{"type": "text", "text": message}], "isError": true})),
        provenance: Some(cfg.provenance.clone()),
        ..Observation::error(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(budget: usize) -> ForwardConfig {
        ForwardConfig {
            budget_bytes: budget,
            spill: None,
            owner: None,
            provenance: Provenance {
                tool: Some("t".into()),
                server: Some("s".into()),
                trusted: false,
            },
        }
    }

    /// The result object the client receives: the observation's payload.
    fn result(o: &Observation) -> &Value {
        o.structured.as_ref().expect("a result object")
    }

    #[test]
    fn a_small_result_is_forwarded_unchanged_with_unknown_fields() {
        let raw = json!({"content": [{"type": "text", "text": "hello", "_meta": {"k": 1}},
                                     {"type": "image", "data": "aGk=", "mimeType": "image/png"}],
                         "_meta": {"trace": "x"}, "x-extra": [1, 2]});
        let f = forward(&raw, None, &cfg(16 * 1024));
        assert_eq!(result(&f), &raw);
        assert_eq!(f.text, "hello\n[image image/png, 4 bytes of base64]");
    }

    #[test]
    fn escape_sequences_in_text_are_removed() {
        let raw = json!({"content": [{"type": "text", "text": "\u{1b}[31mred\u{1b}[0m"}]});
        let f = forward(&raw, None, &cfg(16 * 1024));
        assert_eq!(result(&f)["content"][0]["text"], "red");
    }

    #[test]
    fn an_oversized_text_is_cut_within_budget_and_stays_valid_json() {
        let big = "line of output\n".repeat(10_000);
        let raw = json!({"content": [{"type": "text", "text": big}], "isError": false});
        let f = forward(&raw, None, &cfg(8 * 1024));
        let text = result(&f)["content"][0]["text"].as_str().unwrap();
        assert!(text.len() <= 8 * 1024, "{}", text.len());
        assert!(f.truncated);
        let again: Value = serde_json::from_str(&result(&f).to_string()).unwrap();
        assert_eq!(&again, result(&f));
    }

    #[test]
    fn structured_content_violating_the_output_schema_becomes_an_error() {
        let schema =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        let v = ring0_kernel::registry::compile_schema(&schema).unwrap();
        let raw = json!({"content": [], "structuredContent": {"n": "three"}});
        let f = forward(&raw, Some(&v), &cfg(16 * 1024));
        assert_eq!(result(&f)["isError"], true);
        assert!(result(&f).get("structuredContent").is_none());
        assert!(f.is_error);
        let raw = json!({"content": [], "structuredContent": {"n": 3}});
        let f = forward(&raw, Some(&v), &cfg(16 * 1024));
        assert_eq!(result(&f)["structuredContent"]["n"], 3);
        assert!(!f.is_error);
    }

    #[test]
    fn an_oversized_structured_value_is_replaced_only_by_a_stand_in_its_schema_accepts() {
        let rows: Vec<Value> = (0..2000)
            .map(|i| json!({"id": i, "note": "n".repeat(40)}))
            .collect();
        let raw = json!({"content": [{"type": "text", "text": "rows"}], "structuredContent": {"rows": rows}});
        let strict = ring0_kernel::registry::compile_schema(
            &json!({"type": "object", "required": ["rows"]}),
        )
        .unwrap();
        let f = forward(&raw, Some(&strict), &cfg(16 * 1024));
        assert_eq!(result(&f)["isError"], true);
        assert!(result(&f).get("structuredContent").is_none());
        let said = result(&f)["content"].to_string();
        assert!(
            said.contains("does not match the tool's outputSchema"),
            "{said}"
        );
        let loose = ring0_kernel::registry::compile_schema(&json!({"type": "object"})).unwrap();
        let f = forward(&raw, Some(&loose), &cfg(16 * 1024));
        assert!(result(&f).get("isError").is_none());
        assert!(loose.is_valid(&result(&f)["structuredContent"]));
        assert!(
            result(&f)["content"]
                .to_string()
                .contains("exceeded its share")
        );
    }

    #[test]
    fn is_error_from_the_server_is_kept() {
        let raw = json!({"content": [{"type": "text", "text": "nope"}], "isError": true});
        let f = forward(&raw, None, &cfg(16 * 1024));
        assert_eq!(result(&f)["isError"], true);
        assert!(f.is_error);
    }

    #[test]
    fn a_result_past_the_result_bound_keeps_its_text_and_says_what_was_left_out() {
        let image = "A".repeat(BINARY_CONTENT_BYTES_MAX - 16);
        let raw = json!({
            "content": [{"type": "text", "text": "kept"},
                        {"type": "image", "data": image, "mimeType": "image/png"}],
            "_meta": {"trace": "t".repeat(FORWARDED_RESULT_BYTES_MAX / 2)},
        });
        let f = forward(&raw, None, &cfg(16 * 1024));
        let size = serde_json::to_vec(result(&f)).unwrap().len();
        assert!(size <= FORWARDED_RESULT_BYTES_MAX, "{size}");
        assert_eq!(result(&f)["content"][0]["text"], "kept");
        let placeholder = result(&f)["content"][1]["text"].as_str().unwrap();
        assert!(
            placeholder.starts_with("[image content left out"),
            "{placeholder}"
        );
        assert!(result(&f).get("_meta").is_none());
        assert!(f.truncated);
        assert!(f.truncation_notice.unwrap().contains("left out"));
    }

    #[test]
    fn many_texts_share_the_budget_and_each_stays_an_item() {
        let items: Vec<Value> = (0..4)
            .map(|i| json!({"type": "text", "text": format!("{i}").repeat(6000)}))
            .collect();
        let f = forward(&json!({"content": items}), None, &cfg(16 * 1024));
        let content = result(&f)["content"].as_array().unwrap();
        assert_eq!(content.len(), 4);
        let total: usize = content
            .iter()
            .map(|c| c["text"].as_str().unwrap().len())
            .sum();
        assert!(total <= 16 * 1024, "{total}");
    }
}
