//! Valid messages of every kind: the seeds the wire targets mutate.

use sharemesh_protocol::commitment::{commitment_root, commitment_step};
use sharemesh_protocol::envelope::body_digest;
use sharemesh_protocol::{
    codec, Accept, ChainLink, ChatMessage, Digest, ExecutionProfile, FinishReason, FraudProof,
    JobId, JobRequest, Keypair, ModelId, NanoUsd, Prompt, Quote, QuoteRequest, Receipt, Reject,
    RejectReason, Role, Sampling, SignedEnvelope, StepFingerprint, Tier, TokenChunk, WireMessage,
};

pub const NOW: u64 = 1_796_029_200_000;

pub fn key(n: u8) -> Keypair {
    Keypair::from_secret([n; 32])
}

pub fn job_request(buyer: &Keypair, provider: &Keypair) -> JobRequest {
    JobRequest {
        job_id: JobId::from_bytes([7; 16]),
        buyer: buyer.node_id(),
        provider: provider.node_id(),
        model: ModelId::from_bytes([9; 32]),
        prompt: Prompt::Chat(vec![
            ChatMessage {
                role: Role::System,
                content: "be brief".into(),
            },
            ChatMessage {
                role: Role::User,
                content: "hi ✓".into(),
            },
        ]),
        sampling: Sampling {
            max_tokens: 16,
            stop: vec!["\n\n".into()],
            ..Sampling::default()
        },
        max_price_per_token: NanoUsd(1_000),
        tier: Tier::OnDemand,
        deadline_ms: NOW + 60_000,
        resume: vec![1, 2, 3],
        audit_commitment: Digest::from_bytes([4; 32]),
    }
}

pub fn profile() -> ExecutionProfile {
    ExecutionProfile {
        engine: "sharemesh-kernels".into(),
        version: "1".into(),
        isa: "avx2".into(),
        quantization: "Q4_1".into(),
        device: "cpu".into(),
    }
}

/// Two chunks of `job`, chained from its root: one of two tokens, one final.
pub fn chunks(job: &JobRequest, provider: &Keypair) -> Vec<TokenChunk> {
    let digest = body_digest(job).unwrap_or_else(|_| unreachable!("a sample encodes"));
    let mut head = commitment_root(&job.job_id, &provider.node_id(), &digest, &profile());
    let fingerprint = |id: u32| StepFingerprint {
        top: vec![(id, 3.5f32.to_bits()), (id + 1, 1.25f32.to_bits())],
    };
    let parts: [(&[u32], &str, Option<FinishReason>); 2] = [
        (&[17, 42], " hello", None),
        (&[], "", Some(FinishReason::Stop)),
    ];
    let mut first_index = 3;
    let mut out = Vec::new();
    for (ids, text, finish) in parts {
        let fingerprints: Vec<StepFingerprint> = ids.iter().map(|&id| fingerprint(id)).collect();
        head = commitment_step(&head, first_index, ids, &fingerprints, finish);
        out.push(TokenChunk {
            job_id: job.job_id,
            provider: provider.node_id(),
            first_index,
            token_ids: ids.to_vec(),
            text_delta: text.into(),
            finish,
            fingerprints,
            commitment: head,
            logprobs: Vec::new(),
        });
        first_index += ids.len() as u32;
    }
    out
}

pub fn accept(job: &JobRequest, provider: &Keypair) -> Accept {
    Accept {
        job_id: job.job_id,
        provider: provider.node_id(),
        price_per_token: NanoUsd(100),
        prompt_tokens: 12,
        credit_window_tokens: 64,
        profile: profile(),
    }
}

/// A well-formed fraud proof (signatures and chain check) disputing the second chunk.
pub fn fraud_proof(buyer: &Keypair, provider: &Keypair) -> Option<FraudProof> {
    let job = job_request(buyer, provider);
    let chunks = chunks(&job, provider);
    Some(FraudProof {
        reporter: buyer.node_id(),
        provider: provider.node_id(),
        job_id: job.job_id,
        request: sealed(buyer, &job)?,
        accept: sealed(provider, &accept(&job, provider))?,
        earlier: vec![ChainLink::of(&chunks[0])],
        disputed: sealed(provider, &chunks[1])?,
        step: 0,
        replayed: StepFingerprint {
            top: vec![(5, 1.0f32.to_bits())],
        },
        replay_profile: profile(),
    })
}

pub fn receipt(buyer: &Keypair, provider: &Keypair, job: u8, tokens: u64) -> Receipt {
    Receipt::new(
        JobId::from_bytes([job; 16]),
        provider.node_id(),
        buyer.node_id(),
        5,
        tokens,
        NanoUsd(100),
        Digest::from_bytes([6; 32]),
    )
    .unwrap_or_else(|| unreachable!("small amounts do not overflow"))
}

fn sealed<T: WireMessage>(key: &Keypair, body: &T) -> Option<SignedEnvelope> {
    key.seal(body, 1, NOW, 60_000).ok()
}

/// One sealed envelope of every kind a stream or gossip carries.
pub fn envelopes() -> Vec<SignedEnvelope> {
    let (buyer, provider) = (key(1), key(2));
    let job = job_request(&buyer, &provider);
    let mut out = Vec::new();
    out.extend(sealed(
        &provider,
        &sharemesh_mesh::orderbook::tests_support::advert(&provider),
    ));
    out.extend(sealed(&buyer, &job));
    out.extend(sealed(
        &buyer,
        &QuoteRequest {
            job_id: job.job_id,
            buyer: buyer.node_id(),
            provider: provider.node_id(),
            model: job.model,
            tier: Tier::Reserved,
            max_price_per_token: NanoUsd(500),
            max_tokens: 64,
        },
    ));
    out.extend(sealed(
        &provider,
        &Quote {
            job_id: job.job_id,
            provider: provider.node_id(),
            price_per_token: NanoUsd(100),
            queue_wait_ms: 20,
            expected_milli_tokens_per_second: 30_000,
        },
    ));
    out.extend(sealed(&provider, &accept(&job, &provider)));
    out.extend(sealed(
        &provider,
        &Reject {
            job_id: job.job_id,
            provider: provider.node_id(),
            reason: RejectReason::BuyerLimit,
            detail: "busy".into(),
        },
    ));
    for chunk in chunks(&job, &provider) {
        out.extend(sealed(&provider, &chunk));
    }
    if let Some(proof) = fraud_proof(&buyer, &provider) {
        out.extend(sealed(&buyer, &proof));
    }
    out.extend(sealed(&buyer, &receipt(&buyer, &provider, 7, 2)));
    out
}

/// Every envelope's encoding.
pub fn envelope_bytes() -> Vec<Vec<u8>> {
    envelopes()
        .iter()
        .filter_map(|e| e.to_bytes().ok())
        .collect()
}

/// `[kind index] ‖ body` for every envelope: the body decoders' seeds.
pub fn bodies() -> Vec<Vec<u8>> {
    envelopes()
        .into_iter()
        .map(|e| {
            let mut input = vec![e.kind as u8];
            input.extend_from_slice(&e.payload);
            input
        })
        .collect()
}

/// Decodes `payload` as `T` (as `open` does after the signature) and validates it.
pub fn decode_and_validate<T: WireMessage>(payload: &[u8]) {
    if let Ok(body) = codec::decode::<T>(payload, "payload", T::MAX_BYTES) {
        let _ = body.validate();
        let _ = body.author();
    }
}
