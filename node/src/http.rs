//! The node's local HTTP API: network views now; the OpenAI gateway joins here.

use std::net::SocketAddr;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use sharemesh_gateway::access::{self, Access};
use sharemesh_gateway::keys::KeyCheck;
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::MeshHandle;

#[derive(Clone)]
pub struct AppState {
    pub mesh: MeshHandle,
    pub ledger: Option<std::sync::Arc<sharemesh_ledger::Ledger>>,
}

#[derive(serde::Deserialize)]
struct Since {
    since: Option<String>,
}

fn account(
    state: &AppState,
    side: sharemesh_ledger::Side,
    since: Option<String>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(ledger) = &state.ledger else {
        return sharemesh_gateway::error::ApiError::upstream("this node keeps no ledger")
            .into_response();
    };
    let since_ms = match since.as_deref().map(sharemesh_ledger::parse_day) {
        None => 0,
        Some(Some(ms)) => ms,
        Some(None) => {
            return sharemesh_gateway::error::ApiError::invalid(
                "since",
                "`since` must be a date, YYYY-MM-DD",
            )
            .into_response()
        }
    };
    match sharemesh_ledger::report(ledger, &state.mesh.node_id, side, since_ms, now_ms()) {
        Ok(report) => Json(report).into_response(),
        Err(err) => sharemesh_gateway::error::ApiError::upstream(err.to_string()).into_response(),
    }
}

async fn earnings(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<Since>,
) -> axum::response::Response {
    account(&state, sharemesh_ledger::Side::Earnings, q.since)
}

async fn spend(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<Since>,
) -> axum::response::Response {
    account(&state, sharemesh_ledger::Side::Spend, q.since)
}

#[derive(Serialize)]
struct ModelView {
    id: String,
    name: String,
    price_per_mtok_usd: f64,
    price_nano_usd_per_token: u64,
    tokens_per_second: f64,
}

#[derive(Serialize)]
struct ProviderView {
    peer_id: String,
    models: Vec<ModelView>,
    region: String,
    tiers: Vec<sharemesh_protocol::Tier>,
    load: sharemesh_protocol::Load,
    hardware: sharemesh_protocol::HardwareSummary,
    addresses: Vec<String>,
    last_seen: u64,
    expires_at: u64,
}

async fn providers(State(state): State<AppState>) -> Json<Vec<ProviderView>> {
    let now = now_ms();
    let live = state
        .mesh
        .book
        .read()
        .map(|book| book.live(now))
        .unwrap_or_default();
    Json(
        live.into_iter()
            .map(|entry| ProviderView {
                peer_id: entry.advert.provider.to_string(),
                models: entry
                    .advert
                    .models
                    .iter()
                    .map(|offer| {
                        let price = offer.prices.first().map_or(0, |p| p.price_per_token.0);
                        ModelView {
                            id: offer.model.id.to_string(),
                            name: offer.model.name.clone(),
                            price_per_mtok_usd: sharemesh_protocol::NanoUsd(price)
                                .as_usd_per_mtok(),
                            price_nano_usd_per_token: price,
                            tokens_per_second: f64::from(offer.generation_milli_tokens_per_second)
                                / 1000.0,
                        }
                    })
                    .collect(),
                region: entry.advert.region.clone(),
                tiers: entry.advert.tiers.clone(),
                load: entry.advert.load,
                hardware: entry.advert.hardware.clone(),
                addresses: entry.advert.addresses.clone(),
                last_seen: entry.last_seen_ms,
                expires_at: entry.expires_at_ms,
            })
            .collect(),
    )
}

async fn peers(State(state): State<AppState>) -> Json<Vec<sharemesh_mesh::PeerInfo>> {
    Json(state.mesh.peers().await.unwrap_or_default())
}

#[derive(serde::Deserialize)]
struct PeerList {
    peers: Vec<String>,
}

/// `POST /v1/network/block` and `/v1/network/unblock` with `{"peers": [PeerId, …]}`:
/// the operator's (and the partition scenario's) way to cut a node off from peers.
async fn set_blocked(
    state: AppState,
    list: Result<Json<PeerList>, axum::extract::rejection::JsonRejection>,
    block: bool,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use sharemesh_gateway::error::ApiError;
    let Ok(Json(list)) = list else {
        return ApiError::invalid("peers", "the body must be {\"peers\": [\"<PeerId>\", …]}")
            .into_response();
    };
    let mut peers = Vec::with_capacity(list.peers.len());
    for peer in &list.peers {
        match peer.parse::<libp2p::PeerId>() {
            Ok(peer) => peers.push(peer),
            Err(_) => {
                return ApiError::invalid("peers", format!("`{peer}` is not a peer id"))
                    .into_response()
            }
        }
    }
    let count = peers.len();
    let result = if block {
        state.mesh.block(peers).await
    } else {
        state.mesh.unblock(peers).await
    };
    match result {
        Ok(()) => Json(serde_json::json!({"blocked": block, "peers": count})).into_response(),
        Err(err) => ApiError::upstream(err.to_string()).into_response(),
    }
}

async fn block(
    State(state): State<AppState>,
    list: Result<Json<PeerList>, axum::extract::rejection::JsonRejection>,
) -> axum::response::Response {
    set_blocked(state, list, true).await
}

async fn unblock(
    State(state): State<AppState>,
    list: Result<Json<PeerList>, axum::extract::rejection::JsonRejection>,
) -> axum::response::Response {
    set_blocked(state, list, false).await
}

async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok", "peer_id": state.mesh.peer_id.to_string()}))
}

/// `GET /` (and `/console`): the web console, one page built into the binary that reads
/// the node's own API (no data in it, so it needs no key; its API calls do).
async fn console() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("console/index.html"))
}

/// `GET /metrics`: the process's metrics in the OpenMetrics text format (the same keys
/// as every other route off loopback).
async fn metrics(State(state): State<AppState>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(registry) = &state.mesh.metrics else {
        return (
            axum::http::StatusCode::NOT_FOUND,
            "this node keeps no metrics",
        )
            .into_response();
    };
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        sharemesh_mesh::metrics::encode(registry),
    )
        .into_response()
}

/// The API, every route behind [`access::guard`] (keys, admin keys, and on loopback the
/// Host/Origin check).
pub fn router(
    state: AppState,
    gateway: Option<sharemesh_gateway::GatewayState>,
    access: Access,
) -> Router {
    let network = Router::new()
        .route("/", get(console))
        .route("/console", get(console))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/network/providers", get(providers))
        .route("/v1/network/peers", get(peers))
        .route("/v1/account/earnings", get(earnings))
        .route("/v1/account/spend", get(spend))
        .route("/v1/network/block", axum::routing::post(block))
        .route("/v1/network/unblock", axum::routing::post(unblock))
        .with_state(state);
    let routes = match gateway {
        Some(gateway) => network.merge(sharemesh_gateway::router(gateway)),
        None => network,
    };
    routes.layer(axum::middleware::from_fn_with_state(access, access::guard))
}

/// Binds `address` and serves until the process stops; returns the bound address.
pub async fn serve(
    address: SocketAddr,
    state: AppState,
    gateway: Option<sharemesh_gateway::GatewayState>,
    keys: KeyCheck,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("binding HTTP on {address}: {e}"))?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        let access = Access {
            keys,
            loopback: bound.ip().is_loopback(),
        };
        if let Err(err) = axum::serve(listener, router(state, gateway, access)).await {
            tracing::error!(%err, "HTTP server stopped");
        }
    });
    Ok(bound)
}
