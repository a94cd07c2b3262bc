//! Reputation that travels: this node's signed report of what it verified, the reports
//! others gossip, and its own EigenTrust view over both (`sharemesh_reputation::view`,
//! SPEC §12). The view ranks providers, lowers the audit rate of providers that
//! reporters it trusts verified, and feeds gossipsub's application score.

use std::collections::BTreeMap;
use std::sync::{Mutex, RwLock};

use sharemesh_protocol::{NodeId, ReportedDealings, ReputationReport, MAX_REPORT_ENTRIES};
use sharemesh_reputation::{view, Dealings, TrustParams, View};

use crate::audit::Auditor;

/// Reporters whose latest report is kept; the stalest is forgotten beyond it.
const MAX_REPORTERS: usize = 1024;

/// What one reporter claims, per provider.
type Claims = BTreeMap<NodeId, Dealings>;

#[derive(Default)]
pub struct Standing {
    /// Each reporter's latest report: when it arrived, and its claims.
    reports: Mutex<BTreeMap<NodeId, (u64, Claims)>>,
    view: RwLock<View<NodeId>>,
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
        let Ok(mut reports) = self.reports.lock() else {
            return;
        };
        reports.insert(report.reporter, (now_ms, claims));
        if reports.len() > MAX_REPORTERS {
            let stalest = reports
                .iter()
                .min_by_key(|(_, (seen, _))| *seen)
                .map(|(id, _)| *id);
            if let Some(id) = stalest {
                reports.remove(&id);
            }
        }
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

    /// The whole view (trust per node), for `GET /v1/trust`.
    pub fn trust(&self) -> BTreeMap<NodeId, f64> {
        self.view
            .read()
            .map(|v| v.trust.clone())
            .unwrap_or_default()
    }
}
