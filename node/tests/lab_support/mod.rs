//! Set-up shared by the lab tests (`lab.rs`: the market; `attacks.rs`: what a modified
//! peer tries): providers by price, attacks, gateways with a ledger.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use sharemesh_gateway::plan::RoutingDefaults;
use sharemesh_node::lab::{GatewaySpec, Lab, ProviderSpec};
use sharemesh_protocol::{NanoUsd, NodeId};
use sharemesh_provider::policy::Adversary;

pub fn provider(price: u64) -> ProviderSpec {
    let mut spec = ProviderSpec::default();
    spec.policy.price_per_token = NanoUsd(price);
    spec
}

/// A gateway that replaces a provider after `timeout` of silence.
pub fn stall_timeout(timeout: Duration) -> GatewaySpec {
    GatewaySpec {
        defaults: RoutingDefaults {
            stall_timeout: timeout,
            ..RoutingDefaults::default()
        },
        ..GatewaySpec::default()
    }
}

/// A provider playing `attack`.
pub fn adversary(price: u64, attack: Adversary) -> ProviderSpec {
    let mut spec = provider(price);
    spec.policy.adversary = Some(attack);
    spec
}

/// A cheap provider playing `attack` beside an honest dearer one, behind a gateway with
/// a ledger in `dir`; returns the lab, the cheat and the honest provider.
pub async fn cheat_beside_honest(
    attack: Adversary,
    dir: &tempfile::TempDir,
) -> (Lab, NodeId, NodeId) {
    let lab = Lab::start(vec![adversary(50, attack), provider(100)], with_ledger(dir))
        .await
        .unwrap();
    let (cheat, honest) = (lab.providers[0].node_id, lab.providers[1].node_id);
    (lab, cheat, honest)
}

pub fn slow(spec: ProviderSpec, token_ms: u64) -> ProviderSpec {
    spec.with_token_delay(Duration::from_millis(token_ms))
}

/// The receipts in the gateway's ledger, per provider: (completion tokens, amount).
pub fn booked(lab: &Lab) -> std::collections::HashMap<NodeId, (u64, u64)> {
    let ledger = lab.ledger.as_ref().unwrap();
    ledger
        .receipts()
        .unwrap()
        .into_iter()
        .map(|(r, _)| (r.provider, (r.completion_tokens, r.amount.0)))
        .collect()
}

pub fn with_ledger(dir: &tempfile::TempDir) -> GatewaySpec {
    GatewaySpec {
        ledger_dir: Some(dir.path().to_owned()),
        ..GatewaySpec::default()
    }
}

/// A provider whose scripted engine plays `cheat` (the verification adversaries).
pub fn cheating(price: u64, cheat: sharemesh_engine::Cheat) -> ProviderSpec {
    let mut spec = provider(price);
    spec.script.cheat = cheat;
    spec
}

/// Polls `done` every 20 ms for up to `limit`.
pub async fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
