#![allow(clippy::unwrap_used)]
//! The market and the network on the fast seam: real providers, a real gateway and
//! real swarms on the memory transport in one process, with scripted engines (no
//! model; the `sharemesh-lab` crate). Each test takes well under a few seconds. What needs
//! the real model (exact resume of real text, the demo) stays in the other test files.
//! What a modified peer tries is in `attacks.rs`.

mod lab_support;

use std::time::Duration;

use lab_support::*;
use sharemesh_gateway::budget::Budget;
use sharemesh_gateway::plan::RoutingDefaults;
use sharemesh_gateway::route::RouteError;
use sharemesh_gateway::route::RoutingOptions;
use sharemesh_lab::{Completion, GatewaySpec, Lab, ProviderSpec};
use sharemesh_protocol::{FinishReason, NanoUsd, NodeId, Tier};
use sharemesh_provider::adversary::Adversary;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_served_by_the_cheapest_and_billed_from_its_receipts() {
    let ledger = tempfile::tempdir().unwrap();
    let lab = Lab::start(
        vec![provider(300), provider(100), provider(200)],
        GatewaySpec {
            ledger_dir: Some(ledger.path().to_owned()),
            ..GatewaySpec::default()
        },
    )
    .await
    .unwrap();
    let request = Lab::request("say something short", 20, RoutingOptions::default());
    let (ids, text) = lab.expected(&request).unwrap();
    let done = lab.complete(request).await.unwrap();
    assert_eq!(done.token_ids, ids);
    assert_eq!(done.text, text);
    assert_eq!(done.finish, FinishReason::Length);
    let ids: Vec<_> = lab.providers.iter().map(|p| p.node_id).collect();
    assert_eq!(done.providers, vec![ids[1]], "cheapest of {ids:?}");
    // Three words and a start token: 4 prompt tokens, 20 completion tokens, 100 each.
    assert_eq!(done.segments.len(), 1);
    assert_eq!(done.segments[0].prompt_tokens, 4);
    assert_eq!(done.segments[0].completion_tokens, 20);
    assert_eq!(done.cost, NanoUsd(24 * 100));
    let booked = lab
        .ledger
        .as_ref()
        .unwrap()
        .spent_since(&lab.gateway.node_id(), 0)
        .unwrap();
    assert_eq!(booked, 24 * 100, "the ledger holds what was billed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_serving_provider_mid_stream_loses_no_token() {
    let lab = Lab::start(
        vec![slow(provider(100), 5), slow(provider(150), 5)],
        GatewaySpec::default(),
    )
    .await
    .unwrap();
    let request = Lab::request("tell me a long story", 40, RoutingOptions::default());
    let (ids, text) = lab.expected(&request).unwrap();
    let done = lab
        .complete_with(request, |delivered, serving| {
            let lab = &lab;
            async move {
                if delivered == 10 {
                    lab.provider(serving).unwrap().kill().await;
                }
            }
        })
        .await
        .unwrap();
    assert_eq!(done.token_ids, ids, "every token once, in order");
    assert_eq!(done.text, text);
    assert_eq!(done.switches, 1);
    assert_eq!(
        done.providers,
        vec![lab.providers[0].node_id, lab.providers[1].node_id]
    );
    // Each provider billed what it served: the first at least the 10 tokens the client
    // saw before the kill, the second the rest; the prompt once per segment.
    let served: u64 = done.segments.iter().map(|s| s.completion_tokens).sum();
    assert_eq!(served, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalling_provider_is_replaced_and_marked_down() {
    let lab = Lab::start(
        vec![adversary(50, Adversary::StallAfter(5)), provider(100)],
        stall_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let request = Lab::request("count to twenty", 20, RoutingOptions::default());
    let (ids, text) = lab.expected(&request).unwrap();
    let done = lab.complete(request).await.unwrap();
    assert_eq!(done.token_ids, ids);
    assert_eq!(done.text, text);
    assert_eq!(done.switches, 1);
    assert_eq!(done.segments[0].completion_tokens, 5, "the staller's share");
    let staller = lab.providers[0].node_id;
    assert!(
        lab.gateway.reputation(&staller) < lab.gateway.reputation(&lab.providers[1].node_id),
        "a stall lowers the staller's standing"
    );
    // The job log shows the route: the candidates by score, then each hop and why it
    // ended, with what it was paid.
    let job = &lab.gateway.jobs().list(1, None)[0];
    assert_eq!(job.status, "completed");
    assert_eq!(job.candidates[0].provider, staller.to_string());
    assert!(job
        .candidates
        .windows(2)
        .all(|pair| pair[0].score <= pair[1].score));
    let hops: Vec<(&str, u64)> = job
        .segments
        .iter()
        .map(|s| (s.ended.as_str(), s.completion_tokens))
        .collect();
    assert_eq!(hops.len(), 2, "{hops:?}");
    assert!(
        hops[0].0.starts_with("failover: the provider went silent"),
        "{hops:?}"
    );
    assert_eq!((hops[0].1, hops[1]), (5, ("completed", 15)));
    assert_eq!(
        job.segments[1].provider,
        lab.providers[1].node_id.to_string()
    );
    assert_eq!(job.cost_nano_usd, done.cost.0);
    assert_eq!(
        job.segments.iter().map(|s| s.amount_nano_usd).sum::<u64>(),
        done.cost.0
    );
    assert!(job.segments[1].first_token_ms.unwrap() >= job.segments[1].started_ms);
}

/// Gold's hedged start: the same job starts on the two best providers and the first to
/// answer serves it. The cheaper one (ranked first) never sends a token; the stall
/// timeout is two minutes, so without the hedge the request would wait that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_gold_request_is_served_by_the_first_to_answer_and_only_it_is_billed() {
    let gold = |price| {
        let mut spec = provider(price);
        spec.policy.tiers = vec![Tier::Reserved, Tier::OnDemand];
        spec
    };
    let mut silent = gold(50);
    silent.policy.adversary = Some(Adversary::StallAfter(0));
    let lab = Lab::start(
        vec![silent, gold(100)],
        stall_timeout(Duration::from_secs(120)),
    )
    .await
    .unwrap();
    let routing = RoutingOptions {
        tier: Some(Tier::Reserved),
        hedge: Some(true),
        ..RoutingOptions::default()
    };
    let request = Lab::request("gold work", 12, routing);
    let (ids, _) = lab.expected(&request).unwrap();
    let done = tokio::time::timeout(Duration::from_secs(30), lab.complete(request))
        .await
        .expect("the silent provider was waited for")
        .unwrap();
    assert_eq!(done.token_ids, ids);
    assert_eq!(done.providers, vec![lab.providers[1].node_id]);
    assert_eq!(done.segments.len(), 1, "the cancelled twin is not billed");
    assert_eq!(done.cost, NanoUsd(100 * (3 + 12)));
    let job = &lab.gateway.jobs().list(1, None)[0];
    let silent = lab.providers[0].node_id.to_string();
    assert!(
        job.segments
            .iter()
            .any(|s| s.provider == silent && s.ended == "hedge lost" && s.amount_nano_usd == 0),
        "{job:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daily_budget_refuses_what_could_exceed_it() {
    let ledger = tempfile::tempdir().unwrap();
    let lab = Lab::start(
        vec![provider(100)],
        GatewaySpec {
            budget: Budget {
                daily: Some(NanoUsd(2_000)),
                monthly: None,
            },
            ledger_dir: Some(ledger.path().to_owned()),
            ..GatewaySpec::default()
        },
    )
    .await
    .unwrap();
    // Worst case 100 × (19 prompt bytes + 8 + 20 tokens) = 4,700 nano-USD > 2,000.
    let refused = lab
        .complete(Lab::request(
            "a prompt too costly",
            20,
            RoutingOptions::default(),
        ))
        .await
        .unwrap_err();
    assert!(matches!(refused, RouteError::OverBudget(_)), "{refused:?}");
    // Worst case 100 × (2 + 8 + 5) = 1,500 fits; it costs 100 × (2 + 5) = 700.
    let done = lab
        .complete(Lab::request("hi", 5, RoutingOptions::default()))
        .await
        .unwrap();
    assert_eq!(done.cost, NanoUsd(700));
    // 700 spent + 1,500 worst case > 2,000.
    let refused = lab
        .complete(Lab::request("hi", 5, RoutingOptions::default()))
        .await
        .unwrap_err();
    assert!(matches!(refused, RouteError::OverBudget(_)), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_provider_within_the_price_ceiling_is_a_clear_503() {
    let lab = Lab::start(vec![provider(500)], GatewaySpec::default())
        .await
        .unwrap();
    let routing = RoutingOptions {
        max_price_per_token: Some(NanoUsd(100)),
        ..RoutingOptions::default()
    };
    let refused = lab
        .complete(Lab::request("hi", 5, routing))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, RouteError::NoProvider(why) if why.contains("price ceiling")),
        "{refused:?}"
    );
    // The API edge answers it as a 503 the SDKs retry.
    let answered = sharemesh_gateway::api::error::ApiError::from(refused);
    assert_eq!(answered.status.as_u16(), 503);
    assert_eq!(answered.code, Some("no_provider_available"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bronze_job_preempted_by_gold_work_finishes_elsewhere() {
    // The only gold provider, and the cheapest bronze one; the other serves bronze only.
    let tiers = |price, tiers: Vec<Tier>| {
        let mut spec = slow(provider(price), 10);
        spec.policy.tiers = tiers;
        spec
    };
    let lab = Lab::start(
        vec![
            tiers(50, vec![Tier::Interruptible, Tier::Reserved]),
            tiers(1_000, vec![Tier::Interruptible]),
        ],
        GatewaySpec::default(),
    )
    .await
    .unwrap();
    let cheap = lab.providers[0].node_id;
    let bronze = Lab::request(
        "a long interruptible job",
        60,
        RoutingOptions {
            tier: Some(Tier::Interruptible),
            ..RoutingOptions::default()
        },
    );
    let (ids, text) = lab.expected(&bronze).unwrap();
    let gold_started = tokio::sync::Notify::new();
    let bronze_run = lab.complete_with(bronze, |delivered, serving| {
        let gold_started = &gold_started;
        async move {
            if delivered == 10 && serving == cheap {
                gold_started.notify_one();
            }
        }
    });
    let gold_run = async {
        gold_started.notified().await;
        // Gold goes to the cheap provider, which preempts the bronze job for it.
        let gold = Lab::request(
            "gold work",
            5,
            RoutingOptions {
                tier: Some(Tier::Reserved),
                ..RoutingOptions::default()
            },
        );
        lab.complete(gold).await
    };
    let (bronze_done, gold_done) = tokio::join!(bronze_run, gold_run);
    let gold_done = gold_done.unwrap();
    assert_eq!(gold_done.providers, vec![cheap]);
    let bronze_done = bronze_done.unwrap();
    assert_eq!(bronze_done.token_ids, ids);
    assert_eq!(bronze_done.text, text);
    assert_eq!(bronze_done.providers[0], cheap);
    assert!(bronze_done.switches >= 1, "resumed after the preemption");
}

/// The reverse auction's quote round: the cheap provider is busy with a long job (its
/// advert still says it has a free slot), so its quote names a long queue wait and the
/// next request goes to the dearer, idle provider. With `quote_k = 0` (adverts alone)
/// the cheap provider wins and the request waits in its queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quoted_queue_wait_moves_work_to_a_free_provider() {
    for quote_k in [4, 0] {
        let busy_cheap = |price| {
            let mut spec = slow(provider(price), 20);
            spec.policy.max_concurrent = 2;
            spec
        };
        let run = a_short_job_behind_a_long_one([busy_cheap(100), busy_cheap(130)], quote_k).await;
        assert_eq!(run.long.providers, vec![run.cheap]);
        let expected = if quote_k > 0 { run.dear } else { run.cheap };
        assert_eq!(run.short.providers, vec![expected], "quote_k = {quote_k}");
    }
}

/// The quote comes from the scheduler: a batching provider with a free place in its
/// batch and KV blocks to spare starts a job at once, so while it runs a long job it
/// still quotes no wait and the cheaper provider gets the next request too (the same
/// set-up without batching sends it to the dearer, idle provider: the test above).
/// Its adverts carry the batch's size and KV blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batching_provider_with_room_quotes_no_wait_while_busy() {
    let batching = |price| {
        let mut spec = slow(provider(price), 20);
        spec.policy.max_concurrent = 4;
        spec.script.slots = 4;
        spec.script.kv_blocks = Some(64);
        spec
    };
    let run = a_short_job_behind_a_long_one([batching(100), batching(130)], 4).await;
    assert_eq!(run.long.providers, vec![run.cheap]);
    assert_eq!(
        run.short.providers,
        vec![run.cheap],
        "a free batch place means no wait"
    );
    let load = run.cheap_load;
    assert_eq!((load.max_batch, load.kv_blocks_total), (4, 64));
    // The long job's 100 tokens hold 7 blocks of 16 positions.
    assert_eq!(load.kv_blocks_available, 64 - 7);
}

/// What [`a_short_job_behind_a_long_one`] saw.
struct LongThenShort {
    cheap: NodeId,
    dear: NodeId,
    long: Completion,
    short: Completion,
    /// The cheap provider's load as it advertised it when the short job was asked.
    cheap_load: sharemesh_protocol::Load,
}

/// Runs a 100-token job (it goes to the cheap provider), and once it has started and
/// the cheap provider has advertised since, an 8-token job, with `quote_k` quotes.
async fn a_short_job_behind_a_long_one(
    [cheap, dear]: [ProviderSpec; 2],
    quote_k: usize,
) -> LongThenShort {
    let lab = Lab::start(
        vec![cheap, dear],
        GatewaySpec {
            defaults: RoutingDefaults {
                quote_k,
                stall_timeout: Duration::from_secs(120),
                ..RoutingDefaults::default()
            },
            ..GatewaySpec::default()
        },
    )
    .await
    .unwrap();
    let (cheap, dear) = (lab.providers[0].node_id, lab.providers[1].node_id);
    let long_started = tokio::sync::Notify::new();
    let long = lab.complete_with(
        Lab::request("a long job", 100, RoutingOptions::default()),
        |delivered, _| {
            let long_started = &long_started;
            async move {
                if delivered == 1 {
                    long_started.notify_one();
                }
            }
        },
    );
    let short = async {
        long_started.notified().await;
        // Let the cheap provider's next advert show the running job.
        lab.wait_for_adverts(&[cheap], Duration::from_secs(5))
            .await
            .unwrap();
        let load = lab.provider(cheap).unwrap().provider.advert().load;
        let done = lab
            .complete(Lab::request("hi", 8, RoutingOptions::default()))
            .await;
        (done, load)
    };
    let (long, (short, cheap_load)) = tokio::join!(long, short);
    LongThenShort {
        cheap,
        dear,
        long: long.unwrap(),
        short: short.unwrap(),
        cheap_load,
    }
}

/// A client that leaves mid-stream ends its request, but the segment in flight is still
/// what the gateway saw: logged with what it delivered (`the client went away`) and
/// considered for verification like any other (#41: it was neither). The provider is
/// not marked down for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_the_client_left_is_logged_and_verified() {
    let spec = GatewaySpec {
        verify: true,
        ..GatewaySpec::default()
    };
    let lab = Lab::start(vec![slow(provider(100), 20)], spec)
        .await
        .unwrap();
    let request = Lab::request("a long story", 200, RoutingOptions::default());
    let mut events = lab.gateway.run(request, None);
    let mut tokens = 0;
    while tokens < 6 {
        match events.recv().await.unwrap() {
            sharemesh_gateway::dispatch::DispatchEvent::Token { .. } => tokens += 1,
            sharemesh_gateway::dispatch::DispatchEvent::Failed(err) => panic!("{err:?}"),
            _ => {}
        }
    }
    drop(events);
    let log = lab.gateway.jobs();
    eventually(Duration::from_secs(10), "the segment logged", || {
        log.list(1, None)
            .first()
            .is_some_and(|job| !job.segments.is_empty())
    })
    .await;
    let job = &log.list(1, None)[0];
    assert_eq!(job.segments[0].ended, "the client went away");
    assert!(
        job.segments[0].completion_tokens >= 6,
        "{:?}",
        job.segments[0]
    );
    // A newcomer's every job is verified: the partial transcript is replayed.
    let trust = lab.gateway.trust();
    eventually(Duration::from_secs(10), "the segment verified", || {
        trust.auditor.stats().verified_ok == 1
    })
    .await;
    let provider = lab.providers[0].node_id;
    assert!(!trust.auditor.is_suspected(&provider));
}
