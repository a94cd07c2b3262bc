#![allow(clippy::unwrap_used)]
//! Property and adversarial tests for every wire message and the signed envelope.

use proptest::prelude::*;
use sharemesh_protocol::*;

fn keypair(seed: u8) -> Keypair {
    Keypair::from_secret([seed; 32])
}

const NOW: u64 = 1_796_029_200_000;

fn arb_id16() -> impl Strategy<Value = JobId> {
    any::<[u8; 16]>().prop_map(JobId::from_bytes)
}
fn arb_id32() -> impl Strategy<Value = ModelId> {
    any::<[u8; 32]>().prop_map(ModelId::from_bytes)
}
fn arb_tier() -> impl Strategy<Value = Tier> {
    prop_oneof![
        Just(Tier::Reserved),
        Just(Tier::OnDemand),
        Just(Tier::Interruptible)
    ]
}
fn arb_text() -> impl Strategy<Value = String> {
    "\\PC{0,40}"
}

fn arb_advert(provider: NodeId) -> impl Strategy<Value = Advert> {
    (
        arb_text(),
        prop::collection::vec(
            (
                arb_id32(),
                arb_text(),
                any::<u32>(),
                any::<u64>(),
                arb_tier(),
            ),
            0..4,
        ),
        prop::collection::vec(arb_tier(), 0..3),
        any::<(u32, u32, u32)>(),
        prop::bool::ANY,
    )
        .prop_map(move |(region, models, tiers, load, gpu)| Advert {
            provider,
            region,
            hardware: if gpu {
                HardwareSummary::Gpu {
                    name: "NVIDIA H200".into(),
                    count: 1,
                    vram_total_bytes: 141 << 30,
                    vram_free_bytes: 100 << 30,
                    fingerprints: vec![],
                }
            } else {
                HardwareSummary::Cpu {
                    cores: 2,
                    ram_bytes: 24 << 30,
                }
            },
            models: models
                .into_iter()
                .map(|(id, name, speed, price, tier)| ModelOffer {
                    model: ModelDescriptor {
                        id,
                        name,
                        architecture: "llama".into(),
                        quantization: "Q4_1".into(),
                        context_length: 8192,
                    },
                    generation_milli_tokens_per_second: speed,
                    prices: vec![TierPrice {
                        tier,
                        price_per_token: NanoUsd(price),
                    }],
                })
                .collect(),
            tiers,
            windows: vec![AvailabilityWindow::ALWAYS],
            load: Load {
                active_jobs: load.0,
                queue_depth: load.1,
                max_concurrent: load.2,
                ..Load::default()
            },
            addresses: vec!["/ip4/127.0.0.1/tcp/4001".into()],
        })
}

fn arb_sampling() -> impl Strategy<Value = Sampling> {
    (
        0.0f32..=2.0,
        0.01f32..=1.0,
        0u32..100,
        0.5f32..=2.0,
        any::<u64>(),
        1u32..4096,
        prop::collection::vec("[a-z]{1,8}", 0..3),
        prop_oneof![
            Just(OutputFormat::Free),
            Just(OutputFormat::JsonObject),
            "[a-z{}:\" ]{0,40}".prop_map(OutputFormat::JsonSchema),
        ],
        (
            -2.0f32..=2.0,
            -2.0f32..=2.0,
            prop::collection::btree_map(any::<u32>(), -100.0f32..=100.0, 0..4),
            prop::option::of(0u8..=20),
        ),
    )
        .prop_map(
            |(
                temperature,
                top_p,
                top_k,
                repetition_penalty,
                seed,
                max_tokens,
                stop,
                format,
                (presence_penalty, frequency_penalty, bias, logprobs),
            )| {
                Sampling {
                    logprobs,
                    presence_penalty,
                    frequency_penalty,
                    logit_bias: bias.into_iter().collect(),
                    temperature,
                    top_p,
                    top_k,
                    repetition_penalty,
                    seed,
                    max_tokens,
                    stop,
                    format,
                }
            },
        )
}

fn arb_prompt() -> impl Strategy<Value = Prompt> {
    prop_oneof![
        arb_text().prop_map(Prompt::Text),
        prop::collection::vec(any::<u32>(), 0..64).prop_map(Prompt::Tokens),
        prop::collection::vec(
            (
                prop_oneof![Just(Role::System), Just(Role::User), Just(Role::Assistant)],
                arb_text()
            )
                .prop_map(|(role, content)| ChatMessage { role, content }),
            0..4
        )
        .prop_map(Prompt::Chat),
    ]
}

fn arb_job_request(buyer: NodeId, provider: NodeId) -> impl Strategy<Value = JobRequest> {
    (
        arb_id16(),
        arb_id32(),
        arb_prompt(),
        arb_sampling(),
        any::<u64>(),
        arb_tier(),
        any::<u64>(),
    )
        .prop_map(
            move |(job_id, model, prompt, sampling, price, tier, deadline_ms)| JobRequest {
                job_id,
                buyer,
                provider,
                model,
                prompt,
                resume: vec![1; (sampling.max_tokens as usize).saturating_sub(1).min(3)],
                sampling,
                max_price_per_token: NanoUsd(price),
                tier,
                deadline_ms,
                audit_commitment: Digest::from_bytes([job_id.as_bytes()[0]; 32]),
            },
        )
}

/// Seals, encodes, decodes and opens; the body must come back unchanged.
fn round_trip<T: WireMessage + PartialEq + std::fmt::Debug>(
    key: &Keypair,
    body: &T,
) -> SignedEnvelope {
    let envelope = key.seal(body, 7, NOW, 60_000).unwrap();
    let bytes = envelope.to_bytes().unwrap();
    let decoded = SignedEnvelope::from_bytes(&bytes).unwrap();
    assert_eq!(decoded, envelope);
    let opened = decoded.open::<T>(NOW + 1).unwrap();
    assert_eq!(&opened.body, body);
    assert_eq!(opened.signer, key.node_id());
    assert_eq!(opened.seq, 7);
    envelope
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn adverts_round_trip(advert in arb_advert(keypair(1).node_id())) {
        round_trip(&keypair(1), &advert);
    }

    #[test]
    fn job_requests_round_trip(request in arb_job_request(keypair(2).node_id(), keypair(1).node_id())) {
        round_trip(&keypair(2), &request);
    }

    #[test]
    fn small_messages_round_trip(job in arb_id16(), a in any::<u32>(), b in any::<u32>(), price in 0u64..1_000_000, text in arb_text()) {
        let provider = keypair(1);
        let buyer = keypair(2);
        round_trip(&buyer, &QuoteRequest { job_id: job, buyer: buyer.node_id(), provider: provider.node_id(), model: ModelId::from_bytes([5; 32]), tier: Tier::Reserved, max_price_per_token: NanoUsd(price), max_tokens: (a % 131_072) + 1 });
        round_trip(&provider, &Quote { job_id: job, provider: provider.node_id(), price_per_token: NanoUsd(price), queue_wait_ms: a, expected_milli_tokens_per_second: b });
        round_trip(&provider, &Accept { job_id: job, provider: provider.node_id(), price_per_token: NanoUsd(price), prompt_tokens: a, credit_window_tokens: b, profile: ExecutionProfile { engine: "sharemesh-kernels".into(), version: "1".into(), isa: text.clone(), quantization: "Q4_1".into(), device: "cpu".into() } });
        round_trip(&provider, &Reject { job_id: job, provider: provider.node_id(), reason: RejectReason::OverCapacity, detail: text.clone() });
        round_trip(&provider, &TokenChunk { job_id: job, provider: provider.node_id(), first_index: a, token_ids: vec![b, a], text_delta: text, finish: Some(FinishReason::Length), fingerprints: vec![StepFingerprint { top: vec![(b, 2.0f32.to_bits()), (a, 1.0f32.to_bits())] }, StepFingerprint { top: vec![(a, 0.5f32.to_bits())] }], commitment: Digest::from_bytes([b as u8; 32]), logprobs: vec![] });
        let tokens = u64::from(a) + u64::from(b);
        round_trip(&buyer, &Receipt { job_id: job, provider: provider.node_id(), buyer: buyer.node_id(), prompt_tokens: u64::from(a), completion_tokens: u64::from(b), price_per_token: NanoUsd(price), amount: NanoUsd(price * tokens), commitment: Digest::from_bytes([a as u8; 32]) });
        round_trip(&buyer, &ReputationReport { reporter: buyer.node_id(), epoch: u64::from(a), entries: vec![(provider.node_id(), ReportedDealings { verified_jobs: a, verified_tokens: u64::from(b), mismatches: 1, failures: 2 })] });
        round_trip(&provider, &Attestation { node: provider.node_id(), gpus: vec![GpuFingerprint { name: "NVIDIA H200".into(), uuid: "GPU-1".into(), vram_bytes: 1 << 30, driver_version: "560".into(), cuda_version: "12.6".into() }], cpu_model: "x86".into(), cpu_cores: 2, ram_bytes: 1 << 34, benchmarks: vec![BenchmarkResult { model: ModelId::from_bytes([5; 32]), threads: 2, prefill_milli_tokens_per_second: a, generation_milli_tokens_per_second: b }] });
    }

    #[test]
    fn any_single_bit_flip_is_rejected(advert in arb_advert(keypair(1).node_id()), bit in any::<prop::sample::Index>()) {
        let envelope = keypair(1).seal(&advert, 3, NOW, 60_000).unwrap();
        let mut bytes = envelope.to_bytes().unwrap();
        let bit = bit.index(bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        let refused = match SignedEnvelope::from_bytes(&bytes) {
            Err(_) => true,
            Ok(changed) => changed.open::<Advert>(NOW + 1).is_err(),
        };
        prop_assert!(refused, "flipping bit {} was accepted", bit);
    }

    #[test]
    fn the_key_cache_changes_no_verdict(advert in arb_advert(keypair(1).node_id()), bit in any::<prop::sample::Index>(), now_offset in 0u64..120_000) {
        // Same answer with and without cached keys, for intact and corrupted envelopes,
        // at any time (fresh, expired), with the cache warm from the intact one.
        let envelope = keypair(1).seal(&advert, 3, NOW, 60_000).unwrap();
        let mut bytes = envelope.to_bytes().unwrap();
        let mut keys = SignerKeys::new(8);
        let now = NOW + now_offset;
        prop_assert_eq!(envelope.open::<Advert>(now).is_ok(), envelope.open_cached::<Advert>(now, &mut keys).is_ok());
        let bit = bit.index(bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        if let Ok(changed) = SignedEnvelope::from_bytes(&bytes) {
            let plain = changed.open::<Advert>(now).map(|o| o.seq).map_err(|e| e.to_string());
            let cached = changed.open_cached::<Advert>(now, &mut keys).map(|o| o.seq).map_err(|e| e.to_string());
            prop_assert_eq!(plain, cached);
        }
    }

    #[test]
    fn random_bytes_give_errors_not_panics(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(envelope) = SignedEnvelope::from_bytes(&bytes) {
            prop_assert!(envelope.open::<Advert>(NOW).is_err());
        }
    }

    #[test]
    fn truncated_envelopes_give_errors(request in arb_job_request(keypair(2).node_id(), keypair(1).node_id()), cut in any::<prop::sample::Index>()) {
        let bytes = keypair(2).seal(&request, 1, NOW, 60_000).unwrap().to_bytes().unwrap();
        let cut = cut.index(bytes.len());
        prop_assert!(SignedEnvelope::from_bytes(&bytes[..cut]).is_err());
    }
}

fn sample_advert(key: &Keypair) -> Advert {
    Advert {
        provider: key.node_id(),
        region: "eu-west".into(),
        hardware: HardwareSummary::Cpu {
            cores: 2,
            ram_bytes: 1 << 34,
        },
        models: vec![],
        tiers: vec![Tier::OnDemand],
        windows: vec![],
        load: Load::default(),
        addresses: vec![],
    }
}

#[test]
fn the_key_cache_is_bounded_and_refuses_non_keys() {
    let mut keys = SignerKeys::new(2);
    for seed in 1..=5 {
        let key = keypair(seed);
        let envelope = key.seal(&sample_advert(&key), 1, NOW, 60_000).unwrap();
        assert!(envelope.open_cached::<Advert>(NOW, &mut keys).is_ok());
        assert!(keys.len() <= 2);
    }
    // 32 bytes that are not a curve point: refused, not cached.
    let not_a_point = (0u8..=255)
        .map(|i| NodeId::from_bytes([i; 32]))
        .find(|id| SignerKeys::new(1).key(id).is_err())
        .expect("about half of all 32-byte strings are not points");
    let before = keys.len();
    assert!(matches!(
        keys.key(&not_a_point),
        Err(OpenError::BadSignerKey)
    ));
    assert_eq!(keys.len(), before);
}

#[test]
fn expired_messages_are_rejected() {
    let key = keypair(1);
    let envelope = key.seal(&sample_advert(&key), 1, NOW, 60_000).unwrap();
    assert!(envelope.open::<Advert>(NOW + 60_000).is_ok());
    assert!(matches!(
        envelope.open::<Advert>(NOW + 60_001),
        Err(OpenError::Expired { .. })
    ));
    assert!(matches!(
        envelope.open::<Advert>(NOW - MAX_CLOCK_SKEW_MS - 1),
        Err(OpenError::FromTheFuture { .. })
    ));
    // Archived evidence ignores the clock but still checks the signature.
    assert!(envelope.open_archived::<Advert>().is_ok());
}

#[test]
fn replayed_messages_are_rejected() {
    let key = keypair(1);
    let mut guard = ReplayGuard::new(1024);
    let first = key.seal(&sample_advert(&key), 10, NOW, 60_000).unwrap();
    let opened = first.open::<Advert>(NOW).unwrap();
    guard
        .admit(&opened, MessageKind::Advert, [0; 16], NOW)
        .unwrap();
    let replay = SignedEnvelope::from_bytes(&first.to_bytes().unwrap()).unwrap();
    let opened = replay.open::<Advert>(NOW + 5).unwrap();
    assert!(matches!(
        guard.admit(&opened, MessageKind::Advert, [0; 16], NOW + 5),
        Err(ReplayError::Stale {
            got: 10,
            highest: 10
        })
    ));
    let older = key.seal(&sample_advert(&key), 9, NOW, 60_000).unwrap();
    assert!(guard
        .admit(
            &older.open::<Advert>(NOW).unwrap(),
            MessageKind::Advert,
            [0; 16],
            NOW
        )
        .is_err());
}

#[test]
fn a_signature_never_verifies_as_another_kind() {
    let key = keypair(1);
    let mut envelope = key.seal(&sample_advert(&key), 1, NOW, 60_000).unwrap();
    envelope.kind = MessageKind::Attestation;
    assert!(envelope.open::<Attestation>(NOW).is_err());
    envelope.kind = MessageKind::Advert;
    assert!(envelope.open::<Advert>(NOW).is_ok());
    assert!(matches!(
        envelope.open::<Receipt>(NOW),
        Err(OpenError::Decode(DecodeError::WrongKind { .. }))
    ));
}

#[test]
fn a_body_signed_by_someone_else_is_rejected() {
    let provider = keypair(1);
    let impostor = keypair(3);
    let advert = sample_advert(&provider);
    let envelope = impostor.seal(&advert, 1, NOW, 60_000).unwrap();
    assert!(matches!(
        envelope.open::<Advert>(NOW),
        Err(OpenError::Invalid(ValidationError::SignerMismatch { .. }))
    ));
}

#[test]
fn oversized_input_is_refused_before_decoding() {
    let bytes = vec![0u8; MAX_ENVELOPE_BYTES + 1];
    assert!(matches!(
        SignedEnvelope::from_bytes(&bytes),
        Err(DecodeError::TooLarge { .. })
    ));
}

#[test]
fn hostile_length_prefix_does_not_allocate() {
    let key = keypair(1);
    let mut bytes = key
        .seal(&sample_advert(&key), 1, NOW, 60_000)
        .unwrap()
        .to_bytes()
        .unwrap();
    // The payload length prefix sits after version(2) kind(4) signer(32) seq, issued, expires (8 each).
    let at = 2 + 4 + 32 + 24;
    bytes[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(SignedEnvelope::from_bytes(&bytes).is_err());
}

#[test]
fn trailing_bytes_are_refused() {
    let key = keypair(1);
    let mut bytes = key
        .seal(&sample_advert(&key), 1, NOW, 60_000)
        .unwrap()
        .to_bytes()
        .unwrap();
    bytes.push(0);
    assert!(matches!(
        SignedEnvelope::from_bytes(&bytes),
        Err(DecodeError::TrailingBytes { .. })
    ));
}

#[test]
fn other_versions_are_refused() {
    let key = keypair(1);
    let mut envelope = key.seal(&sample_advert(&key), 1, NOW, 60_000).unwrap();
    // Version 1 (before commitment chains) and a future 3 are both refused.
    envelope.version = 1;
    let bytes = envelope.to_bytes().unwrap();
    assert!(matches!(
        SignedEnvelope::from_bytes(&bytes),
        Err(DecodeError::UnsupportedVersion {
            got: 1,
            supported: 2
        })
    ));
    envelope.version = 3;
    let bytes = envelope.to_bytes().unwrap();
    assert!(matches!(
        SignedEnvelope::from_bytes(&bytes),
        Err(DecodeError::UnsupportedVersion {
            got: 3,
            supported: 2
        })
    ));
}

/// Golden bytes: the encoding must not drift silently. If this fails, the wire format
/// changed: bump PROTOCOL_VERSION and update SPEC.md, or fix the regression.
#[test]
fn receipt_golden_bytes() {
    let provider = keypair(1);
    let buyer = keypair(2);
    let receipt = Receipt {
        job_id: JobId::from_bytes([0xab; 16]),
        provider: provider.node_id(),
        buyer: buyer.node_id(),
        prompt_tokens: 12,
        completion_tokens: 30,
        price_per_token: NanoUsd(250),
        amount: NanoUsd(10_500),
        commitment: Digest::from_bytes([0xcd; 32]),
    };
    let envelope = buyer.seal(&receipt, 42, NOW, 60_000).unwrap();
    let bytes = envelope.to_bytes().unwrap();
    let digest = envelope.digest().unwrap().to_string();
    assert_eq!(
        bytes.len(),
        2 + 4 + 32 + 8 * 3 + 8 + envelope.payload.len() + 64
    );
    assert_eq!(
        &bytes[..6],
        &[2, 0, 7, 0, 0, 0],
        "version 2, kind Receipt (7)"
    );
    assert_eq!(digest, GOLDEN_RECEIPT_DIGEST, "encoding drifted");
}

const GOLDEN_RECEIPT_DIGEST: &str =
    "b75e4ef1bd390be2a91b6a177cc731d815616aab06e4ffae5f859f3807ecffe2";

#[test]
fn a_quote_request_for_no_tokens_is_refused_by_name() {
    let buyer = keypair(2);
    let request = QuoteRequest {
        job_id: JobId::from_bytes([1; 16]),
        buyer: buyer.node_id(),
        provider: keypair(1).node_id(),
        model: ModelId::from_bytes([5; 32]),
        tier: Tier::OnDemand,
        max_price_per_token: NanoUsd(100),
        max_tokens: 0,
    };
    let envelope = buyer.seal(&request, 1, NOW, 60_000).unwrap();
    let err = envelope
        .open::<QuoteRequest>(NOW + 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_tokens"), "{err}");
}

#[test]
fn a_catalog_name_offers_only_its_own_file() {
    let provider = keypair(1);
    let advert = |id: ModelId| Advert {
        provider: provider.node_id(),
        region: "eu".into(),
        hardware: HardwareSummary::Cpu {
            cores: 2,
            ram_bytes: 1 << 30,
        },
        models: vec![ModelOffer {
            model: ModelDescriptor {
                id,
                name: "smollm2-135m-instruct".into(),
                architecture: "llama".into(),
                quantization: "Q4_1".into(),
                context_length: 8192,
            },
            generation_milli_tokens_per_second: 1000,
            prices: vec![TierPrice {
                tier: Tier::OnDemand,
                price_per_token: NanoUsd(100),
            }],
        }],
        tiers: vec![Tier::OnDemand],
        windows: vec![AvailabilityWindow::ALWAYS],
        load: Load::default(),
        addresses: vec![],
    };
    let catalog = sharemesh_protocol::catalog::catalog_id("smollm2-135m-instruct").unwrap();
    let honest = provider.seal(&advert(catalog), 1, NOW, 60_000).unwrap();
    assert!(honest.open::<Advert>(NOW + 1).is_ok());
    let hijack = provider
        .seal(&advert(ModelId::from_bytes([9; 32])), 2, NOW, 60_000)
        .unwrap();
    let err = hijack.open::<Advert>(NOW + 1).unwrap_err().to_string();
    assert!(
        err.contains("`smollm2-135m-instruct` is the catalog name of model 56e91e8d"),
        "{err}"
    );
}
