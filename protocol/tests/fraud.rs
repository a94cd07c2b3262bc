#![allow(clippy::unwrap_used)]
//! Fraud proofs: what any node can check without the model (signatures, the chain from
//! the request to the disputed chunk, the greedy rule), and every way to fake one.

use sharemesh_protocol::commitment::{commitment_root, commitment_step};
use sharemesh_protocol::envelope::body_digest;
use sharemesh_protocol::*;

const NOW: u64 = 1_796_029_200_000;

fn key(n: u8) -> Keypair {
    Keypair::from_secret([n; 32])
}

fn profile(quantization: &str) -> ExecutionProfile {
    ExecutionProfile {
        engine: "sharemesh-kernels".into(),
        version: "1".into(),
        isa: "avx512-vnni".into(),
        quantization: quantization.into(),
        device: "cpu".into(),
    }
}

fn request(buyer: &Keypair, provider: &Keypair, temperature: f32) -> JobRequest {
    JobRequest {
        job_id: JobId::from_bytes([7; 16]),
        buyer: buyer.node_id(),
        provider: provider.node_id(),
        model: ModelId::from_bytes([9; 32]),
        prompt: Prompt::Text("once upon a time".into()),
        sampling: Sampling {
            temperature,
            max_tokens: 16,
            ..Sampling::default()
        },
        max_price_per_token: NanoUsd(100),
        tier: Tier::OnDemand,
        deadline_ms: NOW + 60_000,
        resume: vec![4],
        audit_commitment: Digest::from_bytes([1; 32]),
    }
}

fn fp(best: u32, logit: f32) -> StepFingerprint {
    StepFingerprint {
        top: vec![(best, logit.to_bits()), (best + 1, (logit - 1.0).to_bits())],
    }
}

/// A job of three one-token chunks (token = the best of its fingerprint, except where
/// `lie_at` makes the greedy token another), and a proof disputing chunk `disputed`.
fn proof(temperature: f32, lie_at: Option<usize>, disputed: usize) -> FraudProof {
    let (buyer, provider) = (key(1), key(2));
    let job = request(&buyer, &provider, temperature);
    let accept = Accept {
        job_id: job.job_id,
        provider: provider.node_id(),
        price_per_token: NanoUsd(100),
        prompt_tokens: 5,
        credit_window_tokens: 64,
        profile: profile("Q4_1"),
    };
    let mut head = commitment_root(
        &job.job_id,
        &provider.node_id(),
        &body_digest(&job).unwrap(),
        &accept.profile,
    );
    let mut chunks = Vec::new();
    for i in 0..3usize {
        let best = 10 + i as u32;
        let token = if lie_at == Some(i) { 99 } else { best };
        let fingerprints = vec![fp(best, 5.0)];
        let first_index = 1 + i as u32;
        head = commitment_step(&head, first_index, &[token], &fingerprints, None);
        chunks.push(TokenChunk {
            job_id: job.job_id,
            provider: provider.node_id(),
            first_index,
            token_ids: vec![token],
            text_delta: String::new(),
            finish: None,
            fingerprints,
            commitment: head,
            logprobs: Vec::new(),
        });
    }
    FraudProof {
        reporter: buyer.node_id(),
        provider: provider.node_id(),
        job_id: job.job_id,
        request: buyer.seal(&job, 1, NOW, 60_000).unwrap(),
        accept: provider.seal(&accept, 1, NOW, 60_000).unwrap(),
        earlier: chunks[..disputed].iter().map(ChainLink::of).collect(),
        disputed: provider.seal(&chunks[disputed], 1, NOW, 60_000).unwrap(),
        step: 0,
        replayed: fp(50, 3.0),
        replay_profile: profile("Q4_1"),
    }
}

#[test]
fn a_proof_shows_the_committed_step_and_its_context() {
    let evidence = proof(0.7, None, 2).evidence().unwrap();
    assert_eq!(evidence.before, vec![4, 10, 11]);
    assert_eq!(evidence.token, 12);
    assert_eq!(evidence.committed, fp(12, 5.0));
    assert!(!evidence.self_inconsistent());
    // A same-profile replay that differs contradicts it; one on another profile is no
    // proof, and a replay that agrees is none either.
    assert!(evidence.contradicted_by(&fp(50, 3.0), &profile("Q4_1")));
    assert!(!evidence.contradicted_by(&fp(50, 3.0), &profile("Q8_0")));
    assert!(!evidence.contradicted_by(&fp(12, 5.0), &profile("Q4_1")));
}

#[test]
fn breaking_the_greedy_rule_is_fraud_without_the_model() {
    let evidence = proof(0.0, Some(1), 1).evidence().unwrap();
    assert_eq!(evidence.token, 99);
    assert!(evidence.self_inconsistent());
    // Sampled decoding may pick a token that is not the best.
    assert!(!proof(0.7, Some(1), 1)
        .evidence()
        .unwrap()
        .self_inconsistent());
}

#[test]
fn forged_or_cut_proofs_are_refused_by_name() {
    // A link altered: the chain no longer leads to the signed head.
    let mut altered = proof(0.7, None, 2);
    altered.earlier[1].token_ids[0] = 77;
    assert_eq!(altered.evidence().unwrap_err(), ProofError::BrokenChain);
    // A link left out: the indices no longer continue.
    let mut cut = proof(0.7, None, 2);
    cut.earlier.remove(0);
    assert!(matches!(
        cut.evidence().unwrap_err(),
        ProofError::Gap { .. }
    ));
    // A step the chunk does not have.
    let mut beyond = proof(0.7, None, 2);
    beyond.step = 1;
    assert!(matches!(
        beyond.evidence().unwrap_err(),
        ProofError::NoSuchStep { .. }
    ));
    // The disputed chunk re-signed by someone else than the accused.
    let mut resigned = proof(0.7, None, 2);
    let body = resigned
        .disputed
        .open_archived::<TokenChunk>()
        .unwrap()
        .body;
    let mut forged = body.clone();
    forged.provider = key(3).node_id();
    resigned.disputed = key(3).seal(&forged, 1, NOW, 60_000).unwrap();
    assert_eq!(
        resigned.evidence().unwrap_err(),
        ProofError::Mismatched("disputed chunk")
    );
    // A bad signature anywhere.
    let mut unsigned = proof(0.7, None, 2);
    unsigned.accept.signature[0] ^= 1;
    assert!(matches!(
        unsigned.evidence().unwrap_err(),
        ProofError::Unsigned { part: "accept", .. }
    ));
    // Accusing someone else than the provider of the evidence.
    let mut misdirected = proof(0.7, None, 2);
    misdirected.provider = key(4).node_id();
    assert_eq!(
        misdirected.evidence().unwrap_err(),
        ProofError::Mismatched("request")
    );
}

#[test]
fn proofs_travel_signed_and_bounded() {
    let reporter = key(1);
    let body = proof(0.0, Some(0), 0);
    let envelope = reporter.seal(&body, 1, NOW, 60_000).unwrap();
    let bytes = envelope.to_bytes().unwrap();
    let back = SignedEnvelope::from_bytes(&bytes).unwrap();
    let opened = back.open::<FraudProof>(NOW + 1).unwrap();
    assert_eq!(opened.body, body);
    // Signed by another than the reporter it names: refused.
    let impostor = key(5).seal(&body, 1, NOW, 60_000).unwrap();
    assert!(impostor.open::<FraudProof>(NOW + 1).is_err());
    // Too many links to gossip: refused by name.
    let mut long = body.clone();
    long.earlier = vec![
        long.earlier.first().cloned().unwrap_or(ChainLink {
            first_index: 0,
            token_ids: vec![1],
            fingerprints: vec![fp(1, 1.0)],
            finish: None,
        });
        fraud::MAX_PROOF_LINKS + 1
    ];
    let err = reporter
        .seal(&long, 1, NOW, 60_000)
        .unwrap()
        .open::<FraudProof>(NOW + 1);
    assert!(err.is_err());
}
