//! A model's identity and its header. A model id commits separately to the GGUF
//! file's header (everything before the tensor data: metadata with the vocabulary and
//! chat template, and the tensor table) and to its tensor data:
//!
//! `ModelId = sha256("sharemesh/model-id/1" ‖ sha256(header) ‖ sha256(tensor data))`
//!
//! so a node that holds only the header and the tensor data's digest can check that
//! the header belongs to a model id, and count tokens with it, without the weights.
//! `/sharemesh/model-header/2` carries it: the asker writes the 32-byte model id; the
//! provider answers `tensor digest (32 bytes) ‖ header length (u64, big-endian) ‖
//! header`, or a length of 0 for a model it does not serve.

use sha2::{Digest as _, Sha256};

use crate::ids::ModelId;

const DOMAIN: &[u8] = b"sharemesh/model-id/1";

/// The largest header a node sends or accepts (the largest vocabularies take ~10 MiB).
pub const MAX_HEADER_BYTES: u64 = 64 << 20;

impl ModelId {
    /// The id of a model whose header and tensor data have these sha256 digests.
    pub fn of_parts(header_digest: &[u8; 32], tensor_digest: &[u8; 32]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(DOMAIN);
        hasher.update(header_digest);
        hasher.update(tensor_digest);
        Self::from_bytes(hasher.finalize().into())
    }

    /// Whether `header` (with the tensor data's digest beside it) is this model's.
    pub fn is_header_of(&self, header: &[u8], tensor_digest: &[u8; 32]) -> bool {
        let header_digest: [u8; 32] = Sha256::digest(header).into();
        Self::of_parts(&header_digest, tensor_digest) == *self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_checked_against_the_id_without_the_weights() {
        let header = b"GGUF header bytes".to_vec();
        let tensors: [u8; 32] = Sha256::digest(b"weights").into();
        let id = ModelId::of_parts(&Sha256::digest(&header).into(), &tensors);
        assert!(id.is_header_of(&header, &tensors));
        let mut forged = header.clone();
        forged[0] ^= 1;
        assert!(!id.is_header_of(&forged, &tensors));
        assert!(!id.is_header_of(&header, &[0; 32]));
        // Domain-separated: not the plain hash of the two digests.
        let mut plain = Sha256::new();
        plain.update(Sha256::digest(&header));
        plain.update(tensors);
        assert_ne!(id.as_bytes(), &<[u8; 32]>::from(plain.finalize()));
    }
}
