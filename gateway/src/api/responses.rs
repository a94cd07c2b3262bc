//! OpenAI's Responses API, stateless (`POST /v1/responses`): `input` (a string or
//! message items) and `instructions` become a chat prompt; the answer is a `response`
//! object with one `message` output item, or streamed as the Responses events
//! (`response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`…, `…output_text.done`,
//! `…content_part.done`, `…output_item.done`, `response.completed`), each with its
//! `sequence_number`. Nothing is stored: `previous_response_id`, `conversation` and
//! `background` are refused by name, as are tools and structured output.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use sharemesh_protocol::{ChatMessage, FinishReason, OutputFormat, Prompt, Role, Sampling};
use tokio::sync::mpsc;

use crate::api::encode::{encode, tagged, Encoder, Finished, Token};
use crate::api::error::ApiError;
use crate::api::fields::{boolean, integer, kind, number, object, string, text_content};
use crate::api::openai::{routing, top_p, CompletionRequest};
use crate::dispatch::DispatchEvent;
use crate::route::{RouteError, RouteRequest};

/// Fields a stateless gateway without tools cannot honour: refused when set.
const UNSERVED: &[(&str, &str)] = &[
    (
        "previous_response_id",
        "responses are not stored: send the whole conversation in `input`",
    ),
    (
        "conversation",
        "conversations are not stored: send the whole conversation in `input`",
    ),
    ("background", "background responses are not supported"),
    ("tools", "tool calling is not supported yet"),
    ("prompt", "stored prompts are not supported"),
];

/// `text.format`: `text`, `json_object`, or `json_schema` with its `schema` (the
/// Responses API puts `name`, `schema` and `strict` beside `type`).
fn text_format(obj: &Map<String, Value>) -> Result<OutputFormat, ApiError> {
    let Some(format) = obj.get("text").and_then(|t| t.get("format")) else {
        return Ok(OutputFormat::Free);
    };
    match format.get("type").and_then(Value::as_str) {
        None | Some("text") => Ok(OutputFormat::Free),
        Some("json_object") => Ok(OutputFormat::JsonObject),
        Some("json_schema") => match format.get("schema") {
            Some(schema) if schema.is_object() => {
                let format = OutputFormat::JsonSchema(schema.to_string());
                format
                    .validate()
                    .map_err(|e| ApiError::invalid("text.format.schema", e.to_string()))?;
                Ok(format)
            }
            _ => Err(ApiError::invalid(
                "text.format.schema",
                "`text.format.schema` must be a JSON Schema object",
            )),
        },
        Some(other) => Err(ApiError::invalid(
            "text.format.type",
            format!("`text.format.type` must be text, json_object or json_schema, got `{other}`"),
        )),
    }
}

/// `instructions` and `input` as a chat prompt.
fn prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let mut chat = Vec::new();
    if let Some(instructions) = string(obj, "instructions")? {
        chat.push(ChatMessage {
            role: Role::System,
            content: instructions.to_owned(),
        });
    }
    match obj.get("input") {
        Some(Value::String(text)) => chat.push(ChatMessage {
            role: Role::User,
            content: text.clone(),
        }),
        Some(Value::Array(items)) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                let at = format!("input[{i}]");
                let kind_of = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                if kind_of != "message" {
                    return Err(ApiError::invalid(
                        &format!("{at}.type"),
                        format!("`{kind_of}` items are not supported: only messages"),
                    ));
                }
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("user") => Role::User,
                    Some("assistant") => Role::Assistant,
                    Some("system" | "developer") => Role::System,
                    other => {
                        return Err(ApiError::invalid(
                            &format!("{at}.role"),
                            format!("`{at}.role` must be user, assistant, system or developer, got {other:?}"),
                        ))
                    }
                };
                let content = text_content(
                    item.get("content").unwrap_or(&Value::Null),
                    &format!("{at}.content"),
                    &["input_text", "output_text", "text"],
                )?;
                chat.push(ChatMessage { role, content });
            }
        }
        None | Some(Value::Null) => return Err(ApiError::invalid("input", "`input` is required")),
        Some(other) => {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "`input` must be a string or a non-empty list of messages, got {}",
                    kind(other)
                ),
            ))
        }
    }
    Ok(Prompt::Chat(chat))
}

/// Parses a `/v1/responses` body.
pub fn parse(body: &[u8], headers: &HeaderMap) -> Result<CompletionRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_json(format!("the request body is not valid JSON: {e}")))?;
    let obj = object(&value)?;
    for (field, why) in UNSERVED {
        let set = match obj.get(*field) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Array(items)) => !items.is_empty(),
            Some(_) => true,
        };
        if set {
            return Err(ApiError::invalid(field, format!("`{field}`: {why}")));
        }
    }
    if integer(obj, "top_logprobs", 0, 20)?.is_some_and(|n| n > 0) {
        return Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs`: log-probabilities are served on /v1/chat/completions",
        ));
    }
    let model = string(obj, "model")?
        .ok_or_else(|| ApiError::invalid("model", "`model` is required"))?
        .to_owned();
    let sampling = Sampling {
        temperature: number(obj, "temperature", 0.0, 2.0)?.unwrap_or(1.0) as f32,
        top_p: top_p(obj)?,
        max_tokens: integer(obj, "max_output_tokens", 1, 131_072)?.unwrap_or(256) as u32,
        format: text_format(obj)?,
        ..Sampling::default()
    };
    Ok(CompletionRequest {
        route: RouteRequest {
            model,
            prompt: prompt(obj)?,
            sampling,
            routing: routing(obj, headers)?,
        },
        stream: boolean(obj, "stream")?.unwrap_or(false),
        include_usage: true,
        chat: true,
        n: 1,
        tools: None,
    })
}

/// What the response object repeats of the request, and the ids it names.
pub(crate) struct Shape {
    pub id: String,
    pub item_id: String,
    pub model: String,
    pub created_at: u64,
    pub prompt_tokens: u32,
    pub request: CompletionRequest,
    pub job_header: HeaderValue,
    pub provider_header: HeaderValue,
}

impl Shape {
    pub(crate) fn new(
        job: &str,
        request: CompletionRequest,
        prompt_tokens: u32,
        job_header: HeaderValue,
        provider_header: HeaderValue,
    ) -> Self {
        Self {
            id: format!("resp_{job}"),
            item_id: format!("msg_{job}"),
            model: request.route.model.clone(),
            created_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            prompt_tokens,
            request,
            job_header,
            provider_header,
        }
    }

    fn item(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
        };
        json!({"type": "message", "id": self.item_id, "status": status, "role": "assistant", "content": content})
    }

    /// The `response` object: `in_progress` while streaming, then `completed` (or
    /// `incomplete` when `max_output_tokens` cut it).
    fn response(&self, output: Option<(&str, FinishReason, u32)>, extra: Value) -> Value {
        let (status, items, usage, incomplete) = match output {
            None => ("in_progress", json!([]), Value::Null, Value::Null),
            Some((text, finish, completion)) => {
                let cut = finish == FinishReason::Length;
                (
                    if cut { "incomplete" } else { "completed" },
                    json!([self.item(text, "completed")]),
                    json!({"input_tokens": self.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                           "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                           "total_tokens": self.prompt_tokens + completion}),
                    if cut {
                        json!({"reason": "max_output_tokens"})
                    } else {
                        Value::Null
                    },
                )
            }
        };
        let sampling = &self.request.route.sampling;
        // The SDK's `responses.parse` reads the format back from the response.
        let format = match &sampling.format {
            OutputFormat::Free => json!({"type": "text"}),
            OutputFormat::JsonObject => json!({"type": "json_object"}),
            OutputFormat::JsonSchema(schema) => json!({"type": "json_schema", "name": "response",
                "schema": serde_json::from_str::<Value>(schema).unwrap_or(Value::Null), "strict": true}),
        };
        let mut body = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": items, "usage": usage, "incomplete_details": incomplete,
            "error": null, "instructions": null, "max_output_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "parallel_tool_calls": false,
            "tool_choice": "none", "tools": [], "text": {"format": format}, "store": false,
        });
        if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
            body.extend(extra);
        }
        body
    }
}

fn sharemesh_block(providers: &[sharemesh_protocol::NodeId], cost: u64) -> Value {
    json!({"sharemesh": {"providers": providers.iter().map(ToString::to_string).collect::<Vec<_>>(), "cost_nano_usd": cost}})
}

fn with_headers(mut response: Response, shape: &Shape) -> Response {
    response
        .headers_mut()
        .insert("x-sharemesh-job", shape.job_header.clone());
    response
        .headers_mut()
        .insert("x-sharemesh-provider", shape.provider_header.clone());
    response
}

/// The whole response, once the dispatcher is done.
pub(crate) async fn whole(
    events: mpsc::Receiver<DispatchEvent>,
    shape: Shape,
) -> Result<Response, ApiError> {
    let answer = crate::api::respond::collect(events).await?;
    let body = shape.response(
        Some((&answer.text, answer.finish, answer.completion_tokens)),
        sharemesh_block(&answer.providers, answer.cost.0),
    );
    Ok(with_headers(Json(body).into_response(), &shape))
}

/// The response streamed as the Responses API's events.
pub(crate) fn stream(events: mpsc::Receiver<DispatchEvent>, shape: Shape) -> Response {
    let headers = (shape.job_header.clone(), shape.provider_header.clone());
    let encoder = ResponseStream {
        shape,
        text: String::new(),
        sequence: 0,
    };
    crate::api::respond::sse(encode(tagged(0, events), encoder), headers.0, headers.1)
}

/// The Responses API's shape of a streamed response: created, in progress, one output
/// item with one text part, its deltas, then each of them done and the response
/// completed (or incomplete at the length limit). Every event carries its type and its
/// place in the stream.
struct ResponseStream {
    shape: Shape,
    text: String,
    sequence: u64,
}

impl ResponseStream {
    fn event(&mut self, name: &str, mut data: Value) -> Event {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        Event::default().event(name).data(data.to_string())
    }
}

impl Encoder for ResponseStream {
    fn opening(&mut self) -> Vec<Event> {
        let shape = &self.shape;
        let created = json!({"response": shape.response(None, json!({}))});
        let added = json!({"output_index": 0, "item": shape.item("", "in_progress")});
        let part = json!({"item_id": shape.item_id, "output_index": 0, "content_index": 0,
                          "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}});
        vec![
            self.event("response.created", created.clone()),
            self.event("response.in_progress", created),
            self.event("response.output_item.added", added),
            self.event("response.content_part.added", part),
        ]
    }

    fn token(&mut self, _: usize, token: Token) -> Vec<Event> {
        if token.text.is_empty() {
            return Vec::new();
        }
        self.text.push_str(&token.text);
        let delta = json!({"item_id": self.shape.item_id, "output_index": 0,
                           "content_index": 0, "delta": token.text, "logprobs": []});
        vec![self.event("response.output_text.delta", delta)]
    }

    fn finished(&mut self, _: usize, done: Finished) -> (Vec<Event>, bool) {
        let (shape, text) = (&self.shape, &self.text);
        let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
        let last = if done.finish == FinishReason::Length {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let events = [
            (
                "response.output_text.done",
                json!({"item_id": shape.item_id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
            ),
            (
                "response.content_part.done",
                json!({"item_id": shape.item_id, "output_index": 0, "content_index": 0, "part": part}),
            ),
            (
                "response.output_item.done",
                json!({"output_index": 0, "item": shape.item(text, "completed")}),
            ),
            (
                last,
                json!({"response": shape.response(Some((text, done.finish, done.completion_tokens)), sharemesh_block(&done.providers, done.cost.0))}),
            ),
        ];
        let frames = events
            .into_iter()
            .map(|(name, data)| self.event(name, data))
            .collect();
        (frames, true)
    }

    fn failed(&mut self, error: RouteError) -> Vec<Event> {
        let error = ApiError::from(error);
        let data = json!({"code": error.code, "message": error.message, "param": error.param});
        vec![self.event("error", data)]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse_body(json: &str) -> Result<CompletionRequest, ApiError> {
        parse(json.as_bytes(), &HeaderMap::new())
    }

    #[test]
    fn input_and_instructions_become_a_chat_prompt() {
        let req = parse_body(r#"{"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0}"#).unwrap();
        let Prompt::Chat(chat) = &req.route.prompt else {
            panic!()
        };
        assert_eq!((chat[0].role, chat[1].role), (Role::System, Role::User));
        assert_eq!(
            (
                req.route.sampling.max_tokens,
                req.route.sampling.temperature
            ),
            (9, 0.0)
        );
        let items = parse_body(
            r#"{"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}]},
                                        {"type": "message", "role": "assistant", "content": "b"},
                                        {"role": "user", "content": "c"}]}"#,
        )
        .unwrap();
        let Prompt::Chat(chat) = &items.route.prompt else {
            panic!()
        };
        assert_eq!(
            chat.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn what_a_stateless_gateway_cannot_do_is_refused_by_name() {
        for (extra, field) in [
            (
                r#""previous_response_id": "resp_1""#,
                "previous_response_id",
            ),
            (r#""tools": [{"type": "function"}]"#, "tools"),
            (r#""background": true"#, "background"),
            (
                r#""text": {"format": {"type": "json_schema"}}"#,
                "text.format.schema",
            ),
            (
                r#""text": {"format": {"type": "yaml"}}"#,
                "text.format.type",
            ),
            (r#""top_logprobs": 3"#, "top_logprobs"),
            (r#""max_output_tokens": 0"#, "max_output_tokens"),
        ] {
            let err =
                parse_body(&format!(r#"{{"model": "m", "input": "x", {extra}}}"#)).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(field), "{extra}");
        }
        let err = parse_body(
            r#"{"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}"#,
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input[0].type"));
        assert_eq!(
            parse_body(r#"{"model": "m"}"#)
                .unwrap_err()
                .param
                .as_deref(),
            Some("input")
        );
    }
}
