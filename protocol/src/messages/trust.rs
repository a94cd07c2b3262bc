//! Reputation gossip: each node's own verified dealings, signed once per epoch.

use serde::{Deserialize, Serialize};

use super::at_most;
use crate::error::ValidationError;
use crate::ids::NodeId;

/// Most subjects one report names.
pub const MAX_REPORT_ENTRIES: usize = 256;

/// What the reporter verified of one provider (its own replays only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedDealings {
    pub verified_jobs: u32,
    pub verified_tokens: u64,
    /// Verifications that failed (each one a fraud proof the reporter published).
    pub mismatches: u32,
    pub failures: u32,
}

/// One reporter's verified dealings with providers, as of `epoch` (the reporter's
/// Unix minute when it signed; the envelope's sequence number orders reports).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReputationReport {
    pub reporter: NodeId,
    pub epoch: u64,
    pub entries: Vec<(NodeId, ReportedDealings)>,
}

impl ReputationReport {
    pub fn validate(&self) -> Result<(), ValidationError> {
        at_most("entries", self.entries.len(), MAX_REPORT_ENTRIES)?;
        if self
            .entries
            .iter()
            .any(|(subject, _)| *subject == self.reporter)
        {
            return Err(ValidationError::field(
                "entries",
                "a node cannot report on itself",
            ));
        }
        let mut subjects: Vec<&NodeId> = self.entries.iter().map(|(s, _)| s).collect();
        subjects.sort();
        if subjects.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(ValidationError::field("entries", "a subject appears twice"));
        }
        Ok(())
    }
}
