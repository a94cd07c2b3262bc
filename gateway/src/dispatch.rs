//! Routing a request to providers, in three steps: plan it ([`crate::plan`]: eligible
//! providers, quotes, ranking, worst case held against the budgets), run it segment by
//! segment (on a provider failure the same response continues on the next provider
//! with `resume`: the engine's exact resume keeps the text identical), and book each
//! segment (amounts read from the buyer's signed receipts).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rand::Rng;
use sharemesh_ledger::{JobOutcome, JobRecord, Ledger};
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::orderbook::BookEntry;
use sharemesh_mesh::{MeshEvent, MeshHandle};
use sharemesh_protocol::{
    Accept, FinishReason, JobId, JobRequest, Keypair, ModelId, NanoUsd, NodeId, Receipt, Tier,
};
use sharemesh_reputation::{Outcome, ReputationBook, ScoreParams};
use tokio::sync::{broadcast, mpsc};

use crate::audit::{self, AuditPolicy};
use crate::budget::{Budget, Budgets};
use crate::buyer::{Billing, JobEvent, SegmentError};
use crate::error::ApiError;
use crate::keys::KeyRecord;
use crate::openai::CompletionRequest;
use crate::plan::{self, Plan, RoutingDefaults};
use crate::quote::Candidate;
use crate::segment::{race, LocalRoute, Opened, SegmentTerms, Segments};
use crate::transcript::Transcript;
use crate::trust::{SegmentAudit, Trust};
use crate::vocab::{self, Counted, Vocabularies};

#[derive(Debug)]
pub enum DispatchEvent {
    Accepted {
        job_id: JobId,
        provider: NodeId,
        prompt_tokens: u32,
    },
    Token {
        text: String,
        token_id: u32,
    },
    Switched {
        provider: NodeId,
    },
    Done {
        finish: FinishReason,
        completion_tokens: u32,
        providers: Vec<NodeId>,
        cost: NanoUsd,
        segments: Vec<Segment>,
    },
    Failed(ApiError),
}

/// What one provider served of a response, as its receipts priced it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Segment {
    pub provider: String,
    pub prompt_tokens: u64,
    /// Tokens delivered to the client from this provider.
    pub completion_tokens: u64,
    /// The amount of the last receipt the buyer signed for this segment (tokens that
    /// arrived after it, when the stream broke, are not owed).
    pub amount_nano_usd: u64,
}

pub struct Dispatcher {
    mesh: MeshHandle,
    key: Arc<Keypair>,
    defaults: RoutingDefaults,
    reliability: Arc<Mutex<ReputationBook<NodeId>>>,
    /// Verification, fraud proofs and the providers dropped for fraud.
    trust: Arc<Trust>,
    ledger: Option<Arc<Ledger>>,
    budgets: Budgets,
    segments: Arc<Segments>,
    vocabularies: Arc<Vocabularies>,
    /// Requests, routes, failovers and spend (`GET /metrics`).
    metrics: Option<crate::metrics::GatewayMetrics>,
    /// Each recent request's route and price per hop (`GET /v1/jobs`).
    jobs: crate::jobs::JobLog,
}

/// The response as it grows across segments.
struct Response {
    job_id: JobId,
    /// When the request started (segment times in the job log are from here).
    started: Instant,
    /// Every completion token delivered to the client, across providers.
    delivered: Vec<u32>,
    providers: Vec<NodeId>,
    segments: Vec<Segment>,
    cost: NanoUsd,
    /// The standby warm-up in flight, and the delivered count it was started at.
    warming: Option<tokio::task::JoinHandle<()>>,
    warmed_at: usize,
}

/// How one segment went, for booking and for the next step.
struct SegmentReport {
    provider: NodeId,
    accept: Option<Accept>,
    /// Tokens delivered from this segment.
    tokens: u64,
    last_receipt: Option<Receipt>,
    started: Instant,
    first_token: Option<Instant>,
    end: Result<FinishReason, SegmentError>,
    /// What the provider signed (remote providers only), for verification.
    transcript: Option<Transcript>,
}

impl Dispatcher {
    pub fn new(
        mesh: MeshHandle,
        key: Keypair,
        defaults: RoutingDefaults,
        ledger: Option<Arc<Ledger>>,
        budget: Budget,
    ) -> Arc<Self> {
        let key = Arc::new(key);
        let segments = Segments::new(
            mesh.clone(),
            key.clone(),
            ledger.clone(),
            defaults.stall_timeout,
        );
        let reliability = Arc::new(Mutex::new(ReputationBook::new(
            ScoreParams::default(),
            10_000,
        )));
        let trust = Trust::new(
            mesh.clone(),
            key.clone(),
            ledger.clone(),
            reliability.clone(),
            AuditPolicy::default(),
        );
        let mesh_metrics = mesh
            .metrics
            .as_ref()
            .and_then(crate::metrics::GatewayMetrics::register);
        let dispatcher = Arc::new(Self {
            mesh,
            key,
            defaults,
            reliability,
            trust,
            ledger,
            budgets: Budgets::new(budget),
            segments: Arc::new(segments),
            vocabularies: Arc::default(),
            metrics: mesh_metrics,
            jobs: crate::jobs::JobLog::default(),
        });
        dispatcher.penalise_signed_faults();
        dispatcher
    }

    /// A provider that signs an invalid advert (a catalog name on another model's id)
    /// loses standing here, not only that advert.
    fn penalise_signed_faults(self: &Arc<Self>) {
        let mut events = self.mesh.subscribe();
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(MeshEvent::AdvertRejected {
                        signed_fault: Some(signer),
                        reason,
                        ..
                    }) => {
                        let Some(this) = this.upgrade() else { return };
                        tracing::warn!(provider = %signer, %reason, "provider signed an invalid advert");
                        this.record(signer, Outcome::Misbehaved);
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                    _ => {}
                }
            }
        });
    }

    fn count<R>(&self, change: impl FnOnce(&crate::metrics::GatewayMetrics) -> R) {
        if let Some(metrics) = &self.metrics {
            change(metrics);
        }
    }

    /// Routes jobs for this node's own provider to it directly.
    pub fn set_local_route(&self, route: Arc<dyn LocalRoute>) {
        self.segments.set_local_route(route);
    }

    pub fn ledger(&self) -> Option<&Arc<Ledger>> {
        self.ledger.as_ref()
    }

    /// Verification and its findings (the node sets a replayer where it holds models).
    pub fn trust(&self) -> &Arc<Trust> {
        &self.trust
    }

    pub fn node_id(&self) -> NodeId {
        self.key.node_id()
    }

    /// Has other providers re-run windows of what this node cannot replay itself, paid
    /// from this node's ledger like its own jobs (SPEC §12, `--verify-by-providers`).
    pub fn outsource_verification(&self, policy: crate::outsource::OutsourcePolicy) {
        let segments = Segments::new(
            self.mesh.clone(),
            self.key.clone(),
            self.ledger.clone(),
            self.defaults.stall_timeout,
        );
        self.trust
            .outsource(crate::outsource::Outsourcing::new(segments, policy));
    }

    pub fn mesh(&self) -> &MeshHandle {
        &self.mesh
    }

    /// Live adverts, less providers dropped for fraud.
    fn live(&self) -> Vec<Arc<BookEntry>> {
        self.trust.live()
    }

    /// A catalog name or model id → the model id, if anyone offers it now.
    pub fn resolve_model(&self, name: &str) -> Result<ModelId, ApiError> {
        plan::resolve_model(&self.live(), name)
    }

    /// Eligible providers for `model`, best first (see [`plan::candidates`]).
    pub fn candidates(
        &self,
        model: &ModelId,
        request: &CompletionRequest,
        rtt_ms: &std::collections::HashMap<libp2p::PeerId, f64>,
    ) -> (Vec<Candidate>, Tier) {
        self.rank(self.live(), model, request, rtt_ms)
    }

    /// [`Self::candidates`] over a copy of the book the caller already took.
    fn rank(
        &self,
        live: Vec<Arc<BookEntry>>,
        model: &ModelId,
        request: &CompletionRequest,
        rtt_ms: &std::collections::HashMap<libp2p::PeerId, f64>,
    ) -> (Vec<Candidate>, Tier) {
        let now = now_ms();
        self.check_memory_claims(&live, model);
        let book = self.reliability.lock().ok();
        // Half this node's own success rate with the provider, half its standing in
        // this node's trust view (verified work, its own and trusted reporters'): a
        // fresh key starts below a provider with a verified record.
        let trust = self.trust.standing.trust();
        let best = live
            .iter()
            .filter_map(|e| trust.get(&e.advert.provider).copied())
            .fold(0.0, f64::max);
        let reliability = |provider: &NodeId| {
            let success = book.as_ref().map_or(0.5, |b| b.success_rate(provider, now));
            let standing = match trust.get(provider) {
                Some(t) if best > 0.0 => (t / best).clamp(0.0, 1.0),
                _ => 0.0,
            };
            let base = 0.5 * success + 0.5 * standing;
            // Hardware claims that do not fit together halve it.
            if self.trust.attestations.is_flagged(provider) {
                base * 0.5
            } else {
                base
            }
        };
        let measured_speed = |provider: &NodeId| self.trust.auditor.measured_speed(provider);
        let context = plan::Context {
            live,
            defaults: &self.defaults,
            rtt_ms,
            reliability: &reliability,
            measured_speed: &measured_speed,
            now_ms: now,
        };
        plan::candidates(model, request, &context)
    }

    /// Where this gateway holds `model`'s header: an advert offering it on less memory
    /// than its weights and a KV cache for the advertised context need is a hardware
    /// finding (ranked lower, every job verified) until the advert changes.
    fn check_memory_claims(&self, live: &[Arc<BookEntry>], model: &ModelId) {
        let Some(memory) = self.vocabularies.get(model).and_then(|v| v.memory) else {
            return;
        };
        let attestations = &self.trust.attestations;
        for entry in live {
            let Some(offer) = entry.advert.offer(model) else {
                continue;
            };
            let needed = memory.needed_for(offer.model.context_length);
            let name = offer.model.name.as_str();
            let finding = crate::attest::memory_shortfall(&entry.advert.hardware, name, needed);
            let provider = entry.advert.provider;
            if attestations.note_memory(provider, name, finding) {
                tracing::warn!(%provider, model = name, "advertised memory below what the model needs");
                self.trust.auditor.suspect(provider);
            }
        }
    }

    fn limit_unproven(&self, candidates: Vec<Candidate>) -> Vec<Candidate> {
        let Ok(book) = self.mesh.book.read() else {
            return candidates;
        };
        plan::limit_unproven(candidates, self.defaults.unproven_ahead, |id| {
            book.is_known_good(id)
        })
    }

    /// Whether this gateway counts `model`'s prompts with its own vocabulary (it holds
    /// a header that makes the model's id).
    pub fn counts_with(&self, model: &ModelId) -> bool {
        self.vocabularies.get(model).is_some()
    }

    /// This gateway's reputation score of `provider` now (0.5 for one it never used).
    pub fn reputation(&self, provider: &NodeId) -> f64 {
        self.reliability
            .lock()
            .map_or(0.5, |book| book.score(provider, now_ms()))
    }

    fn record(&self, provider: NodeId, outcome: impl Into<Option<Outcome>>) {
        let Some(outcome) = outcome.into() else {
            return;
        };
        if let Ok(mut book) = self.reliability.lock() {
            book.record(&provider, outcome, now_ms());
        }
    }

    /// Starts a request (on behalf of `key`, when API keys are on); the first event is
    /// `Accepted` or `Failed`.
    pub fn run(
        self: &Arc<Self>,
        request: CompletionRequest,
        key: Option<KeyRecord>,
    ) -> mpsc::Receiver<DispatchEvent> {
        let (events, receiver) = mpsc::channel(64);
        let this = self.clone();
        tokio::spawn(async move {
            let tier = plan::tier_of(&request, &this.defaults);
            let result = this.drive(request, key, &events).await;
            if let Some(metrics) = &this.metrics {
                let status = match &result {
                    Ok(()) => "200".to_owned(),
                    Err(err) => err.status.as_u16().to_string(),
                };
                let tier = format!("{tier:?}").to_lowercase();
                metrics
                    .requests
                    .get_or_create(&crate::metrics::RequestLabels { status, tier })
                    .inc();
            }
            if let Err(err) = result {
                let _ = events.send(DispatchEvent::Failed(err)).await;
            }
        });
        receiver
    }

    /// Resolves the model, filters and ranks the providers, asks the best for quotes.
    async fn plan(&self, request: &CompletionRequest) -> Result<Plan, ApiError> {
        // What every provider would refuse is refused here, with the reason, before any
        // provider work (it was retried on every candidate and reported as a 503).
        request
            .prompt
            .validate()
            .and_then(|()| request.sampling.validate())
            .map_err(ApiError::from_validation)?;
        // One read of the book serves both the model's resolution and the ranking.
        let live = self.live();
        let model = plan::resolve_model(&live, &request.model)?;
        let rtt_ms = self.mesh.round_trips_ms();
        let (candidates, tier) = self.rank(live, &model, request, &rtt_ms);
        if candidates.is_empty() {
            return Err(ApiError::no_provider(format!(
                "no provider can serve `{}` now within the price ceiling, tier, region and VRAM constraints",
                request.model
            )));
        }
        let job_id = JobId::from_bytes(rand::rng().random());
        let candidates = self.limit_unproven(candidates);
        let quoting = Instant::now();
        let candidates = plan::quote_round(
            &self.mesh,
            &self.key,
            candidates,
            (job_id, model, tier),
            request,
            &self.defaults,
        )
        .await;
        if let Some(metrics) = &self.metrics {
            metrics.quote_round.observe(quoting.elapsed().as_secs_f64());
        }
        let mut candidates = self.limit_unproven(candidates);
        if candidates.is_empty() {
            return Err(ApiError::no_provider(format!(
                "every provider asked for a quote for `{}` declined it",
                request.model
            )));
        }
        candidates.truncate(self.defaults.max_attempts);
        let counted = self.count_prompt(model, request, &candidates).await?;
        let worst_case = plan::worst_case(request, &candidates);
        Ok(Plan {
            job_id,
            model,
            tier,
            candidates,
            worst_case,
            counted,
        })
    }

    /// Counts the prompt with the model's vocabulary (fetched from the candidates the
    /// first time, checked against the model id), and refuses a prompt that does not
    /// fit the model's context before any provider work. `None` when no candidate sends
    /// the header: the buyer then holds Accepts to the prompt's token bound.
    /// The model's vocabulary: held, or fetched from one of `sources` (waiting at most
    /// `wait`).
    async fn vocabulary(
        &self,
        model: ModelId,
        sources: &[&BookEntry],
        wait: std::time::Duration,
    ) -> Result<Arc<sharemesh_tokenizer::Vocabulary>, crate::vocab::FetchError> {
        if let Some(vocabulary) = self.vocabularies.get(&model) {
            return Ok(vocabulary);
        }
        // Only the first requests of a model need the providers' addresses.
        let remote: Vec<(libp2p::PeerId, Vec<String>)> = sources
            .iter()
            .filter(|e| e.advert.provider != self.node_id())
            .filter_map(|e| {
                Some((
                    e.advert.provider.peer_id().ok()?,
                    e.advert.addresses.clone(),
                ))
            })
            .collect();
        self.vocabularies
            .get_or_fetch(&self.mesh, model, &remote, wait)
            .await
    }

    /// How many tokens `prompt` runs as on the model `name` names (Anthropic's
    /// `count_tokens`), with the model's own vocabulary.
    pub async fn count_tokens(
        &self,
        name: &str,
        prompt: &sharemesh_protocol::Prompt,
    ) -> Result<u32, ApiError> {
        let live = self.live();
        let model = plan::resolve_model(&live, name)?;
        let sources: Vec<&BookEntry> = live
            .iter()
            .filter(|e| e.advert.offer(&model).is_some())
            .map(|e| e.as_ref())
            .collect();
        let wait = self
            .defaults
            .count_wait
            .max(std::time::Duration::from_secs(10));
        let vocabulary = self
            .vocabulary(model, &sources, wait)
            .await
            .map_err(|e| ApiError::no_provider(format!("cannot count tokens for `{name}`: {e}")))?;
        vocab::count(&vocabulary, prompt)
            .map(|c| c.prompt_tokens)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))
    }

    /// `ids` decoded with the vocabulary of the model `name` names, if this node holds
    /// it.
    pub fn decode(&self, name: &str, ids: &[u32]) -> Option<String> {
        let model = self.resolve_model(name).ok()?;
        let vocabulary = self.vocabularies.get(&model)?;
        Some(vocabulary.tokenizer.decode(ids))
    }

    async fn count_prompt(
        &self,
        model: ModelId,
        request: &CompletionRequest,
        candidates: &[Candidate],
    ) -> Result<Option<Counted>, ApiError> {
        let sources: Vec<&BookEntry> = candidates.iter().map(|c| c.entry.as_ref()).collect();
        let vocabulary = self
            .vocabulary(model, &sources, self.defaults.count_wait)
            .await;
        let vocabulary = match vocabulary {
            Ok(vocabulary) => vocabulary,
            Err(err) => {
                tracing::debug!(%model, %err, "counting with the prompt's token bound");
                return Ok(None);
            }
        };
        let param = match request.prompt {
            sharemesh_protocol::Prompt::Chat(_) => "messages",
            _ => "prompt",
        };
        let counted = vocab::count(&vocabulary, &request.prompt)
            .map_err(|e| ApiError::invalid(param, e.to_string()))?;
        // From the verified header, not from adverts: a provider advertising a tiny
        // context must not make the gateway refuse every request for the model.
        let context = vocabulary.context_length.unwrap_or(u32::MAX);
        if counted.prompt_tokens >= context {
            return Err(ApiError::invalid(
                param,
                format!(
                    "the prompt is {} tokens, but the model's context is {context}",
                    counted.prompt_tokens
                ),
            ));
        }
        Ok(Some(counted))
    }

    async fn drive(
        self: &Arc<Self>,
        request: CompletionRequest,
        key: Option<KeyRecord>,
        events: &mpsc::Sender<DispatchEvent>,
    ) -> Result<(), ApiError> {
        let plan = self.plan(&request).await?;
        let _reservation = self.budgets.reserve(
            self.ledger.as_deref(),
            &self.node_id(),
            plan.worst_case,
            key.as_ref(),
            now_ms(),
        )?;
        let job_id = plan.job_id;
        self.jobs
            .start(self.job_record(&plan, &request, key.as_ref()));
        let served = self.serve(plan, &request, key, events).await;
        // A completed request was logged before the client heard it was done.
        match &served {
            Ok(true) => {}
            Ok(false) => self
                .jobs
                .finish(&job_id, now_ms(), Err("the client went away".into())),
            Err(err) => self
                .jobs
                .finish(&job_id, now_ms(), Err(err.message.clone())),
        }
        served.map(|_| ())
    }

    /// The job log's record of a planned request: the candidates in the order they
    /// will be tried, with their scores.
    fn job_record(
        &self,
        plan: &Plan,
        request: &CompletionRequest,
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

    /// Runs a planned request on its candidates in turn (failing over, hedging gold);
    /// `true` once done, `false` when the client went away.
    async fn serve(
        self: &Arc<Self>,
        plan: Plan,
        request: &CompletionRequest,
        key: Option<KeyRecord>,
        events: &mpsc::Sender<DispatchEvent>,
    ) -> Result<bool, ApiError> {
        let mut response = Response {
            started: Instant::now(),
            job_id: plan.job_id,
            delivered: Vec::new(),
            providers: Vec::new(),
            segments: Vec::new(),
            cost: NanoUsd::ZERO,
            warming: None,
            warmed_at: 0,
        };
        let mut queue: VecDeque<Candidate> = plan.candidates.into();
        let mut hedge = plan.tier == Tier::Reserved
            && request.routing.hedge.unwrap_or(self.defaults.hedge_gold)
            && queue.len() >= 2;
        let mut last_error = String::from("no provider answered");
        let terms = SegmentTerms {
            billing: Billing::Metered(key.as_ref().map(|k| k.id.clone())),
            counted: plan.counted.clone(),
        };
        let (audit_secret, audit_commitment) = audit::audit_secret(&plan.job_id);
        let median_price = median_price(&queue);
        while let Some(candidate) = queue.pop_front() {
            let job = JobRequest {
                job_id: plan.job_id,
                buyer: self.node_id(),
                provider: candidate.provider(),
                model: plan.model,
                prompt: request.prompt.clone(),
                sampling: request.sampling.clone(),
                max_price_per_token: candidate.price,
                tier: plan.tier,
                deadline_ms: now_ms() + 600_000,
                resume: response.delivered.clone(),
                audit_commitment,
            };
            let started = Instant::now();
            let (candidate, opened) = if std::mem::take(&mut hedge) {
                self.open_hedged(candidate, job.clone(), &mut queue, &terms, response.started)
                    .await
            } else {
                let opened = self
                    .segments
                    .open(&candidate.entry, job.clone(), terms.clone())
                    .await;
                (candidate, opened)
            };
            let provider = candidate.provider();
            let opened = match opened {
                Ok(opened) => opened,
                Err(err) => {
                    last_error = format!("provider {provider}: {err}");
                    self.record(provider, err.outcome());
                    self.count(|m| m.failovers.inc());
                    self.log_unserved(&response, &candidate, format!("not opened: {err}"));
                    continue;
                }
            };
            let job = JobRequest {
                provider,
                max_price_per_token: candidate.price,
                ..job
            };
            let Some(mut report) = self
                .stream_segment(opened, &job, started, &mut response, queue.front(), events)
                .await
            else {
                return Ok(false); // The client went away: dropping the stream cancels the job.
            };
            self.book(&report, request, key.as_ref(), &mut response)
                .await;
            self.log_segment(&response, &report, candidate.price);
            if let Some(transcript) = report.transcript.take() {
                self.trust.consider(SegmentAudit {
                    transcript,
                    secret: audit_secret,
                    job_id: plan.job_id,
                    price: candidate.price,
                    median_price,
                });
            }
            match report.end {
                // A provider that cancels (preemption) or errs has not finished the job.
                Ok(finish @ (FinishReason::Stop | FinishReason::Length)) => {
                    let tokens = report.tokens;
                    self.record(provider, Outcome::Completed { tokens });
                    if let Ok(mut book) = self.mesh.book.write() {
                        // It served us: its advert keeps its place in a flooded book.
                        book.mark_known_good(provider);
                    }
                    self.done(finish, response, events).await;
                    return Ok(true);
                }
                Ok(finish) => {
                    last_error = format!("provider {provider} stopped the job ({finish:?})");
                    self.record(provider, Outcome::Failed);
                }
                Err(why) => {
                    last_error = format!("provider {provider}: {why}");
                    self.record(provider, why.outcome());
                }
            }
            tracing::warn!(job = %plan.job_id, %provider, error = %last_error, delivered = response.delivered.len(), "provider failed; trying the next");
            self.count(|m| m.failovers.inc());
            if response.delivered.len() >= request.sampling.max_tokens as usize {
                self.done(FinishReason::Length, response, events).await;
                return Ok(true);
            }
        }
        // A provider that accepted is in `providers`: the client has been told.
        Err(if !response.providers.is_empty() {
            ApiError::upstream(last_error)
        } else {
            ApiError::no_provider(last_error)
        })
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

    /// A finished segment in the job log: its times, tokens, price and why it ended.
    fn log_segment(&self, response: &Response, report: &SegmentReport, price: NanoUsd) {
        let since = |t: Instant| t.saturating_duration_since(response.started).as_millis() as u64;
        let ended = match &report.end {
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
    fn log_unserved(&self, response: &Response, candidate: &Candidate, why: String) {
        self.log_nothing(response.job_id, response.started, candidate, why);
    }

    fn log_nothing(&self, job: JobId, since: Instant, candidate: &Candidate, why: String) {
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

    /// Gold's hedged start: the same job on the next provider too; the first to answer
    /// serves, the other is cancelled and stays next in line. Returns the winner.
    async fn open_hedged(
        &self,
        candidate: Candidate,
        job: JobRequest,
        queue: &mut VecDeque<Candidate>,
        terms: &SegmentTerms,
        since: Instant,
    ) -> (Candidate, Result<Opened, SegmentError>) {
        let job_id = job.job_id;
        let Some(partner) = queue.pop_front() else {
            let opened = self
                .segments
                .open(&candidate.entry, job, terms.clone())
                .await;
            return (candidate, opened);
        };
        self.count(|m| m.hedges.inc());
        let partner_job = JobRequest {
            provider: partner.provider(),
            max_price_per_token: partner.price,
            ..job.clone()
        };
        let (mine, theirs) = futures::future::join(
            self.segments.open(&candidate.entry, job, terms.clone()),
            self.segments
                .open(&partner.entry, partner_job, terms.clone()),
        )
        .await;
        let (winner, loser, opened) = match (mine, theirs) {
            (Ok(a), Ok(b)) => {
                let (winner, loser, opened) = match race(a, b).await {
                    (0, opened) => (candidate, partner, Ok(opened)),
                    (_, opened) => (partner, candidate, Ok(opened)),
                };
                self.log_nothing(job_id, since, &loser, "hedge lost".into());
                (winner, loser, opened)
            }
            (Ok(a), Err(_)) => (candidate, partner, Ok(a)),
            (Err(_), Ok(b)) => (partner, candidate, Ok(b)),
            (Err(err), Err(_)) => (candidate, partner, Err(err)),
        };
        tracing::info!(winner = %winner.provider(), other = %loser.provider(), "hedged start");
        queue.push_front(loser);
        (winner, opened)
    }

    /// Relays one segment's events to the client until it ends; `None` when the client
    /// went away.
    async fn stream_segment(
        &self,
        mut stream: Opened,
        job: &JobRequest,
        started: Instant,
        response: &mut Response,
        next: Option<&Candidate>,
        events: &mpsc::Sender<DispatchEvent>,
    ) -> Option<SegmentReport> {
        let provider = job.provider;
        let mut report = SegmentReport {
            provider,
            accept: None,
            tokens: 0,
            last_receipt: None,
            started,
            first_token: None,
            end: Err(SegmentError::StreamBroke(
                "the job ended without an answer".into(),
            )),
            transcript: None,
        };
        while let Some(event) = stream.next().await {
            match event {
                JobEvent::Accepted(accept) => {
                    let first = response.providers.is_empty();
                    response.providers.push(provider);
                    let event = if !first {
                        DispatchEvent::Switched { provider }
                    } else {
                        DispatchEvent::Accepted {
                            job_id: response.job_id,
                            provider,
                            prompt_tokens: accept.prompt_tokens,
                        }
                    };
                    report.accept = Some(accept);
                    events.send(event).await.ok()?;
                }
                JobEvent::Rejected(reject) => {
                    report.end = Err(SegmentError::Refused {
                        reason: reject.reason,
                        detail: reject.detail,
                    });
                    break;
                }
                JobEvent::Token(chunk) => {
                    report.first_token.get_or_insert_with(Instant::now);
                    report.tokens += chunk.token_ids.len() as u64;
                    let token_id = chunk.token_ids.first().copied().unwrap_or_default();
                    response.delivered.extend(&chunk.token_ids);
                    self.maybe_warm_standby(response, job, next);
                    let text = chunk.text_delta;
                    events
                        .send(DispatchEvent::Token { text, token_id })
                        .await
                        .ok()?;
                }
                JobEvent::Receipted(receipt) => report.last_receipt = Some(receipt),
                JobEvent::Finished { finish, .. } => {
                    report.end = Ok(finish);
                    break;
                }
                JobEvent::Failed(why) => {
                    report.end = Err(why);
                    break;
                }
            }
        }
        report.transcript = stream.transcript().cloned();
        Some(report)
    }

    /// Every `warm_standby_every` delivered tokens, warms the next provider in line with
    /// the tokens so far (one warm-up at a time).
    fn maybe_warm_standby(
        &self,
        response: &mut Response,
        job: &JobRequest,
        next: Option<&Candidate>,
    ) {
        let every = self.defaults.warm_standby_every;
        let idle = response.warming.as_ref().is_none_or(|t| t.is_finished());
        let due = every > 0 && response.delivered.len() >= response.warmed_at + every;
        let Some(next) = next.filter(|_| idle && due) else {
            return;
        };
        let warm_up = JobRequest {
            job_id: JobId::from_bytes(rand::rng().random()),
            provider: next.provider(),
            max_price_per_token: next.price,
            sampling: sharemesh_protocol::Sampling {
                max_tokens: response.delivered.len() as u32 + 1,
                ..job.sampling.clone()
            },
            resume: response.delivered.clone(),
            ..job.clone()
        };
        let (segments, entry) = (self.segments.clone(), next.entry.clone());
        response.warming = Some(tokio::spawn(async move {
            segments.warm_standby(entry, warm_up).await
        }));
        response.warmed_at = response.delivered.len();
    }

    /// Books what a segment cost: the amount of its last receipt (a segment the node's
    /// own provider served costs nothing), and a job record in the ledger.
    async fn book(
        &self,
        report: &SegmentReport,
        request: &CompletionRequest,
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
            m.segments
                .get_or_create(&crate::metrics::RouteLabels {
                    provider: report.provider.to_string(),
                })
                .inc();
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

/// A segment shorter than this says too little about a provider's speed.
const SPEED_CHECK_MIN_TOKENS: u64 = 8;

/// The median price among the quoted candidates: what "cheap" is measured against.
fn median_price(candidates: &VecDeque<Candidate>) -> NanoUsd {
    let mut prices: Vec<u64> = candidates.iter().map(|c| c.price.0).collect();
    prices.sort_unstable();
    NanoUsd(prices.get(prices.len() / 2).copied().unwrap_or(0))
}
