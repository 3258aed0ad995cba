//! Identity of a call: the semantic key and the repeat fingerprint.
//!
//! The model's tool-call id is evidence, never identity. A call's identity is
//! `sha256(version ‖ JCS({tool, prepared_args, scope, epoch}))`, computed from the prepared
//! arguments — the same bytes the executor receives. The version is part of the hash so that a
//! change of canonicalizer can never make two different intents collide with old keys; the
//! journal also stores it and refuses to merge keys across versions.

use crate::canonical::{CanonicalError, canonicalize};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::fmt;

/// Version of the canonicalizer and of the key layout below. Bump on any change to either.
pub const CANONICALIZER_VERSION: u32 = 1;

/// A 32-byte SHA-256 digest, shown as lowercase hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest32(pub [u8; 32]);

impl Digest32 {
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(char::from_digit((b >> 4) as u32, 16).expect("nibble"));
            s.push(char::from_digit((b & 0xf) as u32, 16).expect("nibble"));
        }
        s
    }

    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
            let text = std::str::from_utf8(chunk).ok()?;
            out[i] = u8::from_str_radix(text, 16).ok()?;
        }
        Some(Self(out))
    }

    fn of(version: u32, canonical: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(version.to_be_bytes());
        h.update(canonical);
        Self(h.finalize().into())
    }
}

impl fmt::Debug for Digest32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl fmt::Display for Digest32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

macro_rules! digest_newtype {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
        pub struct $name {
            pub version: u32,
            pub digest: Digest32,
        }

        impl $name {
            /// `v<version>:<hex>`, the stored and displayed form.
            pub fn encode(&self) -> String {
                format!("v{}:{}", self.version, self.digest)
            }

            pub fn decode(text: &str) -> Option<Self> {
                let (v, hex) = text.strip_prefix('v')?.split_once(':')?;
                Some(Self {
                    version: v.parse().ok()?,
                    digest: Digest32::from_hex(hex)?,
                })
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.encode())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.encode())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                Self::decode(&text).ok_or_else(|| {
                    serde::de::Error::custom(concat!("malformed ", stringify!($name)))
                })
            }
        }
    };
}

digest_newtype!(
    SemanticKey,
    "Identity of one intent: tool, prepared arguments, user-intent scope and attempt epoch."
);
digest_newtype!(
    Fingerprint,
    "Tool plus canonical prepared arguments: what exact-repeat detection and memoization compare."
);

/// What a logical call is scoped to, besides its tool, arguments and epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallIdentity<'a> {
    /// A call without an explicit key: its principal's user-intent scope.
    Scope { principal: &'a str, scope: &'a str },
    /// A call with the caller's explicit idempotency key: its principal and that key.
    Key { principal: &'a str, key: &'a str },
}

impl SemanticKey {
    /// Computes the key with the current [`CANONICALIZER_VERSION`].
    pub fn compute(
        tool: &str,
        prepared_args: &Value,
        scope: &str,
        epoch: u64,
    ) -> Result<Self, CanonicalError> {
        let doc =
            json!({"tool": tool, "prepared_args": prepared_args, "scope": scope, "epoch": epoch});
        let bytes = canonicalize(&doc)?;
        Ok(Self {
            version: CANONICALIZER_VERSION,
            digest: Digest32::of(CANONICALIZER_VERSION, &bytes),
        })
    }

    /// The same key from arguments already in RFC 8785 form (`canonical_args`), without
    /// canonicalizing them again. The document is assembled in JCS key order.
    pub fn from_canonical_args(
        tool: &str,
        canonical_args: &str,
        scope: &str,
        epoch: u64,
    ) -> Result<Self, CanonicalError> {
        let tool = crate::canonical::canonical_string(&Value::String(tool.into()))?;
        let scope = crate::canonical::canonical_string(&Value::String(scope.into()))?;
        let doc = format!(
            "{{\"epoch\":{epoch},\"prepared_args\":{canonical_args},\"scope\":{scope},\"tool\":{tool}}}"
        );
        Ok(Self {
            version: CANONICALIZER_VERSION,
            digest: Digest32::of(CANONICALIZER_VERSION, doc.as_bytes()),
        })
    }

    /// The key of one logical call: tool, canonical prepared arguments, epoch, and what it is
    /// scoped to ([`CallIdentity`]). A call of the local principal without an explicit key has
    /// the key [`SemanticKey::from_canonical_args`] gives for its scope; any other principal is
    /// part of the document too, so two principals never share an intent; an explicitly keyed
    /// call is named by its principal and key instead of its scope, so a retry from another
    /// scope (a reconnect) finds it.
    pub fn for_call(
        tool: &str,
        canonical_args: &str,
        identity: &CallIdentity<'_>,
        epoch: u64,
    ) -> Result<Self, CanonicalError> {
        let text = |s: &str| crate::canonical::canonical_string(&Value::String(s.into()));
        let doc = match *identity {
            CallIdentity::Scope { principal, scope } if principal == crate::Principal::LOCAL_ID => {
                return Self::from_canonical_args(tool, canonical_args, scope, epoch);
            }
            CallIdentity::Scope { principal, scope } => format!(
                "{{\"epoch\":{epoch},\"prepared_args\":{canonical_args},\"principal\":{},\"scope\":{},\"tool\":{}}}",
                text(principal)?,
                text(scope)?,
                text(tool)?
            ),
            CallIdentity::Key { principal, key } => format!(
                "{{\"epoch\":{epoch},\"idempotency_key\":{},\"prepared_args\":{canonical_args},\"principal\":{},\"tool\":{}}}",
                text(key)?,
                text(principal)?,
                text(tool)?
            ),
        };
        Ok(Self {
            version: CANONICALIZER_VERSION,
            digest: Digest32::of(CANONICALIZER_VERSION, doc.as_bytes()),
        })
    }

    /// The provider idempotency key derived from this key and the attempt epoch: stable across
    /// model retries (it never involves the model's call id), distinct per epoch.
    pub fn idempotency_key(&self, epoch: u64) -> String {
        let mut h = Sha256::new();
        h.update(b"ring0-idempotency\0");
        h.update(self.encode().as_bytes());
        h.update(epoch.to_be_bytes());
        let d = Digest32(h.finalize().into());
        format!("r0-{}", &d.to_hex()[..40])
    }
}

impl Fingerprint {
    /// The fingerprint from arguments already in RFC 8785 form, without canonicalizing again.
    pub fn from_canonical_args(tool: &str, canonical_args: &str) -> Result<Self, CanonicalError> {
        let tool = crate::canonical::canonical_string(&Value::String(tool.into()))?;
        let doc = format!("{{\"args\":{canonical_args},\"tool\":{tool}}}");
        Ok(Self {
            version: CANONICALIZER_VERSION,
            digest: Digest32::of(CANONICALIZER_VERSION, doc.as_bytes()),
        })
    }

    pub fn compute(tool: &str, prepared_args: &Value) -> Result<Self, CanonicalError> {
        let bytes = canonicalize(&json!({"tool": tool, "args": prepared_args}))?;
        Ok(Self {
            version: CANONICALIZER_VERSION,
            digest: Digest32::of(CANONICALIZER_VERSION, &bytes),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_identity_separates_principals_and_keys_from_scopes() {
        let args = r#"{"n":1}"#;
        let key = |id: CallIdentity<'_>| SemanticKey::for_call("t", args, &id, 0).unwrap();
        let local = key(CallIdentity::Scope {
            principal: "local",
            scope: "s",
        });
        assert_eq!(
            local,
            SemanticKey::from_canonical_args("t", args, "s", 0).unwrap()
        );
        let alice = key(CallIdentity::Scope {
            principal: "alice",
            scope: "s",
        });
        let keyed = key(CallIdentity::Key {
            principal: "alice",
            key: "s",
        });
        let bob_keyed = key(CallIdentity::Key {
            principal: "bob",
            key: "s",
        });
        assert!(local != alice && alice != keyed && keyed != bob_keyed && local != keyed);
    }

    #[test]
    fn semantic_key_ignores_key_order_and_number_spelling() {
        let a =
            SemanticKey::compute("refund", &json!({"amount": 20, "to": "x"}), "u:1", 0).unwrap();
        let b =
            SemanticKey::compute("refund", &json!({"to": "x", "amount": 20.0}), "u:1", 0).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn semantic_key_separates_scope_epoch_and_tool() {
        let args = json!({"amount": 20});
        let base = SemanticKey::compute("refund", &args, "u:1", 0).unwrap();
        assert_ne!(
            base,
            SemanticKey::compute("refund", &args, "u:2", 0).unwrap()
        );
        assert_ne!(
            base,
            SemanticKey::compute("refund", &args, "u:1", 1).unwrap()
        );
        assert_ne!(
            base,
            SemanticKey::compute("charge", &args, "u:1", 0).unwrap()
        );
    }

    #[test]
    fn keys_from_canonical_text_equal_keys_from_values() {
        let args = json!({"b": [1.0, "x"], "a": {"z": null}});
        let canonical = crate::canonical::canonical_string(&args).unwrap();
        assert_eq!(
            SemanticKey::from_canonical_args("t\"q", &canonical, "s/1", 9).unwrap(),
            SemanticKey::compute("t\"q", &args, "s/1", 9).unwrap()
        );
        assert_eq!(
            Fingerprint::from_canonical_args("t", &canonical).unwrap(),
            Fingerprint::compute("t", &args).unwrap()
        );
    }

    #[test]
    fn keys_round_trip_through_their_text_form() {
        let k = SemanticKey::compute("t", &json!({}), "s", 3).unwrap();
        assert_eq!(SemanticKey::decode(&k.encode()), Some(k));
        assert!(k.encode().starts_with("v1:"));
        assert_eq!(SemanticKey::decode("v1:zz"), None);
    }

    #[test]
    fn idempotency_key_is_stable_and_epoch_bound() {
        let k = SemanticKey::compute("t", &json!({"a": 1}), "s", 0).unwrap();
        assert_eq!(k.idempotency_key(0), k.idempotency_key(0));
        assert_ne!(k.idempotency_key(0), k.idempotency_key(1));
    }
}
