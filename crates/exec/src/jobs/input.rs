//! Checking what a caller wants to type into a job.
//!
//! Input is refused, not rewritten, when it holds anything but printable text, newline and tab:
//! a silently dropped escape or interrupt byte would send the process something the caller did
//! not mean. The refusal says which byte and where.

use crate::error::JobError;
use crate::limits;

/// Returns the bytes to write, or why they are refused.
pub(crate) fn check(data: &[u8]) -> Result<&[u8], JobError> {
    if data.is_empty() {
        return Err(JobError::InputRejected {
            reason: "input is empty".into(),
        });
    }
    if data.len() > limits::INPUT_BYTES_MAX {
        return Err(JobError::InputRejected {
            reason: format!(
                "input is {} bytes; at most {} are accepted at once",
                data.len(),
                limits::INPUT_BYTES_MAX
            ),
        });
    }
    let text = std::str::from_utf8(data).map_err(|e| JobError::InputRejected {
        reason: format!("input is not UTF-8 (at byte {})", e.valid_up_to()),
    })?;
    for (offset, c) in text.char_indices() {
        if c.is_control() && c != '\n' && c != '\t' {
            return Err(JobError::InputRejected {
                reason: format!(
                    "control character U+{:04X} at byte {offset}; only newline and tab are allowed",
                    c as u32
                ),
            });
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_with_newline_and_tab_is_accepted() {
        assert!(check(b"yes\n").is_ok());
        assert!(check("name\tvalue ü\n".as_bytes()).is_ok());
    }

    #[test]
    fn interrupt_and_escape_bytes_are_refused_with_their_position() {
        let err = check(b"ab\x03").unwrap_err().to_string();
        assert!(err.contains("U+0003") && err.contains("byte 2"), "{err}");
        assert!(check(b"\x1b[A").is_err());
        assert!(check("\u{9b}".as_bytes()).is_err());
        assert!(check(b"a\r\n").is_err());
    }

    #[test]
    fn oversized_empty_and_invalid_utf8_input_is_refused() {
        assert!(check(&vec![b'a'; limits::INPUT_BYTES_MAX + 1]).is_err());
        assert!(check(b"").is_err());
        assert!(check(&[0xff, b'\n']).is_err());
    }
}
