//! Compatibility preparation of schemas (at registration) and arguments (at call time).
//!
//! Real-world tool schemas are loose: `"type": "dict"`, `"float"`, `"tuple"`, `"any"`, Java and
//! JavaScript type names, no `additionalProperties`. At registration they are normalized once to
//! JSON Schema 2020-12 and closed (`additionalProperties: false` wherever properties are declared,
//! unless the spec opts out). At call time arguments that arrive double-encoded as a JSON string
//! are decoded once, and defaults are applied. Nothing else is coerced: a string `"5"` for an
//! integer stays a validation error the model can correct.

use ring0_core::canonical::parse_strict;
use serde_json::{Map, Value};

/// A schema that cannot be normalized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schema at {path}: {why}")]
pub struct SchemaError {
    pub path: String,
    pub why: String,
}

/// Maps a loose type name to a JSON Schema type; `Ok(None)` means "no type constraint".
fn normalize_type_name(name: &str) -> Result<Option<&'static str>, ()> {
    Ok(Some(match name {
        "string" | "String" | "str" | "char" | "Character" | "text" => "string",
        "integer" | "int" | "Integer" | "long" | "Long" | "short" | "Short" | "byte" | "Byte"
        | "bigint" | "BigInteger" => "integer",
        "number" | "float" | "Float" | "double" | "Double" | "BigDecimal" => "number",
        "boolean" | "bool" | "Boolean" => "boolean",
        "object" | "dict" | "Dict" | "HashMap" | "Map" | "map" | "Object" | "Hashtable"
        | "TreeMap" => "object",
        "array" | "Array" | "ArrayList" | "List" | "list" | "tuple" | "Tuple" | "Set"
        | "HashSet" | "LinkedList" => "array",
        "null" | "None" => "null",
        "any" | "Any" | "" => return Ok(None),
        _ => return Err(()),
    }))
}

/// Normalizes a tool's input schema. `close` adds `additionalProperties: false` where an object
/// declares properties and says nothing about extras.
pub fn normalize_schema(schema: &Value, close: bool) -> Result<Value, SchemaError> {
    let mut out = schema.clone();
    if let Value::Object(map) = &mut out
        && !map.contains_key("type")
    {
        map.insert("type".into(), Value::String("object".into()));
    }
    normalize_node(&mut out, "#", close)?;
    match out.get("type") {
        Some(Value::String(t)) if t == "object" => Ok(out),
        _ => Err(SchemaError {
            path: "#".into(),
            why: "a tool's input schema must describe an object".into(),
        }),
    }
}

/// Normalizes one schema node and, recursively, every subschema under it: its `type`, the
/// draft-07 forms 2020-12 spells differently, and (with `close`) extra properties refused.
fn normalize_node(node: &mut Value, path: &str, close: bool) -> Result<(), SchemaError> {
    let Value::Object(map) = node else {
        // Boolean schemas are valid 2020-12; anything else is not a schema.
        return match node {
            Value::Bool(_) => Ok(()),
            _ => Err(SchemaError {
                path: path.into(),
                why: "expected a schema object".into(),
            }),
        };
    };
    if let Some(t) = map.get("type") {
        match normalize_type(t, path)? {
            Some(t) => {
                map.insert("type".into(), t);
            }
            None => {
                map.remove("type");
            }
        }
    }
    // Draft-07 tuple form `items: [..]` is `prefixItems` in 2020-12.
    if map.get("items").is_some_and(Value::is_array)
        && let Some(items) = map.remove("items")
    {
        map.insert("prefixItems".into(), items);
    }
    move_array_enum_to_items(map);
    let declares_properties = map.get("properties").is_some_and(Value::is_object);
    if close && declares_properties && !map.contains_key("additionalProperties") {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    normalize_subschemas(map, path, close)
}

/// A node's `type` with its names normalized, duplicates dropped; `None` when it allows any
/// type (a name that means "anything" in the list), so the keyword is removed.
fn normalize_type(t: &Value, path: &str) -> Result<Option<Value>, SchemaError> {
    let unknown = |name: &str| SchemaError {
        path: format!("{path}/type"),
        why: format!("unknown type name {name:?}"),
    };
    match t {
        Value::String(name) => Ok(normalize_type_name(name)
            .map_err(|_| unknown(name))?
            .map(|s| Value::String(s.into()))),
        Value::Array(names) => {
            let mut out = Vec::new();
            for n in names {
                let name = n.as_str().unwrap_or_default();
                match normalize_type_name(name).map_err(|_| unknown(name))? {
                    Some(s) => {
                        if !out.contains(&Value::String(s.into())) {
                            out.push(Value::String(s.into()));
                        }
                    }
                    None => return Ok(None),
                }
            }
            Ok((!out.is_empty()).then_some(Value::Array(out)))
        }
        _ => Err(SchemaError {
            path: format!("{path}/type"),
            why: "type must be a string or an array of strings".into(),
        }),
    }
}

/// Normalizes every subschema of a node: under the keywords that hold a map of schemas, one
/// schema, or a list of schemas.
fn normalize_subschemas(
    map: &mut Map<String, Value>,
    path: &str,
    close: bool,
) -> Result<(), SchemaError> {
    for key in ["properties", "patternProperties", "$defs", "definitions"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            for (name, child) in children.iter_mut() {
                normalize_node(child, &format!("{path}/{key}/{name}"), close)?;
            }
        }
    }
    for key in [
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
    ] {
        if let Some(child) = map.get_mut(key)
            && child.is_object()
        {
            normalize_node(child, &format!("{path}/{key}"), close)?;
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(children)) = map.get_mut(key) {
            for (i, child) in children.iter_mut().enumerate() {
                normalize_node(child, &format!("{path}/{key}/{i}"), close)?;
            }
        }
    }
    Ok(())
}

/// An `enum` of scalars on an array schema can never be met (an array is never equal to a
/// scalar); its author meant the values the items may take. It moves into `items`.
fn move_array_enum_to_items(map: &mut Map<String, Value>) {
    let is_array = match map.get("type") {
        Some(Value::String(t)) => t == "array",
        Some(Value::Array(ts)) => ts.len() == 1 && ts[0] == "array",
        _ => false,
    };
    let scalars = map
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|vs| vs.iter().all(|v| !v.is_array() && !v.is_object()));
    if !is_array || !scalars {
        return;
    }
    let Some(values) = map.remove("enum") else {
        return;
    };
    match map.get_mut("items") {
        Some(Value::Object(items)) if !items.contains_key("enum") => {
            items.insert("enum".into(), values);
        }
        Some(Value::Object(_)) => {}
        _ => {
            map.insert("items".into(), serde_json::json!({ "enum": values }));
        }
    }
}

/// Names in `required` that the object does not declare. Where extras are forbidden
/// (`additionalProperties: false`) such a name could never be met, so it is removed; elsewhere it
/// is kept. Either way a note per name says so.
pub fn check_required(schema: &mut Value) -> Vec<String> {
    let mut notes = Vec::new();
    required_node(schema, "#", &mut notes);
    notes
}

fn required_node(node: &mut Value, path: &str, notes: &mut Vec<String>) {
    let Value::Object(map) = node else {
        return;
    };
    let declared: Vec<String> = map
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    let closed = map.get("additionalProperties") == Some(&Value::Bool(false));
    if let Some(Value::Array(required)) = map.get_mut("required") {
        required.retain(|name| {
            let Some(name) = name.as_str() else {
                return true;
            };
            if declared.iter().any(|d| d == name) {
                return true;
            }
            notes.push(if closed {
                format!(
                    "{path}: required property {name:?} is not declared and no other property is allowed; it is no longer required"
                )
            } else {
                format!("{path}: required property {name:?} is not declared")
            });
            !closed
        });
    }
    for key in ["properties", "$defs", "definitions"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            for (name, child) in children.iter_mut() {
                required_node(child, &format!("{path}/{key}/{name}"), notes);
            }
        }
    }
    if let Some(items) = map.get_mut("items") {
        required_node(items, &format!("{path}/items"), notes);
    }
}

/// Integral numbers written as floats (`7890.0`) where the schema asks for an integer become
/// integers: the validator accepts them as integers, so the tool must receive one.
pub fn integers_as_integers(schema: &Value, value: &mut Value) {
    match value {
        Value::Number(n) if n.is_f64() && wants_integer(schema) => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
                && f.abs() <= ring0_core::canonical::SAFE_INTEGER_MAX as f64
            {
                *value = Value::from(f as i64);
            }
        }
        Value::Object(obj) => {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                return;
            };
            for (name, child) in obj.iter_mut() {
                if let Some(s) = props.get(name) {
                    integers_as_integers(s, child);
                }
            }
        }
        Value::Array(items) => {
            let prefix = schema.get("prefixItems").and_then(Value::as_array);
            for (i, child) in items.iter_mut().enumerate() {
                let s = prefix
                    .and_then(|p| p.get(i))
                    .or_else(|| schema.get("items").filter(|s| s.is_object()));
                if let Some(s) = s {
                    integers_as_integers(s, child);
                }
            }
        }
        _ => {}
    }
}

/// The schema accepts integers and not other numbers.
fn wants_integer(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(ts)) => {
            ts.iter().any(|t| t == "integer") && !ts.iter().any(|t| t == "number")
        }
        _ => false,
    }
}

/// Decodes arguments that arrived as a JSON string holding a JSON object, once. Returns the value
/// unchanged otherwise (the validator then reports the type error).
pub fn decode_double_encoded(args: Value) -> Value {
    match &args {
        Value::String(text) if text.trim_start().starts_with('{') => match parse_strict(text) {
            Ok(inner @ Value::Object(_)) => inner,
            _ => args,
        },
        _ => args,
    }
}

/// Removes every property `default` that its own property schema rejects, returning a note per
/// removal. Applying such a default would turn a correct call that omits the property into an
/// error about a value the model never sent. A default whose schema cannot be checked alone
/// (it refers elsewhere with `$ref`) is kept.
pub fn strip_invalid_defaults(schema: &mut Value) -> Vec<String> {
    let mut notes = Vec::new();
    strip_node(schema, "#", &mut notes);
    notes
}

fn strip_node(node: &mut Value, path: &str, notes: &mut Vec<String>) {
    let Some(props) = node.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for (name, prop) in props.iter_mut() {
        let here = format!("{path}/properties/{name}");
        if let Some(default) = prop.get("default").cloned() {
            let mut bare = prop.clone();
            if let Value::Object(m) = &mut bare {
                m.remove("default");
            }
            let refers = bare.to_string().contains("\"$ref\"");
            if !refers
                && let Ok(v) = crate::registry::compile_schema(&bare)
                && !v.is_valid(&default)
            {
                if let Value::Object(m) = prop {
                    m.remove("default");
                }
                notes.push(format!(
                    "{here}: default {default} does not match its own schema and is ignored"
                ));
            }
        }
        strip_node(prop, &here, notes);
    }
}

/// Applies `default`s of absent properties, recursively into present sub-objects.
pub fn apply_defaults(schema: &Value, value: &mut Value) {
    let (Some(props), Value::Object(obj)) =
        (schema.get("properties").and_then(Value::as_object), value)
    else {
        return;
    };
    apply_object_defaults(props, obj);
}

fn apply_object_defaults(props: &Map<String, Value>, obj: &mut Map<String, Value>) {
    for (name, prop_schema) in props {
        match obj.get_mut(name) {
            Some(child) => apply_defaults(prop_schema, child),
            None => {
                if let Some(default) = prop_schema.get("default") {
                    obj.insert(name.clone(), default.clone());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn loose_type_names_become_json_schema_and_objects_are_closed() {
        let loose = json!({"type": "dict", "properties": {
            "n": {"type": "float"}, "xs": {"type": "tuple", "items": {"type": "String"}},
            "m": {"type": "HashMap"}, "a": {"type": "any"}, "l": {"type": "long"},
            "inner": {"type": "dict", "properties": {"c": {"type": "char"}}}
        }});
        let s = normalize_schema(&loose, true).unwrap();
        assert_eq!(s["type"], "object");
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["n"]["type"], "number");
        assert_eq!(s["properties"]["xs"]["type"], "array");
        assert_eq!(s["properties"]["xs"]["items"]["type"], "string");
        assert_eq!(s["properties"]["m"]["type"], "object");
        assert!(s["properties"]["m"].get("additionalProperties").is_none());
        assert!(s["properties"]["a"].get("type").is_none());
        assert_eq!(s["properties"]["l"]["type"], "integer");
        assert_eq!(s["properties"]["inner"]["additionalProperties"], false);
    }

    #[test]
    fn open_schemas_stay_open() {
        let s = normalize_schema(&json!({"type": "object", "properties": {}}), false).unwrap();
        assert!(s.get("additionalProperties").is_none());
    }

    #[test]
    fn unknown_type_names_are_refused_with_their_path() {
        let e = normalize_schema(
            &json!({"type": "object", "properties": {"x": {"type": "Widget"}}}),
            true,
        )
        .unwrap_err();
        assert_eq!(e.path, "#/properties/x/type");
    }

    #[test]
    fn double_encoded_arguments_are_decoded_once_only() {
        let once = decode_double_encoded(json!("{\"a\":1}"));
        assert_eq!(once, json!({"a": 1}));
        let twice = decode_double_encoded(json!("\"{\\\"a\\\":1}\""));
        assert!(twice.is_string());
    }

    #[test]
    fn defaults_that_break_their_own_schema_are_ignored() {
        let mut schema = normalize_schema(
            &json!({"type": "dict", "properties": {
                "flag": {"type": "boolean", "default": "false"},
                "unit": {"type": "string", "default": "c"}
            }}),
            true,
        )
        .unwrap();
        let notes = strip_invalid_defaults(&mut schema);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("#/properties/flag"));
        assert!(schema["properties"]["flag"].get("default").is_none());
        assert_eq!(schema["properties"]["unit"]["default"], "c");
    }

    #[test]
    fn defaults_fill_absent_properties_only() {
        let schema = json!({"type": "object", "properties": {
            "unit": {"type": "string", "default": "celsius"},
            "opts": {"type": "object", "properties": {"deep": {"default": true}}}
        }});
        let mut v = json!({"opts": {}});
        apply_defaults(&schema, &mut v);
        assert_eq!(v, json!({"unit": "celsius", "opts": {"deep": true}}));
        let mut given = json!({"unit": "kelvin"});
        apply_defaults(&schema, &mut given);
        assert_eq!(given["unit"], "kelvin");
    }
}
