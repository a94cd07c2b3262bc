//! The light client (gateway): the OpenAI-compatible API (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/models`, `/health`), each request routed over the mesh by the
//! [`dispatch::Dispatcher`] and metered by the buyer side of the job stream
//! ([`buyer`]). It runs no inference and does not link the engine: a node that also
//! provides hands its in-process provider over as a [`segment::LocalRoute`].

pub mod budget;
pub mod buyer;
pub mod dispatch;
pub mod error;
pub mod keys;
pub mod openai;
pub mod plan;
pub mod quote;
pub mod segment;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use sharemesh_protocol::{FinishReason, NodeId};

use crate::keys::KeyCheck;
use dispatch::{DispatchEvent, Dispatcher};
use error::ApiError;
use sharemesh_mesh::clock::now_ms;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

#[derive(Clone)]
pub struct GatewayState {
    pub dispatcher: Arc<Dispatcher>,
    pub keys: KeyCheck,
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

async fn require_key(
    State(state): State<GatewayState>,
    mut request: Request,
    next: Next,
) -> Response {
    if state.keys.required.is_some() {
        let presented = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .unwrap_or_default()
            .to_owned();
        if presented.is_empty() {
            return ApiError::unauthorized(
                "missing_api_key",
                "an API key is required (Authorization: Bearer sk-sm-…)",
            )
            .into_response();
        }
        let Some(record) = state.keys.identify(&presented).cloned() else {
            return ApiError::unauthorized(
                "invalid_api_key",
                "the API key is not valid or was revoked",
            )
            .into_response();
        };
        request.extensions_mut().insert(record);
    }
    next.run(request).await
}

async fn read_body(body: Body) -> Result<axum::body::Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::too_large(MAX_BODY_BYTES))
}

type ApiKey = Option<axum::Extension<crate::keys::KeyRecord>>;

async fn chat_completions(
    State(state): State<GatewayState>,
    key: ApiKey,
    headers: HeaderMap,
    body: Body,
) -> Response {
    complete(state, key.map(|k| k.0), headers, body, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(
    State(state): State<GatewayState>,
    key: ApiKey,
    headers: HeaderMap,
    body: Body,
) -> Response {
    complete(state, key.map(|k| k.0), headers, body, false)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

struct Shape {
    id: String,
    model: String,
    created: u64,
    chat: bool,
}

impl Shape {
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

fn usage(prompt: u32, completion: u32) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

async fn complete(
    state: GatewayState,
    key: Option<crate::keys::KeyRecord>,
    headers: HeaderMap,
    body: Body,
    chat: bool,
) -> Result<Response, ApiError> {
    let body = read_body(body).await?;
    let request = openai::parse(&body, chat, &headers)?;
    let started = Instant::now();
    let mut events = state.dispatcher.run(request.clone(), key);
    let (job_id, first_provider, prompt_tokens) = match events.recv().await {
        Some(DispatchEvent::Accepted {
            job_id,
            provider,
            prompt_tokens,
        }) => (job_id, provider, prompt_tokens),
        Some(DispatchEvent::Failed(err)) => return Err(err),
        _ => {
            return Err(ApiError::upstream(
                "the request ended before a provider accepted it",
            ))
        }
    };
    let span = tracing::info_span!("request", job = %job_id, provider = %first_provider);
    let _entered = span.enter();
    let shape = Shape {
        id: format!("{}-{job_id}", if chat { "chatcmpl" } else { "cmpl" }),
        model: request.model.clone(),
        created: unix_seconds(),
        chat,
    };
    let job_header = HeaderValue::from_str(&job_id.to_string())
        .map_err(|e| ApiError::upstream(e.to_string()))?;
    if request.stream {
        let provider_header = HeaderValue::from_str(&first_provider.to_string())
            .map_err(|e| ApiError::upstream(e.to_string()))?;
        let include_usage = request.include_usage;
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
                        Some(DispatchEvent::Switched { .. })
                        | Some(DispatchEvent::Accepted { .. }) => continue,
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
        return Ok(response);
    }
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

fn model_objects(state: &GatewayState) -> Vec<Value> {
    use std::collections::BTreeMap;
    let live = state
        .dispatcher
        .mesh()
        .book
        .read()
        .map(|b| b.live(now_ms()))
        .unwrap_or_default();
    let mut by_name: BTreeMap<String, (String, Vec<u64>, f64)> = BTreeMap::new();
    for entry in &live {
        for offer in &entry.advert.models {
            let slot = by_name.entry(offer.model.name.clone()).or_insert((
                offer.model.id.to_string(),
                Vec::new(),
                0.0,
            ));
            if let Some(price) = offer.prices.iter().map(|p| p.price_per_token.0).min() {
                slot.1.push(price);
            }
            slot.2 = slot
                .2
                .max(f64::from(offer.generation_milli_tokens_per_second) / 1000.0);
        }
    }
    by_name
        .into_iter()
        .map(|(name, (id, mut prices, best))| {
            prices.sort_unstable();
            let per_mtok = |p: u64| sharemesh_protocol::NanoUsd(p).as_usd_per_mtok();
            json!({
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "sharemesh",
                "model_id": id,
                "providers": prices.len(),
                "lowest_price_per_mtok": prices.first().map(|&p| per_mtok(p)),
                "median_price_per_mtok": prices.get(prices.len() / 2).map(|&p| per_mtok(p)),
                "best_tokens_per_second": best,
            })
        })
        .collect()
}

async fn list_models(State(state): State<GatewayState>) -> Json<Value> {
    Json(json!({"object": "list", "data": model_objects(&state)}))
}

async fn get_model(State(state): State<GatewayState>, Path(id): Path<String>) -> Response {
    model_objects(&state)
        .into_iter()
        .find(|m| m["id"] == id.as_str() || m["model_id"] == id.as_str())
        .map(|m| Json(m).into_response())
        .unwrap_or_else(|| ApiError::model_not_found(&id).into_response())
}

/// The OpenAI routes, behind the API-key check.
pub fn router(state: GatewayState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key))
        .with_state(state)
}
