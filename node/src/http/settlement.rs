//! `GET /v1/account/settlement`: this node's on-chain settlement (SPEC §13) — as a
//! provider, what buyers authorised, what the escrow paid out and what is still
//! redeemable; as a buyer, its deposit (read from the chain now) and what it authorised.
//! Amounts are in the token's smallest units, as strings (they are 128-bit).

use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::state::AppState;

/// A console refresh must not hang on a slow RPC node.
const CHAIN_READ_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) async fn settlement(State(state): State<AppState>) -> Response {
    let mut view = json!({ "on_chain": false });
    #[cfg(feature = "provider")]
    if let Some(payee) = state.provider.as_ref().and_then(|p| p.payee()) {
        let totals = payee.totals();
        view["on_chain"] = json!(true);
        view["chain_id"] = json!(payee.chain().chain_id);
        view["escrow"] = json!(payee.chain().escrow.to_string());
        view["decimals"] = json!(payee.scale().decimals());
        view["provider"] = json!({
            "account": payee.account().to_string(),
            "buyers": totals.buyers,
            "authorised_units": totals.authorised_units.to_string(),
            "redeemed_units": totals.redeemed_units.to_string(),
            "redeemable_units": totals.redeemable_units.to_string(),
        });
    }
    if let Some(payer) = &state.payer {
        let totals = payer.totals();
        view["on_chain"] = json!(true);
        view["chain_id"] = json!(payer.chain().chain_id);
        view["escrow"] = json!(payer.chain().escrow.to_string());
        view["decimals"] = json!(payer.scale().decimals());
        let deposit = tokio::time::timeout(
            CHAIN_READ_TIMEOUT,
            payer.escrow().account_state(payer.account()),
        )
        .await;
        let (balance, withdrawal) = match deposit {
            Ok(Ok(state)) => (
                Value::from(state.balance.0.to_string()),
                Value::from(state.withdrawal_amount.0.to_string()),
            ),
            _ => (Value::Null, Value::Null),
        };
        view["buyer"] = json!({
            "account": payer.account().to_string(),
            "providers": totals.providers,
            "authorised_units": totals.authorised_units.to_string(),
            "deposit_units": balance,
            "withdrawal_pending_units": withdrawal,
        });
    }
    Json(view).into_response()
}
