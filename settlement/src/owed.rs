//! What a channel's receipts say is owed, in token units: the buyer authorises the final
//! part and nothing else, so a provider is never paid more than the buyer's final
//! receipts, pending receipts wait out the dispute window, and voided ones never count.

use sharemesh_ledger::{Ledger, LedgerError};
use sharemesh_protocol::NodeId;

use crate::units::{Scale, TokenUnits};

/// A channel's amounts at one moment, from one side's ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelOwed {
    /// Past the dispute window and never voided: what the buyer authorises.
    pub final_units: TokenUnits,
    /// Final and pending (not voided): what the provider is exposed to.
    pub all_units: TokenUnits,
}

/// The channel from `buyer` to `provider` as `ledger` books it at `now_ms`.
pub fn channel_owed(
    ledger: &Ledger,
    scale: Scale,
    buyer: &NodeId,
    provider: &NodeId,
    now_ms: u64,
) -> Result<ChannelOwed, LedgerError> {
    let money = ledger.channel_settlement(buyer, provider, now_ms)?;
    let final_nano = u128::from(money.final_nano_usd);
    Ok(ChannelOwed {
        final_units: scale.units_of(final_nano),
        all_units: scale.units_of(final_nano + u128::from(money.pending_nano_usd)),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sharemesh_protocol::{Digest, JobId, Keypair, NanoUsd, Receipt, SignedEnvelope};

    const HOUR: u64 = 3_600_000;

    fn receipt(buyer: &Keypair, provider: &Keypair, job: u8, nano: u64, at: u64) -> SignedEnvelope {
        let receipt = Receipt::new(
            JobId::from_bytes([job; 16]),
            provider.node_id(),
            buyer.node_id(),
            10,
            90,
            // 100 tokens: the price per token that makes the receipt's amount `nano`.
            NanoUsd(nano / 100),
            Digest::from_bytes([job; 32]),
        )
        .unwrap();
        buyer.seal(&receipt, 1, at, 60_000).unwrap()
    }

    #[test]
    fn only_final_unvoided_receipts_of_the_channel_are_authorisable() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path()).unwrap();
        let (buyer, provider, other) = (
            Keypair::from_secret([1; 32]),
            Keypair::from_secret([2; 32]),
            Keypair::from_secret([3; 32]),
        );
        let now = 100 * 24 * HOUR;
        let book = |r: SignedEnvelope| ledger.record_receipt(&r, None).unwrap();
        book(receipt(&buyer, &provider, 1, 2_500_400, now - 48 * HOUR)); // final
        book(receipt(&buyer, &provider, 2, 1_000_000, now - 30 * HOUR)); // final
        book(receipt(&buyer, &provider, 3, 700_000, now - HOUR)); // pending
        book(receipt(&buyer, &other, 4, 9_000_000, now - 48 * HOUR)); // another channel
        let owed = channel_owed(
            &ledger,
            Scale::usdc(),
            &buyer.node_id(),
            &provider.node_id(),
            now,
        )
        .unwrap();
        assert_eq!(owed.final_units, TokenUnits(3_500)); // 3_500_400 nano, rounded down
        assert_eq!(owed.all_units, TokenUnits(4_200));

        // A fraud proof voids the pending receipt: it never becomes authorisable, even
        // after the window passes.
        let proof = receipt(&buyer, &provider, 9, 1, now); // any sealed envelope
        ledger
            .record_fraud(&provider.node_id(), &proof, now)
            .unwrap();
        let later = now + 48 * HOUR;
        let owed = channel_owed(
            &ledger,
            Scale::usdc(),
            &buyer.node_id(),
            &provider.node_id(),
            later,
        )
        .unwrap();
        assert_eq!(owed.final_units, TokenUnits(3_500));
        assert_eq!(owed.all_units, TokenUnits(3_500));
    }
}
