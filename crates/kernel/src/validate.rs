//! Schema validation with every error collected into a bounded, model-correctable envelope.
//!
//! Bounded field by field, so no rejection can outgrow the projection bound: at most
//! [`VALIDATION_ERRORS_MAX`] errors (the rest counted), each text cut to
//! [`REJECTION_TEXT_BYTES_MAX`], each echoed value to [`ECHO_BYTES_MAX`], and each list inside an
//! expected domain (allowed properties, enum values) to [`REJECTION_LIST_ITEMS_MAX`] items with a
//! `…_more` count of the rest. Allowed properties are listed closest to the unknown name first.

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{ValidationError, Validator};
use ring0_core::FieldError;
use ring0_core::limits::{
    ECHO_BYTES_MAX, REJECTION_LIST_ITEMS_MAX, REJECTION_TEXT_BYTES_MAX, VALIDATION_ERRORS_MAX,
    clip_with_length,
};
use ring0_core::text::truncate_utf8;
use serde_json::{Map, Value, json};

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
            Value::String(clip_with_length(s, ECHO_BYTES_MAX).into_owned())
        }
        Value::Array(_) | Value::Object(_) => {
            let text = value.to_string();
            if text.len() <= ECHO_BYTES_MAX {
                value.clone()
            } else {
                Value::String(clip_with_length(&text, ECHO_BYTES_MAX).into_owned())
            }
        }
        other => other.clone(),
    }
}

/// A text of a rejection, within [`REJECTION_TEXT_BYTES_MAX`].
fn bounded_text(s: &str) -> String {
    clip_with_length(s, REJECTION_TEXT_BYTES_MAX).into_owned()
}

/// `{key: [first items], key_more: N}`: a list inside a rejection, bounded.
fn bounded_list(domain: &mut Map<String, Value>, key: &str, items: Vec<Value>) {
    let more = items.len().saturating_sub(REJECTION_LIST_ITEMS_MAX);
    let kept: Vec<Value> = items.into_iter().take(REJECTION_LIST_ITEMS_MAX).collect();
    domain.insert(key.into(), Value::Array(kept));
    if more > 0 {
        domain.insert(format!("{key}_more"), json!(more));
    }
}

/// An enum's values, each echoed, as a bounded list.
fn enum_domain(values: &Value) -> Map<String, Value> {
    let mut d = Map::new();
    let items = values
        .as_array()
        .map(|vs| vs.iter().map(echo).collect())
        .unwrap_or_default();
    bounded_list(&mut d, "enum", items);
    d
}

/// The declared properties, closest to `unknown` first, as a bounded list.
fn allowed_domain(properties: Option<&Map<String, Value>>, unknown: &str) -> Value {
    let mut names: Vec<(f64, &String)> = properties
        .map(|p| {
            p.keys()
                .map(|k| (strsim::jaro_winkler(unknown, k), k))
                .collect()
        })
        .unwrap_or_default();
    names.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    let items = names
        .into_iter()
        .map(|(_, k)| Value::String(truncate_utf8(k, REJECTION_TEXT_BYTES_MAX).to_string()))
        .collect();
    let mut d = Map::new();
    bounded_list(&mut d, "allowed_properties", items);
    Value::Object(d)
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
    let loc = bounded_text(e.instance_path().as_str());
    let input = echo(e.instance());
    let message = bounded_text(&e.to_string());
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
            vec![missing_property(
                e,
                schema,
                property.as_str().unwrap_or_default(),
            )]
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            unexpected_properties(e, schema, unexpected)
        }
        ValidationErrorKind::Type { kind } => one("type", Some(json!({"type": type_name(kind)}))),
        ValidationErrorKind::Enum { options } => {
            one("enum", Some(Value::Object(enum_domain(options.as_ref()))))
        }
        ValidationErrorKind::Constant { expected_value } => one(
            "const",
            Some(json!({"const": echo(expected_value.as_ref())})),
        ),
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
            one("pattern", Some(json!({"pattern": bounded_text(pattern)})))
        }
        ValidationErrorKind::Format { format } => one("format", Some(json!({"format": format}))),
        kind => one(kind.keyword(), None),
    }
}

/// A required property that is missing, located at the property itself, with the domain its
/// schema expects.
fn missing_property(e: &ValidationError<'_>, schema: &Value, name: &str) -> FieldError {
    let prop_loc = pointer_join(e.instance_path().as_str(), name);
    let expected = schema_at(schema, &prop_loc).map(domain_of);
    FieldError {
        loc: bounded_text(&prop_loc),
        input_value: Value::Null,
        error_type: "missing".into(),
        message: bounded_text(&format!("required property {name:?} is missing")),
        expected_domain: expected,
    }
}

/// One error per property the schema does not allow, each located at the property and, for the
/// ones that will be reported, naming the properties that are allowed.
fn unexpected_properties(
    e: &ValidationError<'_>,
    schema: &Value,
    unexpected: &[String],
) -> Vec<FieldError> {
    let here = e.instance_path().as_str();
    let properties = schema_at(schema, here)
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    // Names beyond the reported errors are only counted: no domain is worked out for them, so
    // many unknown keys cost no more than the ones shown.
    unexpected
        .iter()
        .enumerate()
        .map(|(i, name)| FieldError {
            loc: bounded_text(&pointer_join(here, name)),
            input_value: echo(e.instance().get(name).unwrap_or(&Value::Null)),
            error_type: "additional_property".into(),
            message: bounded_text(&format!("property {name:?} is not allowed")),
            expected_domain: (i < VALIDATION_ERRORS_MAX).then(|| allowed_domain(properties, name)),
        })
        .collect()
}

/// What a schema accepts, for `expected_domain`.
fn domain_of(schema: &Value) -> Value {
    let mut d = match schema.get("enum") {
        Some(values) => enum_domain(values),
        None => Map::new(),
    };
    for key in ["type", "const", "minimum", "maximum", "pattern", "format"] {
        if let Some(v) = schema.get(key) {
            d.insert(key.into(), echo(v));
        }
    }
    if let Some(desc) = schema.get("description").and_then(Value::as_str) {
        d.insert("description".into(), echo(&Value::String(desc.into())));
    }
    Value::Object(d)
}
