//! The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`)
//! over the same dispatcher as the OpenAI routes: the request becomes a chat prompt
//! (system, then the turns), and the answer is shaped as a `message`, or streamed with
//! Anthropic's event sequence (`message_start`, `content_block_start`, `ping`,
//! `content_block_delta`…, `content_block_stop`, `message_delta` with the usage,
//! `message_stop`). Errors keep Anthropic's shape: `{"type": "error", "error": {"type",
//! "message"}}`. Fields sharemesh cannot honour yet (tools, images, extended thinking,
//! structured output, an assistant prefill) are refused by name, never ignored; hints
//! without an effect here (`metadata`, `cache_control`, `service_tier`, `speed`,
//! `inference_geo`, `output_config.effort`) are accepted. `temperature`, `top_p` and
//! `top_k` are honoured when sent (the newest SDK no longer has them as arguments:
//! `extra_body`); the default temperature is Anthropic's, 1.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use sharemesh_protocol::{ChatMessage, FinishReason, Prompt, Role, Sampling};
use tokio::sync::mpsc;

use crate::api::encode::{encode, tagged, Encoder, Finished, Token};
use crate::api::error::ApiError;
use crate::api::fields::{boolean, integer, kind, number, object, string, text_content};
use crate::api::openai::{message_list, routing, top_p, CompletionRequest};
use crate::api::tools::Answer;
use crate::dispatch::DispatchEvent;
use crate::route::{RouteError, RouteRequest};

/// Request fields sharemesh does not serve yet: refused with a 400 naming the field.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("thinking", "extended thinking is not supported"),
    ("mcp_servers", "MCP servers are not supported"),
    ("container", "containers are not supported"),
];

/// An error in Anthropic's shape, with the status the OpenAI routes would give.
pub fn error_response(err: &ApiError) -> Response {
    let kind = match err.status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::PAYMENT_REQUIRED => "billing_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        _ => "api_error",
    };
    crate::api::error::with_retry_after(
        (err.status, Json(error_body(kind, &err.message))).into_response(),
        err.retry_after,
    )
}

fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// The text of a `system` value or of a message's `content`: a string, or `text`
/// blocks (`tool_use`, `tool_result`, `image`, … refused by name).
fn text_of(value: &Value, param: &str) -> Result<String, ApiError> {
    if value.is_null() {
        return Err(ApiError::invalid(param, format!("`{param}` is required")));
    }
    text_content(value, param, &["text"])
}

/// `system` and `messages` as a chat prompt.
fn prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let mut chat = Vec::new();
    match obj.get("system") {
        None | Some(Value::Null) => {}
        Some(system) => {
            let content = text_of(system, "system")?;
            if !content.is_empty() {
                chat.push(ChatMessage {
                    role: Role::System,
                    content,
                });
            }
        }
    }
    let list = message_list(obj)?;
    let mut tool_names = std::collections::HashMap::new();
    for (i, message) in list.iter().enumerate() {
        let role = match message.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            other => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!("`messages[{i}].role` must be user or assistant, got {other:?}"),
                ))
            }
        };
        let param = format!("messages[{i}].content");
        let value = message.get("content").unwrap_or(&Value::Null);
        let content = match crate::api::anthropic_tools::content(value, &param, &mut tool_names)? {
            Some(written) => written,
            None => text_of(value, &param)?,
        };
        chat.push(ChatMessage { role, content });
    }
    if chat.last().is_some_and(|m| m.role == Role::Assistant) {
        return Err(ApiError::invalid(
            &format!("messages[{}]", list.len() - 1),
            "a final assistant message (a prefill to continue) is not supported: end with a user turn",
        ));
    }
    Ok(Prompt::Chat(chat))
}

fn stop_sequences(obj: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    match obj.get("stop_sequences") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) if !s.is_empty() => Ok(s.clone()),
                _ => Err(ApiError::invalid(
                    &format!("stop_sequences[{i}]"),
                    "each stop sequence must be a non-empty string",
                )),
            })
            .collect(),
        Some(other) => Err(ApiError::invalid(
            "stop_sequences",
            format!(
                "`stop_sequences` must be a list of strings, got {}",
                kind(other)
            ),
        )),
    }
}

/// Parses a `/v1/messages` body (`count_only`: a `count_tokens` body, which has no
/// `max_tokens`).
pub fn parse(
    body: &[u8],
    headers: &HeaderMap,
    count_only: bool,
) -> Result<CompletionRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_json(format!("the request body is not valid JSON: {e}")))?;
    let obj = object(&value)?;
    for (field, why) in UNSUPPORTED {
        let present = match obj.get(*field) {
            None | Some(Value::Null) => false,
            Some(Value::Array(items)) => !items.is_empty(),
            Some(_) => true,
        };
        if present {
            return Err(ApiError::invalid(field, format!("`{field}`: {why}")));
        }
    }
    let model = string(obj, "model")?
        .ok_or_else(|| ApiError::invalid("model", "`model` is required"))?
        .to_owned();
    let max_tokens = match integer(obj, "max_tokens", 1, 131_072)? {
        Some(n) => n as u32,
        None if count_only => 1,
        None => return Err(ApiError::invalid("max_tokens", "`max_tokens` is required")),
    };
    let sampling = Sampling {
        temperature: number(obj, "temperature", 0.0, 1.0)?.unwrap_or(1.0) as f32,
        top_p: top_p(obj)?,
        top_k: integer(obj, "top_k", 0, 100_000)?.unwrap_or(0) as u32,
        max_tokens,
        stop: stop_sequences(obj)?,
        ..Sampling::default()
    };
    let mut sampling = sampling;
    sampling.format = crate::api::anthropic_tools::output_format(obj)?;
    let tools = crate::api::anthropic_tools::parse(obj)?;
    let mut prompt = prompt(obj)?;
    if let Some(tools) = &tools {
        if !sampling.format.is_free() {
            return Err(ApiError::invalid(
                "output_config.format",
                "`output_config.format` and `tools` cannot be combined: a tool use has its own format",
            ));
        }
        sampling.format = tools.format();
        if let Prompt::Chat(messages) = prompt {
            prompt = Prompt::Chat(crate::api::tools::with_instructions(messages, tools));
        }
    }
    match obj.get("metadata") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(other) => {
            return Err(ApiError::invalid(
                "metadata",
                format!("`metadata` must be an object, got {}", kind(other)),
            ))
        }
    }
    Ok(CompletionRequest {
        route: RouteRequest {
            model,
            prompt,
            sampling,
            routing: routing(obj, headers)?,
        },
        stream: boolean(obj, "stream")?.unwrap_or(false),
        include_usage: true,
        chat: true,
        n: 1,
        tools: tools.map(std::sync::Arc::new),
    })
}

/// Why the answer stopped, in Anthropic's words: `max_tokens`, `stop_sequence` (with
/// the sequence) when the full completion shows one past the text returned, or
/// `end_turn`.
pub fn stop_reason(
    finish: FinishReason,
    stops: &[String],
    returned: &str,
    full: Option<&str>,
) -> (&'static str, Option<String>) {
    match finish {
        FinishReason::Length => ("max_tokens", None),
        _ => {
            let tail = full.and_then(|f| f.get(returned.len()..)).unwrap_or("");
            let hit = stops
                .iter()
                .filter_map(|s| tail.find(s.as_str()).map(|at| (at, s)))
                .min_by_key(|(at, _)| *at)
                .map(|(_, s)| s.clone());
            match hit {
                Some(sequence) => ("stop_sequence", Some(sequence)),
                None => ("end_turn", None),
            }
        }
    }
}

/// Token ids → text with a model's vocabulary, if held.
pub(crate) type Decoder = Box<dyn Fn(&[u32]) -> Option<String> + Send + Sync>;

/// What the response needs besides the dispatcher's events.
pub(crate) struct Reply {
    pub id: String,
    pub model: String,
    pub prompt_tokens: u32,
    pub stops: Vec<String>,
    /// Decodes the completion's token ids with the model's vocabulary (`None`: none
    /// held), to tell a stop sequence from the end of the turn.
    pub decode: Decoder,
    pub job_header: HeaderValue,
    pub provider_header: HeaderValue,
    /// Tools the answer may use: it is read back into `tool_use` blocks.
    pub tools: Option<std::sync::Arc<crate::api::tools::Tools>>,
}

impl Reply {
    /// What a finished answer says under the tools (`None`: no tools).
    fn answer(&self, text: &str, finish: FinishReason) -> Option<Answer> {
        let tools = self.tools.as_ref()?;
        if finish != FinishReason::Stop {
            return Some(Answer::Text(tools.cut_answer(text)));
        }
        let job = self.id.trim_start_matches("msg_");
        Some(tools.answer(text, |i| format!("toolu_{job}_{i}")))
    }

    /// The stop reason: `tool_use` for calls, else as [`Self::stopped`] says.
    fn reason(
        &self,
        answer: Option<&Answer>,
        finish: FinishReason,
        text: &str,
        ids: &[u32],
    ) -> (&'static str, Option<String>) {
        match answer {
            Some(Answer::Calls(_)) => ("tool_use", None),
            Some(Answer::Text(_)) => (
                if finish == FinishReason::Length {
                    "max_tokens"
                } else {
                    "end_turn"
                },
                None,
            ),
            None => self.stopped(finish, text, ids),
        }
    }

    /// The stop reason and sequence of a completion that returned `text` from the
    /// tokens `ids`.
    fn stopped(
        &self,
        finish: FinishReason,
        text: &str,
        ids: &[u32],
    ) -> (&'static str, Option<String>) {
        let full = (self.decode)(ids);
        stop_reason(finish, &self.stops, text, full.as_deref())
    }
}

fn with_headers(mut response: Response, reply: &Reply) -> Response {
    let headers = response.headers_mut();
    headers.insert("x-sharemesh-job", reply.job_header.clone());
    headers.insert("x-sharemesh-provider", reply.provider_header.clone());
    response
}

/// The whole message, once the dispatcher is done.
pub(crate) async fn whole(
    events: mpsc::Receiver<DispatchEvent>,
    reply: Reply,
) -> Result<Response, ApiError> {
    let answer = crate::api::respond::collect(events).await?;
    let read = reply.answer(&answer.text, answer.finish);
    let (reason, sequence) = reply.reason(
        read.as_ref(),
        answer.finish,
        &answer.text,
        &answer.token_ids,
    );
    let content = match &read {
        Some(read) => crate::api::anthropic_tools::blocks(read),
        None => vec![json!({"type": "text", "text": answer.text})],
    };
    let body = json!({
        "id": reply.id, "type": "message", "role": "assistant", "model": reply.model,
        "content": content,
        "stop_reason": reason, "stop_sequence": sequence,
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": answer.completion_tokens},
        "sharemesh": {"providers": answer.providers.iter().map(ToString::to_string).collect::<Vec<_>>(),
                      "cost_nano_usd": answer.cost.0, "segments": answer.segments},
    });
    Ok(with_headers(Json(body).into_response(), &reply))
}

fn event(name: &str, data: Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// An answer read under tools, as Anthropic's block events: each block's start, its
/// text or its input as one JSON delta, and its stop.
fn block_events(answer: &Answer) -> Vec<Event> {
    let mut frames = Vec::new();
    for (index, block) in crate::api::anthropic_tools::blocks(answer)
        .into_iter()
        .enumerate()
    {
        let (opened, delta) = if block["type"] == "tool_use" {
            let input = block["input"].to_string();
            let mut opened = block;
            opened["input"] = json!({});
            (
                opened,
                json!({"type": "input_json_delta", "partial_json": input}),
            )
        } else {
            let text = block["text"].clone();
            (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": text}),
            )
        };
        frames.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": opened}),
        ));
        frames.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
        frames.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    frames
}

/// A message being streamed: its text and tokens so far, and with tools, the answer
/// held back (a text answer is released as written, in a text block opened then).
#[derive(Default)]
struct Streamed {
    text: String,
    ids: Vec<u32>,
    held: crate::api::tools::HeldAnswer,
    text_open: bool,
}

fn text_delta(text: &str) -> Event {
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
    )
}

impl Streamed {
    /// The events a delta releases: itself (no tools), or the part of a text answer it
    /// made final (opening the text block the first time).
    fn stream(&mut self, tools: bool, delta: &str) -> Vec<Event> {
        if !tools {
            return vec![text_delta(delta)];
        }
        let released = self.held.push(delta);
        if released.is_empty() {
            return Vec::new();
        }
        let mut frames = Vec::new();
        if !self.text_open {
            self.text_open = true;
            frames.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
        }
        frames.push(text_delta(&released));
        frames
    }

    /// The events that close the content: the open text block (with what was not
    /// released yet), or every block of an answer read under tools.
    fn close(&self, read: Option<Answer>) -> Vec<Event> {
        let stop = || {
            event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            )
        };
        match read {
            None => vec![stop()],
            Some(read) if self.text_open => match self.held.unreleased(read) {
                Answer::Text(rest) if rest.is_empty() => vec![stop()],
                Answer::Text(rest) => vec![text_delta(&rest), stop()],
                Answer::Calls(_) => vec![stop()],
            },
            Some(read) => block_events(&read),
        }
    }
}

/// The message streamed as Anthropic's events.
pub(crate) fn stream(events: mpsc::Receiver<DispatchEvent>, reply: Reply) -> Response {
    let headers = (reply.job_header.clone(), reply.provider_header.clone());
    let encoder = MessageStream {
        reply,
        at: Streamed::default(),
    };
    let frames = encode(tagged(0, events), encoder);
    crate::api::respond::sse(frames, headers.0, headers.1)
}

/// Anthropic's shape of a streamed message: its start, one text block (or, with tools,
/// the blocks known at the end), its delta with the stop reason, its stop.
struct MessageStream {
    reply: Reply,
    at: Streamed,
}

impl Encoder for MessageStream {
    fn opening(&mut self) -> Vec<Event> {
        let reply = &self.reply;
        let start = json!({"type": "message_start", "message": {
            "id": reply.id, "type": "message", "role": "assistant", "model": reply.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": 0}}});
        // With tools the blocks are known only at the end (text or tool uses).
        let mut opening = vec![event("message_start", start)];
        if reply.tools.is_none() {
            opening.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
        }
        opening.push(event("ping", json!({"type": "ping"})));
        opening
    }

    fn token(&mut self, _: usize, token: Token) -> Vec<Event> {
        self.at.ids.push(token.id);
        if token.text.is_empty() {
            return Vec::new();
        }
        self.at.text.push_str(&token.text);
        self.at.stream(self.reply.tools.is_some(), &token.text)
    }

    fn finished(&mut self, _: usize, done: Finished) -> (Vec<Event>, bool) {
        let (reply, at) = (&self.reply, &mut self.at);
        let read = reply.answer(&at.text, done.finish);
        let (reason, sequence) = reply.reason(read.as_ref(), done.finish, &at.text, &at.ids);
        let mut frames = at.close(read);
        frames.extend([
            event(
                "message_delta",
                json!({"type": "message_delta",
                   "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": {"output_tokens": done.completion_tokens},
                   "sharemesh": {"providers": done.providers.iter().map(ToString::to_string).collect::<Vec<_>>(),
                                 "cost_nano_usd": done.cost.0}}),
            ),
            event("message_stop", json!({"type": "message_stop"})),
        ]);
        (frames, true)
    }

    fn failed(&mut self, error: RouteError) -> Vec<Event> {
        vec![event("error", error_body("api_error", &error.to_string()))]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse_body(json: &str) -> Result<CompletionRequest, ApiError> {
        parse(json.as_bytes(), &HeaderMap::new(), false)
    }

    #[test]
    fn a_messages_body_becomes_a_chat_prompt() {
        let req = parse_body(
            r#"{"model": "m", "max_tokens": 20, "system": [{"type": "text", "text": "Be brief."}],
                "messages": [{"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
                             {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}],
                "stop_sequences": ["\n\n"], "temperature": 0, "top_k": 5, "stream": true,
                "metadata": {"user_id": "u1"}, "sharemesh": {"tier": "gold"}}"#,
        )
        .unwrap();
        let Prompt::Chat(chat) = &req.route.prompt else {
            panic!("{:?}", req.route.prompt)
        };
        let roles: Vec<Role> = chat.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::System, Role::User, Role::Assistant, Role::User]
        );
        assert_eq!(chat[2].content, "Hello.");
        assert_eq!(req.route.sampling.max_tokens, 20);
        assert_eq!(req.route.sampling.stop, ["\n\n"]);
        assert_eq!(
            (req.route.sampling.temperature, req.route.sampling.top_k),
            (0.0, 5)
        );
        assert!(req.stream);
        assert_eq!(
            req.route.routing.tier,
            Some(sharemesh_protocol::Tier::Reserved)
        );
    }

    #[test]
    fn what_cannot_be_served_is_refused_by_name() {
        let base = r#""model": "m", "messages": [{"role": "user", "content": "hi"}]"#;
        for (extra, field) in [
            (r#""max_tokens": 0"#, "max_tokens"),
            (r#""max_tokens": 5, "temperature": 1.5"#, "temperature"),
            (
                r#""max_tokens": 5, "tools": [{"name": "f"}]"#,
                "tools[0].input_schema",
            ),
            (
                r#""max_tokens": 5, "thinking": {"type": "enabled"}"#,
                "thinking",
            ),
            (
                r#""max_tokens": 5, "stop_sequences": [""]"#,
                "stop_sequences[0]",
            ),
            (r#""max_tokens": 5, "system": 3"#, "system"),
            (
                r#""max_tokens": 5, "output_config": {"format": {"type": "json_schema"}}"#,
                "output_config.format",
            ),
        ] {
            let err = parse_body(&format!("{{{base}, {extra}}}")).unwrap_err();
            assert_eq!(
                err.param.as_deref(),
                Some(field),
                "{extra}: {}",
                err.message
            );
        }
        let missing = parse_body(&format!("{{{base}}}")).unwrap_err();
        assert_eq!(missing.param.as_deref(), Some("max_tokens"));
        assert!(parse(format!("{{{base}}}").as_bytes(), &HeaderMap::new(), true).is_ok());
        let image = parse_body(
            r#"{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}"#,
        )
        .unwrap_err();
        assert_eq!(image.param.as_deref(), Some("messages[0].content[0].type"));
        let prefill = parse_body(
            r#"{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]}"#,
        )
        .unwrap_err();
        assert_eq!(prefill.param.as_deref(), Some("messages[1]"));
    }

    #[test]
    fn stop_reasons_tell_a_stop_sequence_from_the_end_of_the_turn() {
        let stops = vec!["END".to_owned(), "\n".to_owned()];
        assert_eq!(
            stop_reason(FinishReason::Length, &stops, "abc", None),
            ("max_tokens", None)
        );
        assert_eq!(
            stop_reason(FinishReason::Stop, &stops, "abc", Some("abc and\nEND")),
            ("stop_sequence", Some("\n".to_owned()))
        );
        assert_eq!(
            stop_reason(FinishReason::Stop, &stops, "abc", Some("abc")),
            ("end_turn", None)
        );
        assert_eq!(
            stop_reason(FinishReason::Stop, &stops, "abc", None),
            ("end_turn", None)
        );
    }
}
