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
use sharemesh_engine::cheat::Cheat;
use sharemesh_gateway::buyer::Billing;
use sharemesh_gateway::dispatch::{DispatchEvent, Dispatcher};
use sharemesh_gateway::route::RoutingOptions;
use sharemesh_lab::{GatewaySpec, Lab, ProviderSpec};
use sharemesh_ledger::Side;
use sharemesh_mesh::clock::now_ms;
use sharemesh_protocol::{NanoUsd, NodeId};

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
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
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
    // A provider's own gateway: it holds the model, but gossiped proofs stay off the
    // engine it serves on.
    let (serving, _serving_mesh) = lab.add_gateway(verifying(&dirs[3])).await.unwrap();
    serving.trust().auditor.keep_gossip_off_the_replayer();
    for gateway in [&other, &light, &serving] {
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
    let why = "garbage under the model's name";
    let served = served_by_cheat_then_convicted(&lab, request.clone(), cheat, why).await;
    let auditor = &lab.gateway.trust().auditor;
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
        || other.trust().auditor.stats().frauds_confirmed_from_gossip == 1,
    )
    .await;
    assert!(other.trust().auditor.is_banned(&cheat));
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
    eventually(
        Duration::from_secs(15),
        "the serving gateway hears of it without replaying it",
        || serving.trust().auditor.stats().proofs_unconfirmed == 1,
    )
    .await;
    assert!(!serving.trust().auditor.is_banned(&cheat));
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

/// Reputation travels: one gateway verifies a provider's jobs and gossips its signed
/// report; another gateway that never dealt with that provider trusts it through the
/// report (it trusts the reporter, which agrees with what it verified itself) and
/// verifies its jobs less often, while a fresh key stands at zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_records_travel_in_signed_reports() {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let lab = Lab::start(vec![provider(100), provider(300)], verifying(&dirs[0]))
        .await
        .unwrap();
    let (known, fresh) = (lab.providers[0].node_id, lab.providers[1].node_id);
    let (other, _mesh) = lab.add_gateway(verifying(&dirs[1])).await.unwrap();
    eventually(
        Duration::from_secs(20),
        "adverts reach the other gateway",
        || knows(&other, known) && knows(&other, fresh),
    )
    .await;
    // Gossip meshes settle before the first report goes out.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let auditor = &lab.gateway.trust().auditor;
    for i in 0..10 {
        let request = Lab::request(&format!("record {i}"), 4, RoutingOptions::default());
        let done = lab.complete(request).await.unwrap();
        assert_eq!(done.providers, vec![known], "the cheaper provider serves");
    }
    eventually(Duration::from_secs(10), "ten verified jobs", || {
        auditor.stats().verified_ok >= 8
    })
    .await;
    // The other gateway has verified nothing itself; the newcomer rule would verify
    // every job of `known`. Once it trusts the reporter, `known` is vouched for. It
    // trusts the reporter only after agreeing with it on something it verified itself:
    // one job of its own — and a reporter vouches for at most as many jobs as it has
    // agreed with this node on subjects (here one), which shortens a newcomer's audit
    // by at most half: sybils cannot vouch a fresh key past it.
    let request = Lab::request("one of my own", 4, RoutingOptions::default());
    let mut events = other.run(request, None);
    let mut served_by = None;
    while let Some(event) = events.recv().await {
        match event {
            DispatchEvent::Done { providers, .. } => {
                served_by = Some(providers);
                break;
            }
            DispatchEvent::Failed(err) => panic!("the other gateway's job failed: {err:?}"),
            _ => {}
        }
    }
    assert_eq!(served_by, Some(vec![known]));
    let theirs = &other.trust().auditor;
    eventually(
        Duration::from_secs(10),
        "the other gateway verifies its own job",
        || theirs.stats().verified_ok == 1,
    )
    .await;
    let waiting = format!(
        "the report's record reaches the other view: {:?}",
        theirs.view()
    );
    let vouched = || {
        theirs
            .view()
            .vouched_jobs
            .get(&known.to_string())
            .copied()
            .unwrap_or(0)
    };
    eventually(Duration::from_secs(60), &waiting, || vouched() == 1).await;
    // Its own verified job and the one vouched for: still under the newcomer
    // threshold, so `known`'s jobs are still all checked here.
    assert_eq!(theirs.rate(&known, NanoUsd(100), NanoUsd(100)), 1.0);
    let standing = &other.trust().standing;
    assert!(standing.standing(&known, &[known, fresh]) > 0.0);
    assert_eq!(
        standing.standing(&fresh, &[known, fresh]),
        0.0,
        "a fresh key starts at zero"
    );
    assert_eq!(theirs.rate(&fresh, NanoUsd(300), NanoUsd(300)), 1.0);
}

/// A provider that claims ten times its speed: every job is an ordinary-looking check
/// (decode speed from first token to last, so the round trip is not counted); once
/// the median of its last three is below 80% of the claim, it is ranked by what was
/// measured and an honestly faster provider wins the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_slower_than_it_claims_is_ranked_by_what_was_measured() {
    let mut boaster = provider(100).with_token_delay(Duration::from_millis(20));
    boaster.policy.measured_milli_tps = 1_000_000; // claims 1000 tokens/s, does 50
    let honest = provider(100).with_token_delay(Duration::from_millis(5)); // 200 tokens/s
    let gateway = GatewaySpec {
        defaults: sharemesh_gateway::plan::RoutingDefaults {
            // Time matters here: 100 µUSD per second of waiting.
            score: sharemesh_market::ScoreWeights {
                nano_usd_per_second: 100_000.0,
                ..sharemesh_market::ScoreWeights::default()
            },
            quote_k: 0,
            warm_standby_every: 0,
            ..sharemesh_gateway::plan::RoutingDefaults::default()
        },
        ..GatewaySpec::default()
    };
    let lab = Lab::start(vec![boaster, honest], gateway).await.unwrap();
    let (boaster, honest) = (lab.providers[0].node_id, lab.providers[1].node_id);
    let mut served = Vec::new();
    for i in 0..6 {
        let request = Lab::request(&format!("speed {i}"), 16, RoutingOptions::default());
        served.push(lab.complete(request).await.unwrap().providers[0]);
    }
    assert_eq!(
        served[..3],
        [boaster; 3],
        "its claim wins until it is measured"
    );
    assert_eq!(served[3..], [honest; 3], "then the measured speed ranks it");
    let measured = lab
        .gateway
        .trust()
        .auditor
        .measured_speed(&boaster)
        .unwrap();
    assert!(measured < 100.0, "{measured}");
}

fn with_gpu(mut spec: ProviderSpec, uuid: &str) -> ProviderSpec {
    let mut hardware = sharemesh_provider::hardware::Hardware::cpu_only();
    hardware.gpus = vec![sharemesh_provider::hardware::GpuStatus {
        name: "NVIDIA H200".into(),
        uuid: uuid.into(),
        vram_total_bytes: 141 << 30,
        vram_free_bytes: 141 << 30,
        driver_version: "560.35".into(),
        cuda_version: "12.6".into(),
        utilization_percent: None,
        temperature_celsius: None,
        power_watts: None,
    }];
    spec.hardware = Some(hardware);
    spec
}

/// One GPU sold under two identities (a sybil that wants twice the exploration share,
/// or a stolen fingerprint): the signed attestations gossiped beside the adverts give
/// it away; both identities are suspected (every job verified) and ranked lower, and
/// a provider with a GPU of its own is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gpu_under_two_identities_is_noticed() {
    let lab = Lab::start(
        vec![
            with_gpu(provider(100), "GPU-shared"),
            with_gpu(provider(100), "GPU-shared"),
            with_gpu(provider(100), "GPU-own"),
        ],
        GatewaySpec::default(),
    )
    .await
    .unwrap();
    let trust = lab.gateway.trust();
    let ids: Vec<NodeId> = lab.providers.iter().map(|p| p.node_id).collect();
    // The shared UUID counts against whichever identity claimed it later here.
    eventually(
        Duration::from_secs(15),
        "the attestations reach the gateway",
        // Flagged first, then suspected: wait for both.
        || ids[..2].iter().any(|id| trust.auditor.is_suspected(id)),
    )
    .await;
    let (first, later) = match trust.attestations.is_flagged(&ids[1]) {
        true => (ids[0], ids[1]),
        false => (ids[1], ids[0]),
    };
    assert!(trust.attestations.is_flagged(&later) && trust.auditor.is_suspected(&later));
    assert!(!trust.attestations.is_flagged(&first));
    assert!(!trust.attestations.is_flagged(&ids[2]));
    assert!(!trust.auditor.is_suspected(&ids[2]));
    let findings = trust.attestations.findings();
    assert!(findings[&later.to_string()][0].contains("attested first by 1 other identity"));
    // Same price: the later claimant ranks below both others.
    let request = Lab::request("x", 4, RoutingOptions::default());
    let (ranked, _) = lab
        .gateway
        .candidates(&request_model(&lab), &request, &Default::default());
    assert_eq!(ranked.last().map(|c| c.provider()), Some(later));
}

/// Less unpaid work at risk with a stranger: a buyer that never paid this provider
/// gets a credit window of at most 16 tokens; once one of its receipts is booked, the
/// provider's full window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_that_never_paid_gets_a_small_credit_window() {
    use sharemesh_gateway::buyer::{Billing, JobEvent};
    let lab = Lab::start(vec![provider(100)], GatewaySpec::default())
        .await
        .unwrap();
    let provider = lab.providers[0].node_id;
    let mut windows = Vec::new();
    for _ in 0..2 {
        let mut job = lab
            .gateway_buyer()
            .open_job(provider, "pay as you go", 12, Billing::Metered(None))
            .await
            .unwrap();
        while let Some(event) = job.next().await {
            match event {
                JobEvent::Accepted(accept) => windows.push(accept.credit_window_tokens),
                JobEvent::Finished { .. } => break,
                JobEvent::Failed(why) => panic!("{why}"),
                _ => {}
            }
        }
    }
    let full = sharemesh_provider::ProviderPolicy::default().credit_window_tokens;
    assert_eq!(
        windows,
        vec![sharemesh_provider::NEWCOMER_CREDIT_WINDOW, full]
    );
}

/// Attack (`proof-spam`): a key buys one honest job, then gossips thirty fraud proofs
/// against the honest provider, built from the provider's real signed chunks with a
/// made-up replay at each step. A verifying gateway checks at most four proofs against
/// one accused an hour (and eight from one reporter), refutes what it checks, marks
/// the reporter as misbehaving for each, and never suspects, bans or stops paying the
/// honest provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_false_proofs_costs_the_reporter_not_the_accused() {
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::start(vec![provider(100)], verifying(&dir))
        .await
        .unwrap();
    let honest = lab.providers[0].node_id;
    let spammer = lab.add_buyer().await.unwrap();
    let peer = honest.peer_id().unwrap();
    eventually(Duration::from_secs(10), "the spammer connects", || {
        spammer.mesh.is_connected(&peer)
    })
    .await;
    let mut job = spammer
        .open_job(honest, "something to accuse", 12, Billing::Metered(None))
        .await
        .unwrap();
    while job.next().await.is_some() {}
    let transcript = job.transcript().unwrap().clone();
    let committed: Vec<_> = transcript.committed().into_iter().cloned().collect();
    assert!(committed.len() >= 4);
    let auditor = &lab.gateway.trust().auditor;
    let reporter = spammer.key.node_id();
    let before = lab.gateway.reputation(&reporter);
    for n in 0..30u32 {
        let step = n as usize % committed.len();
        let mut replayed = committed[step].clone();
        for (_, logit) in &mut replayed.top {
            *logit = (f32::from_bits(*logit) + 1.0 + n as f32).to_bits();
        }
        let proof = transcript
            .proof(reporter, step, replayed, transcript.profile().clone())
            .unwrap();
        let sealed = spammer
            .key
            .seal(&proof, u64::from(n) + 1, now_ms(), 3_600_000)
            .unwrap();
        // The first waits for the spammer's gossip mesh to form.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while let Err(err) = spammer.mesh.publish_fraud_proof(&sealed).await {
            assert!(tokio::time::Instant::now() < deadline, "{err}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eventually(
        Duration::from_secs(20),
        "the flood reaches the gateway",
        || {
            let stats = auditor.stats();
            stats.proofs_refuted >= 1 && stats.proofs_rate_limited >= 26
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = auditor.stats();
    assert!(
        (1..=4).contains(&stats.proofs_refuted),
        "at most four checked against one accused: {stats:?}"
    );
    assert_eq!(stats.frauds_confirmed_from_gossip, 0);
    assert!(!auditor.is_banned(&honest) && !auditor.is_suspected(&honest));
    assert!(
        lab.gateway.reputation(&reporter) < before,
        "each refuted proof marks its reporter"
    );
    let done = lab
        .complete(Lab::request("still served", 4, RoutingOptions::default()))
        .await
        .unwrap();
    assert_eq!(done.providers, vec![honest]);
}
