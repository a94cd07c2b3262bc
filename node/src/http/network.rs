//! The network views: the providers in the order book, the adverts as they arrive, the
//! connected peers; and the operator's block list.

use axum::extract::{Query, State};
use axum::Json;
use serde::Serialize;

use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::orderbook::{AdvertArrival, ArrivalOutcome};

use super::state::AppState;

fn model_views(advert: &sharemesh_protocol::Advert) -> Vec<ModelView> {
    advert
        .models
        .iter()
        .map(|offer| {
            let price = offer.prices.first().map_or(0, |p| p.price_per_token.0);
            ModelView {
                id: offer.model.id.to_string(),
                name: offer.model.name.clone(),
                price_per_mtok_usd: sharemesh_protocol::NanoUsd(price).as_usd_per_mtok(),
                price_nano_usd_per_token: price,
                tokens_per_second: f64::from(offer.generation_milli_tokens_per_second) / 1000.0,
            }
        })
        .collect()
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
pub(super) struct ProviderView {
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

pub(super) async fn providers(State(state): State<AppState>) -> Json<Vec<ProviderView>> {
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
                models: model_views(&entry.advert),
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

/// Whether peers can dial this node, its relays, and whether it relays for others.
pub(super) async fn reachability(State(state): State<AppState>) -> Json<sharemesh_mesh::NatView> {
    Json(state.mesh.nat_view())
}

pub(super) async fn peers(State(state): State<AppState>) -> Json<Vec<sharemesh_mesh::PeerInfo>> {
    Json(state.mesh.peers().await.unwrap_or_default())
}

#[derive(serde::Deserialize)]
pub(super) struct PeerList {
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
    use sharemesh_gateway::api::error::ApiError;
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

pub(super) async fn block(
    State(state): State<AppState>,
    list: Result<Json<PeerList>, axum::extract::rejection::JsonRejection>,
) -> axum::response::Response {
    set_blocked(state, list, true).await
}

pub(super) async fn unblock(
    State(state): State<AppState>,
    list: Result<Json<PeerList>, axum::extract::rejection::JsonRejection>,
) -> axum::response::Response {
    set_blocked(state, list, false).await
}

#[derive(serde::Deserialize)]
pub(super) struct After {
    after: Option<u64>,
}

/// One arrival in the live view: taken (with what it offers) or refused (with why).
#[derive(Serialize)]
struct ArrivalView {
    arrival: u64,
    received_ms: u64,
    /// The signer the advert names (verified only when `accepted`).
    signer: Option<String>,
    accepted: bool,
    /// Why the book refused it, and whether gossip penalised the sender for it.
    refused: Option<String>,
    violation: bool,
    seq: Option<u64>,
    region: Option<String>,
    models: Vec<ModelView>,
    load: Option<sharemesh_protocol::Load>,
}

fn arrival_view(arrival: AdvertArrival) -> ArrivalView {
    let mut view = ArrivalView {
        arrival: arrival.arrival,
        received_ms: arrival.received_ms,
        signer: arrival.signer.map(|s| s.to_string()),
        accepted: false,
        refused: None,
        violation: false,
        seq: None,
        region: None,
        models: Vec::new(),
        load: None,
    };
    match arrival.outcome {
        ArrivalOutcome::Accepted(entry) => {
            view.accepted = true;
            view.seq = Some(entry.seq);
            view.region = Some(entry.advert.region.clone());
            view.models = model_views(&entry.advert);
            view.load = Some(entry.advert.load);
        }
        ArrivalOutcome::Refused { reason, violation } => {
            view.refused = Some(reason);
            view.violation = violation;
        }
    }
    view
}

/// `GET /v1/network/adverts[?after=N]`: the adverts this node received since arrival
/// `N` (the last [`sharemesh_mesh::orderbook::RECENT_ARRIVALS`] at most), oldest first;
/// `latest` is what to pass as `after` next time (it starts again from 0 when the node
/// restarts, so a reader whose `after` is above it starts over).
pub(super) async fn adverts(
    State(state): State<AppState>,
    Query(q): Query<After>,
) -> Json<serde_json::Value> {
    let (latest, arrivals) = state
        .mesh
        .book
        .read()
        .map(|book| {
            (
                book.latest_arrival(),
                book.arrivals_after(q.after.unwrap_or(0)),
            )
        })
        .unwrap_or_default();
    let adverts: Vec<ArrivalView> = arrivals.into_iter().map(arrival_view).collect();
    Json(serde_json::json!({"latest": latest, "adverts": adverts}))
}
