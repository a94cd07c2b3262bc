//! Reports read from a ledger: earnings or spend by day, model and counterparty, with
//! job statistics; and the UTC calendar the ledger buckets money by.

use std::collections::BTreeMap;

use serde::Serialize;
use sharemesh_protocol::{JobId, NodeId, Receipt};

use crate::{JobRecord, Ledger, LedgerError, Settlement};

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

/// Unix ms of the start of the UTC day holding `unix_ms`.
pub fn day_start(unix_ms: u64) -> u64 {
    unix_ms - unix_ms % 86_400_000
}

/// Unix ms of the start of the UTC month holding `unix_ms`.
pub fn month_start(unix_ms: u64) -> u64 {
    parse_day(&format!("{}-01", &day(unix_ms)[..7])).unwrap_or(0)
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
    /// Spend per API key id (spend on a gateway that uses keys; receipts without a key
    /// are in the totals and in no key's row).
    pub per_api_key: BTreeMap<String, Totals>,
    /// Spend per API key id, then per UTC day (`YYYY-MM-DD`).
    pub per_api_key_per_day: BTreeMap<String, BTreeMap<String, Totals>>,
    pub ttft_ms: Option<Percentiles>,
    pub tokens_per_second: Option<Percentiles>,
    pub jobs_by_outcome: BTreeMap<String, u64>,
    /// Seconds this node served (earnings only).
    pub uptime_seconds: Option<f64>,
    /// Entries that did not read back and were moved aside (see `Ledger::quarantined`).
    pub quarantined_entries: usize,
    /// Pending (within the dispute window), final and voided money, over all time.
    pub settlement: Settlement,
    /// The same per buyer (earnings) or per provider (spend): each channel's final
    /// amount is what its buyer authorises on chain (SPEC §13).
    pub per_counterparty_settlement: BTreeMap<String, Settlement>,
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
    now_ms: u64,
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
        if !mine || issued_at < since_ms || ledger.is_voided(&crate::key(&receipt))? {
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
        if side == Side::Spend {
            if let Some(api_key) = ledger.api_key_of(&receipt)? {
                report
                    .per_api_key_per_day
                    .entry(api_key.clone())
                    .or_default()
                    .entry(day(issued_at))
                    .or_default()
                    .add(&receipt);
                report.per_api_key.entry(api_key).or_default().add(&receipt);
            }
        }
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
    if side == Side::Earnings {
        report.uptime_seconds = Some(ledger.uptime_seconds(since_ms)?);
    }
    report.quarantined_entries = ledger.quarantined()?;
    report.settlement = ledger.settlement(me, side, now_ms)?;
    report.per_counterparty_settlement = ledger
        .channels_of(me, side, now_ms)?
        .into_iter()
        .map(|(counterparty, money)| (counterparty.to_string(), money))
        .collect();
    Ok(report)
}
