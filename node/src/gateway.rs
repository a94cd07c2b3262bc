//! `sharemesh gateway`: the light client. Joins the mesh, keeps the order book and
//! serves the OpenAI API until interrupted; it runs no inference.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sharemesh_gateway::builder::GatewayBuilder;
use sharemesh_gateway::dispatch::Dispatcher;
use sharemesh_gateway::plan::RoutingDefaults;
use sharemesh_gateway::verify::outsource::OutsourcePolicy;
use sharemesh_gateway::waiting::WaitPolicy;
use sharemesh_mesh as mesh;
use sharemesh_protocol::{NanoUsd, Tier};

use crate::http::{self, AppState};
use crate::serve::{
    announce, key_check, mesh_config, open_ledger, usd, wait_for_shutdown, MeshArgs,
};

#[derive(Args, Debug)]
pub struct GatewayArgs {
    #[command(flatten)]
    pub mesh: MeshArgs,
    #[command(flatten)]
    pub settle: crate::settle_args::SettleArgs,
    /// Default price ceiling, USD per million tokens (a request's `sharemesh.max_price_per_mtok` overrides it).
    #[arg(long, default_value_t = 1000.0)]
    pub max_price: f64,
    /// Default tier for requests that name none.
    #[arg(long, default_value = "on_demand")]
    pub tier: Tier,
    /// Default region for requests that name none.
    #[arg(long)]
    pub region: Option<String>,
    /// Require API keys even on loopback (always required elsewhere).
    #[arg(long)]
    pub require_api_key: bool,
    /// Daily spend limit in USD (UTC days).
    #[arg(long)]
    pub daily_budget: Option<f64>,
    /// Monthly spend limit in USD (UTC months).
    #[arg(long)]
    pub monthly_budget: Option<f64>,
    /// Milliseconds of silence after which a provider counts as stalled and is replaced.
    #[arg(long, default_value_t = 30_000)]
    pub stall_timeout_ms: u64,
    /// Providers asked for a quote (price, queue wait, speed) before each choice; 0 ranks
    /// by adverts alone.
    #[arg(long, default_value_t = 4)]
    pub quote_k: usize,
    /// Start gold (reserved) work on the two best providers and keep the first to
    /// answer (a request can override with `sharemesh.hedge`).
    #[arg(long)]
    pub hedge_gold: bool,
    /// Every this many streamed tokens, warm the next provider in line with the tokens
    /// so far, so a failover there prefills only what came since; 0 turns it off.
    #[arg(long, default_value_t = 64)]
    pub warm_standby_every: usize,
    /// Milliseconds a request waits for the model's header (fetched once per model to
    /// count prompts and check text) before it goes on held only to the prompt's token
    /// bound; the fetch goes on in the background either way.
    #[arg(long, default_value_t = 3_000)]
    pub count_wait_ms: u64,
    /// Seconds a request waits for capacity when every provider is full (a burst waits
    /// its turn, fair across API keys) before a 503 with Retry-After; 0 answers 503 at
    /// once.
    #[arg(long, default_value_t = 30)]
    pub busy_wait_secs: u64,
    /// Most requests waiting for capacity at once; one more gets a 503 at once.
    #[arg(long, default_value_t = 256)]
    pub busy_queue: usize,
    /// Ranking score (SPEC §10): multiplier on the expected price of a request.
    #[arg(long, default_value_t = sharemesh_market::ScoreWeights::default().price)]
    pub score_price: f64,
    /// Ranking score: what a second of waiting is worth, in nano-USD.
    #[arg(long, default_value_t = sharemesh_market::ScoreWeights::default().nano_usd_per_second)]
    pub score_nano_usd_per_second: f64,
    /// Ranking score: how strongly an unreliable provider is penalised.
    #[arg(long, default_value_t = sharemesh_market::ScoreWeights::default().unreliability)]
    pub score_unreliability: f64,
    /// Also hold this model (catalog name, model id or GGUF path) and verify jobs
    /// served with it by replaying them here (SPEC §12) instead of buying the check;
    /// also confirms fraud proofs others gossip. Without it, the models this data dir
    /// holds are used (see --verify-memory-mib).
    #[arg(long)]
    pub verify: Option<String>,
    /// Without --verify: replay with every model this data dir holds (fetched with
    /// `sharemesh models fetch` or registered with `models add`), smallest first, up to
    /// this many MiB of model files; they load in the background. 0 holds none (every
    /// check is bought from providers).
    #[arg(long, default_value_t = 2048)]
    pub verify_memory_mib: u64,
    /// Never fetch a model to verify with. By default, at the first check of a catalog
    /// model this gateway does not hold, the model is fetched into this data dir if it
    /// fits --verify-memory-mib, and from then on that model's jobs are replayed here
    /// (checks are bought from providers until then, and any that end unsettled are
    /// replayed once it is held).
    #[arg(long)]
    pub no_verify_fetch: bool,
    /// Do not verify providers' work at all (not advised: a provider serving a cheaper
    /// model under the name you asked for is then paid in full). By default every job
    /// of a new, cheap or suspected provider is checked, fewer as its record grows: a
    /// window of it re-run by another provider as an ordinary paid job and compared
    /// bit for bit on the same execution profile, a third provider settling a
    /// difference (SPEC §12), or replayed here with --verify.
    #[arg(long, conflicts_with = "verify")]
    pub no_verify: bool,
    /// Steps per verification window bought from providers.
    #[arg(long, default_value_t = sharemesh_gateway::verify::outsource::DEFAULT_WINDOW, value_parser = clap::value_parser!(usize))]
    pub verify_window: usize,
    /// CPU threads for verification replays (default: all cores).
    #[arg(long)]
    pub verify_threads: Option<usize>,
    /// Seconds a receipt stays pending (a fraud proof voids it) before it is final.
    #[arg(long, default_value_t = sharemesh_ledger::DEFAULT_DISPUTE_WINDOW_MS / 1000)]
    pub dispute_window_secs: u64,
}

fn score_weights(args: &GatewayArgs) -> Result<sharemesh_market::ScoreWeights> {
    let weights = sharemesh_market::ScoreWeights {
        price: args.score_price,
        nano_usd_per_second: args.score_nano_usd_per_second,
        unreliability: args.score_unreliability,
    };
    weights
        .validate()
        .context("check --score-price, --score-nano-usd-per-second and --score-unreliability")?;
    Ok(weights)
}

pub fn run(data_dir: &Path, args: GatewayArgs) -> Result<()> {
    let key = crate::identity::load_or_create(data_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mesh = mesh::spawn(key.secret(), mesh_config(data_dir, &args.mesh, false)?).await?;
        let address = args
            .mesh
            .http
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
        let keys = key_check(data_dir, address, args.require_api_key)?;
        let defaults = RoutingDefaults {
            max_price_per_token: NanoUsd::per_token_from_usd_per_mtok(args.max_price)
                .context("--max-price must be a non-negative number")?,
            tier: args.tier,
            region: args.region.clone(),
            stall_timeout: Duration::from_millis(args.stall_timeout_ms.max(100)),
            score: score_weights(&args)?,
            quote_k: args.quote_k,
            hedge_gold: args.hedge_gold,
            warm_standby_every: args.warm_standby_every,
            count_wait: Duration::from_millis(args.count_wait_ms),
            waiting: WaitPolicy {
                max_wait: Duration::from_secs(args.busy_wait_secs),
                limit: args.busy_queue,
                ..WaitPolicy::default()
            },
            ..RoutingDefaults::default()
        };
        let budget = sharemesh_gateway::budget::Budget {
            daily: usd(args.daily_budget, "--daily-budget")?,
            monthly: usd(args.monthly_budget, "--monthly-budget")?,
        };
        let ledger = open_ledger(data_dir)?;
        ledger.set_dispute_window_ms(args.dispute_window_secs.saturating_mul(1000));
        let defaults_ceiling = defaults.max_price_per_token;
        let mut builder = GatewayBuilder::new(mesh.clone(), key)
            .routing(defaults)
            .ledger(ledger.clone())
            .budget(budget);
        builder = if args.no_verify {
            builder.without_verification()
        } else {
            if args.verify_window == 0 {
                anyhow::bail!("--verify-window must be at least 1 step");
            }
            builder.buy_checks(OutsourcePolicy {
                window: args.verify_window,
                max_price_per_token: defaults_ceiling,
                ..OutsourcePolicy::default()
            })
        };
        let payer = args
            .settle
            .payer(
                data_dir,
                std::sync::Arc::new(crate::identity::load_or_create(data_dir)?),
                ledger.clone(),
            )
            .await?;
        if let Some(payer) = payer {
            builder = builder.settle_with(payer, args.settle.every()?);
        }
        let dispatcher = builder.build();
        if !args.no_verify {
            replay_locally(data_dir, &args, &dispatcher)?;
        }
        let gateway = sharemesh_gateway::GatewayState {
            dispatcher: dispatcher.clone(),
        };
        let http = http::serve(
            address,
            AppState::new(mesh.clone(), Some(ledger)),
            Some(gateway),
            keys,
        )
        .await?;
        announce(&mesh, "gateway", Some(http)).await;
        tokio::select! {
            () = wait_for_shutdown() => Ok(()),
            ended = dispatcher.stopped() => Err(ended.into()),
        }
    })
}

/// Replays providers' work here where this node can: the model `--verify` names, or
/// the catalog models it holds or fetches within `--verify-memory-mib`.
#[cfg(feature = "provider")]
fn replay_locally(data_dir: &Path, args: &GatewayArgs, dispatcher: &Dispatcher) -> Result<()> {
    use std::sync::Arc;

    use sharemesh_engine::{Engine, TokenEngine};
    if let Some(model) = &args.verify {
        let model_args = crate::local_engine::ModelArgs {
            model: model.clone(),
            threads: args.verify_threads,
            device: crate::local_engine::Device::Auto,
        };
        let loaded = crate::local_engine::load_model(data_dir, &model_args)
            .with_context(|| format!("loading --verify {model}"))?;
        tracing::info!(model = %loaded.descriptor.name, profile = %loaded.profile(), "verifying jobs by replay");
        crate::verify_models::in_background(&loaded);
        let engine: Arc<dyn TokenEngine> = Arc::new(Engine::spawn(vec![loaded], 4));
        let replayer = crate::replay::EngineReplayer(engine);
        dispatcher.trust().auditor.set_replayer(Arc::new(replayer));
    }
    if args.verify.is_none() && !args.no_verify {
        if let Some(threads) = args.verify_threads {
            sharemesh_engine::set_threads(threads);
        }
        let budget = args.verify_memory_mib.saturating_mul(1 << 20);
        let fetch = !args.no_verify_fetch;
        crate::verify_models::hold(data_dir, budget, fetch, dispatcher.trust());
    }
    Ok(())
}

/// A light client replays nothing itself: it verifies by buying windows of providers'
/// work from other providers (and `--verify MODEL` is refused: it has no engine).
#[cfg(not(feature = "provider"))]
fn replay_locally(_: &Path, args: &GatewayArgs, _: &Dispatcher) -> Result<()> {
    if let Some(model) = &args.verify {
        anyhow::bail!(
            "--verify {model}: this light client has no engine to replay with (build the \
             full binary, or leave verification to the windows it buys)"
        );
    }
    if !args.no_verify {
        tracing::info!(
            "light client: verifying by buying windows of providers' work from other providers"
        );
    }
    Ok(())
}
