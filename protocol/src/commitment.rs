//! What a provider commits to while it streams: per-step logit fingerprints, the
//! execution profile that produced them, and the hash chain that binds every chunk of
//! a job to the request and to each other (SPEC.md §12).
//!
//! A verifier that replays the job teacher-forced on the same execution profile gets
//! the same logits bit for bit (batch-invariant kernels), so any fingerprint that
//! differs is proof the provider did not run what it named. Pure: no I/O.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::ValidationError;
use crate::ids::{Digest, JobId, NodeId};
use crate::messages::FinishReason;

/// Logits kept per step: the top `FINGERPRINT_TOP_K` (token, logit) pairs.
pub const FINGERPRINT_TOP_K: usize = 8;

/// One generation step's logits, reduced to the top-k (token id, logit bits) pairs,
/// highest logit first (ties: lower id first). Taken from the model's raw logits,
/// before penalties, temperature or sampling.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StepFingerprint {
    /// `(token id, f32::to_bits(logit))`.
    pub top: Vec<(u32, u32)>,
}

/// Logits per chunk [`StepFingerprint::from_logits`] may skip whole.
const SKIP_CHUNK: usize = 64;

/// The largest value, NaNs ignored (−∞ if all are NaN): what the fingerprint's key
/// (NaN as −∞) makes of the chunk's best. Sixteen lanes, so it vectorizes.
fn largest(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = values.chunks_exact(16);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(v);
        }
    }
    chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

impl StepFingerprint {
    /// The fingerprint of a logit vector. NaNs sort below every number, so a broken
    /// model still gets a well-defined fingerprint (which will not match an honest one).
    pub fn from_logits(logits: &[f32]) -> Self {
        let k = FINGERPRINT_TOP_K.min(logits.len());
        // Keep the best k in a small sorted buffer: one pass, no full sort.
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
        let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
        for (chunk, values) in logits.chunks(SKIP_CHUNK).enumerate() {
            // Once the buffer is full, a chunk whose best cannot enter is skipped whole
            // (most of a vocabulary): one vectorized maximum instead of a branch per
            // logit, on the path every decoded token takes.
            if let Some(&(_, worst)) = top.last().filter(|_| top.len() == k) {
                if largest(values) <= worst {
                    continue;
                }
            }
            for (offset, &value) in values.iter().enumerate() {
                let value = key(value);
                if top.len() == k && top.last().is_some_and(|&(_, worst)| value <= worst) {
                    continue;
                }
                let at = top.partition_point(|&(_, v)| v >= value);
                top.insert(at, ((chunk * SKIP_CHUNK + offset) as u32, value));
                top.truncate(k);
            }
        }
        Self {
            top: top.into_iter().map(|(id, v)| (id, v.to_bits())).collect(),
        }
    }

    /// The highest-scoring token: what greedy decoding without penalties picks.
    pub fn best_token(&self) -> Option<u32> {
        self.top.first().map(|&(id, _)| id)
    }

    /// The logit of `token`, if it is among the top k.
    pub fn logit_of(&self, token: u32) -> Option<f32> {
        self.top
            .iter()
            .find(|&&(id, _)| id == token)
            .map(|&(_, bits)| f32::from_bits(bits))
    }

    /// The largest |logit difference| over the tokens both fingerprints list
    /// (`None` when they share none): how far apart two runs of one step are.
    pub fn gap(&self, other: &StepFingerprint) -> Option<f32> {
        self.top
            .iter()
            .filter_map(|&(id, bits)| other.logit_of(id).map(|v| (f32::from_bits(bits) - v).abs()))
            .fold(None, |most: Option<f32>, d| {
                Some(most.map_or(d, |m| m.max(d)))
            })
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.top.is_empty() || self.top.len() > FINGERPRINT_TOP_K {
            return Err(ValidationError::field(
                "fingerprints",
                format!("each step holds 1..={FINGERPRINT_TOP_K} pairs"),
            ));
        }
        // A model's raw logits are finite: NaN compares false in every gap and
        // median, so it would pass any tolerance as honest.
        if self
            .top
            .iter()
            .any(|&(_, bits)| !f32::from_bits(bits).is_finite())
        {
            return Err(ValidationError::field(
                "fingerprints",
                "logits must be finite (no NaN or infinity)",
            ));
        }
        let ordered = self.top.windows(2).all(|pair| {
            let (a, b) = (f32::from_bits(pair[0].1), f32::from_bits(pair[1].1));
            a > b || (a == b && pair[0].0 < pair[1].0)
        });
        if !ordered {
            return Err(ValidationError::field(
                "fingerprints",
                "pairs must be ordered by logit, highest first",
            ));
        }
        Ok(())
    }
}

/// The engines a profile may name: each one some verifier runs.
pub const PROFILE_ENGINES: &[&str] = &["sharemesh-kernels", "candle", "scripted"];
/// The devices a profile may name.
pub const PROFILE_DEVICES: &[&str] = &["cpu", "cuda", "metal", "none"];
/// The instruction sets a profile may name: the kernels' builds, candle's target
/// architectures on the CPU, `none` for the scripted engine; and on a GPU its compute
/// capability, `sm_` and its two or three digits (`sm_90`: an H100 or H200).
pub const PROFILE_ISAS: &[&str] = &["avx512-vnni", "avx2", "scalar", "x86_64", "aarch64", "none"];

/// Whether `isa` names a GPU's compute capability (`sm_90`, `sm_120`).
fn is_compute_capability(isa: &str) -> bool {
    isa.strip_prefix("sm_").is_some_and(|digits| {
        (2..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
    })
}
/// The weights' quantizations a profile may name (GGUF file types as the engine
/// names them; `none` for the scripted engine).
pub const PROFILE_QUANTIZATIONS: &[&str] = &[
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M",
    "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "unknown", "none",
];
/// The longest arithmetic version (`3`, `0.11`).
const MAX_VERSION_BYTES: usize = 16;

/// What produced a job's logits. Two runs replay each other bit for bit when
/// [`ExecutionProfile::replays_exactly`] holds; otherwise only a tolerance check is
/// possible.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExecutionProfile {
    /// `sharemesh-kernels`, `candle`, `scripted`.
    pub engine: String,
    /// The engine's arithmetic version: runs with the same version compute the same
    /// bits (for `sharemesh-kernels`, whatever the instruction set).
    pub version: String,
    /// Instruction set used (`avx512-vnni`, `avx2`, `scalar`); informational for the
    /// kernels, whose every ISA gives the same bits.
    pub isa: String,
    /// The weights' quantization as loaded (`Q4_1`).
    pub quantization: String,
    /// `cpu`, `cuda`, `metal`.
    pub device: String,
}

impl ExecutionProfile {
    /// Whether a replay on `other` must reproduce this profile's logits bit for bit.
    /// The kernels promise it across instruction sets (SPEC.md §12); candle promises
    /// it only on the CPU with the same instruction set. On a GPU, candle's bits depend
    /// on the batch a job shared its steps with (cuBLAS picks its kernels by shape), so
    /// a GPU job is checked with the cross-profile tolerance until a run on GPUs
    /// measures which replay each other (#43).
    pub fn replays_exactly(&self, other: &ExecutionProfile) -> bool {
        let same_arithmetic = self.engine == other.engine
            && self.version == other.version
            && self.quantization == other.quantization
            && self.device == other.device;
        match self.engine.as_str() {
            "sharemesh-kernels" => same_arithmetic,
            "candle" => same_arithmetic && self.isa == other.isa && self.device == "cpu",
            _ => same_arithmetic && self.isa == other.isa,
        }
    }

    /// A profile is a closed set of facts, not free text: each field one of the names
    /// this protocol knows, the version dotted decimal digits. A name no verifier runs
    /// (a trailing space, `3x`) would turn any fraud into at most "suspected".
    pub fn validate(&self) -> Result<(), ValidationError> {
        let gpu_isa = self.device == "cuda" && is_compute_capability(&self.isa);
        for (field, value, known) in [
            ("profile.engine", &self.engine, PROFILE_ENGINES),
            ("profile.isa", &self.isa, PROFILE_ISAS),
            (
                "profile.quantization",
                &self.quantization,
                PROFILE_QUANTIZATIONS,
            ),
            ("profile.device", &self.device, PROFILE_DEVICES),
        ] {
            let a_gpu_isa = field == "profile.isa" && gpu_isa;
            if !known.contains(&value.as_str()) && !a_gpu_isa {
                let shown: String = value.chars().take(24).collect();
                return Err(ValidationError::field(
                    field,
                    format!("{shown:?} is not one of {}", known.join(", ")),
                ));
            }
        }
        let version_ok = !self.version.is_empty()
            && self.version.len() <= MAX_VERSION_BYTES
            && self
                .version
                .split('.')
                .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
        if !version_ok {
            return Err(ValidationError::field(
                "profile.version",
                "must be dotted decimal digits (`3`, `0.11`)",
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for ExecutionProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}-{}/{}-{}/{}",
            self.engine, self.version, self.device, self.isa, self.quantization
        )
    }
}

/// Across profiles, a job whose median step gap exceeds this is suspect (honest
/// kernels→candle jobs measured ≤ 0.44; TRUST.md's Q4_0 substitute ≥ 2.15).
pub const CROSS_PROFILE_TOLERANCE: f32 = 1.0;

/// A step whose fingerprints share no token counts as this far apart.
pub const DISJOINT_GAP: f32 = 100.0;

/// The median over steps of [`StepFingerprint::gap`]: the cross-profile distance of
/// two runs of a job (SPEC §12; honest kernels→candle jobs ≤ 0.44, a network with two
/// layers dropped ≥ 7.4, `engine/tests/cross_profile.rs`). `None` for no steps.
pub fn median_gap(committed: &[StepFingerprint], replayed: &[StepFingerprint]) -> Option<f32> {
    let mut gaps: Vec<f32> = committed
        .iter()
        .zip(replayed)
        .map(|(a, b)| a.gap(b).unwrap_or(DISJOINT_GAP))
        .collect();
    if gaps.is_empty() {
        return None;
    }
    gaps.sort_by(f32::total_cmp);
    Some(gaps[gaps.len() / 2])
}

/// Across profiles a draw "disagrees" when it lies farther than this, in probability,
/// from picking the delivered token: another profile's logits move an honest draw only
/// by as much as they move the distribution, while a token the provider chose itself
/// lies anywhere (`engine/tests/cross_profile.rs` measures both).
pub const CROSS_PROFILE_DRAW_SLACK: f32 = 0.2;

/// Across profiles a job is suspect when more than this share of its steps' draws
/// disagree ([`CROSS_PROFILE_DRAW_SLACK`])…
pub const CROSS_PROFILE_DRAW_SHARE: f32 = 0.1;

/// …and at least this many do (one flip on a short job is not evidence).
pub const CROSS_PROFILE_DRAW_MIN: usize = 3;

/// How many draws lie beyond [`CROSS_PROFILE_DRAW_SLACK`] of their delivered token (a
/// NaN distance counts).
pub fn far_draws(distances: &[f32]) -> usize {
    distances
        .iter()
        .filter(|d| d.is_nan() || **d > CROSS_PROFILE_DRAW_SLACK)
        .count()
}

/// The seeded-draw rule across profiles (a Token-DiFR-like test: the verifier knows
/// each step's draw, so it can tell how far the delivered token lies from it): whether
/// the draws of a replay on another profile disagree with the delivered tokens more
/// than honest differences in the logits explain. A NaN distance disagrees.
pub fn draws_disagree(distances: &[f32]) -> bool {
    let disagreeing = far_draws(distances);
    disagreeing >= CROSS_PROFILE_DRAW_MIN
        && disagreeing as f32 > CROSS_PROFILE_DRAW_SHARE * distances.len() as f32
}

const ROOT_DOMAIN: &[u8] = b"sharemesh/2/commitment-root\0";
const STEP_DOMAIN: &[u8] = b"sharemesh/2/commitment-step\0";

/// `h_0`: binds the chain to the job, the provider, the exact request (its body
/// digest) and the execution profile the provider accepted with.
pub fn commitment_root(
    job: &JobId,
    provider: &NodeId,
    request_digest: &Digest,
    profile: &ExecutionProfile,
) -> Digest {
    let mut hasher = Sha256::new();
    hasher.update(ROOT_DOMAIN);
    hasher.update(job.as_bytes());
    hasher.update(provider.as_bytes());
    hasher.update(request_digest.as_bytes());
    for part in [
        &profile.engine,
        &profile.version,
        &profile.isa,
        &profile.quantization,
        &profile.device,
    ] {
        hasher.update((part.len() as u32).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    Digest::from_bytes(hasher.finalize().into())
}

/// `h_k = H(h_{k-1} ‖ first_index ‖ tokens ‖ fingerprints ‖ finish)`: one link per
/// chunk, so the head commits to every token, every fingerprint and the ending.
pub fn commitment_step(
    previous: &Digest,
    first_index: u32,
    tokens: &[u32],
    fingerprints: &[StepFingerprint],
    finish: Option<FinishReason>,
) -> Digest {
    let mut hasher = Sha256::new();
    hasher.update(STEP_DOMAIN);
    hasher.update(previous.as_bytes());
    hasher.update(first_index.to_le_bytes());
    hasher.update((tokens.len() as u32).to_le_bytes());
    for token in tokens {
        hasher.update(token.to_le_bytes());
    }
    hasher.update((fingerprints.len() as u32).to_le_bytes());
    for step in fingerprints {
        hasher.update((step.top.len() as u32).to_le_bytes());
        for (id, bits) in &step.top {
            hasher.update(id.to_le_bytes());
            hasher.update(bits.to_le_bytes());
        }
    }
    hasher.update([match finish {
        None => 0u8,
        Some(FinishReason::Stop) => 1,
        Some(FinishReason::Length) => 2,
        Some(FinishReason::Cancelled) => 3,
        Some(FinishReason::Error) => 4,
    }]);
    Digest::from_bytes(hasher.finalize().into())
}

fn audit_hash(domain: &[u8], secret: &[u8; 32], job: &JobId) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(domain);
    hasher.update(secret);
    hasher.update(job.as_bytes());
    hasher.finalize().into()
}

/// The buyer's commitment to its audit secret, sent with the request: which jobs get
/// verified is drawn from the secret after delivery, so a provider cannot tell a
/// checked job from an unchecked one, and the buyer cannot pick after the fact.
pub fn audit_commitment(secret: &[u8; 32], job: &JobId) -> Digest {
    Digest::from_bytes(audit_hash(b"sharemesh/2/audit-commitment\0", secret, job))
}

/// The audit draw in `[0, 1)`: the job is verified when it falls below the rate the
/// buyer applies to that provider.
pub fn audit_draw(secret: &[u8; 32], job: &JobId) -> f64 {
    let digest = audit_hash(b"sharemesh/2/audit-draw\0", secret, job);
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    (u64::from_le_bytes(head) >> 11) as f64 / (1u64 << 53) as f64
}

/// A teacher-forced replay to run (verification work): the logits a model gives after
/// `prompt` and each prefix of `outputs`, fingerprinted for steps `from..`. Carries no
/// commitment, so a replayer must compute what it returns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayRequest {
    pub model: crate::ids::ModelId,
    pub prompt: crate::messages::Prompt,
    /// Completion tokens as delivered (a resumed prefix included).
    pub outputs: Vec<u32>,
    /// The first step to fingerprint (the steps before it are context only).
    pub from: usize,
    /// The job's sampling as the buyer signed it (seed, temperature, top-k/p,
    /// penalties, bias, output format): the replay redraws every step with it. Real
    /// logits do not depend on it; the tokens a seeded sampler picks from them do.
    pub sampling: crate::messages::Sampling,
}

/// What a replay gave for the steps `from..outputs.len()`: each step's fingerprint,
/// the token the request's seeded sampler draws from the replayed logits after the
/// delivered tokens before it (format mask, bias, penalties, temperature, top-k/p, the
/// draw, as generation does), and the profile it ran on. On a profile that replays
/// exactly, an honest provider delivered exactly `drawn`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayResult {
    pub fingerprints: Vec<StepFingerprint>,
    pub drawn: Vec<u32>,
    /// Per step, how far (in probability) the seeded draw lies from picking the
    /// delivered token: 0 where `drawn` is the delivered token (engine's
    /// `sampler::redraw`). Across profiles, what [`draws_disagree`] judges.
    #[serde(default)]
    pub draw_distances: Vec<f32>,
    pub profile: ExecutionProfile,
}

impl ReplayResult {
    /// The first step (counted from the replay's `from`) whose delivered token is not
    /// the one the seeded sampler draws, with the drawn token.
    pub fn first_other_draw(&self, delivered: &[u32]) -> Option<(usize, u32)> {
        self.drawn
            .iter()
            .zip(delivered)
            .position(|(drawn, delivered)| drawn != delivered)
            .map(|step| (step, self.drawn[step]))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The seeded-draw rule: far draws count only beyond the slack, need both the
    /// minimum count and the share, and a NaN distance is far.
    #[test]
    fn draws_disagree_needs_enough_far_draws() {
        let far = CROSS_PROFILE_DRAW_SLACK + 0.01;
        let job = |far_steps: usize, steps: usize| -> Vec<f32> {
            (0..steps)
                .map(|i| {
                    if i < far_steps {
                        far
                    } else {
                        CROSS_PROFILE_DRAW_SLACK
                    }
                })
                .collect()
        };
        assert!(!draws_disagree(&job(0, 24)));
        assert!(!draws_disagree(&job(2, 24)), "fewer than the minimum");
        assert!(draws_disagree(&job(3, 24)));
        assert!(
            !draws_disagree(&job(3, 40)),
            "not above a tenth of the steps"
        );
        assert!(draws_disagree(&job(5, 40)));
        assert!(draws_disagree(&[f32::NAN, f32::NAN, f32::NAN]));
        assert!(!draws_disagree(&[]));
    }

    #[test]
    fn fingerprint_keeps_the_top_k_in_order_with_ties_by_id() {
        let logits = [0.5, 3.0, -1.0, 3.0, f32::NAN, 2.0, 7.0, 0.0, 1.0, 1.5, 0.25];
        let fp = StepFingerprint::from_logits(&logits);
        let ids: Vec<u32> = fp.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, vec![6, 1, 3, 5, 9, 8, 0, 10]);
        assert_eq!(fp.best_token(), Some(6));
        assert_eq!(fp.logit_of(5), Some(2.0));
        assert!(fp.validate().is_ok());
        let shuffled = StepFingerprint {
            top: vec![fp.top[1], fp.top[0]],
        };
        assert!(shuffled.validate().is_err());
        assert!(StepFingerprint::default().validate().is_err());
    }

    #[test]
    fn gaps_measure_shared_tokens_and_medians_steps() {
        let a = StepFingerprint::from_logits(&[1.0, 5.0, 3.0]);
        let b = StepFingerprint::from_logits(&[1.5, 4.0, 3.0]);
        assert_eq!(a.gap(&b), Some(1.0));
        let disjoint = StepFingerprint {
            top: vec![(9, 1.0f32.to_bits())],
        };
        assert_eq!(a.gap(&disjoint), None);
        let steps = [a.clone(), a.clone(), a.clone()];
        let replayed = [a.clone(), b, disjoint];
        assert_eq!(median_gap(&steps, &replayed), Some(1.0));
        assert_eq!(median_gap(&[], &[]), None);
    }

    /// Skipping whole chunks keeps exactly what a full sort keeps (key NaN as −∞,
    /// ties by id), for vocabularies with ties, NaNs, infinities and lengths around the
    /// chunk size.
    #[test]
    fn fingerprint_equals_a_full_sort() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [0usize, 1, 7, 8, 9, 63, 64, 65, 200, 1000, 49_152] {
            for _ in 0..4 {
                let logits: Vec<f32> = (0..len)
                    .map(|_| match next() % 50 {
                        0 => f32::NAN,
                        1 => f32::INFINITY,
                        2 => f32::NEG_INFINITY,
                        // Few distinct values: many ties.
                        r if r < 25 => (next() % 16) as f32,
                        _ => (next() % 100_000) as f32 / 997.0 - 50.0,
                    })
                    .collect();
                let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
                let mut order: Vec<u32> = (0..len as u32).collect();
                order.sort_by(|&a, &b| {
                    key(logits[b as usize])
                        .total_cmp(&key(logits[a as usize]))
                        .then(a.cmp(&b))
                });
                let want: Vec<(u32, u32)> = order
                    .into_iter()
                    .take(FINGERPRINT_TOP_K)
                    .map(|id| (id, key(logits[id as usize]).to_bits()))
                    .collect();
                assert_eq!(
                    StepFingerprint::from_logits(&logits).top,
                    want,
                    "length {len}"
                );
            }
        }
    }

    #[test]
    fn fingerprint_of_a_short_vector_holds_all_of_it() {
        let fp = StepFingerprint::from_logits(&[1.0, 2.0]);
        assert_eq!(fp.top, vec![(1, 2.0f32.to_bits()), (0, 1.0f32.to_bits())]);
    }

    #[test]
    fn every_part_of_a_step_changes_the_link() {
        let root = Digest::from_bytes([1; 32]);
        let fp = StepFingerprint::from_logits(&[1.0, 2.0, 3.0]);
        let base = commitment_step(&root, 4, &[2], std::slice::from_ref(&fp), None);
        let other_fp = StepFingerprint::from_logits(&[1.0, 2.0, 3.5]);
        let variants = [
            commitment_step(
                &Digest::from_bytes([2; 32]),
                4,
                &[2],
                std::slice::from_ref(&fp),
                None,
            ),
            commitment_step(&root, 5, &[2], std::slice::from_ref(&fp), None),
            commitment_step(&root, 4, &[1], std::slice::from_ref(&fp), None),
            commitment_step(&root, 4, &[2], &[other_fp], None),
            commitment_step(
                &root,
                4,
                &[2],
                std::slice::from_ref(&fp),
                Some(FinishReason::Stop),
            ),
        ];
        for variant in variants {
            assert_ne!(variant, base);
        }
    }

    #[test]
    fn kernels_replay_across_isas_but_not_across_quantizations() {
        let kernels = ExecutionProfile {
            engine: "sharemesh-kernels".into(),
            version: "1".into(),
            isa: "avx512-vnni".into(),
            quantization: "Q4_1".into(),
            device: "cpu".into(),
        };
        let avx2 = ExecutionProfile {
            isa: "avx2".into(),
            ..kernels.clone()
        };
        assert!(kernels.replays_exactly(&avx2));
        let q8 = ExecutionProfile {
            quantization: "Q8_0".into(),
            ..kernels.clone()
        };
        assert!(!kernels.replays_exactly(&q8));
        let candle = ExecutionProfile {
            engine: "candle".into(),
            ..kernels.clone()
        };
        let candle_avx2 = ExecutionProfile {
            isa: "avx2".into(),
            ..candle.clone()
        };
        assert!(!candle.replays_exactly(&candle_avx2));
        assert!(!kernels.replays_exactly(&candle));
        assert!(candle.replays_exactly(&candle.clone()));
        let gpu = ExecutionProfile {
            device: "cuda".into(),
            ..candle.clone()
        };
        assert!(
            !gpu.replays_exactly(&gpu.clone()),
            "a GPU's bits depend on the batch"
        );
    }

    #[test]
    fn profiles_are_closed_names_and_a_dotted_version() {
        let kernels = ExecutionProfile {
            engine: "sharemesh-kernels".into(),
            version: "3".into(),
            isa: "avx2".into(),
            quantization: "Q4_1".into(),
            device: "cpu".into(),
        };
        assert!(kernels.validate().is_ok());
        let candle = ExecutionProfile {
            engine: "candle".into(),
            version: "0.11.1".into(),
            isa: "x86_64".into(),
            ..kernels.clone()
        };
        assert!(candle.validate().is_ok());
        let refused = |profile: ExecutionProfile, field: &str| {
            let err = profile.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        };
        let with = |f: fn(&mut ExecutionProfile)| {
            let mut p = kernels.clone();
            f(&mut p);
            p
        };
        refused(with(|p| p.device = "cuda ".into()), "profile.device");
        // A GPU's instruction set is its compute capability, on a GPU only.
        let gpu = with(|p| {
            p.engine = "candle".into();
            p.device = "cuda".into();
            p.isa = "sm_90".into();
        });
        assert!(gpu.validate().is_ok());
        assert!(with(|p| {
            p.device = "cuda".into();
            p.isa = "sm_120".into();
        })
        .validate()
        .is_ok());
        refused(with(|p| p.isa = "sm_90".into()), "profile.isa");
        for odd in ["sm_9", "sm_9000", "sm_9a", "sm_90 "] {
            let mut bad = gpu.clone();
            bad.isa = odd.into();
            refused(bad, "profile.isa");
        }
        refused(with(|p| p.device = String::new()), "profile.device");
        refused(
            with(|p| p.engine = "sharemesh-kernels2".into()),
            "profile.engine",
        );
        refused(with(|p| p.isa = "AVX2".into()), "profile.isa");
        refused(
            with(|p| p.quantization = "Q4_1 ".into()),
            "profile.quantization",
        );
        for version in ["3x", "", ".3", "3.", "3..1", "1.2.3.4.5.6.7.8.9", " 3"] {
            let mut p = kernels.clone();
            p.version = version.into();
            refused(p, "profile.version");
        }
        refused(with(|p| p.engine = "x".repeat(1 << 16)), "profile.engine");
    }

    #[test]
    fn fingerprints_with_nan_or_infinite_logits_are_refused() {
        let ok = StepFingerprint {
            top: vec![(1, 2.0f32.to_bits()), (2, 1.0f32.to_bits())],
        };
        assert!(ok.validate().is_ok());
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for top in [
                vec![(1, bad.to_bits())],
                vec![(1, 2.0f32.to_bits()), (2, bad.to_bits())],
            ] {
                let err = StepFingerprint { top }.validate().unwrap_err().to_string();
                assert!(err.contains("finite"), "{bad}: {err}");
            }
        }
    }

    #[test]
    fn audit_draws_are_uniform_enough_and_bound_to_the_secret() {
        let job = JobId::from_bytes([9; 16]);
        let draws: Vec<f64> = (0..2000u32)
            .map(|i| {
                let mut secret = [0u8; 32];
                secret[..4].copy_from_slice(&i.to_le_bytes());
                audit_draw(&secret, &job)
            })
            .collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let below_tenth = draws.iter().filter(|&&d| d < 0.1).count();
        assert!((120..=280).contains(&below_tenth), "{below_tenth}");
        assert_ne!(
            audit_commitment(&[1; 32], &job),
            audit_commitment(&[2; 32], &job)
        );
    }
}
