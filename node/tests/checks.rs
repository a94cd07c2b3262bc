#![allow(clippy::unwrap_used)]
//! What a check looks at beyond the logits, and checks bought from providers (the
//! default of `sharemesh gateway`), on the fast seam (scripted engines, real swarms,
//! real ledgers): tokens the request's seeded sampler would not draw (chosen tokens,
//! never stopping) are convicted by a replay's redraw or by a third provider; lazy
//! verifiers are proven wrong; and what checks cost in an honest network, and what a
//! cheat keeps under them, is measured. (Replays and the gossip of proofs:
//! `trust.rs`; on the real model: `engine/tests/verify.rs`.)

mod lab_support;

use std::time::Duration;

use lab_support::*;
use sharemesh_engine::cheat::Cheat;
use sharemesh_gateway::route::RoutingOptions;
use sharemesh_lab::{GatewaySpec, Lab};
use sharemesh_ledger::Side;
use sharemesh_mesh::clock::now_ms;

/// A light client without the model: a window of the garbage job is re-run by another
/// provider as a paid resume, differs, and a third provider settles it against the
/// cheat, whose pay is voided; the honest verifiers are paid and never accused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_the_model_has_providers_check_and_catches_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::start(
        vec![cheating(50, Cheat::Garbage), provider(100), provider(100)],
        buying_checks(&dir, 0.0),
    )
    .await
    .unwrap();
    let cheat = lab.providers[0].node_id;
    let request = Lab::request("tell me a story", 12, RoutingOptions::default());
    let served = served_by_cheat_then_convicted(&lab, request, cheat, "garbage").await;
    let trust = lab.gateway.trust();
    let bought = trust.outsourcing().unwrap().stats();
    assert_eq!(bought.disputes, 1, "{bought:?}");
    assert_eq!(bought.windows_run, 2, "check and tie-break: {bought:?}");
    assert_eq!(bought.verifiers_caught, 0);
    // The verifiers were paid like any job: an eighth of the 12 steps rounded up (the
    // policy's window of 6 is more), resumed after at least one token, so no prompt is
    // billed.
    let paid = booked(&lab);
    let mut spent = 0;
    for verifier in &lab.providers[1..] {
        let (tokens, amount) = paid[&verifier.node_id];
        assert_eq!(tokens, 2, "a window of two steps");
        assert_eq!(amount, 200);
        spent += amount;
    }
    assert_eq!(bought.spent_nano_usd, spent);
    // The cheat's pay is void.
    let ledger = lab.ledger.as_ref().unwrap();
    let settlement = ledger
        .settlement(&lab.gateway.node_id(), Side::Spend, now_ms())
        .unwrap();
    assert_eq!(settlement.voided_nano_usd, served.cost.0);
    for verifier in &lab.providers[1..] {
        assert!(!trust.auditor.is_suspected(&verifier.node_id));
        assert!(!trust.auditor.is_banned(&verifier.node_id));
    }
}

/// A provider that runs the model but draws its sampled tokens from its own random
/// stream (honest fingerprints, chosen text: never ending, steering, or a cheaper
/// model's tokens fingerprinted afterwards). The replay's redraw with the request's
/// seed differs at its first chosen token: convicted, its pay voided, and the next
/// request is served honestly and verifies clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_choosing_its_own_tokens_is_caught_by_the_redraw() {
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::start(
        vec![cheating(50, Cheat::ChooseTokens), provider(100)],
        verifying(&dir),
    )
    .await
    .unwrap();
    let (cheat, honest) = (lab.providers[0].node_id, lab.providers[1].node_id);
    let request = sampled("tell me a story", 12);
    let (expected, _) = lab.expected(&request).unwrap();
    let why = "tokens of its own choosing";
    let served = served_by_cheat_then_convicted(&lab, request.clone(), cheat, why).await;
    let auditor = &lab.gateway.trust().auditor;
    let settlement = spend_settlement(&lab);
    assert_eq!(settlement.voided_nano_usd, served.cost.0);
    let again = lab.complete(request).await.unwrap();
    assert_eq!(again.providers, vec![honest]);
    assert_eq!(again.token_ids, expected);
    eventually(Duration::from_secs(10), "the honest job verifies", || {
        auditor.stats().verified_ok >= 1
    })
    .await;
    assert_eq!(auditor.stats().frauds_found, 1, "no honest false positive");
}

/// The same cheat under checks bought from providers: the verifier's window (same
/// seed, same profile) has equal fingerprints but other tokens; a third provider's
/// run agrees with the verifier, and the cheat is convicted — the honest verifier is
/// not made a suspect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chosen_tokens_are_settled_by_a_third_provider_under_bought_checks() {
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::start(
        vec![
            cheating(50, Cheat::ChooseTokens),
            provider(100),
            provider(100),
        ],
        buying_checks(&dir, 0.0),
    )
    .await
    .unwrap();
    let cheat = lab.providers[0].node_id;
    let request = sampled("tell me a story", 12);
    served_by_cheat_then_convicted(&lab, request, cheat, "chosen tokens").await;
    let trust = lab.gateway.trust();
    let bought = trust.outsourcing().unwrap().stats();
    assert_eq!(bought.windows_run, 2, "check and tie-break: {bought:?}");
    for verifier in &lab.providers[1..] {
        assert!(!trust.auditor.is_suspected(&verifier.node_id));
        assert!(!trust.auditor.is_banned(&verifier.node_id));
    }
}

/// A provider that never ends (where the sampler draws an end token it takes another,
/// billing up to `max_tokens`): a replay redraws the end token there and convicts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_never_stops_is_caught_by_the_redraw() {
    let dir = tempfile::tempdir().unwrap();
    let spec = GatewaySpec {
        verify_stop_after: Some(5),
        ..verifying(&dir)
    };
    let lab = Lab::start(
        vec![ending_after_five(true), ending_after_five(false)],
        spec,
    )
    .await
    .unwrap();
    let cheat = lab.providers[0].node_id;
    let served = lab.complete(sampled("tell me a story", 12)).await.unwrap();
    assert_eq!(served.providers, vec![cheat]);
    assert_eq!(served.token_ids.len(), 12, "billed to max_tokens, not 5");
    let auditor = &lab.gateway.trust().auditor;
    eventually(
        Duration::from_secs(10),
        "the redraw convicts the cheat",
        || auditor.stats().frauds_found == 1,
    )
    .await;
    assert!(auditor.is_banned(&cheat));
    let again = lab.complete(sampled("tell me a story", 12)).await.unwrap();
    assert_eq!(again.token_ids.len(), 5);
}

/// The same cheat under checks bought from providers: a window that reaches where the
/// answer ends has its verifier stop there; a third provider stops there too, and the
/// cheat is convicted with its own token at that step (which any holder of the model
/// confirms by redrawing). Honest providers are never accused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_never_stops_is_caught_under_bought_checks() {
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::start(
        vec![
            ending_after_five(true),
            ending_after_five(false),
            ending_after_five(false),
        ],
        buying_checks(&dir, 0.0),
    )
    .await
    .unwrap();
    let cheat = lab.providers[0].node_id;
    let trust = lab.gateway.trust();
    // A window falls where the answer should have ended in 7 of 10 checks.
    for i in 0..8 {
        let done = lab
            .complete(sampled(&format!("tell me story {i}"), 12))
            .await
            .unwrap();
        if done.providers != vec![cheat] {
            break;
        }
        let checked =
            |s: &sharemesh_gateway::verify::audit::AuditStats| s.verified_ok + s.frauds_found;
        let before = checked(&trust.auditor.stats());
        eventually(Duration::from_secs(20), "this job's check", || {
            trust.auditor.is_banned(&cheat) || checked(&trust.auditor.stats()) > before
        })
        .await;
        if trust.auditor.is_banned(&cheat) {
            break;
        }
    }
    assert!(
        trust.auditor.is_banned(&cheat),
        "{:?}",
        trust.outsourcing().unwrap().stats()
    );
    for honest in &lab.providers[1..] {
        assert!(!trust.auditor.is_suspected(&honest.node_id));
        assert!(!trust.auditor.is_banned(&honest.node_id));
    }
}

/// What verification costs in an honest network under the default policy (windows
/// bought from providers, 16 steps at most an eighth of a segment, a plant now and
/// then): 24 requests of 32 tokens to three fresh providers — a provider's first eight
/// jobs are all checked — cost at most 15% of what the answers cost, and nobody is
/// accused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_costs_at_most_a_sixth_of_spend_in_an_honest_network() {
    let dir = tempfile::tempdir().unwrap();
    let spec = GatewaySpec {
        outsource: Some(Default::default()),
        ..with_ledger(&dir)
    };
    let lab = Lab::start(vec![provider(100), provider(100), provider(100)], spec)
        .await
        .unwrap();
    let trust = lab.gateway.trust();
    let mut answers = 0;
    for i in 0..24 {
        let prompt = format!("please write a short note about the river number {i}");
        let request = Lab::request(&prompt, 32, RoutingOptions::default());
        answers += complete_then_checked(&lab, request).await.cost.0;
    }
    let stats = trust.auditor.stats();
    let bought = trust.outsourcing().unwrap().stats();
    let share = bought.spent_nano_usd as f64 / answers as f64;
    println!(
        "verification: {} of 24 jobs checked, {} windows, {} nano-USD = {:.1}% of {} spent on answers",
        stats.drawn,
        bought.windows_run,
        bought.spent_nano_usd,
        100.0 * share,
        answers
    );
    assert!(
        stats.drawn >= 8,
        "a newcomer's jobs are all checked: {stats:?}"
    );
    assert_eq!(stats.frauds_found, 0);
    assert_eq!(bought.disputes, 0);
    assert!(share <= 0.15, "{share}");
    for provider in &lab.providers {
        assert!(!trust.auditor.is_suspected(&provider.node_id));
    }
}

/// The goal of default verification, measured: a gateway with the default policy
/// (checks bought from providers) beside two honest providers and one cheat that is
/// cheaper (so ranked first) — garbage, or its own token choices — over 24 sampled
/// requests. The cheat serves at most 2 and keeps at most 1% of the buyer's spend on
/// answers (its pending pay is voided on conviction); no honest provider is accused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_default_checks_a_cheat_serves_at_most_two_of_24_and_keeps_under_1_percent() {
    for cheat_kind in [Cheat::Garbage, Cheat::ChooseTokens] {
        let dir = tempfile::tempdir().unwrap();
        let spec = GatewaySpec {
            outsource: Some(Default::default()),
            ..with_ledger(&dir)
        };
        let providers = vec![cheating(50, cheat_kind), provider(100), provider(100)];
        let lab = Lab::start(providers, spec).await.unwrap();
        let cheat = lab.providers[0].node_id;
        let trust = lab.gateway.trust();
        let (mut served_by_cheat, mut spent) = (0, 0);
        for i in 0..24 {
            let request = sampled(&format!("tell me a story about {i}"), 24);
            let done = complete_then_checked(&lab, request).await;
            spent += done.cost.0;
            served_by_cheat += usize::from(done.providers.contains(&cheat));
        }
        let ledger = lab.ledger.as_ref().unwrap();
        let settlement = ledger
            .settlement(&lab.gateway.node_id(), Side::Spend, now_ms())
            .unwrap();
        let to_cheat = booked(&lab).get(&cheat).map_or(0, |&(_, amount)| amount);
        let kept = to_cheat.saturating_sub(settlement.voided_nano_usd);
        println!("{cheat_kind:?}: served {served_by_cheat} of 24, kept {kept} of {spent} nano-USD");
        assert!(
            served_by_cheat <= 2,
            "{cheat_kind:?} served {served_by_cheat}"
        );
        assert!(kept * 100 <= spent, "{cheat_kind:?} kept {kept} of {spent}");
        assert!(trust.auditor.is_banned(&cheat));
        for honest in &lab.providers[1..] {
            assert!(!trust.auditor.is_suspected(&honest.node_id));
            assert!(!trust.auditor.is_banned(&honest.node_id));
        }
    }
}

/// A verifier that skips the work it is paid for (garbage on resumed jobs, honest on
/// fresh ones) is proven wrong: outvoted if it checks a job, or by a planted window
/// two honest providers agreed on. Honest providers are never accused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_verifier_is_proven_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::start(
        vec![
            provider(50),
            cheating(100, Cheat::LazyResume),
            provider(100),
            provider(100),
        ],
        buying_checks(&dir, 1.0),
    )
    .await
    .unwrap();
    let (served_by, lazy) = (lab.providers[0].node_id, lab.providers[1].node_id);
    let trust = lab.gateway.trust();
    // Each job is checked by a random one of the three others (the lazy one: outvoted),
    // and a planted window goes to a random provider outside the pair that agreed on it
    // (the lazy one: a third provider confirms the planted answer).
    for i in 0..8 {
        let request = Lab::request(&format!("honest work {i}"), 12, RoutingOptions::default());
        let (expected, _) = lab.expected(&request).unwrap();
        let done = lab.complete(request).await.unwrap();
        assert_eq!(done.providers, vec![served_by]);
        assert_eq!(done.token_ids, expected);
        let checked = trust.auditor.stats().verified_ok + trust.auditor.stats().frauds_found;
        eventually(Duration::from_secs(20), "this job's check", || {
            trust.auditor.stats().verified_ok + trust.auditor.stats().frauds_found > checked
        })
        .await;
        if trust.auditor.is_banned(&lazy) {
            break;
        }
    }
    assert!(
        trust.auditor.is_banned(&lazy),
        "{:?}",
        trust.outsourcing().unwrap().stats()
    );
    assert_eq!(trust.outsourcing().unwrap().stats().verifiers_caught, 1);
    for honest in [0, 2, 3].map(|i| lab.providers[i].node_id) {
        assert!(!trust.auditor.is_banned(&honest));
        assert!(!trust.auditor.is_suspected(&honest));
    }
    assert_eq!(lab.ledger.as_ref().unwrap().frauds().unwrap()[0].0, lazy);
}

/// Two providers serving the same wrong answer (the scripted garbage is one function of
/// the request, so the pair agrees on it: a ring running one substitute) beside two
/// honest providers, under default bought checks (`download`: the gateway fetches the
/// model at its first check, and holds it after that long), over `requests` sampled
/// requests: the lab, the ring, and how many requests it served and what it kept of
/// what the answers cost, once both colluders are convicted (when it fetches).
async fn ring_beside_two_honest(
    dir: &tempfile::TempDir,
    download: Option<Duration>,
    requests: usize,
) -> (Lab, [sharemesh_protocol::NodeId; 2], usize, u64, u64) {
    let spec = GatewaySpec {
        outsource: Some(Default::default()),
        escalate: download,
        ..with_ledger(dir)
    };
    let providers = vec![
        cheating(50, Cheat::Garbage),
        cheating(50, Cheat::Garbage),
        provider(100),
        provider(100),
    ];
    let lab = Lab::start(providers, spec).await.unwrap();
    let ring = [lab.providers[0].node_id, lab.providers[1].node_id];
    let (mut served, mut spent) = (0, 0);
    for i in 0..requests {
        let request = sampled(&format!("tell me a story about {i}"), 24);
        let done = complete_then_checked(&lab, request).await;
        spent += done.cost.0;
        served += usize::from(done.providers.iter().any(|p| ring.contains(p)));
    }
    if download.is_some() {
        let trust = lab.gateway.trust();
        eventually(Duration::from_secs(20), "both colluders convicted", || {
            ring.iter().all(|p| trust.auditor.is_banned(p))
        })
        .await;
    }
    let kept_now = || {
        let settlement = spend_settlement(&lab);
        let booked = booked(&lab);
        let to_ring: u64 = ring
            .iter()
            .map(|p| booked.get(p).map_or(0, |&(_, amount)| amount))
            .sum();
        to_ring.saturating_sub(settlement.voided_nano_usd)
    };
    // A conviction voids the receipts before it bans: once both are banned, the ledger
    // already says what the ring kept.
    let kept = kept_now();
    (lab, ring, served, kept, spent)
}

/// Waits for the honest providers (the lab's last two) to be suspected no more: the
/// ring's disputes with them were judged by ground truth (after the ring's own work).
async fn honest_suspected_no_more(lab: &Lab) {
    let trust = lab.gateway.trust();
    eventually(
        Duration::from_secs(5),
        "the honest providers vindicated",
        || {
            lab.providers[2..]
                .iter()
                .all(|honest| !trust.auditor.is_suspected(&honest.node_id))
        },
    )
    .await;
}

/// Attack (`collude-verify`) on a light client that cannot fetch the model
/// (`--no-verify-fetch`): a colluder checking its partner agrees with it; an honest
/// verifier that differs is not outvoted by the other colluder alone, since a
/// conviction needs every tie-breaker drawn (two here) to agree — with one tie-breaker,
/// about a third of the disputes convicted the honest verifier. No honest provider is
/// ever convicted. What the ring serves and keeps is printed: a split dispute (two
/// against two) leaves all four suspected and nobody convicted, so the cheaper ring
/// keeps serving; only ground truth settles it (the next test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colluding_verifiers_never_convict_an_honest_provider() {
    let dir = tempfile::tempdir().unwrap();
    let (lab, ring, served, kept, spent) = ring_beside_two_honest(&dir, None, 24).await;
    let trust = lab.gateway.trust();
    let stats = trust.auditor.stats();
    let banned = ring.iter().filter(|p| trust.auditor.is_banned(p)).count();
    println!(
        "ring served {served} of 24, kept {kept} of {spent} nano-USD; \
         {banned} of 2 convicted; {stats:?}"
    );
    for honest in &lab.providers[2..] {
        assert!(
            !trust.auditor.is_banned(&honest.node_id),
            "an honest provider was convicted"
        );
    }
    assert!(stats.disputed > 0, "the ring's answers were disputed");
}

/// The same ring against a gateway that fetches the model, as `sharemesh gateway` does:
/// its first job starts the "download" (the lab hands it the honest replayer after
/// 200 ms), checks are bought meanwhile, and once it holds the model it replays what
/// only providers vouched for meanwhile and every later job here. Meanwhile each
/// provider serves the model once: a provider that served it waits (and so do requests
/// that find every provider waiting) until that work is replayed. Both colluders are
/// convicted and keep none of their pay; no honest provider is accused; the ring serves
/// at most one request per member (3–4 of 24 before providers were held to one job on
/// credit while the model is fetched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsettled_dispute_fetches_the_model_and_convicts_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let download = Some(Duration::from_millis(200));
    let (lab, _ring, served, kept, spent) = ring_beside_two_honest(&dir, download, 24).await;
    let trust = lab.gateway.trust();
    println!("ring served {served} of 24, kept {kept} of {spent} nano-USD");
    assert_eq!(trust.verification().name(), "replay+outsourced");
    assert!(served <= 2, "the ring served {served} of 24");
    assert!(kept * 100 <= spent, "the ring kept {kept} of {spent}");
    for honest in &lab.providers[2..] {
        assert!(!trust.auditor.is_banned(&honest.node_id));
    }
    honest_suspected_no_more(&lab).await;
}

/// Everything the ring serves falls inside a long download (4 requests, 2 s; one each,
/// since a provider that served the model waits while it is fetched): no later job of
/// it is ever replayed here, so only the work kept meanwhile can convict it —
/// its jobs that a bought check passed (a colluder checking its partner) and the
/// windows the colluder signed doing so. Once the model is held both are convicted from
/// that work alone and keep none of their pay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_ring_vouched_for_while_the_model_downloads_convicts_it() {
    let dir = tempfile::tempdir().unwrap();
    let download = Some(Duration::from_secs(2));
    let started = std::time::Instant::now();
    let (lab, ring, served, kept, spent) = ring_beside_two_honest(&dir, download, 4).await;
    let trust = lab.gateway.trust();
    println!(
        "ring served {served} of 4, kept {kept} of {spent} nano-USD; {:?}",
        trust.auditor.stats()
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(served >= 1, "the ring served nothing");
    for colluder in ring {
        assert!(trust.auditor.is_banned(&colluder));
    }
    assert!(kept * 100 <= spent, "the ring kept {kept} of {spent}");
    for honest in &lab.providers[2..] {
        assert!(!trust.auditor.is_banned(&honest.node_id));
    }
    honest_suspected_no_more(&lab).await;
}

/// The gateway's spend as its ledger settles it now (voided pay included).
fn spend_settlement(lab: &Lab) -> sharemesh_ledger::Settlement {
    lab.ledger
        .as_ref()
        .unwrap()
        .settlement(&lab.gateway.node_id(), Side::Spend, now_ms())
        .unwrap()
}
