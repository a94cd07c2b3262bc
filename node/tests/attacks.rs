#![allow(clippy::unwrap_used)]
//! Attacks on the fast seam: each test plays what a peer running modified code would
//! try (the adversary kit's modes, `provide --adversary …`) against real providers, a
//! real gateway and real swarms in one process, and shows what the attack gets.

mod lab_support;

use std::time::Duration;

use lab_support::*;
use sharemesh_gateway::api::error::ApiError;
use sharemesh_gateway::buyer::{Billing, JobEvent};
use sharemesh_gateway::route::RouteError;
use sharemesh_gateway::route::RoutingOptions;
use sharemesh_lab::{gateway_node_id, lab_book, GatewaySpec, Lab};
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::orderbook::BookLimits;
use sharemesh_protocol::{NanoUsd, RejectReason};
use sharemesh_provider::adversary::Adversary;

/// Attack: a provider claims a thousand times the prompt's size in its Accept (a signed
/// receipt for that would be worth far more than the job). The buyer refuses the terms
/// before paying anything, the provider is marked as misbehaving, and the honest
/// provider serves the request at price × counted tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overbilling_provider_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (lab, cheat, honest) = cheat_beside_honest(Adversary::Overbill(1000), &dir).await;
    let request = Lab::request("what does this cost", 10, RoutingOptions::default());
    let (ids, _) = lab.expected(&request).unwrap();
    let done = lab.complete(request).await.unwrap();
    assert_eq!(done.token_ids, ids);
    assert_eq!(done.providers, vec![honest]);
    // Four words and a start token: 5 prompt tokens + 10 completion tokens at 100.
    assert_eq!(done.cost, NanoUsd(15 * 100));
    let books = booked(&lab);
    assert_eq!(books.get(&honest), Some(&(10, 1_500)));
    assert!(!books.contains_key(&cheat), "no receipt for the overbiller");
    assert!(
        lab.gateway.reputation(&cheat) < -7.9,
        "marked as misbehaving"
    );
}

/// Attack: a provider signs its `Accept` and chunks with a throwaway key, so receipts
/// (and any fraud proof) would name an identity it can drop while its own keeps its
/// standing. The buyer refuses an answer not signed by the provider it addressed, before
/// a token is relayed or paid: the honest provider serves, the cheat's real key is marked
/// as misbehaving and nothing is booked to either key of the cheat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_answering_under_another_key_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (lab, cheat, honest) = cheat_beside_honest(Adversary::AliasKey, &dir).await;
    let request = Lab::request("who signs this", 10, RoutingOptions::default());
    let (ids, _) = lab.expected(&request).unwrap();
    let done = lab.complete(request).await.unwrap();
    assert_eq!(done.token_ids, ids);
    assert_eq!(
        done.providers,
        vec![honest],
        "no token relayed from the alias"
    );
    let books = booked(&lab);
    assert_eq!(books.len(), 1, "receipts only to the honest key: {books:?}");
    assert!(books.contains_key(&honest));
    assert!(
        lab.gateway.reputation(&cheat) < -7.9,
        "the addressed key is marked as misbehaving"
    );
}

/// Attack: a provider names an execution profile no verifier runs (its device with a
/// trailing space), so that an exact replay would never apply and any fraud would be
/// at most "suspected". Profiles are a closed set of names: the `Accept` is refused as
/// terms we did not ask for, before any token, and the honest provider serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_naming_a_profile_nobody_runs_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (lab, cheat, honest) = cheat_beside_honest(Adversary::ForeignProfile, &dir).await;
    let request = Lab::request("what runs this", 10, RoutingOptions::default());
    let (ids, _) = lab.expected(&request).unwrap();
    let done = lab.complete(request).await.unwrap();
    assert_eq!(done.token_ids, ids);
    assert_eq!(done.providers, vec![honest]);
    assert!(!booked(&lab).contains_key(&cheat));
    assert!(lab.gateway.reputation(&cheat) < -7.9);
}

/// Attack: a provider commits NaN logits (NaN compares false in every tolerance, so a
/// cross-profile check would pass it as honest). A fingerprint must be finite: its
/// first chunk is a bad chunk, nothing of it is relayed or paid, and the response
/// continues exactly on the honest provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_committing_nan_logits_is_cut_off_at_its_first_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let (lab, cheat, honest) = cheat_beside_honest(Adversary::NanLogits, &dir).await;
    let request = Lab::request("count for me please", 10, RoutingOptions::default());
    let (ids, text) = lab.expected(&request).unwrap();
    let done = lab.complete(request).await.unwrap();
    assert_eq!(done.token_ids, ids);
    assert_eq!(done.text, text);
    assert_eq!(done.providers, vec![cheat, honest]);
    assert_eq!(done.segments[0].completion_tokens, 0);
    assert!(!booked(&lab).contains_key(&cheat));
    assert!(lab.gateway.reputation(&cheat) < -7.9);
}

/// Attack: a provider drips its tokens, each just inside the stall timeout (here 2 s,
/// a token every 1.5 s), to hold the buyer and bill for as long as `max_tokens`
/// allows. Beyond one stall timeout of slack a segment must average 1 token/s: the
/// drip is cut off as stalled after a handful of tokens, and the response continues
/// exactly on the honest provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_drips_tokens_is_cut_off_at_the_rate_floor() {
    let lab = Lab::start(
        vec![adversary(50, Adversary::Drip(1500)), provider(100)],
        stall_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let (cheat, honest) = (lab.providers[0].node_id, lab.providers[1].node_id);
    let request = Lab::request("count slowly for me", 40, RoutingOptions::default());
    let (ids, _) = lab.expected(&request).unwrap();
    let started = std::time::Instant::now();
    let done = lab.complete(request).await.unwrap();
    assert_eq!(done.token_ids, ids, "every token once, exact");
    assert_eq!(done.providers, vec![cheat, honest]);
    let dripped = done.segments[0].completion_tokens;
    assert!((2..=6).contains(&dripped), "{dripped} tokens dripped");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

/// Attack: after three tokens a provider numbers its chunks one further than it sent
/// (billing a token it never delivered). The buyer stops at the gap, pays nothing more,
/// and the response continues exactly on the honest provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_skips_an_index_is_cut_off_at_the_gap() {
    let dir = tempfile::tempdir().unwrap();
    let (lab, cheat, honest) = cheat_beside_honest(Adversary::SkipIndex(3), &dir).await;
    let request = Lab::request("count for me please", 20, RoutingOptions::default());
    let (ids, text) = lab.expected(&request).unwrap();
    let done = lab.complete(request).await.unwrap();
    assert_eq!(done.token_ids, ids, "every token once, none invented");
    assert_eq!(done.text, text);
    assert_eq!(done.providers, vec![cheat, honest]);
    assert_eq!(done.segments[0].completion_tokens, 3);
    let books = booked(&lab);
    // No receipt was due before the gap (one goes out every 8 tokens).
    assert!(!books.contains_key(&cheat), "{books:?}");
    assert_eq!(books.get(&honest).map(|b| b.0), Some(17));
    assert!(
        lab.gateway.reputation(&cheat) < -7.9,
        "marked as misbehaving"
    );
}

/// Warm-ups are unbilled (SPEC §10): the next provider in line is warmed every 4
/// tokens, and no receipt for it reaches the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_warm_ups_are_not_billed() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = with_ledger(&dir);
    spec.defaults.warm_standby_every = 4;
    let lab = Lab::start(vec![slow(provider(100), 5), provider(200)], spec)
        .await
        .unwrap();
    let (serving, standby) = (lab.providers[0].node_id, lab.providers[1].node_id);
    let done = lab
        .complete(Lab::request(
            "warm the next one",
            32,
            RoutingOptions::default(),
        ))
        .await
        .unwrap();
    assert_eq!(done.providers, vec![serving]);
    let books = booked(&lab);
    assert_eq!(books.get(&serving).map(|b| b.0), Some(32));
    assert!(
        !books.contains_key(&standby),
        "a warm-up was billed: {books:?}"
    );
    assert_eq!(
        lab.ledger
            .as_ref()
            .unwrap()
            .spent_since(&lab.gateway.node_id(), 0)
            .unwrap(),
        done.cost.0
    );
}

/// Attack: a provider offers its own (cheaper) model under a catalog name. Its adverts
/// do not validate anywhere, so the name resolves only to the catalog's model and the
/// honest provider serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_name_cannot_be_hijacked() {
    let name = "smollm2-135m-instruct";
    let catalog_model = sharemesh_protocol::ModelDescriptor {
        id: sharemesh_protocol::catalog::catalog_id(name).unwrap(),
        ..sharemesh_engine::scripted::ScriptedEngine::model(name)
    };
    let mut honest = provider(100);
    honest.models = vec![catalog_model];
    let mut hijacker = provider(1);
    hijacker.models = vec![sharemesh_engine::scripted::ScriptedEngine::model(name)];
    hijacker.expect_advert = false;
    let lab = Lab::start(vec![hijacker, honest], GatewaySpec::default())
        .await
        .unwrap();
    let (hijacker, honest) = (lab.providers[0].node_id, lab.providers[1].node_id);
    for _ in 0..3 {
        let done = lab
            .complete(Lab::request_for(name, "hi", 4, RoutingOptions::default()))
            .await
            .unwrap();
        assert_eq!(done.providers, vec![honest]);
    }
    let in_book = {
        let book = lab.gateway_mesh.book.read().unwrap();
        book.get(&hijacker, sharemesh_mesh::clock::now_ms())
            .is_some()
    };
    assert!(!in_book, "the hijacker's advert was accepted");
    // Its model, addressed by its own id, is not offered by anyone either.
    let own = sharemesh_engine::scripted::ScriptedEngine::model(name).id;
    let err = lab
        .complete(Lab::request_for(
            &own.to_string(),
            "hi",
            4,
            RoutingOptions::default(),
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, RouteError::ModelNotFound { .. }), "{err:?}");
}

/// What every provider would refuse is refused by the gateway, with the reason, before
/// any provider work: a 400 naming the field, not retries ending in a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_provider_may_take_is_a_clear_400() {
    let lab = Lab::start(vec![provider(100)], GatewaySpec::default())
        .await
        .unwrap();
    let huge = "word ".repeat(200_000);
    let err = lab
        .complete(Lab::request(&huge, 5, RoutingOptions::default()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RouteError::Invalid { param, message }
            if param == "prompt" && message.contains("limit 524288")),
        "{err:?}"
    );
    assert_eq!(ApiError::from(err).status.as_u16(), 400);
    let served = sharemesh_engine::TokenEngine::active_jobs(&lab.providers[0].engine)
        + sharemesh_engine::TokenEngine::queue_depth(&lab.providers[0].engine);
    assert_eq!(served, 0, "no provider work");
}

/// Attack (`hijack-name`): a provider offers its own model under a catalog name. Beyond
/// its adverts being refused, the gateway holds the signer to what it signed: its
/// reputation drops as for any misbehaviour, so it is not tried even for its own id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_signs_a_hijacking_advert_is_penalised() {
    let mut hijacker = adversary(1, Adversary::HijackName);
    hijacker.expect_advert = false;
    let lab = Lab::start(vec![hijacker, provider(100)], GatewaySpec::default())
        .await
        .unwrap();
    let hijacker = lab.providers[0].node_id;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lab.gateway.reputation(&hijacker) > -7.9 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hijacker was never penalised"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let book = lab.gateway_mesh.book.read().unwrap();
    assert!(book.get(&hijacker, now_ms()).is_none());
}

/// Attack (`flood-adverts:N`): a peer floods the mesh with adverts under fresh keys,
/// each offering the lab model at the lowest price from nowhere. The gateway's book
/// stays within its bounds, the providers that served it keep their place, and a
/// request still reaches the honest provider after at most `unproven_ahead` failed
/// attempts on fakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_fake_providers_stays_bounded_and_buyers_are_still_served() {
    let limits = BookLimits {
        max_entries: 12,
        max_bytes: 24 << 10,
        ..lab_book()
    };
    let gateway = GatewaySpec {
        book: Some(limits),
        ..GatewaySpec::default()
    };
    let lab = Lab::start(vec![provider(100), provider(200)], gateway)
        .await
        .unwrap();
    let (honest, flooder) = (&lab.providers[0], &lab.providers[1]);
    let before = lab
        .complete(Lab::request("hi", 4, RoutingOptions::default()))
        .await
        .unwrap();
    assert_eq!(before.providers, vec![honest.node_id]);

    // The flooder's node publishes 40 fake adverts every 100 ms for 2 s: 800 keys.
    let advert = flooder.provider.advert();
    for _ in 0..20 {
        for envelope in sharemesh_provider::adversary::flood(&advert, 40, Duration::from_secs(60)) {
            flooder.mesh.publish_advert(&envelope).await.unwrap();
        }
        {
            let book = lab.gateway_mesh.book.read().unwrap();
            assert!(book.len() <= limits.max_entries, "{} adverts", book.len());
            assert!(book.bytes() <= limits.max_bytes, "{} bytes", book.bytes());
            assert!(
                book.get(&honest.node_id, now_ms()).is_some(),
                "the honest provider was evicted"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fakes = {
        let book = lab.gateway_mesh.book.read().unwrap();
        book.live(now_ms())
            .iter()
            .filter(|e| e.advert.addresses.is_empty())
            .count()
    };
    assert!(
        fakes >= 5,
        "the flood did reach the gateway ({fakes} fakes held)"
    );
    for _ in 0..3 {
        let request = Lab::request("still there?", 6, RoutingOptions::default());
        let (ids, _) = lab.expected(&request).unwrap();
        let done = tokio::time::timeout(Duration::from_secs(15), lab.complete(request))
            .await
            .expect("served within the quote round and two failed attempts")
            .unwrap();
        assert_eq!(done.token_ids, ids);
        assert_eq!(done.providers, vec![honest.node_id]);
        assert_eq!(done.cost, NanoUsd((3 + 6) * 100));
    }
}

/// A buyer that holds its share of a provider (`--max-jobs-per-buyer 1`) gets no more
/// there: its next request is refused with `BuyerLimit` and served by another provider.
/// A denied buyer (`--deny-buyer`) is never served by that provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_buyer_limits_and_deny_lists_hold() {
    let mut limited = slow(provider(50), 20);
    limited.policy.buyers.max_jobs_per_buyer = Some(1);
    let mut denying = provider(60);
    denying.policy.buyers.deny = [gateway_node_id()].into();
    let lab = Lab::start(
        vec![limited, denying, provider(100)],
        GatewaySpec::default(),
    )
    .await
    .unwrap();
    let (limited, denying, other) = (
        lab.providers[0].node_id,
        lab.providers[1].node_id,
        lab.providers[2].node_id,
    );
    // The buyer's one job on the limited provider, still running.
    let mut running = lab
        .gateway_buyer()
        .open_job(limited, "a long job", 200, Billing::Metered(None))
        .await
        .unwrap();
    assert!(matches!(running.next().await, Some(JobEvent::Accepted(_))));
    let done = lab
        .complete(Lab::request("hi", 4, RoutingOptions::default()))
        .await
        .unwrap();
    assert_eq!(
        done.providers,
        vec![other],
        "the limited provider refused the second job and the denying one every job"
    );
    // Asked directly, each says why.
    for (provider, reason) in [
        (limited, RejectReason::BuyerLimit),
        (denying, RejectReason::NotAllowed),
    ] {
        let mut refused = lab
            .gateway_buyer()
            .open_job(provider, "hi", 4, Billing::Metered(None))
            .await
            .unwrap();
        match refused.next().await {
            Some(JobEvent::Rejected(reject)) => assert_eq!(reject.reason, reason),
            other => panic!("expected a refusal ({reason:?}), got {other:?}"),
        }
    }
    drop(running);
    // Its running job over, the buyer is served by the limited provider again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = lab
            .gateway_buyer()
            .open_job(limited, "hi", 4, Billing::Metered(None))
            .await
            .unwrap();
        if matches!(again.next().await, Some(JobEvent::Accepted(_))) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was not released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Attack (`forge-header`): a provider answers the gateway's header request with a
/// well-formed vocabulary that is not its model's (one that would count prompts its
/// way). The header does not make the model id, so the gateway keeps nothing from it
/// and holds the provider to the prompt's token bound; the request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_model_header_is_not_taken() {
    let lab = Lab::start(
        vec![adversary(50, Adversary::ForgeHeader), provider(100)],
        GatewaySpec::default(),
    )
    .await
    .unwrap();
    let request = Lab::request("a forged vocabulary", 6, RoutingOptions::default());
    let model = sharemesh_engine::scripted::ScriptedEngine::model(sharemesh_lab::LAB_MODEL).id;
    let (ids, _) = lab.expected(&request).unwrap();
    let done = lab.complete(request).await.unwrap();
    assert_eq!(done.token_ids, ids);
    assert!(
        !lab.gateway.counts_with(&model),
        "the gateway took a header that is not the model's"
    );
}

/// Attack (`slow-header:N`): a provider holds the gateway's header request open. No
/// request waits for it longer than the gateway's count wait; it is served under the
/// token bound meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_model_header_delays_no_request_beyond_the_count_wait() {
    let gateway = GatewaySpec {
        defaults: sharemesh_gateway::plan::RoutingDefaults {
            count_wait: Duration::from_millis(300),
            ..Default::default()
        },
        ..GatewaySpec::default()
    };
    let lab = Lab::start(vec![adversary(50, Adversary::SlowHeader(60))], gateway)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let done = tokio::time::timeout(
        Duration::from_secs(10),
        lab.complete(Lab::request("hi", 4, RoutingOptions::default())),
    )
    .await
    .expect("the request waited on the slow header")
    .unwrap();
    assert_eq!(done.token_ids.len(), 4);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

/// Attack (`overbill-hold-header:K`): a cheap provider claims a thousand times the
/// prompt's size and holds every header request, so the gateway cannot count the prompt
/// itself. An over-bound count is waited on before it is judged (an honest long
/// template exceeds the bound too): the request waits for the header at most the
/// recount wait (10 s) once, then holds the claim to the bound — the cheat is marked
/// misbehaving, paid nothing, and the honest provider serves; the next request, with
/// the cheat ranked down, waits for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overbiller_holding_its_header_delays_a_request_at_most_once_and_gets_nothing() {
    let gateway = GatewaySpec {
        defaults: sharemesh_gateway::plan::RoutingDefaults {
            count_wait: Duration::from_millis(300),
            ..Default::default()
        },
        ..GatewaySpec::default()
    };
    let lab = Lab::start(
        vec![
            adversary(50, Adversary::OverbillHoldingHeader(1000)),
            provider(100),
        ],
        gateway,
    )
    .await
    .unwrap();
    let (cheat, honest) = (lab.providers[0].node_id, lab.providers[1].node_id);
    for (round, limit) in [(0, Duration::from_secs(15)), (1, Duration::from_secs(5))] {
        let started = std::time::Instant::now();
        let request = Lab::request(
            &format!("what does this cost {round}"),
            4,
            RoutingOptions::default(),
        );
        let done = lab.complete(request).await.unwrap();
        assert_eq!(done.providers, vec![honest], "round {round}");
        assert!(
            started.elapsed() < limit,
            "round {round} took {:?}",
            started.elapsed()
        );
    }
    assert!(
        lab.gateway.reputation(&cheat) < -7.9,
        "marked as misbehaving"
    );
}

/// Attack (`falsely-full`): a cheap provider claims to be full to every quote and job
/// (`OverCapacity`) while its adverts offer the lowest price, to make requests wait in
/// the gateway's waiting room or fail. A refusal for capacity makes a request wait only
/// when nobody quoted it: beside an honest provider the request is served at once;
/// alone, the liar makes it wait no longer than the gateway's bound and then get 503
/// `providers_busy` — what a provider that really is full gets it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_claiming_to_be_full_delays_nobody_beside_an_honest_one() {
    let lab = Lab::start(
        vec![adversary(50, Adversary::FalselyFull), provider(100)],
        GatewaySpec::default(),
    )
    .await
    .unwrap();
    let honest = lab.providers[1].node_id;
    let started = std::time::Instant::now();
    let done = lab
        .complete(Lab::request("hi", 4, RoutingOptions::default()))
        .await
        .unwrap();
    assert_eq!(done.providers, vec![honest]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    let bounded = GatewaySpec {
        defaults: sharemesh_gateway::plan::RoutingDefaults {
            waiting: sharemesh_gateway::waiting::WaitPolicy {
                max_wait: Duration::from_secs(1),
                ..Default::default()
            },
            ..Default::default()
        },
        ..GatewaySpec::default()
    };
    let alone = Lab::start(vec![adversary(50, Adversary::FalselyFull)], bounded)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let err = alone
        .complete(Lab::request("hi", 4, RoutingOptions::default()))
        .await
        .unwrap_err();
    assert!(matches!(err, RouteError::Busy { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}
