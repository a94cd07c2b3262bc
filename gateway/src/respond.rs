//! Shaping what the dispatcher yields into OpenAI responses: server-sent chunks for a
//! streamed request, one JSON body otherwise; both name the providers and the cost.

use std::convert::Infallible;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sharemesh_protocol::{FinishReason, JobId, NodeId};
use tokio::sync::mpsc;

use crate::dispatch::DispatchEvent;
use crate::error::ApiError;

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
}

impl Shape {
    pub(crate) fn new(accepted: &Accepted, model: &str, chat: bool) -> Self {
        let kind = if chat { "chatcmpl" } else { "cmpl" };
        Self {
            id: format!("{kind}-{}", accepted.job_id),
            model: model.to_owned(),
            created: unix_seconds(),
            chat,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        if self.chat {
            json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        } else {
            let text = delta
                .get("content")
                .cloned()
                .unwrap_or(Value::String(String::new()));
            json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                   "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]})
        }
    }
}

/// A streamed response: a first empty delta, one chunk per token, a last chunk with the
/// finish reason and the providers and cost, optionally a usage chunk, then `[DONE]`.
pub(crate) fn stream(
    events: mpsc::Receiver<DispatchEvent>,
    shape: Shape,
    accepted: Accepted,
    include_usage: bool,
) -> Result<Response, ApiError> {
    let chat = shape.chat;
    let prompt_tokens = accepted.prompt_tokens;
    let job_header = header(&accepted.job_id.to_string())?;
    let provider_header = header(&accepted.provider.to_string())?;
    let first = shape.chunk(
        if chat {
            json!({"role": "assistant", "content": ""})
        } else {
            json!({"content": ""})
        },
        None,
    );
    let state = (Some(first), events, shape, false);
    let stream = futures::stream::unfold(
        state,
        move |(pending, mut events, shape, done)| async move {
            if let Some(value) = pending {
                return Some((vec![value], (None, events, shape, done)));
            }
            if done {
                return None;
            }
            loop {
                match events.recv().await {
                    Some(DispatchEvent::Token { text, .. }) => {
                        if text.is_empty() {
                            continue;
                        }
                        return Some((
                            vec![shape.chunk(json!({"content": text}), None)],
                            (None, events, shape, false),
                        ));
                    }
                    Some(DispatchEvent::Switched { .. }) | Some(DispatchEvent::Accepted { .. }) => {
                        continue
                    }
                    Some(DispatchEvent::Done {
                        finish,
                        completion_tokens,
                        providers,
                        cost,
                        segments,
                    }) => {
                        let mut last = shape.chunk(json!({}), Some(finish_name(finish)));
                        last["sharemesh"] = json!({"providers": providers.iter().map(ToString::to_string).collect::<Vec<_>>(),
                                               "cost_nano_usd": cost.0, "segments": segments});
                        let mut out = vec![last];
                        if include_usage {
                            let mut tail = shape.chunk(json!({}), None);
                            tail["choices"] = json!([]);
                            tail["usage"] = usage(prompt_tokens, completion_tokens);
                            out.push(tail);
                        }
                        return Some((out, (None, events, shape, true)));
                    }
                    Some(DispatchEvent::Failed(err)) => {
                        return Some((vec![err.body()], (None, events, shape, true)));
                    }
                    None => return None,
                }
            }
        },
    );
    let frames = futures::StreamExt::flat_map(stream, |values| {
        futures::stream::iter(
            values
                .into_iter()
                .map(|v| Ok::<_, Infallible>(Event::default().data(v.to_string()))),
        )
    });
    let done =
        futures::stream::once(async { Ok::<_, Infallible>(Event::default().data("[DONE]")) });
    let mut response = Sse::new(futures::StreamExt::chain(frames, done))
        .keep_alive(KeepAlive::default())
        .into_response();
    response
        .headers_mut()
        .insert("x-sharemesh-provider", provider_header);
    response.headers_mut().insert("x-sharemesh-job", job_header);
    Ok(response)
}

/// A whole response, once the dispatcher is done.
pub(crate) async fn whole(
    mut events: mpsc::Receiver<DispatchEvent>,
    shape: Shape,
    accepted: Accepted,
) -> Result<Response, ApiError> {
    let (chat, prompt_tokens, started) = (shape.chat, accepted.prompt_tokens, accepted.started);
    let first_provider = accepted.provider;
    let job_header = header(&accepted.job_id.to_string())?;
    let mut text = String::new();
    let mut providers = vec![first_provider];
    loop {
        match events.recv().await {
            Some(DispatchEvent::Token { text: delta, .. }) => text.push_str(&delta),
            Some(DispatchEvent::Switched { provider }) => providers.push(provider),
            Some(DispatchEvent::Accepted { .. }) => {}
            Some(DispatchEvent::Done {
                finish,
                completion_tokens,
                providers: all,
                cost,
                segments,
            }) => {
                let finish = finish_name(finish);
                let choice = if chat {
                    json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish})
                } else {
                    json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
                };
                let body = json!({
                    "id": shape.id,
                    "object": if chat { "chat.completion" } else { "text_completion" },
                    "created": shape.created,
                    "model": shape.model,
                    "choices": [choice],
                    "usage": usage(prompt_tokens, completion_tokens),
                    "sharemesh": {"providers": all.iter().map(ToString::to_string).collect::<Vec<_>>(), "cost_nano_usd": cost.0,
                                  "segments": segments,
                                  "seconds": started.elapsed().as_secs_f64()},
                });
                let mut response = Json(body).into_response();
                let header = HeaderValue::from_str(&provider_list(&all))
                    .map_err(|e| ApiError::upstream(e.to_string()))?;
                response
                    .headers_mut()
                    .insert("x-sharemesh-provider", header);
                response.headers_mut().insert("x-sharemesh-job", job_header);
                return Ok(response);
            }
            Some(DispatchEvent::Failed(err)) => return Err(err),
            None => {
                return Err(ApiError::upstream(format!(
                    "the job ended unexpectedly (providers {})",
                    provider_list(&providers)
                )))
            }
        }
    }
}
