//! What a provider signed for one job, as the buyer received it: the request the buyer
//! signed, the provider's `Accept` (its execution profile) and every chunk with its
//! fingerprints and commitment. Verification replays it; a fraud proof is cut from it.

use sharemesh_protocol::fraud::MAX_PROOF_LINKS;
use sharemesh_protocol::{
    Accept, ChainLink, ExecutionProfile, FraudProof, JobRequest, NodeId, SignedEnvelope,
    StepFingerprint, TokenChunk,
};

#[derive(Clone, Debug)]
pub struct Transcript {
    pub sealed_request: SignedEnvelope,
    pub sealed_accept: SignedEnvelope,
    pub request: JobRequest,
    pub accept: Accept,
    /// Each chunk as signed, with its decoded body.
    pub chunks: Vec<(SignedEnvelope, TokenChunk)>,
}

/// Where a replay first disagreed with what the provider committed to.
#[derive(Clone, Debug, PartialEq)]
pub struct Disagreement {
    /// Completion index of the step.
    pub index: usize,
    pub replayed: StepFingerprint,
}

impl Transcript {
    pub fn new(
        sealed_request: SignedEnvelope,
        sealed_accept: SignedEnvelope,
        request: JobRequest,
        accept: Accept,
    ) -> Self {
        Self {
            sealed_request,
            sealed_accept,
            request,
            accept,
            chunks: Vec::new(),
        }
    }

    pub fn push(&mut self, sealed: SignedEnvelope, chunk: TokenChunk) {
        self.chunks.push((sealed, chunk));
    }

    pub fn provider(&self) -> NodeId {
        self.accept.provider
    }

    pub fn profile(&self) -> &ExecutionProfile {
        &self.accept.profile
    }

    /// Every completion token: the resumed prefix, then this provider's.
    pub fn outputs(&self) -> Vec<u32> {
        let mut outputs = self.request.resume.clone();
        for (_, chunk) in &self.chunks {
            outputs.extend_from_slice(&chunk.token_ids);
        }
        outputs
    }

    /// The fingerprints this provider committed to, one per token it sent.
    pub fn committed(&self) -> Vec<&StepFingerprint> {
        self.chunks
            .iter()
            .flat_map(|(_, chunk)| chunk.fingerprints.iter())
            .collect()
    }

    /// Tokens this provider sent.
    pub fn sent(&self) -> usize {
        self.chunks.iter().map(|(_, c)| c.token_ids.len()).sum()
    }

    /// The first step whose committed fingerprint differs from `replayed` (one per
    /// token this provider sent, in order).
    pub fn first_disagreement(&self, replayed: &[StepFingerprint]) -> Option<Disagreement> {
        let resumed = self.request.resume.len();
        self.committed()
            .into_iter()
            .zip(replayed)
            .position(|(committed, replayed)| committed != replayed)
            .map(|step| Disagreement {
                index: resumed + step,
                replayed: replayed[step].clone(),
            })
    }

    /// The first greedy step whose token is not the best of its own committed logits:
    /// fraud provable without the model.
    pub fn first_inconsistency(&self) -> Option<usize> {
        if !self.request.sampling.greedy_rule_applies() {
            return None;
        }
        let resumed = self.request.resume.len();
        self.chunks
            .iter()
            .flat_map(|(_, chunk)| chunk.token_ids.iter().zip(&chunk.fingerprints))
            .position(|(&token, fingerprint)| fingerprint.best_token() != Some(token))
            .map(|step| resumed + step)
    }

    /// A fraud proof for the step at completion `index`, signed by nobody yet.
    /// `None` when the index is not a step this provider sent or the proof would be
    /// too long to gossip.
    pub fn proof(
        &self,
        reporter: NodeId,
        index: usize,
        replayed: StepFingerprint,
        replay_profile: ExecutionProfile,
    ) -> Option<FraudProof> {
        let mut first = self.request.resume.len();
        let mut earlier = Vec::new();
        for (sealed, chunk) in &self.chunks {
            let end = first + chunk.token_ids.len();
            if index < end {
                return Some(FraudProof {
                    reporter,
                    provider: self.provider(),
                    job_id: self.request.job_id,
                    request: self.sealed_request.clone(),
                    accept: self.sealed_accept.clone(),
                    earlier,
                    disputed: sealed.clone(),
                    step: u32::try_from(index - first).ok()?,
                    replayed,
                    replay_profile,
                });
            }
            if earlier.len() >= MAX_PROOF_LINKS {
                return None;
            }
            earlier.push(ChainLink::of(chunk));
            first = end;
        }
        None
    }
}
