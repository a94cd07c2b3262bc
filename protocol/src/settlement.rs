//! A node's settlement account: its ed25519 identity signs which EVM account is its own
//! on which chain and escrow contract (SPEC §13), so a buyer authorises payments to the
//! account of the provider whose receipts it signed, and to no one else's.

use serde::{Deserialize, Serialize};

use crate::envelope::WireMessage;
use crate::error::ValidationError;
use crate::ids::NodeId;
use crate::kind::MessageKind;

/// Signed by the node it names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettlementBinding {
    pub node: NodeId,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The escrow contract's address.
    pub escrow: [u8; 20],
    /// The node's account on that chain.
    pub account: [u8; 20],
}

impl SettlementBinding {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.chain_id == 0 {
            return Err(ValidationError::field("chain_id", "0 is no chain"));
        }
        if self.escrow == [0; 20] {
            return Err(ValidationError::field("escrow", "the zero address"));
        }
        if self.account == [0; 20] {
            return Err(ValidationError::field("account", "the zero address"));
        }
        Ok(())
    }
}

impl WireMessage for SettlementBinding {
    const KIND: MessageKind = MessageKind::SettlementBinding;
    const MAX_BYTES: usize = 256;
    /// A binding is re-signed at least yearly; a leaked old one cannot redirect pay for
    /// longer than that.
    const MAX_LIFETIME_MS: u64 = 366 * 24 * 3_600_000;
    fn author(&self) -> NodeId {
        self.node
    }
    fn validate(&self) -> Result<(), ValidationError> {
        SettlementBinding::validate(self)
    }
}

/// A buyer's spending authorisation as it travels to its provider over the mesh: the
/// EIP-712 signature by the buyer's chain account (checked by the settlement crate and
/// by the contract) inside an envelope signed by the buyer's node, so a provider books
/// it against the node whose receipts it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpendingAuthorisation {
    pub buyer: NodeId,
    pub provider: NodeId,
    pub chain_id: u64,
    pub escrow: [u8; 20],
    pub buyer_account: [u8; 20],
    pub provider_account: [u8; 20],
    /// What the channel may pay in all, in the token's smallest units.
    pub cumulative: u128,
    pub r: [u8; 32],
    pub s: [u8; 32],
    pub y_parity: bool,
}

impl SpendingAuthorisation {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.chain_id == 0 {
            return Err(ValidationError::field("chain_id", "0 is no chain"));
        }
        for (field, address) in [
            ("escrow", &self.escrow),
            ("buyer_account", &self.buyer_account),
            ("provider_account", &self.provider_account),
        ] {
            if *address == [0; 20] {
                return Err(ValidationError::field(field, "the zero address"));
            }
        }
        if self.cumulative == 0 {
            return Err(ValidationError::field("cumulative", "authorises nothing"));
        }
        if self.r == [0; 32] || self.s == [0; 32] {
            return Err(ValidationError::field("signature", "r or s is zero"));
        }
        Ok(())
    }
}

impl WireMessage for SpendingAuthorisation {
    const KIND: MessageKind = MessageKind::SpendingAuthorisation;
    const MAX_BYTES: usize = 320;
    /// Delivered at once; the signature inside stays redeemable on chain regardless.
    const MAX_LIFETIME_MS: u64 = 24 * 3_600_000;
    fn author(&self) -> NodeId {
        self.buyer
    }
    fn validate(&self) -> Result<(), ValidationError> {
        SpendingAuthorisation::validate(self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::Keypair;

    const NOW: u64 = 1_800_000_000_000;
    const DAY: u64 = 24 * 3_600_000;

    fn binding(node: &Keypair) -> SettlementBinding {
        SettlementBinding {
            node: node.node_id(),
            chain_id: 31337,
            escrow: [7; 20],
            account: [9; 20],
        }
    }

    #[test]
    fn a_binding_opens_only_as_its_own_nodes_and_only_while_valid() {
        let node = Keypair::from_secret([4; 32]);
        let sealed = node.seal(&binding(&node), 1, NOW, 30 * DAY).unwrap();
        let opened = sealed.open::<SettlementBinding>(NOW + DAY).unwrap();
        assert_eq!(opened.body, binding(&node));
        assert!(sealed.open::<SettlementBinding>(NOW + 31 * DAY).is_err());
        // Another key signing a binding that names this node (to redirect its pay).
        let other = Keypair::from_secret([5; 32]);
        let forged = other.seal(&binding(&node), 1, NOW, DAY).unwrap();
        assert!(forged.open::<SettlementBinding>(NOW).is_err());
        // Asking for longer than the limit gets the limit.
        let long = node.seal(&binding(&node), 1, NOW, 400 * DAY).unwrap();
        assert_eq!(long.expires_at_ms, NOW + SettlementBinding::MAX_LIFETIME_MS);
        assert!(long.open::<SettlementBinding>(NOW + 367 * DAY).is_err());
    }

    fn authorisation(buyer: &Keypair) -> SpendingAuthorisation {
        SpendingAuthorisation {
            buyer: buyer.node_id(),
            provider: Keypair::from_secret([6; 32]).node_id(),
            chain_id: 31337,
            escrow: [7; 20],
            buyer_account: [8; 20],
            provider_account: [9; 20],
            cumulative: 1_234_567,
            r: [1; 32],
            s: [2; 32],
            y_parity: true,
        }
    }

    #[test]
    fn an_authorisation_opens_only_as_its_buyers_and_within_its_limits() {
        let buyer = Keypair::from_secret([4; 32]);
        let sealed = buyer.seal(&authorisation(&buyer), 1, NOW, DAY).unwrap();
        assert!(sealed.payload.len() <= SpendingAuthorisation::MAX_BYTES);
        let opened = sealed.open::<SpendingAuthorisation>(NOW + 1).unwrap();
        assert_eq!(opened.body, authorisation(&buyer));
        let other = Keypair::from_secret([5; 32]);
        let forged = other.seal(&authorisation(&buyer), 1, NOW, DAY).unwrap();
        assert!(forged.open::<SpendingAuthorisation>(NOW).is_err());
        assert!(sealed.open::<SpendingAuthorisation>(NOW + 2 * DAY).is_err());
        // A binding's bytes do not open as an authorisation (domain separation).
        let binding = buyer.seal(&binding(&buyer), 1, NOW, DAY).unwrap();
        assert!(binding.open::<SpendingAuthorisation>(NOW).is_err());
    }

    #[test]
    fn empty_authorisations_are_refused_by_name() {
        let buyer = Keypair::from_secret([4; 32]);
        let base = authorisation(&buyer);
        for (field, broken) in [
            (
                "chain_id",
                SpendingAuthorisation {
                    chain_id: 0,
                    ..base.clone()
                },
            ),
            (
                "escrow",
                SpendingAuthorisation {
                    escrow: [0; 20],
                    ..base.clone()
                },
            ),
            (
                "buyer_account",
                SpendingAuthorisation {
                    buyer_account: [0; 20],
                    ..base.clone()
                },
            ),
            (
                "provider_account",
                SpendingAuthorisation {
                    provider_account: [0; 20],
                    ..base.clone()
                },
            ),
            (
                "cumulative",
                SpendingAuthorisation {
                    cumulative: 0,
                    ..base.clone()
                },
            ),
            (
                "signature",
                SpendingAuthorisation {
                    s: [0; 32],
                    ..base.clone()
                },
            ),
        ] {
            let err = broken.validate().unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn zero_chains_and_addresses_are_refused_by_name() {
        let node = Keypair::from_secret([4; 32]);
        for (field, broken) in [
            (
                "chain_id",
                SettlementBinding {
                    chain_id: 0,
                    ..binding(&node)
                },
            ),
            (
                "escrow",
                SettlementBinding {
                    escrow: [0; 20],
                    ..binding(&node)
                },
            ),
            (
                "account",
                SettlementBinding {
                    account: [0; 20],
                    ..binding(&node)
                },
            ),
        ] {
            let err = broken.validate().unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
    }
}
