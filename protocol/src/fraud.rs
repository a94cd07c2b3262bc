//! Fraud proofs: the provider's own signed commitments for a job, with the step at
//! which a replay on the same execution profile disagreed. Anyone can check the
//! signatures and the chain here (pure, no model); the node that holds the model then
//! replays the one disputed step to confirm (SPEC.md §12).

use serde::{Deserialize, Serialize};

use crate::commitment::{
    commitment_root, commitment_step, ExecutionProfile, StepFingerprint, FINGERPRINT_TOP_K,
};
use crate::envelope::{body_digest, SignedEnvelope, WireMessage};
use crate::error::{OpenError, ValidationError};
use crate::ids::{JobId, NodeId};
use crate::kind::MessageKind;
use crate::messages::{Accept, FinishReason, JobRequest, TokenChunk, MAX_PROMPT_TOKENS};

/// Most chunks a proof may carry before the disputed one. A proof must fit one gossip
/// message (128 KiB): auditors dispute the first step that differs, and a cheat
/// differs from its first cheated step.
pub const MAX_PROOF_LINKS: usize = 1024;
/// Largest encoded proof: what gossip carries, less the envelope.
pub const MAX_PROOF_BYTES: usize = 120 * 1024;

/// One chunk of a commitment chain without its signature: enough to recompute the
/// link (the disputed chunk's signed head covers all of them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainLink {
    pub first_index: u32,
    pub token_ids: Vec<u32>,
    pub fingerprints: Vec<StepFingerprint>,
    pub finish: Option<FinishReason>,
}

impl ChainLink {
    pub fn of(chunk: &TokenChunk) -> Self {
        Self {
            first_index: chunk.first_index,
            token_ids: chunk.token_ids.clone(),
            fingerprints: chunk.fingerprints.clone(),
            finish: chunk.finish,
        }
    }
}

/// A provider's signed commitments for one job and the step a replay disputes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FraudProof {
    pub reporter: NodeId,
    /// The accused.
    pub provider: NodeId,
    pub job_id: JobId,
    /// The buyer-signed `JobRequest`.
    pub request: SignedEnvelope,
    /// The provider-signed `Accept` (its execution profile).
    pub accept: SignedEnvelope,
    /// The chunks before the disputed one, in order.
    pub earlier: Vec<ChainLink>,
    /// The provider-signed chunk holding the disputed step.
    pub disputed: SignedEnvelope,
    /// Which token of `disputed` the replay disagrees on.
    pub step: u32,
    /// What the reporter's replay gave there, and on what.
    pub replayed: StepFingerprint,
    pub replay_profile: ExecutionProfile,
}

impl WireMessage for FraudProof {
    const KIND: MessageKind = MessageKind::FraudProof;
    const MAX_BYTES: usize = MAX_PROOF_BYTES;
    const MAX_LIFETIME_MS: u64 = 30 * 24 * 3_600_000;
    fn author(&self) -> NodeId {
        self.reporter
    }
    fn validate(&self) -> Result<(), ValidationError> {
        if self.earlier.len() > MAX_PROOF_LINKS {
            return Err(ValidationError::field(
                "earlier",
                format!("{} links, limit {MAX_PROOF_LINKS}", self.earlier.len()),
            ));
        }
        self.replayed.validate()?;
        self.replay_profile.validate()?;
        if self.reporter == self.provider {
            return Err(ValidationError::field(
                "provider",
                "a node cannot accuse itself",
            ));
        }
        Ok(())
    }
}

/// What a proof shows once its signatures and chain check.
#[derive(Clone, Debug, PartialEq)]
pub struct Evidence {
    pub request: JobRequest,
    pub profile: ExecutionProfile,
    /// Completion tokens before the disputed step (the resumed prefix included): the
    /// teacher-forced context after the prompt.
    pub before: Vec<u32>,
    /// The token the provider emitted at the disputed step.
    pub token: u32,
    /// The fingerprint it committed to there.
    pub committed: StepFingerprint,
}

impl Evidence {
    /// Greedy decoding without penalties must emit the best token of its own logits:
    /// a step that did not is fraud whatever the model, provable without it.
    pub fn self_inconsistent(&self) -> bool {
        self.request.sampling.greedy_rule_applies()
            && self.committed.best_token() != Some(self.token)
    }

    /// Whether `replayed` (a replay on `profile`) disagrees with the commitment in a
    /// way that is proof on its own: only on a profile that replays exactly.
    pub fn contradicted_by(&self, replayed: &StepFingerprint, profile: &ExecutionProfile) -> bool {
        self.profile.replays_exactly(profile) && replayed != &self.committed
    }

    /// Whether the token the request's seeded sampler draws at the disputed step (from
    /// a replay on `profile`, after `before`) is not the one the provider emitted: on a
    /// profile that replays exactly, the provider chose that token rather than drew
    /// it. The proof carries all a third party needs to redraw: the signed request's
    /// sampling (seed, temperature, top-k/p, penalties, bias, format) and the tokens
    /// before.
    pub fn draw_contradicted_by(&self, drawn: u32, profile: &ExecutionProfile) -> bool {
        self.profile.replays_exactly(profile) && drawn != self.token
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("the {part} does not open: {source}")]
    Unsigned {
        part: &'static str,
        #[source]
        source: OpenError,
    },
    #[error("the {0} names another job, provider or buyer than the proof")]
    Mismatched(&'static str),
    #[error("the chain does not lead to the disputed chunk's signed head")]
    BrokenChain,
    #[error("chunk indices do not continue (expected {expected}, found {found})")]
    Gap { expected: u64, found: u64 },
    #[error("step {step} is outside the disputed chunk ({tokens} tokens)")]
    NoSuchStep { step: u32, tokens: usize },
    #[error("the proof holds more than {MAX_PROMPT_TOKENS} tokens")]
    TooLong,
}

impl FraudProof {
    /// Checks every signature and recomputes the chain from the request to the
    /// disputed chunk. A proof that passes shows what the provider committed to; it
    /// is fraud if [`Evidence::self_inconsistent`] or a same-profile replay differs.
    pub fn evidence(&self) -> Result<Evidence, ProofError> {
        let request = open::<JobRequest>(&self.request, "request")?;
        let accept = open::<Accept>(&self.accept, "accept")?;
        let disputed = open::<TokenChunk>(&self.disputed, "disputed chunk")?;
        if request.job_id != self.job_id || request.provider != self.provider {
            return Err(ProofError::Mismatched("request"));
        }
        if accept.job_id != self.job_id || accept.provider != self.provider {
            return Err(ProofError::Mismatched("accept"));
        }
        if disputed.job_id != self.job_id || disputed.provider != self.provider {
            return Err(ProofError::Mismatched("disputed chunk"));
        }
        let request_digest = body_digest(&request).map_err(|e| ProofError::Unsigned {
            part: "request",
            source: e.into(),
        })?;
        let mut head = commitment_root(
            &self.job_id,
            &self.provider,
            &request_digest,
            &accept.profile,
        );
        let mut before = request.resume.clone();
        for link in &self.earlier {
            let expected = before.len() as u64;
            if u64::from(link.first_index) != expected {
                let found = u64::from(link.first_index);
                return Err(ProofError::Gap { expected, found });
            }
            if link.fingerprints.len() != link.token_ids.len() {
                return Err(ProofError::BrokenChain);
            }
            before.extend_from_slice(&link.token_ids);
            if before.len() > MAX_PROMPT_TOKENS {
                return Err(ProofError::TooLong);
            }
            head = commitment_step(
                &head,
                link.first_index,
                &link.token_ids,
                &link.fingerprints,
                link.finish,
            );
        }
        if u64::from(disputed.first_index) != before.len() as u64 {
            let (expected, found) = (before.len() as u64, u64::from(disputed.first_index));
            return Err(ProofError::Gap { expected, found });
        }
        let link = commitment_step(
            &head,
            disputed.first_index,
            &disputed.token_ids,
            &disputed.fingerprints,
            disputed.finish,
        );
        if link != disputed.commitment {
            return Err(ProofError::BrokenChain);
        }
        let step = self.step as usize;
        let (Some(&token), Some(committed)) = (
            disputed.token_ids.get(step),
            disputed.fingerprints.get(step),
        ) else {
            return Err(ProofError::NoSuchStep {
                step: self.step,
                tokens: disputed.token_ids.len(),
            });
        };
        before.extend_from_slice(&disputed.token_ids[..step]);
        debug_assert!(committed.top.len() <= FINGERPRINT_TOP_K);
        Ok(Evidence {
            request,
            profile: accept.profile,
            before,
            token,
            committed: committed.clone(),
        })
    }
}

/// Opens a piece of archived evidence (signature and body; no clock).
fn open<T: WireMessage>(envelope: &SignedEnvelope, part: &'static str) -> Result<T, ProofError> {
    envelope
        .open_archived::<T>()
        .map(|opened| opened.body)
        .map_err(|source| ProofError::Unsigned { part, source })
}
