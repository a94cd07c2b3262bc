#![allow(clippy::unwrap_used)]
//! A provider node as `ProviderNode::builder` builds it for the CLI and the lab, on real
//! libp2p swarms (the memory transport) with a scripted engine (this is about the
//! node's wiring, not inference): it serves a buyer's job and books it, records its
//! uptime, and says which task ended when its mesh stops.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use libp2p::Multiaddr;
use sharemesh_engine::scripted::{Script, ScriptedEngine};
use sharemesh_gateway::buyer::{start_job, Billing, JobEvent, StreamTerms};
use sharemesh_ledger::Ledger;
use sharemesh_mesh::link::LinkProfile;
use sharemesh_mesh::{MeshConfig, MeshHandle, MeshTransport};
use sharemesh_protocol::{
    Digest, FinishReason, JobId, JobRequest, Keypair, NanoUsd, Prompt, Sampling, Tier,
};
use sharemesh_provider::serving::ServingStopped;
use sharemesh_provider::{ProviderNode, ProviderPolicy};

const MODEL: &str = "node-test-model";

/// Memory-transport ports unique to this test binary's process.
static NEXT_PORT: AtomicU64 = AtomicU64::new(0);

async fn mesh(seed: u8, bootstrap: Vec<Multiaddr>, kad_server: bool) -> MeshHandle {
    let port = 70_000_000 + NEXT_PORT.fetch_add(1, Ordering::SeqCst);
    let config = MeshConfig {
        listen: vec![format!("/memory/{port}").parse().unwrap()],
        bootstrap,
        kad_server,
        heartbeat: Duration::from_millis(100),
        transport: MeshTransport::Memory {
            link: Arc::new(|_: &Multiaddr| LinkProfile::default()),
            counters: Arc::default(),
        },
        ..MeshConfig::default()
    };
    let handle = sharemesh_mesh::spawn(key(seed).secret(), config)
        .await
        .unwrap();
    while handle.listen_addrs().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle
}

fn key(seed: u8) -> Keypair {
    Keypair::from_secret([seed; 32])
}

fn engine() -> Arc<ScriptedEngine> {
    Arc::new(ScriptedEngine::new(
        vec![ScriptedEngine::model(MODEL)],
        Script::default(),
    ))
}

/// A provider node built as the CLI builds one: with a ledger, its uptime beating fast.
async fn provider_node(ledger: Arc<Ledger>) -> (ProviderNode, MeshHandle) {
    let mesh = mesh(31, vec![], true).await;
    let node = ProviderNode::builder(key(31), engine(), mesh.clone())
        .policy(ProviderPolicy {
            price_per_token: NanoUsd(100),
            measured_milli_tps: 40_000,
            measured_prefill_milli_tps: 900_000,
            ..ProviderPolicy::default()
        })
        .ledger(ledger)
        .uptime_every(Duration::from_millis(50))
        .spawn();
    (node, mesh)
}

fn job(buyer: &Keypair, node: &ProviderNode, max_tokens: u32) -> JobRequest {
    JobRequest {
        job_id: JobId::from_bytes(rand::random()),
        buyer: buyer.node_id(),
        provider: node.node_id(),
        model: ScriptedEngine::model(MODEL).id,
        prompt: Prompt::Text("count for me".into()),
        sampling: Sampling {
            max_tokens,
            ..Sampling::default()
        },
        max_price_per_token: NanoUsd(1_000),
        tier: Tier::OnDemand,
        deadline_ms: sharemesh_mesh::clock::now_ms() + 60_000,
        resume: Vec::new(),
        audit_commitment: Digest::from_bytes([0; 32]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_built_provider_serves_a_paying_buyer_and_books_the_job_and_its_uptime() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Ledger::open(dir.path()).unwrap());
    let (node, provider_mesh) = provider_node(ledger.clone()).await;
    let buyer_key = Arc::new(key(32));
    let buyer_mesh = mesh(32, provider_mesh.listen_addrs(), false).await;
    let terms = StreamTerms {
        ledger: None,
        stall_timeout: Duration::from_secs(10),
        billing: Billing::Metered(None),
        counted: None,
    };
    let peer = node.node_id().peer_id().unwrap();
    let mut stream = start_job(
        &buyer_mesh,
        buyer_key.clone(),
        peer,
        job(&buyer_key, &node, 40),
        terms,
    )
    .await
    .unwrap();
    let (mut tokens, mut finish) = (0, None);
    while let Some(event) = stream.next().await {
        match event {
            JobEvent::Token(chunk) => tokens += chunk.token_ids.len(),
            JobEvent::Finished { finish: f } => finish = Some(f),
            JobEvent::Rejected(reject) => panic!("refused: {reject:?}"),
            JobEvent::Failed(why) => panic!("failed: {why}"),
            _ => {}
        }
    }
    assert_eq!(tokens, 40);
    assert_eq!(finish, Some(FinishReason::Length));
    // The job and the buyer's receipts land in the provider's own ledger.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let jobs = ledger.jobs().unwrap();
        let receipts = ledger.receipts().unwrap();
        let paid = receipts.iter().map(|(r, _)| r.completion_tokens).max();
        if jobs.len() == 1 && paid == Some(40) && ledger.uptime_seconds(0).unwrap() > 0.0 {
            assert_eq!(jobs[0].completion_tokens, 40, "{jobs:?}");
            assert!(receipts[0].0.amount.0 > 0);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not booked: {} jobs, receipts up to {paid:?} tokens, uptime {}",
            jobs.len(),
            ledger.uptime_seconds(0).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node whose mesh stops says so (one of its protocol tasks ended), rather than
/// seeming to serve while answering nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_names_the_task_that_ended_when_its_mesh_stops() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Ledger::open(dir.path()).unwrap());
    let (mut node, provider_mesh) = provider_node(ledger).await;
    provider_mesh.shutdown().await.unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(20), node.stopped())
        .await
        .expect("the node went on as if serving");
    assert!(
        matches!(
            stopped,
            ServingStopped::Closed { .. } | ServingStopped::Failed { .. }
        ),
        "{stopped:?}"
    );
    assert!(stopped
        .to_string()
        .starts_with("the provider stopped serving"));
}

/// The node attests what it measured: generation and prefill speed per model (the
/// prefill figure was always 0 before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_attests_the_speeds_it_measured() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Ledger::open(dir.path()).unwrap());
    let (node, _mesh) = provider_node(ledger).await;
    let attestation = node.provider().attestation();
    let bench = &attestation.benchmarks[0];
    assert_eq!(bench.model, ScriptedEngine::model(MODEL).id);
    assert_eq!(bench.generation_milli_tokens_per_second, 40_000);
    assert_eq!(bench.prefill_milli_tokens_per_second, 900_000);
}
