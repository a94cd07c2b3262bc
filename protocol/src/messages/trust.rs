//! Reputation gossip.

use serde::{Deserialize, Serialize};

use super::at_most;
use super::*;
use crate::error::ValidationError;
use crate::ids::{Digest, NodeId};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeCounts {
    pub completed: u32,
    pub failed: u32,
    pub stalled: u32,
    pub verified_ok: u32,
    pub verified_mismatch: u32,
}

/// One reporter's view of one subject over one epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReputationReport {
    pub reporter: NodeId,
    pub subject: NodeId,
    pub epoch: u64,
    pub outcomes: OutcomeCounts,
    /// Hashes of receipts or commitments backing the counts.
    pub evidence: Vec<Digest>,
}

impl ReputationReport {
    pub fn validate(&self) -> Result<(), ValidationError> {
        at_most("evidence", self.evidence.len(), MAX_EVIDENCE_HASHES)?;
        if self.reporter == self.subject {
            return Err(ValidationError::field(
                "subject",
                "a node cannot report on itself",
            ));
        }
        Ok(())
    }
}
