//! Settling a dispute between two runs of a window: third providers re-run it, and
//! whoever they all contradict gets a fraud proof cut from its own signed chunks; and
//! planted windows, whose answer two providers already agreed on.
//!
//! A conviction needs every tie-breaker drawn to agree, and two are drawn when there
//! are two to draw: a ring of colluders that serves one wrong answer cannot have one of
//! its members outvote an honest verifier alone (SPEC.md §12).

use std::sync::Arc;

use rand::seq::IndexedRandom;
use sharemesh_mesh::orderbook::BookEntry;
use sharemesh_protocol::{ExecutionProfile, JobRequest, NodeId, StepFingerprint};

use super::{compare, proof_finding, Comparison, Known, Outsourcing, Ran};
use crate::verify::examine::Finding;
use crate::verify::transcript::Transcript;

/// Tie-breakers drawn for a dispute when there are that many to draw.
pub const TIE_BREAKERS: usize = 2;

/// Which of two differing runs a third provider agreed with.
enum Side {
    A,
    /// The second, with the third provider's id.
    B(NodeId),
    Neither,
}

impl Outsourcing {
    /// Up to [`TIE_BREAKERS`] providers (none of `excluded`, each another) re-run
    /// `request`'s window after `prefix` to `end` on `profile`; what each signed, or
    /// `None` when none could be drawn or any drawn one did not finish on the profile
    /// (a tie-breaker that refuses must not leave the verdict to the other alone).
    async fn tie_breaks(
        &self,
        live: &[Arc<BookEntry>],
        request: &JobRequest,
        profile: &ExecutionProfile,
        (prefix, end): (&[u32], usize),
        excluded: &[NodeId],
    ) -> Option<Vec<Ran>> {
        let cap = self.price_cap(live, &request.model, None);
        let mut excluded = excluded.to_vec();
        let mut thirds = Vec::new();
        while thirds.len() < TIE_BREAKERS {
            let Some(third) = self.choose(live, &request.model, profile, &excluded, cap) else {
                break;
            };
            excluded.push(third.0.advert.provider);
            thirds.push(third);
        }
        if thirds.is_empty() {
            return None;
        }
        let runs = thirds
            .iter()
            .map(|third| self.run_window(third, request, prefix, end));
        let mut ties = Vec::new();
        for tie in futures::future::join_all(runs).await {
            ties.push(
                tie.ok()
                    .filter(|t| profile.replays_exactly(t.transcript.profile()))?,
            );
        }
        Some(ties)
    }

    /// Third providers (none of `excluded`) re-run `request`'s window after `prefix` to
    /// `end`, where two runs `a` and `b` first differ at `step`: which of them they all
    /// agree with up to that step (`Neither` when they do not all agree with one;
    /// `None`: no third provider, or one could not run it on the same profile).
    #[allow(clippy::too_many_arguments)]
    async fn tie_break(
        &self,
        live: &[Arc<BookEntry>],
        request: &JobRequest,
        profile: &ExecutionProfile,
        (prefix, end, step): (&[u32], usize, usize),
        a: &[(u32, StepFingerprint)],
        b: &[(u32, StepFingerprint)],
        excluded: &[NodeId],
    ) -> Option<Side> {
        let ties = self
            .tie_breaks(live, request, profile, (prefix, end), excluded)
            .await?;
        let upto = step + 1;
        let agree = |run: &[(u32, StepFingerprint)], tie: &Ran| {
            run.len() >= upto
                && tie.steps.len() >= upto
                && compare(&run[..upto], &tie.steps[..upto]) == Comparison::Same(upto)
        };
        let with_a = ties.iter().all(|t| agree(a, t) && !agree(b, t));
        let with_b = ties.iter().all(|t| agree(b, t) && !agree(a, t));
        Some(match (with_a, with_b) {
            (true, false) => Side::A,
            (false, true) => Side::B(ties[0].transcript.provider()),
            _ => Side::Neither,
        })
    }

    /// Third providers re-run a window whose verifier ended at `step` where the
    /// audited provider went on. All ending there too convicts the audited provider: its
    /// token at that step is not what the request's seeded sampler draws (an end
    /// token), which any holder of the model confirms by redrawing. Going on as the
    /// audited provider did leaves the verifier suspect (a stop carries no token to
    /// prove anything with); anything else leaves both suspect.
    pub(super) async fn settle_end(
        &self,
        audited: &Transcript,
        expected: &[(u32, StepFingerprint)],
        (first, from, end, step): (Ran, usize, usize, usize),
        live: &[Arc<BookEntry>],
        reporter: NodeId,
    ) -> Finding {
        let provider = audited.provider();
        let verifier = first.transcript.provider();
        let outputs = audited.outputs();
        let profile = audited.profile();
        let excluded = [provider, verifier, reporter];
        let prefix = &outputs[..from];
        let ties = self
            .tie_breaks(live, &audited.request, profile, (prefix, end), &excluded)
            .await;
        let Some(ties) = ties else {
            return Finding::Disputed {
                parties: vec![provider, verifier],
            };
        };
        let ended_too = ties.iter().all(|tie| {
            tie.stopped
                && compare(&first.steps, &tie.steps) == Comparison::Same(step)
                && tie.steps.len() == step
        });
        let went_on = ties
            .iter()
            .all(|tie| compare(&expected[..=step], &tie.steps) == Comparison::Same(step + 1));
        if ended_too {
            proof_finding(audited.proof(
                reporter,
                from + step,
                expected[step].1.clone(),
                first.transcript.profile().clone(),
            ))
        } else if went_on {
            Finding::Disputed {
                parties: vec![verifier],
            }
        } else {
            Finding::Disputed {
                parties: vec![provider, verifier],
            }
        }
    }

    /// Third providers re-run the disputed window; whoever they all contradict gets
    /// the proof.
    pub(super) async fn settle(
        &self,
        audited: &Transcript,
        expected: &[(u32, StepFingerprint)],
        first: Ran,
        (from, end, step): (usize, usize, usize),
        live: &[Arc<BookEntry>],
        reporter: NodeId,
    ) -> Finding {
        let provider = audited.provider();
        let verifier = first.transcript.provider();
        let outputs = audited.outputs();
        let prefix = &outputs[..from];
        let side = self
            .tie_break(
                live,
                &audited.request,
                audited.profile(),
                (prefix, end, step),
                expected,
                &first.steps,
                &[provider, verifier, reporter],
            )
            .await;
        let index = from + step;
        match side {
            Some(Side::B(third)) => {
                // A planted mismatch for later: the right answer to this window is not
                // what its provider committed to, so a verifier that echoes a provider
                // (or says "ok" to anything) fails it.
                self.remember(Known {
                    request: audited.request.clone(),
                    prefix: prefix.to_vec(),
                    steps: first.steps[..=step].to_vec(),
                    parties: [verifier, third],
                });
                proof_finding(audited.proof(
                    reporter,
                    index,
                    first.steps[step].1.clone(),
                    first.transcript.profile().clone(),
                ))
            }
            Some(Side::A) => {
                self.count(|s| s.verifiers_caught += 1);
                proof_finding(first.transcript.proof(
                    reporter,
                    index,
                    expected[step].1.clone(),
                    audited.profile().clone(),
                ))
            }
            Some(Side::Neither) | None => Finding::Disputed {
                parties: vec![provider, verifier],
            },
        }
    }

    /// Sends a provider of a known window's model (not one of the two that agreed on
    /// it) that window again under a fresh job id; `None` when there is nothing to
    /// plant or nobody to plant it on, a proof against the provider if it answers
    /// otherwise.
    pub async fn plant(&self, live: &[Arc<BookEntry>], reporter: NodeId) -> Option<Finding> {
        let known = {
            let windows = self.known.lock().ok()?;
            windows
                .iter()
                .collect::<Vec<_>>()
                .choose(&mut rand::rng())
                .map(|k| (*k).clone())?
        };
        let profile = self.profiles.lock().ok()?.get(&known.parties[0]).cloned()?;
        let excluded = [known.parties[0], known.parties[1], reporter];
        let cap = self.price_cap(live, &known.request.model, None);
        let verifier = self.choose(live, &known.request.model, &profile, &excluded, cap)?;
        self.count(|s| s.canaries_sent += 1);
        let from = known.prefix.len();
        let end = from + known.steps.len();
        let ran = self
            .run_window(&verifier, &known.request, &known.prefix, end)
            .await
            .ok()?;
        if !profile.replays_exactly(ran.transcript.profile()) {
            return None;
        }
        let verifier = ran.transcript.provider();
        match compare(&known.steps, &ran.steps) {
            Comparison::Same(_) | Comparison::Ended(_) => Some(Finding::Honest { steps: 0 }),
            Comparison::Diverged(step) | Comparison::Differs(step) => {
                // The verifier is wrong, or the two that agreed on the window were
                // (colluders): a third provider settles it before anyone is convicted.
                let excluded = [known.parties[0], known.parties[1], verifier, reporter];
                let side = self
                    .tie_break(
                        live,
                        &known.request,
                        &profile,
                        (&known.prefix, end, step),
                        &known.steps,
                        &ran.steps,
                        &excluded,
                    )
                    .await;
                Some(match side {
                    Some(Side::A) => {
                        self.count(|s| s.verifiers_caught += 1);
                        proof_finding(ran.transcript.proof(
                            reporter,
                            from + step,
                            known.steps[step].1.clone(),
                            profile,
                        ))
                    }
                    Some(Side::B(_)) => {
                        // The pair agreed on a wrong answer: the window is forgotten and
                        // both are suspect.
                        self.forget(&known);
                        Finding::Disputed {
                            parties: known.parties.to_vec(),
                        }
                    }
                    Some(Side::Neither) | None => Finding::Disputed {
                        parties: vec![verifier, known.parties[0], known.parties[1]],
                    },
                })
            }
        }
    }
}
