//! The light client (gateway): a routing core that knows no HTTP ([`route`]: its
//! request and typed errors; [`plan`], [`dispatch::Dispatcher`], [`budget`], the buyer
//! side of the job stream in [`buyer`]), the API edge that speaks the OpenAI and
//! Anthropic dialects ([`api`]; this file holds its HTTP routes), and verification of
//! the work bought ([`verify`]); [`builder::GatewayBuilder`] assembles one, verifying by
//! default. It runs no inference and does not link the engine: a
//! node that also provides hands its in-process provider over as a
//! [`segment::LocalRoute`], and a node that holds models its engine as a replayer.

pub mod access;
pub mod api;
pub mod background;
pub mod budget;
pub mod builder;
pub mod buyer;
pub mod dispatch;
mod format_check;
pub mod jobs;
pub mod keys;
pub mod metrics;
pub mod plan;
pub mod quote;
pub mod route;
pub mod segment;
pub mod settle;
pub mod verify;
pub mod vocab;
pub mod waiting;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tracing::Instrument;

use api::error::ApiError;
use api::{anthropic, openai, respond, responses};
use dispatch::{DispatchEvent, Dispatcher};
use sharemesh_mesh::clock::now_ms;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

#[derive(Clone)]
pub struct GatewayState {
    pub dispatcher: Arc<Dispatcher>,
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

async fn complete(
    state: GatewayState,
    key: Option<crate::keys::KeyRecord>,
    headers: HeaderMap,
    body: Body,
    chat: bool,
) -> Result<Response, ApiError> {
    let body = read_body(body).await?;
    let request = openai::parse(&body, chat, &headers)?;
    // `n` choices are `n` jobs, seeds `seed`, `seed + 1`, …: all must be accepted
    // before the answer starts (dropping the others cancels them).
    let runs = (0..request.n).map(|i| {
        let mut one = request.clone();
        one.n = 1;
        one.route.sampling.seed = one.route.sampling.seed.wrapping_add(u64::from(i));
        let (state, key) = (&state, key.clone());
        async move { start(state, &one, key).await }
    });
    let runs = futures::future::join_all(runs)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let first = &runs[0].1;
    let span = tracing::info_span!("request", job = %first.job_id, provider = %first.provider);
    let vocabulary = request
        .route
        .sampling
        .logprobs
        .and_then(|_| state.dispatcher.vocabulary_of(&request.route.model));
    let shape = respond::Shape::new(first, &request.route.model, chat, request.tools.clone())
        .with_vocabulary(vocabulary);
    if request.stream {
        let _entered = span.enter(); // Only while the response is built: no await here.
        respond::stream(runs, shape, request.include_usage)
    } else {
        respond::whole(runs, shape).instrument(span).await
    }
}

/// Starts `request` and waits for a provider to accept it: the events that follow,
/// and what the client is told first.
async fn start(
    state: &GatewayState,
    request: &openai::CompletionRequest,
    key: Option<crate::keys::KeyRecord>,
) -> Result<
    (
        tokio::sync::mpsc::Receiver<DispatchEvent>,
        respond::Accepted,
    ),
    ApiError,
> {
    let started = Instant::now();
    let mut events = state.dispatcher.run(request.route.clone(), key);
    match events.recv().await {
        Some(DispatchEvent::Accepted {
            job_id,
            provider,
            prompt_tokens,
        }) => Ok((
            events,
            respond::Accepted {
                job_id,
                provider,
                prompt_tokens,
                started,
            },
        )),
        Some(DispatchEvent::Failed(err)) => Err(err.into()),
        _ => Err(ApiError::upstream(
            "the request ended before a provider accepted it",
        )),
    }
}

/// `POST /v1/responses` (OpenAI's Responses API, stateless).
async fn responses_create(
    State(state): State<GatewayState>,
    key: ApiKey,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answered = async {
        let body = read_body(body).await?;
        let request = responses::parse(&body, &headers)?;
        let (events, accepted) = start(&state, &request, key.map(|k| k.0)).await?;
        let header = |value: String| {
            axum::http::HeaderValue::from_str(&value).map_err(|e| ApiError::upstream(e.to_string()))
        };
        let stream = request.stream;
        let shape = responses::Shape::new(
            &accepted.job_id.to_string(),
            request,
            accepted.prompt_tokens,
            header(accepted.job_id.to_string())?,
            header(accepted.provider.to_string())?,
        );
        if stream {
            Ok(responses::stream(events, shape))
        } else {
            responses::whole(events, shape).await
        }
    };
    answered.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/messages` (Anthropic's Messages API).
async fn messages(
    State(state): State<GatewayState>,
    key: ApiKey,
    headers: HeaderMap,
    body: Body,
) -> Response {
    anthropic_message(state, key.map(|k| k.0), headers, body)
        .await
        .unwrap_or_else(|err| anthropic::error_response(&err))
}

async fn anthropic_message(
    state: GatewayState,
    key: Option<crate::keys::KeyRecord>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(body).await?;
    let request = anthropic::parse(&body, &headers, false)?;
    let (events, accepted) = start(&state, &request, key).await?;
    let span =
        tracing::info_span!("request", job = %accepted.job_id, provider = %accepted.provider);
    let header = |value: String| {
        axum::http::HeaderValue::from_str(&value).map_err(|e| ApiError::upstream(e.to_string()))
    };
    let dispatcher = state.dispatcher.clone();
    let model = request.route.model.clone();
    let reply = anthropic::Reply {
        id: format!("msg_{}", accepted.job_id),
        model: request.route.model.clone(),
        prompt_tokens: accepted.prompt_tokens,
        stops: request.route.sampling.stop.clone(),
        decode: Box::new(move |ids| dispatcher.decode(&model, ids)),
        tools: request.tools.clone(),
        job_header: header(accepted.job_id.to_string())?,
        provider_header: header(accepted.provider.to_string())?,
    };
    if request.stream {
        let _entered = span.enter();
        Ok(anthropic::stream(events, reply))
    } else {
        anthropic::whole(events, reply).instrument(span).await
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, counted with the model's own
/// vocabulary (its header fetched from a provider if this node has none yet).
async fn count_tokens(
    State(state): State<GatewayState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let counted = async {
        let body = read_body(body).await?;
        let request = anthropic::parse(&body, &headers, true)?;
        state
            .dispatcher
            .count_tokens(&request.route.model, &request.route.prompt)
            .await
            .map_err(ApiError::from)
    };
    match counted.await {
        Ok(tokens) => Json(json!({"input_tokens": tokens})).into_response(),
        Err(err) => anthropic::error_response(&err),
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
    // Grouped by content id, never by the name a provider declares: a catalog model is
    // listed under its catalog name, any other under its id (with the declared name).
    let mut by_id: BTreeMap<sharemesh_protocol::ModelId, (String, Vec<u64>, f64)> = BTreeMap::new();
    for entry in &live {
        for offer in &entry.advert.models {
            let slot =
                by_id
                    .entry(offer.model.id)
                    .or_insert((offer.model.name.clone(), Vec::new(), 0.0));
            if let Some(price) = offer.prices.iter().map(|p| p.price_per_token.0).min() {
                slot.1.push(price);
            }
            slot.2 = slot
                .2
                .max(f64::from(offer.generation_milli_tokens_per_second) / 1000.0);
        }
    }
    by_id
        .into_iter()
        .map(|(id, (declared, mut prices, best))| {
            prices.sort_unstable();
            let per_mtok = |p: u64| sharemesh_protocol::NanoUsd(p).as_usd_per_mtok();
            let in_catalog = sharemesh_protocol::catalog::catalog_id(&declared) == Some(id);
            let name = if in_catalog {
                declared.clone()
            } else {
                id.to_string()
            };
            json!({
                "id": name,
                "name": declared,
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

/// `GET /v1/trust`: verification counters, providers dropped for fraud, suspected
/// providers and verified jobs per provider (SPEC §12).
async fn trust_view(State(state): State<GatewayState>) -> Json<Value> {
    let trust = state.dispatcher.trust();
    let mut view = serde_json::to_value(trust.auditor.view()).unwrap_or_default();
    let standing: std::collections::BTreeMap<String, f64> = trust
        .standing
        .trust()
        .iter()
        .map(|(id, t)| (id.to_string(), *t))
        .collect();
    view["trust"] = json!(standing);
    view["hardware_findings"] = json!(trust.attestations.findings());
    if let Some(outsourcing) = trust.outsourcing() {
        view["outsourced"] = json!(outsourcing.stats());
    }
    let verification = trust.verification();
    view["verification"] = json!(verification.name());
    if verification == verify::trust::Verification::Off {
        view["warning"] = json!(
            "verification is off (--no-verify): providers' work is not checked, and a provider serving a substitute under the model's name is paid in full"
        );
    }
    Json(view)
}

/// Whose jobs a caller sees: its own with a (non-admin) key, all without keys.
fn job_owner(key: &ApiKey) -> Option<String> {
    key.as_ref().filter(|k| !k.0.admin).map(|k| k.0.id.clone())
}

#[derive(serde::Deserialize)]
struct JobsQuery {
    limit: Option<usize>,
}

/// `GET /v1/jobs?limit=N`: the newest requests (50 by default), each with its route
/// and price per hop.
async fn list_jobs(
    State(state): State<GatewayState>,
    key: ApiKey,
    axum::extract::Query(query): axum::extract::Query<JobsQuery>,
) -> Json<Value> {
    let owner = job_owner(&key);
    let jobs = state.dispatcher.jobs().list(
        query.limit.unwrap_or(50).min(jobs::MAX_JOBS),
        owner.as_deref(),
    );
    Json(json!({"object": "list", "data": jobs}))
}

/// `GET /v1/account/budgets`: the gateway's budgets and the caller's key's, with what
/// is spent, held by requests in flight and left (nano-USD).
async fn budgets(State(state): State<GatewayState>, key: ApiKey) -> Response {
    match state.dispatcher.budgets(key.as_ref().map(|k| &k.0)) {
        Ok(budgets) => Json(json!({"budgets": budgets})).into_response(),
        Err(err) => ApiError::from(err).into_response(),
    }
}

/// `GET /v1/jobs/{id}`: one request's route and price per hop (`x-sharemesh-job`).
async fn get_job(
    State(state): State<GatewayState>,
    key: ApiKey,
    Path(id): Path<String>,
) -> Response {
    let owner = job_owner(&key);
    match state.dispatcher.jobs().get(&id, owner.as_deref()) {
        Some(job) => Json(job).into_response(),
        None => ApiError {
            status: axum::http::StatusCode::NOT_FOUND,
            message: format!("no job {id} in this gateway's recent requests"),
            kind: "invalid_request_error",
            param: Some("id".into()),
            code: Some("job_not_found"),
            retry_after: None,
        }
        .into_response(),
    }
}

/// The OpenAI routes (the node puts [`access::guard`] in front of them).
pub fn router(state: GatewayState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses_create))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/models", get(list_models))
        .route("/v1/trust", get(trust_view))
        .route("/v1/jobs", get(list_jobs))
        .route("/v1/account/budgets", get(budgets))
        .route("/v1/jobs/{id}", get(get_job))
        .route("/v1/models/{id}", get(get_model))
        .with_state(state)
}
