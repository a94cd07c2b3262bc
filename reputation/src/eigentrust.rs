//! Trust that travels: each node's own EigenTrust view over what it and others report,
//! and the rule for how often a buyer verifies a provider. Pure: no clock, no network.
//!
//! Local trust counts only *verified* dealings (credit before verification let a
//! garbage provider reach full trust in SwarmLLM): `log2(1 + verified tokens)` less 2
//! per failure, and nothing at all once a verification failed. A node's view is
//! `t = (1 − a)·Cᵀt + a·p`, with `C` the row-normalised local trust of every reporter
//! it knows and `p` its seeds (itself and the providers it verified itself). A
//! reporter's influence is its own trust in that view, so a sybil ring that praises
//! itself holds only what honest nodes route into it, however many identities it has.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// What one node saw of one subject (a provider, or a reporter whose reports it
/// checked against its own verifications).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dealings {
    pub verified_jobs: u32,
    pub verified_tokens: u64,
    /// Verifications that failed (for a reporter: reports that contradicted this
    /// node's own verification).
    pub mismatches: u32,
    pub failures: u32,
    /// Unix ms from which the record ages (see [`Dealings::aged`]); 0 for a record
    /// that has not started ageing.
    #[serde(default)]
    pub epoch_ms: u64,
}

/// Verified work counts half as much after this long (jobs, tokens and failures halve
/// for each whole period): a record is kept up by recent work, and one a provider
/// earned long ago does not keep its audit rate at the floor forever.
pub const DEALINGS_HALF_LIFE_MS: u64 = 14 * 24 * 3_600_000;

impl Dealings {
    /// The record at `now_ms`: verified jobs, verified tokens and failures halved for
    /// each whole `half_life_ms` since its epoch, the epoch moved on by those periods
    /// (whole periods, in integers, so frequent updates cannot round the ageing away).
    /// Mismatches never fade: a proven cheat stays one. A record without an epoch
    /// starts ageing at `now_ms`; a clock that went backwards ages nothing.
    pub fn aged(&self, now_ms: u64, half_life_ms: u64) -> Dealings {
        if self.epoch_ms == 0 || half_life_ms == 0 {
            return Dealings {
                epoch_ms: now_ms,
                ..*self
            };
        }
        let periods = now_ms.saturating_sub(self.epoch_ms) / half_life_ms;
        if periods == 0 {
            return *self;
        }
        let shift = u32::try_from(periods).unwrap_or(u32::MAX);
        let halve32 = |v: u32| v.checked_shr(shift).unwrap_or(0);
        Dealings {
            verified_jobs: halve32(self.verified_jobs),
            verified_tokens: self.verified_tokens.checked_shr(shift).unwrap_or(0),
            failures: halve32(self.failures),
            mismatches: self.mismatches,
            epoch_ms: self
                .epoch_ms
                .saturating_add(periods.saturating_mul(half_life_ms)),
        }
    }

    /// Local trust, ≥ 0: nothing once anything failed verification.
    pub fn local_trust(&self) -> f64 {
        if self.mismatches > 0 {
            return 0.0;
        }
        let credit = (1.0 + self.verified_tokens as f64).log2();
        (credit - 2.0 * f64::from(self.failures)).max(0.0)
    }
}

/// EigenTrust's knobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrustParams {
    /// Weight of the seeds in every step (`a`).
    pub alpha: f64,
    pub max_iterations: usize,
    /// Stop once no score moves more than this.
    pub tolerance: f64,
    /// A reporter's row is divided by at least this much local trust (about a
    /// thousand verified tokens), so a little dealing with one subject does not pass
    /// on the reporter's whole trust; what a thin row leaves goes back to the seeds.
    pub min_row_total: f64,
}

impl Default for TrustParams {
    fn default() -> Self {
        Self {
            alpha: 0.2,
            max_iterations: 60,
            tolerance: 1e-10,
            min_row_total: 10.0,
        }
    }
}

/// A node's EigenTrust view: `edges[reporter][subject]` is the reporter's local trust
/// in the subject (negative values count as 0), `seeds` the nodes the viewer trusts a
/// priori (itself first). Returns trust per node, summing to 1 (empty without seeds).
/// Rows are divided by `max(row total, min_row_total)`.
/// Nodes in `convicted` (a confirmed fraud proof) get 0 and pass nothing on.
pub fn eigentrust<K: Ord + Clone>(
    edges: &BTreeMap<K, BTreeMap<K, f64>>,
    seeds: &[K],
    convicted: &BTreeSet<K>,
    params: &TrustParams,
) -> BTreeMap<K, f64> {
    let seeds: Vec<&K> = seeds.iter().filter(|s| !convicted.contains(*s)).collect();
    if seeds.is_empty() {
        return BTreeMap::new();
    }
    let mut nodes: BTreeSet<&K> = seeds.iter().copied().collect();
    for (reporter, row) in edges {
        nodes.insert(reporter);
        nodes.extend(row.keys());
    }
    let index: BTreeMap<&K, usize> = nodes.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let n = nodes.len();
    let mut prior = vec![0.0; n];
    for seed in &seeds {
        prior[index[seed]] += 1.0 / seeds.len() as f64;
    }
    // Row-normalised local trust; rows without trust (and convicted nodes) send their
    // mass back to the seeds.
    let rows: Vec<(usize, Vec<(usize, f64)>)> = edges
        .iter()
        .filter(|(reporter, _)| !convicted.contains(*reporter))
        .filter_map(|(reporter, row)| {
            let kept: Vec<(usize, f64)> = row
                .iter()
                .filter(|(subject, v)| !convicted.contains(*subject) && **v > 0.0 && v.is_finite())
                .map(|(subject, v)| (index[subject], *v))
                .collect();
            let total: f64 = kept.iter().map(|(_, v)| v).sum();
            let divisor = total.max(params.min_row_total);
            (total > 0.0).then(|| {
                let from = index[reporter];
                (
                    from,
                    kept.into_iter().map(|(to, v)| (to, v / divisor)).collect(),
                )
            })
        })
        .collect();
    let mut has_row = vec![false; n];
    for (from, _) in &rows {
        has_row[*from] = true;
    }
    let mut trust = prior.clone();
    for _ in 0..params.max_iterations {
        let mut next = vec![0.0; n];
        // Mass no row passes on (no row, or a thin one) goes back to the seeds.
        let mut dangling = 0.0;
        for (i, t) in trust.iter().enumerate() {
            if !has_row[i] {
                dangling += t;
            }
        }
        for (from, row) in &rows {
            let mut passed = 0.0;
            for (to, share) in row {
                next[*to] += (1.0 - params.alpha) * trust[*from] * share;
                passed += share;
            }
            dangling += trust[*from] * (1.0 - passed).max(0.0);
        }
        for (i, value) in next.iter_mut().enumerate() {
            *value += (params.alpha + (1.0 - params.alpha) * dangling) * prior[i];
        }
        let moved = next
            .iter()
            .zip(&trust)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        trust = next;
        if moved < params.tolerance {
            break;
        }
    }
    nodes
        .into_iter()
        .zip(trust)
        .map(|(k, t)| (k.clone(), if convicted.contains(k) { 0.0 } else { t }))
        .collect()
}

/// How often to verify a provider's jobs (Proof-of-Sampling with the verified record
/// standing in for future earnings): every job while it has fewer than
/// `newcomer_jobs` verified jobs, is suspected or is cheap; then
/// `2 / (1 + verified jobs)`, never below `floor`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditRule {
    pub floor: f64,
    pub newcomer_jobs: u32,
}

impl Default for AuditRule {
    fn default() -> Self {
        Self {
            floor: 0.05,
            newcomer_jobs: 8,
        }
    }
}

impl AuditRule {
    /// The verified record that counts toward a provider's rate: this node's own
    /// verified jobs and what trusted reporters vouched for, the latter at most half
    /// the newcomer threshold — others' word shortens a newcomer's audit, it never
    /// replaces it.
    pub fn record(&self, own: u32, vouched: u32) -> u32 {
        own.saturating_add(vouched.min(self.newcomer_jobs / 2))
    }

    pub fn rate(&self, verified_jobs: u32, suspected: bool, cheap: bool) -> f64 {
        if suspected || cheap || verified_jobs < self.newcomer_jobs {
            return 1.0;
        }
        (2.0 / (1.0 + f64::from(verified_jobs))).clamp(self.floor, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn edges(list: &[(u32, u32, f64)]) -> BTreeMap<u32, BTreeMap<u32, f64>> {
        let mut edges: BTreeMap<u32, BTreeMap<u32, f64>> = BTreeMap::new();
        for &(from, to, v) in list {
            edges.entry(from).or_default().insert(to, v);
        }
        edges
    }

    #[test]
    fn local_trust_needs_verification_and_is_lost_on_a_mismatch() {
        assert_eq!(Dealings::default().local_trust(), 0.0);
        let good = Dealings {
            verified_jobs: 4,
            verified_tokens: 1023,
            ..Dealings::default()
        };
        assert!((good.local_trust() - 10.0).abs() < 1e-9);
        let caught = Dealings {
            mismatches: 1,
            ..good
        };
        assert_eq!(caught.local_trust(), 0.0);
        let flaky = Dealings {
            failures: 3,
            ..good
        };
        assert!((flaky.local_trust() - 4.0).abs() < 1e-9);
    }

    #[test]
    fn verified_work_halves_each_whole_half_life_and_mismatches_stay() {
        let day = 86_400_000;
        let record = Dealings {
            verified_jobs: 40,
            verified_tokens: 4000,
            failures: 3,
            mismatches: 1,
            epoch_ms: 10 * day,
        };
        // A record without an epoch starts ageing now.
        let fresh = Dealings::default().aged(5 * day, 14 * day);
        assert_eq!(fresh.epoch_ms, 5 * day);
        // Within the first period nothing changes, however often it is asked.
        assert_eq!(record.aged(23 * day, 14 * day), record);
        assert_eq!(record.aged(day, 14 * day), record, "a clock that went back");
        let one = record.aged(24 * day, 14 * day);
        assert_eq!(
            (
                one.verified_jobs,
                one.verified_tokens,
                one.failures,
                one.mismatches
            ),
            (20, 2000, 1, 1)
        );
        assert_eq!(one.epoch_ms, 24 * day);
        // Ageing in steps and at once agree.
        assert_eq!(
            one.aged(52 * day, 14 * day),
            record.aged(52 * day, 14 * day)
        );
        let gone = record.aged(u64::MAX, 1);
        assert_eq!(
            (gone.verified_jobs, gone.verified_tokens, gone.mismatches),
            (0, 0, 1)
        );
    }

    proptest! {
        #[test]
        fn ageing_never_adds_and_composes(jobs in 0u32..10_000, tokens in 0u64..1 << 40,
            start in 1u64..1 << 40, a in 0u64..1 << 36, b in 0u64..1 << 36, hl in 1u64..1 << 34) {
            let record = Dealings { verified_jobs: jobs, verified_tokens: tokens, epoch_ms: start, ..Dealings::default() };
            let stepped = record.aged(start + a, hl).aged(start + a + b, hl);
            let direct = record.aged(start + a + b, hl);
            prop_assert_eq!(stepped, direct);
            prop_assert!(direct.verified_jobs <= jobs && direct.verified_tokens <= tokens);
        }
    }

    #[test]
    fn a_sybil_ring_holds_only_what_honest_nodes_route_into_it() {
        // Viewer 0 verified providers 1 and 2; provider 1 (also a buyer) verified 3.
        // Ring 100..100+size praises itself; one honest edge leads in, weakly.
        for size in [5u32, 100] {
            let mut list = vec![(0, 1, 10.0), (0, 2, 10.0), (1, 3, 10.0), (2, 100, 0.01)];
            for i in 0..size {
                for j in 0..size {
                    if i != j {
                        list.push((100 + i, 100 + j, 50.0));
                    }
                }
            }
            let view = eigentrust(
                &edges(&list),
                &[0],
                &BTreeSet::new(),
                &TrustParams::default(),
            );
            let ring: f64 = view
                .iter()
                .filter(|(k, _)| **k >= 100)
                .map(|(_, t)| t)
                .sum();
            let total: f64 = view.values().sum();
            assert!((total - 1.0).abs() < 1e-6, "{total}");
            // What flows in: 0.8 × trust(2) × 0.01/10.01 per step, kept within the
            // ring at 0.8 a step: well under half a percent whatever the size.
            assert!(ring < 0.005, "ring of {size}: {ring}");
            assert!(view[&1] > ring && view[&3] > 0.0);
        }
    }

    #[test]
    fn convicted_nodes_hold_nothing_and_pass_nothing_on() {
        let list = [(0, 1, 5.0), (1, 2, 5.0)];
        let convicted: BTreeSet<u32> = [1].into();
        let view = eigentrust(&edges(&list), &[0], &convicted, &TrustParams::default());
        assert_eq!(view[&1], 0.0);
        assert_eq!(view.get(&2).copied().unwrap_or(0.0), 0.0);
        assert!((view[&0] - 1.0).abs() < 1e-9);
        assert!(eigentrust(&edges(&list), &[], &convicted, &TrustParams::default()).is_empty());
    }

    #[test]
    fn the_audit_rate_falls_with_the_verified_record_to_the_floor() {
        let rule = AuditRule::default();
        assert_eq!(rule.rate(0, false, false), 1.0);
        assert_eq!(rule.rate(7, false, false), 1.0);
        assert!((rule.rate(9, false, false) - 0.2).abs() < 1e-12);
        assert_eq!(rule.rate(10_000, false, false), 0.05);
        assert_eq!(rule.rate(10_000, true, false), 1.0);
        assert_eq!(rule.rate(10_000, false, true), 1.0);
    }

    proptest! {
        #[test]
        fn views_are_distributions(list in prop::collection::vec((0u32..12, 0u32..12, -5.0f64..50.0), 0..80)) {
            let view = eigentrust(&edges(&list), &[0], &BTreeSet::new(), &TrustParams::default());
            let total: f64 = view.values().sum();
            prop_assert!((total - 1.0).abs() < 1e-6);
            prop_assert!(view.values().all(|t| *t >= 0.0));
        }
    }
}
