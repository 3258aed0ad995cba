//! Cutting text to a byte budget without splitting a character.
//!
//! Everything ring0 bounds — notes, matched lines, echoed input, output tails — is cut to a
//! number of bytes. Slicing a `str` inside a multi-byte character panics, and cutting bytes
//! there leaves invalid UTF-8, so every such cut goes through [`truncate_utf8`]: the last
//! character boundary at or before the budget (`str::floor_char_boundary`), never past it.

/// The longest prefix of `text` that takes at most `max_bytes` bytes and ends on a character
/// boundary: `text` itself when it fits.
///
/// ```
/// use ring0_core::text::truncate_utf8;
/// assert_eq!(truncate_utf8("añb", 2), "a"); // 'ñ' takes two bytes, 1..3
/// assert_eq!(truncate_utf8("añb", 3), "añ");
/// assert_eq!(truncate_utf8("abc", 5), "abc");
/// ```
pub fn truncate_utf8(text: &str, max_bytes: usize) -> &str {
    &text[..text.floor_char_boundary(max_bytes)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_never_splits_a_character() {
        let text = "a€😀b"; // 1 + 3 + 4 + 1 bytes
        for max in 0..=text.len() + 1 {
            let cut = truncate_utf8(text, max);
            assert!(cut.len() <= max, "{max}: {cut:?}");
            assert!(text.starts_with(cut));
            // Nothing longer would fit: the next character crosses the budget.
            let next = text[cut.len()..].chars().next().map_or(0, char::len_utf8);
            assert!(
                cut.len() == text.len() || cut.len() + next > max,
                "{max}: {cut:?}"
            );
        }
    }

    #[test]
    fn text_that_fits_is_returned_whole() {
        assert_eq!(truncate_utf8("añb", 4), "añb");
        assert_eq!(truncate_utf8("", 0), "");
        assert_eq!(truncate_utf8("abc", usize::MAX), "abc");
    }

    #[test]
    fn a_budget_inside_the_first_character_keeps_nothing() {
        assert_eq!(truncate_utf8("😀", 3), "");
        assert_eq!(truncate_utf8("abc", 0), "");
    }
}
