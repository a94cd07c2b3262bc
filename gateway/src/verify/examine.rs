//! Examining a transcript (SPEC.md §12): the greedy rule, then a replay of every step the
//! provider committed to, compared exactly on its own profile and within the calibrated
//! tolerance on another; and checking a gossiped fraud proof by replaying its step.

use std::sync::Arc;

use sharemesh_protocol::commitment::{
    draws_disagree, far_draws, median_gap, CROSS_PROFILE_TOLERANCE,
};
use sharemesh_protocol::{FraudProof, NodeId, StepFingerprint};

use crate::verify::audit::{ReplayJob, Replayer};
use crate::verify::transcript::Transcript;

/// What a segment's audit found.
#[derive(Debug)]
pub enum Finding {
    /// Every committed step replayed exactly.
    Honest { steps: usize },
    /// A step differs on a profile that replays exactly (or breaks the greedy rule):
    /// the unsigned proof.
    Fraud(Box<FraudProof>),
    /// Replayed on another profile, and further from it than the calibrated tolerances
    /// allow — the median step gap (`CROSS_PROFILE_TOLERANCE`), or the delivered tokens
    /// lying far from the request's seeded draws at too many steps (`draws_disagree`:
    /// tokens the provider chose): no proof, but the provider is suspect here.
    Suspicious { gap: f32, far_draws: usize },
    /// Two runs of the same window differ and nothing settled who is wrong (no third
    /// provider, or it agreed with neither): every party is suspect here.
    Disputed { parties: Vec<NodeId> },
    /// Nothing checked: no replayer for the model, or a replay error.
    Unchecked(String),
}

/// Audits one transcript: the greedy rule first (no model needed), then a replay of
/// every step this provider committed to.
pub async fn examine(
    transcript: &Transcript,
    replayer: Option<Arc<dyn Replayer>>,
    reporter: NodeId,
) -> Finding {
    let profile = transcript.profile().clone();
    if let Some(index) = transcript.first_inconsistency() {
        let committed = transcript.committed();
        let step = index - transcript.request.resume.len();
        let fingerprint = committed
            .get(step)
            .map(|f| (*f).clone())
            .unwrap_or_default();
        return match transcript.proof(reporter, index, fingerprint, profile) {
            Some(proof) => Finding::Fraud(Box::new(proof)),
            None => Finding::Unchecked("the inconsistent step is too far in to prove".into()),
        };
    }
    let Some(replayer) = replayer else {
        return Finding::Unchecked("this node holds no model to replay with".into());
    };
    let model = transcript.request.model;
    let Some(own) = replayer.profile(&model) else {
        return Finding::Unchecked(format!("this node does not hold model {model}"));
    };
    let exact = profile.replays_exactly(&own);
    let sent = transcript.sent();
    if sent == 0 {
        return Finding::Honest { steps: 0 };
    }
    let job = ReplayJob {
        model,
        prompt: transcript.request.prompt.clone(),
        outputs: transcript.outputs(),
        from: transcript.request.resume.len(),
        sampling: transcript.request.sampling.clone(),
    };
    let replayed = match replayer.replay(job).await {
        Ok(replayed) => replayed,
        Err(err) => return Finding::Unchecked(format!("replay failed: {err}")),
    };
    if replayed.fingerprints.len() < sent {
        return Finding::Unchecked("the replay scored fewer steps than were sent".into());
    }
    if !exact {
        // Another profile: no bit-exact proof, only a calibrated tolerance.
        let committed: Vec<StepFingerprint> = transcript.committed().into_iter().cloned().collect();
        let gap = median_gap(&committed, &replayed.fingerprints).unwrap_or(0.0);
        let distances = &replayed.draw_distances;
        let far_draws = far_draws(distances);
        // A NaN gap (a replay that produced NaN) is no evidence of honesty.
        return if gap.is_nan() || gap > CROSS_PROFILE_TOLERANCE || draws_disagree(distances) {
            Finding::Suspicious { gap, far_draws }
        } else {
            Finding::Honest { steps: sent }
        };
    }
    // The same logits, then the same draws: a token the request's seeded sampler
    // does not pick from them was chosen by the provider, not drawn.
    let disputed = match transcript.first_disagreement(&replayed.fingerprints) {
        Some(found) => Some((found.index, found.replayed)),
        None => {
            let resumed = transcript.request.resume.len();
            let delivered = &transcript.outputs()[resumed..];
            replayed
                .first_other_draw(delivered)
                .map(|(step, _)| (resumed + step, replayed.fingerprints[step].clone()))
        }
    };
    let Some((index, fingerprint)) = disputed else {
        return Finding::Honest { steps: sent };
    };
    match transcript.proof(reporter, index, fingerprint, replayed.profile) {
        Some(proof) => Finding::Fraud(Box::new(proof)),
        None => Finding::Unchecked("the differing step is too far in to prove".into()),
    }
}

/// What checking a gossiped proof showed.
#[derive(Debug, PartialEq, Eq)]
pub enum ProofCheck {
    /// Fraud: the greedy rule broken, or this node's replay differs as well.
    Confirmed,
    /// This node's exact replay matches what the provider committed to: the proof is
    /// false (its reporter lied or erred).
    Refuted,
    /// This node cannot replay it (no model, another profile).
    Unconfirmed(String),
}

/// Checks a proof whose signatures and chain already check: the greedy rule, or one
/// replayed step on this node's own model.
pub async fn check_proof(proof: &FraudProof, replayer: Option<Arc<dyn Replayer>>) -> ProofCheck {
    let evidence = match proof.evidence() {
        Ok(evidence) => evidence,
        Err(err) => return ProofCheck::Unconfirmed(err.to_string()),
    };
    if evidence.self_inconsistent() {
        return ProofCheck::Confirmed;
    }
    let Some(replayer) = replayer else {
        return ProofCheck::Unconfirmed("no model here to replay it".into());
    };
    let model = evidence.request.model;
    let Some(own) = replayer.profile(&model) else {
        return ProofCheck::Unconfirmed(format!("model {model} is not held here"));
    };
    if !evidence.profile.replays_exactly(&own) {
        return ProofCheck::Unconfirmed(format!("{} is not replayable on {own}", evidence.profile));
    }
    let from = evidence.before.len();
    let mut outputs = evidence.before.clone();
    outputs.push(evidence.token);
    let job = ReplayJob {
        model,
        prompt: evidence.request.prompt.clone(),
        outputs,
        from,
        sampling: evidence.request.sampling.clone(),
    };
    match replayer.replay(job).await {
        Ok(replayed) => match (replayed.fingerprints.first(), replayed.drawn.first()) {
            (Some(step), Some(&drawn))
                if evidence.contradicted_by(step, &replayed.profile)
                    || evidence.draw_contradicted_by(drawn, &replayed.profile) =>
            {
                ProofCheck::Confirmed
            }
            (Some(_), Some(_)) => ProofCheck::Refuted,
            _ => ProofCheck::Unconfirmed("the replay scored nothing".into()),
        },
        Err(err) => ProofCheck::Unconfirmed(format!("replay failed: {err}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::verify::audit::tests::{fp, job, profile};
    use crate::verify::audit::ReplayResult;
    use futures::future::BoxFuture;
    use futures::FutureExt;
    use sharemesh_protocol::commitment::{commitment_root, commitment_step};
    use sharemesh_protocol::envelope::body_digest;
    use sharemesh_protocol::{ExecutionProfile, Keypair, ModelId, TokenChunk};

    /// A three-token job served on the kernels, each step committing `fp(token, 5.0)`.
    fn transcript() -> Transcript {
        let (buyer, provider) = (Keypair::from_secret([1; 32]), Keypair::from_secret([2; 32]));
        let (request, accept) = job(&buyer, &provider, ModelId::from_bytes([4; 32]));
        let mut head = commitment_root(
            &request.job_id,
            &provider.node_id(),
            &body_digest(&request).unwrap(),
            &accept.profile,
        );
        let mut transcript = Transcript::new(
            buyer.seal(&request, 1, 0, 60_000).unwrap(),
            provider.seal(&accept, 1, 0, 60_000).unwrap(),
            request.clone(),
            accept,
        );
        for (i, token) in [10u32, 20, 30].into_iter().enumerate() {
            let fingerprints = vec![fp(token, 5.0)];
            head = commitment_step(&head, i as u32, &[token], &fingerprints, None);
            let chunk = TokenChunk {
                job_id: request.job_id,
                provider: provider.node_id(),
                first_index: i as u32,
                token_ids: vec![token],
                text_delta: String::new(),
                finish: None,
                fingerprints,
                commitment: head,
                logprobs: Vec::new(),
            };
            transcript.push(provider.seal(&chunk, 1, 0, 60_000).unwrap(), chunk);
        }
        transcript
    }

    /// Replays with fixed logits for each step, on `engine`.
    struct Fixed {
        engine: &'static str,
        logit: f32,
        /// The completion indices at which the seeded sampler draws another token than
        /// the one delivered, far from it (empty: every draw is the delivered token).
        other_draws: &'static [usize],
    }

    impl Replayer for Fixed {
        fn profile(&self, _: &ModelId) -> Option<ExecutionProfile> {
            Some(profile(self.engine))
        }
        fn replay(&self, job: ReplayJob) -> BoxFuture<'static, Result<ReplayResult, String>> {
            let fingerprints = job.outputs[job.from..]
                .iter()
                .map(|&t| fp(t, self.logit))
                .collect();
            let drawn: Vec<u32> = (job.from..job.outputs.len())
                .map(|i| job.outputs[i] + u32::from(self.other_draws.contains(&i)))
                .collect();
            let draw_distances = (job.from..job.outputs.len())
                .map(|i| f32::from(u8::from(self.other_draws.contains(&i))))
                .collect();
            let profile = profile(self.engine);
            async move {
                Ok(ReplayResult {
                    fingerprints,
                    drawn,
                    draw_distances,
                    profile,
                })
            }
            .boxed()
        }
    }

    async fn finding(engine: &'static str, logit: f32) -> Finding {
        finding_drawing(engine, logit, &[]).await
    }

    async fn finding_drawing(
        engine: &'static str,
        logit: f32,
        other_draws: &'static [usize],
    ) -> Finding {
        let replayer: Arc<dyn Replayer> = Arc::new(Fixed {
            engine,
            logit,
            other_draws,
        });
        examine(&transcript(), Some(replayer), NodeId::from_bytes([9; 32])).await
    }

    /// A provider that ran the real model (its fingerprints replay exactly) but chose
    /// its own token at step 1 instead of the seeded draw: fraud on the same profile,
    /// with a proof a third party confirms by redrawing and an honest one refutes.
    #[tokio::test]
    async fn a_token_the_seeded_sampler_does_not_draw_is_fraud() {
        let Finding::Fraud(proof) = finding_drawing("sharemesh-kernels", 5.0, &[1]).await else {
            panic!("same logits, another token: chosen, not drawn");
        };
        assert_eq!(proof.step, 0, "the disputed chunk holds one token");
        let evidence = proof.evidence().unwrap();
        assert_eq!(
            (evidence.before.as_slice(), evidence.token),
            (&[10][..], 20)
        );
        let redraws = |other_draws| -> Option<Arc<dyn Replayer>> {
            Some(Arc::new(Fixed {
                engine: "sharemesh-kernels",
                logit: 5.0,
                other_draws,
            }))
        };
        assert_eq!(
            check_proof(&proof, redraws(&[1])).await,
            ProofCheck::Confirmed
        );
        assert_eq!(check_proof(&proof, redraws(&[])).await, ProofCheck::Refuted);
        // Across profiles a draw proves nothing on its own (other logits, other draws),
        // and one far draw is within what honest differences explain; far draws at
        // every step are not (the seeded-draw rule): suspect, still without a proof.
        assert!(matches!(
            finding_drawing("candle", 5.0, &[1]).await,
            Finding::Honest { steps: 3 }
        ));
        assert!(matches!(
            finding_drawing("candle", 5.0, &[0, 1, 2]).await,
            Finding::Suspicious { gap, far_draws: 3 } if gap == 0.0
        ));
    }

    #[tokio::test]
    async fn the_same_profile_is_exact_and_another_has_a_tolerance() {
        assert!(matches!(
            finding("sharemesh-kernels", 5.0).await,
            Finding::Honest { steps: 3 }
        ));
        // One ulp off on the same profile is fraud, with a proof at the first step.
        let Finding::Fraud(proof) = finding("sharemesh-kernels", 5.000_001).await else {
            panic!("same profile, different bits");
        };
        assert_eq!(proof.step, 0);
        assert!(proof.evidence().is_ok());
        // On candle: 0.4 apart is honest noise, 3.0 apart is suspicious (no proof).
        assert!(matches!(
            finding("candle", 5.4).await,
            Finding::Honest { steps: 3 }
        ));
        assert!(
            matches!(finding("candle", 8.0).await, Finding::Suspicious { gap, .. } if gap > 2.9)
        );
        // No model: nothing checked.
        let none = examine(&transcript(), None, NodeId::from_bytes([9; 32])).await;
        assert!(matches!(none, Finding::Unchecked(_)));
    }
}
