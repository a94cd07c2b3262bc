//! What a buyer and a provider exchange over the mesh to settle (`/sharemesh/settle/2`,
//! SPEC §13): the buyer offers its [`SettlementBinding`] and, when it owes something,
//! its newest [`SpendingAuthorisation`]; the provider answers with its own binding.
//! Everything here checks what the other side claims before it is kept: the binding
//! must be signed by the peer's own node key for this chain and escrow, and an
//! authorisation must be for this channel and signed by the bound account.

use alloy_primitives::{Address, B256};
use sharemesh_protocol::{
    Keypair, NodeId, SettlementBinding, SignedEnvelope, SpendingAuthorisation,
};

use crate::auth::{AuthError, Channel, SignedSpendingAuth};
use crate::units::TokenUnits;

/// How long a binding a node hands out is valid (it is re-signed at every start).
pub const BINDING_LIFETIME_MS: u64 = 180 * 24 * 3_600_000;
/// How long an authorisation's envelope is valid in transit.
pub const AUTHORISATION_LIFETIME_MS: u64 = 3_600_000;

/// The chain and escrow a node settles on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chain {
    pub chain_id: u64,
    pub escrow: Address,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OfferError {
    #[error("the settlement binding does not open: {0}")]
    Binding(String),
    #[error("the binding names node {named}, not the peer {peer} that sent it")]
    NotThePeer { named: NodeId, peer: NodeId },
    #[error("the binding is for chain {got_chain} escrow {got_escrow}; this node settles on chain {chain} escrow {escrow}")]
    OtherChain {
        got_chain: u64,
        got_escrow: Address,
        chain: u64,
        escrow: Address,
    },
    #[error("the spending authorisation does not open: {0}")]
    Authorisation(String),
    #[error("the authorisation is not for the channel from {buyer} to this provider's {provider} on this chain and escrow")]
    ForeignChannel { buyer: Address, provider: Address },
    #[error(transparent)]
    Signature(#[from] AuthError),
    #[error("an offer has a binding and at most one authorisation")]
    Shape,
}

impl Chain {
    /// The chain and escrow `escrow` settles on, and `node`'s binding to the escrow
    /// client's account there (sealed now, its sequence number the time).
    pub fn bind_escrow_account(
        escrow: &crate::evm::Escrow,
        node: &Keypair,
        now_ms: u64,
    ) -> Result<(Chain, SignedEnvelope), sharemesh_protocol::DecodeError> {
        let chain = Chain {
            chain_id: escrow.chain_id(),
            escrow: escrow.address(),
        };
        let binding = chain.bind(node, escrow.account(), now_ms, now_ms)?;
        Ok((chain, binding))
    }

    /// `node`'s binding to `account` on this chain, sealed by its key.
    pub fn bind(
        &self,
        node: &Keypair,
        account: Address,
        seq: u64,
        now_ms: u64,
    ) -> Result<SignedEnvelope, sharemesh_protocol::DecodeError> {
        let binding = SettlementBinding {
            node: node.node_id(),
            chain_id: self.chain_id,
            escrow: self.escrow.into_array(),
            account: account.into_array(),
        };
        node.seal(&binding, seq, now_ms, BINDING_LIFETIME_MS)
    }

    /// The account `peer` binds on this chain, from its signed binding.
    pub fn open_binding(
        &self,
        envelope: &SignedEnvelope,
        peer: &NodeId,
        now_ms: u64,
    ) -> Result<Address, OfferError> {
        let binding = envelope
            .open::<SettlementBinding>(now_ms)
            .map_err(|e| OfferError::Binding(e.to_string()))?
            .body;
        if &binding.node != peer {
            return Err(OfferError::NotThePeer {
                named: binding.node,
                peer: *peer,
            });
        }
        let escrow = Address::from(binding.escrow);
        if binding.chain_id != self.chain_id || escrow != self.escrow {
            return Err(OfferError::OtherChain {
                got_chain: binding.chain_id,
                got_escrow: escrow,
                chain: self.chain_id,
                escrow: self.escrow,
            });
        }
        Ok(Address::from(binding.account))
    }

    /// A buyer's authorisation from its envelope: signed by `buyer`'s node, for the
    /// channel from `buyer_account` to `provider_account` here, and by `buyer_account`.
    pub fn open_authorisation(
        &self,
        envelope: &SignedEnvelope,
        buyer: &NodeId,
        buyer_account: Address,
        provider_account: Address,
        now_ms: u64,
    ) -> Result<SignedSpendingAuth, OfferError> {
        let wire = envelope
            .open::<SpendingAuthorisation>(now_ms)
            .map_err(|e| OfferError::Authorisation(e.to_string()))?
            .body;
        if &wire.buyer != buyer {
            return Err(OfferError::Authorisation(format!(
                "signed by {} for buyer {}",
                buyer, wire.buyer
            )));
        }
        let auth = from_wire(&wire);
        let expected = Channel {
            chain_id: self.chain_id,
            escrow: self.escrow,
            buyer: buyer_account,
            provider: provider_account,
        };
        if auth.channel != expected {
            return Err(OfferError::ForeignChannel {
                buyer: buyer_account,
                provider: provider_account,
            });
        }
        auth.verify()?;
        Ok(auth)
    }
}

/// `auth` as it travels, from `buyer` to `provider` (the node ids its receipts name).
pub fn to_wire(
    auth: &SignedSpendingAuth,
    buyer: NodeId,
    provider: NodeId,
) -> SpendingAuthorisation {
    SpendingAuthorisation {
        buyer,
        provider,
        chain_id: auth.channel.chain_id,
        escrow: auth.channel.escrow.into_array(),
        buyer_account: auth.channel.buyer.into_array(),
        provider_account: auth.channel.provider.into_array(),
        cumulative: auth.cumulative.0,
        r: auth.r.0,
        s: auth.s.0,
        y_parity: auth.y_parity,
    }
}

fn from_wire(wire: &SpendingAuthorisation) -> SignedSpendingAuth {
    SignedSpendingAuth {
        channel: Channel {
            chain_id: wire.chain_id,
            escrow: Address::from(wire.escrow),
            buyer: Address::from(wire.buyer_account),
            provider: Address::from(wire.provider_account),
        },
        cumulative: TokenUnits(wire.cumulative),
        r: B256::from(wire.r),
        s: B256::from(wire.s),
        y_parity: wire.y_parity,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::key::AccountKey;

    const NOW: u64 = 1_800_000_000_000;

    fn chain() -> Chain {
        Chain {
            chain_id: 31337,
            escrow: Address::repeat_byte(0xee),
        }
    }

    fn account(byte: u8) -> AccountKey {
        AccountKey::from_bytes(&B256::repeat_byte(byte)).unwrap()
    }

    #[test]
    fn a_binding_opens_only_from_its_own_node_and_for_this_chain() {
        let node = Keypair::from_secret([1; 32]);
        let sealed = chain().bind(&node, account(5).address(), 1, NOW).unwrap();
        assert_eq!(
            chain().open_binding(&sealed, &node.node_id(), NOW).unwrap(),
            account(5).address()
        );
        // Relayed by another peer: not that peer's account.
        let other = Keypair::from_secret([2; 32]).node_id();
        assert!(matches!(
            chain().open_binding(&sealed, &other, NOW),
            Err(OfferError::NotThePeer { .. })
        ));
        // Another chain, another escrow.
        for elsewhere in [
            Chain {
                chain_id: 1,
                ..chain()
            },
            Chain {
                escrow: Address::repeat_byte(0xef),
                ..chain()
            },
        ] {
            assert!(matches!(
                elsewhere.open_binding(&sealed, &node.node_id(), NOW),
                Err(OfferError::OtherChain { .. })
            ));
        }
        // Not a binding at all.
        let auth = SignedSpendingAuth::sign(
            &account(5),
            Channel {
                chain_id: 31337,
                escrow: chain().escrow,
                buyer: account(5).address(),
                provider: account(6).address(),
            },
            TokenUnits(10),
        )
        .unwrap();
        let wire = node
            .seal(&to_wire(&auth, node.node_id(), other), 2, NOW, 60_000)
            .unwrap();
        assert!(matches!(
            chain().open_binding(&wire, &node.node_id(), NOW),
            Err(OfferError::Binding(_))
        ));
    }

    #[test]
    fn an_authorisation_opens_only_for_its_channel_and_signer() {
        let (buyer, provider) = (Keypair::from_secret([1; 32]), Keypair::from_secret([2; 32]));
        let (buyer_account, provider_account) = (account(5), account(6));
        let channel = Channel {
            chain_id: 31337,
            escrow: chain().escrow,
            buyer: buyer_account.address(),
            provider: provider_account.address(),
        };
        let auth = SignedSpendingAuth::sign(&buyer_account, channel, TokenUnits(1_234)).unwrap();
        let sealed = buyer
            .seal(
                &to_wire(&auth, buyer.node_id(), provider.node_id()),
                1,
                NOW,
                60_000,
            )
            .unwrap();
        let open = |envelope: &SignedEnvelope, buyer_node: &NodeId, from: Address, to: Address| {
            chain().open_authorisation(envelope, buyer_node, from, to, NOW)
        };
        assert_eq!(
            open(
                &sealed,
                &buyer.node_id(),
                buyer_account.address(),
                provider_account.address()
            )
            .unwrap(),
            auth
        );
        // Offered as another buyer's, or for another provider's account.
        assert!(matches!(
            open(
                &sealed,
                &provider.node_id(),
                buyer_account.address(),
                provider_account.address()
            ),
            Err(OfferError::Authorisation(_))
        ));
        assert!(matches!(
            open(
                &sealed,
                &buyer.node_id(),
                buyer_account.address(),
                account(7).address()
            ),
            Err(OfferError::ForeignChannel { .. })
        ));
        // The amount raised after signing: the chain signature no longer recovers.
        let mut raised = to_wire(&auth, buyer.node_id(), provider.node_id());
        raised.cumulative += 1;
        let raised = buyer.seal(&raised, 2, NOW, 60_000).unwrap();
        assert!(matches!(
            open(
                &raised,
                &buyer.node_id(),
                buyer_account.address(),
                provider_account.address()
            ),
            Err(OfferError::Signature(AuthError::WrongSigner { .. }))
        ));
    }
}
