//! The policy a running provider applies, as its operator reads it
//! (`GET /v1/provider/policy`, the console's Provider page): what it offers and at what
//! price, when and to whom, the limits it holds buyers to, and whether it takes new work
//! right now (and if not, why).

use serde::Serialize;
use sharemesh_protocol::{Load, NanoUsd, Tier};

use crate::policy::format_window;
use crate::{Provider, NEWCOMER_CREDIT_WINDOW};

#[derive(Clone, Debug, Serialize)]
pub struct PolicyInForce {
    pub models: Vec<ServedModel>,
    pub prices: Vec<TierPriceView>,
    pub region: String,
    /// `mon-fri 09:00-17:00 UTC+02:00`, …; none: always.
    pub windows: Vec<String>,
    pub thermal: ThermalView,
    pub buyers: BuyersView,
    pub max_concurrent: u32,
    /// Tokens sent beyond a paying buyer's last receipt before the stream pauses (a
    /// buyer that has never paid here gets at most `newcomer_credit_window_tokens`).
    pub credit_window_tokens: u32,
    pub newcomer_credit_window_tokens: u32,
    pub credit_timeout_seconds: u64,
    pub advert_interval_seconds: u64,
    pub load: Load,
    /// Whether a job offered now would be taken (slots aside, which `load` shows).
    pub taking_new_work: bool,
    /// Why not, when it would not: outside every window, a GPU over a thermal limit.
    pub paused_because: Vec<String>,
    /// A testnet adversary mode this provider plays (`None`: honest).
    pub adversary: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ServedModel {
    pub id: String,
    pub name: String,
    pub measured_tokens_per_second: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TierPriceView {
    pub tier: &'static str,
    pub price_per_mtok_usd: f64,
    pub price_nano_usd_per_token: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThermalView {
    pub max_temperature_celsius: Option<u32>,
    pub max_power_watts: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BuyersView {
    /// Only these buyers are served (empty: anyone not denied).
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub max_jobs_per_buyer: Option<u32>,
    pub jobs_per_minute: Option<u32>,
}

fn price_view(tier: Tier, price: NanoUsd) -> TierPriceView {
    TierPriceView {
        tier: tier.name(),
        price_per_mtok_usd: price.as_usd_per_mtok(),
        price_nano_usd_per_token: price.0,
    }
}

fn sorted_ids<'a>(ids: impl Iterator<Item = &'a sharemesh_protocol::NodeId>) -> Vec<String> {
    let mut ids: Vec<String> = ids.map(ToString::to_string).collect();
    ids.sort();
    ids
}

impl Provider {
    /// The policy in force at `now_ms`.
    pub fn policy_in_force(&self, now_ms: u64) -> PolicyInForce {
        let policy = &self.policy;
        let mut paused_because = Vec::new();
        if !policy.windows.is_empty() && !policy.windows.iter().any(|w| w.contains(now_ms)) {
            paused_because.push("outside every availability window".to_owned());
        }
        if let Some(reason) = policy.thermal.over_limit() {
            paused_because.push(reason);
        }
        PolicyInForce {
            models: self
                .engine
                .models()
                .iter()
                .map(|model| ServedModel {
                    id: model.id.to_string(),
                    name: model.name.clone(),
                    measured_tokens_per_second: f64::from(policy.measured_milli_tps) / 1000.0,
                })
                .collect(),
            prices: policy
                .tiers
                .iter()
                .map(|&tier| price_view(tier, policy.price(tier)))
                .collect(),
            region: policy.region.clone(),
            windows: policy.windows.iter().map(format_window).collect(),
            thermal: ThermalView {
                max_temperature_celsius: policy.thermal.max_temperature_celsius,
                max_power_watts: policy.thermal.max_power_watts,
            },
            buyers: BuyersView {
                allow: sorted_ids(policy.buyers.allow.iter()),
                deny: sorted_ids(policy.buyers.deny.iter()),
                max_jobs_per_buyer: policy.buyers.max_jobs_per_buyer,
                jobs_per_minute: policy.buyers.jobs_per_minute,
            },
            max_concurrent: policy.max_concurrent,
            credit_window_tokens: policy.credit_window_tokens,
            newcomer_credit_window_tokens: policy.credit_window_tokens.min(NEWCOMER_CREDIT_WINDOW),
            credit_timeout_seconds: policy.credit_timeout.as_secs(),
            advert_interval_seconds: policy.advert_interval.as_secs(),
            load: self.load(),
            taking_new_work: paused_because.is_empty(),
            paused_because,
            adversary: policy.adversary().map(|a| format!("{a:?}")),
        }
    }
}
