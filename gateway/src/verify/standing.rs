//! Reputation that travels: this node's signed report of what it verified, the reports
//! others gossip, and its own EigenTrust view over both (`sharemesh_reputation::view`,
//! SPEC §12). The view ranks providers, lowers the audit rate of providers that
//! reporters it trusts verified, and feeds gossipsub's application score.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use sharemesh_protocol::{NodeId, ReportedDealings, ReputationReport, MAX_REPORT_ENTRIES};
use sharemesh_reputation::{view, Dealings, TrustParams, View};

use crate::verify::audit::Auditor;

/// Reporters whose latest report is kept; beyond it the least trusted (the stalest
/// among equals) is forgotten, so a flood of fresh sybil reporters cannot push out the
/// reporters this node trusts.
const MAX_REPORTERS: usize = 1024;

/// What one reporter claims, per provider.
type Claims = BTreeMap<NodeId, Dealings>;

#[derive(Default)]
pub struct Standing {
    /// Each reporter's latest report: when it arrived, and its claims.
    reports: Mutex<BTreeMap<NodeId, (u64, Claims)>>,
    view: RwLock<View<NodeId>>,
    /// The view's trust per node, as rankings read it.
    trust: RwLock<Arc<BTreeMap<NodeId, f64>>>,
}

fn from_wire(d: &ReportedDealings) -> Dealings {
    Dealings {
        verified_jobs: d.verified_jobs,
        verified_tokens: d.verified_tokens,
        mismatches: d.mismatches,
        failures: d.failures,
        // A report's record is the reporter's, aged by it: not aged again here.
        epoch_ms: 0,
    }
}

impl Standing {
    /// Keeps `report` as its reporter's latest (the mesh already checked its signature
    /// and that it is newer than the last).
    pub fn on_report(&self, report: &ReputationReport, now_ms: u64) {
        let claims = report
            .entries
            .iter()
            .map(|(subject, d)| (*subject, from_wire(d)))
            .collect();
        let trust = self.trust();
        let Ok(mut reports) = self.reports.lock() else {
            return;
        };
        reports.insert(report.reporter, (now_ms, claims));
        if reports.len() > MAX_REPORTERS {
            let trust_of = |id: &NodeId| trust.get(id).copied().unwrap_or(0.0);
            let weakest = reports
                .iter()
                .min_by(|(a, (seen_a, _)), (b, (seen_b, _))| {
                    trust_of(a).total_cmp(&trust_of(b)).then(seen_a.cmp(seen_b))
                })
                .map(|(id, _)| *id);
            if let Some(id) = weakest {
                reports.remove(&id);
            }
        }
    }

    /// Reporters whose report is held.
    pub fn reporters(&self) -> usize {
        self.reports.lock().map_or(0, |r| r.len())
    }

    /// This node's report: what it verified itself, the most verified providers first.
    pub fn own_report(
        &self,
        me: NodeId,
        auditor: &Auditor,
        epoch: u64,
    ) -> Option<ReputationReport> {
        let mut entries: Vec<(NodeId, ReportedDealings)> = auditor
            .dealings()
            .into_iter()
            .filter(|(subject, d)| *subject != me && (d.verified_jobs > 0 || d.mismatches > 0))
            .map(|(subject, d)| {
                let wire = ReportedDealings {
                    verified_jobs: d.verified_jobs,
                    verified_tokens: d.verified_tokens,
                    mismatches: d.mismatches,
                    failures: d.failures,
                };
                (subject, wire)
            })
            .collect();
        if entries.is_empty() {
            return None;
        }
        entries.sort_by_key(|(_, d)| std::cmp::Reverse((d.mismatches, d.verified_jobs)));
        entries.truncate(MAX_REPORT_ENTRIES);
        Some(ReputationReport {
            reporter: me,
            epoch,
            entries,
        })
    }

    /// Recomputes the view from this node's dealings and the reports it holds.
    pub fn recompute(&self, me: NodeId, auditor: &Auditor) {
        let reports: BTreeMap<NodeId, Claims> = self
            .reports
            .lock()
            .map(|r| {
                r.iter()
                    .map(|(k, (_, claims))| (*k, claims.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let seen = view(
            &me,
            &auditor.dealings(),
            &reports,
            &auditor.convicted(),
            &auditor.policy.rule,
            &TrustParams::default(),
        );
        auditor.set_vouched(seen.vouched.clone());
        if let Ok(mut slot) = self.trust.write() {
            *slot = Arc::new(seen.trust.clone());
        }
        if let Ok(mut slot) = self.view.write() {
            *slot = seen;
        }
    }

    /// `provider`'s trust relative to the most trusted of `among`, in 0..=1.
    pub fn standing(&self, provider: &NodeId, among: &[NodeId]) -> f64 {
        self.view
            .read()
            .map_or(0.0, |v| v.standing(provider, among.iter().copied()))
    }

    /// The whole view (trust per node): shared, not copied, since every ranking reads
    /// it.
    pub fn trust(&self) -> Arc<BTreeMap<NodeId, f64>> {
        self.trust.read().map(|t| t.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn node(i: u32) -> NodeId {
        let mut bytes = [7u8; 32];
        bytes[..4].copy_from_slice(&i.to_le_bytes());
        NodeId::from_bytes(bytes)
    }

    /// 3000 fresh sybil reporters, each newer than the rest: the held reports stay
    /// bounded, and the one reporter this node trusts keeps its place.
    #[test]
    fn a_flood_of_untrusted_reporters_does_not_push_out_a_trusted_one() {
        let standing = Standing::default();
        let trusted = node(u32::MAX);
        *standing.trust.write().unwrap() = Arc::new([(trusted, 0.4)].into());
        let report = |reporter| ReputationReport {
            reporter,
            epoch: 0,
            entries: vec![(
                node(1),
                ReportedDealings {
                    verified_jobs: 1_000,
                    verified_tokens: 1 << 30,
                    mismatches: 0,
                    failures: 0,
                },
            )],
        };
        standing.on_report(&report(trusted), 0);
        for i in 0..3_000 {
            standing.on_report(&report(node(i + 10)), u64::from(i) + 1);
        }
        assert_eq!(standing.reporters(), MAX_REPORTERS);
        assert!(standing.reports.lock().unwrap().contains_key(&trusted));
        // Among the untrusted, the stalest went first.
        assert!(!standing.reports.lock().unwrap().contains_key(&node(10)));
        assert!(standing.reports.lock().unwrap().contains_key(&node(3_009)));
    }
}
