//! One request being served, as a state: the candidates left, the response so far, why
//! the last provider failed. [`Job::after`] decides what a segment's end means (done,
//! the client left, try the next provider) without side effects, so the rules are
//! tested alone; [`Dispatcher::serve`] runs the segments and acts on the decisions.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use sharemesh_mesh::clock::now_ms;
use sharemesh_protocol::{FinishReason, JobRequest, NanoUsd, NodeId, Tier};
use sharemesh_reputation::Outcome;
use tokio::sync::mpsc;

use super::{DispatchEvent, Dispatcher, Response, SegmentReport};
use crate::buyer::{Billing, SegmentError};
use crate::keys::KeyRecord;
use crate::plan::Plan;
use crate::quote::Candidate;
use crate::route::{RouteError, RouteRequest};
use crate::segment::SegmentTerms;
use crate::verify::audit;
use crate::verify::trust::SegmentAudit;

/// The longest wait between two plans while a request waits mid-answer.
pub(super) const MAX_REPLAN_GAP: std::time::Duration = std::time::Duration::from_secs(4);

/// A request's state while providers serve it.
pub(super) struct Job {
    plan: Plan,
    /// Candidates not tried yet, best first.
    queue: VecDeque<Candidate>,
    response: Response,
    /// Start on two providers at once (gold tier, once).
    hedge: bool,
    last_error: String,
    /// Whether every provider tried refused only for lack of capacity (then the
    /// request waits for a turn and is planned again).
    only_unavailable: bool,
    terms: SegmentTerms,
    audit_secret: [u8; 32],
    audit_commitment: sharemesh_protocol::Digest,
    /// The median quoted price: what "cheap" is measured against.
    median_price: NanoUsd,
    /// Whether the prompt was counted again after an `Uncounted` segment.
    recounted: bool,
    /// Whether every provider tried since the last segment that streamed was merely
    /// unavailable (unreachable, or at capacity).
    unavailable_since_stream: bool,
    /// When the request, mid-answer with no candidate left, began waiting for one.
    waiting_since: Option<Instant>,
    /// The highest price among the planned candidates: what the budget reserved for,
    /// so a provider found while waiting may cost no more.
    price_ceiling: NanoUsd,
    /// Providers this request cut off for what they did (misbehaved or stalled): not
    /// asked again when it plans anew mid-answer.
    cut_off: Vec<NodeId>,
}

/// What a segment's end means for the request.
#[derive(Debug, PartialEq)]
pub(super) enum Next {
    /// The provider finished it: tell the client.
    Done(FinishReason),
    /// The client went away: the request ends (what arrived is booked and audited).
    ClientLeft,
    /// The provider did not finish it; `outcome` is what its reputation records.
    FailOver { outcome: Option<Outcome> },
}

impl Job {
    pub(super) fn new(
        mut plan: Plan,
        request: &RouteRequest,
        key: Option<&KeyRecord>,
        hedge_gold: bool,
    ) -> Self {
        let queue: VecDeque<Candidate> = std::mem::take(&mut plan.candidates).into();
        let hedge = plan.tier == Tier::Reserved
            && request.routing.hedge.unwrap_or(hedge_gold)
            && queue.len() >= 2;
        let terms = SegmentTerms {
            billing: Billing::Metered(key.map(|k| k.id.clone())),
            counted: plan.counted.clone(),
        };
        let (audit_secret, audit_commitment) = audit::audit_secret(&plan.job_id);
        let price_ceiling = queue.iter().map(|c| c.price).max().unwrap_or(NanoUsd::ZERO);
        Self {
            median_price: median_price(&queue),
            response: Response {
                started: Instant::now(),
                job_id: plan.job_id,
                delivered: Vec::new(),
                providers: Vec::new(),
                segments: Vec::new(),
                cost: NanoUsd::ZERO,
                warming: None,
                warmed_at: 0,
            },
            plan,
            queue,
            hedge,
            last_error: String::from("no provider answered"),
            only_unavailable: true,
            terms,
            audit_secret,
            audit_commitment,
            recounted: false,
            unavailable_since_stream: true,
            waiting_since: None,
            price_ceiling,
            cut_off: Vec::new(),
        }
    }

    /// The job a provider is asked to run: the request, resumed after every token
    /// delivered so far.
    fn job_request(&self, buyer: NodeId, request: &RouteRequest, to: &Candidate) -> JobRequest {
        JobRequest {
            job_id: self.plan.job_id,
            buyer,
            provider: to.provider(),
            model: self.plan.model,
            prompt: request.prompt.clone(),
            sampling: request.sampling.clone(),
            max_price_per_token: to.price,
            tier: self.plan.tier,
            deadline_ms: now_ms() + 600_000,
            resume: self.response.delivered.clone(),
            audit_commitment: self.audit_commitment,
        }
    }

    /// Whether a provider's answer `err` calls for counting the prompt again: it
    /// counted more than this node can bound without the model's vocabulary (a long
    /// default system prompt in its template may be honest), so the request waits for
    /// the vocabulary and, once it has it, asks the same provider again with an exact
    /// count. Once per request; a claim still unconfirmed is `Misbehaved` as before.
    fn recounts(&mut self, err: &SegmentError) -> bool {
        matches!(err, SegmentError::Uncounted { .. })
            && self.terms.counted.is_none()
            && !std::mem::replace(&mut self.recounted, true)
    }

    /// A provider that could not be reached or refused before accepting.
    fn not_opened(&mut self, provider: NodeId, err: &SegmentError) {
        self.last_error = format!("provider {provider}: {err}");
        self.only_unavailable &= err.is_unavailable();
        self.unavailable_since_stream &= err.is_unavailable();
        self.cut_off_if_at_fault(provider, err);
    }

    /// Remembers `provider` as not to be asked again by this request when `err` is its
    /// own doing (misbehaved or stalled), at `Accept` or mid-stream alike.
    fn cut_off_if_at_fault(&mut self, provider: NodeId, err: &SegmentError) {
        if matches!(err.outcome(), Some(Outcome::Misbehaved | Outcome::Stalled)) {
            self.cut_off.push(provider);
        }
    }

    /// Whether, with no candidate left at `now`, the request waits for a provider to
    /// come back rather than fail: it is mid-answer (the client has tokens; the rest
    /// resumes exactly after them), everything tried since its last segment was merely
    /// unavailable — the providers' relay died with the one that streamed, say, and
    /// they are reachable again once they hold another — and it has waited less than
    /// `limit` in all.
    pub(super) fn waits_mid_answer(&mut self, now: Instant, limit: std::time::Duration) -> bool {
        if self.response.providers.is_empty() || !self.unavailable_since_stream {
            return false;
        }
        let since = *self.waiting_since.get_or_insert(now);
        now.duration_since(since) < limit
    }

    /// How long to wait before planning again, mid-answer: half of what it waited so
    /// far, at least `first` and at most [`MAX_REPLAN_GAP`]. A relay found again within
    /// a second or two is tried within a second or two, while a request whose providers
    /// are gone for good asks the market for quotes about a dozen times in 30 s, not
    /// sixty.
    pub(super) fn replan_delay(
        &self,
        now: Instant,
        first: std::time::Duration,
    ) -> std::time::Duration {
        let waited = self
            .waiting_since
            .map_or(std::time::Duration::ZERO, |since| {
                now.saturating_duration_since(since)
            });
        (waited / 2).clamp(first, MAX_REPLAN_GAP.max(first))
    }

    /// Candidates found while waiting mid-answer: those within the price the budget
    /// reserved for, and not cut off by this request.
    pub(super) fn refill(&mut self, candidates: Vec<Candidate>) {
        let (ceiling, cut_off) = (self.price_ceiling, &self.cut_off);
        self.queue.extend(
            candidates
                .into_iter()
                .filter(|c| c.price <= ceiling && !cut_off.contains(&c.provider())),
        );
    }

    /// What the end of `report`'s segment means.
    pub(super) fn after(&mut self, report: &SegmentReport) -> Next {
        if report.client_left {
            // Its stream was dropped, which cancelled the job and sent the receipt for
            // what arrived; the provider did nothing wrong.
            return Next::ClientLeft;
        }
        let provider = report.provider;
        match &report.end {
            // A provider that cancels (preemption) or errs has not finished the job.
            Ok(finish @ (FinishReason::Stop | FinishReason::Length)) => Next::Done(*finish),
            Ok(finish) => {
                self.last_error = format!("provider {provider} stopped the job ({finish:?})");
                self.only_unavailable = false;
                self.unavailable_since_stream = true;
                Next::FailOver {
                    outcome: Some(Outcome::Failed),
                }
            }
            Err(why) => {
                self.last_error = format!("provider {provider}: {why}");
                self.only_unavailable &= why.is_at_capacity();
                self.unavailable_since_stream = true;
                self.cut_off_if_at_fault(provider, why);
                Next::FailOver {
                    outcome: why.outcome(),
                }
            }
        }
    }

    /// Every token the request asked for was delivered (by the providers that failed).
    fn delivered_all(&self, request: &RouteRequest) -> bool {
        self.response.delivered.len() >= request.sampling.max_tokens as usize
    }

    /// Why the request failed once no candidate is left.
    pub(super) fn failure(self) -> RouteError {
        // A provider that accepted is in `providers`: the client has been told.
        if !self.response.providers.is_empty() {
            RouteError::Upstream(self.last_error)
        } else if self.only_unavailable {
            RouteError::busy(self.last_error)
        } else {
            RouteError::NoProvider(self.last_error)
        }
    }
}

impl Dispatcher {
    /// Runs a planned request on its candidates in turn (failing over, hedging gold);
    /// `true` once done, `false` when the client went away.
    pub(super) async fn serve(
        self: &Arc<Self>,
        plan: Plan,
        request: &RouteRequest,
        key: Option<KeyRecord>,
        events: &mpsc::Sender<DispatchEvent>,
    ) -> Result<bool, RouteError> {
        let mut job = Job::new(plan, request, key.as_ref(), self.defaults.hedge_gold);
        loop {
            let Some(candidate) = job.queue.pop_front() else {
                if self.wait_mid_answer(&mut job, request, events).await? {
                    continue;
                }
                return Err(job.failure());
            };
            let asked = job.job_request(self.node_id(), request, &candidate);
            let started = Instant::now();
            let (candidate, opened) = if std::mem::take(&mut job.hedge) {
                let since = job.response.started;
                self.open_hedged(candidate, asked.clone(), &mut job.queue, &job.terms, since)
                    .await
            } else {
                let terms = job.terms.clone();
                let opened = self
                    .segments
                    .open(&candidate.entry, asked.clone(), terms)
                    .await;
                (candidate, opened)
            };
            let provider = candidate.provider();
            let opened = match opened {
                Ok(opened) => opened,
                Err(err) => {
                    if job.recounts(&err) && self.recount(&mut job, request, &candidate).await? {
                        tracing::info!(job = %job.plan.job_id, %provider, "asking again with the prompt counted by the model's vocabulary");
                        job.queue.push_front(candidate);
                        continue;
                    }
                    job.not_opened(provider, &err);
                    self.record(provider, err.outcome());
                    self.count(|m| m.failovers.inc());
                    self.log_unserved(&job.response, &candidate, format!("not opened: {err}"));
                    continue;
                }
            };
            self.trust.serving(job.plan.model, provider);
            let asked = JobRequest {
                provider,
                max_price_per_token: candidate.price,
                ..asked
            };
            let next = job.queue.front();
            let mut report = self
                .stream_segment(opened, &asked, started, &mut job.response, next, events)
                .await;
            self.book(&report, request, key.as_ref(), &mut job.response)
                .await;
            self.log_segment(&job.response, &report, candidate.price);
            if let Some(transcript) = report.transcript.take() {
                self.trust.consider(SegmentAudit {
                    transcript,
                    secret: job.audit_secret,
                    job_id: job.plan.job_id,
                    price: candidate.price,
                    median_price: job.median_price,
                });
            }
            match job.after(&report) {
                Next::ClientLeft => return Ok(false),
                Next::Done(finish) => {
                    let tokens = report.tokens;
                    self.record(provider, Outcome::Completed { tokens });
                    if let Ok(mut book) = self.mesh.book.write() {
                        // It served us: its advert keeps its place in a flooded book.
                        book.mark_known_good(provider);
                    }
                    self.done(finish, job.response, events).await;
                    return Ok(true);
                }
                Next::FailOver { outcome } => {
                    self.record(provider, outcome);
                    let (job_id, delivered) = (job.plan.job_id, job.response.delivered.len());
                    tracing::warn!(job = %job_id, %provider, error = %job.last_error, delivered, "provider failed; trying the next");
                    self.count(|m| m.failovers.inc());
                    if job.delivered_all(request) {
                        self.done(FinishReason::Length, job.response, events).await;
                        return Ok(true);
                    }
                }
            }
        }
    }

    /// With no candidate left mid-answer, waits a moment for a provider to be
    /// reachable again and plans anew ([`Job::waits_mid_answer`]); whether there are
    /// candidates to try (`Ok(false)` too when the client left meanwhile: the request
    /// then fails unheard).
    async fn wait_mid_answer(
        &self,
        job: &mut Job,
        request: &RouteRequest,
        events: &mpsc::Sender<DispatchEvent>,
    ) -> Result<bool, RouteError> {
        let waiting = self.defaults.waiting;
        if !job.waits_mid_answer(Instant::now(), waiting.max_wait) {
            return Ok(false);
        }
        tracing::info!(job = %job.plan.job_id, error = %job.last_error, "every provider left is unavailable mid-answer: waiting for one");
        let delay = job.replan_delay(Instant::now(), waiting.pump_every);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = events.closed() => return Ok(false),
        }
        match self.plan(request).await {
            Ok(plan) => job.refill(plan.candidates),
            Err(err) => job.last_error = err.to_string(),
        }
        Ok(true)
    }

    /// Waits (at most [`RECOUNT_WAIT`], and not again for a while once such a wait for
    /// the model came to nothing) for the model's vocabulary to count the prompt
    /// exactly; whether it came.
    async fn recount(
        &self,
        job: &mut Job,
        request: &RouteRequest,
        candidate: &Candidate,
    ) -> Result<bool, RouteError> {
        let mut sources = vec![candidate.clone()];
        sources.extend(job.queue.iter().cloned());
        job.terms.counted = self
            .count_prompt(
                job.plan.model,
                request,
                &sources,
                super::counting::HeaderWait::OnceLately(RECOUNT_WAIT),
            )
            .await?;
        Ok(job.terms.counted.is_some())
    }

    /// Logs the response as complete, then tells the client.
    async fn done(
        &self,
        finish: FinishReason,
        response: Response,
        events: &mpsc::Sender<DispatchEvent>,
    ) {
        let summary = (response.delivered.len() as u64, response.cost);
        self.jobs.finish(&response.job_id, now_ms(), Ok(summary));
        let done = DispatchEvent::Done {
            finish,
            completion_tokens: response.delivered.len() as u32,
            providers: response.providers,
            cost: response.cost,
            segments: response.segments,
        };
        let _ = events.send(done).await;
    }
}

/// How long a request whose prompt count could not be bounded waits for the model's
/// vocabulary: long enough for a multi-megabyte header, short enough that a provider
/// holding its header back while overbilling delays a request little (and only one: a
/// fruitless wait is not repeated for the model for 30 s).
const RECOUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The median price among the quoted candidates: what "cheap" is measured against.
fn median_price(candidates: &VecDeque<Candidate>) -> NanoUsd {
    let mut prices: Vec<u64> = candidates.iter().map(|c| c.price.0).collect();
    prices.sort_unstable();
    NanoUsd(prices.get(prices.len() / 2).copied().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sharemesh_protocol::{JobId, ModelId, Prompt, RejectReason, Sampling};

    use super::*;

    fn fresh() -> (Job, RouteRequest) {
        let request = RouteRequest {
            model: "m".into(),
            prompt: Prompt::Text("hi".into()),
            sampling: Sampling {
                max_tokens: 4,
                ..Sampling::default()
            },
            routing: Default::default(),
        };
        let plan = Plan {
            job_id: JobId::from_bytes([7; 16]),
            model: ModelId::from_bytes([1; 32]),
            tier: Tier::OnDemand,
            candidates: Vec::new(),
            worst_case: 0,
            counted: None,
        };
        (Job::new(plan, &request, None, true), request)
    }

    fn ended(end: Result<FinishReason, SegmentError>, client_left: bool) -> SegmentReport {
        SegmentReport {
            provider: NodeId::from_bytes([9; 32]),
            accept: None,
            tokens: 2,
            last_receipt: None,
            started: Instant::now(),
            first_token: None,
            end,
            transcript: None,
            client_left,
        }
    }

    fn full() -> SegmentError {
        SegmentError::Refused {
            reason: RejectReason::OverCapacity,
            detail: "full".into(),
        }
    }

    #[test]
    fn a_finished_segment_ends_the_request_and_a_client_leaving_ends_it_first() {
        let (mut job, _) = fresh();
        for finish in [FinishReason::Stop, FinishReason::Length] {
            assert_eq!(job.after(&ended(Ok(finish), false)), Next::Done(finish));
        }
        assert_eq!(
            job.after(&ended(Ok(FinishReason::Stop), true)),
            Next::ClientLeft
        );
        let stalled = ended(Err(SegmentError::Stalled(Duration::from_secs(5))), true);
        assert_eq!(job.after(&stalled), Next::ClientLeft);
    }

    #[test]
    fn a_request_only_full_providers_refused_waits_for_a_turn() {
        let (mut job, _) = fresh();
        job.not_opened(NodeId::from_bytes([2; 32]), &full());
        let next = job.after(&ended(Err(full()), false));
        assert_eq!(
            next,
            Next::FailOver {
                outcome: Some(Outcome::Refused)
            }
        );
        assert!(matches!(job.failure(), RouteError::Busy { .. }));
    }

    #[test]
    fn any_other_failure_is_no_provider_and_after_an_accept_upstream() {
        let (mut job, _) = fresh();
        job.not_opened(NodeId::from_bytes([2; 32]), &full());
        let preempted = job.after(&ended(Ok(FinishReason::Cancelled), false));
        assert_eq!(
            preempted,
            Next::FailOver {
                outcome: Some(Outcome::Failed)
            }
        );
        assert!(
            matches!(job.failure(), RouteError::NoProvider(ref why) if why.contains("Cancelled"))
        );
        let (mut job, request) = fresh();
        job.response.providers.push(NodeId::from_bytes([3; 32]));
        job.response.delivered = vec![5, 6, 7, 8];
        let broke = job.after(&ended(Err(SegmentError::StreamBroke("eof".into())), false));
        assert!(matches!(broke, Next::FailOver { .. }));
        assert!(job.delivered_all(&request), "4 of max_tokens 4 delivered");
        assert!(matches!(job.failure(), RouteError::Upstream(ref why) if why.contains("eof")));
    }

    /// A job mid-answer whose streaming provider's connection (its relay) just died.
    fn streamed_then_broke() -> Job {
        let (mut job, _) = fresh();
        job.response.providers.push(NodeId::from_bytes([9; 32]));
        job.after(&ended(
            Err(SegmentError::StreamBroke("relay".into())),
            false,
        ));
        job
    }

    #[test]
    fn mid_answer_a_request_waits_for_unavailable_providers_within_its_limit() {
        let limit = Duration::from_secs(30);
        let start = Instant::now();
        // Before any token: no (a fresh request waits in the waiting room instead).
        let (mut job, _) = fresh();
        job.not_opened(NodeId::from_bytes([2; 32]), &full());
        assert!(!job.waits_mid_answer(start, limit));
        // Mid-answer, the streaming provider's relay died and the rest is unreachable.
        let mut job = streamed_then_broke();
        let unreachable = SegmentError::Unreachable("connection refused".into());
        job.not_opened(NodeId::from_bytes([2; 32]), &unreachable);
        job.not_opened(NodeId::from_bytes([3; 32]), &full());
        assert!(job.waits_mid_answer(start, limit));
        assert!(job.waits_mid_answer(start + Duration::from_secs(29), limit));
        assert!(
            !job.waits_mid_answer(start + limit, limit),
            "the wait is bounded"
        );
        // A provider that refused for another reason ends the wait: it is an answer.
        let mut job = streamed_then_broke();
        job.not_opened(
            NodeId::from_bytes([2; 32]),
            &SegmentError::BadAnswer("?".into()),
        );
        assert!(!job.waits_mid_answer(start, limit));
    }

    #[test]
    fn mid_answer_re_plans_back_off_to_a_bounded_gap() {
        let first = Duration::from_millis(500);
        let start = Instant::now();
        let mut job = streamed_then_broke();
        assert_eq!(job.replan_delay(start, first), first, "before any wait");
        job.not_opened(
            NodeId::from_bytes([2; 32]),
            &SegmentError::Unreachable("refused".into()),
        );
        assert!(job.waits_mid_answer(start, Duration::from_secs(30)));
        assert_eq!(job.replan_delay(start, first), first);
        assert_eq!(
            job.replan_delay(start + Duration::from_secs(3), first),
            Duration::from_millis(1_500)
        );
        assert_eq!(
            job.replan_delay(start + Duration::from_secs(29), first),
            MAX_REPLAN_GAP
        );
        // Re-plans over a 30 s wait: a dozen or so, not sixty.
        let (mut at, mut plans) = (start, 0);
        while at < start + Duration::from_secs(30) {
            at += job.replan_delay(at, first);
            plans += 1;
        }
        assert!((8..=16).contains(&plans), "{plans} re-plans");
    }

    #[test]
    fn providers_found_mid_answer_are_within_the_reserved_price_and_not_cut_off() {
        let (mut job, _) = fresh();
        job.price_ceiling = NanoUsd(100);
        let cheat = crate::quote::tests::candidate(4, 50);
        job.cut_off.push(cheat.provider());
        job.refill(vec![
            crate::quote::tests::candidate(2, 100),
            crate::quote::tests::candidate(3, 101),
            cheat,
        ]);
        let queued: Vec<NodeId> = job.queue.iter().map(Candidate::provider).collect();
        assert_eq!(
            queued,
            vec![crate::quote::tests::candidate(2, 100).provider()]
        );
        // A segment that misbehaved cuts its provider off; one whose stream broke not.
        let (mut job, _) = fresh();
        job.after(&ended(Err(SegmentError::BadChunk("forged".into())), false));
        job.after(&SegmentReport {
            provider: NodeId::from_bytes([8; 32]),
            ..ended(Err(SegmentError::StreamBroke("eof".into())), false)
        });
        assert_eq!(job.cut_off, vec![NodeId::from_bytes([9; 32])]);
        // So does one whose `Accept` broke the terms (an overbiller, an alias key).
        let terms = SegmentError::TermsMismatch("a count it made up".into());
        job.not_opened(NodeId::from_bytes([7; 32]), &terms);
        assert_eq!(job.cut_off.last(), Some(&NodeId::from_bytes([7; 32])));
    }

    #[test]
    fn a_count_above_the_bound_is_counted_again_once_per_request() {
        let (mut job, _) = fresh();
        let uncounted = SegmentError::Uncounted {
            bound: 80,
            claim: 900,
        };
        assert!(job.recounts(&uncounted));
        // Still without a vocabulary after waiting for it: held to the bound.
        assert!(!job.recounts(&uncounted));
        assert_eq!(uncounted.outcome(), Some(Outcome::Misbehaved));
        assert!(!job.recounts(&full()));
    }
}
