//! Arguments as a person is shown them before approving a call.
//!
//! A person must see what they approve. The rendering is the canonical JSON of the prepared
//! arguments (RFC 8785: no whitespace outside strings, control characters already escaped by
//! JSON), made unambiguous for a terminal or a chat window:
//! - every non-ASCII character is written as `\u{…}`, so look-alike letters, bidirectional
//!   overrides and invisible or exotic spaces are visible;
//! - a run of [`SPACE_RUN_MARKED_MIN`] or more spaces is written `⟪N spaces⟫`, so padding that
//!   would push the rest of an argument out of sight is counted instead. The marker is the
//!   only non-ASCII text the rendering contains, so no argument can imitate it.
//!
//! A rendering longer than [`ARGS_SHOWN_BYTES_MAX`] is not shown whole in a prompt: the prompt
//! shows its head, says that it is cut, and names where it is shown whole
//! (`ring0 approve --show ID`); the approval binds to the arguments' fingerprint either way.

use ring0_core::canonical::canonical_string;
use serde_json::Value;
use std::fmt::Write;

/// Longest argument rendering a prompt shows whole.
pub const ARGS_SHOWN_BYTES_MAX: usize = 4096;
/// Shortest run of spaces written as a counted marker.
pub const SPACE_RUN_MARKED_MIN: usize = 4;

/// The whole rendering of `args` (unbounded; see the module docs).
pub fn render_args(args: &Value) -> String {
    let text = canonical_string(args).unwrap_or_else(|_| args.to_string());
    let mut out = String::with_capacity(text.len());
    let mut spaces = 0usize;
    for c in text.chars() {
        if c == ' ' {
            spaces += 1;
            continue;
        }
        flush_spaces(&mut out, &mut spaces);
        if c.is_ascii() && !c.is_ascii_control() {
            out.push(c);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
    flush_spaces(&mut out, &mut spaces);
    out
}

fn flush_spaces(out: &mut String, spaces: &mut usize) {
    if *spaces >= SPACE_RUN_MARKED_MIN {
        let _ = write!(out, "⟪{spaces} spaces⟫");
    } else {
        out.extend(std::iter::repeat_n(' ', *spaces));
    }
    *spaces = 0;
}

/// What a prompt shows: the rendering whole when it fits [`ARGS_SHOWN_BYTES_MAX`], otherwise its
/// head and a note naming where the whole is shown. The flag says whether it is whole.
pub fn shown_args(args: &Value, approval_id: &str, args_hash: &str) -> (String, bool) {
    let whole = render_args(args);
    if whole.len() <= ARGS_SHOWN_BYTES_MAX {
        return (whole, true);
    }
    // The note's fixed text and two numbers fit in 160 bytes besides the id and digest.
    let note_room = 160 + approval_id.len() + args_hash.len();
    let cut = whole.floor_char_boundary(ARGS_SHOWN_BYTES_MAX.saturating_sub(note_room));
    let note = format!(
        " … [cut: {cut} of {} bytes shown; the whole arguments (digest {args_hash}) are shown by `ring0 approve --show {approval_id}`]",
        whole.len()
    );
    (format!("{}{note}", &whole[..cut]), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn padding_is_counted_and_the_tail_stays_visible() {
        let argv = format!("{}; echo pwned > tail.txt", " ".repeat(1200));
        let shown = render_args(&json!({"argv": ["ls", argv]}));
        assert!(
            shown.contains("⟪1200 spaces⟫; echo pwned > tail.txt"),
            "{shown}"
        );
        assert!(shown.len() < 100, "{shown}");
    }

    #[test]
    fn control_and_non_ascii_characters_are_escaped() {
        let shown = render_args(&json!({"a": "x\u{1b}[2Jy\u{202e}é\r"}));
        assert_eq!(shown, r#"{"a":"x\u001b[2Jy\u{202e}\u{e9}\r"}"#);
    }

    #[test]
    fn an_argument_cannot_imitate_the_space_marker() {
        let shown = render_args(&json!({"a": "⟪3 spaces⟫"}));
        assert!(!shown.contains('⟪'), "{shown}");
    }

    #[test]
    fn too_long_arguments_point_to_the_whole_rendering() {
        let (shown, whole) = shown_args(&json!({"a": "x".repeat(10_000)}), "ap_12", "v1:abc");
        assert!(!whole);
        assert!(shown.len() <= ARGS_SHOWN_BYTES_MAX, "{}", shown.len());
        assert!(shown.contains("ring0 approve --show ap_12") && shown.contains("v1:abc"));
        let (short, whole) = shown_args(&json!({"a": 1}), "ap_12", "v1:abc");
        assert!(whole);
        assert_eq!(short, r#"{"a":1}"#);
    }
}
