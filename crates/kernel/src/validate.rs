//! Schema validation with every error collected into a bounded, model-correctable envelope.

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{ValidationError, Validator};
use ring0_core::FieldError;
use ring0_core::limits::{ECHO_BYTES_MAX, VALIDATION_ERRORS_MAX};
use serde_json::{Value, json};

/// Validates `args`, returning at most [`VALIDATION_ERRORS_MAX`] field errors and the count of
/// the rest.
pub fn validate(validator: &Validator, schema: &Value, args: &Value) -> (Vec<FieldError>, usize) {
    let mut errors = Vec::new();
    let mut omitted = 0;
    for e in validator.iter_errors(args) {
        for fe in field_errors(&e, schema) {
            if errors.len() < VALIDATION_ERRORS_MAX {
                errors.push(fe);
            } else {
                omitted += 1;
            }
        }
    }
    (errors, omitted)
}

/// Cuts an echoed value to [`ECHO_BYTES_MAX`] so a huge argument is never sent back whole.
pub fn echo(value: &Value) -> Value {
    match value {
        Value::String(s) if s.len() > ECHO_BYTES_MAX => {
            let mut cut = ECHO_BYTES_MAX;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            Value::String(format!("{}… ({} bytes in all)", &s[..cut], s.len()))
        }
        Value::Array(_) | Value::Object(_) => {
            let text = value.to_string();
            if text.len() <= ECHO_BYTES_MAX {
                value.clone()
            } else {
                let mut cut = ECHO_BYTES_MAX;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                Value::String(format!("{}… ({} bytes in all)", &text[..cut], text.len()))
            }
        }
        other => other.clone(),
    }
}

fn pointer_join(base: &str, name: &str) -> String {
    format!("{base}/{}", name.replace('~', "~0").replace('/', "~1"))
}

/// The sub-schema at an instance location, following `properties` only (good enough to name
/// the expected type of a missing or extra property).
fn schema_at<'a>(schema: &'a Value, pointer: &str) -> Option<&'a Value> {
    let mut cur = schema;
    for seg in pointer.split('/').skip(1) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        cur = match cur.get("properties").and_then(|p| p.get(&seg)) {
            Some(s) => s,
            None => cur.get("items")?,
        };
    }
    Some(cur)
}

fn type_name(kind: &TypeKind) -> Value {
    match kind {
        TypeKind::Single(t) => json!(t.to_string()),
        TypeKind::Multiple(set) => json!(set.iter().map(|t| t.to_string()).collect::<Vec<_>>()),
    }
}

fn field_errors(e: &ValidationError<'_>, schema: &Value) -> Vec<FieldError> {
    let loc = e.instance_path().as_str().to_string();
    let input = echo(e.instance());
    let message = e.to_string();
    let one = |error_type: &str, expected: Option<Value>| {
        vec![FieldError {
            loc: loc.clone(),
            input_value: input.clone(),
            error_type: error_type.into(),
            message: message.clone(),
            expected_domain: expected,
        }]
    };
    match e.kind() {
        ValidationErrorKind::Required { property } => {
            let name = property.as_str().unwrap_or_default();
            let prop_loc = pointer_join(&loc, name);
            let expected = schema_at(schema, &prop_loc).map(domain_of);
            vec![FieldError {
                loc: prop_loc,
                input_value: Value::Null,
                error_type: "missing".into(),
                message: format!("required property {name:?} is missing"),
                expected_domain: expected,
            }]
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let allowed: Vec<String> = schema_at(schema, &loc)
                .and_then(|s| s.get("properties"))
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            unexpected
                .iter()
                .map(|name| FieldError {
                    loc: pointer_join(&loc, name),
                    input_value: echo(e.instance().get(name).unwrap_or(&Value::Null)),
                    error_type: "additional_property".into(),
                    message: format!("property {name:?} is not allowed"),
                    expected_domain: Some(json!({"allowed_properties": allowed})),
                })
                .collect()
        }
        ValidationErrorKind::Type { kind } => one("type", Some(json!({"type": type_name(kind)}))),
        ValidationErrorKind::Enum { options } => {
            one("enum", Some(json!({"enum": options.as_ref()})))
        }
        ValidationErrorKind::Constant { expected_value } => {
            one("const", Some(json!({"const": expected_value.as_ref()})))
        }
        ValidationErrorKind::Minimum { limit } => one("range", Some(json!({"minimum": limit}))),
        ValidationErrorKind::Maximum { limit } => one("range", Some(json!({"maximum": limit}))),
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            one("range", Some(json!({"exclusiveMinimum": limit})))
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            one("range", Some(json!({"exclusiveMaximum": limit})))
        }
        ValidationErrorKind::MinLength { limit } => {
            one("length", Some(json!({"minLength": limit})))
        }
        ValidationErrorKind::MaxLength { limit } => {
            one("length", Some(json!({"maxLength": limit})))
        }
        ValidationErrorKind::MinItems { limit } => one("length", Some(json!({"minItems": limit}))),
        ValidationErrorKind::MaxItems { limit } => one("length", Some(json!({"maxItems": limit}))),
        ValidationErrorKind::Pattern { pattern } => {
            one("pattern", Some(json!({"pattern": pattern})))
        }
        ValidationErrorKind::Format { format } => one("format", Some(json!({"format": format}))),
        kind => one(kind.keyword(), None),
    }
}

/// What a schema accepts, for `expected_domain`.
fn domain_of(schema: &Value) -> Value {
    let mut d = serde_json::Map::new();
    for key in [
        "type", "enum", "const", "minimum", "maximum", "pattern", "format",
    ] {
        if let Some(v) = schema.get(key) {
            d.insert(key.into(), v.clone());
        }
    }
    if let Some(desc) = schema.get("description").and_then(Value::as_str) {
        d.insert("description".into(), echo(&Value::String(desc.into())));
    }
    Value::Object(d)
}
