#![allow(clippy::unwrap_used)]
//! No free work: what a buyer that does not pay can take from a provider, on the fast
//! seam (real providers, a real gateway and real swarms in one process, scripted
//! engines): the credit window holds a job, the unpaid-work rules hold a key and an
//! origin (`provider/src/unpaid.rs`), and an honest buyer that leaves mid-stream pays
//! for what it received, so the rules never catch it.

mod lab_support;

use std::time::Duration;

use lab_support::*;
use sharemesh_engine::TokenEngine;
use sharemesh_gateway::buyer::{Billing, JobEvent, SegmentError};
use sharemesh_gateway::route::RoutingOptions;
use sharemesh_lab::{GatewaySpec, Lab, LabBuyer};
use sharemesh_protocol::{NodeId, RejectReason};

/// A buyer that never pays cannot hold a provider: once its receipts lag the credit
/// window for the credit timeout, its job is cancelled and the slot freed, and another
/// buyer's request (queued behind it on a one-slot engine) is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_that_never_pays_cannot_freeze_a_provider() {
    let mut spec = slow(provider(100), 5);
    spec.policy.credit_window_tokens = 4;
    spec.policy.credit_timeout = Duration::from_millis(500);
    spec.script.slots = 1;
    let lab = Lab::start(vec![spec], GatewaySpec::default())
        .await
        .unwrap();
    let provider = lab.providers[0].node_id;
    let mut freeloader = lab
        .gateway_buyer()
        .open_job(provider, "a long story for free", 500, Billing::Unbilled)
        .await
        .unwrap();
    let mut tokens = 0;
    while tokens < 4 {
        if let Some(JobEvent::Token(_)) = freeloader.next().await {
            tokens += 1;
        }
    }
    let honest = tokio::time::timeout(
        Duration::from_secs(5),
        lab.complete(Lab::request("hi", 8, RoutingOptions::default())),
    );
    let freeloader_end = async {
        let mut more = 0;
        loop {
            match freeloader.next().await {
                Some(JobEvent::Token(_)) => more += 1,
                Some(JobEvent::Failed(why)) => return (more, Some(why)),
                None => return (more, None),
                Some(_) => {}
            }
        }
    };
    let (honest, (more, why)) = tokio::join!(honest, freeloader_end);
    let honest = honest
        .expect("the honest buyer waited behind the freeloader")
        .unwrap();
    assert_eq!(honest.providers, vec![provider]);
    assert_eq!(more, 0, "nothing beyond the credit window without receipts");
    assert!(
        matches!(why, Some(SegmentError::StreamBroke(_))),
        "the provider closed the freeloader's stream: {why:?}"
    );
}

/// How one job of a buyer that never pays ended.
#[derive(Debug)]
enum Taken {
    Refused(RejectReason, String),
    Tokens(u64),
}

/// Runs one job for a buyer that never pays: reads every token it is sent and holds the
/// stream (`hold`) until the provider gives up on it, or leaves after 15.
async fn take_for_free(buyer: &LabBuyer, provider: NodeId, hold: bool) -> Taken {
    let mut job = buyer
        .open_job(provider, "a long story for free", 500, Billing::Unbilled)
        .await
        .unwrap();
    let mut tokens = 0;
    loop {
        match job.next().await {
            Some(JobEvent::Rejected(reject)) => {
                return Taken::Refused(reject.reason, reject.detail)
            }
            Some(JobEvent::Token(chunk)) => {
                tokens += chunk.token_ids.len() as u64;
                if !hold && tokens >= 15 {
                    return Taken::Tokens(tokens);
                }
            }
            Some(JobEvent::Failed(_)) | None => return Taken::Tokens(tokens),
            Some(_) => {}
        }
    }
}

/// A fresh buyer key on the lab's mesh, once it is connected to `provider`.
async fn connected_buyer(lab: &Lab, provider: NodeId) -> LabBuyer {
    let peer = provider.peer_id().unwrap();
    let buyer = lab.add_buyer().await.unwrap();
    eventually(Duration::from_secs(10), "the buyer connects", || {
        buyer.mesh.is_connected(&peer)
    })
    .await;
    buyer
}

/// Attack (`free-rider`): a buyer that takes tokens and never pays, making a fresh key
/// whenever one is refused, holding some jobs until the credit timeout and leaving
/// others inside the window. Each key is refused once it left 32 tokens unpaid (each
/// job's first token aside); once the keys from its origin (the lab is one host) left
/// 128 beyond what they paid for, every new key from there is refused, while a buyer
/// there whose payments cover its credit window is still served. Before these rules it
/// took a newcomer's window (16 tokens) per job, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_rider_with_fresh_keys_takes_a_bounded_number_of_tokens() {
    let mut spec = provider(100);
    spec.policy.credit_timeout = Duration::from_millis(300);
    let lab = Lab::start(vec![spec], GatewaySpec::default())
        .await
        .unwrap();
    let provider = lab.providers[0].node_id;
    // The lab's gateway pays for a long job first: a paying buyer from the same origin,
    // whose payments (an eighth of 600 tokens) cover its credit window of 64.
    let paid = lab
        .complete(Lab::request("hi", 600, RoutingOptions::default()))
        .await
        .unwrap();
    assert_eq!(paid.token_ids.len(), 600);
    let (mut free, mut key_refusals, mut origin_refused) = (0u64, 0, false);
    for key in 0..20 {
        let buyer = connected_buyer(&lab, provider).await;
        for job in 0..4 {
            match take_for_free(&buyer, provider, (key + job) % 2 == 0).await {
                Taken::Tokens(tokens) => {
                    free += tokens;
                    // Sequential jobs: the provider books each end before the next
                    // starts (concurrent ones are bounded by the newcomer job limits).
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Taken::Refused(reason, why) => {
                    assert_eq!(reason, RejectReason::NotAllowed, "{why}");
                    if job == 0 {
                        assert!(why.contains("buyers from memory"), "{why}");
                        origin_refused = true;
                    } else {
                        assert!(why.contains("tokens unpaid here"), "{why}");
                        key_refusals += 1;
                    }
                    break;
                }
            }
        }
        if origin_refused {
            break;
        }
    }
    eprintln!("free rider took {free} tokens; {key_refusals} keys refused, then the origin");
    assert!(origin_refused, "fresh keys kept being served");
    assert!(
        key_refusals >= 3,
        "each key was refused after its allowance"
    );
    // The origin's newcomers stop at 128 unpaid, counted less each job's first token
    // (nine jobs of at most a newcomer's window of 16).
    assert!(free <= 9 * 16, "took {free} tokens unpaid");
    // A buyer whose payments cover its window is still served from the same origin.
    let done = lab
        .complete(Lab::request("hi", 8, RoutingOptions::default()))
        .await
        .unwrap();
    assert_eq!(done.providers, vec![provider]);
}

/// Attack (`free-prefill`): a buyer that never pays asks for one token at a time
/// behind a long prompt — a classifier's workload — or closes the stream right after
/// `Accept`. No job leaves a completion token unpaid (a job's first token is the
/// provider's bid), so before unpaid prefill was counted every such job was served: the
/// provider prefilled 8,001 tokens a job for nothing, for ever. Now its key is refused
/// once the prompts prefilled unpaid reach its allowance (65,536 tokens here, the floor),
/// and a buyer that pays is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_that_never_pays_for_its_prompts_is_refused_prefill() {
    let lab = Lab::start(vec![provider(100)], GatewaySpec::default())
        .await
        .unwrap();
    let provider = lab.providers[0].node_id;
    let buyer = connected_buyer(&lab, provider).await;
    let prompt = "word ".repeat(8_000);
    let (mut served, mut refused) = (0u32, None);
    for job in 0..20 {
        let mut stream = buyer
            .open_job(provider, &prompt, 1, Billing::Unbilled)
            .await
            .unwrap();
        let leave_at_accept = job % 2 == 1;
        loop {
            match stream.next().await {
                Some(JobEvent::Rejected(reject)) => {
                    refused = Some((reject.reason, reject.detail));
                    break;
                }
                Some(JobEvent::Accepted(_)) if leave_at_accept => break,
                Some(JobEvent::Finished { .. } | JobEvent::Failed(_)) | None => break,
                Some(_) => {}
            }
        }
        if refused.is_some() {
            break;
        }
        served += 1;
        drop(stream);
        // Sequential jobs: the provider books each end before the next starts.
        eventually(Duration::from_secs(10), "the job ends", || {
            lab.providers[0].engine.active_jobs() == 0
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (reason, why) = refused.expect("every job was prefilled for nothing");
    eprintln!("served {served} one-token jobs of 8,001 prompt tokens, then: {why}");
    assert_eq!(reason, RejectReason::NotAllowed, "{why}");
    assert!(why.contains("prompt tokens prefilled here unpaid"), "{why}");
    // 8,001 tokens a job: the ninth reaches the 65,536-token floor (a tenth when the
    // ninth's end was booked after the next job was asked for).
    assert!((9..=10).contains(&served), "served {served}: {why}");
    let done = lab
        .complete(Lab::request("hi", 8, RoutingOptions::default()))
        .await
        .unwrap();
    assert_eq!(done.providers, vec![provider], "a paying buyer is served");
}

/// An honest buyer whose client leaves mid-stream (or that drops a hedge) pays for every
/// token it received: the provider counts it as a paying buyer (the full credit window)
/// and its few stray tokens stay inside its allowance, round after round. Without the
/// receipt a dropped stream sends, each round would leave its tokens unpaid, the buyer
/// would stay a newcomer and be refused by the fourth round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_that_leaves_mid_stream_pays_for_what_it_received() {
    let lab = Lab::start(vec![slow(provider(100), 20)], GatewaySpec::default())
        .await
        .unwrap();
    let provider = lab.providers[0].node_id;
    let mut windows = Vec::new();
    for _ in 0..6 {
        let mut job = lab
            .gateway_buyer()
            .open_job(provider, "a long story", 200, Billing::Metered(None))
            .await
            .unwrap();
        let mut tokens = 0;
        while tokens < 6 {
            match job.next().await {
                Some(JobEvent::Accepted(accept)) => windows.push(accept.credit_window_tokens),
                Some(JobEvent::Token(_)) => tokens += 1,
                Some(JobEvent::Receipted(_)) => {}
                other => panic!("round {}: {other:?}", windows.len()),
            }
        }
        drop(job);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(windows.len(), 6, "served every round");
    assert_eq!(windows[0], 16, "a newcomer's window first");
    assert_eq!(windows[5], 64, "a paying buyer's window: {windows:?}");
}

/// Attack: a crowd of keys that each pay for one tiny job (so none is a newcomer any
/// more), then ask for a long prompt and leave at `Accept`, before the first receipt
/// pays it. Judged by its own past, each key had a whole unpaid-prefill floor (65,536
/// tokens here) and the crowd was never refused; now the keys of one origin (the lab is
/// one host) share four floors beyond what their payments earned, and once they are
/// used a key from there is refused unless its payments cover what it asks for (a fresh
/// key's first job, or a paid-once key's long prompt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_each_paid_once_share_their_origin_s_free_prefill() {
    let lab = Lab::start(vec![provider(100)], GatewaySpec::default())
        .await
        .unwrap();
    let provider = lab.providers[0].node_id;
    let prompt = "word ".repeat(16_000);
    let (mut keys, mut refused) = (0u32, None);
    while keys < 40 && refused.is_none() {
        let buyer = connected_buyer(&lab, provider).await;
        keys += 1;
        // One tiny paid job (its receipt makes the key a paying buyer here), then the
        // long prompt, left at `Accept`.
        for (prompt, billing) in [
            ("hi", Billing::Metered(None)),
            (&prompt[..], Billing::Unbilled),
        ] {
            let paying = matches!(billing, Billing::Metered(_));
            let mut job = buyer.open_job(provider, prompt, 4, billing).await.unwrap();
            loop {
                match job.next().await {
                    Some(JobEvent::Rejected(reject)) => {
                        refused = Some((reject.reason, reject.detail));
                        break;
                    }
                    Some(JobEvent::Accepted(_)) if !paying => break,
                    Some(JobEvent::Finished { .. } | JobEvent::Failed(_)) | None => break,
                    Some(_) => {}
                }
            }
            drop(job);
            // Sequential jobs: the provider books each end before the next starts.
            eventually(Duration::from_secs(10), "the job ends", || {
                lab.providers[0].engine.active_jobs() == 0
            })
            .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            if refused.is_some() {
                break;
            }
        }
    }
    let (reason, why) = refused.expect("the crowd was never refused");
    eprintln!("{keys} keys, then: {why}");
    assert_eq!(reason, RejectReason::NotAllowed, "{why}");
    assert!(why.contains("buyers from memory had"), "{why}");
    // 16,001 prompt tokens a job against four floors of 65,536: about the 17th key
    // reaches them.
    assert!((15..=19).contains(&keys), "{keys} keys: {why}");
}
