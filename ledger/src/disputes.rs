//! Disputes: a receipt is *pending* for the dispute window after it was issued and
//! *final* after it. Without a chain, a provider's "stake" is exactly its pending
//! earnings: a confirmed fraud proof voids every pending receipt of that provider in
//! this ledger (the buyer's money comes back to its budgets), and the proof is kept,
//! so the provider stays known as a cheat across restarts (SPEC.md §12).

use serde::Serialize;
use sharemesh_protocol::{NodeId, Receipt, SignedEnvelope};
use sled::transaction::TransactionError;
use sled::transaction::{ConflictableTransactionError, Transactional};

use crate::{key, move_amount, read_stored, spend, Ledger, LedgerError, Side, Stored};

/// Where the trust layer's dealings live in the `frauds` tree (not a 32-byte id).
const DEALINGS_KEY: &[u8] = b"\xffdealings";

/// How long a receipt stays open to a fraud proof by default.
pub const DEFAULT_DISPUTE_WINDOW_MS: u64 = 24 * 3_600_000;
/// How long a kept fraud proof is kept, from when it was signed: its receipts were
/// voided long before, and a convicted key is worth nothing to its owner by then (keys
/// are free), so what is left is storage a flood of convictions would grow.
pub const FRAUD_PROOF_RETENTION_MS: u64 = 30 * 24 * 3_600_000;
/// Fraud proofs kept at most (the oldest go first).
pub const MAX_FRAUD_PROOFS: usize = 10_000;

/// What a fraud proof took back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Voided {
    pub receipts: u64,
    pub amount_nano_usd: u64,
}

/// Money by settlement state, from one side's ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Settlement {
    /// Within the dispute window: a fraud proof may still void it.
    pub pending_nano_usd: u64,
    /// Past the dispute window.
    pub final_nano_usd: u64,
    /// Voided by a fraud proof.
    pub voided_nano_usd: u64,
    pub dispute_window_ms: u64,
}

impl Ledger {
    pub fn dispute_window_ms(&self) -> u64 {
        self.dispute_window_ms
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the dispute window (operators; tests shorten it).
    pub fn set_dispute_window_ms(&self, window_ms: u64) {
        self.dispute_window_ms
            .store(window_ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Keeps `proof` (a checked, confirmed fraud proof against `provider`) and voids
    /// every receipt of `provider` still pending at `now_ms`, taking its amount out of
    /// the running totals in the same transaction.
    pub fn record_fraud(
        &self,
        provider: &NodeId,
        proof: &SignedEnvelope,
        now_ms: u64,
    ) -> Result<Voided, LedgerError> {
        let bytes = proof
            .to_bytes()
            .map_err(|e| LedgerError::Invalid(e.to_string()))?;
        if !self.frauds.contains_key(provider.as_bytes())? {
            self.frauds.insert(provider.as_bytes(), bytes)?;
            self.expire_frauds(now_ms)?;
        }
        let window = self.dispute_window_ms();
        let mut voided = Voided::default();
        for entry in self.receipts.iter() {
            let (receipt_key, value) = entry?;
            let Ok(stored) = read_stored(&value) else {
                continue;
            };
            let receipt = &stored.body;
            let pending = stored.issued_at_ms.saturating_add(window) > now_ms;
            if &receipt.provider != provider || !pending {
                continue;
            }
            let done = self.void_stored(&receipt_key, &stored, now_ms)?;
            if done {
                voided.receipts += 1;
                voided.amount_nano_usd += receipt.amount.0;
            }
        }
        self.db.flush()?;
        Ok(voided)
    }

    /// Voids one stored receipt (at `receipt_key`), taking its amount out of the running
    /// totals in the same transaction; `false` if it was void already.
    pub(crate) fn void_stored(
        &self,
        receipt_key: &[u8],
        stored: &Stored,
        now_ms: u64,
    ) -> Result<bool, LedgerError> {
        let receipt = &stored.body;
        let trees = (&self.voided, &self.totals, &self.receipt_api_keys);
        let done = trees.transaction(|(voids, totals, api_keys)| {
            if voids.get(receipt_key)?.is_some() {
                return Ok(false);
            }
            voids.insert(receipt_key, &now_ms.to_be_bytes())?;
            let api_key = api_keys
                .get(receipt_key)?
                .map(|id| String::from_utf8_lossy(&id).into_owned());
            let buckets = spend::buckets(&receipt.buyer, api_key.as_deref(), stored.issued_at_ms);
            move_amount(totals, &buckets, receipt.amount.0, false)?;
            Ok::<_, ConflictableTransactionError<LedgerError>>(true)
        });
        done.map_err(|e| match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => LedgerError::Storage(e),
        })
    }

    /// Providers with a confirmed fraud proof on record, and the proofs.
    pub fn frauds(&self) -> Result<Vec<(NodeId, SignedEnvelope)>, LedgerError> {
        let mut frauds = Vec::new();
        for entry in self.frauds.iter() {
            let (provider, proof) = entry?;
            if provider.as_ref() == DEALINGS_KEY {
                continue;
            }
            let (Ok(provider), Ok(proof)) = (
                <[u8; 32]>::try_from(provider.as_ref()),
                SignedEnvelope::from_bytes(&proof),
            ) else {
                continue;
            };
            frauds.push((NodeId::from_bytes(provider), proof));
        }
        Ok(frauds)
    }

    /// Forgets fraud proofs signed more than [`FRAUD_PROOF_RETENTION_MS`] before
    /// `now_ms` (or dated more than a day after it), and the oldest beyond
    /// [`MAX_FRAUD_PROOFS`]; returns how many went.
    pub fn expire_frauds(&self, now_ms: u64) -> Result<usize, LedgerError> {
        self.expire_frauds_beyond(now_ms, MAX_FRAUD_PROOFS)
    }

    fn expire_frauds_beyond(&self, now_ms: u64, max: usize) -> Result<usize, LedgerError> {
        let mut kept = Vec::new();
        let mut gone = 0;
        for (provider, proof) in self.frauds()? {
            let signed = proof.issued_at_ms;
            let stale = signed.saturating_add(FRAUD_PROOF_RETENTION_MS) < now_ms;
            let future = signed > now_ms.saturating_add(24 * 3_600_000);
            if stale || future {
                self.frauds.remove(provider.as_bytes())?;
                gone += 1;
            } else {
                kept.push((proof.issued_at_ms, provider));
            }
        }
        if kept.len() > max {
            kept.sort_unstable();
            for (_, provider) in &kept[..kept.len() - max] {
                self.frauds.remove(provider.as_bytes())?;
                gone += 1;
            }
        }
        if gone > 0 {
            self.db.flush()?;
        }
        Ok(gone)
    }

    /// Keeps the trust layer's own verified dealings (an opaque encoding the gateway
    /// owns), so a restart does not forget what this node verified.
    pub fn save_dealings(&self, encoded: &[u8]) -> Result<(), LedgerError> {
        self.frauds.insert(DEALINGS_KEY, encoded)?;
        self.db.flush()?;
        Ok(())
    }

    /// What [`Self::save_dealings`] kept last.
    pub fn dealings(&self) -> Result<Option<Vec<u8>>, LedgerError> {
        Ok(self.frauds.get(DEALINGS_KEY)?.map(|v| v.to_vec()))
    }

    /// Whether the receipt stored under this (job, provider) was voided.
    pub(crate) fn is_voided(&self, receipt_key: &[u8]) -> Result<bool, LedgerError> {
        Ok(self.voided.contains_key(receipt_key)?)
    }

    /// `me`'s money on `side`, by settlement state at `now_ms`.
    pub fn settlement(
        &self,
        me: &NodeId,
        side: Side,
        now_ms: u64,
    ) -> Result<Settlement, LedgerError> {
        self.settlement_where(now_ms, |receipt| match side {
            Side::Earnings => &receipt.provider == me,
            Side::Spend => &receipt.buyer == me,
        })
    }

    /// One payment channel's money by settlement state at `now_ms`: what `buyer` owes
    /// `provider` (its final amount is what the buyer authorises on chain).
    pub fn channel_settlement(
        &self,
        buyer: &NodeId,
        provider: &NodeId,
        now_ms: u64,
    ) -> Result<Settlement, LedgerError> {
        self.settlement_where(now_ms, |receipt| {
            &receipt.buyer == buyer && &receipt.provider == provider
        })
    }

    /// Every channel of `me` on `side` in one pass over the receipts: the counterparty
    /// (the buyer of `me`'s earnings, the provider of its spend) → its money at `now_ms`.
    pub fn channels_of(
        &self,
        me: &NodeId,
        side: Side,
        now_ms: u64,
    ) -> Result<std::collections::HashMap<NodeId, Settlement>, LedgerError> {
        let window = self.dispute_window_ms();
        let mut channels = std::collections::HashMap::<NodeId, Settlement>::new();
        for (receipt, issued_at) in self.receipts()? {
            let counterparty = match side {
                Side::Earnings if &receipt.provider == me => receipt.buyer,
                Side::Spend if &receipt.buyer == me => receipt.provider,
                _ => continue,
            };
            let voided = self.is_voided(&key(&receipt))?;
            let settlement = channels.entry(counterparty).or_insert_with(|| Settlement {
                dispute_window_ms: window,
                ..Settlement::default()
            });
            settlement.add(
                receipt.amount.0,
                voided,
                issued_at.saturating_add(window) > now_ms,
            );
        }
        Ok(channels)
    }

    fn settlement_where(
        &self,
        now_ms: u64,
        counts: impl Fn(&Receipt) -> bool,
    ) -> Result<Settlement, LedgerError> {
        let window = self.dispute_window_ms();
        let mut settlement = Settlement {
            dispute_window_ms: window,
            ..Settlement::default()
        };
        for (receipt, issued_at) in self.receipts()? {
            if !counts(&receipt) {
                continue;
            }
            let voided = self.is_voided(&key(&receipt))?;
            settlement.add(
                receipt.amount.0,
                voided,
                issued_at.saturating_add(window) > now_ms,
            );
        }
        Ok(settlement)
    }
}

impl Settlement {
    fn add(&mut self, amount: u64, voided: bool, pending: bool) {
        let bucket = if voided {
            &mut self.voided_nano_usd
        } else if pending {
            &mut self.pending_nano_usd
        } else {
            &mut self.final_nano_usd
        };
        *bucket = bucket.saturating_add(amount);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{report, Period, SpendScope};
    use sharemesh_protocol::{Digest, JobId, Keypair, NanoUsd, Receipt};

    const HOUR: u64 = 3_600_000;

    fn sealed(buyer: &Keypair, provider: &Keypair, job: u8, at_ms: u64) -> SignedEnvelope {
        let receipt = Receipt::new(
            JobId::from_bytes([job; 16]),
            provider.node_id(),
            buyer.node_id(),
            10,
            90,
            NanoUsd(10),
            Digest::from_bytes([job; 32]),
        )
        .unwrap();
        buyer.seal(&receipt, 1, at_ms, 60_000).unwrap()
    }

    #[test]
    fn a_fraud_proof_voids_pending_receipts_and_refunds_budgets_but_not_final_ones() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path()).unwrap();
        let (buyer, cheat, honest) = (
            Keypair::from_secret([1; 32]),
            Keypair::from_secret([2; 32]),
            Keypair::from_secret([3; 32]),
        );
        let now = 100 * 24 * HOUR + 12 * HOUR;
        // Final (two days old), pending (one hour old), and another provider's.
        ledger
            .record_receipt(&sealed(&buyer, &cheat, 1, now - 48 * HOUR), Some("team"))
            .unwrap();
        ledger
            .record_receipt(&sealed(&buyer, &cheat, 2, now - HOUR), Some("team"))
            .unwrap();
        ledger
            .record_receipt(&sealed(&buyer, &honest, 3, now - HOUR), Some("team"))
            .unwrap();
        let spent_today = || {
            ledger
                .spent(SpendScope::Buyer(&buyer.node_id()), Period::Day(now))
                .unwrap()
        };
        let key_month = || {
            ledger
                .spent(SpendScope::ApiKey("team"), Period::Month(now))
                .unwrap()
        };
        assert_eq!(spent_today(), 2000);
        let month_before = key_month();

        let proof = buyer
            .seal(
                &sealed(&buyer, &cheat, 9, now)
                    .open_archived::<Receipt>()
                    .unwrap()
                    .body,
                2,
                now,
                60_000,
            )
            .unwrap();
        let voided = ledger.record_fraud(&cheat.node_id(), &proof, now).unwrap();
        assert_eq!(
            voided,
            Voided {
                receipts: 1,
                amount_nano_usd: 1000
            }
        );
        // The pending job's money is back in the budgets; the final one stays spent.
        assert_eq!(spent_today(), 1000);
        // A job of the convict's that was still running is paid nothing more.
        let late = ledger.record_receipt(&sealed(&buyer, &cheat, 4, now), None);
        assert!(matches!(late, Err(LedgerError::Invalid(why)) if why.contains("convicted")));
        assert_eq!(spent_today(), 1000);
        assert_eq!(key_month(), month_before - 1000);
        // Once voided, always voided: a second proof takes nothing more, and a later
        // receipt for the voided job is refused.
        assert_eq!(
            ledger.record_fraud(&cheat.node_id(), &proof, now).unwrap(),
            Voided::default()
        );
        let late = Receipt::new(
            JobId::from_bytes([2; 16]),
            cheat.node_id(),
            buyer.node_id(),
            10,
            95,
            NanoUsd(10),
            Digest::from_bytes([2; 32]),
        )
        .unwrap();
        let late = buyer.seal(&late, 7, now, 60_000).unwrap();
        assert!(matches!(
            ledger.record_receipt(&late, None),
            Err(LedgerError::Invalid(_))
        ));

        // Every channel in one pass agrees with each channel read alone.
        let by_provider = ledger
            .channels_of(&buyer.node_id(), Side::Spend, now)
            .unwrap();
        assert_eq!(by_provider.len(), 2);
        for provider in [&cheat, &honest] {
            let alone = ledger
                .channel_settlement(&buyer.node_id(), &provider.node_id(), now)
                .unwrap();
            assert_eq!(by_provider[&provider.node_id()], alone);
        }
        assert_eq!(by_provider[&cheat.node_id()].voided_nano_usd, 1000);
        let by_buyer = ledger
            .channels_of(&honest.node_id(), Side::Earnings, now)
            .unwrap();
        assert_eq!(by_buyer[&buyer.node_id()].pending_nano_usd, 1000);

        let spend = report(&ledger, &buyer.node_id(), Side::Spend, 0, now).unwrap();
        assert_eq!(
            spend.total.amount_nano_usd, 2000,
            "voided money is not spend"
        );
        assert_eq!(
            spend.settlement,
            Settlement {
                pending_nano_usd: 1000,
                final_nano_usd: 1000,
                voided_nano_usd: 1000,
                dispute_window_ms: DEFAULT_DISPUTE_WINDOW_MS
            }
        );
        let earned = ledger
            .settlement(&cheat.node_id(), Side::Earnings, now)
            .unwrap();
        assert_eq!(
            (
                earned.pending_nano_usd,
                earned.final_nano_usd,
                earned.voided_nano_usd
            ),
            (0, 1000, 1000)
        );
        assert_eq!(ledger.frauds().unwrap().len(), 1);

        // After a restart the proof and the voids are still there, and totals rebuilt
        // from scratch leave voided receipts out.
        drop(ledger);
        let ledger = Ledger::open(dir.path()).unwrap();
        assert_eq!(ledger.frauds().unwrap()[0].0, cheat.node_id());
        // The trust layer's dealings sit beside the proofs, and are not one.
        assert_eq!(ledger.dealings().unwrap(), None);
        ledger.save_dealings(b"[]").unwrap();
        assert_eq!(
            ledger.dealings().unwrap().as_deref(),
            Some(b"[]".as_slice())
        );
        assert_eq!(ledger.frauds().unwrap().len(), 1);
        ledger.totals.clear().unwrap();
        ledger.build_totals().unwrap();
        assert_eq!(
            ledger
                .expire_frauds(now + FRAUD_PROOF_RETENTION_MS)
                .unwrap(),
            0
        );
        assert_eq!(
            ledger
                .expire_frauds(now + FRAUD_PROOF_RETENTION_MS + 1)
                .unwrap(),
            1
        );
        assert!(
            ledger.frauds().unwrap().is_empty(),
            "an old proof is forgotten"
        );
        assert_eq!(
            ledger
                .spent(SpendScope::Buyer(&buyer.node_id()), Period::Day(now))
                .unwrap(),
            1000
        );
    }

    #[test]
    fn kept_proofs_are_bounded_oldest_first_and_future_dated_ones_go() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path()).unwrap();
        let buyer = Keypair::from_secret([1; 32]);
        let now = 100 * 24 * HOUR;
        let keep = |n: u8, at: u64| {
            let cheat = Keypair::from_secret([n; 32]);
            let body = sealed(&buyer, &cheat, n, at)
                .open_archived::<Receipt>()
                .unwrap()
                .body;
            let proof = buyer.seal(&body, u64::from(n), at, 60_000).unwrap();
            ledger
                .frauds
                .insert(cheat.node_id().as_bytes(), proof.to_bytes().unwrap())
                .unwrap();
            cheat.node_id()
        };
        let oldest = keep(10, now - 3 * HOUR);
        let middle = keep(11, now - 2 * HOUR);
        let newest = keep(12, now - HOUR);
        keep(13, now + 2 * 24 * HOUR);
        assert_eq!(ledger.expire_frauds_beyond(now, 2).unwrap(), 2);
        let mut left: Vec<NodeId> = ledger
            .frauds()
            .unwrap()
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        left.sort();
        let mut expected = vec![middle, newest];
        expected.sort();
        assert_eq!(left, expected, "{oldest} and the future-dated one went");
    }

    /// A conviction that lands between a booking's fraud check and its store: the void
    /// pass has already gone by, so the booking voids its own receipt and refuses it
    /// (the order a race between a gateway's bookings and its conviction can take).
    #[test]
    fn a_receipt_stored_after_the_void_pass_voids_itself() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path()).unwrap();
        let (buyer, cheat) = (Keypair::from_secret([1; 32]), Keypair::from_secret([2; 32]));
        let now = 100 * 24 * HOUR;
        let envelope = sealed(&buyer, &cheat, 4, now);
        let opened = envelope.open_archived::<Receipt>().unwrap();
        let receipt_key = key(&opened.body);
        ledger.check_payable(&opened.body, &receipt_key).unwrap();
        let voided = ledger
            .record_fraud(&cheat.node_id(), &sealed(&buyer, &cheat, 9, now), now)
            .unwrap();
        assert_eq!(voided, Voided::default(), "nothing stored yet to void");
        let stored = ledger
            .store_receipt(&envelope, &opened, &receipt_key, None)
            .unwrap();
        let refused = ledger.void_if_convicted(&opened, &receipt_key, stored);
        assert!(refused.is_err(), "{refused:?}");
        assert!(ledger.is_voided(&receipt_key).unwrap());
        let spent = ledger
            .spent(SpendScope::Buyer(&buyer.node_id()), Period::Day(now))
            .unwrap();
        assert_eq!(spent, 0, "the voided amount left the totals");
    }
}
