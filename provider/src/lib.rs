//! The provider side of `/sharemesh/infer/2`: checks a signed job request, runs it on
//! the engine, streams each token as a signed chunk, and pauses when the buyer's
//! receipts fall more than the credit window behind.
//!
//! Stream state machine (provider view):
//! `AwaitRequest → (Reject → Closed) | (Accept → Streaming ⇄ Paused → Final → Closed)`.
//! Closing the stream at any point cancels generation within one token.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{AsyncReadExt, StreamExt};
use libp2p::PeerId;
use sharemesh_protocol::commitment::commitment_root;
use sharemesh_protocol::{
    Accept, AvailabilityWindow, JobRequest, Keypair, MessageKind, NanoUsd, NodeId, Reject,
    RejectReason, ReplayGuard, SignedEnvelope, Tier, WireMessage,
};
use tokio::sync::watch;
use tracing::Instrument;

use crate::buyers::{BuyerLimits, BuyerPolicy, BuyerSlot};
use crate::hardware::Hardware;
use sharemesh_engine::{EngineError, EngineEvent, GenerateRequest, Generation, TokenEngine};
use sharemesh_ledger::{JobOutcome, JobRecord, Ledger};
use sharemesh_mesh::clock::{now_ms, SeqCounter};
use sharemesh_mesh::framing::{read_frame, write_frame, FrameError};
use sharemesh_mesh::{MeshHandle, INFER_PROTOCOL};

pub mod adversary;
pub mod advertise;
pub mod buyers;
pub mod hardware;
mod header;
pub mod in_force;
mod local;
pub use local::LocalJob;
pub mod metrics;
pub mod node;
pub use node::{ProviderNode, ProviderNodeBuilder};
mod offer_limits;
pub mod policy;
mod quote;
mod receipts;
pub mod serving;
mod settle;
mod stream;
pub mod unpaid;
use receipts::read_receipts;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the engine runs for a job (the same for mesh jobs and in-process ones).
fn engine_request(job: &JobRequest) -> GenerateRequest {
    GenerateRequest {
        model: job.model,
        prompt: job.prompt.clone(),
        sampling: job.sampling.clone(),
        resume: job.resume.clone(),
        ignore_eos: false,
        interruptible: job.tier == Tier::Interruptible,
        prefix_salt: *job.buyer.as_bytes(),
    }
}
const FINAL_RECEIPT_WAIT: Duration = Duration::from_secs(5);
/// Lifetime of job-bound envelopes.
const JOB_ENVELOPE_LIFETIME_MS: u64 = 3_600_000;

/// What a provider offers and on what terms.
#[derive(Clone, Debug)]
pub struct ProviderPolicy {
    pub price_per_token: NanoUsd,
    pub region: String,
    pub tiers: Vec<Tier>,
    pub windows: Vec<AvailabilityWindow>,
    pub max_concurrent: u32,
    /// Tokens sent beyond the last receipt before pausing.
    pub credit_window_tokens: u32,
    /// A job paused on the credit window (or on a buyer that does not read) longer than
    /// this is cancelled and its slot freed: one buyer cannot hold the engine.
    pub credit_timeout: Duration,
    pub advert_interval: Duration,
    pub advert_lifetime: Duration,
    /// Measured generation speed per model, thousandths of tokens/s.
    pub measured_milli_tps: u32,
    /// Measured aggregate speed with a full batch decoding (thousandths of tokens/s;
    /// 0: the engine does not batch).
    pub batch_milli_tps: u32,
    /// Measured prefill speed, thousandths of tokens/s (0: not measured): what a buyer
    /// may have prefilled unpaid is a minute of it (`unpaid`).
    pub measured_prefill_milli_tps: u32,
    /// Prices that differ from `price_per_token` for a tier.
    pub tier_prices: Vec<(Tier, NanoUsd)>,
    pub thermal: crate::policy::ThermalGuard,
    /// Adversary kit: the attack this provider plays (`None`: honest). Only in a build
    /// with the kit; read it with [`Self::adversary`].
    #[cfg(feature = "adversary")]
    pub adversary: Option<crate::adversary::Adversary>,
    /// Which buyers are served, and per-buyer limits.
    pub buyers: BuyerPolicy,
}

impl ProviderPolicy {
    /// The attack this provider plays: `None` for an honest one, and always in a build
    /// without the adversary kit.
    pub fn adversary(&self) -> Option<&crate::adversary::Adversary> {
        #[cfg(feature = "adversary")]
        return self.adversary.as_ref();
        #[cfg(not(feature = "adversary"))]
        None
    }

    /// Plays `adversary` (only a build with the kit has a mode to give).
    pub fn set_adversary(&mut self, adversary: Option<crate::adversary::Adversary>) {
        #[cfg(feature = "adversary")]
        {
            self.adversary = adversary;
        }
        #[cfg(not(feature = "adversary"))]
        if let Some(mode) = adversary {
            match mode {}
        }
    }

    pub fn price(&self, tier: Tier) -> NanoUsd {
        self.tier_prices
            .iter()
            .find(|(t, _)| *t == tier)
            .map_or(self.price_per_token, |(_, p)| *p)
    }
}

impl Default for ProviderPolicy {
    fn default() -> Self {
        Self {
            price_per_token: NanoUsd(100),
            region: "local".into(),
            tiers: vec![Tier::OnDemand],
            windows: Vec::new(),
            max_concurrent: 4,
            credit_window_tokens: 64,
            credit_timeout: Duration::from_secs(10),
            advert_interval: Duration::from_secs(10),
            advert_lifetime: Duration::from_secs(60),
            measured_milli_tps: 0,
            batch_milli_tps: 0,
            measured_prefill_milli_tps: 0,
            tier_prices: Vec::new(),
            thermal: crate::policy::ThermalGuard::default(),
            #[cfg(feature = "adversary")]
            adversary: None,
            buyers: BuyerPolicy::default(),
        }
    }
}

pub struct Provider {
    key: Keypair,
    engine: Arc<dyn TokenEngine>,
    mesh: MeshHandle,
    policy: ProviderPolicy,
    hardware: Hardware,
    seq: SeqCounter,
    replay: Mutex<ReplayGuard>,
    ledger: Option<Arc<Ledger>>,
    /// Interruptible jobs in progress, each with the signal that preempts it.
    interruptible: Mutex<Vec<(sharemesh_protocol::JobId, Arc<tokio::sync::Notify>)>>,
    buyer_limits: BuyerLimits,
    /// Buyers that have paid this provider a receipt: they get the full credit window.
    paying_buyers: receipts::PayingBuyers,
    /// Jobs buyers walked away from unpaid, and newcomers' jobs in progress.
    unpaid: unpaid::UnpaidWork,
    /// Where jobs, tokens, earnings and load are counted (`GET /metrics`).
    metrics: Option<Arc<metrics::ProviderMetrics>>,
    /// Testnet adversary `alias-key`: the throwaway key its jobs' `Accept` and chunks
    /// are signed with (`None`: its own key, as an honest provider's).
    alias: Option<Keypair>,
    /// On-chain settlement (SPEC §13), when this provider settles on a chain: buyers
    /// must have offered a binding and be covered by their deposit to be served.
    payee: Option<(Arc<sharemesh_settlement::Payee>, Duration)>,
    /// How many settlement offers it takes (each costs a chain read).
    offer_limits: offer_limits::OfferLimits,
}

/// The credit window a buyer that has never paid this provider gets (at most): less
/// unpaid work at risk with a stranger, still twice the buyer's receipt cadence.
pub const NEWCOMER_CREDIT_WINDOW: u32 = 16;

impl Provider {
    /// Signals the oldest interruptible job to stop (it ends with `Cancelled`, and the
    /// buyer's gateway resumes it elsewhere).
    fn preempt_one(&self) {
        if let Ok(mut jobs) = self.interruptible.lock() {
            if !jobs.is_empty() {
                let (job, signal) = jobs.remove(0);
                tracing::info!(%job, "preempting interruptible job for reserved work");
                signal.notify_one();
            }
        }
    }

    /// This provider's identity (what its adverts, accepts and chunks are signed by).
    pub fn node_id(&self) -> NodeId {
        self.key.node_id()
    }

    /// A provider; built and started by [`node::ProviderNodeBuilder::spawn`].
    fn new(
        key: Keypair,
        engine: Arc<dyn TokenEngine>,
        mesh: MeshHandle,
        policy: ProviderPolicy,
        hardware: Hardware,
        ledger: Option<Arc<Ledger>>,
        settlement: Option<(Arc<sharemesh_settlement::Payee>, Duration)>,
    ) -> Arc<Self> {
        let metrics = mesh
            .metrics
            .as_ref()
            .and_then(metrics::ProviderMetrics::register)
            .map(Arc::new);
        let alias = crate::adversary::signs_with_alias(policy.adversary());
        let unpaid = unpaid::UnpaidWork::new(policy.measured_prefill_milli_tps);
        Arc::new(Self {
            key,
            engine,
            metrics,
            mesh,
            buyer_limits: BuyerLimits::new(policy.buyers.clone()),
            policy,
            hardware,
            seq: SeqCounter::default(),
            replay: Mutex::new(ReplayGuard::new(100_000)),
            ledger,
            interruptible: Mutex::new(Vec::new()),
            paying_buyers: receipts::PayingBuyers::default(),
            unpaid,
            alias: alias.then(|| Keypair::from_secret(rand::random::<[u8; 32]>())),
            payee: settlement,
            offer_limits: offer_limits::OfferLimits::default(),
        })
    }

    /// `buyer` (connected as `peer`) as the unpaid-work rules see it: its network
    /// origin, and whether it is new here.
    /// Who asks, for the unpaid-work rules, with what its job could leave unpaid (its
    /// prefill and credit window; none for a quote).
    fn asker(&self, buyer: NodeId, peer: &PeerId, job: Option<&JobRequest>) -> unpaid::Asker {
        unpaid::Asker {
            buyer,
            at_risk: job.map_or_else(unpaid::AtRisk::default, |job| unpaid::AtRisk {
                prefill: job.unpaid_prefill_bound(),
                tokens: u64::from(self.credit_window_for(&buyer)),
            }),
            origin: self
                .mesh
                .remote_address(peer)
                .map_or_else(unpaid::Origin::unknown, |address| {
                    unpaid::Origin::of(&address)
                }),
            newcomer: !self.paying_buyers.contains(&buyer),
        }
    }

    /// The credit window `buyer` gets: the policy's once it has paid here, at most
    /// [`NEWCOMER_CREDIT_WINDOW`] before.
    fn credit_window_for(&self, buyer: &NodeId) -> u32 {
        if self.paying_buyers.contains(buyer) {
            self.policy.credit_window_tokens
        } else {
            self.policy.credit_window_tokens.min(NEWCOMER_CREDIT_WINDOW)
        }
    }

    fn seal<T: WireMessage>(
        &self,
        body: &T,
    ) -> Result<SignedEnvelope, sharemesh_protocol::DecodeError> {
        self.key
            .seal(body, self.seq.next(), now_ms(), JOB_ENVELOPE_LIFETIME_MS)
    }

    /// The key a job's `Accept`, chunks and rejection are signed with: this provider's
    /// own, but for the `alias-key` adversary's throwaway one.
    fn job_key(&self) -> &Keypair {
        self.alias.as_ref().unwrap_or(&self.key)
    }

    /// Seals a job's message with [`Provider::job_key`].
    fn seal_job<T: WireMessage>(
        &self,
        body: &T,
    ) -> Result<SignedEnvelope, sharemesh_protocol::DecodeError> {
        self.job_key()
            .seal(body, self.seq.next(), now_ms(), JOB_ENVELOPE_LIFETIME_MS)
    }

    /// Accepts `/sharemesh/infer/2` streams until the mesh stops.
    pub async fn serve(self: Arc<Self>) -> anyhow::Result<()> {
        self.accept_streams(INFER_PROTOCOL, "job", |provider, peer, stream| async move {
            provider.handle(peer, stream).await
        })
        .await
    }

    /// Accepts every inbound stream of `protocol` and runs `handle` on it in its own
    /// task; `what` names the stream in logs.
    pub(crate) async fn accept_streams<F, Fut, E>(
        self: Arc<Self>,
        protocol: libp2p::StreamProtocol,
        what: &'static str,
        handle: F,
    ) -> anyhow::Result<()>
    where
        F: Fn(Arc<Self>, PeerId, libp2p::Stream) -> Fut,
        Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let mut control = self.mesh.control.clone();
        let mut incoming = control
            .accept(protocol)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        loop {
            // The incoming streams outlive the mesh (every handle holds their sender):
            // its end is told apart, and ends this task (reported as `Closed`).
            let (peer, stream) = tokio::select! {
                next = incoming.next() => match next {
                    Some(next) => next,
                    None => break,
                },
                () = self.mesh.closed() => break,
            };
            let task = handle(self.clone(), peer, stream);
            tokio::spawn(async move {
                if let Err(err) = task.await {
                    tracing::debug!(%peer, %err, "{what} stream ended with an error");
                }
            });
        }
        Ok(())
    }

    /// The terms a job and a quote must both meet: model served, tier offered, not paused
    /// by the thermal guard, price within the ceiling, inside an availability window.
    fn terms(
        &self,
        model: &sharemesh_protocol::ModelId,
        tier: Tier,
        ceiling: NanoUsd,
        now: u64,
    ) -> Result<(), (RejectReason, String)> {
        if !self.engine.models().iter().any(|m| m.id == *model) {
            return Err((
                RejectReason::UnknownModel,
                format!("model {model} is not served here"),
            ));
        }
        if !self.policy.tiers.contains(&tier) {
            return Err((
                RejectReason::TierNotOffered,
                format!("tier {} is not offered", tier.name()),
            ));
        }
        if let Some(reason) = self.policy.thermal.over_limit() {
            return Err((RejectReason::Paused, reason));
        }
        let price = self.policy.price(tier);
        if ceiling < price {
            return Err((
                RejectReason::PriceBelowFloor,
                format!(
                    "price {} nano-USD/token is above the ceiling {}",
                    price.0, ceiling.0
                ),
            ));
        }
        if !self.policy.windows.is_empty() && !self.policy.windows.iter().any(|w| w.contains(now)) {
            return Err((
                RejectReason::OutsideWindow,
                "outside the provider's availability windows".into(),
            ));
        }
        Ok(())
    }

    fn check(
        &self,
        peer: PeerId,
        envelope: &SignedEnvelope,
    ) -> Result<(JobRequest, Admitted), (RejectReason, String)> {
        let now = now_ms();
        let opened = envelope
            .open::<JobRequest>(now)
            .map_err(|e| (RejectReason::BadRequest, e.to_string()))?;
        let request = opened.body.clone();
        if opened.signer.peer_id().ok() != Some(peer) {
            return Err((
                RejectReason::BadRequest,
                "request signed by another identity than the connection's".into(),
            ));
        }
        if request.provider != self.key.node_id() {
            return Err((
                RejectReason::BadRequest,
                "request addressed to another provider".into(),
            ));
        }
        if let Ok(mut replay) = self.replay.lock() {
            replay
                .admit(
                    &opened,
                    MessageKind::JobRequest,
                    *request.job_id.as_bytes(),
                    now,
                )
                .map_err(|e| (RejectReason::BadRequest, format!("replayed request: {e}")))?;
        }
        // The buyer's own limits first: a buyer over its share does not get to
        // preempt anyone's interruptible work. Its slot is taken only once the job is
        // admitted, so refused attempts do not count against its jobs per minute.
        self.buyer_limits.check(&request.buyer, now)?;
        let asker = self.asker(request.buyer, &peer, Some(&request));
        self.unpaid.check(&asker, now)?;
        self.admit(&request, now)?;
        let credit = self.credit_for(&request)?;
        let buyer_slot = self.buyer_limits.admit(request.buyer, now)?;
        let newcomer_slot = self.unpaid.admit(&asker, now)?;
        Ok((
            request,
            Admitted {
                asker,
                _buyer_slot: buyer_slot,
                _newcomer_slot: newcomer_slot,
                _credit: credit,
            },
        ))
    }

    /// The admission check every job passes, from the mesh or from this process's own
    /// gateway: deadline, terms (model, tier, thermal guard, price, window) and a free
    /// slot (gold preempts bronze instead of waiting).
    fn admit(&self, request: &JobRequest, now: u64) -> Result<(), (RejectReason, String)> {
        if request.deadline_ms != 0 && request.deadline_ms < now {
            return Err((
                RejectReason::DeadlinePassed,
                "the deadline has passed".into(),
            ));
        }
        self.terms(
            &request.model,
            request.tier,
            request.max_price_per_token,
            now,
        )?;
        if crate::adversary::claims_full(self.policy.adversary()) {
            return Err((RejectReason::OverCapacity, "all slots are busy".into()));
        }
        let busy = self.engine.active_jobs() + self.engine.queue_depth();
        if request.tier == Tier::Reserved && busy > 0 {
            // Gold work never waits behind bronze: preempt an interruptible job.
            self.preempt_one();
        } else if busy >= self.policy.max_concurrent as usize {
            return Err((RejectReason::OverCapacity, "all slots are busy".into()));
        }
        Ok(())
    }

    /// Submits an admitted job to the engine and waits for its start (the prompt's size
    /// in tokens); an engine refusal becomes the reason to reject the job.
    async fn start(
        &self,
        request: &JobRequest,
    ) -> Result<(u32, tokio::sync::mpsc::Receiver<EngineEvent>), (RejectReason, String)> {
        let mut events = self.engine.submit(engine_request(request)).map_err(|err| {
            let reason = if matches!(err, EngineError::Busy(_) | EngineError::OverCapacity(_)) {
                RejectReason::OverCapacity
            } else {
                RejectReason::Internal
            };
            (reason, err.to_string())
        })?;
        match events.recv().await {
            Some(EngineEvent::Started { prompt_tokens }) => Ok((prompt_tokens, events)),
            Some(EngineEvent::Failed(err)) => {
                let reason = match err {
                    EngineError::ContextTooLong { .. } => RejectReason::ContextTooLong,
                    EngineError::OverCapacity(_) => RejectReason::OverCapacity,
                    EngineError::BadRequest(_) | EngineError::Tokenizer(_) => {
                        RejectReason::BadRequest
                    }
                    _ => RejectReason::Internal,
                };
                Err((reason, err.to_string()))
            }
            _ => Err((RejectReason::Internal, "engine stopped".into())),
        }
    }

    async fn reject(
        &self,
        writer: &mut (impl futures::AsyncWrite + Unpin),
        job: &JobRequest,
        reason: RejectReason,
        detail: String,
    ) -> Result<(), FrameError> {
        let reject = Reject {
            job_id: job.job_id,
            provider: self.job_key().node_id(),
            reason,
            detail,
        };
        write_frame(writer, &self.seal_job(&reject)?).await
    }

    /// Books a finished job's statistics (its money is the buyer's receipts, booked as
    /// they arrive).
    async fn book_job(&self, request: &JobRequest, prompt_tokens: u32, generation: &Generation) {
        let Some(ledger) = &self.ledger else { return };
        let model = self.engine.models().iter().find(|m| m.id == request.model);
        let record = JobRecord {
            job_id: request.job_id,
            provider: self.key.node_id(),
            buyer: request.buyer,
            model: model.map_or_else(|| request.model.to_string(), |m| m.name.clone()),
            prompt_tokens: u64::from(prompt_tokens),
            completion_tokens: u64::from(generation.generated_tokens),
            price_per_token: self.policy.price(request.tier),
            started_ms: now_ms(),
            ttft_ms: None,
            tokens_per_second: Some(generation.generation_tokens_per_second()),
            outcome: JobOutcome::from(generation.finish),
            api_key: None,
        };
        // sled flushes to disk: off the async runtime's threads.
        let ledger = ledger.clone();
        let booked = tokio::task::spawn_blocking(move || ledger.record_job(&record)).await;
        if let Ok(Err(err)) = booked {
            tracing::warn!(%err, "could not book the job");
        }
    }

    async fn handle(
        self: Arc<Self>,
        peer: PeerId,
        stream: libp2p::Stream,
    ) -> Result<(), FrameError> {
        let (mut reader, mut writer) = stream.split();
        let envelope = read_frame(&mut reader, REQUEST_TIMEOUT).await?;
        let (request, admitted) = match self.check(peer, &envelope) {
            Ok(admitted) => admitted,
            Err((reason, detail)) => {
                tracing::info!(%peer, ?reason, %detail, "rejected job");
                // Without a decodable request there is no job id to answer with.
                if let Ok(opened) = envelope.open_archived::<JobRequest>() {
                    self.reject(&mut writer, &opened.body, reason, detail)
                        .await?;
                }
                return Ok(());
            }
        };
        let span = tracing::info_span!("job", job = %request.job_id, %peer);
        self.serve_job(request, &admitted.asker, writer, reader)
            .instrument(span)
            .await
    }

    /// Runs an admitted job: start, accept, stream under the credit window, finish.
    async fn serve_job(
        &self,
        request: JobRequest,
        asker: &unpaid::Asker,
        mut writer: futures::io::WriteHalf<libp2p::Stream>,
        reader: futures::io::ReadHalf<libp2p::Stream>,
    ) -> Result<(), FrameError> {
        let (prompt_tokens, events) = match self.start(&request).await {
            Ok(started) => started,
            Err((reason, detail)) => {
                return self.reject(&mut writer, &request, reason, detail).await;
            }
        };
        let accept = Accept {
            job_id: request.job_id,
            provider: self.job_key().node_id(),
            price_per_token: self.policy.price(request.tier),
            prompt_tokens: crate::adversary::claimed_prompt_tokens(
                self.policy.adversary(),
                prompt_tokens,
            ),
            credit_window_tokens: self.credit_window_for(&request.buyer),
            profile: self
                .engine
                .profile(&request.model)
                .map_or_else(Default::default, |p| {
                    crate::adversary::claimed_profile(self.policy.adversary(), p)
                }),
        };
        write_frame(&mut writer, &self.seal_job(&accept)?).await?;
        let root = commitment_root(
            &request.job_id,
            &accept.provider,
            &sharemesh_protocol::envelope::body_digest(&request)?,
            &accept.profile,
        );

        // Receipts arrive concurrently; `acked` holds the completion tokens they cover.
        let (acked_tx, mut acked) = watch::channel(0u64);
        let heads = stream::SentHeads::default();
        let mut receipts = tokio::spawn(read_receipts(
            reader,
            request.clone(),
            receipts::Terms {
                provider: self.job_key().node_id(),
                price: self.policy.price(request.tier),
                prompt_tokens: request.billed_prompt_tokens(prompt_tokens),
                heads: heads.clone(),
                paying: self.paying_buyers.clone(),
                metrics: self.metrics.clone(),
            },
            acked_tx,
            self.ledger.clone(),
        ));
        let preempt = Arc::new(tokio::sync::Notify::new());
        if request.tier == Tier::Interruptible {
            if let Ok(mut jobs) = self.interruptible.lock() {
                jobs.push((request.job_id, preempt.clone()));
            }
        }
        let mut job = stream::JobStream {
            request: &request,
            prompt_tokens,
            writer,
            acked: acked.clone(),
            sent: 0,
            head: root,
            heads,
            window: u64::from(accept.credit_window_tokens),
            accepted_at: std::time::Instant::now(),
            last_token: None,
            prefilled: None,
        };
        let result = self.stream_job(&mut job, events, &preempt).await;
        if let Some(metrics) = &self.metrics {
            metrics.job_ended(match result {
                Ok(stream::Streamed::Ended) => "ended",
                Ok(stream::Streamed::BuyerLeft) => "buyer_left",
                Ok(stream::Streamed::Unpaid) => "unpaid",
                Ok(stream::Streamed::Stalled) => "stalled",
                Err(_) => "write_failed",
            });
        }
        let sent = job.sent;
        // The engine says what it prefilled when the job finishes; one cancelled first
        // (the buyer left after `Accept`) counts as having prefilled all of it.
        let prefilled = job.prefilled.map_or_else(
            || u64::from(prompt_tokens).saturating_add(request.resume.len() as u64),
            u64::from,
        );
        if let Ok(mut jobs) = self.interruptible.lock() {
            jobs.retain(|(job, _)| *job != request.job_id);
        }
        // Give the buyer a moment to send its final receipt (or, having left, the
        // receipt for what it received), then close.
        match result {
            Ok(stream::Streamed::Ended) => {
                let paid = acked.wait_for(|&a| a >= sent);
                let _ = tokio::time::timeout(FINAL_RECEIPT_WAIT, paid).await;
            }
            Ok(stream::Streamed::BuyerLeft) | Err(_) => {
                let _ = tokio::time::timeout(FINAL_RECEIPT_WAIT, &mut receipts).await;
            }
            Ok(_) => {}
        }
        receipts.abort();
        let paid = (*acked.borrow()).min(sent);
        if paid < sent {
            tracing::info!(buyer = %asker.buyer, origin = %asker.origin, sent, paid, "job ended with tokens unpaid");
        }
        let tally = unpaid::Tally {
            sent,
            paid,
            prefilled,
            billed_prompt: request.billed_prompt_tokens(prompt_tokens),
        };
        self.unpaid.ended(asker, tally, now_ms());
        result.map(|_| ())
    }
}

/// What an admitted job holds until it ends: who asked, and its buyer's slots.
struct Admitted {
    asker: unpaid::Asker,
    _buyer_slot: BuyerSlot,
    _newcomer_slot: Option<unpaid::NewcomerSlot>,
    /// What the job may cost, held against the buyer's deposit while it runs.
    _credit: Option<sharemesh_settlement::payee::CreditHold>,
}
