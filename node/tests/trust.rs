#![allow(clippy::unwrap_used)]
//! Verified work on the fast seam (scripted engines, real swarms, real ledgers): a
//! provider that serves garbage under the model's name is caught by a verifying
//! gateway's replay, its pay voided and the proof gossiped, so every gateway that can
//! replay drops it — including one that never dealt with it — and one that cannot
//! replay scrutinises it. Honest providers are never accused. (Replays on the real
//! model: `engine/tests/verify.rs`; the whole path with real processes:
//! `tests/verify_process.rs`.)

mod lab_support;

use std::sync::Arc;
use std::time::Duration;

use lab_support::*;
use sharemesh_engine::Cheat;
use sharemesh_gateway::dispatch::Dispatcher;
use sharemesh_gateway::openai::RoutingOptions;
use sharemesh_ledger::Side;
use sharemesh_mesh::clock::now_ms;
use sharemesh_node::lab::{GatewaySpec, Lab, ProviderSpec};
use sharemesh_protocol::{NanoUsd, NodeId};

fn cheating(price: u64, cheat: Cheat) -> ProviderSpec {
    let mut spec = provider(price);
    spec.script.cheat = cheat;
    spec
}

fn verifying(dir: &tempfile::TempDir) -> GatewaySpec {
    GatewaySpec {
        verify: true,
        ..with_ledger(dir)
    }
}

/// Polls `done` every 20 ms for up to `limit`.
async fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn knows(gateway: &Dispatcher, provider: NodeId) -> bool {
    gateway
        .mesh()
        .book
        .read()
        .unwrap()
        .live(now_ms())
        .iter()
        .any(|e| e.advert.provider == provider)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_provider_is_caught_unpaid_and_dropped_across_the_mesh() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let lab = Lab::start(
        vec![cheating(50, Cheat::Garbage), provider(100)],
        verifying(&dirs[0]),
    )
    .await
    .unwrap();
    let (cheat, honest) = (lab.providers[0].node_id, lab.providers[1].node_id);
    // A second verifying gateway that never buys from the cheat, and a light client
    // without a model.
    let (other, _other_mesh) = lab.add_gateway(verifying(&dirs[1])).await.unwrap();
    let (light, _light_mesh) = lab.add_gateway(with_ledger(&dirs[2])).await.unwrap();
    for gateway in [&other, &light] {
        eventually(
            Duration::from_secs(20),
            "adverts reach the new gateways",
            || knows(gateway, cheat) && knows(gateway, honest),
        )
        .await;
    }
    // Mesh links settle before the proof is gossiped.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The cheapest provider serves the first request: noise, which the client cannot
    // tell until the replay.
    let request = Lab::request("tell me a story", 12, RoutingOptions::default());
    let (expected, _) = lab.expected(&request).unwrap();
    let served = lab.complete(request.clone()).await.unwrap();
    assert_eq!(served.providers, vec![cheat]);
    assert_ne!(served.token_ids, expected, "garbage under the model's name");

    let auditor = &lab.gateway.trust().auditor;
    eventually(
        Duration::from_secs(10),
        "the buyer's replay convicts the cheat",
        || auditor.is_banned(&cheat),
    )
    .await;
    let stats = auditor.stats();
    assert_eq!(stats.frauds_found, 1);
    // Its pay is void: the buyer's money is back in its budgets.
    let ledger = lab.ledger.as_ref().unwrap();
    let settlement = ledger
        .settlement(&lab.gateway.node_id(), Side::Spend, now_ms())
        .unwrap();
    assert_eq!(settlement.voided_nano_usd, served.cost.0);
    assert!(served.cost > NanoUsd::ZERO);
    assert_eq!(
        ledger.spent_since(&lab.gateway.node_id(), 0).unwrap(),
        served.cost.0
    );
    assert_eq!(ledger.frauds().unwrap()[0].0, cheat);

    // The gossiped proof: the other verifying gateway replays it and drops the cheat;
    // the light client cannot replay it and verifies the cheat's every job instead.
    eventually(
        Duration::from_secs(15),
        "the other gateway confirms the proof",
        || other.trust().auditor.is_banned(&cheat),
    )
    .await;
    assert_eq!(
        other.trust().auditor.stats().frauds_confirmed_from_gossip,
        1
    );
    let (ranked, _) = other.candidates(&request_model(&lab), &request, &Default::default());
    assert!(ranked.iter().all(|c| c.provider() != cheat));
    assert!(ranked.iter().any(|c| c.provider() == honest));
    eventually(
        Duration::from_secs(15),
        "the light client hears of it",
        || light.trust().auditor.stats().proofs_unconfirmed == 1,
    )
    .await;
    assert!(!light.trust().auditor.is_banned(&cheat));
    assert_eq!(
        light.trust().auditor.rate(&cheat, NanoUsd(50), NanoUsd(50)),
        1.0
    );

    // The next request goes to the honest provider, exact, and verifies clean.
    let again = lab.complete(request).await.unwrap();
    assert_eq!(again.providers, vec![honest]);
    assert_eq!(again.token_ids, expected);
    eventually(Duration::from_secs(10), "the honest job verifies", || {
        auditor.stats().verified_ok >= 1
    })
    .await;
    assert_eq!(auditor.stats().frauds_found, 1, "no honest false positive");
}

fn request_model(lab: &Lab) -> sharemesh_protocol::ModelId {
    lab.gateway
        .resolve_model(&Lab::request("x", 1, RoutingOptions::default()).model)
        .unwrap()
}

/// Camouflage: honest while new (every job is verified then), garbage once it has a
/// record. Verification never stops (the rate has a floor, and the buyer's secret
/// draw cannot be predicted), so the first garbage job verified convicts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_camouflaged_provider_is_caught_when_it_turns() {
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::start(
        vec![
            cheating(50, Cheat::Camouflage { honest_jobs: 3 }),
            provider(100),
        ],
        verifying(&dir),
    )
    .await
    .unwrap();
    let (cheat, honest) = (lab.providers[0].node_id, lab.providers[1].node_id);
    let auditor = &lab.gateway.trust().auditor;
    let mut garbage_served = 0;
    for i in 0..8 {
        let request = Lab::request(&format!("question {i}"), 6, RoutingOptions::default());
        let (expected, _) = lab.expected(&request).unwrap();
        let audited = auditor.stats().verified_ok + auditor.stats().frauds_found;
        let done = lab.complete(request).await.unwrap();
        if done.token_ids != expected {
            garbage_served += 1;
            assert_eq!(done.providers, vec![cheat]);
        }
        // Audits run beside the response; every job here is a newcomer's: audited.
        eventually(Duration::from_secs(10), "this job's audit", || {
            auditor.stats().verified_ok + auditor.stats().frauds_found > audited
        })
        .await;
    }
    assert_eq!(garbage_served, 1, "caught on its first garbage job");
    assert!(auditor.is_banned(&cheat));
    assert!(!auditor.is_banned(&honest));
    assert_eq!(auditor.stats().frauds_found, 1);
}

/// Honest providers on the same profile: every job replays exactly, nobody is accused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_providers_are_never_accused() {
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::start(vec![provider(100), provider(100)], verifying(&dir))
        .await
        .unwrap();
    let auditor = Arc::new(&lab.gateway.trust().auditor);
    for i in 0..10 {
        let request = Lab::request(&format!("honest {i}"), 5, RoutingOptions::default());
        lab.complete(request).await.unwrap();
    }
    // Every job of a provider with fewer than 8 verified jobs is drawn; the rate falls
    // after that.
    let drawn = auditor.stats().drawn;
    assert!(drawn >= 8, "{:?}", auditor.stats());
    eventually(Duration::from_secs(10), "every drawn job verified", || {
        auditor.stats().verified_ok == drawn
    })
    .await;
    assert_eq!(auditor.stats().frauds_found, 0);
    assert!(lab.providers.iter().all(|p| !auditor.is_banned(&p.node_id)));
}
