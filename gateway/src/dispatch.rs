//! Routing a request to providers: filter the order book to eligible providers, rank
//! them, run the job, and on a provider failure continue the same response on the
//! next provider with `resume` (the engine's exact resume keeps the text identical).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use libp2p::PeerId;
use rand::Rng;
use sharemesh_market::{OfferView, ScoreWeights};
use sharemesh_protocol::{
    FinishReason, JobId, JobRequest, Keypair, ModelId, NanoUsd, NodeId, QuoteRequest, Tier,
};
use sharemesh_reputation::{Outcome, ReputationBook, ScoreParams};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::openai::CompletionRequest;
use super::quote::{self, Candidate, QuoteAnswer};
use super::segment::race;
use crate::buyer::{JobEvent, SegmentError};
use crate::keys::KeyRecord;
use sharemesh_ledger::{JobRecord, Ledger};
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::orderbook::BookEntry;
use sharemesh_mesh::MeshHandle;

/// Gateway-wide defaults for routing options a request leaves out.
#[derive(Clone, Debug)]
pub struct RoutingDefaults {
    pub max_price_per_token: NanoUsd,
    pub tier: Tier,
    pub region: Option<String>,
    /// Providers tried (first plus failovers) before giving up.
    pub max_attempts: usize,
    /// A provider silent this long mid-job is replaced.
    pub stall_timeout: std::time::Duration,
    /// Weights of the ranking score (SPEC §10).
    pub score: ScoreWeights,
    /// Candidates asked for a quote before the choice (0: rank by adverts alone).
    pub quote_k: usize,
    /// Start gold work on two providers and keep the first to answer, unless the
    /// request says otherwise (`sharemesh.hedge`).
    pub hedge_gold: bool,
    /// Every this many delivered tokens, warm the next provider in line so a failover
    /// there prefills only what came since (0: never). See `warm_standby`.
    pub warm_standby_every: usize,
}

/// Round trip assumed for a provider the gateway has not pinged yet.
const UNKNOWN_RTT_MS: f64 = 200.0;

impl Default for RoutingDefaults {
    fn default() -> Self {
        Self {
            max_price_per_token: NanoUsd(1_000_000),
            tier: Tier::OnDemand,
            region: None,
            max_attempts: 4,
            stall_timeout: crate::buyer::DEFAULT_STALL_TIMEOUT,
            score: ScoreWeights::default(),
            quote_k: 4,
            hedge_gold: false,
            warm_standby_every: 64,
        }
    }
}

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
    pub completion_tokens: u64,
    pub amount_nano_usd: u64,
}

/// Spend limits of the gateway, in nano-USD.
#[derive(Clone, Debug, Default)]
pub struct Budget {
    pub daily: Option<NanoUsd>,
    pub monthly: Option<NanoUsd>,
}

pub struct Dispatcher {
    mesh: MeshHandle,
    key: Arc<Keypair>,
    defaults: RoutingDefaults,
    reliability: Mutex<ReputationBook<NodeId>>,
    ledger: Option<Arc<Ledger>>,
    budget: Budget,
    /// Worst-case cost of requests in flight, held against the budgets.
    reserved: Mutex<Reserved>,
    /// This process's own provider, served directly (a node cannot dial itself).
    local: std::sync::OnceLock<Arc<dyn LocalRoute>>,
}

/// This process's own provider, as the gateway sees it: a job runs there without a
/// stream (a node cannot dial itself) and yields the same events a remote provider's
/// stream does. The node wires its provider in (`set_local_route`); the gateway itself
/// does not link the engine.
pub trait LocalRoute: Send + Sync + 'static {
    /// Runs `job` (addressed to this node); its events arrive on the returned channel,
    /// and dropping it cancels the job.
    fn run(&self, job: JobRequest) -> mpsc::Receiver<JobEvent>;
}

#[derive(Default)]
struct Reserved {
    total: u64,
    per_key: std::collections::HashMap<String, u64>,
}

/// Releases a request's reservation however it ends.
struct Reservation<'a> {
    reserved: &'a Mutex<Reserved>,
    amount: u64,
    key: Option<String>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Ok(mut reserved) = self.reserved.lock() {
            reserved.total = reserved.total.saturating_sub(self.amount);
            if let Some(key) = &self.key {
                if let Some(held) = reserved.per_key.get_mut(key) {
                    *held = held.saturating_sub(self.amount);
                }
            }
        }
    }
}

impl Dispatcher {
    pub fn new(
        mesh: MeshHandle,
        key: Keypair,
        defaults: RoutingDefaults,
        ledger: Option<Arc<Ledger>>,
        budget: Budget,
    ) -> Arc<Self> {
        Arc::new(Self {
            mesh,
            key: Arc::new(key),
            defaults,
            reliability: Mutex::new(ReputationBook::new(ScoreParams::default(), 10_000)),
            ledger,
            budget,
            reserved: Mutex::new(Reserved::default()),
            local: std::sync::OnceLock::new(),
        })
    }

    /// Routes jobs for this node's own provider to it directly.
    pub fn set_local_route(&self, route: Arc<dyn LocalRoute>) {
        let _ = self.local.set(route);
    }

    pub fn ledger(&self) -> Option<&Arc<Ledger>> {
        self.ledger.as_ref()
    }

    pub fn node_id(&self) -> NodeId {
        self.key.node_id()
    }

    /// Refuses the request (402) if its worst-case cost does not fit what is left of the
    /// daily and monthly budgets, counting requests in flight; else reserves it.
    fn reserve(
        &self,
        worst_case: u64,
        key: Option<&KeyRecord>,
    ) -> Result<Reservation<'_>, ApiError> {
        let now = now_ms();
        let mut reserved = self
            .reserved
            .lock()
            .map_err(|_| ApiError::upstream("budget lock poisoned"))?;
        let day = sharemesh_ledger::parse_day(&sharemesh_ledger::day(now)).unwrap_or(0);
        let month =
            sharemesh_ledger::parse_day(&format!("{}-01", &sharemesh_ledger::day(now)[..7]))
                .unwrap_or(0);
        let ledger_error = |e: sharemesh_ledger::LedgerError| ApiError::upstream(e.to_string());
        // (limit, spent, name, held by requests in flight)
        let mut limits: Vec<(u64, u64, String, u64)> = Vec::new();
        for (limit, since, name) in [
            (self.budget.daily, day, "daily"),
            (self.budget.monthly, month, "monthly"),
        ] {
            let Some(limit) = limit else { continue };
            let spent = match &self.ledger {
                Some(ledger) => ledger
                    .spent_since(&self.key.node_id(), since)
                    .map_err(ledger_error)?,
                None => 0,
            };
            limits.push((limit.0, spent, format!("gateway's {name}"), reserved.total));
        }
        if let Some(key) = key {
            for (limit, since, name) in [
                (key.daily_budget_nano_usd, day, "daily"),
                (key.monthly_budget_nano_usd, month, "monthly"),
            ] {
                let Some(limit) = limit else { continue };
                let spent = match &self.ledger {
                    Some(ledger) => ledger.spent_by_key(&key.id, since).map_err(ledger_error)?,
                    None => 0,
                };
                let in_flight = reserved.per_key.get(&key.id).copied().unwrap_or(0);
                limits.push((
                    limit,
                    spent,
                    format!("API key {}'s {name}", key.name),
                    in_flight,
                ));
            }
        }
        for (limit, spent, name, in_flight) in limits {
            let left = limit.saturating_sub(spent).saturating_sub(in_flight);
            if worst_case > left {
                return Err(ApiError::insufficient_balance(format!(
                    "the worst-case cost of this request is {worst_case} nano-USD but only {left} of the {name} budget of {limit} nano-USD is left"
                )));
            }
        }
        reserved.total += worst_case;
        if let Some(key) = key {
            *reserved.per_key.entry(key.id.clone()).or_default() += worst_case;
        }
        Ok(Reservation {
            reserved: &self.reserved,
            amount: worst_case,
            key: key.map(|k| k.id.clone()),
        })
    }

    pub fn mesh(&self) -> &MeshHandle {
        &self.mesh
    }

    fn live(&self) -> Vec<BookEntry> {
        self.mesh
            .book
            .read()
            .map(|b| b.live(now_ms()))
            .unwrap_or_default()
    }

    /// A catalog name or model id → the model id, if anyone offers it now.
    pub fn resolve_model(&self, name: &str) -> Result<ModelId, ApiError> {
        self.live()
            .iter()
            .flat_map(|e| e.advert.models.iter())
            .find(|o| o.model.name == name || o.model.id.to_string() == name)
            .map(|o| o.model.id)
            .ok_or_else(|| ApiError::model_not_found(name))
    }

    /// Eligible providers for `model`, best first by `sharemesh_market::rank`: expected
    /// cost of the request from price, latency (measured round trip, plus the advertised
    /// queue at the advertised speed), throughput and observed success rate.
    pub fn candidates(
        &self,
        model: &ModelId,
        request: &CompletionRequest,
        rtt_ms: &HashMap<PeerId, f64>,
    ) -> (Vec<Candidate>, Tier) {
        let now = now_ms();
        let routing = &request.routing;
        let tier = if routing.interruptible {
            Tier::Interruptible
        } else {
            routing.tier.unwrap_or(self.defaults.tier)
        };
        let ceiling = routing
            .max_price_per_token
            .unwrap_or(self.defaults.max_price_per_token);
        let region = routing
            .region
            .clone()
            .or_else(|| self.defaults.region.clone());
        let reliability = self.reliability.lock().ok();
        let tokens = request.sampling.max_tokens;
        let eligible: Vec<Candidate> = self
            .live()
            .into_iter()
            .filter_map(|entry| {
                let advert = &entry.advert;
                let offer = advert.offer(model)?;
                let price = offer.price_for(tier)?;
                let load = advert.load;
                let ok = price <= ceiling
                    && advert.tiers.contains(&tier)
                    && region.as_ref().is_none_or(|r| &advert.region == r)
                    && routing
                        .min_vram_bytes
                        .is_none_or(|min| advert.hardware.vram_total_bytes() >= min)
                    && advert.available_at(now)
                    && (load.max_concurrent == 0
                        || load.active_jobs + load.queue_depth < load.max_concurrent);
                if !ok {
                    return None;
                }
                let speed = f64::from(offer.generation_milli_tokens_per_second) / 1000.0;
                let rtt = advert
                    .provider
                    .peer_id()
                    .ok()
                    .and_then(|peer| rtt_ms.get(&peer).copied())
                    .unwrap_or(UNKNOWN_RTT_MS);
                // A job ahead in the queue takes about as long as this one will.
                let queue_ms = if speed > 0.0 {
                    f64::from(load.queue_depth) * f64::from(tokens) / speed * 1000.0
                } else {
                    0.0
                };
                let view = OfferView {
                    price_per_token: price.0,
                    latency_ms: rtt + queue_ms,
                    tokens_per_second: speed,
                    reliability: reliability
                        .as_ref()
                        .map_or(0.5, |r| r.success_rate(&advert.provider, now)),
                };
                Some(Candidate {
                    entry: entry.clone(),
                    price,
                    rtt_ms: rtt,
                    view,
                })
            })
            .collect();
        let views: Vec<OfferView> = eligible.iter().map(|c| c.view).collect();
        let order = sharemesh_market::rank(&views, tokens, &self.defaults.score);
        let mut slots: Vec<Option<Candidate>> = eligible.into_iter().map(Some).collect();
        (
            order.into_iter().filter_map(|i| slots[i].take()).collect(),
            tier,
        )
    }

    /// This gateway's reputation score of `provider` now (0.5 for one it never used).
    pub fn reputation(&self, provider: &NodeId) -> f64 {
        self.reliability
            .lock()
            .map_or(0.5, |book| book.score(provider, now_ms()))
    }

    fn record(&self, provider: NodeId, outcome: Outcome) {
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
            if let Err(err) = this.drive(request, key, &events).await {
                let _ = events.send(DispatchEvent::Failed(err)).await;
            }
        });
        receiver
    }

    async fn drive(
        self: &Arc<Self>,
        request: CompletionRequest,
        key: Option<KeyRecord>,
        events: &mpsc::Sender<DispatchEvent>,
    ) -> Result<(), ApiError> {
        let model = self.resolve_model(&request.model)?;
        let rtt_ms: HashMap<PeerId, f64> = self.mesh.round_trips_ms();
        let (candidates, tier) = self.candidates(&model, &request, &rtt_ms);
        if candidates.is_empty() {
            return Err(ApiError::no_provider(format!(
                "no provider can serve `{}` now within the price ceiling, tier, region and VRAM constraints",
                request.model
            )));
        }
        let job_id = JobId::from_bytes(rand::rng().random());
        let candidates = self
            .quote_round(candidates, job_id, model, tier, &request)
            .await;
        if candidates.is_empty() {
            return Err(ApiError::no_provider(format!(
                "every provider asked for a quote for `{}` declined it",
                request.model
            )));
        }
        // Worst case: every prompt byte a token, every completion token produced, at the
        // highest price among the candidates we may fail over to.
        let prompt_bytes = match &request.prompt {
            sharemesh_protocol::Prompt::Text(t) => t.len() as u64,
            sharemesh_protocol::Prompt::Chat(m) => {
                m.iter().map(|m| m.content.len() as u64 + 16).sum::<u64>() + 64
            }
            sharemesh_protocol::Prompt::Tokens(t) => t.len() as u64,
        };
        let highest = candidates
            .iter()
            .take(self.defaults.max_attempts)
            .map(|c| c.price.0)
            .max()
            .unwrap_or(0);
        let worst_case =
            highest.saturating_mul(prompt_bytes + u64::from(request.sampling.max_tokens));
        let _reservation = self.reserve(worst_case, key.as_ref())?;
        let mut delivered: Vec<u32> = Vec::new();
        let mut providers: Vec<NodeId> = Vec::new();
        let mut cost = NanoUsd::ZERO;
        let mut segments: Vec<Segment> = Vec::new();
        let mut last_error = String::from("no provider answered");
        let mut accepted = false;
        let mut queue: VecDeque<Candidate> = candidates
            .into_iter()
            .take(self.defaults.max_attempts)
            .collect();
        let mut warm_task: Option<tokio::task::JoinHandle<()>> = None;
        let mut warmed_at = 0;
        let mut hedge = tier == Tier::Reserved
            && request.routing.hedge.unwrap_or(self.defaults.hedge_gold)
            && queue.len() >= 2;
        while let Some(Candidate {
            mut entry,
            mut price,
            ..
        }) = queue.pop_front()
        {
            let mut provider = entry.advert.provider;
            let job = JobRequest {
                job_id,
                buyer: self.key.node_id(),
                provider,
                model,
                prompt: request.prompt.clone(),
                sampling: request.sampling.clone(),
                max_price_per_token: price,
                tier,
                deadline_ms: now_ms() + 600_000,
                resume: delivered.clone(),
            };
            let job_template = job.clone();
            let segment_started = std::time::Instant::now();
            let mut first_token: Option<std::time::Instant> = None;
            let opened = if std::mem::take(&mut hedge) {
                // Gold's hedged start: the same job on the next provider too; the first
                // to answer serves, the other is cancelled and stays next in line.
                let partner = queue.pop_front();
                match partner {
                    None => self.open_segment(&entry, job).await,
                    Some(partner) => {
                        let partner_job = JobRequest {
                            provider: partner.provider(),
                            max_price_per_token: partner.price,
                            ..job.clone()
                        };
                        let (mine, theirs) = futures::future::join(
                            self.open_segment(&entry, job),
                            self.open_segment(&partner.entry, partner_job),
                        )
                        .await;
                        let winner = match (mine, theirs) {
                            (Ok(a), Ok(b)) => Ok(race(a, b).await),
                            (Ok(a), Err(_)) => Ok((0, a)),
                            (Err(_), Ok(b)) => Ok((1, b)),
                            (Err(err), Err(_)) => Err(err),
                        };
                        let loser = match winner {
                            Ok((1, _)) => {
                                let loser = Candidate {
                                    entry: std::mem::replace(&mut entry, partner.entry.clone()),
                                    price: std::mem::replace(&mut price, partner.price),
                                    ..partner
                                };
                                provider = entry.advert.provider;
                                loser
                            }
                            _ => partner,
                        };
                        tracing::info!(job = %job_id, winner = %provider, other = %loser.provider(), "hedged start");
                        queue.push_front(loser);
                        winner.map(|(_, opened)| opened)
                    }
                }
            } else {
                self.open_segment(&entry, job).await
            };
            let mut stream = match opened {
                Ok(stream) => stream,
                Err(err) => {
                    last_error = format!("provider {provider}: {err}");
                    self.record(provider, err.outcome());
                    continue;
                }
            };
            let mut segment_tokens = 0u64;
            let mut segment_prompt = 0u64;
            // What the provider accepted at (its own engine, in-process, charges nothing).
            let mut segment_price = price;
            let outcome = loop {
                let Some(event) = stream.next().await else {
                    break Err(SegmentError::StreamBroke(
                        "the job ended without an answer".into(),
                    ));
                };
                match event {
                    JobEvent::Accepted(accept) => {
                        segment_prompt = u64::from(accept.prompt_tokens);
                        segment_price = accept.price_per_token;
                        providers.push(provider);
                        let event = if accepted {
                            DispatchEvent::Switched { provider }
                        } else {
                            accepted = true;
                            DispatchEvent::Accepted {
                                job_id,
                                provider,
                                prompt_tokens: accept.prompt_tokens,
                            }
                        };
                        if events.send(event).await.is_err() {
                            return Ok(()); // Client gone: dropping `stream` cancels the job.
                        }
                    }
                    JobEvent::Rejected(reject) => {
                        break Err(SegmentError::Refused {
                            reason: reject.reason,
                            detail: reject.detail,
                        })
                    }
                    JobEvent::Token(chunk) => {
                        first_token.get_or_insert_with(std::time::Instant::now);
                        segment_tokens += chunk.token_ids.len() as u64;
                        let token_id = chunk.token_ids.first().copied().unwrap_or_default();
                        delivered.extend(&chunk.token_ids);
                        let every = self.defaults.warm_standby_every;
                        let idle = warm_task.as_ref().is_none_or(|t| t.is_finished());
                        if every > 0 && idle && delivered.len() >= warmed_at + every {
                            if let Some(next) = queue.front() {
                                let warm_up = JobRequest {
                                    job_id: JobId::from_bytes(rand::rng().random()),
                                    provider: next.provider(),
                                    max_price_per_token: next.price,
                                    sampling: sharemesh_protocol::Sampling {
                                        max_tokens: delivered.len() as u32 + 1,
                                        ..request.sampling.clone()
                                    },
                                    resume: delivered.clone(),
                                    ..job_template.clone()
                                };
                                let (this, entry) = (self.clone(), next.entry.clone());
                                warm_task = Some(tokio::spawn(async move {
                                    this.warm_standby(entry, warm_up).await
                                }));
                                warmed_at = delivered.len();
                            }
                        }
                        if events
                            .send(DispatchEvent::Token {
                                text: chunk.text_delta,
                                token_id,
                            })
                            .await
                            .is_err()
                        {
                            return Ok(());
                        }
                    }
                    JobEvent::Finished { finish, .. } => break Ok(finish),
                    JobEvent::Failed(why) => break Err(why),
                }
            };
            if segment_prompt > 0 {
                let amount = segment_price
                    .times(segment_prompt + segment_tokens)
                    .unwrap_or(NanoUsd::ZERO);
                cost = cost.checked_add(amount).unwrap_or(cost);
                segments.push(Segment {
                    provider: provider.to_string(),
                    prompt_tokens: segment_prompt,
                    completion_tokens: segment_tokens,
                    amount_nano_usd: amount.0,
                });
                if let Some(ledger) = &self.ledger {
                    let ttft = first_token.map(|t| (t - segment_started).as_secs_f64() * 1000.0);
                    let tps = first_token
                        .filter(|_| segment_tokens > 1)
                        .map(|t| (segment_tokens - 1) as f64 / t.elapsed().as_secs_f64().max(1e-9));
                    let record = JobRecord {
                        job_id: job_id.to_string(),
                        provider: provider.to_string(),
                        buyer: self.key.node_id().to_string(),
                        model: request.model.clone(),
                        prompt_tokens: segment_prompt,
                        completion_tokens: segment_tokens,
                        price_per_token: segment_price.0,
                        started_ms: now_ms(),
                        ttft_ms: ttft,
                        tokens_per_second: tps,
                        api_key: key.as_ref().map(|k| k.id.clone()),
                        outcome: match &outcome {
                            Ok(finish) => format!("{finish:?}").to_lowercase(),
                            Err(_) => "failed".to_owned(),
                        },
                    };
                    if let Err(err) = ledger.record_job(&record) {
                        tracing::warn!(%err, "could not book the job");
                    }
                }
            }
            match outcome {
                // A provider that cancels (preemption) or errs has not finished the job.
                Ok(finish) if matches!(finish, FinishReason::Stop | FinishReason::Length) => {
                    self.record(
                        provider,
                        Outcome::Completed {
                            tokens: segment_tokens,
                        },
                    );
                    let done = DispatchEvent::Done {
                        finish,
                        completion_tokens: delivered.len() as u32,
                        providers,
                        cost,
                        segments,
                    };
                    let _ = events.send(done).await;
                    return Ok(());
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
            tracing::warn!(job = %job_id, %provider, error = %last_error, delivered = delivered.len(), "provider failed; trying the next");
            if delivered.len() >= request.sampling.max_tokens as usize {
                let done = DispatchEvent::Done {
                    finish: FinishReason::Length,
                    completion_tokens: delivered.len() as u32,
                    providers,
                    cost,
                    segments,
                };
                let _ = events.send(done).await;
                return Ok(());
            }
        }
        Err(if accepted {
            ApiError::upstream(last_error)
        } else {
            ApiError::no_provider(last_error)
        })
    }

    /// Asks the first `quote_k` candidates for a quote in parallel and ranks again with
    /// their answers (SPEC §10). With `quote_k = 0` the advert-based ranking stands.
    async fn quote_round(
        &self,
        candidates: Vec<Candidate>,
        job_id: JobId,
        model: ModelId,
        tier: Tier,
        request: &CompletionRequest,
    ) -> Vec<Candidate> {
        let k = self.defaults.quote_k.min(candidates.len());
        if k == 0 {
            return candidates;
        }
        let ceiling = request
            .routing
            .max_price_per_token
            .unwrap_or(self.defaults.max_price_per_token);
        let key = self.key.clone();
        let asks = candidates[..k].iter().map(|candidate| {
            let key = &key;
            async move {
                let provider = candidate.provider();
                let Ok(peer) = provider.peer_id() else {
                    return QuoteAnswer::Silent;
                };
                if provider == self.key.node_id() {
                    return QuoteAnswer::Local;
                }
                self.dial_advertised(peer, &candidate.entry).await;
                let ask = QuoteRequest {
                    job_id,
                    buyer: self.key.node_id(),
                    provider,
                    model,
                    tier,
                    max_price_per_token: ceiling,
                    max_tokens: request.sampling.max_tokens.max(1),
                };
                quote::ask(&self.mesh, key, peer, ask).await
            }
        });
        let answers = futures::future::join_all(asks).await;
        for (candidate, answer) in candidates.iter().zip(&answers) {
            tracing::debug!(job = %job_id, provider = %candidate.provider(), ?answer, "quote");
        }
        quote::rerank(
            candidates,
            &answers,
            ceiling,
            request.sampling.max_tokens,
            &self.defaults.score,
        )
    }

    pub(super) fn local_route(&self) -> Option<Arc<dyn LocalRoute>> {
        self.local.get().cloned()
    }

    pub(super) fn key(&self) -> Arc<Keypair> {
        self.key.clone()
    }

    pub(super) fn stall_timeout(&self) -> std::time::Duration {
        self.defaults.stall_timeout
    }

    pub(super) async fn dial_advertised(&self, peer: PeerId, entry: &BookEntry) {
        if self.mesh.is_connected(&peer) {
            return;
        }
        for address in &entry.advert.addresses {
            if let Ok(address) = address.parse() {
                let _ = self.mesh.dial(address).await;
            }
        }
    }
}
