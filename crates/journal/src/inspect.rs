//! Human-readable views of intents, for `ring0 journal ls` and `ring0 journal show <id>`.
//!
//! The CLI opens the file with [`crate::JournalReader`] (no lock, read-only), fetches records and
//! prints these renderings.

use crate::record::IntentRecord;
use std::fmt::Write as _;

/// Default number of records `ring0 journal ls` lists.
pub const LIST_LIMIT_DEFAULT: usize = 50;

/// One line per record, newest first as given: id, state, attempts, tool, scope, last update.
pub fn render_list(records: &[IntentRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<36}  {:<18}  {:>3}  {:<24}  SCOPE",
        "INTENT", "STATE", "TRY", "TOOL"
    );
    for r in records {
        let _ = writeln!(
            out,
            "{:<36}  {:<18}  {:>3}  {:<24}  {}",
            r.id,
            r.state.as_str(),
            r.attempts,
            r.tool,
            r.scope
        );
    }
    if records.is_empty() {
        out.push_str("(no intents)\n");
    }
    out
}

/// Everything about one record, with its timeline.
pub fn render_show(r: &IntentRecord) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "intent:          {}", r.id);
    let _ = writeln!(out, "state:           {}", r.state);
    let _ = writeln!(out, "tool:            {}", r.tool);
    let _ = writeln!(out, "scope:           {}", r.scope);
    let _ = writeln!(
        out,
        "principal:       {}",
        r.principal.as_deref().unwrap_or("(not recorded)")
    );
    let _ = writeln!(out, "epoch:           {}", r.attempt_epoch);
    let _ = writeln!(out, "semantic key:    {}", r.semantic_key);
    let _ = writeln!(out, "idempotency key: {}", r.idempotency_key);
    let _ = writeln!(out, "mutating:        {}", r.mutating);
    let _ = writeln!(out, "fence:           {}", r.fence);
    let _ = writeln!(out, "attempts:        {}", r.attempts);
    let _ = writeln!(
        out,
        "arguments:       {} bytes, sha256 {}",
        r.canonical_args.len(),
        r.args_sha256()
    );
    let _ = writeln!(out, "call ids:        {}", r.call_ids.join(", "));
    let _ = writeln!(out, "incarnation:     {}", r.owner);
    let start = r.timeline.first().map_or(0, |e| e.at_ms);
    let _ = writeln!(
        out,
        "timeline:        (ms since the Unix epoch, +ms since proposed)"
    );
    for e in &r.timeline {
        let mut line = format!(
            "  {:>15}  +{:<8} {:<18}",
            e.at_ms,
            e.at_ms.saturating_sub(start),
            e.state.as_str()
        );
        if let Some(note) = &e.note {
            line.push_str(note);
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if let Some(snapshot) = &r.snapshot {
        let _ = writeln!(out, "snapshot:        {snapshot}");
    }
    match &r.receipt {
        Some(receipt) => {
            let text = serde_json::to_string_pretty(receipt).unwrap_or_default();
            let _ = writeln!(out, "receipt:\n{text}");
        }
        None => out.push_str("receipt:         (none)\n"),
    }
    out
}
