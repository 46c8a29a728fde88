//! The JSON Schema subset a structured result is described in, and the check of a value
//! against it.
//!
//! Supported: `type` (a name or a list of names), `properties`, `required`,
//! `additionalProperties` (a boolean or a schema), `items`, `enum`, `const`, `minimum`,
//! `maximum`, `minLength`, `maxLength`, `minItems`, `maxItems`, and the annotations
//! `description`, `title`, `default`, `examples` and `$schema`. Any other keyword is refused
//! when the schema is checked, so a schema never promises a constraint that is not enforced.

use serde_json::{Map, Value};

const TYPES: [&str; 7] = [
    "object", "array", "string", "number", "integer", "boolean", "null",
];
const ANNOTATIONS: [&str; 5] = ["description", "title", "default", "examples", "$schema"];

/// Checks that `schema` is in the subset and describes an object at its root. The error names
/// the JSON pointer of the offending part.
pub fn check_object_schema(schema: &Value) -> Result<(), String> {
    let Some(root) = schema.as_object() else {
        return Err("the output schema must be a JSON object".into());
    };
    if root.get("type").and_then(Value::as_str) != Some("object") {
        return Err(r#"the output schema must describe an object ("type": "object")"#.into());
    }
    check_schema(schema, "")
}

fn check_schema(schema: &Value, at: &str) -> Result<(), String> {
    let Some(obj) = schema.as_object() else {
        return Err(format!("{}: a schema must be an object", pointer(at)));
    };
    for (key, value) in obj {
        let here = format!("{at}/{}", escape(key));
        match key.as_str() {
            "type" => {
                let names: Vec<&Value> = match value {
                    Value::Array(names) if !names.is_empty() => names.iter().collect(),
                    Value::String(_) => vec![value],
                    _ => return Err(format!("{here}: must be a type name or a list of them")),
                };
                for name in names {
                    if !name.as_str().is_some_and(|n| TYPES.contains(&n)) {
                        return Err(format!("{here}: unknown type {name}"));
                    }
                }
            }
            "properties" => {
                let Some(props) = value.as_object() else {
                    return Err(format!("{here}: must be an object of schemas"));
                };
                for (name, sub) in props {
                    check_schema(sub, &format!("{here}/{}", escape(name)))?;
                }
            }
            "required" => {
                if !value
                    .as_array()
                    .is_some_and(|names| names.iter().all(Value::is_string))
                {
                    return Err(format!("{here}: must be a list of property names"));
                }
            }
            "additionalProperties" => {
                if !value.is_boolean() {
                    check_schema(value, &here)?;
                }
            }
            "items" => check_schema(value, &here)?,
            "enum" => {
                if value.as_array().is_none_or(Vec::is_empty) {
                    return Err(format!("{here}: must be a non-empty list"));
                }
            }
            "minimum" | "maximum" => {
                if !value.is_number() {
                    return Err(format!("{here}: must be a number"));
                }
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" => {
                if value.as_u64().is_none() {
                    return Err(format!("{here}: must be a non-negative integer"));
                }
            }
            "const" => {}
            k if ANNOTATIONS.contains(&k) => {}
            _ => return Err(format!("{here}: the keyword {key:?} is not supported")),
        }
    }
    Ok(())
}

/// Checks `value` against `schema` (already checked with [`check_object_schema`]). The error
/// names the JSON pointer of the first value that does not match.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    validate_at(schema, value, "")
}

fn validate_at(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let Some(schema) = schema.as_object() else {
        return Ok(());
    };
    let here = || pointer(at);
    if let Some(types) = schema.get("type") {
        let matches = |name: &Value| name.as_str().is_some_and(|n| has_type(value, n));
        let ok = match types {
            Value::Array(names) => names.iter().any(matches),
            name => matches(name),
        };
        if !ok {
            return Err(format!(
                "{}: expected {}, got {}",
                here(),
                types,
                kind(value)
            ));
        }
    }
    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.contains(value)
    {
        return Err(format!(
            "{}: must be one of {}",
            here(),
            Value::Array(options.clone())
        ));
    }
    if let Some(constant) = schema.get("const")
        && constant != value
    {
        return Err(format!("{}: must be {constant}", here()));
    }
    match value {
        Value::Object(fields) => validate_object(schema, fields, at)?,
        Value::Array(items) => {
            bounds(schema, "minItems", "maxItems", items.len(), at, "items")?;
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate_at(item_schema, item, &format!("{at}/{i}"))?;
                }
            }
        }
        Value::String(s) => bounds(
            schema,
            "minLength",
            "maxLength",
            s.chars().count(),
            at,
            "characters",
        )?,
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or(f64::NAN);
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                && n < min
            {
                return Err(format!("{}: must be at least {min}", here()));
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                && n > max
            {
                return Err(format!("{}: must be at most {max}", here()));
            }
        }
        _ => {}
    }
    Ok(())
}

fn validate_object(
    schema: &Map<String, Value>,
    fields: &Map<String, Value>,
    at: &str,
) -> Result<(), String> {
    let props = schema.get("properties").and_then(Value::as_object);
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !fields.contains_key(name) {
                return Err(format!(
                    "{}: missing the required property {name:?}",
                    pointer(at)
                ));
            }
        }
    }
    for (name, value) in fields {
        let here = format!("{at}/{}", escape(name));
        match props.and_then(|p| p.get(name)) {
            Some(sub) => validate_at(sub, value, &here)?,
            None => match schema.get("additionalProperties") {
                Some(Value::Bool(false)) => {
                    return Err(format!(
                        "{}: the property {name:?} is not allowed",
                        pointer(at)
                    ));
                }
                Some(extra @ Value::Object(_)) => validate_at(extra, value, &here)?,
                _ => {}
            },
        }
    }
    Ok(())
}

fn bounds(
    schema: &Map<String, Value>,
    min_key: &str,
    max_key: &str,
    len: usize,
    at: &str,
    unit: &str,
) -> Result<(), String> {
    let len = len as u64;
    if let Some(min) = schema.get(min_key).and_then(Value::as_u64)
        && len < min
    {
        return Err(format!("{}: must have at least {min} {unit}", pointer(at)));
    }
    if let Some(max) = schema.get(max_key).and_then(Value::as_u64)
        && len > max
    {
        return Err(format!("{}: must have at most {max} {unit}", pointer(at)));
    }
    Ok(())
}

fn has_type(value: &Value, name: &str) -> bool {
    match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => false,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Object(_) => "an object",
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
    }
}

fn pointer(at: &str) -> &str {
    if at.is_empty() { "/" } else { at }
}

/// A JSON pointer segment for `key` (RFC 6901).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn verdict() -> Value {
        json!({
            "type": "object",
            "description": "a review verdict",
            "properties": {
                "approved": {"type": "boolean"},
                "score": {"type": "integer", "minimum": 0, "maximum": 10},
                "notes": {"type": "array", "items": {"type": "string", "maxLength": 5}},
                "level": {"enum": ["low", "high"]}
            },
            "required": ["approved"],
            "additionalProperties": false
        })
    }

    #[test]
    fn only_object_rooted_schemas_in_the_subset_are_accepted() {
        check_object_schema(&verdict()).unwrap();
        assert!(check_object_schema(&json!({"type": "string"})).is_err());
        assert!(check_object_schema(&json!([1])).is_err());
        let unsupported = json!({"type": "object", "properties": {"a": {"$ref": "#/x"}}});
        assert_eq!(
            check_object_schema(&unsupported).unwrap_err(),
            r#"/properties/a/$ref: the keyword "$ref" is not supported"#
        );
        let bad_type = json!({"type": "object", "properties": {"a": {"type": "text"}}});
        assert!(
            check_object_schema(&bad_type)
                .unwrap_err()
                .contains("unknown type")
        );
    }

    #[test]
    fn values_are_checked_and_the_first_mismatch_is_named() {
        let schema = verdict();
        validate(
            &schema,
            &json!({"approved": true, "score": 7, "notes": ["ok"]}),
        )
        .unwrap();
        let cases = [
            (json!({}), r#"/: missing the required property "approved""#),
            (
                json!({"approved": "yes"}),
                "/approved: expected \"boolean\", got a string",
            ),
            (
                json!({"approved": true, "score": 11}),
                "/score: must be at most 10",
            ),
            (
                json!({"approved": true, "score": 1.5}),
                "/score: expected \"integer\", got a number",
            ),
            (
                json!({"approved": true, "notes": ["toolong"]}),
                "/notes/0: must have at most 5 characters",
            ),
            (
                json!({"approved": true, "level": "mid"}),
                r#"/level: must be one of ["low","high"]"#,
            ),
            (
                json!({"approved": true, "extra": 1}),
                r#"/: the property "extra" is not allowed"#,
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(validate(&schema, &value).unwrap_err(), expected, "{value}");
        }
    }
}
