//! The metering ledger, in sled, on both sides: every receipt (provider: earnings;
//! buyer: spend) and every job. A receipt is verified before it is stored; the newest
//! receipt per (job, provider) wins, so a replayed or duplicated receipt counts once;
//! each write is flushed before it is acknowledged, so `kill -9` at any moment loses
//! no recorded receipt and a restart finds consistent books.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sharemesh_protocol::{FinishReason, JobId, NanoUsd, NodeId, Receipt, SignedEnvelope};
use sled::transaction::{
    ConflictableTransactionError, TransactionError, Transactional, TransactionalTree,
};

mod channels;
mod disputes;
mod report;
mod spend;

pub use channels::MAX_CHANNEL_RECORDS;
pub use disputes::{Settlement, Voided, DEFAULT_DISPUTE_WINDOW_MS};
pub use report::{
    day, day_start, month_start, parse_day, report, Percentiles, Report, Side, Totals,
};
pub use spend::{Period, SpendScope};

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger storage: {0}")]
    Storage(#[from] sled::Error),
    #[error("the ledger at {0} is in use by another sharemesh process; query that node's /v1/account/* instead")]
    Locked(String),
    #[error("receipt refused: {0}")]
    Invalid(String),
    #[error("corrupt ledger entry: {0}")]
    Corrupt(String),
    #[error("the ledger holds as many {0} as it keeps")]
    Full(&'static str),
}

/// What happened to a receipt offered to the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// It supersedes what was stored (or is the first for its job).
    New,
    /// The same or an older receipt was already stored: nothing changed.
    AlreadyCounted,
}

/// How a job (one provider's part of a response) ended, as a side saw it. Stored as its
/// snake_case name (the same text earlier ledgers stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobOutcome {
    /// End of text or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The provider cancelled it (preemption, shutdown).
    Cancelled,
    /// The provider's engine failed.
    Error,
    /// It broke off on the buyer's side: stalled, stream broke, refused, bad chunk.
    Failed,
}

impl JobOutcome {
    pub fn name(self) -> &'static str {
        match self {
            JobOutcome::Stop => "stop",
            JobOutcome::Length => "length",
            JobOutcome::Cancelled => "cancelled",
            JobOutcome::Error => "error",
            JobOutcome::Failed => "failed",
        }
    }
}

impl From<FinishReason> for JobOutcome {
    fn from(finish: FinishReason) -> Self {
        match finish {
            FinishReason::Stop => JobOutcome::Stop,
            FinishReason::Length => JobOutcome::Length,
            FinishReason::Cancelled => JobOutcome::Cancelled,
            FinishReason::Error => JobOutcome::Error,
        }
    }
}

/// One job as a side saw it: the statistics beside the money (which is the receipts).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub job_id: JobId,
    pub provider: NodeId,
    pub buyer: NodeId,
    pub model: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub price_per_token: NanoUsd,
    pub started_ms: u64,
    pub ttft_ms: Option<f64>,
    pub tokens_per_second: Option<f64>,
    pub outcome: JobOutcome,
    /// The API key (id) the request came with, on a gateway that uses keys.
    #[serde(default)]
    pub api_key: Option<String>,
}

pub struct Ledger {
    db: sled::Db,
    receipts: sled::Tree,
    jobs: sled::Tree,
    /// Serving sessions: start ms → last-alive ms (big-endian u64s), for uptime.
    sessions: sled::Tree,
    /// Running spend totals (see `spend`).
    totals: sled::Tree,
    /// Receipt key → the API key id its job's money counts against.
    receipt_api_keys: sled::Tree,
    /// Entries that did not read back, moved aside: `<tree>/<key>` → the bytes.
    quarantine: sled::Tree,
    /// Receipt key → when a fraud proof voided it (see `disputes`).
    voided: sled::Tree,
    /// Provider id → the confirmed fraud proof against it.
    frauds: sled::Tree,
    /// Counterparty id → its settlement channel's record (see `channels`).
    channels: sled::Tree,
    dispute_window_ms: std::sync::atomic::AtomicU64,
}

/// A stored receipt, read back.
struct Stored {
    seq: u64,
    issued_at_ms: u64,
    body: Receipt,
}

fn read_stored(bytes: &[u8]) -> Result<Stored, LedgerError> {
    let envelope =
        SignedEnvelope::from_bytes(bytes).map_err(|e| LedgerError::Corrupt(e.to_string()))?;
    let opened = envelope
        .open_archived::<Receipt>()
        .map_err(|e| LedgerError::Corrupt(e.to_string()))?;
    Ok(Stored {
        seq: opened.seq,
        issued_at_ms: opened.issued_at_ms,
        body: opened.body,
    })
}

type TxResult<T> = Result<T, ConflictableTransactionError<LedgerError>>;

/// Adds `amount` to (or with `sign` false, takes it from) every bucket in `keys`.
fn move_amount(
    totals: &TransactionalTree,
    keys: &[Vec<u8>],
    amount: u64,
    add: bool,
) -> TxResult<()> {
    for key in keys {
        let current = spend::read_amount(totals.get(key)?.as_deref());
        let next = if add {
            current.saturating_add(amount)
        } else {
            current.saturating_sub(amount)
        };
        totals.insert(key.as_slice(), &next.to_be_bytes())?;
    }
    Ok(())
}

fn key(receipt: &Receipt) -> Vec<u8> {
    let mut key = receipt.job_id.as_bytes().to_vec();
    key.extend_from_slice(receipt.provider.as_bytes());
    key
}

/// How long [`Ledger::open`] waits for a lock this process may still hold: a dropped
/// sled database keeps its file lock until its flusher thread wakes and exits (up to
/// its 500 ms flush interval), so reopening at once in the same process could fail.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(1500);

fn open_db(dir: &Path) -> Result<sled::Db, LedgerError> {
    let started = std::time::Instant::now();
    loop {
        match sled::Config::new()
            .path(dir)
            .cache_capacity(8 * 1024 * 1024)
            .open()
        {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(io))
                if io.kind() == std::io::ErrorKind::WouldBlock
                    || io.to_string().contains("lock") =>
            {
                if started.elapsed() >= LOCK_WAIT {
                    return Err(LedgerError::Locked(dir.display().to_string()));
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            Err(other) => return Err(LedgerError::Storage(other)),
        }
    }
}

impl Ledger {
    /// Opens (or creates) the ledger in `dir`, with a small cache.
    pub fn open(dir: &Path) -> Result<Self, LedgerError> {
        let db = open_db(dir)?;
        let receipts = db.open_tree("receipts")?;
        let jobs = db.open_tree("jobs")?;
        let ledger = Self {
            sessions: db.open_tree("sessions")?,
            totals: db.open_tree("totals")?,
            receipt_api_keys: db.open_tree("receipt_api_keys")?,
            quarantine: db.open_tree("quarantine")?,
            voided: db.open_tree("voided")?,
            frauds: db.open_tree("frauds")?,
            channels: db.open_tree("channels")?,
            dispute_window_ms: std::sync::atomic::AtomicU64::new(DEFAULT_DISPUTE_WINDOW_MS),
            db,
            receipts,
            jobs,
        };
        ledger.build_totals()?;
        Ok(ledger)
    }

    /// Verifies and stores a receipt; the newest per (job, provider) is kept, and the
    /// buyer's (and `api_key`'s) running totals move with it in the same transaction.
    pub fn record_receipt(
        &self,
        envelope: &SignedEnvelope,
        api_key: Option<&str>,
    ) -> Result<Recorded, LedgerError> {
        let opened = envelope
            .open_archived::<Receipt>()
            .map_err(|e| LedgerError::Invalid(e.to_string()))?;
        let key = key(&opened.body);
        self.check_payable(&opened.body, &key)?;
        let recorded = self.store_receipt(envelope, &opened, &key, api_key)?;
        self.void_if_convicted(&opened, &key, recorded)
    }

    /// Whether `receipt` (stored at `key`) may still be paid: not voided, and its
    /// provider has no fraud on record.
    fn check_payable(&self, receipt: &Receipt, key: &[u8]) -> Result<(), LedgerError> {
        if self.is_voided(key)? {
            return Err(LedgerError::Invalid(
                "this job's receipts were voided by a fraud proof".into(),
            ));
        }
        // A job that was still running, or a window bought, when its provider was
        // convicted: nothing more is paid to a provider with a fraud on record.
        if self.frauds.contains_key(receipt.provider.as_bytes())? {
            return Err(LedgerError::Invalid(
                "this provider was convicted of fraud: nothing more is paid to it".into(),
            ));
        }
        Ok(())
    }

    /// A conviction recorded while this receipt was being booked: its void pass may have
    /// gone by before the receipt landed, so the receipt is voided here (the fraud record
    /// is written before that pass begins, so one of the two sees the other). Flushes.
    fn void_if_convicted(
        &self,
        opened: &sharemesh_protocol::Opened<Receipt>,
        key: &[u8],
        recorded: Recorded,
    ) -> Result<Recorded, LedgerError> {
        let convicted = self.frauds.contains_key(opened.body.provider.as_bytes())?;
        if recorded == Recorded::New && convicted {
            if let Some(stored) = self.receipts.get(key)? {
                self.void_stored(key, &read_stored(&stored)?, opened.issued_at_ms)?;
            }
        }
        if recorded == Recorded::New {
            self.db.flush()?;
        }
        if convicted {
            return Err(LedgerError::Invalid(
                "this provider was convicted of fraud: nothing more is paid to it".into(),
            ));
        }
        Ok(recorded)
    }

    /// Stores the receipt (the newest per job and provider) and moves the running
    /// totals with it, in one transaction; not flushed.
    fn store_receipt(
        &self,
        envelope: &SignedEnvelope,
        opened: &sharemesh_protocol::Opened<Receipt>,
        key: &[u8],
        api_key: Option<&str>,
    ) -> Result<Recorded, LedgerError> {
        let bytes = envelope
            .to_bytes()
            .map_err(|e| LedgerError::Invalid(e.to_string()))?;
        let receipt = &opened.body;
        let trees = (
            &self.receipts,
            &self.totals,
            &self.receipt_api_keys,
            &self.quarantine,
        );
        let recorded = trees.transaction(|(receipts, totals, api_keys, quarantine)| {
            let mut superseded = None;
            if let Some(current) = receipts.get(key)? {
                match read_stored(&current) {
                    Ok(stored) => {
                        if stored.seq >= envelope.seq {
                            return Ok(Recorded::AlreadyCounted);
                        }
                        if stored.body.buyer != receipt.buyer
                            || receipt.completion_tokens < stored.body.completion_tokens
                        {
                            return Err(ConflictableTransactionError::Abort(LedgerError::Invalid(
                                "a later receipt may not lower what an earlier one acknowledged"
                                    .into(),
                            )));
                        }
                        superseded = Some(stored);
                    }
                    // Its amount cannot be taken back out of the totals: they may count
                    // more than was spent, never less.
                    Err(_) => {
                        quarantine.insert([b"receipts/".as_slice(), key].concat(), current)?;
                    }
                }
            }
            let api_key = match api_keys.get(key)? {
                Some(id) => Some(String::from_utf8_lossy(&id).into_owned()),
                None => {
                    if let Some(id) = api_key {
                        api_keys.insert(key, id.as_bytes())?;
                    }
                    api_key.map(str::to_owned)
                }
            };
            receipts.insert(key, bytes.as_slice())?;
            if let Some(old) = superseded {
                let old_keys =
                    spend::buckets(&old.body.buyer, api_key.as_deref(), old.issued_at_ms);
                move_amount(totals, &old_keys, old.body.amount.0, false)?;
            }
            let new_keys = spend::buckets(&receipt.buyer, api_key.as_deref(), opened.issued_at_ms);
            move_amount(totals, &new_keys, receipt.amount.0, true)?;
            Ok(Recorded::New)
        });
        recorded.map_err(|e| match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => LedgerError::Storage(e),
        })
    }

    /// The newest stored receipt of `job_id` served by `provider`, if any (and readable).
    pub fn receipt_for(
        &self,
        job_id: &JobId,
        provider: &NodeId,
    ) -> Result<Option<Receipt>, LedgerError> {
        let mut key = job_id.as_bytes().to_vec();
        key.extend_from_slice(provider.as_bytes());
        Ok(self
            .receipts
            .get(&key)?
            .and_then(|bytes| read_stored(&bytes).ok())
            .map(|stored| stored.body))
    }

    /// The API key (id) whose money `receipt`'s job counts against, if any.
    pub fn api_key_of(&self, receipt: &Receipt) -> Result<Option<String>, LedgerError> {
        Ok(self
            .receipt_api_keys
            .get(key(receipt))?
            .map(|id| String::from_utf8_lossy(&id).into_owned()))
    }

    /// What `scope` spent in `period`: one read of a running total.
    pub fn spent(&self, scope: SpendScope<'_>, period: Period) -> Result<u64, LedgerError> {
        let key = spend::total_key(scope, period);
        Ok(spend::read_amount(self.totals.get(key)?.as_deref()))
    }

    /// Builds the running totals from the stored receipts once (a ledger written before
    /// they existed), taking each job's API key from its job record.
    fn build_totals(&self) -> Result<(), LedgerError> {
        if self.totals.contains_key(spend::BUILT_MARKER)? {
            return Ok(());
        }
        self.totals.clear()?;
        let mut key_of = std::collections::HashMap::new();
        for job in self.jobs()? {
            if let Some(id) = job.api_key {
                let mut receipt_key = job.job_id.as_bytes().to_vec();
                receipt_key.extend_from_slice(job.provider.as_bytes());
                key_of.insert(receipt_key, id);
            }
        }
        for entry in self.receipts.iter() {
            let (key, value) = entry?;
            let Ok(stored) = read_stored(&value) else {
                continue; // Quarantined by `receipts()` when next read.
            };
            if self.is_voided(&key)? {
                continue;
            }
            let api_key = key_of.get(key.as_ref());
            if let Some(id) = api_key {
                self.receipt_api_keys.insert(&key, id.as_bytes())?;
            }
            for bucket in spend::buckets(
                &stored.body.buyer,
                api_key.map(String::as_str),
                stored.issued_at_ms,
            ) {
                let current = spend::read_amount(self.totals.get(&bucket)?.as_deref());
                self.totals.insert(
                    bucket,
                    &current.saturating_add(stored.body.amount.0).to_be_bytes(),
                )?;
            }
        }
        self.totals.insert(spend::BUILT_MARKER, b"")?;
        self.db.flush()?;
        Ok(())
    }

    /// Moves an entry that does not read back out of `tree` into the quarantine, so one
    /// bad entry costs its own record and not every later read of the ledger.
    fn quarantine_entry(&self, tree: &sled::Tree, name: &str, key: &[u8], why: &str) {
        tracing::error!(tree = name, key = %hex::encode(key), why, "quarantined a corrupt ledger entry");
        let moved = tree.remove(key).and_then(|value| match value {
            Some(value) => self
                .quarantine
                .insert([name.as_bytes(), b"/", key].concat(), value)
                .map(|_| ()),
            None => Ok(()),
        });
        if let Err(err) = moved.and_then(|()| self.db.flush().map(|_| ())) {
            tracing::error!(tree = name, %err, "could not quarantine a corrupt ledger entry");
        }
    }

    /// How many entries were quarantined (they are kept, for inspection).
    pub fn quarantined(&self) -> Result<usize, LedgerError> {
        Ok(self.quarantine.len())
    }

    pub fn record_job(&self, job: &JobRecord) -> Result<(), LedgerError> {
        // Text ids in the key, as earlier ledgers wrote them.
        let mut key = job.job_id.to_string().into_bytes();
        key.extend_from_slice(job.provider.to_string().as_bytes());
        let value = serde_json::to_vec(job).map_err(|e| LedgerError::Corrupt(e.to_string()))?;
        self.jobs.insert(key, value)?;
        self.db.flush()?;
        Ok(())
    }

    /// Every stored (newest) receipt with its issue time, each re-verified; an entry
    /// that does not verify is quarantined and left out.
    pub fn receipts(&self) -> Result<Vec<(Receipt, u64)>, LedgerError> {
        let mut receipts = Vec::new();
        for entry in self.receipts.iter() {
            let (key, value) = entry?;
            match read_stored(&value) {
                Ok(stored) => receipts.push((stored.body, stored.issued_at_ms)),
                Err(err) => {
                    self.quarantine_entry(&self.receipts, "receipts", &key, &err.to_string())
                }
            }
        }
        Ok(receipts)
    }

    /// Every job record; one that does not parse is quarantined and left out.
    pub fn jobs(&self) -> Result<Vec<JobRecord>, LedgerError> {
        let mut jobs = Vec::new();
        for entry in self.jobs.iter() {
            let (key, value) = entry?;
            match serde_json::from_slice(&value) {
                Ok(job) => jobs.push(job),
                Err(err) => self.quarantine_entry(&self.jobs, "jobs", &key, &err.to_string()),
            }
        }
        Ok(jobs)
    }

    /// Records that a serving session started at `started_ms` is alive at `now_ms`.
    pub fn heartbeat(&self, started_ms: u64, now_ms: u64) -> Result<(), LedgerError> {
        self.sessions
            .insert(started_ms.to_be_bytes(), &now_ms.to_be_bytes())?;
        self.db.flush()?;
        Ok(())
    }

    /// Seconds of serving sessions since `since_ms` (as far as heartbeats show).
    pub fn uptime_seconds(&self, since_ms: u64) -> Result<f64, LedgerError> {
        let mut total = 0u64;
        for entry in self.sessions.iter() {
            let (start, alive) = entry?;
            let read = |b: &[u8]| {
                b.try_into()
                    .map(u64::from_be_bytes)
                    .map_err(|_| LedgerError::Corrupt("session entry".into()))
            };
            let (start, alive) = (read(&start)?, read(&alive)?);
            total += alive.saturating_sub(start.max(since_ms));
        }
        Ok(total as f64 / 1000.0)
    }

    /// Amount of receipts signed by `buyer` and issued at or after `since_ms` (a scan,
    /// for reports and tests; budgets read [`Self::spent`]).
    pub fn spent_since(&self, buyer: &NodeId, since_ms: u64) -> Result<u64, LedgerError> {
        Ok(self
            .receipts()?
            .iter()
            .filter(|(r, at)| &r.buyer == buyer && *at >= since_ms)
            .map(|(r, _)| r.amount.0)
            .sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharemesh_protocol::{JobId, Keypair, NanoUsd};

    fn receipt(buyer: &Keypair, provider: &Keypair, job: u8, tokens: u64) -> Receipt {
        Receipt {
            job_id: JobId::from_bytes([job; 16]),
            provider: provider.node_id(),
            buyer: buyer.node_id(),
            prompt_tokens: 10,
            completion_tokens: tokens,
            price_per_token: NanoUsd(100),
            amount: NanoUsd(100 * (10 + tokens)),
            commitment: sharemesh_protocol::Digest::from_bytes([tokens as u8; 32]),
        }
    }

    #[test]
    fn receipts_count_once_and_forgeries_are_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ledger = Ledger::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let (buyer, provider) = (Keypair::from_secret([1; 32]), Keypair::from_secret([2; 32]));
        let first = buyer
            .seal(&receipt(&buyer, &provider, 1, 8), 1, 1_000, 60_000)
            .unwrap_or_else(|e| panic!("{e}"));
        let second = buyer
            .seal(&receipt(&buyer, &provider, 1, 16), 2, 1_000, 60_000)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            ledger.record_receipt(&first, None).ok(),
            Some(Recorded::New)
        );
        assert_eq!(
            ledger.record_receipt(&second, None).ok(),
            Some(Recorded::New)
        );
        // Replays and duplicates change nothing.
        assert_eq!(
            ledger.record_receipt(&first, None).ok(),
            Some(Recorded::AlreadyCounted)
        );
        assert_eq!(
            ledger.record_receipt(&second, None).ok(),
            Some(Recorded::AlreadyCounted)
        );
        // Forged: body altered after signing.
        let mut forged = second.clone();
        forged.seq = 3;
        assert!(matches!(
            ledger.record_receipt(&forged, None),
            Err(LedgerError::Invalid(_))
        ));
        // Signed by someone who is not the buyer named in it.
        let impostor = Keypair::from_secret([9; 32]);
        let stolen = impostor
            .seal(&receipt(&buyer, &provider, 2, 8), 5, 1_000, 60_000)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(ledger.record_receipt(&stolen, None).is_err());
        // A later receipt may not lower what was acknowledged.
        let lower = buyer
            .seal(&receipt(&buyer, &provider, 1, 4), 9, 1_000, 60_000)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(ledger.record_receipt(&lower, None).is_err());
        let receipts = ledger.receipts().unwrap_or_default();
        assert_eq!(receipts.len(), 1);
        assert_eq!(receipts[0].0.completion_tokens, 16);
        let earnings =
            report(&ledger, &provider.node_id(), Side::Earnings, 0, 0).unwrap_or_default();
        assert_eq!(
            earnings.total,
            Totals {
                jobs: 1,
                tokens: 26,
                amount_nano_usd: 2600
            }
        );
        let spend = report(&ledger, &buyer.node_id(), Side::Spend, 0, 0).unwrap_or_default();
        assert_eq!(spend.total, earnings.total);
        assert_eq!(
            spend.per_day.keys().next().map(String::as_str),
            Some("1970-01-01")
        );
    }

    #[test]
    fn running_totals_follow_the_newest_receipt_per_day_month_and_key() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ledger = Ledger::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let (buyer, provider) = (Keypair::from_secret([1; 32]), Keypair::from_secret([2; 32]));
        let me = buyer.node_id();
        let day1 = parse_day("2026-11-30").unwrap_or(0) + 3_600_000;
        let day2 = day1 + 86_400_000; // 2026-12-01: another day and month
        let seal = |job, tokens, seq, at| {
            buyer
                .seal(&receipt(&buyer, &provider, job, tokens), seq, at, 60_000)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let spent = |scope, period| ledger.spent(scope, period).unwrap_or(u64::MAX);
        ledger
            .record_receipt(&seal(1, 10, 1, day1), Some("key-a"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spent(SpendScope::Buyer(&me), Period::Day(day1)), 2_000);
        assert_eq!(
            spent(SpendScope::ApiKey("key-a"), Period::Month(day1)),
            2_000
        );
        // The job's later receipt, issued the next day, moves the whole amount there,
        // and still counts against the key of its first receipt.
        ledger
            .record_receipt(&seal(1, 20, 2, day2), None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spent(SpendScope::Buyer(&me), Period::Day(day1)), 0);
        assert_eq!(spent(SpendScope::Buyer(&me), Period::Month(day1)), 0);
        assert_eq!(spent(SpendScope::Buyer(&me), Period::Day(day2)), 3_000);
        assert_eq!(spent(SpendScope::ApiKey("key-a"), Period::Day(day2)), 3_000);
        // A replay changes nothing; another job adds up.
        ledger
            .record_receipt(&seal(1, 20, 2, day2), Some("key-b"))
            .unwrap_or_else(|e| panic!("{e}"));
        ledger
            .record_receipt(&seal(2, 0, 1, day2), Some("key-b"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spent(SpendScope::Buyer(&me), Period::Month(day2)), 4_000);
        assert_eq!(spent(SpendScope::ApiKey("key-b"), Period::Day(day2)), 1_000);
        assert_eq!(spent(SpendScope::ApiKey("key-a"), Period::Day(day2)), 3_000);
        // The totals equal a scan of the receipts.
        assert_eq!(ledger.spent_since(&me, day2).unwrap_or(0), 4_000);
        let newest = ledger
            .receipt_for(&JobId::from_bytes([1; 16]), &provider.node_id())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(newest.map(|r| r.completion_tokens), Some(20));
        assert_eq!(
            ledger
                .receipt_for(&JobId::from_bytes([9; 16]), &provider.node_id())
                .ok()
                .flatten(),
            None
        );
        // The spend report splits the same money by key, and by key and day.
        let spend = crate::report(&ledger, &me, crate::Side::Spend, 0, day2)
            .unwrap_or_else(|e| panic!("{e}"));
        let amounts = |key: &str| {
            spend
                .per_api_key
                .get(key)
                .map(|t| (t.jobs, t.amount_nano_usd))
        };
        assert_eq!(amounts("key-a"), Some((1, 3_000)));
        assert_eq!(amounts("key-b"), Some((1, 1_000)));
        assert_eq!(
            spend.per_api_key_per_day["key-a"]
                .keys()
                .collect::<Vec<_>>(),
            ["2026-12-01"]
        );
        // Rebuilt from the receipts (a ledger from before totals existed): the same.
        ledger.totals.clear().unwrap_or_else(|e| panic!("{e}"));
        drop(ledger);
        let ledger = Ledger::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            ledger
                .spent(SpendScope::Buyer(&me), Period::Month(day2))
                .unwrap_or(0),
            4_000
        );
    }

    #[test]
    fn a_corrupt_entry_is_quarantined_and_the_rest_still_reads() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ledger = Ledger::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let (buyer, provider) = (Keypair::from_secret([1; 32]), Keypair::from_secret([2; 32]));
        for job in 1..=3 {
            let envelope = buyer
                .seal(&receipt(&buyer, &provider, job, 8), 1, 1_000, 60_000)
                .unwrap_or_else(|e| panic!("{e}"));
            ledger
                .record_receipt(&envelope, None)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        // A torn write or a flipped bit on disk.
        let victim = ledger.receipts.iter().keys().nth(1).and_then(Result::ok);
        let victim = victim.unwrap_or_else(|| panic!("three receipts stored"));
        ledger
            .receipts
            .insert(&victim, b"\x00garbage".as_slice())
            .unwrap_or_else(|e| panic!("{e}"));
        ledger
            .jobs
            .insert(b"bad-job", b"{ not json".as_slice())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ledger.receipts().unwrap_or_default().len(), 2);
        assert!(ledger.jobs().unwrap_or_default().is_empty());
        assert_eq!(ledger.quarantined().unwrap_or(0), 2);
        let spend =
            report(&ledger, &buyer.node_id(), Side::Spend, 0, 0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spend.total.jobs, 2);
        assert_eq!(spend.quarantined_entries, 2);
    }

    #[test]
    fn reopening_keeps_every_receipt() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (buyer, provider) = (Keypair::from_secret([1; 32]), Keypair::from_secret([2; 32]));
        {
            let ledger = Ledger::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
            for job in 0..20 {
                let env = buyer
                    .seal(&receipt(&buyer, &provider, job, 4), 1, 0, 1)
                    .unwrap_or_else(|e| panic!("{e}"));
                ledger
                    .record_receipt(&env, None)
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        let ledger = Ledger::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ledger.receipts().unwrap_or_default().len(), 20);
        ledger
            .heartbeat(1_000, 61_000)
            .unwrap_or_else(|e| panic!("{e}"));
        ledger
            .heartbeat(100_000, 130_000)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ledger.uptime_seconds(0).unwrap_or_default(), 90.0);
        // The earnings report carries it (and a spend report has none).
        let me = provider.node_id();
        let earnings = crate::report(&ledger, &me, crate::Side::Earnings, 0, 200_000)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(earnings.uptime_seconds, Some(90.0));
        let since = crate::report(&ledger, &me, crate::Side::Earnings, 110_000, 200_000)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(since.uptime_seconds, Some(20.0));
        let spend = crate::report(&ledger, &buyer.node_id(), crate::Side::Spend, 0, 200_000)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spend.uptime_seconds, None);
    }

    #[test]
    fn days_round_trip() {
        assert_eq!(day(1_796_029_200_000), "2026-11-30");
        assert_eq!(parse_day("2026-11-30"), Some(1_795_996_800_000));
        assert_eq!(
            day(parse_day("2024-02-29").unwrap_or_default()),
            "2024-02-29"
        );
        assert_eq!(parse_day("2026-13-01"), None);
        assert_eq!(parse_day("yesterday"), None);
    }
}
