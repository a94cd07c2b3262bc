//! What a buyer checks of a provider's answer without the model: the accepted terms,
//! each chunk's place in the stream and in the commitment chain, the greedy rule, and
//! log-probabilities against the committed logits.

use sharemesh_protocol::commitment::commitment_step;
use sharemesh_protocol::{Accept, Digest, JobRequest, TokenChunk};

pub(super) fn preview(text: &str) -> String {
    text.chars().take(40).collect()
}

/// Why an `Accept` was not taken.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum AcceptProblem {
    /// Terms the buyer did not ask for (another key, job, price, profile or count).
    Mismatch(String),
    /// Without the model's vocabulary, a prompt count above the prompt's token bound:
    /// perhaps honest (a template's own text — a long default system prompt — is not in
    /// the bound), so not yet a finding: counted again once the vocabulary is here.
    Uncounted { bound: u64, claim: u32 },
}

/// The terms a provider accepted on, checked against the request: signed by the
/// provider the request was addressed to (whose key the stream's peer proved), the
/// same job, a price within the ceiling, a closed execution profile, and the prompt
/// count the buyer counted itself (without a vocabulary: within the prompt's token
/// bound). An `Accept` under another key would have the chunks, receipts and any fraud
/// proof bound to a throwaway identity while the real one kept its standing.
pub(super) fn check_accept(
    accept: &Accept,
    request: &JobRequest,
    counted: Option<u32>,
) -> Result<(), AcceptProblem> {
    if accept.provider != request.provider {
        return Err(AcceptProblem::Mismatch(format!(
            "accepted by {} for a request addressed to {}",
            accept.provider, request.provider
        )));
    }
    if let Err(why) = accept.profile.validate() {
        return Err(AcceptProblem::Mismatch(format!(
            "execution profile {}: {why}",
            accept.profile
        )));
    }
    if accept.job_id != request.job_id || accept.price_per_token > request.max_price_per_token {
        return Err(AcceptProblem::Mismatch(format!(
            "job {} at {} nano-USD/token (asked: job {}, at most {})",
            accept.job_id, accept.price_per_token.0, request.job_id, request.max_price_per_token.0
        )));
    }
    if let Some(counted) = counted {
        if accept.prompt_tokens != counted {
            let claim = accept.prompt_tokens;
            return Err(AcceptProblem::Mismatch(format!(
                "a prompt of {counted} tokens billed as {claim}"
            )));
        }
        return Ok(());
    }
    let bound = request.prompt.token_bound();
    if u64::from(accept.prompt_tokens) > bound {
        return Err(AcceptProblem::Uncounted {
            bound,
            claim: accept.prompt_tokens,
        });
    }
    Ok(())
}

/// The chunk extends the commitment chain from `head`, and, where decoding was greedy
/// without penalties, each token is the best of the logits it committed to (a
/// provider-signed chunk that breaks this is fraud whatever the model).
pub(super) fn check_commitment(
    chunk: &TokenChunk,
    request: &JobRequest,
    head: &Digest,
) -> Result<(), String> {
    let link = commitment_step(
        head,
        chunk.first_index,
        &chunk.token_ids,
        &chunk.fingerprints,
        chunk.finish,
    );
    if link != chunk.commitment {
        return Err("the chunk's commitment does not extend the chain".into());
    }
    if request.sampling.greedy_rule_applies() {
        for (step, (&token, fingerprint)) in
            chunk.token_ids.iter().zip(&chunk.fingerprints).enumerate()
        {
            if fingerprint.best_token() != Some(token) {
                return Err(format!(
                    "greedy token {token} at index {} is not the best of its own logits",
                    chunk.first_index as usize + step
                ));
            }
        }
    }
    Ok(())
}

/// What a chunk claims, checked against what the buyer can count itself: it continues
/// exactly where the last one ended (after the resumed prefix), stays within
/// `max_tokens`, and carries text only with tokens (a chunk with neither tokens nor an
/// end would only reset the stall timer).
pub(super) fn check_chunk(
    chunk: &TokenChunk,
    request: &JobRequest,
    received: u64,
) -> Result<(), String> {
    let next = request.resume.len() as u64 + received;
    if u64::from(chunk.first_index) != next {
        return Err(format!(
            "a chunk at index {} where {next} was next",
            chunk.first_index
        ));
    }
    let total = next + chunk.token_ids.len() as u64;
    if total > u64::from(request.sampling.max_tokens) {
        return Err(format!(
            "{total} completion tokens, more than max_tokens {}",
            request.sampling.max_tokens
        ));
    }
    if chunk.token_ids.is_empty() && !chunk.text_delta.is_empty() {
        return Err("text without tokens".into());
    }
    if chunk.token_ids.is_empty() && chunk.finish.is_none() {
        return Err("a chunk with neither tokens nor an end".into());
    }
    check_logprobs(chunk, request)
}

/// Log-probabilities only when asked for, one per token, at most the alternatives asked
/// for, and consistent with the committed fingerprint: every token both list must sit
/// the same distance below its raw logit (that distance is the log of the softmax's
/// normaliser), so they cannot be made up apart from the logits the provider committed.
fn check_logprobs(chunk: &TokenChunk, request: &JobRequest) -> Result<(), String> {
    let Some(top) = request.sampling.logprobs else {
        return match chunk.logprobs.is_empty() {
            true => Ok(()),
            false => Err("log-probabilities nobody asked for".into()),
        };
    };
    if chunk.logprobs.len() != chunk.token_ids.len() {
        return Err(format!(
            "{} log-probabilities for {} tokens",
            chunk.logprobs.len(),
            chunk.token_ids.len()
        ));
    }
    let steps = chunk
        .token_ids
        .iter()
        .zip(&chunk.logprobs)
        .zip(&chunk.fingerprints);
    for ((&token, logprobs), fingerprint) in steps {
        if logprobs.top.len() > usize::from(top) {
            return Err(format!(
                "{} alternatives, {top} asked for",
                logprobs.top.len()
            ));
        }
        let listed = std::iter::once((token, logprobs.logprob)).chain(logprobs.top.iter().copied());
        let mut normaliser: Option<f32> = None;
        for (id, logprob) in listed {
            let Some(&(_, logit)) = fingerprint.top.iter().find(|(t, _)| *t == id) else {
                continue;
            };
            let distance = f32::from_bits(logit) - f32::from_bits(logprob);
            match normaliser {
                None => normaliser = Some(distance),
                Some(first) if (distance - first).abs() > 1e-3 * first.abs().max(1.0) => {
                    return Err(format!(
                        "the log-probability of token {id} does not follow from its committed logit"
                    ))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sharemesh_protocol::{
        FinishReason, JobId, Keypair, ModelId, NanoUsd, Prompt, Sampling, StepFingerprint, Tier,
    };

    fn request(resume: usize, max_tokens: u32) -> JobRequest {
        let key = Keypair::from_secret([3; 32]);
        JobRequest {
            job_id: JobId::from_bytes([1; 16]),
            buyer: key.node_id(),
            provider: key.node_id(),
            model: ModelId::from_bytes([2; 32]),
            prompt: Prompt::Text("hi".into()),
            sampling: Sampling {
                max_tokens,
                ..Sampling::default()
            },
            max_price_per_token: NanoUsd(1),
            tier: Tier::OnDemand,
            deadline_ms: 0,
            resume: vec![7; resume],
            audit_commitment: Digest::from_bytes([0; 32]),
        }
    }

    fn chunk(
        first_index: u32,
        ids: &[u32],
        text: &str,
        finish: Option<FinishReason>,
    ) -> TokenChunk {
        let request = request(0, 1);
        TokenChunk {
            job_id: request.job_id,
            provider: request.provider,
            first_index,
            token_ids: ids.to_vec(),
            text_delta: text.into(),
            finish,
            fingerprints: ids
                .iter()
                .map(|&id| StepFingerprint {
                    top: vec![(id, 1.0f32.to_bits())],
                })
                .collect(),
            commitment: Digest::from_bytes([0; 32]),
            logprobs: Vec::new(),
        }
    }

    fn accept(request: &JobRequest, provider: sharemesh_protocol::NodeId) -> Accept {
        Accept {
            job_id: request.job_id,
            provider,
            price_per_token: request.max_price_per_token,
            prompt_tokens: 2,
            credit_window_tokens: 16,
            profile: sharemesh_protocol::ExecutionProfile {
                engine: "sharemesh-kernels".into(),
                version: "3".into(),
                isa: "avx2".into(),
                quantization: "Q4_1".into(),
                device: "cpu".into(),
            },
        }
    }

    fn mismatch(problem: AcceptProblem) -> String {
        match problem {
            AcceptProblem::Mismatch(why) => why,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_accept_must_come_from_the_addressed_provider_with_a_known_profile() {
        let job = request(0, 4);
        assert!(check_accept(&accept(&job, job.provider), &job, Some(2)).is_ok());
        let alias = Keypair::from_secret([9; 32]).node_id();
        let aliased = mismatch(check_accept(&accept(&job, alias), &job, Some(2)).unwrap_err());
        assert!(aliased.contains("addressed to"), "{aliased}");
        let mut foreign = accept(&job, job.provider);
        foreign.profile.device = "cuda ".into();
        let profile = mismatch(check_accept(&foreign, &job, Some(2)).unwrap_err());
        assert!(profile.contains("profile.device"), "{profile}");
    }

    /// With the vocabulary the count is exact; without it a count above the token
    /// bound is not yet a finding (a template's own text may be that long).
    #[test]
    fn a_count_is_exact_with_the_vocabulary_and_unsettled_above_the_bound_without() {
        let job = request(0, 4);
        let mut over = accept(&job, job.provider);
        over.prompt_tokens = 3;
        let wrong = mismatch(check_accept(&over, &job, Some(2)).unwrap_err());
        assert!(
            wrong.contains("a prompt of 2 tokens billed as 3"),
            "{wrong}"
        );
        let bound = job.prompt.token_bound();
        over.prompt_tokens = u32::try_from(bound).unwrap();
        assert!(check_accept(&over, &job, None).is_ok());
        over.prompt_tokens += 1;
        assert_eq!(
            check_accept(&over, &job, None),
            Err(AcceptProblem::Uncounted {
                bound,
                claim: over.prompt_tokens
            })
        );
    }

    #[test]
    fn chunks_must_extend_the_chain_and_greedy_tokens_must_be_their_logits_best() {
        let job = request(0, 6);
        let head = Digest::from_bytes([7; 32]);
        let mut good = chunk(0, &[5], "a", None);
        good.commitment = commitment_step(&head, 0, &[5], &good.fingerprints, None);
        assert!(check_commitment(&good, &job, &head).is_ok());
        let other_head = Digest::from_bytes([8; 32]);
        let unlinked = check_commitment(&good, &job, &other_head).unwrap_err();
        assert!(unlinked.contains("does not extend the chain"), "{unlinked}");
        // Token 5 committed with logits whose best is 9: fraud under greedy decoding.
        let mut lying = good.clone();
        lying.fingerprints[0].top = vec![(9, 2.0f32.to_bits()), (5, 1.0f32.to_bits())];
        lying.commitment = commitment_step(&head, 0, &[5], &lying.fingerprints, None);
        let greedy = check_commitment(&lying, &job, &head).unwrap_err();
        assert!(
            greedy.contains("not the best of its own logits"),
            "{greedy}"
        );
        // Sampled decoding may pick any token.
        let mut sampled = job.clone();
        sampled.sampling.temperature = 0.7;
        assert!(check_commitment(&lying, &sampled, &head).is_ok());
    }

    #[test]
    fn chunks_must_continue_where_the_last_ended_and_stay_within_max_tokens() {
        let job = request(3, 6);
        assert!(check_chunk(&chunk(3, &[1], "a", None), &job, 0).is_ok());
        assert!(check_chunk(&chunk(5, &[1], "a", None), &job, 2).is_ok());
        assert!(check_chunk(&chunk(6, &[], "", Some(FinishReason::Length)), &job, 3).is_ok());
        let skipped = check_chunk(&chunk(4, &[1], "a", None), &job, 0).unwrap_err();
        assert!(skipped.contains("index 4 where 3"), "{skipped}");
        let repeated = check_chunk(&chunk(3, &[1], "a", None), &job, 1).unwrap_err();
        assert!(repeated.contains("where 4"), "{repeated}");
        let beyond = check_chunk(&chunk(5, &[1, 2], "ab", None), &job, 2).unwrap_err();
        assert!(beyond.contains("more than max_tokens 6"), "{beyond}");
        assert!(check_chunk(&chunk(3, &[], "free text", None), &job, 0).is_err());
        assert!(check_chunk(&chunk(3, &[], "", None), &job, 0).is_err());
    }

    #[test]
    fn logprobs_come_only_when_asked_and_must_follow_from_the_committed_logits() {
        use sharemesh_protocol::TokenLogprobs;
        let mut job = request(0, 8);
        let mut one = chunk(0, &[5], "a", None);
        // The fingerprint: token 5 at logit 3.0, token 9 at 1.0 (normaliser 3.5).
        one.fingerprints = vec![StepFingerprint {
            top: vec![(5, 3.0f32.to_bits()), (9, 1.0f32.to_bits())],
        }];
        let honest = TokenLogprobs {
            logprob: (-0.5f32).to_bits(),
            top: vec![(5, (-0.5f32).to_bits()), (9, (-2.5f32).to_bits())],
        };
        one.logprobs = vec![honest.clone()];
        let unasked = check_chunk(&one, &job, 0).unwrap_err();
        assert!(unasked.contains("nobody asked"), "{unasked}");
        job.sampling.logprobs = Some(2);
        assert!(check_chunk(&one, &job, 0).is_ok());
        // Token 9's log-probability made up: it no longer sits 3.5 below its logit.
        one.logprobs = vec![TokenLogprobs {
            top: vec![(5, (-0.5f32).to_bits()), (9, (-0.1f32).to_bits())],
            ..honest.clone()
        }];
        let made_up = check_chunk(&one, &job, 0).unwrap_err();
        assert!(made_up.contains("token 9"), "{made_up}");
        // More alternatives than asked for, or none at all when asked.
        job.sampling.logprobs = Some(1);
        one.logprobs = vec![honest];
        assert!(check_chunk(&one, &job, 0)
            .unwrap_err()
            .contains("alternatives"));
        one.logprobs.clear();
        assert!(check_chunk(&one, &job, 0)
            .unwrap_err()
            .contains("0 log-probabilities"));
    }
}
