//! Spending authorisations: the buyer's EIP-712 signature over the cumulative amount a
//! channel may pay its provider. Signed and checked offline; the escrow contract checks
//! the same digest on redemption.

use alloy_primitives::{Address, Signature, B256, U256};
use alloy_sol_types::{eip712_domain, sol, Eip712Domain, SolStruct};
use serde::{Deserialize, Serialize};

use crate::key::AccountKey;
use crate::units::TokenUnits;

sol! {
    /// The EIP-712 type the buyer signs (`SharemeshEscrow.SPENDING_AUTH_TYPEHASH`).
    #[derive(Debug, PartialEq, Eq)]
    struct SpendingAuth {
        address buyer;
        address provider;
        uint256 cumulative;
    }
}

/// The EIP-712 domain's name and version, as the contract hashes them.
pub const DOMAIN_NAME: &str = "sharemesh escrow";
pub const DOMAIN_VERSION: &str = "1";

/// secp256k1's order halved: the contract refuses the malleable twin above it.
const HALF_ORDER: U256 = U256::from_limbs([
    0xdfe9_2f46_681b_20a0,
    0x5d57_6e73_57a4_501d,
    0xffff_ffff_ffff_ffff,
    0x7fff_ffff_ffff_ffff,
]);

/// One payment channel: a buyer's deposit in one escrow on one chain, toward one
/// provider. Every field is in the signed digest, so an authorisation for one channel
/// redeems on no other (chain, contract, buyer or provider).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Channel {
    pub chain_id: u64,
    pub escrow: Address,
    pub buyer: Address,
    pub provider: Address,
}

impl Channel {
    pub fn domain(&self) -> Eip712Domain {
        eip712_domain! {
            name: DOMAIN_NAME,
            version: DOMAIN_VERSION,
            chain_id: self.chain_id,
            verifying_contract: self.escrow,
        }
    }

    /// The digest the buyer signs for `cumulative` on this channel.
    pub fn digest(&self, cumulative: TokenUnits) -> B256 {
        SpendingAuth {
            buyer: self.buyer,
            provider: self.provider,
            cumulative: cumulative.to_u256(),
        }
        .eip712_signing_hash(&self.domain())
    }
}

/// A buyer's signed authorisation, as it travels to the provider and on to the chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedSpendingAuth {
    pub channel: Channel,
    pub cumulative: TokenUnits,
    pub r: B256,
    pub s: B256,
    /// The signature's y parity (v = 27 + parity on chain).
    pub y_parity: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("the signing key's account {key} is not the channel's buyer {buyer}")]
    NotTheBuyer { key: Address, buyer: Address },
    #[error("the signature's s is in the upper half of the curve order (malleable; the escrow refuses it)")]
    HighS,
    #[error("the signature does not recover to any account")]
    Unrecoverable,
    #[error("signed by {signer}, not by the channel's buyer {buyer}")]
    WrongSigner { signer: Address, buyer: Address },
}

impl SignedSpendingAuth {
    /// Signs `cumulative` on `channel` with the buyer's key.
    pub fn sign(
        key: &AccountKey,
        channel: Channel,
        cumulative: TokenUnits,
    ) -> Result<Self, AuthError> {
        if key.address() != channel.buyer {
            return Err(AuthError::NotTheBuyer {
                key: key.address(),
                buyer: channel.buyer,
            });
        }
        let signature = key.sign_hash(&channel.digest(cumulative));
        Ok(SignedSpendingAuth {
            channel,
            cumulative,
            r: signature.r().into(),
            s: signature.s().into(),
            y_parity: signature.v(),
        })
    }

    /// Checks what the escrow will check, before the provider relies on it.
    pub fn verify(&self) -> Result<(), AuthError> {
        let s = U256::from_be_bytes(self.s.0);
        if s > HALF_ORDER {
            return Err(AuthError::HighS);
        }
        let signature = Signature::new(U256::from_be_bytes(self.r.0), s, self.y_parity);
        let signer = signature
            .recover_address_from_prehash(&self.channel.digest(self.cumulative))
            .map_err(|_| AuthError::Unrecoverable)?;
        if signer != self.channel.buyer {
            return Err(AuthError::WrongSigner {
                signer,
                buyer: self.channel.buyer,
            });
        }
        Ok(())
    }

    /// `v` as `ecrecover` takes it.
    pub fn v(&self) -> u8 {
        27 + u8::from(self.y_parity)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use alloy_primitives::address;

    fn key(byte: u8) -> AccountKey {
        AccountKey::from_bytes(&B256::repeat_byte(byte)).unwrap()
    }

    fn channel(buyer: &AccountKey) -> Channel {
        Channel {
            chain_id: 31337,
            escrow: address!("0x5FbDB2315678afecb367f032d93F642f64180aa3"),
            buyer: buyer.address(),
            provider: address!("0x70997970C51812dc3A010C7d01b50e0d17dc79C8"),
        }
    }

    #[test]
    fn a_signed_authorisation_verifies_and_any_changed_field_does_not() {
        let buyer = key(7);
        let auth = SignedSpendingAuth::sign(&buyer, channel(&buyer), TokenUnits(1_500)).unwrap();
        auth.verify().unwrap();
        assert!(matches!(auth.v(), 27 | 28));

        let mut more = auth.clone();
        more.cumulative = TokenUnits(1_501);
        assert!(matches!(more.verify(), Err(AuthError::WrongSigner { .. })));
        let mut elsewhere = auth.clone();
        elsewhere.channel.chain_id = 1;
        assert!(matches!(
            elsewhere.verify(),
            Err(AuthError::WrongSigner { .. })
        ));
        let mut other_escrow = auth.clone();
        other_escrow.channel.escrow = Address::repeat_byte(9);
        assert!(matches!(
            other_escrow.verify(),
            Err(AuthError::WrongSigner { .. })
        ));
        let mut other_provider = auth.clone();
        other_provider.channel.provider = Address::repeat_byte(9);
        assert!(matches!(
            other_provider.verify(),
            Err(AuthError::WrongSigner { .. })
        ));
    }

    #[test]
    fn only_the_buyers_key_signs_for_its_channel() {
        let buyer = key(7);
        let err = SignedSpendingAuth::sign(&key(8), channel(&buyer), TokenUnits(1)).unwrap_err();
        assert!(matches!(err, AuthError::NotTheBuyer { .. }));
    }

    #[test]
    fn the_malleable_twin_of_a_signature_is_refused() {
        let buyer = key(7);
        let mut auth = SignedSpendingAuth::sign(&buyer, channel(&buyer), TokenUnits(10)).unwrap();
        // (r, n - s, !parity) recovers the same key; the escrow refuses it, so must we.
        let n = HALF_ORDER * U256::from(2u8) + U256::from(1u8);
        auth.s = (n - U256::from_be_bytes(auth.s.0)).into();
        auth.y_parity = !auth.y_parity;
        assert_eq!(auth.verify(), Err(AuthError::HighS));
    }

    #[test]
    fn the_type_hash_is_the_contracts() {
        assert_eq!(
            SpendingAuth::eip712_encode_type(),
            "SpendingAuth(address buyer,address provider,uint256 cumulative)"
        );
    }
}
