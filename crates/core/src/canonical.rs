//! RFC 8785 (JCS) canonical JSON.
//!
//! Identity in ring0 is a hash of canonical bytes, so canonicalization must be faithful: input
//! that cannot be represented exactly is refused with a [`CanonicalError`] rather than hashed as
//! something else. Two things are refused:
//! - duplicate object keys (`{"a":1,"a":2}`): parsers disagree on which one wins;
//! - integers beyond ±2^53: JCS serializes numbers as IEEE-754 doubles, so `9007199254740993`
//!   would silently become `9007199254740992`.
//!
//! Serialization itself is `serde_json_canonicalizer`'s.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;

/// The largest integer magnitude an IEEE-754 double represents exactly (2^53).
pub const SAFE_INTEGER_MAX: u64 = 1 << 53;

/// Why a JSON text or value cannot be canonicalized faithfully.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    #[error("invalid JSON: {0}")]
    Syntax(String),
    #[error("duplicate object key {key:?}: the value it names is ambiguous")]
    DuplicateKey { key: String },
    #[error(
        "integer {literal} is beyond ±2^53 and cannot be represented exactly; send it as a string"
    )]
    UnsafeInteger { literal: String },
}

/// Parses JSON text, refusing duplicate keys and integers beyond ±2^53.
pub fn parse_strict(text: &str) -> Result<Value, CanonicalError> {
    scan_integer_literals(text)?;
    let mut de = serde_json::Deserializer::from_str(text);
    let value = StrictValue::deserialize(&mut de).map_err(|e| {
        let msg = e.to_string();
        match msg.strip_prefix(DUPLICATE_PREFIX) {
            Some(rest) => CanonicalError::DuplicateKey {
                key: rest.split(" at line").next().unwrap_or(rest).to_string(),
            },
            None => CanonicalError::Syntax(msg),
        }
    })?;
    de.end()
        .map_err(|e| CanonicalError::Syntax(e.to_string()))?;
    Ok(value.0)
}

/// Serializes a value to its RFC 8785 canonical bytes.
pub fn canonicalize(value: &Value) -> Result<Vec<u8>, CanonicalError> {
    check_numbers(value)?;
    serde_json_canonicalizer::to_vec(value).map_err(|e| CanonicalError::Syntax(e.to_string()))
}

/// Canonical bytes as a `String` (JCS output is always UTF-8).
pub fn canonical_string(value: &Value) -> Result<String, CanonicalError> {
    canonicalize(value).map(|bytes| String::from_utf8(bytes).expect("JCS output is UTF-8"))
}

fn check_numbers(value: &Value) -> Result<(), CanonicalError> {
    match value {
        Value::Number(n) => check_number(n),
        Value::Array(items) => items.iter().try_for_each(check_numbers),
        Value::Object(map) => map.values().try_for_each(check_numbers),
        _ => Ok(()),
    }
}

fn check_number(n: &Number) -> Result<(), CanonicalError> {
    let unsafe_int = match (n.as_u64(), n.as_i64()) {
        (Some(u), _) => u > SAFE_INTEGER_MAX,
        (None, Some(i)) => i.unsigned_abs() > SAFE_INTEGER_MAX,
        (None, None) => false,
    };
    if unsafe_int {
        return Err(CanonicalError::UnsafeInteger {
            literal: n.to_string(),
        });
    }
    Ok(())
}

/// Finds integer literals too large for a double before serde_json turns the ones beyond u64 into
/// lossy floats. A hand-written scan because no JSON library reports a number's lexical form
/// without a crate-wide feature (`arbitrary_precision`) that would change every other parse.
fn scan_integer_literals(text: &str) -> Result<(), CanonicalError> {
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut in_string = false;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += 1;
                while i < bytes.len()
                    && matches!(bytes[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    i += 1;
                }
                let token = &text[start..i];
                let is_integer = !token.contains(['.', 'e', 'E']);
                let digits = token.trim_start_matches('-');
                if is_integer && digits.len() >= 16 {
                    let too_big = digits.len() > 20
                        || digits
                            .parse::<u128>()
                            .map_or(true, |v| v > SAFE_INTEGER_MAX as u128);
                    if too_big {
                        return Err(CanonicalError::UnsafeInteger {
                            literal: token.to_string(),
                        });
                    }
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

const DUPLICATE_PREFIX: &str = "duplicate key ";

/// A `serde_json::Value` whose deserialization refuses duplicate keys.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("non-finite number"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            if map.contains_key(&key) {
                return Err(de::Error::custom(format_args!("{DUPLICATE_PREFIX}{key}")));
            }
            let StrictValue(v) = access.next_value()?;
            map.insert(key, v);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let err = parse_strict(r#"{"a":{"b":1,"b":2}}"#).unwrap_err();
        assert_eq!(err, CanonicalError::DuplicateKey { key: "b".into() });
    }

    #[test]
    fn integers_beyond_two_to_the_53_are_refused() {
        assert!(parse_strict("9007199254740992").is_ok());
        for text in [
            "9007199254740993",
            "-9007199254740993",
            "[123456789012345678901234567890]",
            r#"{"amount":18446744073709551616}"#,
        ] {
            assert!(
                matches!(
                    parse_strict(text),
                    Err(CanonicalError::UnsafeInteger { .. })
                ),
                "{text}"
            );
        }
        assert!(matches!(
            canonicalize(&json!({"n": 9007199254740993u64})),
            Err(CanonicalError::UnsafeInteger { .. })
        ));
    }

    #[test]
    fn digits_inside_strings_and_floats_are_not_integers() {
        assert!(parse_strict(r#"{"id":"123456789012345678901234567890"}"#).is_ok());
        assert!(parse_strict("[1.0e300, 12345678901234567890.5]").is_ok());
        assert!(parse_strict(r#"{"s":"a\"123456789012345678901\""}"#).is_ok());
    }

    #[test]
    fn canonical_form_sorts_keys_and_normalizes_numbers() {
        let v =
            parse_strict(r#"{"b": 1.0, "a": [1e2, "x"], "c": {"z": null, "y": true}}"#).unwrap();
        assert_eq!(
            canonical_string(&v).unwrap(),
            r#"{"a":[100,"x"],"b":1,"c":{"y":true,"z":null}}"#
        );
    }

    #[test]
    fn syntax_errors_are_reported_not_panicked() {
        assert!(matches!(parse_strict("{"), Err(CanonicalError::Syntax(_))));
        assert!(matches!(
            parse_strict("[1] x"),
            Err(CanonicalError::Syntax(_))
        ));
    }
}
