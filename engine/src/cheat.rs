//! The adversary kit's engine side (cargo feature `adversary`, off in the shipped
//! build): how a cheating provider's engine serves, so tests and the testnet can show
//! that verification catches it. Nothing here exists in a default build.

use sharemesh_protocol::commitment::StepFingerprint;
use sharemesh_protocol::Sampling;

use crate::sampler;

/// Testnet adversary kit: how a cheating provider's engine serves. Honest engines run
/// `Cheat::None`; the others exist so tests can show that verification catches them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cheat {
    #[default]
    None,
    /// Noise tokens without running the model, with fingerprints that look greedy.
    Garbage,
    /// Honest for the first `honest_jobs` jobs, garbage after (earn trust, then cheat).
    Camouflage { honest_jobs: u32 },
    /// Honest on fresh jobs, garbage on resumed ones (failovers and the windows other
    /// nodes have it re-run to verify someone else's work): a lazy verifier that skips
    /// the costly re-prefill of a context it is paid to recompute.
    LazyResume,
    /// Runs the real model (its fingerprints are honest) but draws each sampled token
    /// from its own random stream instead of the request's seed: free to steer the text.
    ChooseTokens,
    /// Runs the real model, but where the sampler draws an end token takes the best
    /// other one instead: it never stops before `max_tokens`, and bills them all.
    NeverStop,
}

/// The seed the `ChooseTokens` cheat draws with instead of the request's.
pub(crate) const OWN_STREAM: u64 = 0x0c40_05e5_0000_0001;

impl Cheat {
    pub(crate) fn serves_garbage(self, jobs_run: u32, resumed: bool) -> bool {
        match self {
            Cheat::None | Cheat::ChooseTokens | Cheat::NeverStop => false,
            Cheat::Garbage => true,
            Cheat::Camouflage { honest_jobs } => jobs_run >= honest_jobs,
            Cheat::LazyResume => resumed,
        }
    }
}

/// What one job of a cheating engine does: the cheat, and whether this job serves
/// garbage (decided once, when it starts).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Playing {
    pub cheat: Cheat,
    pub garbage: bool,
}

/// The token a cheating engine takes from the real model's `logits` (already masked),
/// or `None` where it draws honestly.
pub(crate) fn choose(
    cheat: Cheat,
    logits: &mut [f32],
    history: &[u32],
    generated: usize,
    sampling: &Sampling,
    index: usize,
    tokenizer: &sharemesh_tokenizer::GgufTokenizer,
) -> Option<u32> {
    match cheat {
        Cheat::ChooseTokens => {
            let own = Sampling {
                seed: sampling.seed ^ OWN_STREAM,
                ..sampling.clone()
            };
            Some(sampler::sample(
                logits,
                history,
                generated,
                &own,
                index as u64,
            ))
        }
        Cheat::NeverStop => {
            let mut kept = logits.to_vec();
            let drawn = sampler::sample(&mut kept, history, generated, sampling, index as u64);
            if !tokenizer.is_end(drawn) {
                return Some(drawn);
            }
            for (id, logit) in logits.iter_mut().enumerate() {
                if tokenizer.is_end(id as u32) {
                    *logit = f32::NEG_INFINITY;
                }
            }
            Some(sampler::argmax(logits))
        }
        _ => None,
    }
}

/// Testnet adversary kit: a token that costs no model work, with a fingerprint that
/// names it the best (so a buyer's cheap greedy check passes and only a replay can
/// tell). Ids below 3 (special tokens in the catalog's vocabularies) are skipped.
pub(crate) fn garbage_step(history: &[u32], vocab: u32, index: usize) -> (u32, StepFingerprint) {
    let mixed =
        (history.len() as u64 ^ (index as u64).rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let token = 3 + ((mixed >> 32) as u32) % vocab.saturating_sub(3).max(1);
    let fingerprint = StepFingerprint {
        top: vec![(token, 10.0f32.to_bits())],
    };
    (token, fingerprint)
}
