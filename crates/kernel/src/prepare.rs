//! Prepare: a proposed call becomes a [`PreparedCall`] or a structured [`Rejection`].
//!
//! In order: tool lookup, argument decoding (strict JSON, size and depth limits, double-encoded
//! strings decoded once), defaults (unless the spec says `apply_schema_defaults: false`), schema
//! validation reporting every error, policy rewriting (validated again), integral floats made
//! integers where the schema asks for one, fingerprinting, authorization, and conflict-key
//! resolution. All of it
//! finishes before anything is dispatched.

// A rejection is an ordinary result of preparation, returned once per call; boxing it would
// only add an allocation to the common path.
#![allow(clippy::result_large_err)]

use crate::compat::{apply_defaults, decode_double_encoded, integers_as_integers};
use crate::policy::{
    AuthAdmission, AuthDecision, AuthRequest, Authorizer, PolicyRewrite, SessionInfo,
};
use crate::registry::{RegisteredTool, Registry};
use crate::validate::{echo, validate};
use ring0_core::call::{FREE_FORM_INPUT, RejectionKind};
use ring0_core::canonical::{canonical_string, parse_strict};
use ring0_core::limits::{ARGUMENT_BYTES_MAX, ARGUMENT_DEPTH_MAX, IDEMPOTENCY_KEY_BYTES_MAX};
use ring0_core::{
    FieldError, Fingerprint, PreparedCall, ProposedArguments, ProposedCall, Rejection,
};
use serde_json::Value;
use std::sync::Arc;

/// A call that passed preparation, with the tool it will run.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub call: PreparedCall,
    pub tool: Arc<RegisteredTool>,
    /// The caller's explicit idempotency key, checked.
    pub idempotency_key: Option<String>,
    /// The authorizer holds this call for a person ([`crate::AuthAdmission::Hold`]): asked
    /// right before dispatch, once the journal decided the call runs.
    pub hold: bool,
}

/// Everything preparation needs besides the call.
pub struct PrepareContext<'a> {
    pub registry: &'a Registry,
    pub session: &'a SessionInfo,
    pub authorizer: &'a dyn Authorizer,
    pub rewrites: &'a [Arc<dyn PolicyRewrite>],
    pub events: Option<crate::tool::EventSink>,
    /// What the host attached to the round, for the authorizer.
    pub extensions: &'a crate::tool::CallExtensions,
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Decodes the provider's arguments into a JSON object candidate.
fn decode_arguments(call: &ProposedCall) -> Result<Value, Rejection> {
    let reject = |kind, msg: String| Rejection::new(kind, &call.tool, &call.call_id, msg);
    let value = match &call.arguments {
        ProposedArguments::Text(text) => {
            if text.len() > ARGUMENT_BYTES_MAX {
                return Err(reject(
                    RejectionKind::LimitExceeded,
                    format!(
                        "arguments of {} bytes exceed the limit of {ARGUMENT_BYTES_MAX}",
                        text.len()
                    ),
                ));
            }
            // An empty arguments string is how several providers say "no arguments".
            if text.trim().is_empty() {
                Value::Object(Default::default())
            } else {
                parse_strict(text).map_err(|e| {
                    reject(
                        RejectionKind::InvalidJson,
                        format!("arguments are not valid JSON: {e}"),
                    )
                })?
            }
        }
        ProposedArguments::FreeForm(text) => {
            if text.len() > ARGUMENT_BYTES_MAX {
                return Err(reject(
                    RejectionKind::LimitExceeded,
                    format!(
                        "input of {} bytes exceeds the limit of {ARGUMENT_BYTES_MAX}",
                        text.len()
                    ),
                ));
            }
            // Never decoded as JSON: free-form input is text, whatever it looks like.
            let mut object = serde_json::Map::new();
            object.insert(FREE_FORM_INPUT.into(), Value::String(text.clone()));
            return Ok(Value::Object(object));
        }
        ProposedArguments::Value(v) => {
            let bytes = v.to_string().len();
            if bytes > ARGUMENT_BYTES_MAX {
                return Err(reject(
                    RejectionKind::LimitExceeded,
                    format!("arguments of {bytes} bytes exceed the limit of {ARGUMENT_BYTES_MAX}"),
                ));
            }
            match v {
                Value::Null => Value::Object(Default::default()),
                other => other.clone(),
            }
        }
    };
    let value = decode_double_encoded(value);
    let d = depth(&value);
    if d > ARGUMENT_DEPTH_MAX {
        return Err(reject(
            RejectionKind::LimitExceeded,
            format!("arguments nest {d} levels deep; the limit is {ARGUMENT_DEPTH_MAX}"),
        ));
    }
    Ok(value)
}

fn validation_rejection(call: &ProposedCall, errors: Vec<FieldError>, omitted: usize) -> Rejection {
    let n = errors.len() + omitted;
    Rejection::new(
        RejectionKind::ValidationError,
        &call.tool,
        &call.call_id,
        format!(
            "{n} argument error{} for tool {:?}",
            if n == 1 { "" } else { "s" },
            call.tool
        ),
    )
    .with_errors(errors, omitted)
}

/// Prepares one call. Never panics on input; every failure is a structured rejection.
pub async fn prepare(cx: &PrepareContext<'_>, call: &ProposedCall) -> Result<Prepared, Rejection> {
    check_idempotency_key(call)?;
    let tool = lookup(cx, call)?;
    let spec = &tool.spec;
    let args = prepared_arguments(cx, &tool, call)?;
    let invalid = |e: ring0_core::CanonicalError| {
        Rejection::new(
            RejectionKind::InvalidJson,
            &call.tool,
            &call.call_id,
            e.to_string(),
        )
    };
    let canonical_args = canonical_string(&args).map_err(invalid)?;
    let fingerprint =
        Fingerprint::from_canonical_args(&spec.name, &canonical_args).map_err(|e| {
            Rejection::new(
                RejectionKind::InvalidJson,
                &call.tool,
                &call.call_id,
                e.to_string(),
            )
        })?;
    let hold = authorize(cx, spec, call, &args, &fingerprint.encode()).await?;
    let conflict_key = conflict_key(spec, call, &args)?;
    Ok(Prepared {
        idempotency_key: call.idempotency_key.clone(),
        hold,
        call: PreparedCall {
            index: call.index,
            call_id: call.call_id.clone(),
            tool: spec.name.clone(),
            args,
            canonical_args,
            fingerprint,
            conflict_key,
        },
        tool,
    })
}

/// The registered tool the call names, if the session may see it; otherwise an `unknown_tool`
/// rejection with the closest names it may see.
fn lookup(cx: &PrepareContext<'_>, call: &ProposedCall) -> Result<Arc<RegisteredTool>, Rejection> {
    let visible = |spec: &ring0_core::ToolSpec| cx.authorizer.visible(cx.session, spec);
    if let Some(tool) = cx.registry.get(&call.tool).filter(|t| visible(&t.spec)) {
        return Ok(tool.clone());
    }
    let suggestions = cx.registry.closest(&call.tool, visible);
    let msg = if suggestions.is_empty() {
        format!("unknown tool {:?}", call.tool)
    } else {
        format!(
            "unknown tool {:?}; did you mean {}?",
            call.tool,
            suggestions.join(", ")
        )
    };
    Err(
        Rejection::new(RejectionKind::UnknownTool, &call.tool, &call.call_id, msg)
            .with_suggestions(suggestions),
    )
}

/// Decoded, defaulted, validated and policy-rewritten arguments (validated again after every
/// rewrite), with integral floats made integers where the schema asks for one.
fn prepared_arguments(
    cx: &PrepareContext<'_>,
    tool: &RegisteredTool,
    call: &ProposedCall,
) -> Result<Value, Rejection> {
    let spec = &tool.spec;
    let mut args = decode_arguments(call)?;
    if spec.apply_schema_defaults {
        apply_defaults(&spec.input_schema, &mut args);
    }
    let check = |args: &Value| {
        let (errors, omitted) = validate(&tool.validator, &spec.input_schema, args);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(validation_rejection(call, errors, omitted))
        }
    };
    check(&args)?;
    for rewrite in cx.rewrites {
        args = rewrite.rewrite(cx.session, spec, args).map_err(|why| {
            Rejection::new(RejectionKind::PolicyDenied, &call.tool, &call.call_id, why)
        })?;
        check(&args)?;
    }
    integers_as_integers(&spec.input_schema, &mut args);
    Ok(args)
}

/// A caller's idempotency key: 1 to [`IDEMPOTENCY_KEY_BYTES_MAX`] printable ASCII characters.
fn check_idempotency_key(call: &ProposedCall) -> Result<(), Rejection> {
    let Some(key) = &call.idempotency_key else {
        return Ok(());
    };
    let printable = key.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    if !key.is_empty() && key.len() <= IDEMPOTENCY_KEY_BYTES_MAX && printable {
        return Ok(());
    }
    Err(Rejection::new(
        RejectionKind::InvalidIdempotencyKey,
        &call.tool,
        &call.call_id,
        format!(
            "the idempotency key ({} bytes) must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} printable \
             ASCII characters; nothing was run",
            key.len()
        ),
    ))
}

/// The authorizer's decision on the prepared arguments, short of asking a person: `Ok(true)`
/// when the call is held for one (asked right before dispatch); anything but an allow or a
/// hold is a rejection.
async fn authorize(
    cx: &PrepareContext<'_>,
    spec: &ring0_core::ToolSpec,
    call: &ProposedCall,
    args: &Value,
    args_hash: &str,
) -> Result<bool, Rejection> {
    let request = AuthRequest {
        session: cx.session,
        spec,
        call_id: &call.call_id,
        args,
        args_hash,
        events: cx.events.as_ref(),
        extensions: cx.extensions,
    };
    // The caller runs this inside the call's prepare span.
    let span = tracing::Span::current();
    match cx.authorizer.admit(&request).await {
        AuthAdmission::Hold => {
            crate::trace::record_decision(&span, "hold", None);
            Ok(true)
        }
        AuthAdmission::Decided(decision) => {
            crate::trace::record_decision(&span, decision.kind(), Some(decision.rule()));
            decision_result(decision, &call.tool, &call.call_id).map(|()| false)
        }
    }
}

/// An authorization decision as the call sees it: nothing for an allow, else its rejection.
pub(crate) fn decision_result(
    decision: AuthDecision,
    tool: &str,
    call_id: &str,
) -> Result<(), Rejection> {
    let mut retry_after_ms = None;
    let (kind, message) = match decision {
        AuthDecision::Allow { .. } => return Ok(()),
        AuthDecision::Deny { rule, reason } => (
            RejectionKind::PolicyDenied,
            format!("denied by {rule}: {reason}"),
        ),
        AuthDecision::ApprovalDenied { rule, reason } => (
            RejectionKind::ApprovalDenied,
            format!("not approved ({rule}): {reason}"),
        ),
        AuthDecision::ApprovalTimeout { rule } => (
            RejectionKind::ApprovalTimeout,
            format!("no approval arrived in time ({rule})"),
        ),
        AuthDecision::ApprovalRequired { rule, reason, next } => (
            RejectionKind::ApprovalRequired,
            format!("waiting for a person's approval ({rule}): {reason}. Next: {next}"),
        ),
        AuthDecision::RateLimited {
            rule,
            reason,
            retry_after_ms: wait_ms,
        } => {
            retry_after_ms = Some(wait_ms);
            (
                RejectionKind::RateLimited,
                format!("rate limited ({rule}): {reason}"),
            )
        }
    };
    let rejection = Rejection::new(kind, tool, call_id, message);
    Err(match retry_after_ms {
        Some(ms) => rejection.with_retry_after_ms(ms),
        None => rejection,
    })
}

/// The call's conflict key from the tool's template; a field the template needs and the
/// arguments lack is a validation error.
fn conflict_key(
    spec: &ring0_core::ToolSpec,
    call: &ProposedCall,
    args: &Value,
) -> Result<Option<String>, Rejection> {
    let Some(template) = &spec.conflict_key else {
        return Ok(None);
    };
    template.resolve(args).map(Some).map_err(|e| {
        let field = match &e {
            ring0_core::spec::ConflictKeyError::MissingField { field, .. } => field.clone(),
            _ => String::new(),
        };
        validation_rejection(
            call,
            vec![FieldError {
                loc: format!("/{}", field.replace('.', "/")),
                input_value: echo(&Value::Null),
                error_type: "missing".into(),
                message: format!("{e}; it is needed to order this call against others"),
                expected_domain: None,
            }],
            0,
        )
    })
}
