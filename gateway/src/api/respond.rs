//! Shaping what the dispatcher yields into OpenAI responses: server-sent chunks for a
//! streamed request, one JSON body otherwise; both name the providers and the cost.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sharemesh_protocol::{FinishReason, JobId, NodeId};
use tokio::sync::mpsc;

use crate::api::encode::{encode, tagged, Encoder, Finished, Token};
use crate::api::error::ApiError;
use crate::api::tools::{Answer, HeldAnswer, ToolCall, Tools};
use crate::dispatch::{DispatchEvent, Segment};
use crate::route::RouteError;
use sharemesh_protocol::TokenLogprobs;

/// What the client is told once a provider accepted the request.
pub(crate) struct Accepted {
    pub job_id: JobId,
    pub provider: NodeId,
    pub prompt_tokens: u32,
    pub started: Instant,
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn finish_name(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::Length => "length",
        FinishReason::Error => "error",
    }
}

fn provider_list(providers: &[NodeId]) -> String {
    providers
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn usage(prompt: u32, completion: u32) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

fn header(value: &str) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(value).map_err(|e| ApiError::upstream(e.to_string()))
}

pub(crate) struct Shape {
    id: String,
    model: String,
    created: u64,
    chat: bool,
    /// Tools the answer may call: it is read back into calls, not passed on as text.
    tools: Option<Arc<Tools>>,
    /// The model's vocabulary, to spell the tokens of log-probabilities.
    vocabulary: Option<Arc<sharemesh_tokenizer::Vocabulary>>,
}

impl Shape {
    pub(crate) fn new(
        accepted: &Accepted,
        model: &str,
        chat: bool,
        tools: Option<Arc<Tools>>,
    ) -> Self {
        let kind = if chat { "chatcmpl" } else { "cmpl" };
        Self {
            id: format!("{kind}-{}", accepted.job_id),
            model: model.to_owned(),
            created: unix_seconds(),
            chat,
            tools,
            vocabulary: None,
        }
    }

    pub(crate) fn with_vocabulary(
        mut self,
        vocabulary: Option<Arc<sharemesh_tokenizer::Vocabulary>>,
    ) -> Self {
        self.vocabulary = vocabulary;
        self
    }

    /// A token's bytes (empty for control tokens, or without the vocabulary).
    fn bytes_of(&self, token: u32) -> Vec<u8> {
        self.vocabulary
            .as_ref()
            .map(|v| v.tokenizer.token_bytes(token).to_vec())
            .unwrap_or_default()
    }

    /// One token's entry in OpenAI's chat `logprobs.content`.
    fn logprob_entry(&self, token: u32, logprobs: &TokenLogprobs) -> Value {
        let entry = |id: u32, bits: u32| {
            let bytes = self.bytes_of(id);
            json!({"token": String::from_utf8_lossy(&bytes), "logprob": f32::from_bits(bits), "bytes": bytes})
        };
        let mut first = entry(token, logprobs.logprob);
        first["top_logprobs"] = logprobs
            .top
            .iter()
            .map(|&(id, bits)| entry(id, bits))
            .collect();
        first
    }

    /// A choice's `logprobs` over its tokens (`null` when none were asked for): chat's
    /// `{"content": [...]}`, or the completions API's token lists.
    fn logprobs(&self, tokens: &[(u32, TokenLogprobs)]) -> Value {
        if tokens.is_empty() {
            return Value::Null;
        }
        if self.chat {
            let content: Vec<Value> = tokens
                .iter()
                .map(|(t, lp)| self.logprob_entry(*t, lp))
                .collect();
            return json!({"content": content, "refusal": null});
        }
        let text = |id: u32| String::from_utf8_lossy(&self.bytes_of(id)).into_owned();
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for (token, _) in tokens {
            offsets.push(offset);
            offset += self.bytes_of(*token).len();
        }
        json!({
            "tokens": tokens.iter().map(|(t, _)| text(*t)).collect::<Vec<_>>(),
            "token_logprobs": tokens.iter().map(|(_, lp)| lp.logprob()).collect::<Vec<_>>(),
            "top_logprobs": tokens.iter().map(|(_, lp)| lp.top.iter()
                .map(|&(id, bits)| (text(id), json!(f32::from_bits(bits))))
                .collect::<serde_json::Map<String, Value>>()).collect::<Vec<_>>(),
            "text_offset": offsets,
        })
    }

    /// What choice `index`'s whole text says under the tools (`None`: no tools).
    fn tool_answer(&self, index: usize, text: &str, finish: FinishReason) -> Option<Answer> {
        let tools = self.tools.as_ref()?;
        if finish != FinishReason::Stop {
            // Cut short (max_tokens): the JSON is unfinished; its text so far.
            return Some(Answer::Text(tools.cut_answer(text)));
        }
        let job = self.id.trim_start_matches("chatcmpl-");
        Some(tools.answer(text, |call| format!("call_{job}_{index}_{call}")))
    }

    /// The finish reason OpenAI names for `answer`.
    fn finish_of(answer: Option<&Answer>, finish: FinishReason) -> &'static str {
        match answer {
            Some(Answer::Calls(_)) => "tool_calls",
            _ => finish_name(finish),
        }
    }

    fn chunk(&self, index: usize, delta: Value, finish: Option<&str>) -> Value {
        self.chunk_with(index, delta, finish, Value::Null)
    }

    fn chunk_with(
        &self,
        index: usize,
        delta: Value,
        finish: Option<&str>,
        logprobs: Value,
    ) -> Value {
        if self.chat {
            json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                   "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
        } else {
            let text = delta
                .get("content")
                .cloned()
                .unwrap_or(Value::String(String::new()));
            json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                   "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]})
        }
    }
}

/// One choice being answered: its dispatcher events and what its provider accepted.
pub(crate) type Run = (mpsc::Receiver<DispatchEvent>, Accepted);

/// `x-sharemesh-job`: the first choice's job.
fn first_job(runs: &[Run]) -> Result<HeaderValue, ApiError> {
    header(
        &runs
            .first()
            .map(|(_, a)| a.job_id.to_string())
            .unwrap_or_default(),
    )
}

/// The `tool_calls` of a message (whole) from an answer's calls.
fn tool_calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect()
}

/// The deltas that stream an answer read back under tools: its text, or each call's
/// id and name, then its arguments.
fn answer_deltas(answer: &Answer) -> Vec<Value> {
    match answer {
        Answer::Text(text) => vec![json!({"content": text})],
        Answer::Calls(calls) => calls
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                [
                    json!({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                           "function": {"name": c.name, "arguments": ""}}]}),
                    json!({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]}),
                ]
            })
            .collect(),
    }
}

fn sharemesh_block(
    providers: &[NodeId],
    cost: sharemesh_protocol::NanoUsd,
    segments: &[Segment],
) -> Value {
    json!({"providers": providers.iter().map(ToString::to_string).collect::<Vec<_>>(),
           "cost_nano_usd": cost.0, "segments": segments})
}

/// A streamed response: a first empty delta per choice, one chunk per token (with its
/// choice's index), a chunk with each choice's finish reason and its providers and
/// cost, optionally a usage chunk once every choice is done, then `[DONE]`.
pub(crate) fn stream(
    runs: Vec<Run>,
    shape: Shape,
    include_usage: bool,
) -> Result<Response, ApiError> {
    let choices = runs.len();
    let prompt_tokens = runs.first().map_or(0, |(_, a)| a.prompt_tokens);
    let job_header = first_job(&runs)?;
    let provider_header = header(&provider_list(
        &runs.iter().map(|(_, a)| a.provider).collect::<Vec<_>>(),
    ))?;
    let merged = futures::stream::select_all(
        runs.into_iter()
            .enumerate()
            .map(|(index, (events, _))| tagged(index, events)),
    );
    let encoder = ChunkStream {
        shape,
        running: choices,
        completion_tokens: 0,
        held: vec![HeldAnswer::default(); choices],
        prompt_tokens,
        include_usage,
    };
    Ok(sse(encode(merged, encoder), job_header, provider_header))
}

/// OpenAI's shape of a streamed completion: `chat.completion.chunk`s (or text
/// completion chunks), each choice's text held back while tools may read it as calls.
struct ChunkStream {
    shape: Shape,
    /// Choices still running.
    running: usize,
    /// Completion tokens of the choices that ended.
    completion_tokens: u32,
    /// Each choice's text held back while tools may read it as calls.
    held: Vec<HeldAnswer>,
    prompt_tokens: u32,
    include_usage: bool,
}

fn data(value: Value) -> Event {
    Event::default().data(value.to_string())
}

impl Encoder for ChunkStream {
    fn opening(&mut self) -> Vec<Event> {
        (0..self.held.len())
            .map(|index| {
                let delta = if self.shape.chat {
                    json!({"role": "assistant", "content": ""})
                } else {
                    json!({"content": ""})
                };
                data(self.shape.chunk(index, delta, None))
            })
            .collect()
    }

    fn token(&mut self, choice: usize, token: Token) -> Vec<Event> {
        let shape = &self.shape;
        if shape.tools.is_some() {
            let released = self.held[choice].push(&token.text);
            if released.is_empty() {
                return Vec::new();
            }
            return vec![data(shape.chunk(
                choice,
                json!({"content": released}),
                None,
            ))];
        }
        if token.text.is_empty() && token.logprobs.is_none() {
            return Vec::new();
        }
        let logprobs = match token.logprobs {
            Some(lp) => shape.logprobs(&[(token.id, lp)]),
            None => Value::Null,
        };
        let delta = json!({"content": token.text});
        vec![data(shape.chunk_with(choice, delta, None, logprobs))]
    }

    fn finished(&mut self, choice: usize, done: Finished) -> (Vec<Event>, bool) {
        let shape = &self.shape;
        let answer = shape.tool_answer(choice, self.held[choice].text(), done.finish);
        let unreleased = answer.clone().map(|a| self.held[choice].unreleased(a));
        let mut out: Vec<Event> = unreleased
            .iter()
            .flat_map(answer_deltas)
            .map(|delta| data(shape.chunk(choice, delta, None)))
            .collect();
        let finish = Shape::finish_of(answer.as_ref(), done.finish);
        let mut last = shape.chunk(choice, json!({}), Some(finish));
        last["sharemesh"] = sharemesh_block(&done.providers, done.cost, &done.segments);
        out.push(data(last));
        self.running -= 1;
        self.completion_tokens += done.completion_tokens;
        if self.running == 0 && self.include_usage {
            let mut tail = shape.chunk(0, json!({}), None);
            tail["choices"] = json!([]);
            tail["usage"] = usage(self.prompt_tokens, self.completion_tokens);
            out.push(data(tail));
        }
        (out, self.running == 0)
    }

    fn failed(&mut self, error: RouteError) -> Vec<Event> {
        vec![data(ApiError::from(error).body())]
    }

    fn closing(&mut self) -> Vec<Event> {
        vec![Event::default().data("[DONE]")]
    }
}

/// A server-sent-events response (kept alive) naming its job and provider(s).
pub(crate) fn sse<S>(events: S, job: HeaderValue, providers: HeaderValue) -> Response
where
    S: futures::Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    response.headers_mut().insert("x-sharemesh-job", job);
    response
        .headers_mut()
        .insert("x-sharemesh-provider", providers);
    response
}

/// One choice, answered in full.
pub(crate) struct Collected {
    pub text: String,
    /// Every completion token, for an API that must decode them (a stop sequence).
    pub token_ids: Vec<u32>,
    /// Each token's log-probabilities, when asked for.
    pub logprobs: Vec<(u32, TokenLogprobs)>,
    pub finish: FinishReason,
    pub completion_tokens: u32,
    pub providers: Vec<NodeId>,
    pub cost: sharemesh_protocol::NanoUsd,
    pub segments: Vec<Segment>,
}

/// One choice's events read to the end (every API's whole answer is built from it).
pub(crate) async fn collect(
    mut events: mpsc::Receiver<DispatchEvent>,
) -> Result<Collected, ApiError> {
    let (mut text, mut token_ids, mut logprobs) = (String::new(), Vec::new(), Vec::new());
    loop {
        match events.recv().await {
            Some(DispatchEvent::Token {
                text: delta,
                token_id,
                logprobs: token_logprobs,
            }) => {
                text.push_str(&delta);
                token_ids.push(token_id);
                logprobs.extend(token_logprobs.map(|lp| (token_id, lp)));
            }
            Some(DispatchEvent::Done {
                finish,
                completion_tokens,
                providers,
                cost,
                segments,
            }) => {
                return Ok(Collected {
                    text,
                    token_ids,
                    logprobs,
                    finish,
                    completion_tokens,
                    providers,
                    cost,
                    segments,
                })
            }
            Some(DispatchEvent::Failed(err)) => return Err(err.into()),
            Some(_) => {}
            None => return Err(ApiError::upstream("the job ended before it was done")),
        }
    }
}

/// A whole response, once every choice is done.
pub(crate) async fn whole(runs: Vec<Run>, shape: Shape) -> Result<Response, ApiError> {
    let chat = shape.chat;
    let prompt_tokens = runs.first().map_or(0, |(_, a)| a.prompt_tokens);
    let started = runs.first().map(|(_, a)| a.started);
    let job_header = first_job(&runs)?;
    let answers =
        futures::future::join_all(runs.into_iter().map(|(events, _)| collect(events))).await;
    let answers = answers.into_iter().collect::<Result<Vec<_>, _>>()?;
    let choices: Vec<Value> = answers
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let answer = shape.tool_answer(index, &a.text, a.finish);
            let finish = Shape::finish_of(answer.as_ref(), a.finish);
            if chat {
                let message = match &answer {
                    Some(Answer::Calls(calls)) => {
                        json!({"role": "assistant", "content": null, "tool_calls": tool_calls(calls)})
                    }
                    Some(Answer::Text(text)) => json!({"role": "assistant", "content": text}),
                    None => json!({"role": "assistant", "content": a.text}),
                };
                json!({"index": index, "message": message, "logprobs": shape.logprobs(&a.logprobs), "finish_reason": finish})
            } else {
                json!({"index": index, "text": a.text, "logprobs": shape.logprobs(&a.logprobs), "finish_reason": finish})
            }
        })
        .collect();
    let providers: Vec<NodeId> = answers.iter().flat_map(|a| a.providers.clone()).collect();
    let segments: Vec<Segment> = answers.iter().flat_map(|a| a.segments.clone()).collect();
    let cost = sharemesh_protocol::NanoUsd(answers.iter().map(|a| a.cost.0).sum());
    let completion_tokens = answers.iter().map(|a| a.completion_tokens).sum();
    let mut sharemesh = sharemesh_block(&providers, cost, &segments);
    sharemesh["seconds"] = json!(started.map_or(0.0, |s| s.elapsed().as_secs_f64()));
    let body = json!({
        "id": shape.id,
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": shape.created,
        "model": shape.model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
        "sharemesh": sharemesh,
    });
    let mut response = Json(body).into_response();
    response
        .headers_mut()
        .insert("x-sharemesh-provider", header(&provider_list(&providers))?);
    response.headers_mut().insert("x-sharemesh-job", job_header);
    Ok(response)
}
