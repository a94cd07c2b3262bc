//! `sharemesh provide`: load and measure the model, join the mesh, advertise, serve
//! jobs and quotes (and, with `--openai`, this node's own gateway) until interrupted.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sharemesh_engine::{self as engine, Engine, LoadedModel};
use sharemesh_gateway::builder::GatewayBuilder;
use sharemesh_mesh as mesh;
use sharemesh_protocol::{ChatMessage, NanoUsd, Prompt, Role, Tier};
use sharemesh_provider::adversary::{self, Adversary};
use sharemesh_provider::{ProviderNode, ProviderPolicy};

use crate::http::{self, AppState};
use crate::local_engine::ModelArgs;
use crate::serve::{announce, key_check, mesh_config, open_ledger, wait_for_shutdown, MeshArgs};

#[derive(Args, Debug)]
pub struct ProvideArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub mesh: MeshArgs,
    #[command(flatten)]
    pub settle: crate::settle_args::PayeeArgs,
    /// Price in USD per million tokens.
    #[arg(long, default_value_t = 0.10)]
    pub price: f64,
    #[arg(long, default_value = "local")]
    pub region: String,
    /// Tiers offered (reserved|on_demand|interruptible, or gold|silver|bronze).
    #[arg(long, default_values = ["on_demand"])]
    pub tier: Vec<Tier>,
    /// Jobs running or queued at once; one more is refused `OverCapacity`. The default
    /// is two full batches of the default `--max-batch`: one decoding, one waiting.
    #[arg(long, default_value_t = 16)]
    pub max_concurrent: u32,
    /// Jobs the engine decodes together in one batch (continuous batching on the
    /// batch-invariant kernels; each job's tokens are its solo ones); 1 runs one job at
    /// a time.
    #[arg(long, default_value_t = sharemesh_engine::DEFAULT_MAX_BATCH)]
    pub max_batch: usize,
    /// KV-cache memory for the batch, in MiB: jobs wait for room (and the one that
    /// joined last is preempted and recomputed when decoding runs out); a job whose
    /// context could outgrow it all is refused `OverCapacity`.
    #[arg(long, default_value_t = sharemesh_engine::DEFAULT_KV_MEMORY_BYTES >> 20)]
    pub kv_memory_mib: usize,
    /// Tokens sent beyond the buyer's last receipt before pausing.
    #[arg(long, default_value_t = 64)]
    pub credit_window: u32,
    /// Seconds a job may wait on a buyer's receipts (or on a buyer that does not read)
    /// before it is cancelled and its slot freed.
    #[arg(long, default_value_t = 10)]
    pub credit_timeout_secs: u64,
    /// Serve only this buyer (its node id; repeatable). Without any, every buyer not
    /// denied is served.
    #[arg(long = "allow-buyer", value_name = "NODE_ID")]
    pub allow_buyer: Vec<sharemesh_protocol::NodeId>,
    /// Never serve this buyer (its node id; repeatable).
    #[arg(long = "deny-buyer", value_name = "NODE_ID")]
    pub deny_buyer: Vec<sharemesh_protocol::NodeId>,
    /// Jobs one buyer may run here at once (default: up to --max-concurrent; a gateway
    /// is one buyer for all of its clients).
    #[arg(long)]
    pub max_jobs_per_buyer: Option<u32>,
    /// Jobs one buyer may start here per minute (default: no limit).
    #[arg(long)]
    pub buyer_jobs_per_minute: Option<u32>,
    /// Seconds between advert refreshes (at most 30: adverts live at most 2 minutes).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=30))]
    pub advert_interval: u64,
    /// Price for reserved (gold) work, USD per million tokens (default: --price).
    #[arg(long)]
    pub price_reserved: Option<f64>,
    /// Price for interruptible (bronze) work, USD per million tokens (default: --price).
    #[arg(long)]
    pub price_interruptible: Option<f64>,
    /// Availability window, e.g. "mon-fri 09:00-17:00 UTC+02:00" (repeatable; none = always).
    #[arg(long, value_parser = sharemesh_provider::policy::parse_window)]
    pub window: Vec<sharemesh_protocol::AvailabilityWindow>,
    /// Take no new work while a GPU is hotter than this (°C, via NVML).
    #[arg(long)]
    pub max_temperature: Option<u32>,
    /// Take no new work while a GPU draws more than this (W, via NVML).
    #[arg(long)]
    pub max_power: Option<f64>,
    /// Also serve the OpenAI API (as a gateway with default routing) on --http.
    #[arg(long, requires = "http")]
    pub openai: bool,
    /// Adversary kit mode (a build with `--features adversary` only): `stall-after:N` (goes silent after N tokens),
    /// `overbill:K` (claims K times the prompt's size), `skip-index:N` (after N tokens,
    /// numbers chunks one further than it sent), `lie-text:N` (after N tokens, text its
    /// tokens do not spell), `hijack-name`, `flood-adverts:N`, `garbage` (noise
    /// tokens), `truncate-layers:N` (a cheaper network under the honest name),
    /// `camouflage:N` (honest for N jobs, then garbage), `substitute:PATH`,
    /// `lazy-verifier` (garbage on resumed jobs only), `claim-gpu:MIB` (a GPU it does not
    /// have), `lie-logprobs` (runners-up made less likely) (docs/security.md).
    #[arg(long, hide = true)]
    pub adversary: Option<Adversary>,
}

pub fn run(data_dir: &Path, args: ProvideArgs) -> Result<()> {
    let key = crate::identity::load_or_create(data_dir)?;
    let threads = args
        .model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    engine::set_threads(threads);
    let mut hardware = sharemesh_provider::hardware::detect();
    if let Some(gpu) = adversary::claimed_gpu(args.adversary.as_ref()) {
        hardware.gpus = vec![gpu];
    }
    hardware.log();
    let mut model: LoadedModel = crate::local_engine::load_model(data_dir, &args.model)?;
    adversary::apply_to_model(args.adversary.as_ref(), &mut model)?;
    // Measure what we advertise: a short greedy run on the benchmark prompt.
    let measured = crate::local_engine::measure_with(&mut model, "Hi", 16, 1)?;
    tracing::info!(model = %model.descriptor.name, tokens_per_second = measured.generation_tokens_per_second, "measured speed");
    // And what a full batch makes together (adverts and quotes report it).
    let benchmark_prompt = model.prompt_tokens(&Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: "Hi".into(),
    }]))?;
    let batch_tps = if args.max_batch > 1 {
        model.measure_batch(&benchmark_prompt, args.max_batch, 16)?
    } else {
        None
    };
    if let Some(tps) = batch_tps {
        tracing::info!(
            streams = args.max_batch,
            tokens_per_second = tps,
            "measured batch speed"
        );
    }
    let mut policy = ProviderPolicy {
        price_per_token: NanoUsd::per_token_from_usd_per_mtok(args.price)
            .context("--price must be a non-negative number")?,
        region: args.region.clone(),
        tiers: args.tier.clone(),
        max_concurrent: args.max_concurrent,
        credit_window_tokens: args.credit_window,
        credit_timeout: Duration::from_secs(args.credit_timeout_secs.max(1)),
        advert_interval: Duration::from_secs(args.advert_interval.max(1)),
        buyers: sharemesh_provider::buyers::BuyerPolicy {
            allow: args.allow_buyer.iter().copied().collect(),
            deny: args.deny_buyer.iter().copied().collect(),
            max_jobs_per_buyer: args.max_jobs_per_buyer,
            jobs_per_minute: args.buyer_jobs_per_minute,
        },
        measured_milli_tps: (measured.generation_tokens_per_second * 1000.0) as u32,
        batch_milli_tps: batch_tps.map_or(0, |tps| (tps * 1000.0) as u32),
        measured_prefill_milli_tps: (measured.prefill_tokens_per_second * 1000.0) as u32,
        tier_prices: [
            (Tier::Reserved, args.price_reserved),
            (Tier::Interruptible, args.price_interruptible),
        ]
        .into_iter()
        .filter_map(|(tier, price)| price.map(|p| (tier, p)))
        .map(|(tier, p)| {
            NanoUsd::per_token_from_usd_per_mtok(p)
                .map(|p| (tier, p))
                .context("tier prices must be non-negative numbers")
        })
        .collect::<Result<_>>()?,
        windows: args.window.clone(),
        thermal: sharemesh_provider::policy::ThermalGuard {
            max_temperature_celsius: args.max_temperature,
            max_power_watts: args.max_power,
        },
        ..ProviderPolicy::default()
    };
    policy.set_adversary(args.adversary);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let settings = sharemesh_engine::BatchSettings {
            max_batch: args.max_batch,
            kv_memory_bytes: args.kv_memory_mib.saturating_mul(1 << 20),
        };
        let engine = Arc::new(Engine::spawn_with(
            vec![model],
            args.max_concurrent as usize,
            settings,
        ));
        let mesh = mesh::spawn(key.secret(), mesh_config(data_dir, &args.mesh, true)?).await?;
        let ledger = open_ledger(data_dir)?;
        ledger.set_dispute_window_ms(args.settle.dispute_window_secs.saturating_mul(1000));
        let payee = args.settle.payee(data_dir, &key, ledger.clone()).await?;
        let mut node = ProviderNode::builder(key, engine.clone(), mesh.clone())
            .policy(policy)
            .hardware(hardware)
            .ledger(ledger.clone());
        if let Some(payee) = payee {
            node = node.settle_on_chain(payee, args.settle.chain.every()?);
        }
        let mut node = node.spawn();
        let provider = node.provider().clone();
        let mut own_gateway = None;
        let http = match args.mesh.http {
            Some(address) => {
                let gateway = if args.openai {
                    // Its own model verifies the jobs it buys from others (checks are
                    // bought for the models it does not serve); proofs that anyone may
                    // gossip are not replayed on the engine it serves on.
                    let replayer = crate::replay::EngineReplayer(engine.clone());
                    let dispatcher = GatewayBuilder::new(
                        mesh.clone(),
                        crate::identity::load_or_create(data_dir)?,
                    )
                    .ledger(ledger.clone())
                    .replay_with(Arc::new(replayer))
                    .build();
                    dispatcher.set_local_route(Arc::new(crate::local_route::LocalProvider(
                        provider.clone(),
                    )));
                    dispatcher.trust().auditor.keep_gossip_off_the_replayer();
                    own_gateway = Some(dispatcher.clone());
                    Some(sharemesh_gateway::GatewayState { dispatcher })
                } else {
                    None
                };
                let state = AppState::new(mesh.clone(), Some(ledger.clone()))
                    .with_provider(provider.clone());
                let keys = key_check(data_dir, address, false)?;
                Some(http::serve(address, state, gateway, keys).await?)
            }
            None => None,
        };
        announce(&mesh, "provider", http).await;
        let gateway_stopped = async {
            match &own_gateway {
                Some(dispatcher) => dispatcher.stopped().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = wait_for_shutdown() => Ok(()),
            stopped = node.stopped() => Err(stopped.into()),
            ended = gateway_stopped => Err(ended.into()),
        }
    })
}
