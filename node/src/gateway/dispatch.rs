//! Routing a request to providers: filter the order book to eligible providers, rank
//! them, run the job, and on a provider failure continue the same response on the
//! next provider with `resume` (the engine's exact resume keeps the text identical).

use std::sync::{Arc, Mutex};

use libp2p::PeerId;
use rand::Rng;
use sharemesh_protocol::{
    FinishReason, JobId, JobRequest, Keypair, ModelId, NanoUsd, NodeId, Tier,
};
use sharemesh_reputation::{Outcome, ReputationBook, ScoreParams};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::openai::CompletionRequest;
use crate::buyer::{start_job, JobEvent};
use crate::clock::now_ms;
use crate::mesh::orderbook::BookEntry;
use crate::mesh::MeshHandle;

/// Gateway-wide defaults for routing options a request leaves out.
#[derive(Clone, Debug)]
pub struct RoutingDefaults {
    pub max_price_per_token: NanoUsd,
    pub tier: Tier,
    pub region: Option<String>,
    /// Providers tried (first plus failovers) before giving up.
    pub max_attempts: usize,
}

impl Default for RoutingDefaults {
    fn default() -> Self {
        Self {
            max_price_per_token: NanoUsd(1_000_000),
            tier: Tier::OnDemand,
            region: None,
            max_attempts: 4,
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

pub struct Dispatcher {
    mesh: MeshHandle,
    key: Keypair,
    defaults: RoutingDefaults,
    reliability: Mutex<ReputationBook<NodeId>>,
}

impl Dispatcher {
    pub fn new(mesh: MeshHandle, key: Keypair, defaults: RoutingDefaults) -> Arc<Self> {
        Arc::new(Self {
            mesh,
            key,
            defaults,
            reliability: Mutex::new(ReputationBook::new(ScoreParams::default(), 10_000)),
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

    /// Eligible providers for `model`, best first: cheapest, then fastest, then most
    /// reliable (observed success rate).
    pub fn candidates(
        &self,
        model: &ModelId,
        request: &CompletionRequest,
    ) -> (Vec<(BookEntry, NanoUsd)>, Tier) {
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
        let mut eligible: Vec<(BookEntry, NanoUsd, f64, f64)> = self
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
                let speed = f64::from(offer.generation_milli_tokens_per_second);
                let success = reliability
                    .as_ref()
                    .map_or(0.5, |r| r.success_rate(&advert.provider, now));
                ok.then_some((entry.clone(), price, speed, success))
            })
            .collect();
        eligible.sort_by(|a, b| {
            a.1.cmp(&b.1)
                .then(b.2.total_cmp(&a.2))
                .then(b.3.total_cmp(&a.3))
        });
        (
            eligible.into_iter().map(|(e, p, _, _)| (e, p)).collect(),
            tier,
        )
    }

    fn record(&self, provider: NodeId, outcome: Outcome) {
        if let Ok(mut book) = self.reliability.lock() {
            book.record(&provider, outcome, now_ms());
        }
    }

    /// Starts a request; the first event is `Accepted` or `Failed`.
    pub fn run(self: &Arc<Self>, request: CompletionRequest) -> mpsc::Receiver<DispatchEvent> {
        let (events, receiver) = mpsc::channel(64);
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(err) = this.drive(request, &events).await {
                let _ = events.send(DispatchEvent::Failed(err)).await;
            }
        });
        receiver
    }

    async fn drive(
        &self,
        request: CompletionRequest,
        events: &mpsc::Sender<DispatchEvent>,
    ) -> Result<(), ApiError> {
        let model = self.resolve_model(&request.model)?;
        let (candidates, tier) = self.candidates(&model, &request);
        if candidates.is_empty() {
            return Err(ApiError::no_provider(format!(
                "no provider can serve `{}` now within the price ceiling, tier, region and VRAM constraints",
                request.model
            )));
        }
        let job_id = JobId::from_bytes(rand::rng().random());
        let mut delivered: Vec<u32> = Vec::new();
        let mut providers: Vec<NodeId> = Vec::new();
        let mut cost = NanoUsd::ZERO;
        let mut segments: Vec<Segment> = Vec::new();
        let mut last_error = String::from("no provider answered");
        let mut accepted = false;
        for (entry, price) in candidates.into_iter().take(self.defaults.max_attempts) {
            let provider = entry.advert.provider;
            let Ok(peer) = provider.peer_id() else {
                continue;
            };
            self.dial_advertised(peer, &entry).await;
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
            let mut stream = match start_job(
                &self.mesh,
                Keypair::from_secret(self.key.secret()),
                peer,
                job,
            )
            .await
            {
                Ok(stream) => stream,
                Err(err) => {
                    last_error = err.to_string();
                    self.record(provider, Outcome::Failed);
                    continue;
                }
            };
            let mut segment_tokens = 0u64;
            let mut segment_prompt = 0u64;
            let outcome = loop {
                let Some(event) = stream.recv().await else {
                    break Err("the job ended without an answer".to_owned());
                };
                match event {
                    JobEvent::Accepted(accept) => {
                        segment_prompt = u64::from(accept.prompt_tokens);
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
                        break Err(format!("{:?}: {}", reject.reason, reject.detail))
                    }
                    JobEvent::Token(chunk) => {
                        segment_tokens += chunk.token_ids.len() as u64;
                        let token_id = chunk.token_ids.first().copied().unwrap_or_default();
                        delivered.extend(&chunk.token_ids);
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
                let amount = price
                    .times(segment_prompt + segment_tokens)
                    .unwrap_or(NanoUsd::ZERO);
                cost = cost.checked_add(amount).unwrap_or(cost);
                segments.push(Segment {
                    provider: provider.to_string(),
                    prompt_tokens: segment_prompt,
                    completion_tokens: segment_tokens,
                    amount_nano_usd: amount.0,
                });
            }
            match outcome {
                Ok(finish) if finish != FinishReason::Error => {
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
                Ok(_) => last_error = format!("provider {provider} reported an error"),
                Err(why) => last_error = format!("provider {provider}: {why}"),
            }
            tracing::warn!(job = %job_id, %provider, error = %last_error, delivered = delivered.len(), "provider failed; trying the next");
            self.record(provider, Outcome::Failed);
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

    async fn dial_advertised(&self, peer: PeerId, entry: &BookEntry) {
        if self
            .mesh
            .peers()
            .await
            .map(|p| p.iter().any(|i| i.peer_id == peer.to_string()))
            .unwrap_or(false)
        {
            return;
        }
        for address in &entry.advert.addresses {
            if let Ok(address) = address.parse() {
                let _ = self.mesh.dial(address).await;
            }
        }
    }
}
