//! Each request's route and price per hop, for `GET /v1/jobs` and `GET /v1/jobs/{id}`
//! (SPEC §10): the candidates the plan ranked (with their scores), then every segment
//! — provider, tokens, price, amount, times — and why it ended (completed, a failover
//! and its reason, preempted, a hedge lost). Kept in memory for the last
//! [`MAX_JOBS`] requests; no prompt or answer text is kept.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;
use sharemesh_protocol::{JobId, NanoUsd, Tier};

/// Requests remembered; the oldest is forgotten beyond it.
pub const MAX_JOBS: usize = 1_000;

/// A provider the plan ranked, in the order it would be tried.
#[derive(Clone, Debug, Serialize)]
pub struct CandidateRecord {
    pub provider: String,
    pub price_per_token_nano_usd: u64,
    /// Round trip plus queue wait the ranking expected (quoted where it answered).
    pub latency_ms: f64,
    pub tokens_per_second: f64,
    pub reliability: f64,
    /// `sharemesh_market::score`: expected cost in nano-USD, lowest first.
    pub score: f64,
}

/// One provider's part of a response.
#[derive(Clone, Debug, Serialize)]
pub struct SegmentRecord {
    pub provider: String,
    /// From the request's start.
    pub started_ms: u64,
    pub first_token_ms: Option<u64>,
    pub ended_ms: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub price_per_token_nano_usd: u64,
    /// What the last receipt for it says.
    pub amount_nano_usd: u64,
    /// `completed`, `preempted`, `provider error`, `hedge lost`, or `failover: …` /
    /// `not opened: …` with the reason.
    pub ended: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct JobRecord {
    pub job_id: String,
    pub model: String,
    pub tier: Tier,
    /// The API key (its id) the request came with, if any.
    pub key: Option<String>,
    pub started_unix_ms: u64,
    pub finished_unix_ms: Option<u64>,
    /// `running`, `completed` or `failed`.
    pub status: String,
    pub error: Option<String>,
    pub candidates: Vec<CandidateRecord>,
    pub segments: Vec<SegmentRecord>,
    pub completion_tokens: u64,
    pub cost_nano_usd: u64,
}

/// The last [`MAX_JOBS`] requests.
#[derive(Default)]
pub struct JobLog {
    jobs: Mutex<VecDeque<JobRecord>>,
}

impl JobLog {
    pub fn start(&self, record: JobRecord) {
        if let Ok(mut jobs) = self.jobs.lock() {
            if jobs.len() >= MAX_JOBS {
                jobs.pop_front();
            }
            jobs.push_back(record);
        }
    }

    fn update(&self, job: &JobId, change: impl FnOnce(&mut JobRecord)) {
        let id = job.to_string();
        if let Ok(mut jobs) = self.jobs.lock() {
            if let Some(record) = jobs.iter_mut().rev().find(|r| r.job_id == id) {
                change(record);
            }
        }
    }

    pub fn segment(&self, job: &JobId, segment: SegmentRecord) {
        self.update(job, |r| r.segments.push(segment));
    }

    pub fn finish(&self, job: &JobId, now_ms: u64, outcome: Result<(u64, NanoUsd), String>) {
        self.update(job, |r| {
            r.finished_unix_ms = Some(now_ms);
            match outcome {
                Ok((tokens, cost)) => {
                    r.status = "completed".into();
                    r.completion_tokens = tokens;
                    r.cost_nano_usd = cost.0;
                }
                Err(error) => {
                    r.status = "failed".into();
                    r.cost_nano_usd = r.segments.iter().map(|s| s.amount_nano_usd).sum();
                    r.completion_tokens = r.segments.iter().map(|s| s.completion_tokens).sum();
                    r.error = Some(error);
                }
            }
        });
    }

    /// The request `id`, if remembered and visible to `key` (`None`: any).
    pub fn get(&self, id: &str, key: Option<&str>) -> Option<JobRecord> {
        let jobs = self.jobs.lock().ok()?;
        jobs.iter()
            .rev()
            .find(|r| r.job_id == id && visible(r, key))
            .cloned()
    }

    /// The newest `limit` requests visible to `key`, newest first.
    pub fn list(&self, limit: usize, key: Option<&str>) -> Vec<JobRecord> {
        self.jobs.lock().map_or_else(
            |_| Vec::new(),
            |jobs| {
                jobs.iter()
                    .rev()
                    .filter(|r| visible(r, key))
                    .take(limit)
                    .cloned()
                    .collect()
            },
        )
    }
}

/// A key sees its own requests; no key (loopback without keys, an admin) sees all.
fn visible(record: &JobRecord, key: Option<&str>) -> bool {
    key.is_none_or(|key| record.key.as_deref() == Some(key))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn record(id: u8, key: Option<&str>) -> JobRecord {
        JobRecord {
            job_id: JobId::from_bytes([id; 16]).to_string(),
            model: "m".into(),
            tier: Tier::OnDemand,
            key: key.map(str::to_owned),
            started_unix_ms: 1,
            finished_unix_ms: None,
            status: "running".into(),
            error: None,
            candidates: vec![],
            segments: vec![],
            completion_tokens: 0,
            cost_nano_usd: 0,
        }
    }

    #[test]
    fn keys_see_their_own_jobs_and_the_log_is_bounded() {
        let log = JobLog::default();
        log.start(record(1, Some("alice")));
        log.start(record(2, Some("bob")));
        let alice = JobId::from_bytes([1; 16]).to_string();
        assert!(log.get(&alice, Some("alice")).is_some());
        assert!(log.get(&alice, Some("bob")).is_none());
        assert!(log.get(&alice, None).is_some());
        assert_eq!(log.list(10, None).len(), 2);
        assert_eq!(log.list(10, Some("bob")).len(), 1);
        log.finish(&JobId::from_bytes([1; 16]), 9, Err("no provider".into()));
        let failed = log.get(&alice, None).unwrap();
        assert_eq!(
            (failed.status.as_str(), failed.finished_unix_ms),
            ("failed", Some(9))
        );
        for i in 0..MAX_JOBS {
            log.start(record((i % 200) as u8 + 3, None));
        }
        assert_eq!(log.list(usize::MAX, None).len(), MAX_JOBS);
        assert!(log.get(&alice, None).is_none(), "the oldest is forgotten");
    }
}
