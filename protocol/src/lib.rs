//! sharemesh wire protocol: every message that crosses the network, its canonical
//! encoding, and its signed envelope. Pure: no sockets, no files, no clock (time is
//! always an argument, in milliseconds since the Unix epoch).
//!
//! `SPEC.md` at the repository root describes exactly what this crate does.

pub mod catalog;
pub mod codec;
pub mod commitment;
pub mod envelope;
pub mod error;
pub mod fraud;
pub mod ids;
pub mod kind;
pub mod messages;
pub mod model_header;
pub mod money;
pub mod names;
pub mod replay;
pub mod settlement;

pub use commitment::{ExecutionProfile, StepFingerprint};
pub use envelope::{Keypair, Opened, SignedEnvelope, SignerKeys, WireMessage};
pub use error::{DecodeError, OpenError, ParseIdError, ReplayError, ValidationError};
pub use fraud::{ChainLink, Evidence, FraudProof, ProofError};
pub use ids::{Digest, JobId, ModelId, NodeId};
pub use kind::MessageKind;
pub use messages::*;
pub use money::NanoUsd;
pub use names::{GossipTopic, StreamName};
pub use replay::ReplayGuard;
pub use settlement::{SettlementBinding, SpendingAuthorisation};

/// The protocol version this crate speaks. Carried in every envelope, every topic
/// name and every stream protocol id.
pub const PROTOCOL_VERSION: u16 = 2;

/// Largest encoded envelope accepted from the network.
pub const MAX_ENVELOPE_BYTES: usize = 1024 * 1024;

/// Clock skew tolerated for `issued_at` in the future.
pub const MAX_CLOCK_SKEW_MS: u64 = 30_000;
