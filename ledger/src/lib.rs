//! The metering ledger, in sled, on both sides: every receipt (provider: earnings;
//! buyer: spend) and every job. A receipt is verified before it is stored; the newest
//! receipt per (job, provider) wins, so a replayed or duplicated receipt counts once;
//! each write is flushed before it is acknowledged, so `kill -9` at any moment loses
//! no recorded receipt and a restart finds consistent books.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sharemesh_protocol::{FinishReason, JobId, NanoUsd, NodeId, Receipt, SignedEnvelope};

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
}

fn key(receipt: &Receipt) -> Vec<u8> {
    let mut key = receipt.job_id.as_bytes().to_vec();
    key.extend_from_slice(receipt.provider.as_bytes());
    key
}

impl Ledger {
    /// Opens (or creates) the ledger in `dir`, with a small cache.
    pub fn open(dir: &Path) -> Result<Self, LedgerError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(8 * 1024 * 1024)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(io)
                    if io.kind() == std::io::ErrorKind::WouldBlock
                        || io.to_string().contains("lock") =>
                {
                    LedgerError::Locked(dir.display().to_string())
                }
                other => LedgerError::Storage(other),
            })?;
        let receipts = db.open_tree("receipts")?;
        let jobs = db.open_tree("jobs")?;
        let sessions = db.open_tree("sessions")?;
        Ok(Self {
            db,
            receipts,
            jobs,
            sessions,
        })
    }

    /// Verifies and stores a receipt; the newest per (job, provider) is kept.
    pub fn record_receipt(&self, envelope: &SignedEnvelope) -> Result<Recorded, LedgerError> {
        let opened = envelope
            .open_archived::<Receipt>()
            .map_err(|e| LedgerError::Invalid(e.to_string()))?;
        let key = key(&opened.body);
        let bytes = envelope
            .to_bytes()
            .map_err(|e| LedgerError::Invalid(e.to_string()))?;
        loop {
            let current = self.receipts.get(&key)?;
            if let Some(stored) = &current {
                let stored = SignedEnvelope::from_bytes(stored)
                    .map_err(|e| LedgerError::Corrupt(e.to_string()))?;
                let stored_body = stored
                    .open_archived::<Receipt>()
                    .map_err(|e| LedgerError::Corrupt(e.to_string()))?
                    .body;
                if stored.seq >= envelope.seq {
                    return Ok(Recorded::AlreadyCounted);
                }
                if stored_body.buyer != opened.body.buyer
                    || opened.body.completion_tokens < stored_body.completion_tokens
                {
                    return Err(LedgerError::Invalid(
                        "a later receipt may not lower what an earlier one acknowledged".into(),
                    ));
                }
            }
            match self
                .receipts
                .compare_and_swap(&key, current, Some(bytes.clone()))?
            {
                Ok(()) => break,
                Err(_) => continue, // Raced with another writer: look again.
            }
        }
        self.db.flush()?;
        Ok(Recorded::New)
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

    /// Every stored (newest) receipt with its issue time, each re-verified.
    pub fn receipts(&self) -> Result<Vec<(Receipt, u64)>, LedgerError> {
        self.receipts
            .iter()
            .values()
            .map(|value| {
                let envelope = SignedEnvelope::from_bytes(&value?)
                    .map_err(|e| LedgerError::Corrupt(e.to_string()))?;
                let opened = envelope
                    .open_archived::<Receipt>()
                    .map_err(|e| LedgerError::Corrupt(e.to_string()))?;
                Ok((opened.body, opened.issued_at_ms))
            })
            .collect()
    }

    pub fn jobs(&self) -> Result<Vec<JobRecord>, LedgerError> {
        self.jobs
            .iter()
            .values()
            .map(|value| {
                serde_json::from_slice(&value?).map_err(|e| LedgerError::Corrupt(e.to_string()))
            })
            .collect()
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

    /// What requests made with API key `key_id` cost since `since_ms`: the amounts of the
    /// receipts of the jobs recorded with that key (money is read from receipts only).
    pub fn spent_by_key(&self, key_id: &str, since_ms: u64) -> Result<u64, LedgerError> {
        let keyed: std::collections::BTreeSet<(JobId, NodeId)> = self
            .jobs()?
            .into_iter()
            .filter(|j| j.api_key.as_deref() == Some(key_id) && j.started_ms >= since_ms)
            .map(|j| (j.job_id, j.provider))
            .collect();
        Ok(self
            .receipts()?
            .iter()
            .filter(|(r, _)| keyed.contains(&(r.job_id, r.provider)))
            .map(|(r, _)| r.amount.0)
            .sum())
    }

    /// Amount of receipts signed by `buyer` and issued at or after `since_ms`.
    pub fn spent_since(&self, buyer: &NodeId, since_ms: u64) -> Result<u64, LedgerError> {
        Ok(self
            .receipts()?
            .iter()
            .filter(|(r, at)| &r.buyer == buyer && *at >= since_ms)
            .map(|(r, _)| r.amount.0)
            .sum())
    }
}

/// Tokens and money.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    pub jobs: u64,
    pub tokens: u64,
    pub amount_nano_usd: u64,
}

impl Totals {
    fn add(&mut self, receipt: &Receipt) {
        self.jobs += 1;
        self.tokens += receipt.prompt_tokens + receipt.completion_tokens;
        self.amount_nano_usd += receipt.amount.0;
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
}

fn percentiles(mut values: Vec<f64>) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    Some(Percentiles {
        p50: at(0.5),
        p95: at(0.95),
    })
}

/// `YYYY-MM-DD` (UTC) of a Unix time in ms.
pub fn day(unix_ms: u64) -> String {
    // Howard Hinnant's civil-from-days.
    let z = (unix_ms / 86_400_000) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Unix ms of the start of a `YYYY-MM-DD` day (UTC).
pub fn parse_day(text: &str) -> Option<u64> {
    let mut parts = text.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (parts.next()??, parts.next()??, parts.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400_000).ok()
}

/// Earnings (provider) or spend (buyer) from one side's ledger.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub total: Totals,
    pub per_day: BTreeMap<String, Totals>,
    pub per_model: BTreeMap<String, Totals>,
    /// Per buyer (earnings) or per provider (spend).
    pub per_counterparty: BTreeMap<String, Totals>,
    pub ttft_ms: Option<Percentiles>,
    pub tokens_per_second: Option<Percentiles>,
    pub jobs_by_outcome: BTreeMap<String, u64>,
    /// Seconds this node served (earnings only).
    pub uptime_seconds: Option<f64>,
}

/// Which side's report: `me` as provider (earnings) or as buyer (spend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Earnings,
    Spend,
}

pub fn report(
    ledger: &Ledger,
    me: &NodeId,
    side: Side,
    since_ms: u64,
) -> Result<Report, LedgerError> {
    let jobs = ledger.jobs()?;
    let model_of = |job_id: &JobId, provider: &NodeId| {
        jobs.iter()
            .find(|j| &j.job_id == job_id && &j.provider == provider)
            .map_or_else(|| "unknown".to_owned(), |j| j.model.clone())
    };
    let mut report = Report::default();
    for (receipt, issued_at) in ledger.receipts()? {
        let mine = match side {
            Side::Earnings => &receipt.provider == me,
            Side::Spend => &receipt.buyer == me,
        };
        if !mine || issued_at < since_ms {
            continue;
        }
        let counterparty = match side {
            Side::Earnings => receipt.buyer.to_string(),
            Side::Spend => receipt.provider.to_string(),
        };
        report.total.add(&receipt);
        report
            .per_day
            .entry(day(issued_at))
            .or_default()
            .add(&receipt);
        report
            .per_model
            .entry(model_of(&receipt.job_id, &receipt.provider))
            .or_default()
            .add(&receipt);
        report
            .per_counterparty
            .entry(counterparty)
            .or_default()
            .add(&receipt);
    }
    let recent: Vec<&JobRecord> = jobs.iter().filter(|j| j.started_ms >= since_ms).collect();
    report.ttft_ms = percentiles(recent.iter().filter_map(|j| j.ttft_ms).collect());
    report.tokens_per_second =
        percentiles(recent.iter().filter_map(|j| j.tokens_per_second).collect());
    for job in recent {
        *report
            .jobs_by_outcome
            .entry(job.outcome.name().to_owned())
            .or_default() += 1;
    }
    Ok(report)
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
        assert_eq!(ledger.record_receipt(&first).ok(), Some(Recorded::New));
        assert_eq!(ledger.record_receipt(&second).ok(), Some(Recorded::New));
        // Replays and duplicates change nothing.
        assert_eq!(
            ledger.record_receipt(&first).ok(),
            Some(Recorded::AlreadyCounted)
        );
        assert_eq!(
            ledger.record_receipt(&second).ok(),
            Some(Recorded::AlreadyCounted)
        );
        // Forged: body altered after signing.
        let mut forged = second.clone();
        forged.seq = 3;
        assert!(matches!(
            ledger.record_receipt(&forged),
            Err(LedgerError::Invalid(_))
        ));
        // Signed by someone who is not the buyer named in it.
        let impostor = Keypair::from_secret([9; 32]);
        let stolen = impostor
            .seal(&receipt(&buyer, &provider, 2, 8), 5, 1_000, 60_000)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(ledger.record_receipt(&stolen).is_err());
        // A later receipt may not lower what was acknowledged.
        let lower = buyer
            .seal(&receipt(&buyer, &provider, 1, 4), 9, 1_000, 60_000)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(ledger.record_receipt(&lower).is_err());
        let receipts = ledger.receipts().unwrap_or_default();
        assert_eq!(receipts.len(), 1);
        assert_eq!(receipts[0].0.completion_tokens, 16);
        let earnings = report(&ledger, &provider.node_id(), Side::Earnings, 0).unwrap_or_default();
        assert_eq!(
            earnings.total,
            Totals {
                jobs: 1,
                tokens: 26,
                amount_nano_usd: 2600
            }
        );
        let spend = report(&ledger, &buyer.node_id(), Side::Spend, 0).unwrap_or_default();
        assert_eq!(spend.total, earnings.total);
        assert_eq!(
            spend.per_day.keys().next().map(String::as_str),
            Some("1970-01-01")
        );
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
                    .record_receipt(&env)
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
