//! Token counts with the o200k tokenizer.
//!
//! The tokenizer's rank table ships inside `tiktoken-rs` (compiled in, nothing is downloaded); it
//! is parsed once per process, on first use.

use std::sync::LazyLock;

use tiktoken_rs::CoreBPE;

/// Name reported in [`ring0_core::observation::TokenCounts::encoding`].
pub const ENCODING: &str = "o200k_base";

static O200K: LazyLock<Option<CoreBPE>> = LazyLock::new(|| tiktoken_rs::o200k_base().ok());

/// Tokens in `text`, counting special-token text as ordinary text (the way tool output reaches a
/// model). `None` if the tokenizer could not be built.
pub fn count(text: &str) -> Option<u64> {
    O200K
        .as_ref()
        .map(|bpe| bpe.encode_ordinary(text).len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_cost_more_tokens_than_the_text_they_colour() {
        let raw = count("\x1b[1;38;2;255;128;0merror\x1b[0m").unwrap();
        let shaped = count("error").unwrap();
        assert!(raw > shaped * 3, "raw {raw} shaped {shaped}");
    }
}
