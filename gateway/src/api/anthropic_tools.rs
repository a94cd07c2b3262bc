//! Tool use and structured output on the Anthropic Messages API: `tools` (client tools
//! with an `input_schema`), `tool_choice` (`auto`, `any`, `tool`, `none`,
//! `disable_parallel_tool_use`), `tool_use`/`tool_result` blocks in the conversation,
//! and `output_config.format` (`json_schema`). They become the same [`Tools`] and
//! [`OutputFormat`] as OpenAI's fields (see `tools`), and answers come back as
//! `tool_use` blocks with `stop_reason: "tool_use"`.

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use sharemesh_protocol::OutputFormat;

use crate::api::error::ApiError;
use crate::api::fields::text_content;
use crate::api::tools::{Answer, Tool, ToolChoice, Tools};

fn tool(value: &Value, i: usize) -> Result<Tool, ApiError> {
    let at = format!("tools[{i}]");
    if let Some(kind) = value.get("type").and_then(Value::as_str) {
        if kind != "custom" {
            return Err(ApiError::invalid(
                &format!("{at}.type"),
                format!("`{at}.type` `{kind}`: server tools are not supported, only client tools with an input_schema"),
            ));
        }
    }
    let parameters = match value.get("input_schema") {
        Some(schema) if schema.is_object() => schema.clone(),
        _ => {
            return Err(ApiError::invalid(
                &format!("{at}.input_schema"),
                format!("`{at}.input_schema` must be a JSON Schema object"),
            ))
        }
    };
    let fields = value
        .as_object()
        .ok_or_else(|| ApiError::invalid(&at, format!("`{at}` must be an object")))?;
    Tool::read(fields, &at, parameters)
}

/// `tools` and `tool_choice`; `None` when no tool may be used.
pub fn parse(obj: &Map<String, Value>) -> Result<Option<Tools>, ApiError> {
    let tools = crate::api::tools::tool_list(obj, tool)?;
    let choice = obj.get("tool_choice").filter(|c| !c.is_null());
    let parallel = !choice
        .and_then(|c| c.get("disable_parallel_tool_use"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let choice = match choice.map(|c| (c.get("type").and_then(Value::as_str), c)) {
        None | Some((Some("auto"), _)) => Some(ToolChoice::Auto),
        Some((Some("none"), _)) => None,
        Some((Some("any"), _)) => Some(ToolChoice::Required),
        Some((Some("tool"), c)) => {
            let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice.name",
                    format!("`tool_choice` names `{name}`, which is not among `tools`"),
                ));
            }
            Some(ToolChoice::Named(name.to_owned()))
        }
        Some((other, _)) => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("`tool_choice.type` must be auto, any, tool or none, got {other:?}"),
            ))
        }
    };
    crate::api::tools::offer(tools, choice, parallel)
}

/// `output_config.format`: `{"type": "json_schema", "schema": {…}}`.
pub fn output_format(obj: &Map<String, Value>) -> Result<OutputFormat, ApiError> {
    let Some(format) = obj
        .get("output_config")
        .and_then(|c| c.get("format"))
        .filter(|f| !f.is_null())
    else {
        return Ok(OutputFormat::Free);
    };
    match (
        format.get("type").and_then(Value::as_str),
        format.get("schema"),
    ) {
        (Some("json_schema"), Some(schema)) if schema.is_object() => {
            let format = OutputFormat::JsonSchema(schema.to_string());
            format
                .validate()
                .map_err(|e| ApiError::invalid("output_config.format.schema", e.to_string()))?;
            Ok(format)
        }
        _ => Err(ApiError::invalid(
            "output_config.format",
            "`output_config.format` must be {\"type\": \"json_schema\", \"schema\": {…}}",
        )),
    }
}

/// A message's content with `tool_use` and `tool_result` blocks written as the model
/// is asked to write them (see `tools`); `names` remembers each tool use's tool.
/// `None` when the content has no such block (plain text reads it).
pub(crate) fn content(
    value: &Value,
    param: &str,
    names: &mut HashMap<String, String>,
) -> Result<Option<String>, ApiError> {
    let Value::Array(blocks) = value else {
        return Ok(None);
    };
    let is_tool_block = |b: &Value| {
        matches!(
            b.get("type").and_then(Value::as_str),
            Some("tool_use" | "tool_result")
        )
    };
    if !blocks.iter().any(is_tool_block) {
        return Ok(None);
    }
    let (mut calls, mut parts) = (Vec::new(), Vec::new());
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{param}[{j}]");
        match block.get("type").and_then(Value::as_str) {
            Some("tool_use") => {
                let name = block.get("name").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid(&format!("{at}.name"), format!("`{at}.name` is required"))
                })?;
                if let Some(id) = block.get("id").and_then(Value::as_str) {
                    names.insert(id.to_owned(), name.to_owned());
                }
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({"name": name, "arguments": input}));
            }
            Some("tool_result") => {
                let id = block
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let name = names.get(id).map_or("the tool", String::as_str);
                let result = text_content(
                    block.get("content").unwrap_or(&Value::Null),
                    &format!("{at}.content"),
                    &["text"],
                )?;
                let error = block.get("is_error").and_then(Value::as_bool) == Some(true);
                let verb = if error { "failed" } else { "returned" };
                parts.push(format!("Result of {name} ({verb}): {result}"));
            }
            _ => parts.push(text_content(
                &Value::Array(vec![block.clone()]),
                param,
                &["text"],
            )?),
        }
    }
    if !calls.is_empty() {
        parts.insert(0, json!({"tool_calls": calls}).to_string());
    }
    Ok(Some(parts.join("\n")))
}

/// An answer as Anthropic content blocks.
pub(crate) fn blocks(answer: &Answer) -> Vec<Value> {
    match answer {
        Answer::Text(text) => vec![json!({"type": "text", "text": text})],
        Answer::Calls(calls) => calls
            .iter()
            .map(|call| {
                let input: Value =
                    serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
                json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input})
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::api::fields::test_object as object;

    const WEATHER: &str = r#"{"name": "get_weather", "description": "Weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}"#;

    #[test]
    fn tool_choices_map_onto_the_shared_tools() {
        let with = |choice: &str| parse(&object(&format!(r#"{{"tools": [{WEATHER}]{choice}}}"#)));
        assert_eq!(with("").unwrap().unwrap().choice, ToolChoice::Auto);
        assert_eq!(
            with(r#", "tool_choice": {"type": "any"}"#)
                .unwrap()
                .unwrap()
                .choice,
            ToolChoice::Required
        );
        let named = with(r#", "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}"#)
            .unwrap()
            .unwrap();
        assert_eq!(named.choice, ToolChoice::Named("get_weather".into()));
        assert!(!named.parallel);
        assert!(with(r#", "tool_choice": {"type": "none"}"#)
            .unwrap()
            .is_none());
        let bad = with(r#", "tool_choice": {"type": "tool", "name": "nope"}"#).unwrap_err();
        assert_eq!(bad.param.as_deref(), Some("tool_choice.name"));
        let server = parse(&object(
            r#"{"tools": [{"type": "web_search_20250305", "name": "web_search"}]}"#,
        ));
        assert_eq!(server.unwrap_err().param.as_deref(), Some("tools[0].type"));
        let schemaless = parse(&object(r#"{"tools": [{"name": "f"}]}"#));
        assert_eq!(
            schemaless.unwrap_err().param.as_deref(),
            Some("tools[0].input_schema")
        );
    }

    #[test]
    fn tool_blocks_are_written_as_the_model_answers() {
        let mut names = HashMap::new();
        let used: Value = serde_json::from_str(
            r#"[{"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]"#,
        )
        .unwrap();
        let written = content(&used, "messages[1].content", &mut names)
            .unwrap()
            .unwrap();
        assert_eq!(
            written,
            "{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]}\nLet me check."
        );
        let result: Value = serde_json::from_str(
            r#"[{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]}]"#,
        )
        .unwrap();
        let written = content(&result, "messages[2].content", &mut names)
            .unwrap()
            .unwrap();
        assert_eq!(written, "Result of get_weather (returned): 18 C");
        assert!(content(&json!("plain"), "m", &mut names).unwrap().is_none());
        let format = output_format(&object(
            r#"{"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}"#,
        ));
        assert_eq!(
            format.unwrap(),
            OutputFormat::JsonSchema(r#"{"type":"object"}"#.into())
        );
        let bad = output_format(&object(
            r#"{"output_config": {"format": {"type": "yaml"}}}"#,
        ));
        assert_eq!(
            bad.unwrap_err().param.as_deref(),
            Some("output_config.format")
        );
    }
}
