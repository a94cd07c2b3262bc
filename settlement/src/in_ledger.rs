//! Settlement by accounting alone (the demo's and the lab's): a buyer's budget is its only
//! limit, and redeeming an authorisation moves no money; it records how much of the
//! channel has been settled, with the same rules the escrow keeps (signed by the buyer,
//! cumulative, never twice).

use std::collections::HashMap;
use std::sync::Mutex;

use alloy_primitives::Address;

use crate::auth::{AuthError, Channel, SignedSpendingAuth};
use crate::units::TokenUnits;
use crate::{Coverage, Redeemed, Settlement};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InLedgerError {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("the channel has already settled {0} (an older or equal authorisation)")]
    AlreadyRedeemed(TokenUnits),
}

#[derive(Default)]
pub struct InLedger {
    redeemed: Mutex<HashMap<Channel, TokenUnits>>,
}

impl InLedger {
    fn settled(&self) -> std::sync::MutexGuard<'_, HashMap<Channel, TokenUnits>> {
        // A poisoned map is still a consistent map: every write is one insert.
        self.redeemed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Settlement for InLedger {
    type Error = InLedgerError;

    async fn coverage(
        &self,
        _buyer: Address,
        _provider: Address,
    ) -> Result<Coverage, InLedgerError> {
        Ok(Coverage::Unbounded)
    }

    async fn redeem(&self, auth: &SignedSpendingAuth) -> Result<Redeemed, InLedgerError> {
        auth.verify()?;
        let mut settled = self.settled();
        let already = settled.get(&auth.channel).copied().unwrap_or_default();
        if auth.cumulative <= already {
            return Err(InLedgerError::AlreadyRedeemed(already));
        }
        settled.insert(auth.channel, auth.cumulative);
        Ok(Redeemed {
            paid: auth.cumulative.saturating_sub(already),
            redeemed: auth.cumulative,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::key::AccountKey;
    use alloy_primitives::B256;

    #[tokio::test]
    async fn in_ledger_settlement_keeps_the_escrows_rules() {
        let buyer = AccountKey::from_bytes(&B256::repeat_byte(3)).unwrap();
        let channel = Channel {
            chain_id: 0,
            escrow: Address::ZERO,
            buyer: buyer.address(),
            provider: Address::repeat_byte(4),
        };
        let settlement = InLedger::default();
        let auth = |n| SignedSpendingAuth::sign(&buyer, channel, TokenUnits(n)).unwrap();
        assert_eq!(
            settlement
                .coverage(channel.buyer, channel.provider)
                .await
                .unwrap(),
            Coverage::Unbounded
        );
        let first = settlement.redeem(&auth(100)).await.unwrap();
        assert_eq!(
            first,
            Redeemed {
                paid: TokenUnits(100),
                redeemed: TokenUnits(100)
            }
        );
        assert_eq!(
            settlement.redeem(&auth(100)).await,
            Err(InLedgerError::AlreadyRedeemed(TokenUnits(100)))
        );
        let second = settlement.redeem(&auth(250)).await.unwrap();
        assert_eq!(second.paid, TokenUnits(150));
        let mut forged = auth(400);
        forged.cumulative = TokenUnits(4_000);
        assert!(matches!(
            settlement.redeem(&forged).await,
            Err(InLedgerError::Auth(_))
        ));
    }
}
