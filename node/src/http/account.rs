//! The account views: what this node earned (as a provider) and spent (as a buyer), and
//! the API keys it serves with what each spent.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;

use sharemesh_gateway::api::error::ApiError;
use sharemesh_gateway::keys::KeyRecord;
use sharemesh_ledger::{Ledger, Period, Side, SpendScope};
use sharemesh_mesh::clock::now_ms;

use super::state::AppState;

#[derive(serde::Deserialize)]
pub(super) struct Since {
    since: Option<String>,
}

/// The caller's key when it is an ordinary one: it sees only its own key's rows. An
/// admin key, and every caller where no key is required, sees them all.
fn restricted_to(caller: Option<Extension<KeyRecord>>) -> Option<KeyRecord> {
    caller.map(|Extension(key)| key).filter(|key| !key.admin)
}

fn report(
    state: &AppState,
    side: Side,
    since: Option<String>,
) -> Result<sharemesh_ledger::Report, ApiError> {
    let ledger = state.ledger()?;
    let since_ms = match since.as_deref().map(sharemesh_ledger::parse_day) {
        None => 0,
        Some(Some(ms)) => ms,
        Some(None) => {
            return Err(ApiError::invalid(
                "since",
                "`since` must be a date, YYYY-MM-DD",
            ))
        }
    };
    sharemesh_ledger::report(ledger, &state.mesh.node_id, side, since_ms, now_ms())
        .map_err(|err| ApiError::upstream(err.to_string()))
}

/// `GET /v1/account/earnings[?since=YYYY-MM-DD]`.
pub(super) async fn earnings(State(state): State<AppState>, Query(q): Query<Since>) -> Response {
    match report(&state, Side::Earnings, q.since) {
        Ok(report) => Json(report).into_response(),
        Err(err) => err.into_response(),
    }
}

/// `GET /v1/account/spend[?since=YYYY-MM-DD]`: with per-key rows (an ordinary key's
/// caller gets its own key's only).
pub(super) async fn spend(
    State(state): State<AppState>,
    caller: Option<Extension<KeyRecord>>,
    Query(q): Query<Since>,
) -> Response {
    match report(&state, Side::Spend, q.since) {
        Ok(mut report) => {
            if let Some(key) = restricted_to(caller) {
                report.per_api_key.retain(|id, _| *id == key.id);
                report.per_api_key_per_day.retain(|id, _| *id == key.id);
            }
            Json(report).into_response()
        }
        Err(err) => err.into_response(),
    }
}

#[derive(Serialize)]
struct KeyView {
    id: String,
    name: String,
    admin: bool,
    created_ms: u64,
    daily_budget_nano_usd: Option<u64>,
    monthly_budget_nano_usd: Option<u64>,
    spent_today_nano_usd: u64,
    spent_this_month_nano_usd: u64,
}

#[derive(Serialize)]
struct KeysView {
    /// Whether this listener asks for keys at all (loopback does not, by default).
    keys_required: bool,
    keys: Vec<KeyView>,
}

fn key_view(ledger: &Ledger, key: KeyRecord, now: u64) -> Result<KeyView, ApiError> {
    let spent = |period| {
        ledger
            .spent(SpendScope::ApiKey(&key.id), period)
            .map_err(|err| ApiError::upstream(err.to_string()))
    };
    Ok(KeyView {
        spent_today_nano_usd: spent(Period::Day(now))?,
        spent_this_month_nano_usd: spent(Period::Month(now))?,
        id: key.id,
        name: key.name,
        admin: key.admin,
        created_ms: key.created_ms,
        daily_budget_nano_usd: key.daily_budget_nano_usd,
        monthly_budget_nano_usd: key.monthly_budget_nano_usd,
    })
}

/// `GET /v1/account/keys`: the active API keys (never their secrets) with their budgets
/// and what each spent today and this month; an ordinary key's caller sees its own.
pub(super) async fn keys(
    State(state): State<AppState>,
    caller: Option<Extension<KeyRecord>>,
) -> Response {
    let ledger = match state.ledger() {
        Ok(ledger) => ledger,
        Err(err) => return err.into_response(),
    };
    let mut active = state.keys.active();
    if let Some(key) = restricted_to(caller) {
        active.retain(|record| record.id == key.id);
    }
    let now = now_ms();
    let keys: Result<Vec<KeyView>, ApiError> = active
        .into_iter()
        .map(|key| key_view(ledger, key, now))
        .collect();
    match keys {
        Ok(keys) => Json(KeysView {
            keys_required: state.keys.is_required(),
            keys,
        })
        .into_response(),
        Err(err) => err.into_response(),
    }
}

#[derive(serde::Deserialize)]
pub(super) struct Limit {
    limit: Option<usize>,
}

/// Jobs a page lists at most.
const MAX_JOBS_LISTED: usize = 200;

#[derive(Serialize)]
struct ServedJob {
    #[serde(flatten)]
    record: sharemesh_ledger::JobRecord,
    /// What the buyer's newest receipt acknowledged for it (0 before any).
    earned_nano_usd: u64,
}

/// `GET /v1/provider/jobs[?limit=N]`: the jobs this node served, newest first (at most
/// 200), each with what its receipts acknowledged.
pub(super) async fn served_jobs(State(state): State<AppState>, Query(q): Query<Limit>) -> Response {
    let ledger = match state.ledger() {
        Ok(ledger) => ledger,
        Err(err) => return err.into_response(),
    };
    let me = state.mesh.node_id;
    let listed = ledger.jobs().and_then(|jobs| {
        let mut served: Vec<_> = jobs.into_iter().filter(|j| j.provider == me).collect();
        served.sort_by_key(|j| std::cmp::Reverse(j.started_ms));
        served.truncate(q.limit.unwrap_or(50).min(MAX_JOBS_LISTED));
        served
            .into_iter()
            .map(|record| {
                let earned = ledger
                    .receipt_for(&record.job_id, &me)?
                    .map_or(0, |r| r.amount.0);
                Ok(ServedJob {
                    record,
                    earned_nano_usd: earned,
                })
            })
            .collect::<Result<Vec<_>, _>>()
    });
    match listed {
        Ok(jobs) => Json(serde_json::json!({"data": jobs})).into_response(),
        Err(err) => ApiError::upstream(err.to_string()).into_response(),
    }
}
