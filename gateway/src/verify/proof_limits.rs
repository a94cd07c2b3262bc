//! How many gossiped fraud proofs this node checks, per reporter and per accused. Anyone
//! can mint well-formed proofs against throwaway keys, and each costs a replay: without
//! a bound a flood of them would keep this node's engine busy (and, where it serves,
//! its customers waiting). Two token buckets per id (the order book's
//! [`RateBuckets`]), an hour's budget each. Pure: time is an argument.

use sharemesh_mesh::orderbook::RateBuckets;
use sharemesh_protocol::NodeId;

/// Proofs checked per reporter in an hour (a burst, then one every 7.5 minutes).
pub const PER_REPORTER: u32 = 8;
/// Proofs checked against one accused in an hour (one confirmed is enough).
pub const PER_ACCUSED: u32 = 4;
const HOUR_MS: u64 = 3_600_000;
/// Ids tracked on each side before full buckets are forgotten.
const MAX_TRACKED: usize = 10_000;

/// Why a proof was not checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProofLimited {
    #[error("the reporter used its {PER_REPORTER} proofs an hour")]
    Reporter,
    #[error("{PER_ACCUSED} proofs an hour against the accused were checked")]
    Accused,
}

/// The per-reporter and per-accused budgets.
pub struct ProofLimits {
    reporters: RateBuckets,
    accused: RateBuckets,
}

impl Default for ProofLimits {
    fn default() -> Self {
        let bucket =
            |per_hour: u32| RateBuckets::new(HOUR_MS / u64::from(per_hour), per_hour, MAX_TRACKED);
        Self {
            reporters: bucket(PER_REPORTER),
            accused: bucket(PER_ACCUSED),
        }
    }
}

impl ProofLimits {
    /// Takes one proof from `reporter` against `accused` into the budgets, or says why
    /// it is over them (and then draws from neither).
    pub fn admit(
        &mut self,
        reporter: NodeId,
        accused: NodeId,
        now_ms: u64,
    ) -> Result<(), ProofLimited> {
        if !self.reporters.allows(&reporter, now_ms) {
            return Err(ProofLimited::Reporter);
        }
        if !self.accused.allows(&accused, now_ms) {
            return Err(ProofLimited::Accused);
        }
        self.reporters.draw(reporter, now_ms);
        self.accused.draw(accused, now_ms);
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
        // A refused proof drew nothing from its reporter's budget.
        assert!(limits.reporters.allows(&node(9), 30));
        assert_eq!(limits.reporters.len(), 5, "no bucket drawn for node 9");
        // An hour later both budgets are whole again.
        assert_eq!(limits.admit(node(1), node(50), HOUR_MS + 20), Ok(()));
    }

    #[test]
    fn tracking_is_bounded() {
        let mut limits = ProofLimits::default();
        for i in 0..(MAX_TRACKED as u32 + 10) {
            let mut id = [0u8; 32];
            id[..4].copy_from_slice(&i.to_le_bytes());
            let _ = limits.admit(NodeId::from_bytes(id), node(1), u64::from(i) * HOUR_MS);
        }
        assert!(limits.reporters.len() <= MAX_TRACKED);
    }
}
