//! Why the book did not take an advert, and whether that is the sender's fault.
//!
//! gossipsub penalises a `Reject` heavily (the invalid-message weight is squared), so
//! only what no honest node would ever forward is a violation: bytes that do not
//! decode, a bad signature, a body that fails validation, a lifetime over the limit.
//! Clocks drift and gossip reorders, so an expired, future-dated or superseded advert
//! is only ignored; so is one over its signer's rate or one the full book declines.

use sharemesh_protocol::{DecodeError, NodeId, OpenError, ReplayError, ValidationError};

#[derive(Debug, thiserror::Error)]
pub enum AdvertRefusal {
    #[error("undecodable: {0}")]
    Decode(#[from] DecodeError),
    #[error("invalid: {0}")]
    Open(#[from] OpenError),
    /// Validly signed, but the body fails validation (a catalog name on another
    /// model's id, a body naming another author): the signer's own fault.
    #[error("signed by {signer} but invalid: {error}")]
    Invalid {
        signer: NodeId,
        error: ValidationError,
    },
    #[error("replayed: {0}")]
    Replay(#[from] ReplayError),
    #[error("signer {signer} is over its advert rate (one per {refill_ms} ms, burst {burst})")]
    RateLimited {
        signer: NodeId,
        refill_ms: u64,
        burst: u32,
    },
    #[error("the order book is full of known providers ({entries} adverts, {bytes} bytes)")]
    Full { entries: usize, bytes: usize },
}

impl AdvertRefusal {
    /// Whether the message is one no honest node sends or forwards (gossipsub `Reject`);
    /// otherwise it is dropped without penalty (`Ignore`).
    pub fn is_violation(&self) -> bool {
        match self {
            AdvertRefusal::Decode(_) | AdvertRefusal::Invalid { .. } => true,
            AdvertRefusal::Open(open) => !open.is_untimely(),
            AdvertRefusal::Replay(_)
            | AdvertRefusal::RateLimited { .. }
            | AdvertRefusal::Full { .. } => false,
        }
    }

    /// The signer whose own signature covers the fault. Only such a fault is the
    /// signer's to answer for; anything else could have been made up by whoever
    /// forwarded it.
    pub fn signed_fault(&self) -> Option<NodeId> {
        match self {
            AdvertRefusal::Invalid { signer, .. } => Some(*signer),
            _ => None,
        }
    }
}
