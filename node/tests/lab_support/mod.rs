//! Set-up shared by the lab tests (`lab.rs`: the market; `attacks.rs`: what a modified
//! peer tries; `trust.rs`, `checks.rs`: verified work): providers by price, attacks,
//! gateways with a ledger, verifying gateways.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use sharemesh_engine::cheat::Cheat;
use sharemesh_gateway::plan::RoutingDefaults;
use sharemesh_lab::{GatewaySpec, Lab, ProviderSpec};
use sharemesh_protocol::{NanoUsd, NodeId};
use sharemesh_provider::adversary::Adversary;

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

/// The receipts in the gateway's ledger, summed per provider: (completion tokens,
/// amount) over every job it was paid for.
pub fn booked(lab: &Lab) -> std::collections::HashMap<NodeId, (u64, u64)> {
    let ledger = lab.ledger.as_ref().unwrap();
    let mut sums = std::collections::HashMap::new();
    for (receipt, _) in ledger.receipts().unwrap() {
        let (tokens, amount) = sums.entry(receipt.provider).or_insert((0, 0));
        *tokens += receipt.completion_tokens;
        *amount += receipt.amount.0;
    }
    sums
}

pub fn with_ledger(dir: &tempfile::TempDir) -> GatewaySpec {
    GatewaySpec {
        ledger_dir: Some(dir.path().to_owned()),
        ..GatewaySpec::default()
    }
}

/// A provider whose scripted engine plays `cheat` (the verification adversaries).
pub fn cheating(price: u64, cheat: sharemesh_engine::cheat::Cheat) -> ProviderSpec {
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

pub fn verifying(dir: &tempfile::TempDir) -> GatewaySpec {
    GatewaySpec {
        verify: true,
        ..with_ledger(dir)
    }
}

/// Sends `request` to the lab, which routes it to the cheapest provider `cheat`, whose
/// answer is not the honest one; waits for the gateway's check to convict it. Returns
/// the answer the client got.
pub async fn served_by_cheat_then_convicted(
    lab: &Lab,
    request: sharemesh_gateway::route::RouteRequest,
    cheat: NodeId,
    why: &str,
) -> sharemesh_lab::Completion {
    let (expected, _) = lab.expected(&request).unwrap();
    let served = lab.complete(request).await.unwrap();
    assert_eq!(served.providers, vec![cheat]);
    assert_ne!(served.token_ids, expected, "{why}");
    let auditor = &lab.gateway.trust().auditor;
    eventually(
        Duration::from_secs(20),
        "the buyer's check convicts the cheat",
        // Counted once the cheat is out of routing and its pay voided.
        || auditor.stats().frauds_found == 1,
    )
    .await;
    assert!(auditor.is_banned(&cheat));
    served
}

/// A gateway that buys its checks from providers (what `sharemesh gateway`
/// does by default), with `canary_rate` of its checks planting a known window.
pub fn buying_checks(dir: &tempfile::TempDir, canary_rate: f64) -> GatewaySpec {
    GatewaySpec {
        outsource: Some(sharemesh_gateway::verify::outsource::OutsourcePolicy {
            window: 6,
            canary_rate,
            ..Default::default()
        }),
        ..with_ledger(dir)
    }
}

/// A sampled request (temperature 0.8, its own seed): the draw is the request's.
pub fn sampled(prompt: &str, max_tokens: u32) -> sharemesh_gateway::route::RouteRequest {
    let routing = sharemesh_gateway::route::RoutingOptions::default();
    let mut request = Lab::request(prompt, max_tokens, routing);
    request.sampling.temperature = 0.8;
    request.sampling.seed = 7;
    request
}

/// Scripted providers whose answers end after five tokens; `cheat` plays the
/// never-stop adversary at half the price (it goes on to `max_tokens`).
pub fn ending_after_five(cheat: bool) -> ProviderSpec {
    let mut spec = if cheat {
        cheating(50, Cheat::NeverStop)
    } else {
        provider(100)
    };
    spec.script.stop_after = Some(5);
    spec
}

/// Completes `request` on the lab, then waits until every check drawn so far is done
/// (verified, convicted, disputed, unverifiable, or skipped for want of a replay slot).
pub async fn complete_then_checked(
    lab: &Lab,
    request: sharemesh_gateway::route::RouteRequest,
) -> sharemesh_lab::Completion {
    let done = lab.complete(request).await.unwrap();
    let trust = lab.gateway.trust();
    eventually(Duration::from_secs(20), "this job's check", || {
        let s = trust.auditor.stats();
        // A check skipped for want of a replay slot is drawn but never done.
        s.verified_ok + s.frauds_found + s.skipped + s.disputed + s.unchecked + s.suspicious
            >= s.drawn
    })
    .await;
    done
}
