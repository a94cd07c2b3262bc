//! Identifier newtypes: bytes on the wire, text (base58 PeerId / hex) in JSON and config.

use std::fmt;
use std::str::FromStr;

use libp2p_identity::PeerId;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ParseIdError;

/// A node's identity: its ed25519 public key. The same key is the node's libp2p
/// identity, so a `NodeId` maps one-to-one onto a `PeerId`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId([u8; 32]);

impl NodeId {
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The libp2p `PeerId` of this key (identity multihash of the protobuf-encoded key).
    pub fn peer_id(&self) -> Result<PeerId, ParseIdError> {
        let key = libp2p_identity::ed25519::PublicKey::try_from_bytes(&self.0)
            .map_err(|_| ParseIdError::NotEd25519)?;
        Ok(PeerId::from_public_key(&libp2p_identity::PublicKey::from(
            key,
        )))
    }

    /// Recovers the key from a `PeerId`; only ed25519 PeerIds (which inline their key) work.
    pub fn from_peer_id(peer: &PeerId) -> Result<Self, ParseIdError> {
        let multihash = peer.as_ref();
        if multihash.code() != 0 {
            return Err(ParseIdError::NotEd25519);
        }
        let key = libp2p_identity::PublicKey::try_decode_protobuf(multihash.digest())
            .map_err(|_| ParseIdError::NotEd25519)?;
        let ed = key
            .try_into_ed25519()
            .map_err(|_| ParseIdError::NotEd25519)?;
        Ok(Self(ed.to_bytes()))
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.peer_id() {
            Ok(peer) => write!(f, "{peer}"),
            Err(_) => write!(f, "invalid-key:{}", hex::encode(self.0)),
        }
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({self})")
    }
}

impl FromStr for NodeId {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let peer = PeerId::from_str(s).map_err(|_| ParseIdError::BadPeerId(s.to_owned()))?;
        Self::from_peer_id(&peer)
    }
}

macro_rules! hex_id {
    ($(#[$meta:meta])* $name:ident, $len:expr) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name([u8; $len]);

        impl $name {
            pub const LEN: usize = $len;
            pub const fn from_bytes(bytes: [u8; $len]) -> Self {
                Self(bytes)
            }
            pub const fn as_bytes(&self) -> &[u8; $len] {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex::encode(self.0))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self)
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let mut out = [0u8; $len];
                hex::decode_to_slice(s, &mut out).map_err(|_| ParseIdError::BadHex {
                    what: stringify!($name),
                    expected_len: $len * 2,
                    input: s.chars().take(80).collect(),
                })?;
                Ok(Self(out))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if s.is_human_readable() {
                    s.serialize_str(&self.to_string())
                } else {
                    self.0.serialize(s)
                }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                if d.is_human_readable() {
                    let text = String::deserialize(d)?;
                    text.parse().map_err(D::Error::custom)
                } else {
                    Ok(Self(<[u8; $len]>::deserialize(d)?))
                }
            }
        }
    };
}

hex_id!(
    /// A model: the sha256 of its GGUF file.
    ModelId,
    32
);
hex_id!(
    /// A job (one completion request), chosen at random by the buyer.
    JobId,
    16
);
hex_id!(
    /// A sha256 digest used as evidence (request, output or receipt hashes).
    Digest,
    32
);

impl Serialize for NodeId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&self.to_string())
        } else {
            self.0.serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for NodeId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            let text = String::deserialize(d)?;
            text.parse().map_err(D::Error::custom)
        } else {
            Ok(Self(<[u8; 32]>::deserialize(d)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_round_trips_through_peer_id_text() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
        let node = NodeId::from_bytes(key.verifying_key().to_bytes());
        let text = node.to_string();
        assert!(text.starts_with("12D3KooW"), "{text}");
        assert_eq!(text.parse::<NodeId>().unwrap(), node);
        let json = serde_json::to_string(&node).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<NodeId>(&json).unwrap(), node);
    }

    #[test]
    fn node_id_parse_errors_name_the_input() {
        let err = "not-a-peer".parse::<NodeId>().unwrap_err();
        assert!(err.to_string().contains("not-a-peer"));
    }

    #[test]
    fn model_id_parses_hex_and_rejects_bad_lengths() {
        let hex = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
        let id: ModelId = hex.parse().unwrap();
        assert_eq!(id.to_string(), hex);
        assert!("abcd".parse::<ModelId>().is_err());
        assert!("zz".repeat(32).parse::<ModelId>().is_err());
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<ModelId>(&json).unwrap(), id);
    }
}
