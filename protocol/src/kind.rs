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
    OutputCommitment,
    ReputationReport,
    // New kinds go last: the discriminant's index is on the wire.
    QuoteRequest,
}

impl MessageKind {
    /// The signing domain, `sharemesh/<version>/<kind>`.
    pub fn domain(self) -> &'static str {
        match self {
            MessageKind::Advert => "sharemesh/1/advert",
            MessageKind::Attestation => "sharemesh/1/attestation",
            MessageKind::JobRequest => "sharemesh/1/job-request",
            MessageKind::Quote => "sharemesh/1/quote",
            MessageKind::Accept => "sharemesh/1/accept",
            MessageKind::Reject => "sharemesh/1/reject",
            MessageKind::TokenChunk => "sharemesh/1/token-chunk",
            MessageKind::Receipt => "sharemesh/1/receipt",
            MessageKind::OutputCommitment => "sharemesh/1/output-commitment",
            MessageKind::ReputationReport => "sharemesh/1/reputation-report",
            MessageKind::QuoteRequest => "sharemesh/1/quote-request",
        }
    }
}
