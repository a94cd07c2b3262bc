//! What a request leaves behind: the job log's record of its route and price per
//! hop, and each segment booked in the ledger with its metrics.

use super::*;

impl Dispatcher {
    /// The job log's record of a planned request: the candidates in the order they
    /// will be tried, with their scores.
    pub(super) fn job_record(
        &self,
        plan: &Plan,
        request: &RouteRequest,
        key: Option<&KeyRecord>,
    ) -> crate::jobs::JobRecord {
        let tokens = request.sampling.max_tokens;
        crate::jobs::JobRecord {
            job_id: plan.job_id.to_string(),
            model: request.model.clone(),
            tier: plan.tier,
            key: key.map(|k| k.id.clone()),
            started_unix_ms: now_ms(),
            finished_unix_ms: None,
            status: "running".into(),
            error: None,
            candidates: plan
                .candidates
                .iter()
                .map(|c| crate::jobs::CandidateRecord {
                    provider: c.provider().to_string(),
                    price_per_token_nano_usd: c.price.0,
                    latency_ms: c.view.latency_ms,
                    tokens_per_second: c.view.tokens_per_second,
                    reliability: c.view.reliability,
                    score: sharemesh_market::score(&c.view, tokens, &self.defaults.score),
                })
                .collect(),
            segments: Vec::new(),
            completion_tokens: 0,
            cost_nano_usd: 0,
        }
    }

    /// A finished segment in the job log: its times, tokens, price and why it ended.
    pub(super) fn log_segment(&self, response: &Response, report: &SegmentReport, price: NanoUsd) {
        let since = |t: Instant| t.saturating_duration_since(response.started).as_millis() as u64;
        let ended = match &report.end {
            _ if report.client_left => "the client went away".to_owned(),
            Ok(FinishReason::Stop | FinishReason::Length) => "completed".to_owned(),
            Ok(FinishReason::Cancelled) => "preempted".to_owned(),
            Ok(FinishReason::Error) => "provider error".to_owned(),
            Err(why) => format!("failover: {why}"),
        };
        self.jobs.segment(
            &response.job_id,
            crate::jobs::SegmentRecord {
                provider: report.provider.to_string(),
                started_ms: since(report.started),
                first_token_ms: report.first_token.map(since),
                ended_ms: since(Instant::now()),
                prompt_tokens: report
                    .accept
                    .as_ref()
                    .map_or(0, |a| u64::from(a.prompt_tokens)),
                completion_tokens: report.tokens,
                price_per_token_nano_usd: price.0,
                amount_nano_usd: report.last_receipt.as_ref().map_or(0, |r| r.amount.0),
                ended,
            },
        );
    }

    /// A provider that served nothing of the response (never opened, or lost a
    /// hedged start) in the job log.
    pub(super) fn log_unserved(&self, response: &Response, candidate: &Candidate, why: String) {
        self.log_nothing(response.job_id, response.started, candidate, why);
    }

    pub(super) fn log_nothing(
        &self,
        job: JobId,
        since: Instant,
        candidate: &Candidate,
        why: String,
    ) {
        let now = since.elapsed().as_millis() as u64;
        self.jobs.segment(
            &job,
            crate::jobs::SegmentRecord {
                provider: candidate.provider().to_string(),
                started_ms: now,
                first_token_ms: None,
                ended_ms: now,
                prompt_tokens: 0,
                completion_tokens: 0,
                price_per_token_nano_usd: candidate.price.0,
                amount_nano_usd: 0,
                ended: why,
            },
        );
    }

    /// The job log (`GET /v1/jobs`).
    pub fn jobs(&self) -> &crate::jobs::JobLog {
        &self.jobs
    }

    /// Books what a segment cost: the amount of its last receipt (a segment the node's
    /// own provider served costs nothing), and a job record in the ledger.
    pub(super) async fn book(
        &self,
        report: &SegmentReport,
        request: &RouteRequest,
        key: Option<&KeyRecord>,
        response: &mut Response,
    ) {
        let Some(accept) = &report.accept else {
            return; // Never accepted: nothing served, nothing owed.
        };
        let amount = report
            .last_receipt
            .as_ref()
            .map_or(NanoUsd::ZERO, |r| r.amount);
        response.cost = response.cost.checked_add(amount).unwrap_or(response.cost);
        self.count(|m| {
            m.count_segment(&report.provider.to_string());
            m.tokens.inc_by(report.tokens);
            m.spent_nano_usd.inc_by(amount.0);
            if let Some(first) = report.first_token {
                m.time_to_first_token
                    .observe((first - report.started).as_secs_f64());
            }
        });
        response.segments.push(Segment {
            provider: report.provider.to_string(),
            prompt_tokens: u64::from(accept.prompt_tokens),
            completion_tokens: report.tokens,
            amount_nano_usd: amount.0,
        });
        let ttft = report
            .first_token
            .map(|t| (t - report.started).as_secs_f64() * 1000.0);
        let tps = report
            .first_token
            .filter(|_| report.tokens > 1)
            .map(|t| (report.tokens - 1) as f64 / t.elapsed().as_secs_f64().max(1e-9));
        // Every job is a check of the advertised speed (enough tokens to mean it).
        if let Some(tps) = tps.filter(|_| report.tokens >= SPEED_CHECK_MIN_TOKENS) {
            self.trust.auditor.record_speed(report.provider, tps);
        }
        let Some(ledger) = &self.ledger else { return };
        let record = JobRecord {
            job_id: response.job_id,
            provider: report.provider,
            buyer: self.node_id(),
            model: request.model.clone(),
            prompt_tokens: u64::from(accept.prompt_tokens),
            completion_tokens: report.tokens,
            price_per_token: accept.price_per_token,
            started_ms: now_ms(),
            ttft_ms: ttft,
            tokens_per_second: tps,
            api_key: key.map(|k| k.id.clone()),
            outcome: match report.end {
                Ok(finish) => JobOutcome::from(finish),
                Err(_) => JobOutcome::Failed,
            },
        };
        // sled flushes to disk: off the async runtime's threads.
        let ledger = ledger.clone();
        let booked = tokio::task::spawn_blocking(move || ledger.record_job(&record)).await;
        if let Ok(Err(err)) = booked {
            tracing::warn!(%err, "could not book the job");
        }
    }
}
