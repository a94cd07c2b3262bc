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

use crate::budget::{Budget, Budgets};
use crate::buyer::{JobEvent, SegmentError};
use crate::keys::KeyRecord;
use crate::plan::{self, Plan, RoutingDefaults};
use crate::quote::Candidate;
use crate::route::{RouteError, RouteRequest};
use crate::segment::{race, LocalRoute, Opened, SegmentTerms, Segments};
use crate::verify::audit::AuditPolicy;
use crate::verify::transcript::Transcript;
use crate::verify::trust::Trust;
use crate::vocab::{self, Counted, Vocabularies};

mod counting;
mod drive;
mod job;
mod ranking;
mod record;
mod segments;

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
        /// Its log-probabilities, when the request asked.
        logprobs: Option<sharemesh_protocol::TokenLogprobs>,
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
    Failed(RouteError),
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
    budgets: Arc<Budgets>,
    segments: Arc<Segments>,
    vocabularies: Arc<Vocabularies>,
    /// Requests, routes, failovers and spend (`GET /metrics`).
    metrics: Option<crate::metrics::GatewayMetrics>,
    /// Each recent request's route and price per hop (`GET /v1/jobs`).
    jobs: crate::jobs::JobLog,
    /// Requests waiting for a provider with capacity.
    waiting: Arc<crate::waiting::WaitingRoom>,
    /// Tasks that run as long as this gateway does (settlement rounds, penalties for
    /// signed faults), stopped with it; [`Dispatcher::stopped`] says if one ends.
    background: crate::background::Background,
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
    /// The client went away during the segment: what arrived is still logged and
    /// audited, and the request ends there.
    client_left: bool,
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
        let waiting = defaults.waiting;
        let dispatcher = Arc::new(Self {
            mesh,
            key,
            defaults,
            reliability,
            trust,
            ledger,
            budgets: Arc::new(Budgets::new(budget)),
            segments: Arc::new(segments),
            vocabularies: Arc::default(),
            metrics: mesh_metrics,
            jobs: crate::jobs::JobLog::default(),
            waiting: crate::waiting::WaitingRoom::new(waiting),
            background: Default::default(),
        });
        dispatcher.penalise_signed_faults();
        // A gateway whose mesh stopped routes nothing: it stops with it, as a provider
        // does, rather than answer every request 503 while seeming to serve.
        let mesh = dispatcher.mesh.clone();
        dispatcher
            .background
            .spawn("mesh", async move { mesh.closed().await });
        dispatcher.show_budgets(None);
        dispatcher
    }

    /// A provider that signs an invalid advert (a catalog name on another model's id)
    /// loses standing here, not only that advert.
    fn penalise_signed_faults(self: &Arc<Self>) {
        let mut events = self.mesh.subscribe();
        let this = Arc::downgrade(self);
        self.background.spawn("penalties for signed faults", async move {
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

    /// Settles on chain through `payer` from now on (SPEC §13): providers are offered
    /// this buyer's binding before its first job with them, and every `every` the
    /// gateway signs what each channel's final receipts owe — rounds that stop when the
    /// gateway is dropped.
    pub(crate) fn settle_with(
        &self,
        payer: Arc<sharemesh_settlement::Payer>,
        every: std::time::Duration,
    ) {
        self.segments.set_payer(payer.clone());
        let rounds = crate::settle::run_authorisations(self.mesh.clone(), payer, every);
        self.background.spawn("settlement rounds", rounds);
    }

    /// Waits until one of the gateway's long-running tasks ends (its own, or its
    /// trust's: reports, gossiped proofs), which none does while it serves: the node
    /// stops with why rather than run on without settling or checking.
    pub async fn stopped(&self) -> crate::background::TaskEnded {
        tokio::select! {
            end = self.background.stopped() => end,
            end = self.trust.background.stopped() => end,
        }
    }

    pub fn payer(&self) -> Option<&Arc<sharemesh_settlement::Payer>> {
        self.segments.payer()
    }

    pub fn ledger(&self) -> Option<&Arc<Ledger>> {
        self.ledger.as_ref()
    }

    /// The budgets a request of `key` is held to, with what is spent and left.
    pub fn budgets(
        &self,
        key: Option<&KeyRecord>,
    ) -> Result<Vec<crate::budget::BudgetView>, RouteError> {
        self.budgets
            .view(self.ledger.as_deref(), &self.node_id(), key, now_ms())
    }

    /// Refreshes the budget gauges (the gateway's, and `key`'s) for `GET /metrics`.
    fn show_budgets(&self, key: Option<&KeyRecord>) {
        if let Some(metrics) = &self.metrics {
            match self.budgets(key) {
                Ok(budgets) => metrics.show_budgets(&budgets),
                Err(err) => tracing::warn!(error = %err, "budget gauges not refreshed"),
            }
        }
    }

    /// Verification and its findings (the node sets a replayer where it holds models).
    pub fn trust(&self) -> &Arc<Trust> {
        &self.trust
    }

    pub fn node_id(&self) -> NodeId {
        self.key.node_id()
    }

    /// Has other providers re-run windows of what this node cannot replay itself, paid
    /// from this node's ledger like its own jobs, each window's worst case held against
    /// the budgets before it runs (SPEC §12; on by default in `sharemesh gateway`).
    pub fn outsource_verification(&self, policy: crate::verify::outsource::OutsourcePolicy) {
        let segments = Segments::new(
            self.mesh.clone(),
            self.key.clone(),
            self.ledger.clone(),
            self.defaults.stall_timeout,
        );
        let spending = crate::verify::outsource::WindowSpending {
            budgets: Some(self.budgets.clone()),
            spent: self
                .metrics
                .as_ref()
                .map(|m| m.verification_spent_nano_usd.clone()),
        };
        self.trust.outsource(
            crate::verify::outsource::Outsourcing::new(segments, policy, spending)
                .counting_with(self.vocabularies.clone()),
        );
    }

    pub fn mesh(&self) -> &MeshHandle {
        &self.mesh
    }

    /// Live adverts, less providers dropped for fraud.
    fn live(&self) -> Vec<Arc<BookEntry>> {
        self.trust.live()
    }

    /// A catalog name or model id → the model id, if anyone offers it now.
    pub fn resolve_model(&self, name: &str) -> Result<ModelId, RouteError> {
        plan::resolve_model(&self.live(), name)
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
        request: RouteRequest,
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
                    // The status the API edge answers with, as the label has always read.
                    Err(err) => crate::api::error::ApiError::from(err.clone())
                        .status
                        .as_u16()
                        .to_string(),
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
    async fn plan(&self, request: &RouteRequest) -> Result<Plan, RouteError> {
        // What every provider would refuse is refused here, with the reason, before any
        // provider work (it was retried on every candidate and reported as a 503).
        request
            .prompt
            .validate()
            .and_then(|()| request.sampling.validate())
            .map_err(RouteError::from_validation)?;
        // One read of the book serves both the model's resolution and the ranking.
        let live = self.live();
        let model = plan::resolve_model(&live, &request.model)?;
        let rtt_ms = self.mesh.round_trips_ms();
        let (candidates, tier) = self.rank(live, &model, request, &rtt_ms);
        if candidates.is_empty() {
            return Err(RouteError::NoProvider(format!(
                "no provider can serve `{}` now within the price ceiling, tier, region and VRAM constraints",
                request.model
            )));
        }
        let candidates = self.hold_on_credit(&model, candidates)?;
        let job_id = JobId::from_bytes(rand::rng().random());
        let candidates = self.limit_unproven(candidates);
        let quoting = Instant::now();
        let (candidates, at_capacity) = plan::quote_round(
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
            let declined = format!(
                "every provider asked for a quote for `{}` declined it",
                request.model
            );
            return Err(if at_capacity {
                RouteError::busy(format!("{declined} (at capacity)"))
            } else {
                RouteError::NoProvider(declined)
            });
        }
        candidates.truncate(self.defaults.max_attempts);
        let counted = self
            .count_prompt(
                model,
                request,
                &candidates,
                counting::HeaderWait::UpTo(self.defaults.count_wait),
            )
            .await?;
        let worst_case = plan::worst_case(
            request,
            &candidates,
            counted.as_ref().map(|c| c.prompt_tokens),
        );
        Ok(Plan {
            job_id,
            model,
            tier,
            candidates,
            worst_case,
            counted,
        })
    }
}

/// A segment shorter than this says too little about a provider's speed.
const SPEED_CHECK_MIN_TOKENS: u64 = 8;
