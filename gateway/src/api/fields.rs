//! Reading request fields from JSON by name, so every error names the field at fault
//! (`messages[2].content[0].text`); shared by the OpenAI, Anthropic and Responses APIs.

use serde_json::{Map, Value};

use crate::api::error::ApiError;

pub(crate) fn object(body: &Value) -> Result<&Map<String, Value>, ApiError> {
    body.as_object()
        .ok_or_else(|| ApiError::bad_json("the request body must be a JSON object"))
}

pub(crate) fn number(
    obj: &Map<String, Value>,
    field: &str,
    min: f64,
    max: f64,
) -> Result<Option<f64>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let v = n.as_f64().unwrap_or(f64::NAN);
            if !(min..=max).contains(&v) {
                return Err(ApiError::invalid(
                    field,
                    format!("`{field}` must be between {min} and {max}, got {v}"),
                ));
            }
            Ok(Some(v))
        }
        Some(other) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be a number, got {}", kind(other)),
        )),
    }
}

pub(crate) fn integer(
    obj: &Map<String, Value>,
    field: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
            _ => Err(ApiError::invalid(
                field,
                format!("`{field}` must be an integer between {min} and {max}, got {n}"),
            )),
        },
        Some(other) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be an integer, got {}", kind(other)),
        )),
    }
}

pub(crate) fn boolean(obj: &Map<String, Value>, field: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be a boolean, got {}", kind(other)),
        )),
    }
}

pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn string<'a>(
    obj: &'a Map<String, Value>,
    field: &str,
) -> Result<Option<&'a str>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be a string, got {}", kind(other)),
        )),
    }
}

/// The text of a message's content (`param` names it in errors): a string, or a list
/// of parts whose `type` is one of `text_types`, each with a string `text`. Any other
/// part (an image, a tool call) is refused by name: answering without it would answer
/// another question. `null` is empty.
pub(crate) fn text_content(
    value: &Value,
    param: &str,
    text_types: &[&str],
) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{param}[{j}]");
                match part.get("type").and_then(Value::as_str) {
                    Some(t) if text_types.contains(&t) => match part.get("text") {
                        Some(Value::String(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                &format!("{at}.text"),
                                format!("`{at}.text` must be a string"),
                            ))
                        }
                    },
                    Some(other) => {
                        return Err(ApiError::invalid(
                            &format!("{at}.type"),
                            format!(
                                "`{other}` parts are not supported yet: only text ({})",
                                text_types.join(", ")
                            ),
                        ))
                    }
                    None => {
                        return Err(ApiError::invalid(
                            &format!("{at}.type"),
                            format!("`{at}` needs a `type`"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Value::Null => Ok(String::new()),
        other => Err(ApiError::invalid(
            param,
            format!(
                "`{param}` must be a string or a list of text parts, got {}",
                kind(other)
            ),
        )),
    }
}

/// A JSON object from test text (panics on anything else).
#[cfg(test)]
pub(crate) fn test_object(text: &str) -> Map<String, Value> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => map,
        other => panic!("{other:?}"),
    }
}
