//! Local reputation: a small set of scored actions, a bounded score, and half-life
//! decay. Pure: time is always an argument (Unix milliseconds), nothing is read from a
//! clock or the network. The local, per-provider book the market ranks with, and
//! ([`eigentrust`]) the trust view over verified dealings and others' reports, with
//! the audit rate rule (SPEC.md §12).

mod eigentrust;
mod view;

pub use eigentrust::{eigentrust, AuditRule, Dealings, TrustParams, DEALINGS_HALF_LIFE_MS};
pub use view::{view, View};

use std::collections::HashMap;
use std::hash::Hash;

use serde::{Deserialize, Serialize};

/// What a node observed about a provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// A job finished and its tokens were received.
    Completed { tokens: u64 },
    /// The provider errored, broke the stream or could not be reached.
    Failed,
    /// The provider stopped sending tokens past the stall timeout.
    Stalled,
    /// A verification replay matched.
    VerifiedOk,
    /// A verification replay found substituted or garbage output.
    VerifiedMismatch,
    /// The provider refused a job its advert said it would take (busy, paused, outside
    /// its window): a small mark, since honest load changes between adverts.
    Refused,
    /// The provider signed something a correct provider never signs: a chunk of another
    /// job or out of order, or an acceptance on terms not asked for.
    Misbehaved,
}

/// Weights of each outcome and the decay half-life.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ScoreParams {
    pub half_life_ms: u64,
    pub failed: f64,
    pub stalled: f64,
    pub verified_ok: f64,
    pub verified_mismatch: f64,
    pub refused: f64,
    pub misbehaved: f64,
    /// Completed jobs earn `completed_per_log2_tokens × log2(1 + tokens)`.
    pub completed_per_log2_tokens: f64,
    /// Scores are clamped to ±`bound`.
    pub bound: f64,
}

impl Default for ScoreParams {
    fn default() -> Self {
        Self {
            half_life_ms: 7 * 24 * 3_600_000,
            failed: -2.0,
            stalled: -2.0,
            verified_ok: 1.0,
            verified_mismatch: -8.0,
            refused: -0.5,
            misbehaved: -8.0,
            completed_per_log2_tokens: 0.1,
            bound: 100.0,
        }
    }
}

impl ScoreParams {
    fn weight(&self, outcome: Outcome) -> f64 {
        match outcome {
            Outcome::Completed { tokens } => {
                self.completed_per_log2_tokens * ((1 + tokens) as f64).log2()
            }
            Outcome::Failed => self.failed,
            Outcome::Stalled => self.stalled,
            Outcome::VerifiedOk => self.verified_ok,
            Outcome::VerifiedMismatch => self.verified_mismatch,
            Outcome::Refused => self.refused,
            Outcome::Misbehaved => self.misbehaved,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
struct Entry {
    score: f64,
    successes: f64,
    attempts: f64,
    updated_ms: u64,
}

/// Decaying scores for many subjects, bounded in count (the lowest-|score| subject is
/// dropped when full, so a flood of fresh identities cannot evict what we know of bad ones).
#[derive(Clone, Debug)]
pub struct ReputationBook<K> {
    params: ScoreParams,
    capacity: usize,
    entries: HashMap<K, Entry>,
}

impl<K: Eq + Hash + Clone> ReputationBook<K> {
    pub fn new(params: ScoreParams, capacity: usize) -> Self {
        Self {
            params,
            capacity: capacity.max(1),
            entries: HashMap::new(),
        }
    }

    fn decay_factor(&self, from_ms: u64, to_ms: u64) -> f64 {
        if self.params.half_life_ms == 0 {
            return 0.0;
        }
        let elapsed = to_ms.saturating_sub(from_ms) as f64;
        0.5f64.powf(elapsed / self.params.half_life_ms as f64)
    }

    fn decayed(&self, entry: &Entry, now_ms: u64) -> Entry {
        let factor = self.decay_factor(entry.updated_ms, now_ms);
        Entry {
            score: entry.score * factor,
            successes: entry.successes * factor,
            attempts: entry.attempts * factor,
            updated_ms: now_ms.max(entry.updated_ms),
        }
    }

    /// Records an outcome for `subject` at `now_ms`.
    pub fn record(&mut self, subject: &K, outcome: Outcome, now_ms: u64) {
        if !self.entries.contains_key(subject) && self.entries.len() >= self.capacity {
            self.evict_least_informative(now_ms);
        }
        let current = self.entries.get(subject).map_or(
            Entry {
                score: 0.0,
                successes: 0.0,
                attempts: 0.0,
                updated_ms: now_ms,
            },
            |e| self.decayed(e, now_ms),
        );
        let bound = self.params.bound;
        let success = matches!(outcome, Outcome::Completed { .. } | Outcome::VerifiedOk);
        let counts_as_attempt = !matches!(outcome, Outcome::VerifiedOk);
        let next = Entry {
            score: (current.score + self.params.weight(outcome)).clamp(-bound, bound),
            successes: current.successes
                + if success && counts_as_attempt {
                    1.0
                } else {
                    0.0
                },
            attempts: current.attempts + if counts_as_attempt { 1.0 } else { 0.0 },
            updated_ms: current.updated_ms,
        };
        self.entries.insert(subject.clone(), next);
    }

    fn evict_least_informative(&mut self, now_ms: u64) {
        let victim = self
            .entries
            .iter()
            .map(|(k, e)| (k.clone(), self.decayed(e, now_ms).score.abs()))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(k, _)| k);
        if let Some(victim) = victim {
            self.entries.remove(&victim);
        }
    }

    /// The decayed score at `now_ms`; 0 for unknown subjects.
    pub fn score(&self, subject: &K, now_ms: u64) -> f64 {
        self.entries
            .get(subject)
            .map_or(0.0, |e| self.decayed(e, now_ms).score)
    }

    /// Observed success rate with a Laplace prior (1 success in 2 attempts), so a
    /// newcomer starts at 0.5 rather than at either extreme.
    pub fn success_rate(&self, subject: &K, now_ms: u64) -> f64 {
        let (successes, attempts) = self.entries.get(subject).map_or((0.0, 0.0), |e| {
            let d = self.decayed(e, now_ms);
            (d.successes, d.attempts)
        });
        (successes + 1.0) / (attempts + 2.0)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DAY: u64 = 24 * 3_600_000;

    fn book() -> ReputationBook<u32> {
        ReputationBook::new(ScoreParams::default(), 1000)
    }

    #[test]
    fn failures_lower_and_completions_raise() {
        let mut b = book();
        b.record(&1, Outcome::Completed { tokens: 1023 }, 0);
        assert!((b.score(&1, 0) - 1.0).abs() < 1e-9);
        b.record(&2, Outcome::Failed, 0);
        assert_eq!(b.score(&2, 0), -2.0);
        b.record(&3, Outcome::VerifiedMismatch, 0);
        assert_eq!(b.score(&3, 0), -8.0);
        assert_eq!(b.score(&4, 0), 0.0);
    }

    #[test]
    fn scores_halve_every_half_life() {
        let mut b = book();
        b.record(&1, Outcome::VerifiedMismatch, 0);
        assert!((b.score(&1, 7 * DAY) + 4.0).abs() < 1e-9);
        assert!((b.score(&1, 14 * DAY) + 2.0).abs() < 1e-9);
    }

    #[test]
    fn success_rate_starts_neutral_and_tracks_outcomes() {
        let mut b = book();
        assert_eq!(b.success_rate(&1, 0), 0.5);
        for _ in 0..8 {
            b.record(&1, Outcome::Completed { tokens: 10 }, 0);
        }
        b.record(&1, Outcome::Stalled, 0);
        assert!((b.success_rate(&1, 0) - 9.0 / 11.0).abs() < 1e-9);
    }

    #[test]
    fn capacity_keeps_the_most_informative_subjects() {
        let mut b = ReputationBook::new(ScoreParams::default(), 2);
        b.record(&1, Outcome::VerifiedMismatch, 0);
        b.record(&2, Outcome::Completed { tokens: 1 }, 0);
        b.record(&3, Outcome::Failed, 0);
        assert_eq!(b.len(), 2);
        assert_eq!(b.score(&1, 0), -8.0, "the known-bad subject was evicted");
        assert_eq!(b.score(&2, 0), 0.0);
    }

    #[test]
    fn a_refusal_costs_less_than_a_failure_and_misbehaving_as_much_as_a_mismatch() {
        let mut b = book();
        b.record(&1, Outcome::Refused, 0);
        b.record(&2, Outcome::Failed, 0);
        b.record(&3, Outcome::Misbehaved, 0);
        b.record(&4, Outcome::VerifiedMismatch, 0);
        assert!(b.score(&1, 0) < 0.0);
        assert!(b.score(&1, 0) > b.score(&2, 0));
        assert_eq!(b.score(&3, 0), b.score(&4, 0));
        // Both count as attempts that did not succeed.
        assert!((b.success_rate(&1, 0) - 1.0 / 3.0).abs() < 1e-9);
        assert!((b.success_rate(&3, 0) - 1.0 / 3.0).abs() < 1e-9);
    }

    proptest! {
        #[test]
        fn scores_stay_bounded(outcomes in prop::collection::vec(0u8..7, 0..500), gaps in prop::collection::vec(0u64..DAY, 500)) {
            let mut b = book();
            let mut now = 0;
            for (o, gap) in outcomes.iter().zip(gaps) {
                now += gap;
                let outcome = match o {
                    0 => Outcome::Completed { tokens: 1 << 20 },
                    1 => Outcome::Failed,
                    2 => Outcome::Stalled,
                    3 => Outcome::VerifiedOk,
                    4 => Outcome::Refused,
                    5 => Outcome::Misbehaved,
                    _ => Outcome::VerifiedMismatch,
                };
                b.record(&7, outcome, now);
                let s = b.score(&7, now);
                prop_assert!(s.abs() <= 100.0 + 1e-9);
                let r = b.success_rate(&7, now);
                prop_assert!((0.0..=1.0).contains(&r));
            }
        }
    }
}
