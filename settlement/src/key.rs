//! The node's chain account: a secp256k1 key derived from its ed25519 identity, so a node
//! has one secret to keep. Others learn the pairing from a binding the ed25519 key signs
//! (`SettlementBinding`, exchanged over `/sharemesh/settle/2`, SPEC §13); the derivation
//! itself is never needed to check it.

use alloy_primitives::{keccak256, Address, Signature, B256};
use k256::ecdsa::SigningKey;

/// Domain separation: this derivation and nothing else hashes this prefix.
const DERIVATION_DOMAIN: &[u8] = b"sharemesh/1/evm-account-key";

#[derive(Debug, thiserror::Error)]
#[error("not a valid secp256k1 secret key (zero, or not below the curve order)")]
pub struct InvalidKey;

/// A secp256k1 account key. Debug never prints the secret.
#[derive(Clone)]
pub struct AccountKey {
    signing: SigningKey,
    address: Address,
}

impl std::fmt::Debug for AccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountKey")
            .field("address", &self.address)
            .finish()
    }
}

impl AccountKey {
    pub fn from_bytes(secret: &B256) -> Result<Self, InvalidKey> {
        let signing = SigningKey::from_bytes(&secret.0.into()).map_err(|_| InvalidKey)?;
        let address = Address::from_public_key(signing.verifying_key());
        Ok(AccountKey { signing, address })
    }

    /// The chain key of the node whose ed25519 secret is `node_secret`.
    pub fn derive(node_secret: &[u8; 32]) -> Result<Self, InvalidKey> {
        let mut input = Vec::with_capacity(DERIVATION_DOMAIN.len() + 32);
        input.extend_from_slice(DERIVATION_DOMAIN);
        input.extend_from_slice(node_secret);
        Self::from_bytes(&keccak256(&input))
    }

    pub fn address(&self) -> Address {
        self.address
    }

    /// Signs a 32-byte digest; `s` is always in the lower half of the curve order (the
    /// only form the escrow and Ethereum transactions accept).
    pub fn sign_hash(&self, digest: &B256) -> Signature {
        // A 32-byte prehash is the one input k256 can refuse, and it is always 32 bytes.
        #[allow(clippy::expect_used)]
        let (signature, recovery) = self
            .signing
            .sign_prehash_recoverable(digest.as_slice())
            .expect("a 32-byte prehash signs");
        let (signature, odd) = match signature.normalize_s() {
            Some(low) => (low, !recovery.is_y_odd()),
            None => (signature, recovery.is_y_odd()),
        };
        Signature::from_signature_and_parity(signature, odd)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_node_secret_has_its_own_stable_account() {
        let a = AccountKey::derive(&[1; 32]).unwrap().address();
        assert_eq!(a, AccountKey::derive(&[1; 32]).unwrap().address());
        assert_ne!(a, AccountKey::derive(&[2; 32]).unwrap().address());
    }

    #[test]
    fn signatures_recover_to_the_account_and_are_low_s() {
        let key = AccountKey::from_bytes(&B256::repeat_byte(5)).unwrap();
        for i in 0..32u8 {
            let digest = keccak256([i]);
            let signature = key.sign_hash(&digest);
            assert_eq!(
                signature.recover_address_from_prehash(&digest).unwrap(),
                key.address()
            );
            assert!(signature.normalize_s().is_none(), "high s for digest {i}");
        }
    }

    #[test]
    fn anvils_first_dev_key_has_its_well_known_address() {
        let secret: B256 = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
            .parse()
            .unwrap();
        assert_eq!(
            AccountKey::from_bytes(&secret).unwrap().address(),
            "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
                .parse::<Address>()
                .unwrap()
        );
    }

    #[test]
    fn zero_is_not_a_key() {
        assert!(AccountKey::from_bytes(&B256::ZERO).is_err());
        let _ = format!(
            "{:?}",
            AccountKey::from_bytes(&B256::repeat_byte(5)).unwrap()
        );
    }
}
