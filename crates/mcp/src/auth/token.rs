//! Static bearer tokens: configured as SHA-256 hashes, each naming a principal and its groups.
//!
//! The configuration never holds a token, only `sha256(token)` in hex, so a leaked config file
//! gives no credential. A presented token is hashed and compared with every configured hash in
//! constant time (`subtle`), without stopping at the first match. [`generate`] makes a new token
//! from the operating system's random source (`ring0 token add` prints it once).

use ring0_core::Principal;
use ring0_core::principal::{PRINCIPAL_GROUPS_MAX, PRINCIPAL_ID_BYTES_MAX};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Random bytes in a generated token (256 bits).
pub const TOKEN_RANDOM_BYTES: usize = 32;
/// The prefix of generated tokens (so a leaked one is recognizable in a scan).
pub const TOKEN_PREFIX: &str = "r0t_";
/// Most `[[auth.tokens]]` entries.
pub const TOKENS_MAX: usize = 1024;

/// One `[[auth.tokens]]` entry.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Names the token (in the log; `ring0 token add NAME`). Required, unique.
    pub name: String,
    /// `sha256(token)`, 64 lowercase hex digits. Required.
    pub sha256: String,
    /// The principal the token authenticates as. Default: the token's `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The principal's groups. Default none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

impl TokenEntry {
    /// The principal id this entry names.
    pub fn principal_id(&self) -> &str {
        self.principal.as_deref().unwrap_or(&self.name)
    }
}

/// `sha256(token)` as lowercase hex: the form the configuration stores.
pub fn hash_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A new token: [`TOKEN_PREFIX`] and [`TOKEN_RANDOM_BYTES`] random bytes, base64url.
pub fn generate() -> Result<String, String> {
    use base64::Engine;
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "the system's random source failed".to_string())?;
    Ok(format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// Checks a principal id or group name from configuration.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > PRINCIPAL_ID_BYTES_MAX {
        return Err(format!(
            "{what} must be 1 to {PRINCIPAL_ID_BYTES_MAX} bytes"
        ));
    }
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "{what} {name:?} holds whitespace or a control character"
        ));
    }
    Ok(())
}

/// Checks the entries: names unique, hashes well-formed and unique, principals and groups sane.
pub fn validate(entries: &[TokenEntry]) -> Result<(), String> {
    if entries.len() > TOKENS_MAX {
        return Err(format!("auth.tokens: more than {TOKENS_MAX} entries"));
    }
    let mut names = std::collections::BTreeSet::new();
    let mut hashes = std::collections::BTreeSet::new();
    for (i, t) in entries.iter().enumerate() {
        let key = |k: &str| format!("auth.tokens[{i}].{k}");
        check_name("the name", &t.name).map_err(|why| format!("{}: {why}", key("name")))?;
        if !names.insert(t.name.as_str()) {
            return Err(format!("{}: {:?} is used twice", key("name"), t.name));
        }
        if t.sha256.len() != 64
            || !t
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "{}: must be 64 lowercase hex digits (sha256 of the token)",
                key("sha256")
            ));
        }
        if !hashes.insert(t.sha256.as_str()) {
            return Err(format!("{}: the same hash is given twice", key("sha256")));
        }
        check_name("the principal", t.principal_id())
            .map_err(|why| format!("{}: {why}", key("principal")))?;
        if t.principal_id() == Principal::LOCAL_ID {
            return Err(format!(
                "{}: {:?} is reserved for the local user (stdio, or HTTP without credentials)",
                key("principal"),
                Principal::LOCAL_ID
            ));
        }
        if t.groups.len() > PRINCIPAL_GROUPS_MAX {
            return Err(format!(
                "{}: more than {PRINCIPAL_GROUPS_MAX} groups",
                key("groups")
            ));
        }
        for g in &t.groups {
            check_name("a group", g).map_err(|why| format!("{}: {why}", key("groups")))?;
        }
    }
    Ok(())
}

/// The static tokens, ready for lookups.
pub struct StaticTokens {
    entries: Vec<([u8; 32], Principal)>,
}

impl StaticTokens {
    /// From validated entries, plus `extra`: tokens given directly (hashed here) with their
    /// principal.
    pub fn new(entries: &[TokenEntry], extra: Vec<(String, Principal)>) -> Self {
        let mut out: Vec<([u8; 32], Principal)> = entries
            .iter()
            .filter_map(|t| {
                let bytes = decode_hex(&t.sha256)?;
                let principal = Principal::new(t.principal_id()).with_groups(t.groups.clone());
                Some((bytes, principal))
            })
            .collect();
        for (token, principal) in extra {
            out.push((Sha256::digest(token.as_bytes()).into(), principal));
        }
        Self { entries: out }
    }

    /// Whether no token is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal of `token`, comparing its hash with every entry in constant time.
    pub fn lookup(&self, token: &str) -> Option<Principal> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (hash, principal) in &self.entries {
            if bool::from(hash.ct_eq(&presented)) && found.is_none() {
                found = Some(principal);
            }
        }
        found.cloned()
    }
}

fn decode_hex(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, token: &str) -> TokenEntry {
        TokenEntry {
            name: name.into(),
            sha256: hash_hex(token),
            principal: None,
            groups: vec!["ops".into()],
        }
    }

    #[test]
    fn the_hash_is_sha256_in_lowercase_hex() {
        // sha256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            hash_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_token_authenticates_as_its_entry_and_no_other() {
        let tokens = StaticTokens::new(&[entry("alice", "ta"), entry("bob", "tb")], vec![]);
        let a = tokens.lookup("ta").expect("alice's token");
        assert_eq!(a.id, "alice");
        assert_eq!(a.groups, vec!["ops".to_string()]);
        assert_eq!(tokens.lookup("tb").map(|p| p.id), Some("bob".into()));
        assert_eq!(tokens.lookup("tc"), None);
        assert_eq!(tokens.lookup(""), None);
        assert_eq!(tokens.lookup(&hash_hex("ta")), None, "the hash is no token");
    }

    #[test]
    fn generated_tokens_are_long_distinct_and_prefixed() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX), "{a}");
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 43, "{a}");
        assert!(!a.contains('.'), "never mistaken for a JWT: {a}");
    }

    #[test]
    fn entries_with_bad_hashes_duplicate_names_or_the_local_principal_are_refused() {
        let mut bad = entry("a", "t");
        bad.sha256 = "ABC".into();
        assert!(
            validate(&[bad])
                .unwrap_err()
                .contains("auth.tokens[0].sha256")
        );
        let e = validate(&[entry("a", "t1"), entry("a", "t2")]).unwrap_err();
        assert!(e.contains("auth.tokens[1].name"), "{e}");
        let mut local = entry("a", "t");
        local.principal = Some("local".into());
        assert!(validate(&[local]).unwrap_err().contains("reserved"));
        let mut spaced = entry("a", "t");
        spaced.groups = vec!["two words".into()];
        assert!(validate(&[spaced]).unwrap_err().contains("groups"));
        assert_eq!(validate(&[entry("a", "t1"), entry("b", "t2")]), Ok(()));
    }
}
