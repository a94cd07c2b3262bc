//! The signed envelope that wraps every message.
//!
//! signature = ed25519(key, "sharemesh/2/<kind>" ‖ 0x00 ‖ encode(SignedFields))
//!
//! The domain prefix keeps a signature over one message type from ever verifying as
//! another; the signer's key is the node's libp2p identity key, so signer = PeerId.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::codec;
use crate::error::{DecodeError, OpenError, ValidationError};
use crate::ids::{Digest, NodeId};
use crate::kind::MessageKind;
use crate::messages::*;
use crate::{MAX_CLOCK_SKEW_MS, MAX_ENVELOPE_BYTES, PROTOCOL_VERSION};

/// A message body that can travel in an envelope.
pub trait WireMessage: Serialize + DeserializeOwned {
    const KIND: MessageKind;
    /// Largest encoded body accepted.
    const MAX_BYTES: usize;
    /// Longest `expires_at - issued_at` accepted.
    const MAX_LIFETIME_MS: u64;
    /// The identity the body claims as its author; must equal the envelope's signer.
    fn author(&self) -> NodeId;
    fn validate(&self) -> Result<(), ValidationError>;
}

const MINUTE: u64 = 60_000;
const DAY: u64 = 24 * 60 * MINUTE;

macro_rules! wire {
    ($ty:ty, $kind:ident, $max:expr, $life:expr, |$m:ident| $author:expr, $validate:expr) => {
        impl WireMessage for $ty {
            const KIND: MessageKind = MessageKind::$kind;
            const MAX_BYTES: usize = $max;
            const MAX_LIFETIME_MS: u64 = $life;
            fn author(&self) -> NodeId {
                let $m = self;
                $author
            }
            fn validate(&self) -> Result<(), ValidationError> {
                let f: fn(&Self) -> Result<(), ValidationError> = $validate;
                f(self)
            }
        }
    };
}

wire!(
    Advert,
    Advert,
    64 * 1024,
    // A small multiple of the refresh interval (providers refresh every ≤ 30 s): a
    // flood of adverts cannot outlive its signers by long.
    2 * MINUTE,
    |m| m.provider,
    Advert::validate
);
wire!(
    Attestation,
    Attestation,
    64 * 1024,
    DAY,
    |m| m.node,
    Attestation::validate
);
wire!(
    JobRequest,
    JobRequest,
    MAX_ENVELOPE_BYTES - 1024,
    DAY,
    |m| m.buyer,
    JobRequest::validate
);
wire!(
    QuoteRequest,
    QuoteRequest,
    1024,
    10 * MINUTE,
    |m| m.buyer,
    QuoteRequest::validate
);
wire!(Quote, Quote, 1024, 10 * MINUTE, |m| m.provider, |_| Ok(()));
wire!(Accept, Accept, 1024, DAY, |m| m.provider, |_| Ok(()));
wire!(Reject, Reject, 4096, DAY, |m| m.provider, |_| Ok(()));
wire!(
    TokenChunk,
    TokenChunk,
    256 * 1024,
    DAY,
    |m| m.provider,
    TokenChunk::validate
);
wire!(
    Receipt,
    Receipt,
    1024,
    365 * DAY,
    |m| m.buyer,
    Receipt::validate
);
wire!(
    ReputationReport,
    ReputationReport,
    32 * 1024,
    DAY,
    |m| m.reporter,
    ReputationReport::validate
);

/// The fields covered by the signature, in this order.
#[derive(Serialize)]
struct SignedFields<'a> {
    version: u16,
    kind: MessageKind,
    signer: &'a NodeId,
    seq: u64,
    issued_at_ms: u64,
    expires_at_ms: u64,
    payload: &'a [u8],
}

/// A signed message as it travels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedEnvelope {
    pub version: u16,
    pub kind: MessageKind,
    pub signer: NodeId,
    /// Strictly increasing per (signer, kind, scope); see [`crate::ReplayGuard`].
    pub seq: u64,
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
    /// The canonical encoding of the body.
    pub payload: Vec<u8>,
    #[serde(with = "signature_bytes")]
    pub signature: [u8; 64],
}

mod signature_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(sig: &[u8; 64], s: S) -> Result<S::Ok, S::Error> {
        let (a, b) = sig.split_at(32);
        let mut first = [0u8; 32];
        let mut second = [0u8; 32];
        first.copy_from_slice(a);
        second.copy_from_slice(b);
        (first, second).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 64], D::Error> {
        let (first, second) = <([u8; 32], [u8; 32])>::deserialize(d)?;
        let mut out = [0u8; 64];
        out[..32].copy_from_slice(&first);
        out[32..].copy_from_slice(&second);
        Ok(out)
    }
}

/// A node's signing key (the same ed25519 key as its libp2p identity).
pub struct Keypair {
    signing: SigningKey,
}

impl Keypair {
    pub fn from_secret(secret: [u8; 32]) -> Self {
        Self {
            signing: SigningKey::from_bytes(&secret),
        }
    }

    pub fn secret(&self) -> [u8; 32] {
        self.signing.to_bytes()
    }

    pub fn node_id(&self) -> NodeId {
        NodeId::from_bytes(self.signing.verifying_key().to_bytes())
    }

    /// Signs `body` as sequence `seq`, valid from `issued_at_ms` for `lifetime_ms`.
    pub fn seal<T: WireMessage>(
        &self,
        body: &T,
        seq: u64,
        issued_at_ms: u64,
        lifetime_ms: u64,
    ) -> Result<SignedEnvelope, DecodeError> {
        let payload = codec::encode(body, "payload")?;
        if payload.len() > T::MAX_BYTES {
            return Err(DecodeError::TooLarge {
                what: "payload",
                len: payload.len(),
                limit: T::MAX_BYTES,
            });
        }
        let signer = self.node_id();
        let expires_at_ms = issued_at_ms.saturating_add(lifetime_ms.min(T::MAX_LIFETIME_MS));
        let message = signing_input(T::KIND, &signer, seq, issued_at_ms, expires_at_ms, &payload)?;
        let signature = self.signing.sign(&message).to_bytes();
        Ok(SignedEnvelope {
            version: PROTOCOL_VERSION,
            kind: T::KIND,
            signer,
            seq,
            issued_at_ms,
            expires_at_ms,
            payload,
            signature,
        })
    }
}

impl std::fmt::Debug for Keypair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keypair({})", self.node_id())
    }
}

fn signing_input(
    kind: MessageKind,
    signer: &NodeId,
    seq: u64,
    issued_at_ms: u64,
    expires_at_ms: u64,
    payload: &[u8],
) -> Result<Vec<u8>, DecodeError> {
    let fields = SignedFields {
        version: PROTOCOL_VERSION,
        kind,
        signer,
        seq,
        issued_at_ms,
        expires_at_ms,
        payload,
    };
    let mut input = kind.domain().as_bytes().to_vec();
    input.push(0);
    input.extend(codec::encode(&fields, "envelope")?);
    Ok(input)
}

/// A verified message and the envelope facts a caller needs for replay checks.
#[derive(Clone, Debug, PartialEq)]
pub struct Opened<T> {
    pub body: T,
    pub signer: NodeId,
    pub seq: u64,
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
}

impl SignedEnvelope {
    pub fn to_bytes(&self) -> Result<Vec<u8>, DecodeError> {
        codec::encode(self, "envelope")
    }

    /// Decodes an envelope from untrusted bytes (size-limited; never panics).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        let envelope: Self = codec::decode(bytes, "envelope", MAX_ENVELOPE_BYTES)?;
        if envelope.version != PROTOCOL_VERSION {
            return Err(DecodeError::UnsupportedVersion {
                got: envelope.version,
                supported: PROTOCOL_VERSION,
            });
        }
        Ok(envelope)
    }

    /// sha256 of the envelope's encoding: how evidence and ledgers refer to it.
    pub fn digest(&self) -> Result<Digest, DecodeError> {
        Ok(Digest::from_bytes(Sha256::digest(self.to_bytes()?).into()))
    }

    /// Checks the signature alone, with no clock: for archived evidence (receipts,
    /// commitments) that must stay verifiable after they expire.
    pub fn verify_signature(&self) -> Result<(), OpenError> {
        let key = VerifyingKey::from_bytes(self.signer.as_bytes())
            .map_err(|_| OpenError::BadSignerKey)?;
        self.verify_signature_with(&key)
    }

    /// [`Self::verify_signature`] with the signer's key already decompressed (see
    /// [`SignerKeys`]); `key` must be the signer's.
    fn verify_signature_with(&self, key: &VerifyingKey) -> Result<(), OpenError> {
        if self.version != PROTOCOL_VERSION {
            return Err(DecodeError::UnsupportedVersion {
                got: self.version,
                supported: PROTOCOL_VERSION,
            }
            .into());
        }
        let input = signing_input(
            self.kind,
            &self.signer,
            self.seq,
            self.issued_at_ms,
            self.expires_at_ms,
            &self.payload,
        )?;
        key.verify_strict(&input, &Signature::from_bytes(&self.signature))
            .map_err(|_| OpenError::BadSignature)
    }

    /// Verifies the signature and decodes and validates the body, without time checks.
    pub fn open_archived<T: WireMessage>(&self) -> Result<Opened<T>, OpenError> {
        let key = VerifyingKey::from_bytes(self.signer.as_bytes())
            .map_err(|_| OpenError::BadSignerKey)?;
        self.open_archived_with(&key)
    }

    fn open_archived_with<T: WireMessage>(
        &self,
        key: &VerifyingKey,
    ) -> Result<Opened<T>, OpenError> {
        if self.kind != T::KIND {
            return Err(DecodeError::WrongKind {
                expected: T::KIND,
                got: self.kind,
            }
            .into());
        }
        self.verify_signature_with(key)?;
        let body: T = codec::decode(&self.payload, "payload", T::MAX_BYTES)?;
        body.validate()?;
        if body.author() != self.signer {
            return Err(ValidationError::SignerMismatch {
                claimed: body.author().to_string(),
                signer: self.signer.to_string(),
            }
            .into());
        }
        Ok(Opened {
            body,
            signer: self.signer,
            seq: self.seq,
            issued_at_ms: self.issued_at_ms,
            expires_at_ms: self.expires_at_ms,
        })
    }

    /// Full check for live traffic: kind, signature, body, and freshness at `now_ms`.
    pub fn open<T: WireMessage>(&self, now_ms: u64) -> Result<Opened<T>, OpenError> {
        self.check_times::<T>(now_ms)?;
        self.open_archived()
    }

    /// [`Self::open`], taking the signer's decompressed key from `keys` (a node that
    /// hears the same signers again and again skips the point decompression, about a
    /// third of a verification).
    pub fn open_cached<T: WireMessage>(
        &self,
        now_ms: u64,
        keys: &mut SignerKeys,
    ) -> Result<Opened<T>, OpenError> {
        self.check_times::<T>(now_ms)?;
        let key = keys.key(&self.signer)?;
        self.open_archived_with(&key)
    }

    fn check_times<T: WireMessage>(&self, now_ms: u64) -> Result<(), OpenError> {
        if self.expires_at_ms < self.issued_at_ms {
            return Err(OpenError::ExpiresBeforeIssued);
        }
        let lifetime_ms = self.expires_at_ms - self.issued_at_ms;
        if lifetime_ms > T::MAX_LIFETIME_MS {
            return Err(OpenError::LifetimeTooLong {
                kind: self.kind,
                lifetime_ms,
                limit_ms: T::MAX_LIFETIME_MS,
            });
        }
        if now_ms > self.expires_at_ms {
            return Err(OpenError::Expired {
                expires_at_ms: self.expires_at_ms,
                now_ms,
            });
        }
        if self.issued_at_ms > now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
            return Err(OpenError::FromTheFuture {
                issued_at_ms: self.issued_at_ms,
                now_ms,
                skew_ms: MAX_CLOCK_SKEW_MS,
            });
        }
        Ok(())
    }
}

/// Decompressed ed25519 keys of signers seen before, at most `capacity` of them (when
/// full it starts over: a bounded cache needs no clock and no order).
#[derive(Debug)]
pub struct SignerKeys {
    keys: std::collections::HashMap<NodeId, VerifyingKey>,
    capacity: usize,
}

impl SignerKeys {
    pub fn new(capacity: usize) -> Self {
        Self {
            keys: std::collections::HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The signer's key: cached, or decompressed (and then cached).
    pub fn key(&mut self, signer: &NodeId) -> Result<VerifyingKey, OpenError> {
        if let Some(key) = self.keys.get(signer) {
            return Ok(*key);
        }
        let key =
            VerifyingKey::from_bytes(signer.as_bytes()).map_err(|_| OpenError::BadSignerKey)?;
        if self.keys.len() >= self.capacity {
            self.keys.clear();
        }
        self.keys.insert(*signer, key);
        Ok(key)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// sha256 of a body's canonical encoding (e.g. the request hash in a commitment).
pub fn body_digest<T: Serialize>(body: &T) -> Result<Digest, DecodeError> {
    Ok(Digest::from_bytes(
        Sha256::digest(codec::encode(body, "body")?).into(),
    ))
}

/// sha256 over token ids as little-endian u32s.
pub fn tokens_digest(tokens: &[u32]) -> Digest {
    let mut hasher = Sha256::new();
    for token in tokens {
        hasher.update(token.to_le_bytes());
    }
    Digest::from_bytes(hasher.finalize().into())
}
