//! Verification outsourced to providers (SPEC.md §12).
//!
//! A node that holds no model has a window of a sampled segment re-run by another
//! provider that holds it, as an ordinary paid job: the same prompt and sampling,
//! resumed at the window's first step and cut at its last — to the verifier it looks
//! like a failover. On the same execution profile its signed fingerprints must equal
//! the audited provider's bit for bit.
//!
//! A verifier returns no verdict, only its own signed, hash-chained work, so a verifier
//! that "always says ok" would have to produce bit-exact logits it did not compute.
//! When the two differ, tie-breakers settle it (two when two can be drawn, and they must
//! all agree: `disputes`) and whoever is outvoted gets a fraud proof cut from its own
//! transcript (any node with the model can check it). Now and
//! then a verifier is also sent a planted window whose answer two independent providers
//! already agreed on — among them windows of convicted jobs, whose right answer is
//! *not* what their provider committed to (planted mismatches) — and one that answers
//! otherwise is proven wrong the same way.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::seq::IndexedRandom;
use rand::Rng;
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::orderbook::BookEntry;
use sharemesh_protocol::commitment::{median_gap, CROSS_PROFILE_TOLERANCE};
use sharemesh_protocol::{
    ExecutionProfile, FinishReason, JobId, JobRequest, ModelId, NanoUsd, NodeId, Sampling,
    StepFingerprint, Tier,
};

use crate::buyer::{Billing, JobEvent};
use crate::segment::{SegmentTerms, Segments};
use crate::verify::examine::Finding;
use crate::verify::transcript::Transcript;

mod disputes;

/// The API key id verification windows' receipts are booked under, so spend reports
/// show what checks cost as a line of its own (`per_api_key`); the parentheses keep it
/// apart from every key id `sharemesh keys` makes.
pub const VERIFICATION_SPEND: &str = "(verification)";
/// Steps re-run per check, by default: a cheater that serves a cheaper network differs
/// at every step, so a short window catches it; where it falls is drawn after delivery.
pub const DEFAULT_WINDOW: usize = 16;
/// Share of outsourced checks that also send the verifier a planted window.
pub const DEFAULT_CANARY_RATE: f64 = 0.1;
/// Agreed windows kept for planting.
const KNOWN_WINDOWS: usize = 32;
/// Providers whose execution profile is remembered; beyond it the map starts over.
const MAX_PROFILES: usize = 10_000;
/// How long a provider's adverts must have been in this node's book before it is
/// preferred as a verifier over keys seen more recently.
pub const ESTABLISHED_MS: u64 = 10 * 60 * 1000;
/// How long a verification window may take from request to last token.
const WINDOW_DEADLINE: Duration = Duration::from_secs(300);

/// How outsourced checks are bought.
#[derive(Clone, Debug)]
pub struct OutsourcePolicy {
    /// Steps re-run per check.
    pub window: usize,
    /// Share of checks that also plant a known window on the verifier.
    pub canary_rate: f64,
    /// The most this node pays a verifier per token.
    pub max_price_per_token: NanoUsd,
}

impl Default for OutsourcePolicy {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            canary_rate: DEFAULT_CANARY_RATE,
            max_price_per_token: NanoUsd(1_000_000),
        }
    }
}

/// What the outsourced checks did, for `GET /v1/trust` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OutsourceStats {
    /// Windows another provider re-ran to the end (checks, tie-breaks and plants).
    pub windows_run: u64,
    /// Windows that failed to run (refused, broken, unreachable).
    pub windows_failed: u64,
    /// Checks where the verifier and the audited provider differed.
    pub disputes: u64,
    pub canaries_sent: u64,
    /// Verifiers proven wrong (outvoted in a dispute, or by a planted window).
    pub verifiers_caught: u64,
    /// What the windows cost, from the receipts this node signed for them.
    pub spent_nano_usd: u64,
}

/// A window two independent providers agreed on, kept to plant on verifiers.
#[derive(Clone, Debug)]
struct Known {
    request: JobRequest,
    /// Completion tokens before the window.
    prefix: Vec<u32>,
    steps: Vec<(u32, StepFingerprint)>,
    parties: [NodeId; 2],
}

/// How two runs of the same window compare, step by step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Comparison {
    /// Equal over this many steps (the shorter run's length).
    Same(usize),
    /// The fingerprints differ at this step (the contexts were equal up to it).
    Differs(usize),
    /// Equal fingerprints, yet another token was drawn at this step.
    Diverged(usize),
    /// Equal up to this step, where the second run ended (drew an end token) and the
    /// first went on.
    Ended(usize),
}

fn compare(a: &[(u32, StepFingerprint)], b: &[(u32, StepFingerprint)]) -> Comparison {
    for (i, ((ta, fa), (tb, fb))) in a.iter().zip(b).enumerate() {
        if fa != fb {
            return Comparison::Differs(i);
        }
        if ta != tb {
            return Comparison::Diverged(i);
        }
    }
    Comparison::Same(a.len().min(b.len()))
}

/// The (token, fingerprint) of each step at completion index `from..end` that
/// `transcript`'s provider sent.
fn steps_of(transcript: &Transcript, from: usize, end: usize) -> Vec<(u32, StepFingerprint)> {
    let first = transcript.request.resume.len();
    transcript
        .chunks
        .iter()
        .flat_map(|(_, chunk)| chunk.token_ids.iter().zip(&chunk.fingerprints))
        .enumerate()
        .filter(|(i, _)| (from..end).contains(&(first + i)))
        .map(|(_, (&token, fingerprint))| (token, fingerprint.clone()))
        .collect()
}

/// A check's window over a segment of `sent` steps: its width (the policy's, at most
/// an eighth of the segment rounded up, at least one step) and the first offset it may
/// start at (after the first step whenever the segment is longer than the window: a
/// resumed window bills no prompt). A check then costs about an eighth of the tokens it
/// checks — even while every job of new providers is checked, verification stays
/// within 15% of spend; substitutes and garbage differ at every step, so a few catch
/// them.
fn window_span(policy_window: usize, sent: usize) -> (usize, usize) {
    let width = policy_window.min(sent.div_ceil(8)).max(1);
    (width, usize::from(sent > width))
}

/// A finished window: what the verifier signed.
struct Ran {
    transcript: Transcript,
    steps: Vec<(u32, StepFingerprint)>,
    /// The run ended by drawing an end token (before the window's end, if `steps` is
    /// shorter than the window).
    stopped: bool,
}

/// What verification windows are paid from and counted in.
#[derive(Default)]
pub struct WindowSpending {
    /// Each window's worst case is held against these before it runs; one that does
    /// not fit is not bought (the check is skipped, counted in `windows_failed`).
    pub budgets: Option<Arc<crate::budget::Budgets>>,
    /// `sharemesh_gateway_verification_spent_nano_usd`.
    pub spent: Option<prometheus_client::metrics::counter::Counter>,
}

/// Called with every window a provider ran to the end (see [`Outsourcing::witness_with`]).
pub type WindowWitness = Box<dyn Fn(&Transcript) + Send + Sync>;

/// Buys verification windows from providers.
pub struct Outsourcing {
    segments: Segments,
    policy: OutsourcePolicy,
    spending: WindowSpending,
    witness: std::sync::OnceLock<WindowWitness>,
    /// The execution profile each provider named in its last `Accept`.
    profiles: Mutex<HashMap<NodeId, ExecutionProfile>>,
    known: Mutex<VecDeque<Known>>,
    stats: Mutex<OutsourceStats>,
    /// The gateway's vocabularies: a window's prompt is counted exactly where the model's
    /// is held (a template's own text can exceed the prompt's token bound).
    vocabularies: Option<Arc<crate::vocab::Vocabularies>>,
}

impl Outsourcing {
    pub fn new(segments: Segments, policy: OutsourcePolicy, spending: WindowSpending) -> Self {
        Self {
            segments,
            policy,
            spending,
            witness: std::sync::OnceLock::new(),
            profiles: Mutex::default(),
            known: Mutex::default(),
            stats: Mutex::default(),
            vocabularies: None,
        }
    }

    /// Counts windows' prompts with the vocabularies the gateway holds.
    pub fn counting_with(mut self, vocabularies: Arc<crate::vocab::Vocabularies>) -> Self {
        self.vocabularies = Some(vocabularies);
        self
    }

    /// Hands `witness` every window a provider signed to the end (verifiers',
    /// tie-breakers' and planted ones): signed work that a node which comes to hold the
    /// model checks too (set once).
    pub fn witness_with(&self, witness: WindowWitness) {
        let _ = self.witness.set(witness);
    }

    pub fn stats(&self) -> OutsourceStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    fn count(&self, change: impl FnOnce(&mut OutsourceStats)) {
        if let Ok(mut stats) = self.stats.lock() {
            change(&mut stats);
        }
    }

    /// Remembers the profile `provider` named, so verifiers can be chosen on the
    /// audited job's profile (where a difference is proof, not suspicion).
    pub fn learn(&self, provider: NodeId, profile: &ExecutionProfile) {
        if let Ok(mut profiles) = self.profiles.lock() {
            if profiles.len() >= MAX_PROFILES && !profiles.contains_key(&provider) {
                profiles.clear();
            }
            profiles.insert(provider, profile.clone());
        }
    }

    /// The most a window of `model` is paid per token: the audited job's own price or
    /// the model's median offer, whichever is higher, and never above this node's
    /// ceiling. A key that offers verification at the gateway's full ceiling is never
    /// drawn, and a check costs about what the job it checks did.
    fn price_cap(
        &self,
        live: &[Arc<BookEntry>],
        model: &ModelId,
        audited: Option<NanoUsd>,
    ) -> NanoUsd {
        let mut prices: Vec<NanoUsd> = live
            .iter()
            .filter_map(|e| e.advert.offer(model)?.price_for(Tier::OnDemand))
            .collect();
        prices.sort();
        let median = prices.get(prices.len() / 2).copied().unwrap_or(NanoUsd(0));
        audited
            .unwrap_or(NanoUsd(0))
            .max(median)
            .min(self.policy.max_price_per_token)
    }

    /// A provider to re-run a window of `model`: not one of `excluded`, at most `cap`
    /// per token; one known to run `profile` or not known yet if there is any, else
    /// any; within that group among the keys whose adverts this node has seen for
    /// [`ESTABLISHED_MS`] if there is any (a flood of fresh keys is not drawn while
    /// established providers are there), at random (no provider can count on
    /// verifying a given job).
    fn choose(
        &self,
        live: &[Arc<BookEntry>],
        model: &ModelId,
        profile: &ExecutionProfile,
        excluded: &[NodeId],
        cap: NanoUsd,
    ) -> Option<(Arc<BookEntry>, Tier, NanoUsd)> {
        let profiles = self.profiles.lock().ok()?;
        let mut groups: [Vec<(Arc<BookEntry>, Tier, NanoUsd)>; 2] = Default::default();
        for entry in live {
            let advert = &entry.advert;
            if excluded.contains(&advert.provider) {
                continue;
            }
            let Some(offer) = advert.offer(model) else {
                continue;
            };
            let priced = [Tier::OnDemand, Tier::Interruptible, Tier::Reserved]
                .into_iter()
                .filter(|tier| advert.tiers.contains(tier))
                .find_map(|tier| Some((tier, offer.price_for(tier)?)))
                .filter(|(_, price)| *price <= cap);
            let Some((tier, price)) = priced else {
                continue;
            };
            // A provider whose profile is not known yet is as likely a match as not,
            // and drawing only among those already seen would make verifiers
            // predictable: it stays in the first group.
            let group = match profiles.get(&advert.provider) {
                Some(known) if !known.replays_exactly(profile) => 1,
                _ => 0,
            };
            groups[group].push((entry.clone(), tier, price));
        }
        let group = groups.into_iter().find(|g| !g.is_empty())?;
        let now = now_ms();
        let (established, fresh): (Vec<_>, Vec<_>) = group
            .into_iter()
            .partition(|(entry, _, _)| now.saturating_sub(entry.first_seen_ms) >= ESTABLISHED_MS);
        let pool = if established.is_empty() {
            fresh
        } else {
            established
        };
        pool.choose(&mut rand::rng()).cloned()
    }

    /// Runs `request`'s steps `prefix.len()..end` on the chosen provider, paid like any
    /// job; what it signed, or why it did not finish.
    async fn run_window(
        &self,
        (entry, tier, price): &(Arc<BookEntry>, Tier, NanoUsd),
        request: &JobRequest,
        prefix: &[u32],
        end: usize,
    ) -> Result<Ran, String> {
        let job_id = JobId::from_bytes(rand::rng().random());
        let (_, audit_commitment) = crate::verify::audit::audit_secret(&job_id);
        let job = JobRequest {
            job_id,
            buyer: self.segments.key.node_id(),
            provider: entry.advert.provider,
            model: request.model,
            prompt: request.prompt.clone(),
            sampling: Sampling {
                max_tokens: u32::try_from(end).map_err(|_| "window end too far")?,
                ..request.sampling.clone()
            },
            max_price_per_token: *price,
            tier: *tier,
            deadline_ms: now_ms() + WINDOW_DEADLINE.as_millis() as u64,
            resume: prefix.to_vec(),
            audit_commitment,
        };
        let counted = self
            .vocabularies
            .as_ref()
            .and_then(|held| held.get(&request.model))
            .and_then(|vocabulary| crate::vocab::count(&vocabulary, &request.prompt).ok());
        // Held against the budgets before it is spent: the window's tokens, and the
        // prompt when it starts at the first step (a fresh job bills it).
        let prompt = counted.as_ref().map_or_else(
            || request.prompt.token_bound(),
            |c| u64::from(c.prompt_tokens),
        );
        let billed = (end - prefix.len()) as u64 + if prefix.is_empty() { prompt } else { 0 };
        let terms = SegmentTerms {
            billing: Billing::Metered(Some(VERIFICATION_SPEND.into())),
            counted,
        };
        let worst_case = price.0.saturating_mul(billed);
        let _reservation = match &self.spending.budgets {
            Some(budgets) => Some(
                budgets
                    .reserve(
                        self.segments.ledger.as_deref(),
                        &self.segments.key.node_id(),
                        worst_case,
                        None,
                        now_ms(),
                    )
                    .map_err(|err| {
                        self.count(|s| s.windows_failed += 1);
                        format!("not within the budgets: {err}")
                    })?,
            ),
            None => None,
        };
        let ran = tokio::time::timeout(WINDOW_DEADLINE, async {
            let mut opened = self
                .segments
                .open(entry, job, terms)
                .await
                .map_err(|e| e.to_string())?;
            let mut paid = 0;
            let end = loop {
                match opened.next().await {
                    Some(JobEvent::Receipted(receipt)) => paid = receipt.amount.0,
                    Some(JobEvent::Finished { finish }) => break Ok(finish),
                    Some(JobEvent::Failed(why)) => break Err(why.to_string()),
                    Some(JobEvent::Rejected(reject)) => break Err(format!("{reject:?}")),
                    Some(_) => {}
                    None => break Err("the stream ended without a finish".to_owned()),
                }
            };
            self.count(|s| s.spent_nano_usd += paid);
            if let Some(spent) = &self.spending.spent {
                spent.inc_by(paid);
            }
            let finish: FinishReason = end?;
            tracing::debug!(?finish, "verification window ran");
            opened
                .transcript()
                .cloned()
                .map(|transcript| (transcript, finish == FinishReason::Stop))
                .ok_or_else(|| "no transcript".to_owned())
        })
        .await
        .map_err(|_| "the window took too long".to_owned())
        .and_then(|r| r);
        match ran {
            Ok((transcript, stopped)) => {
                self.count(|s| s.windows_run += 1);
                if let Some(witness) = self.witness.get() {
                    witness(&transcript);
                }
                self.learn(transcript.provider(), transcript.profile());
                let steps = steps_of(&transcript, prefix.len(), end);
                Ok(Ran {
                    transcript,
                    steps,
                    stopped,
                })
            }
            Err(why) => {
                self.count(|s| s.windows_failed += 1);
                Err(why)
            }
        }
    }

    /// Checks a window of `audited` on another provider (see the module docs).
    /// `live` is the order book less providers dropped for fraud.
    pub async fn examine(
        &self,
        audited: &Transcript,
        live: &[Arc<BookEntry>],
        reporter: NodeId,
    ) -> Finding {
        let sent = audited.sent();
        if sent == 0 {
            return Finding::Honest { steps: 0 };
        }
        let resumed = audited.request.resume.len();
        let (width, first) = window_span(self.policy.window, sent);
        let from = resumed + rand::rng().random_range(first..=sent - width);
        let end = from + width;
        let outputs = audited.outputs();
        let provider = audited.provider();
        let expected = steps_of(audited, from, end);
        let model = audited.request.model;
        let cap = self.price_cap(live, &model, Some(audited.accept.price_per_token));
        let excluded = [provider, reporter];
        let Some(verifier) = self.choose(live, &model, audited.profile(), &excluded, cap) else {
            return Finding::Unchecked(format!("no other provider of {model} to verify with"));
        };
        let first = match self
            .run_window(&verifier, &audited.request, &outputs[..from], end)
            .await
        {
            Ok(ran) => ran,
            Err(why) => {
                return Finding::Unchecked(format!("the verification window failed: {why}"))
            }
        };
        let verifier_id = first.transcript.provider();
        if !audited
            .profile()
            .replays_exactly(first.transcript.profile())
        {
            // Another profile: no proof, only the calibrated gap tolerance. (The
            // seeded-draw rule needs the verifier's draws on the delivered tokens, which a
            // window run on the verifier's own tokens does not give.)
            let (a, b): (Vec<_>, Vec<_>) = (
                expected.iter().map(|(_, f)| f.clone()).collect(),
                first.steps.iter().map(|(_, f)| f.clone()).collect(),
            );
            let gap = median_gap(&a, &b).unwrap_or(0.0);
            return if gap > CROSS_PROFILE_TOLERANCE {
                Finding::Suspicious { gap, far_draws: 0 }
            } else {
                Finding::Honest { steps: a.len() }
            };
        }
        let comparison = match compare(&expected, &first.steps) {
            Comparison::Same(steps) if steps < expected.len() && first.stopped => {
                Comparison::Ended(steps)
            }
            other => other,
        };
        match comparison {
            // The verifier drew an end token where the audited provider went on (one
            // that never stops bills up to `max_tokens`), or stopped where it should
            // not have: a third run settles which.
            Comparison::Ended(step) => {
                self.count(|s| s.disputes += 1);
                let ran = (first, from, end, step);
                self.settle_end(audited, &expected, ran, live, reporter)
                    .await
            }
            Comparison::Same(0) => Finding::Unchecked("the verifier ran no step".into()),
            Comparison::Same(steps) => {
                self.remember(Known {
                    request: audited.request.clone(),
                    prefix: outputs[..from].to_vec(),
                    steps: expected[..steps].to_vec(),
                    parties: [provider, verifier_id],
                });
                Finding::Honest { steps }
            }
            // Equal logits yet another token: one of the two chose its token instead of
            // drawing it with the request's seed. A third run settles which, as for
            // differing logits; its proof is one any holder of the model redraws.
            Comparison::Diverged(step) | Comparison::Differs(step) => {
                self.count(|s| s.disputes += 1);
                self.settle(audited, &expected, first, (from, end, step), live, reporter)
                    .await
            }
        }
    }

    fn forget(&self, known: &Known) {
        if let Ok(mut windows) = self.known.lock() {
            windows.retain(|k| k.parties != known.parties || k.prefix != known.prefix);
        }
    }

    fn remember(&self, known: Known) {
        if let Ok(mut windows) = self.known.lock() {
            if windows.len() >= KNOWN_WINDOWS {
                windows.pop_front();
            }
            windows.push_back(known);
        }
    }

    /// Whether to plant a known window along with a check (drawn at `canary_rate`).
    pub fn draws_canary(&self) -> bool {
        rand::rng().random_bool(self.policy.canary_rate.clamp(0.0, 1.0))
    }
}

fn proof_finding(proof: Option<sharemesh_protocol::FraudProof>) -> Finding {
    match proof {
        Some(proof) => Finding::Fraud(Box::new(proof)),
        None => Finding::Unchecked("the differing step is too far in to prove".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(token: u32, logit: f32) -> (u32, StepFingerprint) {
        (
            token,
            StepFingerprint {
                top: vec![(token, logit.to_bits())],
            },
        )
    }

    #[test]
    fn comparison_names_the_first_difference() {
        let a = vec![step(1, 1.0), step(2, 1.0), step(3, 1.0)];
        assert_eq!(compare(&a, &a), Comparison::Same(3));
        assert_eq!(compare(&a, &a[..2]), Comparison::Same(2));
        let mut b = a.clone();
        b[1] = step(2, 1.5);
        assert_eq!(compare(&a, &b), Comparison::Differs(1));
        let mut c = a.clone();
        c[2].0 = 9;
        assert_eq!(compare(&a, &c), Comparison::Diverged(2));
    }

    #[test]
    fn a_window_is_at_most_an_eighth_of_the_segment_and_starts_after_its_prompt() {
        assert_eq!(window_span(16, 1), (1, 0));
        assert_eq!(window_span(16, 2), (1, 1));
        assert_eq!(window_span(16, 12), (2, 1));
        assert_eq!(window_span(16, 200), (16, 1));
        assert_eq!(window_span(0, 40), (1, 1));
        for sent in 1..300 {
            let (width, first) = window_span(16, sent);
            assert!(first + width <= sent, "{sent}");
            assert!(width * 8 <= sent + 7, "{sent}");
        }
    }
}
