//! Typed errors, one enum per fallible operation a caller branches on.

use crate::kind::MessageKind;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseIdError {
    #[error("`{0}` is not a valid PeerId")]
    BadPeerId(String),
    #[error("the key is not an ed25519 key (sharemesh identities are ed25519)")]
    NotEd25519,
    #[error("{what} must be {expected_len} hex characters, got `{input}`")]
    BadHex {
        what: &'static str,
        expected_len: usize,
        input: String,
    },
}

/// Why bytes could not be turned into a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{what} is {len} bytes, over the limit of {limit}")]
    TooLarge {
        what: &'static str,
        len: usize,
        limit: usize,
    },
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
    #[error("{what} has {extra} trailing bytes after its encoding")]
    TrailingBytes { what: &'static str, extra: usize },
    #[error("unsupported protocol version {got} (this node speaks {supported})")]
    UnsupportedVersion { got: u16, supported: u16 },
    #[error("expected a {expected:?} message, got {got:?}")]
    WrongKind {
        expected: MessageKind,
        got: MessageKind,
    },
}

/// Why a message's content is not acceptable even though it decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("field `{field}` is invalid: {reason}")]
    Field { field: &'static str, reason: String },
    #[error("the message names {claimed} as its author but was signed by {signer}")]
    SignerMismatch { claimed: String, signer: String },
}

impl ValidationError {
    pub fn field(field: &'static str, reason: impl Into<String>) -> Self {
        Self::Field {
            field,
            reason: reason.into(),
        }
    }
}

/// Why a signed envelope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("bad signature")]
    BadSignature,
    #[error("the signer key is not a valid ed25519 point")]
    BadSignerKey,
    #[error("expired at {expires_at_ms} ms, now {now_ms} ms")]
    Expired { expires_at_ms: u64, now_ms: u64 },
    #[error(
        "issued at {issued_at_ms} ms, in the future (now {now_ms} ms, allowed skew {skew_ms} ms)"
    )]
    FromTheFuture {
        issued_at_ms: u64,
        now_ms: u64,
        skew_ms: u64,
    },
    #[error("lifetime {lifetime_ms} ms exceeds the {limit_ms} ms allowed for {kind:?}")]
    LifetimeTooLong {
        kind: MessageKind,
        lifetime_ms: u64,
        limit_ms: u64,
    },
    #[error("expires before it was issued")]
    ExpiresBeforeIssued,
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

impl OpenError {
    /// Refused only because of when it arrived: expired on the way, or issued ahead of
    /// the receiver's clock. An honest relay sends such messages whenever a path (or
    /// the receiver itself) is slow, so they are dropped, never held against the sender.
    pub fn is_untimely(&self) -> bool {
        matches!(
            self,
            OpenError::Expired { .. } | OpenError::FromTheFuture { .. }
        )
    }
}

/// Why the replay guard refused a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    #[error("sequence {got} already seen or superseded (highest accepted {highest})")]
    Stale { got: u64, highest: u64 },
}
