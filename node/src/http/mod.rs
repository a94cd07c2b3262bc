//! The node's local HTTP API: the console, metrics, the account and network views, a
//! provider's policy; the OpenAI/Anthropic gateway joins here.

mod account;
mod network;
mod settlement;
mod state;

pub use state::AppState;

use std::net::SocketAddr;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};

use sharemesh_gateway::access::{self, Access};
use sharemesh_gateway::api::error::ApiError;
use sharemesh_gateway::keys::KeyCheck;

async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok", "peer_id": state.mesh.peer_id.to_string()}))
}

/// `GET /` (and `/console`): the web console, one page built into the binary that reads
/// the node's own API (no data in it, so it needs no key; its API calls do).
async fn console() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("../console/index.html"))
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

/// `GET /v1/provider/policy`: the policy this node's provider applies now (404 on a
/// node that provides nothing).
async fn provider_policy(State(state): State<AppState>) -> axum::response::Response {
    use axum::response::IntoResponse;
    #[cfg(feature = "provider")]
    if let Some(provider) = &state.provider {
        let now = sharemesh_mesh::clock::now_ms();
        return Json(provider.policy_in_force(now)).into_response();
    }
    #[cfg(not(feature = "provider"))]
    let _ = state;
    ApiError::not_here(
        "not_a_provider",
        "this node serves no models (`sharemesh provide`)",
    )
    .into_response()
}

/// The API, every route behind [`access::guard`] (keys, admin keys, and on loopback the
/// Host/Origin check).
pub fn router(
    mut state: AppState,
    gateway: Option<sharemesh_gateway::GatewayState>,
    access: Access,
) -> Router {
    state.keys = access.keys.clone();
    state.payer = gateway.as_ref().and_then(|g| g.dispatcher.payer().cloned());
    let network = Router::new()
        .route("/", get(console))
        .route("/console", get(console))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/network/providers", get(network::providers))
        .route("/v1/network/adverts", get(network::adverts))
        .route("/v1/network/peers", get(network::peers))
        .route("/v1/network/reachability", get(network::reachability))
        .route("/v1/account/earnings", get(account::earnings))
        .route("/v1/account/spend", get(account::spend))
        .route("/v1/account/keys", get(account::keys))
        .route("/v1/account/settlement", get(settlement::settlement))
        .route("/v1/provider/policy", get(provider_policy))
        .route("/v1/provider/jobs", get(account::served_jobs))
        .route("/v1/network/block", axum::routing::post(network::block))
        .route("/v1/network/unblock", axum::routing::post(network::unblock))
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
