//! How many gossiped fraud proofs this node checks, per reporter and per accused, in a
//! sliding hour. Anyone can mint well-formed proofs against throwaway keys, and each
//! costs a replay: without a bound a flood of them would keep this node's engine busy
//! (and, where it serves, its customers waiting). Pure: time is an argument.

use std::collections::{HashMap, VecDeque};

use sharemesh_protocol::NodeId;

/// Proofs checked per reporter in [`WINDOW_MS`].
pub const PER_REPORTER: usize = 8;
/// Proofs checked against one accused in [`WINDOW_MS`] (one confirmed is enough).
pub const PER_ACCUSED: usize = 4;
/// The sliding window.
pub const WINDOW_MS: u64 = 3_600_000;
/// Nodes tracked on each side before the oldest entries are forgotten.
const MAX_TRACKED: usize = 10_000;

/// Why a proof was not checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProofLimited {
    #[error("the reporter sent {PER_REPORTER} proofs within the hour")]
    Reporter,
    #[error("{PER_ACCUSED} proofs against the accused were checked within the hour")]
    Accused,
}

#[derive(Default)]
struct Recent {
    times: HashMap<NodeId, VecDeque<u64>>,
}

impl Recent {
    fn count(&mut self, node: &NodeId, now_ms: u64) -> usize {
        let Some(times) = self.times.get_mut(node) else {
            return 0;
        };
        while times.front().is_some_and(|&t| t + WINDOW_MS <= now_ms) {
            times.pop_front();
        }
        times.len()
    }

    fn add(&mut self, node: NodeId, now_ms: u64) {
        if self.times.len() >= MAX_TRACKED && !self.times.contains_key(&node) {
            self.times
                .retain(|_, t| t.back().is_some_and(|&t| t + WINDOW_MS > now_ms));
            if self.times.len() >= MAX_TRACKED {
                self.times.clear();
            }
        }
        self.times.entry(node).or_default().push_back(now_ms);
    }
}

/// The per-reporter and per-accused budgets.
#[derive(Default)]
pub struct ProofLimits {
    reporters: Recent,
    accused: Recent,
}

impl ProofLimits {
    /// Takes one proof from `reporter` against `accused` into the budgets, or says why
    /// it is over them (and then counts nothing).
    pub fn admit(
        &mut self,
        reporter: NodeId,
        accused: NodeId,
        now_ms: u64,
    ) -> Result<(), ProofLimited> {
        if self.reporters.count(&reporter, now_ms) >= PER_REPORTER {
            return Err(ProofLimited::Reporter);
        }
        if self.accused.count(&accused, now_ms) >= PER_ACCUSED {
            return Err(ProofLimited::Accused);
        }
        self.reporters.add(reporter, now_ms);
        self.accused.add(accused, now_ms);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: u8) -> NodeId {
        NodeId::from_bytes([n; 32])
    }

    #[test]
    fn a_reporter_and_an_accused_each_have_an_hourly_budget() {
        let mut limits = ProofLimits::default();
        for i in 0..PER_REPORTER as u8 {
            assert_eq!(limits.admit(node(1), node(100 + i), 0), Ok(()));
        }
        assert_eq!(
            limits.admit(node(1), node(50), 10),
            Err(ProofLimited::Reporter)
        );
        // Another reporter is not held back by the first one's flood.
        assert_eq!(limits.admit(node(2), node(50), 10), Ok(()));
        // One accused: four checks an hour, from whoever.
        for r in 3..3 + PER_ACCUSED as u8 - 1 {
            assert_eq!(limits.admit(node(r), node(50), 20), Ok(()));
        }
        assert_eq!(
            limits.admit(node(9), node(50), 30),
            Err(ProofLimited::Accused)
        );
        // A refused proof counted nothing against its reporter.
        assert_eq!(limits.reporters.count(&node(9), 30), 0);
        // An hour later both budgets are whole again.
        assert_eq!(limits.admit(node(1), node(50), WINDOW_MS + 20), Ok(()));
    }

    #[test]
    fn tracking_is_bounded() {
        let mut limits = ProofLimits::default();
        for i in 0..(MAX_TRACKED as u32 + 10) {
            let mut id = [0u8; 32];
            id[..4].copy_from_slice(&i.to_le_bytes());
            let _ = limits.admit(NodeId::from_bytes(id), node(1), u64::from(i) * WINDOW_MS);
        }
        assert!(limits.reporters.times.len() <= MAX_TRACKED);
    }
}
