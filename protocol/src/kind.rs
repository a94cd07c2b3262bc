//! The kinds of signed message. A module of its own: the envelope signs over the kind
//! and the errors name it, and neither should import the other for it.

use serde::{Deserialize, Serialize};

/// Which message an envelope carries. The discriminant is part of the signed bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MessageKind {
    Advert,
    Attestation,
    JobRequest,
    Quote,
    Accept,
    Reject,
    TokenChunk,
    Receipt,
    /// Retired: the commitment chain in every `TokenChunk` replaced it. Kept so the
    /// discriminants after it keep their index.
    OutputCommitment,
    ReputationReport,
    // New kinds go last: the discriminant's index is on the wire.
    QuoteRequest,
    FraudProof,
    SettlementBinding,
    SpendingAuthorisation,
}

impl MessageKind {
    /// The signing domain, `sharemesh/<version>/<kind>`.
    pub fn domain(self) -> &'static str {
        match self {
            MessageKind::Advert => "sharemesh/2/advert",
            MessageKind::Attestation => "sharemesh/2/attestation",
            MessageKind::JobRequest => "sharemesh/2/job-request",
            MessageKind::Quote => "sharemesh/2/quote",
            MessageKind::Accept => "sharemesh/2/accept",
            MessageKind::Reject => "sharemesh/2/reject",
            MessageKind::TokenChunk => "sharemesh/2/token-chunk",
            MessageKind::Receipt => "sharemesh/2/receipt",
            MessageKind::OutputCommitment => "sharemesh/2/output-commitment",
            MessageKind::ReputationReport => "sharemesh/2/reputation-report",
            MessageKind::QuoteRequest => "sharemesh/2/quote-request",
            MessageKind::FraudProof => "sharemesh/2/fraud-proof",
            MessageKind::SettlementBinding => "sharemesh/2/settlement-binding",
            MessageKind::SpendingAuthorisation => "sharemesh/2/spending-authorisation",
        }
    }
}
