//! One answer to "how much does this node trust that provider", for ranking: its own
//! success rate with it (the reputation book), its standing in this node's EigenTrust
//! view (verified work, its own and trusted reporters'), hardware findings, and the
//! speed measured over its last jobs — read together here instead of blended inline
//! where offers are ranked.

use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard};

use sharemesh_mesh::orderbook::BookEntry;
use sharemesh_protocol::NodeId;
use sharemesh_reputation::ReputationBook;

use super::Trust;

/// What this node knows of one provider's standing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProviderStanding {
    /// This node's own success rate with it (0.5 when it has none).
    pub success: f64,
    /// Its trust in this node's view relative to the most trusted live provider, 0..=1
    /// (0 for a key nobody verified).
    pub trust: f64,
    /// Its hardware claims do not fit together (a GPU under two identities, memory too
    /// small for the model offered).
    pub hardware_flagged: bool,
    /// Tokens per second measured over its last jobs, once enough were seen.
    pub measured_speed: Option<f64>,
}

impl ProviderStanding {
    /// How reliable ranking takes it to be, 0..=1: half its success rate, half its trust
    /// (so a fresh key starts below a provider with a verified record), halved by a
    /// hardware finding.
    pub fn reliability(&self) -> f64 {
        let base = 0.5 * self.success + 0.5 * self.trust;
        if self.hardware_flagged {
            base * 0.5
        } else {
            base
        }
    }
}

/// The standings of the providers of one ranking, read at one time.
pub struct Standings<'a> {
    trust: &'a Trust,
    book: Option<MutexGuard<'a, ReputationBook<NodeId>>>,
    view: Arc<BTreeMap<NodeId, f64>>,
    /// The most trusted live provider's trust.
    best: f64,
    now_ms: u64,
}

impl Standings<'_> {
    pub fn of(&self, provider: &NodeId) -> ProviderStanding {
        let trust = match self.view.get(provider) {
            Some(t) if self.best > 0.0 => (t / self.best).clamp(0.0, 1.0),
            _ => 0.0,
        };
        ProviderStanding {
            success: self
                .book
                .as_ref()
                .map_or(0.5, |book| book.success_rate(provider, self.now_ms)),
            trust,
            hardware_flagged: self.trust.attestations.is_flagged(provider),
            measured_speed: self.trust.auditor.measured_speed(provider),
        }
    }
}

impl Trust {
    /// The standings of `live`'s providers now (trust relative to the best of them).
    pub fn standings(&self, live: &[Arc<BookEntry>], now_ms: u64) -> Standings<'_> {
        let view = self.standing.trust();
        let best = live
            .iter()
            .filter_map(|e| view.get(&e.advert.provider).copied())
            .fold(0.0, f64::max);
        Standings {
            trust: self,
            book: self.reliability.lock().ok(),
            view,
            best,
            now_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standing(success: f64, trust: f64, hardware_flagged: bool) -> ProviderStanding {
        ProviderStanding {
            success,
            trust,
            hardware_flagged,
            measured_speed: None,
        }
    }

    #[test]
    fn reliability_is_half_success_half_trust_and_a_hardware_finding_halves_it() {
        assert_eq!(standing(1.0, 1.0, false).reliability(), 1.0);
        assert_eq!(standing(1.0, 0.0, false).reliability(), 0.5);
        assert_eq!(standing(0.5, 0.5, false).reliability(), 0.5);
        assert_eq!(standing(1.0, 1.0, true).reliability(), 0.5);
        // A fresh key that has not failed yet ranks below a verified provider that failed
        // once in ten.
        assert!(standing(1.0, 0.0, false).reliability() < standing(0.9, 1.0, false).reliability());
    }
}
