//! Qualified tool names: `alias__tool`.
//!
//! Tools of upstream servers are exposed under their connection's alias so that two servers can
//! both have a `search` tool. The separator must be valid in every major provider API's function
//! names, since the catalog ring0 serves is handed on to models: OpenAI accepts
//! `^[a-zA-Z0-9_-]{1,64}$`, Anthropic `^[a-zA-Z0-9_-]{1,64}$`, Gemini letters, digits, `_ . : -`
//! up to 64 starting with a letter or `_`. A dot (`alias.tool`) is refused by OpenAI and Anthropic,
//! so the separator is a double underscore, and aliases may not contain one (nor end in `_`), which
//! makes the split unambiguous. Characters of an upstream tool name outside `[A-Za-z0-9_-]` (MCP
//! also allows `.`) are replaced by `-`; two upstream names that map to the same qualified name
//! are both refused as duplicates rather than one shadowing the other.

use crate::limits::{ALIAS_BYTES_MAX, QUALIFIED_NAME_BYTES_MAX};

/// Between the alias and the upstream tool name.
pub const SEPARATOR: &str = "__";

/// Why an alias is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "upstream alias {0:?} must start with a letter, use only letters, digits, '_' and '-', \
     contain no \"__\", not end in '_', and be at most {ALIAS_BYTES_MAX} bytes"
)]
pub struct InvalidAlias(pub String);

/// Checks an alias.
pub fn check_alias(alias: &str) -> Result<(), InvalidAlias> {
    let ok = !alias.is_empty()
        && alias.len() <= ALIAS_BYTES_MAX
        && alias.as_bytes()[0].is_ascii_alphabetic()
        && alias
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !alias.contains(SEPARATOR)
        && !alias.ends_with('_');
    if ok {
        Ok(())
    } else {
        Err(InvalidAlias(alias.to_string()))
    }
}

/// Why an upstream tool cannot be exposed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("tool name is empty")]
    Empty,
    #[error("qualified name {0:?} is longer than {QUALIFIED_NAME_BYTES_MAX} bytes")]
    TooLong(String),
}

/// The qualified name of an upstream tool.
pub fn qualify(alias: &str, tool: &str) -> Result<String, NameError> {
    if tool.is_empty() {
        return Err(NameError::Empty);
    }
    let mapped: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = format!("{alias}{SEPARATOR}{mapped}");
    if name.len() > QUALIFIED_NAME_BYTES_MAX {
        return Err(NameError::TooLong(name));
    }
    Ok(name)
}

/// The exposed name of an upstream tool or prompt: qualified, or (without a namespace) the
/// server's own name with the same character mapping.
pub fn expose(alias: &str, tool: &str, namespace: bool) -> Result<String, NameError> {
    if namespace {
        return qualify(alias, tool);
    }
    let q = qualify(alias, tool)?;
    Ok(q[alias.len() + SEPARATOR.len()..].to_string())
}

/// Splits a qualified name into alias and (mapped) tool name; `None` for a built-in name.
pub fn split(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names_use_only_characters_every_provider_accepts() {
        let name = qualify("fs", "read.file/v2").unwrap();
        assert_eq!(name, "fs__read-file-v2");
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        );
    }

    #[test]
    fn split_is_unambiguous_for_valid_aliases() {
        let name = qualify("my_srv", "do__it").unwrap();
        assert_eq!(split(&name), Some(("my_srv", "do__it")));
    }

    #[test]
    fn aliases_that_would_make_the_split_ambiguous_are_refused() {
        assert!(check_alias("a__b").is_err());
        assert!(check_alias("ab_").is_err());
        assert!(check_alias("9ab").is_err());
        assert!(check_alias("a.b").is_err());
        assert!(check_alias("files-2").is_ok());
    }

    #[test]
    fn names_over_the_provider_limit_are_refused() {
        let long = "x".repeat(70);
        assert!(matches!(qualify("a", &long), Err(NameError::TooLong(_))));
    }
}
