//! Structured output and tool calling (OpenAI's `response_format`, `tools`,
//! `tool_choice`, `parallel_tool_calls`), on any provider: the gateway turns them into an
//! [`OutputFormat`] the provider enforces by constrained decoding, and reads the answer
//! back into content or tool calls.
//!
//! The catalog's chat templates know no tools, so tools are presented the generic way
//! (as llama.cpp does for such models): a system note lists each tool with its JSON
//! Schema, and the answer is constrained to one JSON object, `{"tool_calls": [{"name",
//! "arguments"}, …]}` or (with `tool_choice: "auto"`) `{"response": "…"}`. Earlier tool
//! calls and results in the conversation are written the same way, so the model sees
//! the convention it is held to.

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use sharemesh_protocol::{ChatMessage, OutputFormat, Role};

use crate::api::error::ApiError;
use crate::api::fields::{boolean, kind, text_content};

/// The most tools one request may declare.
pub const MAX_TOOLS: usize = 64;
/// The most calls one answer may make with `parallel_tool_calls` (one without).
pub const MAX_PARALLEL_CALLS: usize = 8;

#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub parameters: Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model calls tools or answers in text, as it judges.
    Auto,
    /// At least one call.
    Required,
    /// A call of this tool.
    Named(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

/// A tool call read from an answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// What an answer under [`Tools`] says.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Text(String),
    Calls(Vec<ToolCall>),
}

/// `response_format`: `text` (or absent), `json_object`, or `json_schema` with a
/// `schema` (always enforced, `strict` or not).
pub fn response_format(obj: &Map<String, Value>) -> Result<OutputFormat, ApiError> {
    let format = match obj.get("response_format") {
        None | Some(Value::Null) => return Ok(OutputFormat::Free),
        Some(Value::Object(format)) => format,
        Some(other) => {
            return Err(ApiError::invalid(
                "response_format",
                format!("`response_format` must be an object, got {}", kind(other)),
            ))
        }
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(OutputFormat::Free),
        Some("json_object") => Ok(OutputFormat::JsonObject),
        Some("json_schema") => {
            let schema = format
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "response_format.json_schema.schema",
                        "`response_format.json_schema.schema` is required",
                    )
                })?;
            if !schema.is_object() {
                return Err(ApiError::invalid(
                    "response_format.json_schema.schema",
                    "`response_format.json_schema.schema` must be a JSON Schema object",
                ));
            }
            let format = OutputFormat::JsonSchema(schema.to_string());
            format.validate().map_err(|e| {
                ApiError::invalid("response_format.json_schema.schema", e.to_string())
            })?;
            Ok(format)
        }
        other => Err(ApiError::invalid(
            "response_format.type",
            format!(
                "`response_format.type` must be text, json_object or json_schema, got {other:?}"
            ),
        )),
    }
}

/// `at.field` is missing (or not what it must be).
fn required(at: &str, field: &str) -> ApiError {
    ApiError::invalid(
        &format!("{at}.{field}"),
        format!("`{at}.{field}` is required"),
    )
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Tool {
    /// A tool from the object that holds its `name` and `description` (`at` names it in
    /// errors), with the schema of its arguments.
    pub(crate) fn read(
        fields: &Map<String, Value>,
        at: &str,
        parameters: Value,
    ) -> Result<Self, ApiError> {
        let name = fields
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| valid_name(n))
            .ok_or_else(|| {
                ApiError::invalid(
                    &format!("{at}.name"),
                    format!("`{at}.name` must be 1-64 letters, digits, _ or -"),
                )
            })?;
        Ok(Tool {
            name: name.to_owned(),
            description: fields
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            parameters,
        })
    }
}

fn tool(value: &Value, i: usize) -> Result<Tool, ApiError> {
    let at = format!("tools[{i}]");
    if value.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ApiError::invalid(
            &format!("{at}.type"),
            format!("`{at}.type` must be \"function\""),
        ));
    }
    let function = value
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| required(&at, "function"))?;
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p) if p.is_object() => p.clone(),
        Some(other) => {
            return Err(ApiError::invalid(
                &format!("{at}.function.parameters"),
                format!(
                    "`{at}.function.parameters` must be a JSON Schema object, got {}",
                    kind(other)
                ),
            ))
        }
    };
    Tool::read(function, &format!("{at}.function"), parameters)
}

/// `tools`, `tool_choice` and `parallel_tool_calls`; `None` when no tool may be called
/// (none declared, or `tool_choice: "none"`).
pub fn parse(obj: &Map<String, Value>) -> Result<Option<Tools>, ApiError> {
    let tools = tool_list(obj, tool)?;
    let choice = match obj.get("tool_choice") {
        None | Some(Value::Null) => Some(ToolChoice::Auto),
        Some(Value::String(s)) if s == "auto" => Some(ToolChoice::Auto),
        Some(Value::String(s)) if s == "none" => None,
        Some(Value::String(s)) if s == "required" => Some(ToolChoice::Required),
        Some(Value::Object(named)) => {
            let name = named
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice.function.name",
                        "a named `tool_choice` needs `function.name`",
                    )
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice.function.name",
                    format!("`tool_choice` names `{name}`, which is not among `tools`"),
                ));
            }
            Some(ToolChoice::Named(name.to_owned()))
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "`tool_choice` must be none, auto, required or a named function, got {other}"
                ),
            ))
        }
    };
    let parallel = boolean(obj, "parallel_tool_calls")?.unwrap_or(true);
    offer(tools, choice, parallel)
}

/// The `tools` array read with `read` (each tool, by index), at most [`MAX_TOOLS`].
pub(crate) fn tool_list(
    obj: &Map<String, Value>,
    read: impl Fn(&Value, usize) -> Result<Tool, ApiError>,
) -> Result<Vec<Tool>, ApiError> {
    match obj.get("tools") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) if list.len() <= MAX_TOOLS => {
            list.iter().enumerate().map(|(i, t)| read(t, i)).collect()
        }
        Some(Value::Array(list)) => Err(ApiError::invalid(
            "tools",
            format!("{} tools, limit {MAX_TOOLS}", list.len()),
        )),
        Some(other) => Err(ApiError::invalid(
            "tools",
            format!("`tools` must be an array, got {}", kind(other)),
        )),
    }
}

/// The tools a request offers under `choice` (`None`: no tool may be called); a choice
/// that asks for a call needs tools.
pub(crate) fn offer(
    tools: Vec<Tool>,
    choice: Option<ToolChoice>,
    parallel: bool,
) -> Result<Option<Tools>, ApiError> {
    if tools.is_empty() {
        if choice.as_ref().is_some_and(|c| *c != ToolChoice::Auto) {
            return Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` asks for a tool call, but `tools` declares none",
            ));
        }
        return Ok(None);
    }
    Ok(choice.map(|choice| Tools {
        tools,
        choice,
        parallel,
    }))
}

impl Tools {
    fn offered(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().filter(move |t| match &self.choice {
            ToolChoice::Named(name) => &t.name == name,
            _ => true,
        })
    }

    /// The system note that presents the tools and the answer's shape.
    pub fn instructions(&self) -> String {
        let mut note = String::from("You can call these tools:\n");
        for tool in self.offered() {
            note.push_str(&format!(
                "- {}: {}\n  arguments (JSON Schema): {}\n",
                tool.name, tool.description, tool.parameters
            ));
        }
        let call = r#"{"tool_calls": [{"name": "<tool>", "arguments": {<arguments>}}]}"#;
        note.push_str(&match &self.choice {
            ToolChoice::Auto => format!(
                "Answer with one JSON object. To call tools: {call}. To answer without a tool: {{\"response\": \"<your answer>\"}}. When a tool result is given, use it to answer."
            ),
            ToolChoice::Required => format!("Answer by calling a tool, as one JSON object: {call}."),
            ToolChoice::Named(name) => {
                format!("Answer by calling the tool `{name}`, as one JSON object: {call}.")
            }
        });
        note
    }

    /// The JSON Schema the answer is held to.
    pub fn format(&self) -> OutputFormat {
        let calls: Vec<Value> = self
            .offered()
            .map(|tool| {
                json!({"type": "object",
                       "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
                       "required": ["name", "arguments"], "additionalProperties": false})
            })
            .collect();
        let item = if calls.len() == 1 {
            calls[0].clone()
        } else {
            json!({"anyOf": calls})
        };
        let most = if self.parallel { MAX_PARALLEL_CALLS } else { 1 };
        let tool_calls = json!({"type": "object",
            "properties": {"tool_calls": {"type": "array", "items": item, "minItems": 1, "maxItems": most}},
            "required": ["tool_calls"], "additionalProperties": false});
        let schema = match self.choice {
            ToolChoice::Auto => json!({"anyOf": [tool_calls, {"type": "object",
                "properties": {"response": {"type": "string"}},
                "required": ["response"], "additionalProperties": false}]}),
            _ => tool_calls,
        };
        OutputFormat::JsonSchema(schema.to_string())
    }

    /// Reads an answer written under [`Self::format`]; `call_id` names each call's id
    /// from its index. Text that is not such an answer (cut short by `max_tokens`) is
    /// returned as text.
    pub fn answer(&self, text: &str, call_id: impl Fn(usize) -> String) -> Answer {
        let Ok(Value::Object(answer)) = serde_json::from_str::<Value>(text) else {
            return Answer::Text(text.to_owned());
        };
        if let Some(Value::String(response)) = answer.get("response") {
            return Answer::Text(response.clone());
        }
        let Some(Value::Array(calls)) = answer.get("tool_calls") else {
            return Answer::Text(text.to_owned());
        };
        let calls: Vec<ToolCall> = calls
            .iter()
            .enumerate()
            .filter_map(|(i, call)| {
                Some(ToolCall {
                    id: call_id(i),
                    name: call.get("name")?.as_str()?.to_owned(),
                    arguments: call.get("arguments")?.to_string(),
                })
            })
            .collect();
        if calls.is_empty() {
            Answer::Text(text.to_owned())
        } else {
            Answer::Calls(calls)
        }
    }
}

impl Tools {
    /// The text of an answer cut short (`max_tokens`): the part of a `{"response": "…`
    /// string written so far, or the raw text when it is not one.
    pub fn cut_answer(&self, text: &str) -> String {
        response_so_far(text).unwrap_or_else(|| text.to_owned())
    }
}

/// How a `{"response": …}` answer begins (the format is compiled compact).
const RESPONSE_OPENING: &str = r#"{"response": ""#;

/// The text of a `{"response": "…` answer as far as it is written (a half-written
/// escape left out, the closing `"}` too), or `None` when it is not such an answer.
fn response_so_far(text: &str) -> Option<String> {
    decode_open_string(text.strip_prefix(RESPONSE_OPENING)?).map(|(read, _)| read)
}

/// Decodes the body of a JSON string that may stop anywhere: as far as it is whole (a
/// half-written escape, and a closing `"}` if there, left out), with how many bytes of
/// `raw` that took. A string body cut where no escape is open decodes piece by piece,
/// so a stream can decode each new piece alone.
fn decode_open_string(raw: &str) -> Option<(String, usize)> {
    // At most `\uD83D\uDE0` (11 bytes) of a half escape, or `"}`, to leave out.
    let mut open = raw;
    for _ in 0..12 {
        if let Ok(Value::String(read)) = serde_json::from_str(&format!("\"{open}\"")) {
            return Some((read, open.len()));
        }
        let mut chars = open.chars();
        chars.next_back()?;
        open = chars.as_str();
    }
    None
}

/// A tool answer arriving token by token: the text of a `{"response": "…"}` answer is
/// released as it is written (so an `auto` request streams like any other), tool calls
/// are held until the answer is whole.
#[derive(Clone, Debug, Default)]
pub struct HeldAnswer {
    text: String,
    /// Bytes of `text` decoded and released so far (after the opening; 0: none yet).
    decoded: usize,
    /// Bytes of the response's text already released.
    released: usize,
}

impl HeldAnswer {
    /// Takes a delta; returns the response text it made final (empty if none). Only the
    /// part not decoded yet is read: a token costs its own length, not the answer's.
    pub fn push(&mut self, delta: &str) -> String {
        self.text.push_str(delta);
        if self.decoded == 0 {
            if !self.text.starts_with(RESPONSE_OPENING) {
                return String::new();
            }
            self.decoded = RESPONSE_OPENING.len();
        }
        match decode_open_string(&self.text[self.decoded..]) {
            Some((read, used)) => {
                self.decoded += used;
                self.released += read.len();
                read
            }
            None => String::new(),
        }
    }

    /// Everything received.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// `answer` less what was released already.
    pub fn unreleased(&self, answer: Answer) -> Answer {
        match answer {
            Answer::Text(text) if text.is_char_boundary(self.released.min(text.len())) => {
                Answer::Text(text[self.released.min(text.len())..].to_owned())
            }
            other => other,
        }
    }
}

/// The conversation with the tools' note first (in the system message, or as one).
pub fn with_instructions(mut messages: Vec<ChatMessage>, tools: &Tools) -> Vec<ChatMessage> {
    let note = tools.instructions();
    match messages.first_mut() {
        Some(first) if first.role == Role::System => {
            first.content = format!("{}\n\n{note}", first.content);
        }
        _ => messages.insert(
            0,
            ChatMessage {
                role: Role::System,
                content: note,
            },
        ),
    }
    messages
}

/// Tool calls an assistant message made and tool results, written as the model is
/// asked to write them. `names` remembers each call id's tool for its result.
pub(crate) fn message(
    m: &Value,
    i: usize,
    names: &mut HashMap<String, String>,
) -> Result<Option<ChatMessage>, ApiError> {
    match m.get("role").and_then(Value::as_str) {
        Some("assistant") => {
            let Some(Value::Array(calls)) = m.get("tool_calls") else {
                return Ok(None);
            };
            let mut written = Vec::new();
            for (j, call) in calls.iter().enumerate() {
                let at = format!("messages[{i}].tool_calls[{j}]");
                let function = call
                    .get("function")
                    .ok_or_else(|| required(&at, "function"))?;
                let name = function
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| required(&at, "function.name"))?;
                let arguments = match function.get("arguments") {
                    Some(Value::String(text)) => {
                        serde_json::from_str(text).unwrap_or(Value::String(text.clone()))
                    }
                    Some(other) => other.clone(),
                    None => json!({}),
                };
                if let Some(id) = call.get("id").and_then(Value::as_str) {
                    names.insert(id.to_owned(), name.to_owned());
                }
                written.push(json!({"name": name, "arguments": arguments}));
            }
            Ok(Some(ChatMessage {
                role: Role::Assistant,
                content: json!({"tool_calls": written}).to_string(),
            }))
        }
        Some("tool") | Some("function") => {
            let content = text_content(
                m.get("content").unwrap_or(&Value::Null),
                &format!("messages[{i}].content"),
                &["text"],
            )?;
            let id = m
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let name = names
                .get(id)
                .cloned()
                .or_else(|| m.get("name").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| "the tool".to_owned());
            Ok(Some(ChatMessage {
                role: Role::User,
                content: format!("Result of {name}: {content}"),
            }))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::api::fields::test_object as object;

    const WEATHER: &str = r#"{"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#;

    #[test]
    fn choices_parse_and_bad_ones_name_the_field() {
        let with = |rest: &str| parse(&object(&format!(r#"{{"tools": [{WEATHER}]{rest}}}"#)));
        assert_eq!(with("").unwrap().unwrap().choice, ToolChoice::Auto);
        assert!(with(r#", "tool_choice": "none""#).unwrap().is_none());
        assert_eq!(
            with(r#", "tool_choice": "required""#)
                .unwrap()
                .unwrap()
                .choice,
            ToolChoice::Required
        );
        let named =
            with(r#", "tool_choice": {"type": "function", "function": {"name": "get_weather"}}"#);
        assert_eq!(
            named.unwrap().unwrap().choice,
            ToolChoice::Named("get_weather".into())
        );
        let missing =
            with(r#", "tool_choice": {"type": "function", "function": {"name": "nope"}}"#);
        assert_eq!(
            missing.unwrap_err().param.as_deref(),
            Some("tool_choice.function.name")
        );
        let bad = parse(&object(
            r#"{"tools": [{"type": "function", "function": {"name": "a b"}}]}"#,
        ));
        assert_eq!(
            bad.unwrap_err().param.as_deref(),
            Some("tools[0].function.name")
        );
        let none = parse(&object(r#"{"tool_choice": "required"}"#));
        assert_eq!(none.unwrap_err().param.as_deref(), Some("tool_choice"));
        assert!(parse(&object(r#"{"tool_choice": "auto"}"#))
            .unwrap()
            .is_none());
    }

    #[test]
    fn response_formats_parse() {
        assert_eq!(response_format(&object("{}")).unwrap(), OutputFormat::Free);
        assert_eq!(
            response_format(&object(r#"{"response_format": {"type": "json_object"}}"#)).unwrap(),
            OutputFormat::JsonObject
        );
        let schema = response_format(&object(
            r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}"#,
        ));
        assert_eq!(
            schema.unwrap(),
            OutputFormat::JsonSchema(r#"{"type":"object"}"#.into())
        );
        let err = response_format(&object(r#"{"response_format": {"type": "yaml"}}"#)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("response_format.type"));
        let err = response_format(&object(r#"{"response_format": {"type": "json_schema"}}"#))
            .unwrap_err();
        assert_eq!(
            err.param.as_deref(),
            Some("response_format.json_schema.schema")
        );
    }

    #[test]
    fn answers_read_back_as_calls_or_text() {
        let tools = parse(&object(&format!(r#"{{"tools": [{WEATHER}]}}"#)))
            .unwrap()
            .unwrap();
        let id = |i: usize| format!("call_{i}");
        assert_eq!(
            tools.answer(
                r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}"#,
                id
            ),
            Answer::Calls(vec![ToolCall {
                id: "call_0".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }])
        );
        assert_eq!(
            tools.answer(r#"{"response": "Hi!"}"#, id),
            Answer::Text("Hi!".into())
        );
        assert_eq!(
            tools.answer(r#"{"tool_ca"#, id),
            Answer::Text(r#"{"tool_ca"#.into())
        );
        // The schema names the tool and holds it to its parameters.
        let OutputFormat::JsonSchema(schema) = tools.format() else {
            panic!()
        };
        assert!(schema.contains(r#""const":"get_weather""#), "{schema}");
        assert!(
            schema.contains(r#""response""#),
            "auto allows a text answer: {schema}"
        );
    }

    #[test]
    fn earlier_calls_and_results_are_written_as_the_model_answers() {
        let mut names = HashMap::new();
        let call = serde_json::from_str(
            r#"{"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}"#,
        )
        .unwrap();
        let written = message(&call, 1, &mut names).unwrap().unwrap();
        assert_eq!(
            written.content,
            r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}"#
        );
        let result = serde_json::from_str(
            r#"{"role": "tool", "tool_call_id": "call_1", "content": "18 °C"}"#,
        )
        .unwrap();
        let written = message(&result, 2, &mut names).unwrap().unwrap();
        assert_eq!(
            (written.role, written.content.as_str()),
            (Role::User, "Result of get_weather: 18 °C")
        );
    }
}
