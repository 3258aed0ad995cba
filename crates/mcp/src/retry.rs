//! What a client says about a call's identity across retries: its idempotency key and the scope
//! its calls belong to.
//!
//! - **Idempotency key**: `params.idempotencyKey` (the field of the MCP idempotency proposal) or
//!   `_meta["io.ring0/idempotency-key"]`. rmcp's typed request drops the unmodelled
//!   `params.idempotencyKey`, so the transports lift it into the request's `_meta` under
//!   [`LIFTED_KEY_META_KEY`] before rmcp decodes the message ([`lift_wire_fields`]): the key then
//!   travels inside the request it belongs to. Both given and different is refused.
//! - **Scope**: `_meta["io.ring0/scope"]` keeps one conversation's scope across reconnects and
//!   eras. It is bound to the principal ([`client_scope`]): two principals naming the same scope
//!   string get two scopes. Without it, a sessionful session's calls share the session's scope, a
//!   stateless 2026-07-28 request's calls share the principal's ([`principal_scope`]), and stdio
//!   keeps `--scope` (or a scope of its own per connection).
//!
//! ring0's own `_meta` keys are read here and never sent upstream: an upstream call's `_meta` is
//! built by ring0 afresh (`crate::upstream`).

use crate::limits::{IDEMPOTENCY_KEY_BYTES_MAX, SCOPE_BYTES_MAX};
use ring0_core::Principal;
use serde_json::{Map, Value, json};

/// `_meta` key of a call's idempotency key.
pub const IDEMPOTENCY_META_KEY: &str = "io.ring0/idempotency-key";
/// `_meta` key of the scope a client keeps across connections.
pub const SCOPE_META_KEY: &str = "io.ring0/scope";
/// `_meta` key the transports move `params.idempotencyKey` to, so that it survives rmcp's typed
/// request. A client that sends it itself has sent `params.idempotencyKey` by another name.
pub const LIFTED_KEY_META_KEY: &str = "io.ring0/params-idempotency-key";
/// The field of the MCP idempotency proposal.
const PARAMS_KEY_FIELD: &str = "idempotencyKey";

/// What a `tools/call` says about its identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallIdentity {
    /// The client's idempotency key, if it sent one.
    pub idempotency_key: Option<String>,
    /// The scope the client named, as it named it (not yet bound to the principal).
    pub scope: Option<String>,
}

/// Why a call's identity fields were refused: a JSON-RPC invalid-params error whose `data`
/// names the field, the kind and the bound.
#[derive(Debug, Clone, PartialEq)]
pub struct IdentityError {
    pub message: String,
    pub data: Value,
}

impl IdentityError {
    fn new(field: &str, kind: &str, message: String) -> Self {
        Self {
            data: json!({"kind": kind, "field": field, "message": message}),
            message,
        }
    }
}

/// Reads the identity fields from a request's `_meta` objects (rmcp keeps some in the request
/// context and some in the params; each is looked up in both).
pub fn read(metas: &[&Map<String, Value>]) -> Result<CallIdentity, IdentityError> {
    let meta_key = text_field(metas, IDEMPOTENCY_META_KEY, IDEMPOTENCY_KEY_BYTES_MAX)?;
    let lifted = text_field(metas, LIFTED_KEY_META_KEY, IDEMPOTENCY_KEY_BYTES_MAX)?;
    let idempotency_key = match (meta_key, lifted) {
        (Some(a), Some(b)) if a != b => {
            return Err(IdentityError::new(
                PARAMS_KEY_FIELD,
                "idempotency_key_mismatch",
                format!(
                    "params.{PARAMS_KEY_FIELD} and _meta[{IDEMPOTENCY_META_KEY:?}] differ; send \
                     one key"
                ),
            ));
        }
        (a, b) => a.or(b),
    };
    let scope = text_field(metas, SCOPE_META_KEY, SCOPE_BYTES_MAX)?;
    Ok(CallIdentity {
        idempotency_key,
        scope,
    })
}

/// A non-empty string of at most `max` bytes at `key` in the first `_meta` that has it.
fn text_field(
    metas: &[&Map<String, Value>],
    key: &str,
    max: usize,
) -> Result<Option<String>, IdentityError> {
    let Some(value) = metas.iter().find_map(|m| m.get(key)) else {
        return Ok(None);
    };
    let field = if key == LIFTED_KEY_META_KEY {
        format!("params.{PARAMS_KEY_FIELD}")
    } else {
        format!("_meta[{key:?}]")
    };
    let Some(text) = value.as_str() else {
        return Err(IdentityError::new(
            &field,
            "invalid_type",
            format!("{field} must be a string"),
        ));
    };
    if text.is_empty() || text.len() > max {
        return Err(IdentityError::new(
            &field,
            "invalid_length",
            format!(
                "{field} must be 1 to {max} bytes long (it is {} bytes)",
                text.len()
            ),
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(IdentityError::new(
            &field,
            "invalid_characters",
            format!("{field} must not contain control characters"),
        ));
    }
    Ok(Some(text.to_string()))
}

/// The kernel scope of a scope a client named: bound to its principal, so that another
/// principal naming the same string gets a scope of its own. The principal's id goes first,
/// prefixed by its length, so no pair of (principal, scope) maps to another's.
pub fn client_scope(principal: &Principal, scope: &str) -> String {
    format!("client:{}:{}:{scope}", principal.id.len(), principal.id)
}

/// The kernel scope of a principal's stateless (2026-07-28) requests that name no scope.
pub fn principal_scope(principal: &Principal) -> String {
    format!("principal:{}:{}", principal.id.len(), principal.id)
}

/// Moves `params.idempotencyKey` of every `tools/call` in a JSON-RPC message (or batch) into
/// `params._meta[LIFTED_KEY_META_KEY]`, where rmcp's typed request keeps it. Returns whether the
/// message changed.
pub fn lift_wire_fields(message: &mut Value) -> bool {
    match message {
        // Every entry is lifted (no short circuit), then whether any changed.
        Value::Array(batch) => batch
            .iter_mut()
            .map(lift_one)
            .collect::<Vec<bool>>()
            .contains(&true),
        other => lift_one(other),
    }
}

fn lift_one(message: &mut Value) -> bool {
    if message.get("method").and_then(Value::as_str) != Some("tools/call") {
        return false;
    }
    let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) else {
        return false;
    };
    let Some(key) = params.remove(PARAMS_KEY_FIELD) else {
        return false;
    };
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    match meta.as_object_mut() {
        Some(meta) => {
            meta.insert(LIFTED_KEY_META_KEY.into(), key);
        }
        // A `_meta` that is not an object is rmcp's to refuse; the key goes with it.
        None => {
            params.insert(PARAMS_KEY_FIELD.into(), key);
            return false;
        }
    }
    true
}

/// [`lift_wire_fields`] over one serialized message: `None` when it has nothing to lift (the
/// common case, decided without parsing).
pub fn lift_wire_bytes(bytes: &[u8]) -> Option<Vec<u8>> {
    memchr::memmem::find(bytes, PARAMS_KEY_FIELD.as_bytes())?;
    let mut message: Value = serde_json::from_slice(bytes).ok()?;
    if !lift_wire_fields(&mut message) {
        return None;
    }
    serde_json::to_vec(&message).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn the_params_key_is_lifted_into_meta_and_read_from_there() {
        let mut m = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": "t", "idempotencyKey": "k-1"}});
        assert!(lift_wire_fields(&mut m));
        assert!(m["params"].get("idempotencyKey").is_none());
        let meta = m["params"]["_meta"].as_object().unwrap();
        let id = read(&[meta]).unwrap();
        assert_eq!(id.idempotency_key.as_deref(), Some("k-1"));
    }

    #[test]
    fn only_tools_calls_are_lifted_and_batches_entry_by_entry() {
        let mut batch = json!([
            {"jsonrpc": "2.0", "id": 1, "method": "prompts/get", "params": {"idempotencyKey": "x"}},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "t", "idempotencyKey": "y"}}
        ]);
        assert!(lift_wire_fields(&mut batch));
        assert_eq!(batch[0]["params"]["idempotencyKey"], "x");
        assert_eq!(batch[1]["params"]["_meta"][LIFTED_KEY_META_KEY], "y");
        assert!(lift_wire_bytes(br#"{"method":"tools/call","params":{"name":"t"}}"#).is_none());
    }

    #[test]
    fn two_different_keys_are_refused_with_a_structured_error() {
        let m = meta(json!({IDEMPOTENCY_META_KEY: "a", LIFTED_KEY_META_KEY: "b"}));
        let e = read(&[&m]).unwrap_err();
        assert_eq!(e.data["kind"], "idempotency_key_mismatch");
        let same = meta(json!({IDEMPOTENCY_META_KEY: "a", LIFTED_KEY_META_KEY: "a"}));
        assert_eq!(
            read(&[&same]).unwrap().idempotency_key.as_deref(),
            Some("a")
        );
    }

    #[test]
    fn a_scope_or_key_beyond_its_bound_or_not_a_string_is_refused() {
        let long = meta(json!({SCOPE_META_KEY: "s".repeat(SCOPE_BYTES_MAX + 1)}));
        let e = read(&[&long]).unwrap_err();
        assert_eq!(e.data["kind"], "invalid_length");
        assert!(
            e.message.contains(&SCOPE_BYTES_MAX.to_string()),
            "{}",
            e.message
        );
        let number = meta(json!({IDEMPOTENCY_META_KEY: 7}));
        assert_eq!(read(&[&number]).unwrap_err().data["kind"], "invalid_type");
        let empty = meta(json!({SCOPE_META_KEY: ""}));
        assert_eq!(read(&[&empty]).unwrap_err().data["kind"], "invalid_length");
        let control = meta(json!({SCOPE_META_KEY: "a\nb"}));
        assert_eq!(
            read(&[&control]).unwrap_err().data["kind"],
            "invalid_characters"
        );
        let fits = meta(json!({SCOPE_META_KEY: "s".repeat(SCOPE_BYTES_MAX)}));
        assert!(read(&[&fits]).unwrap().scope.is_some());
    }

    #[test]
    fn a_named_scope_is_bound_to_its_principal() {
        let alice = Principal::new("alice");
        let bob = Principal::new("bob");
        assert_ne!(client_scope(&alice, "conv"), client_scope(&bob, "conv"));
        // No principal id and scope can be arranged to name another principal's scope.
        let tricky = Principal::new("alice:1");
        assert_ne!(
            client_scope(&tricky, "conv"),
            client_scope(&alice, "1:conv")
        );
        assert_ne!(client_scope(&alice, "x"), principal_scope(&alice));
    }
}
