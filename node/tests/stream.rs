#![allow(clippy::unwrap_used)]
//! `/sharemesh/infer/2` with the real engine: a buyer streams a generation from a
//! provider over the mesh (tokens equal local generation); closing the stream stops
//! the provider; a restarted provider process keeps its PeerId and is found again.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use sharemesh_engine::{Engine, GenerateRequest, LoadedModel, TokenEngine};
use sharemesh_gateway::buyer::{start_job, Billing, JobEvent, StreamTerms};
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::{self as mesh, MeshConfig};
use sharemesh_protocol::{
    ChatMessage, FinishReason, JobId, JobRequest, Keypair, ModelId, NanoUsd, Prompt, Role,
    Sampling, Tier,
};
use sharemesh_provider::{ProviderNode, ProviderPolicy};

fn load() -> LoadedModel {
    sharemesh_engine::set_threads(1);
    let id: ModelId = common::DEFAULT_MODEL_ID.parse().unwrap();
    LoadedModel::load(
        &common::default_model_path(),
        id,
        "smollm2-135m-instruct",
        sharemesh_engine::Device::Cpu,
    )
    .unwrap()
}

fn mesh_config(bootstrap: Vec<libp2p::Multiaddr>, kad_server: bool) -> MeshConfig {
    MeshConfig {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
        bootstrap,
        kad_server,
        heartbeat: Duration::from_millis(300),
        ..MeshConfig::default()
    }
}

fn request(
    buyer: &Keypair,
    provider: &Keypair,
    model: ModelId,
    prompt: &str,
    max_tokens: u32,
) -> JobRequest {
    JobRequest {
        job_id: JobId::from_bytes(rand_id()),
        buyer: buyer.node_id(),
        provider: provider.node_id(),
        model,
        prompt: Prompt::Chat(vec![ChatMessage {
            role: Role::User,
            content: prompt.into(),
        }]),
        sampling: Sampling {
            max_tokens,
            ..Sampling::default()
        },
        max_price_per_token: NanoUsd(1000),
        tier: Tier::OnDemand,
        deadline_ms: now_ms() + 600_000,
        resume: vec![],
        audit_commitment: sharemesh_protocol::Digest::from_bytes([0; 32]),
    }
}

fn rand_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&now_ms().to_le_bytes());
    id[8..].copy_from_slice(&std::process::id().to_le_bytes().repeat(2));
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_streams_tokens_equal_to_local_generation_and_closing_cancels() {
    let mut local = load();
    let model_id = local.descriptor.id;
    let expected = local
        .generate(
            &GenerateRequest {
                model: model_id,
                prompt: Prompt::Chat(vec![ChatMessage {
                    role: Role::User,
                    content: "What is 2 + 2?".into(),
                }]),
                sampling: Sampling {
                    max_tokens: 24,
                    ..Sampling::default()
                },
                resume: vec![],
                ignore_eos: false,
                interruptible: false,
                prefix_salt: [0; 32],
            },
            |_| true,
        )
        .unwrap();

    let provider_key = Keypair::from_secret([21; 32]);
    let provider_mesh = mesh::spawn(provider_key.secret(), mesh_config(vec![], true))
        .await
        .unwrap();
    while provider_mesh.listen_addrs().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let engine = std::sync::Arc::new(Engine::spawn(vec![load()], 4));
    let policy = ProviderPolicy {
        credit_window_tokens: 4,
        ..ProviderPolicy::default()
    };
    let _provider = ProviderNode::builder(
        Keypair::from_secret(provider_key.secret()),
        engine.clone(),
        provider_mesh.clone(),
    )
    .policy(policy)
    .hardware(sharemesh_provider::hardware::detect())
    .spawn();

    let buyer_key = Keypair::from_secret([22; 32]);
    let buyer_mesh = mesh::spawn(
        buyer_key.secret(),
        mesh_config(provider_mesh.listen_addrs(), false),
    )
    .await
    .unwrap();
    let job = request(&buyer_key, &provider_key, model_id, "What is 2 + 2?", 24);
    let mut events = start_job(
        &buyer_mesh,
        std::sync::Arc::new(Keypair::from_secret(buyer_key.secret())),
        provider_mesh.peer_id,
        job,
        StreamTerms {
            ledger: None,
            stall_timeout: sharemesh_gateway::buyer::DEFAULT_STALL_TIMEOUT,
            billing: Billing::Metered(None),
            counted: None,
        },
    )
    .await
    .unwrap();
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut finished = None;
    let mut receipt = None;
    while let Some(event) = tokio::time::timeout(Duration::from_secs(60), events.next())
        .await
        .unwrap()
    {
        match event {
            JobEvent::Accepted(accept) => assert_eq!(accept.credit_window_tokens, 4),
            JobEvent::Token(chunk) => {
                assert_eq!(chunk.first_index as usize, tokens.len());
                tokens.extend(chunk.token_ids);
                text.push_str(&chunk.text_delta);
            }
            JobEvent::Receipted(last) => receipt = Some(last),
            JobEvent::Finished { finish } => {
                finished = Some(finish);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let finish = finished.expect("the job finished");
    assert_eq!(
        tokens, expected.token_ids,
        "mesh tokens equal local generation"
    );
    assert_eq!(text, expected.text);
    assert_eq!(finish, FinishReason::Stop);
    // A credit window of 4 forced receipts along the way; the last covers every token
    // and acknowledges the provider's final commitment-chain head.
    let receipt = receipt.unwrap();
    assert_eq!(receipt.completion_tokens, tokens.len() as u64);
    let transcript = events.transcript().expect("a transcript");
    let (_, last) = transcript.chunks.last().unwrap();
    assert_eq!(receipt.commitment, last.commitment);
    assert_eq!(transcript.outputs(), tokens);
    // Greedy: every token is the best of the real logits the provider committed to.
    let committed = transcript.committed();
    assert_eq!(committed.len(), tokens.len());
    for (token, fingerprint) in tokens.iter().zip(committed) {
        assert_eq!(fingerprint.best_token(), Some(*token));
    }

    // Closing the stream stops the provider within a token or so.
    let job = request(
        &buyer_key,
        &provider_key,
        model_id,
        "Write a long story about a dragon.",
        400,
    );
    let mut events = start_job(
        &buyer_mesh,
        std::sync::Arc::new(Keypair::from_secret(buyer_key.secret())),
        provider_mesh.peer_id,
        job,
        StreamTerms {
            ledger: None,
            stall_timeout: sharemesh_gateway::buyer::DEFAULT_STALL_TIMEOUT,
            billing: Billing::Metered(None),
            counted: None,
        },
    )
    .await
    .unwrap();
    let mut seen = 0;
    while seen < 3 {
        if let JobEvent::Token(_) = tokio::time::timeout(Duration::from_secs(60), events.next())
            .await
            .unwrap()
            .unwrap()
        {
            seen += 1;
        }
    }
    assert_eq!(engine.active_jobs(), 1);
    drop(events);
    let deadline = Instant::now() + Duration::from_secs(5);
    while engine.active_jobs() != 0 {
        assert!(
            Instant::now() < deadline,
            "the provider kept generating after the stream closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn providers(http: &str) -> Vec<serde_json::Value> {
    let out = Command::new("curl")
        .args(["-s", &format!("http://{http}/v1/network/providers")])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

#[test]
fn a_restarted_provider_keeps_its_peer_id_and_is_found_again() {
    let model = common::default_model_path();
    let model = model.to_str().unwrap();
    let provider_dir = tempfile::tempdir().unwrap();
    let gateway_dir = tempfile::tempdir().unwrap();
    let provider_args = |listen: &str| {
        [
            "provide",
            "--model",
            model,
            "--threads",
            "1",
            "--listen",
            listen,
            "--advert-interval",
            "1",
        ]
        .map(str::to_owned)
    };
    let first = provider_args("/ip4/127.0.0.1/tcp/0");
    let (provider, ready) =
        common::start(&first.each_ref().map(String::as_str), provider_dir.path());
    let peer_id = ready["peer_id"].as_str().unwrap().to_owned();
    let bootstrap = ready["listen"][0].as_str().unwrap().to_owned();
    // The restart listens where the first run was bound: the gateway knows that address.
    let bound = bootstrap.split("/p2p/").next().unwrap().to_owned();
    let (_gateway, http_ready) = common::start(
        &[
            "gateway",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--bootstrap",
            &bootstrap,
            "--http",
            "127.0.0.1:0",
        ],
        gateway_dir.path(),
    );
    let http = http_ready["http"].as_str().unwrap().to_owned();
    let seen_after = |since: u64| {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let found = providers(&http).iter().any(|p| {
                p["peer_id"] == peer_id.as_str() && p["last_seen"].as_u64().unwrap_or(0) > since
            });
            if found {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the gateway did not see {peer_id} after {since}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    seen_after(0);
    drop(provider); // SIGKILL
    let restarted_at = now_ms();
    let again = provider_args(&bound);
    let (_provider, ready) =
        common::start(&again.each_ref().map(String::as_str), provider_dir.path());
    assert_eq!(
        ready["peer_id"].as_str().unwrap(),
        peer_id,
        "the PeerId survived the restart"
    );
    seen_after(restarted_at);
}
