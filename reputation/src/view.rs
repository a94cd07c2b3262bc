//! A node's view of everyone: its own verified dealings, the reports others gossip, and
//! its trust in each reporter from checking their reports against its own verifications
//! (a reporter that praised a provider this node convicted, or accused one it verified
//! clean, gets no weight). Used by gateways and by `testnet trust-sim` alike.

use std::collections::{BTreeMap, BTreeSet};

use crate::eigentrust::{eigentrust, AuditRule, Dealings, TrustParams};

#[derive(Clone, Debug, PartialEq)]
pub struct View<K: Ord> {
    /// EigenTrust per node (providers and reporters), summing to 1.
    pub trust: BTreeMap<K, f64>,
    /// Verified jobs per provider that reporters this node trusts vouched for, each
    /// reporter counting at most the rule's newcomer threshold.
    pub vouched: BTreeMap<K, u32>,
}

impl<K: Ord> Default for View<K> {
    fn default() -> Self {
        Self {
            trust: BTreeMap::new(),
            vouched: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> View<K> {
    /// `node`'s trust relative to the most trusted of `among` (0 for unknown nodes).
    pub fn standing(&self, node: &K, among: impl IntoIterator<Item = K>) -> f64 {
        let best = among
            .into_iter()
            .filter_map(|k| self.trust.get(&k).copied())
            .fold(0.0, f64::max);
        let mine = self.trust.get(node).copied().unwrap_or(0.0);
        if best > 0.0 {
            (mine / best).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}

/// `me`'s view. `own[subject]`: what `me` verified itself; `reports[reporter][subject]`:
/// what each reporter claims (its own report included or not: it is skipped).
pub fn view<K: Ord + Clone>(
    me: &K,
    own: &BTreeMap<K, Dealings>,
    reports: &BTreeMap<K, BTreeMap<K, Dealings>>,
    convicted: &BTreeSet<K>,
    rule: &AuditRule,
    params: &TrustParams,
) -> View<K> {
    let mut edges: BTreeMap<K, BTreeMap<K, f64>> = BTreeMap::new();
    // Per reporter: on how many subjects `me` verified its claims agree.
    let mut agreed: BTreeMap<K, u32> = BTreeMap::new();
    let my_row = edges.entry(me.clone()).or_default();
    for (subject, dealings) in own {
        my_row.insert(subject.clone(), dealings.local_trust());
    }
    for (reporter, claims) in reports {
        if reporter == me {
            continue;
        }
        let row = edges.entry(reporter.clone()).or_default();
        for (subject, dealings) in claims {
            row.insert(subject.clone(), dealings.local_trust());
        }
        let mut check = Dealings::default();
        for (subject, claimed) in claims {
            // Only what `me` verified itself can confirm or contradict a claim.
            let Some(mine) = own
                .get(subject)
                .filter(|d| d.verified_jobs > 0 || d.mismatches > 0)
            else {
                continue;
            };
            if (claimed.mismatches > 0) == (mine.mismatches > 0) {
                check.verified_jobs += 1;
                check.verified_tokens += 64;
            } else {
                check.mismatches += 1;
            }
        }
        edges
            .entry(me.clone())
            .or_default()
            .insert(reporter.clone(), check.local_trust());
        agreed.insert(reporter.clone(), check.verified_jobs);
    }
    let mut seeds = vec![me.clone()];
    seeds.extend(
        own.iter()
            .filter(|(_, d)| d.verified_jobs > 0 && d.mismatches == 0)
            .map(|(k, _)| k.clone()),
    );
    let trust = eigentrust(&edges, &seeds, convicted, params);
    let mut vouched: BTreeMap<K, u32> = BTreeMap::new();
    for (reporter, claims) in reports {
        let trusted = reporter != me && trust.get(reporter).copied().unwrap_or(0.0) > 0.0;
        if !trusted || convicted.contains(reporter) {
            continue;
        }
        // A reporter vouches for at most as many jobs of a subject as it has agreed
        // with `me` on subjects: a sybil that agreed once cannot lift a fresh key past
        // the newcomer audit by claiming eight verified jobs of it.
        let weight = agreed.get(reporter).copied().unwrap_or(0);
        for (subject, claimed) in claims {
            if claimed.mismatches == 0 {
                *vouched.entry(subject.clone()).or_default() +=
                    claimed.verified_jobs.min(rule.newcomer_jobs).min(weight);
            }
        }
    }
    View { trust, vouched }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verified(jobs: u32) -> Dealings {
        Dealings {
            verified_jobs: jobs,
            verified_tokens: u64::from(jobs) * 64,
            ..Dealings::default()
        }
    }

    fn caught() -> Dealings {
        Dealings {
            mismatches: 1,
            ..Dealings::default()
        }
    }

    #[test]
    fn honest_reporters_vouch_and_liars_do_not() {
        // Me (0) verified providers 10 and 11 clean and caught 12. Reporter 1 agrees
        // and vouches for 13; reporter 2 praises 12 (which I caught) and 14.
        let own: BTreeMap<u32, Dealings> =
            [(10, verified(5)), (11, verified(5)), (12, caught())].into();
        let reports: BTreeMap<u32, BTreeMap<u32, Dealings>> = [
            (
                1,
                [(10, verified(9)), (11, verified(9)), (13, verified(20))].into(),
            ),
            (2, [(12, verified(50)), (14, verified(50))].into()),
        ]
        .into();
        let convicted: BTreeSet<u32> = [12].into();
        let v = view(
            &0,
            &own,
            &reports,
            &convicted,
            &AuditRule::default(),
            &TrustParams::default(),
        );
        assert!(v.trust[&1] > 0.0);
        assert_eq!(v.trust.get(&2).copied().unwrap_or(0.0), 0.0);
        assert!(v.trust[&13] > 0.0, "vouched by a trusted reporter");
        assert_eq!(
            v.trust.get(&14).copied().unwrap_or(0.0),
            0.0,
            "praised by a liar"
        );
        assert_eq!(
            v.vouched.get(&13),
            Some(&2),
            "capped at the two subjects it agreed with me on"
        );
        assert_eq!(v.vouched.get(&14), None);
        assert_eq!(v.trust[&12], 0.0);
        // A fresh key stands below a provider with a good record.
        let providers = [10, 11, 13, 99];
        assert_eq!(v.standing(&99, providers), 0.0);
        assert!(v.standing(&10, providers) > 0.0);
    }

    /// Sybil vouching: ten fresh reporters each agree with me on one provider I
    /// verified, and each claims eight clean verified jobs of a fresh key (their
    /// cheat). Each vouches for at most one job, and the record that counts toward the
    /// cheat's audit rate stays under the newcomer threshold: every job still checked.
    #[test]
    fn sybils_that_agreed_once_cannot_vouch_a_fresh_key_past_the_newcomer_audit() {
        let own: BTreeMap<u32, Dealings> = [(10, verified(5))].into();
        let reports: BTreeMap<u32, BTreeMap<u32, Dealings>> = (1..=10)
            .map(|sybil| (sybil, [(10, verified(5)), (77, verified(8))].into()))
            .collect();
        let rule = AuditRule::default();
        let v = view(
            &0,
            &own,
            &reports,
            &BTreeSet::new(),
            &rule,
            &TrustParams::default(),
        );
        assert!(v.trust[&1] > 0.0, "each agreed once: some trust");
        let vouched = v.vouched[&77];
        assert_eq!(vouched, 10, "one job per sybil");
        let record = rule.record(0, vouched);
        assert_eq!(record, rule.newcomer_jobs / 2);
        assert_eq!(rule.rate(record, false, false), 1.0, "still a newcomer");
        // Its own verified jobs then complete the record as before.
        assert_eq!(rule.record(4, vouched), rule.newcomer_jobs);
    }

    /// A reporter that earned trust over many agreements, then turns: its next report
    /// praises a provider this node convicted. Its whole weight goes at once (no
    /// record buys a lie), and what it alone vouched for is no longer vouched for.
    #[test]
    fn a_trusted_reporter_that_turns_liar_loses_all_weight() {
        let own: BTreeMap<u32, Dealings> = (10..30)
            .map(|p| (p, verified(8)))
            .chain([(99, caught())])
            .collect();
        let honest_years: BTreeMap<u32, Dealings> = (10..30)
            .map(|p| (p, verified(40)))
            .chain([(50, verified(40))])
            .collect();
        let run = |report: BTreeMap<u32, Dealings>| {
            view(
                &0,
                &own,
                &[(1, report)].into(),
                &[99].into(),
                &AuditRule::default(),
                &TrustParams::default(),
            )
        };
        let before = run(honest_years.clone());
        assert!(before.trust[&1] > 0.0);
        assert_eq!(before.vouched.get(&50), Some(&8));
        let mut turned = honest_years;
        turned.insert(99, verified(1_000));
        let after = run(turned);
        assert_eq!(after.trust.get(&1).copied().unwrap_or(0.0), 0.0);
        assert_eq!(after.vouched.get(&50), None);
        assert_eq!(after.trust.get(&50).copied().unwrap_or(0.0), 0.0);
        assert_eq!(after.trust[&99], 0.0);
    }
}
