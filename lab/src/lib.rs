//! An in-process lab: real providers, a real gateway and real libp2p swarms on the
//! memory transport, with [`ScriptedEngine`]s instead of models.
//!
//! For tests and experiments about the network and the market (failover, hedging,
//! quotes, budgets, preemption, stalls, adversaries): everything but inference is the
//! deployed code — admission, signed job streams, credit windows, receipts, the ledger,
//! routing and the order book — and a run takes milliseconds to seconds instead of
//! loading a model per process. What needs the model (exactness, resume of real text,
//! the demo) is tested with the real engine elsewhere.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use libp2p::Multiaddr;
use sharemesh_engine::scripted::{Script, ScriptedEngine};
use sharemesh_engine::GenerateRequest;
use sharemesh_gateway::budget::Budget;
use sharemesh_gateway::builder::GatewayBuilder;
use sharemesh_gateway::buyer::{start_job, Billing, BuyerStream, StreamTerms};
use sharemesh_gateway::dispatch::{DispatchEvent, Dispatcher, Segment};
use sharemesh_gateway::plan::RoutingDefaults;
use sharemesh_gateway::route::RouteError;
use sharemesh_gateway::route::{RouteRequest, RoutingOptions};
use sharemesh_ledger::Ledger;
use sharemesh_mesh::link::LinkProfile;
use sharemesh_mesh::orderbook::BookLimits;
use sharemesh_mesh::{MeshConfig, MeshHandle, MeshTransport};
use sharemesh_protocol::{
    FinishReason, JobId, JobRequest, Keypair, ModelDescriptor, NanoUsd, NodeId, Prompt, Sampling,
    Tier,
};
use sharemesh_provider::{Provider, ProviderNode, ProviderPolicy};
use tokio::task::JoinHandle;

/// Lab gateways report what they verified and recompute their views this often.
const LAB_REPORT_INTERVAL: Duration = Duration::from_millis(300);

/// The model every lab provider serves unless its spec says otherwise.
pub const LAB_MODEL: &str = "lab-model";

/// Memory-transport ports: unique in this process, so labs in parallel tests never meet.
static NEXT_PORT: AtomicU64 = AtomicU64::new(0);

fn next_address() -> Result<Multiaddr> {
    // Start high and away from the mesh simulation's range (1,000,000 + index).
    let port = 50_000_000 + NEXT_PORT.fetch_add(1, Ordering::SeqCst);
    format!("/memory/{port}")
        .parse()
        .context("a memory address")
}

/// One provider of a lab.
#[derive(Clone, Debug)]
pub struct ProviderSpec {
    pub policy: ProviderPolicy,
    pub script: Script,
    pub models: Vec<ModelDescriptor>,
    /// Wait for this provider's advert at start (an attacker's may never validate).
    pub expect_advert: bool,
    /// What it claims its hardware is (`None`: this machine's CPU).
    pub hardware: Option<sharemesh_provider::hardware::Hardware>,
}

impl Default for ProviderSpec {
    fn default() -> Self {
        let script = Script::default();
        Self {
            policy: ProviderPolicy {
                advert_interval: Duration::from_millis(200),
                measured_milli_tps: milli_tps(&script),
                ..ProviderPolicy::default()
            },
            script,
            models: vec![ScriptedEngine::model(LAB_MODEL)],
            expect_advert: true,
            hardware: None,
        }
    }
}

impl ProviderSpec {
    /// A provider whose engine takes `token_delay` per token, and says so in its adverts
    /// and quotes (as a real provider advertises what it measured).
    pub fn with_token_delay(mut self, token_delay: Duration) -> Self {
        self.script.token_delay = token_delay;
        self.policy.measured_milli_tps = milli_tps(&self.script);
        self
    }
}

/// The speed a script generates at, in thousandths of tokens per second.
fn milli_tps(script: &Script) -> u32 {
    let seconds = script.token_delay.as_secs_f64().max(1e-6);
    (1000.0 / seconds).min(f64::from(u32::MAX)) as u32
}

/// What the lab's gateway is like.
#[derive(Default)]
pub struct GatewaySpec {
    pub defaults: RoutingDefaults,
    pub budget: Budget,
    /// Book receipts in a real sled ledger in this folder (`None`: no ledger).
    pub ledger_dir: Option<std::path::PathBuf>,
    /// The gateway's order-book bounds (`None`: [`lab_book`]).
    pub book: Option<BookLimits>,
    /// The gateway holds the lab model and verifies jobs by replaying them on an
    /// honest scripted engine (`gateway --verify`).
    pub verify: bool,
    /// Where the replaying engine's script ends an answer (the honest providers'
    /// `Script::stop_after`; `None`: only `max_tokens` ends one).
    pub verify_stop_after: Option<u32>,
    /// The gateway buys verification windows from other providers (`sharemesh
    /// gateway`'s default; `None` here: the lab's gateways verify only when a test asks).
    pub outsource: Option<sharemesh_gateway::verify::outsource::OutsourcePolicy>,
    /// At its first check of the lab model the gateway "fetches" it (it is handed the
    /// honest scripted replayer after this pause, the download) and then replays the
    /// model's jobs and what only providers vouched for meanwhile itself, as `sharemesh
    /// gateway` fetches a catalog model; `None`: it fetches nothing.
    pub escalate: Option<Duration>,
}

impl GatewaySpec {
    /// A gateway as this spec says, on a fresh memory-transport swarm joined through
    /// `bootstrap`, built as `sharemesh gateway` builds one; with its ledger.
    async fn spawn(
        self,
        key: Keypair,
        bootstrap: Vec<Multiaddr>,
    ) -> Result<(Arc<Dispatcher>, MeshHandle, Option<Arc<Ledger>>)> {
        let book = self.book.unwrap_or_else(lab_book);
        let config = mesh_config(next_address()?, bootstrap, false, book);
        let mesh = sharemesh_mesh::spawn(key.secret(), config).await?;
        let ledger = match &self.ledger_dir {
            Some(dir) => Some(Arc::new(open_ledger(dir)?)),
            None => None,
        };
        let mut builder = GatewayBuilder::new(mesh.clone(), key)
            .routing(self.defaults)
            .budget(self.budget);
        if let Some(ledger) = &ledger {
            builder = builder.ledger(ledger.clone());
        }
        let replay = self.verify.then_some(self.verify_stop_after);
        let dispatcher = equip_verification(builder, replay, self.outsource, self.escalate).build();
        Ok((dispatcher, mesh, ledger))
    }
}

/// Lab providers refresh every 200 ms: a per-signer rate to match (the real default is
/// one per second for a 10 s refresh).
pub fn lab_book() -> BookLimits {
    BookLimits {
        refill_ms: 100,
        ..BookLimits::default()
    }
}

/// A running lab provider.
pub struct LabProvider {
    pub node_id: NodeId,
    pub mesh: MeshHandle,
    pub provider: Arc<Provider>,
    pub engine: ScriptedEngine,
    /// Its serving tasks, watched (a task that ends is logged); aborting the watcher
    /// drops them, which stops them.
    serving: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl LabProvider {
    /// Plays `kill -9`: the swarm stops (every connection drops at once) and the
    /// provider's tasks are aborted.
    pub async fn kill(&self) {
        let _ = self.mesh.shutdown().await;
        let serving = self.serving.lock().ok().and_then(|mut s| s.take());
        if let Some(serving) = serving {
            serving.abort();
        }
    }
}

/// The lab: providers and one gateway, joined through the first provider.
pub struct Lab {
    pub providers: Vec<LabProvider>,
    pub gateway: Arc<Dispatcher>,
    pub gateway_mesh: MeshHandle,
    /// The gateway node's key, for jobs a test opens itself (`gateway_buyer`).
    pub gateway_key: Arc<Keypair>,
    pub ledger: Option<Arc<Ledger>>,
}

/// A completed request as the gateway's client saw it.
#[derive(Debug)]
pub struct Completion {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub finish: FinishReason,
    pub providers: Vec<NodeId>,
    pub cost: NanoUsd,
    pub segments: Vec<Segment>,
    /// Providers the response moved to after the first (failovers).
    pub switches: usize,
}

fn mesh_config(
    listen: Multiaddr,
    bootstrap: Vec<Multiaddr>,
    kad_server: bool,
    book: BookLimits,
) -> MeshConfig {
    MeshConfig {
        book,
        listen: vec![listen],
        bootstrap,
        kad_server,
        target_peers: 8,
        heartbeat: Duration::from_millis(100),
        transport: MeshTransport::Memory {
            link: Arc::new(|_: &Multiaddr| LinkProfile::default()),
            counters: Arc::default(),
        },
        ..MeshConfig::default()
    }
}

/// The lab gateway's node id (its identity as a buyer), known before the lab starts so
/// provider policies can name it.
pub fn gateway_node_id() -> NodeId {
    key(GATEWAY_SEED).node_id()
}

const GATEWAY_SEED: u64 = 1_000;

/// A deterministic identity per lab node (seed → key), as testnets use.
fn key(seed: u64) -> Keypair {
    let mut secret = [0u8; 32];
    secret[..8].copy_from_slice(&seed.to_le_bytes());
    secret[31] = 0x1a;
    Keypair::from_secret(secret)
}

impl Lab {
    /// Starts the providers and the gateway and waits until the gateway's order book
    /// holds every provider's advert.
    pub async fn start(providers: Vec<ProviderSpec>, gateway: GatewaySpec) -> Result<Self> {
        let mut started: Vec<LabProvider> = Vec::new();
        let mut bootstrap = Vec::new();
        let mut every_provider = Vec::new();
        let mut expected = Vec::new();
        for (index, spec) in providers.into_iter().enumerate() {
            let key = key(index as u64 + 1);
            let address = next_address()?;
            let config = mesh_config(address.clone(), bootstrap.clone(), true, lab_book());
            let mesh = sharemesh_mesh::spawn(key.secret(), config).await?;
            let dialable = address.with(libp2p::multiaddr::Protocol::P2p(mesh.peer_id));
            if bootstrap.is_empty() {
                bootstrap.push(dialable.clone());
            }
            every_provider.push(dialable);
            if spec.expect_advert {
                expected.push(mesh.node_id);
            }
            let engine = ScriptedEngine::new(spec.models, spec.script);
            let mut node = ProviderNode::builder(key, Arc::new(engine.clone()), mesh.clone())
                .policy(spec.policy);
            // Without a claim, this machine's CPU (the builder's default).
            if let Some(hardware) = spec.hardware {
                node = node.hardware(hardware);
            }
            let mut node = node.spawn();
            let provider = node.provider().clone();
            let serving = tokio::spawn(async move {
                let stopped = node.stopped().await;
                tracing::warn!(%stopped, "a lab provider stopped");
            });
            started.push(LabProvider {
                node_id: mesh.node_id,
                mesh,
                provider,
                engine,
                serving: std::sync::Mutex::new(Some(serving)),
            });
        }
        let gateway_key = key(GATEWAY_SEED);
        // The gateway dials every provider, as a light client given a provider list
        // does: with only the first provider to start from, a gateway that penalised
        // that peer (an adversary) could be cut off before it found the others.
        let signer = Keypair::from_secret(gateway_key.secret());
        let (dispatcher, gateway_mesh, ledger) = gateway.spawn(signer, every_provider).await?;
        let lab = Self {
            providers: started,
            gateway: dispatcher,
            gateway_mesh,
            gateway_key: Arc::new(gateway_key),
            ledger,
        };
        lab.wait_for_adverts(&expected, Duration::from_secs(20))
            .await?;
        Ok(lab)
    }

    /// Waits until the gateway's book holds a live advert from each of `providers`.
    pub async fn wait_for_adverts(&self, providers: &[NodeId], timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let now = sharemesh_mesh::clock::now_ms();
            let missing = match self.gateway_mesh.book.read() {
                Ok(book) => {
                    let live: Vec<NodeId> =
                        book.live(now).iter().map(|e| e.advert.provider).collect();
                    providers.iter().filter(|p| !live.contains(p)).count()
                }
                Err(_) => bail!("the order book lock is poisoned"),
            };
            if missing == 0 {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("{missing} provider advert(s) did not reach the gateway in {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A chat-less text request for the lab model (by its id: it is not a catalog
    /// model).
    pub fn request(prompt: &str, max_tokens: u32, routing: RoutingOptions) -> RouteRequest {
        Self::request_for(
            &ScriptedEngine::model(LAB_MODEL).id.to_string(),
            prompt,
            max_tokens,
            routing,
        )
    }

    /// A chat-less text request for `model` (a catalog name or a model id).
    pub fn request_for(
        model: &str,
        prompt: &str,
        max_tokens: u32,
        routing: RoutingOptions,
    ) -> RouteRequest {
        RouteRequest {
            model: model.into(),
            prompt: Prompt::Text(prompt.into()),
            sampling: Sampling {
                max_tokens,
                ..Sampling::default()
            },
            routing,
        }
    }

    /// What an uninterrupted scripted run of `request` answers (token ids and text),
    /// whichever provider serves it.
    pub fn expected(&self, request: &RouteRequest) -> Result<(Vec<u32>, String)> {
        let model = self
            .gateway
            .resolve_model(&request.model)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let engine = &self
            .providers
            .first()
            .context("a lab without providers")?
            .engine;
        Ok(engine.expected(&GenerateRequest {
            model,
            prompt: request.prompt.clone(),
            sampling: request.sampling.clone(),
            resume: Vec::new(),
            ignore_eos: false,
            interruptible: false,
            prefix_salt: [0; 32],
        }))
    }

    /// Runs a request through the gateway to its end, calling `on_token` with the
    /// number of tokens delivered so far after each one (a test's hook to kill or
    /// stall a provider mid-stream).
    pub async fn complete_with<F, Fut>(
        &self,
        request: RouteRequest,
        mut on_token: F,
    ) -> Result<Completion, RouteError>
    where
        F: FnMut(usize, NodeId) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut events = self.gateway.run(request, None);
        let (mut text, mut token_ids, mut switches) = (String::new(), Vec::new(), 0);
        let mut serving = None;
        while let Some(event) = events.recv().await {
            match event {
                DispatchEvent::Accepted { provider, .. } => serving = Some(provider),
                DispatchEvent::Switched { provider } => {
                    serving = Some(provider);
                    switches += 1;
                }
                DispatchEvent::Token {
                    text: delta,
                    token_id,
                    ..
                } => {
                    text.push_str(&delta);
                    token_ids.push(token_id);
                    if let Some(provider) = serving {
                        on_token(token_ids.len(), provider).await;
                    }
                }
                DispatchEvent::Done {
                    finish,
                    providers,
                    cost,
                    segments,
                    ..
                } => {
                    return Ok(Completion {
                        text,
                        token_ids,
                        finish,
                        providers,
                        cost,
                        segments,
                        switches,
                    })
                }
                DispatchEvent::Failed(err) => return Err(err),
            }
        }
        Err(RouteError::Upstream(
            "the dispatcher stopped without an answer".into(),
        ))
    }

    /// Runs a request through the gateway to its end.
    pub async fn complete(&self, request: RouteRequest) -> Result<Completion, RouteError> {
        self.complete_with(request, |_, _| async {}).await
    }

    /// The lab gateway's own identity and swarm as a bare buyer: a test opens jobs
    /// with it that bypass the dispatcher and behave as the test likes.
    pub fn gateway_buyer(&self) -> LabBuyer {
        LabBuyer {
            key: self.gateway_key.clone(),
            mesh: self.gateway_mesh.clone(),
        }
    }

    /// A bare buyer on the lab's mesh (a fresh key and swarm, no gateway), joined
    /// through the first provider: what a free rider with a new key per job is.
    pub async fn add_buyer(&self) -> Result<LabBuyer> {
        let seed = GATEWAY_SEED + 1 + NEXT_PORT.fetch_add(1, Ordering::SeqCst);
        let key = key(seed);
        let bootstrap = self
            .providers
            .iter()
            .flat_map(|p| p.mesh.listen_addrs())
            .collect();
        let config = mesh_config(next_address()?, bootstrap, false, lab_book());
        let mesh = sharemesh_mesh::spawn(key.secret(), config).await?;
        Ok(LabBuyer {
            key: Arc::new(key),
            mesh,
        })
    }

    /// Another gateway on the lab's mesh (its own key, book and ledger), joined
    /// through the first provider: a buyer that may never have dealt with a provider
    /// the first gateway knows.
    pub async fn add_gateway(&self, spec: GatewaySpec) -> Result<(Arc<Dispatcher>, MeshHandle)> {
        let seed = GATEWAY_SEED + 1 + NEXT_PORT.fetch_add(1, Ordering::SeqCst);
        let gateway_key = key(seed);
        let mut bootstrap = self
            .providers
            .first()
            .context("a lab without providers")?
            .mesh
            .listen_addrs();
        // Also straight to the first gateway: gossip between the two (reports, proofs)
        // then needs no relay through a provider's mesh.
        bootstrap.extend(self.gateway_mesh.listen_addrs());
        let (dispatcher, mesh, _) = spec.spawn(gateway_key, bootstrap).await?;
        Ok((dispatcher, mesh))
    }

    /// The lab provider with this id.
    pub fn provider(&self, id: NodeId) -> Option<&LabProvider> {
        self.providers.iter().find(|p| p.node_id == id)
    }
}

/// A lab gateway's verification: replays on the lab model (`--verify`; `replay` says
/// where its script ends an answer), checks bought from providers (none without a
/// policy), the model fetched on an unsettled check after `escalate`'s "download",
/// reports at the lab's pace.
fn equip_verification(
    mut builder: GatewayBuilder,
    replay: Option<Option<u32>>,
    outsource: Option<sharemesh_gateway::verify::outsource::OutsourcePolicy>,
    escalate: Option<Duration>,
) -> GatewayBuilder {
    if let Some(download) = escalate {
        builder = builder.fetch_models_from(Arc::new(LabModelSource { download }));
    }
    if let Some(stop_after) = replay {
        builder = builder.replay_with(lab_replayer(stop_after));
    }
    builder = match outsource {
        Some(policy) => builder.buy_checks(policy),
        None => builder.no_bought_checks(),
    };
    builder.report_interval(LAB_REPORT_INTERVAL)
}

/// Holds the lab model on request: the honest scripted replayer, after a pause that
/// plays the download.
struct LabModelSource {
    download: Duration,
}

impl sharemesh_gateway::verify::escalate::ModelSource for LabModelSource {
    fn hold(
        &self,
        model: sharemesh_protocol::ModelId,
    ) -> futures::future::BoxFuture<
        'static,
        Option<Arc<dyn sharemesh_gateway::verify::audit::Replayer>>,
    > {
        let download = self.download;
        Box::pin(async move {
            tokio::time::sleep(download).await;
            let lab = ScriptedEngine::model(LAB_MODEL).id;
            let replayer: Arc<dyn sharemesh_gateway::verify::audit::Replayer> = lab_replayer(None);
            (model == lab).then_some(replayer)
        })
    }
}

/// An honest scripted engine serving the lab model: what a verifying gateway replays on.
fn lab_replayer(stop_after: Option<u32>) -> Arc<sharemesh_node::replay::EngineReplayer> {
    let script = Script {
        stop_after,
        ..Script::default()
    };
    let engine = ScriptedEngine::new(vec![ScriptedEngine::model(LAB_MODEL)], script);
    Arc::new(sharemesh_node::replay::EngineReplayer(Arc::new(engine)))
}

fn open_ledger(dir: &Path) -> Result<Ledger> {
    Ledger::open(&dir.join("ledger")).context("opening the lab gateway's ledger")
}

/// A buyer a test plays by hand: its key and swarm, no dispatcher.
pub struct LabBuyer {
    pub key: Arc<Keypair>,
    pub mesh: MeshHandle,
}

impl LabBuyer {
    /// Opens a job on `provider`, bypassing any dispatcher: the buyer behaves as the
    /// test likes (e.g. `Billing::Unbilled`: never pays).
    pub async fn open_job(
        &self,
        provider: NodeId,
        prompt: &str,
        max_tokens: u32,
        billing: Billing,
    ) -> Result<BuyerStream> {
        let model = ScriptedEngine::model(LAB_MODEL).id;
        let job = JobRequest {
            job_id: JobId::from_bytes(rand::random()),
            buyer: self.key.node_id(),
            provider,
            model,
            prompt: Prompt::Text(prompt.into()),
            sampling: Sampling {
                max_tokens,
                ..Sampling::default()
            },
            max_price_per_token: RoutingDefaults::default().max_price_per_token,
            tier: Tier::OnDemand,
            deadline_ms: sharemesh_mesh::clock::now_ms() + 60_000,
            resume: Vec::new(),
            audit_commitment: sharemesh_protocol::Digest::from_bytes([0; 32]),
        };
        let terms = StreamTerms {
            ledger: None,
            stall_timeout: Duration::from_secs(60),
            billing,
            counted: None,
        };
        let peer = provider.peer_id().context("a provider's peer id")?;
        start_job(&self.mesh, self.key.clone(), peer, job, terms)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
    }
}
