//! `sharemesh provide` and `sharemesh gateway`: wire identity, engine, mesh and HTTP
//! together and run until interrupted.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use libp2p::Multiaddr;
use sharemesh_protocol::{NanoUsd, Tier};

use crate::cli::ModelArgs;
use crate::engine::{self, Engine, LoadedModel};
use crate::gateway::dispatch::{Dispatcher, RoutingDefaults};
use crate::http::{self, AppState};
use crate::mesh::{self, MeshConfig};
use crate::provider::{Provider, ProviderPolicy};

#[derive(Args, Debug, Clone)]
pub struct MeshArgs {
    /// Multiaddr to listen on (repeatable).
    #[arg(long = "listen")]
    pub listen: Vec<Multiaddr>,
    /// Multiaddr of a node to join through, with or without /p2p/<PeerId> (repeatable).
    #[arg(long = "bootstrap")]
    pub bootstrap: Vec<Multiaddr>,
    /// Discover peers on the LAN with mDNS (multicasts beyond loopback: off by default).
    #[arg(long)]
    pub mdns: bool,
    /// Connected peers to aim for.
    #[arg(long, default_value_t = 25)]
    pub target_peers: usize,
    /// Local HTTP API address.
    #[arg(long)]
    pub http: Option<SocketAddr>,
    #[command(flatten)]
    pub link: LinkArgs,
}

/// An emulated link for every connection a node dials (testnets on one machine, where
/// the kernel lacks `tc netem`). Any of these switches the mesh to TCP only.
#[derive(Args, Debug, Clone, Default)]
pub struct LinkArgs {
    /// Emulated one-way latency, ms.
    #[arg(long, default_value_t = 0)]
    pub link_latency_ms: u64,
    /// Emulated uniform jitter around the latency, ± ms.
    #[arg(long, default_value_t = 0)]
    pub link_jitter_ms: u64,
    /// Emulated loss: probability in [0, 1) that a chunk arrives one retransmission
    /// timeout (200 ms) late.
    #[arg(long, default_value_t = 0.0)]
    pub link_loss: f64,
    /// Seed of the link's draws (same seed, same delays; a testnet gives node k seed + k).
    #[arg(long, default_value_t = 0)]
    pub link_seed: u64,
}

impl LinkArgs {
    pub fn is_set(&self) -> bool {
        self.link_latency_ms > 0 || self.link_jitter_ms > 0 || self.link_loss > 0.0
    }

    /// The flags that give another node the same link (its seed is its own).
    pub fn flags(&self) -> Vec<String> {
        if !self.is_set() {
            return Vec::new();
        }
        [
            ("--link-latency-ms", self.link_latency_ms.to_string()),
            ("--link-jitter-ms", self.link_jitter_ms.to_string()),
            ("--link-loss", self.link_loss.to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .collect()
    }
}

#[derive(Args, Debug)]
pub struct ProvideArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub mesh: MeshArgs,
    /// Price in USD per million tokens.
    #[arg(long, default_value_t = 0.10)]
    pub price: f64,
    #[arg(long, default_value = "local")]
    pub region: String,
    /// Tiers offered (reserved|on_demand|interruptible, or gold|silver|bronze).
    #[arg(long, default_values = ["on_demand"])]
    pub tier: Vec<Tier>,
    #[arg(long, default_value_t = 4)]
    pub max_concurrent: u32,
    /// Tokens sent beyond the buyer's last receipt before pausing.
    #[arg(long, default_value_t = 64)]
    pub credit_window: u32,
    /// Seconds between advert refreshes.
    #[arg(long, default_value_t = 10)]
    pub advert_interval: u64,
    /// Price for reserved (gold) work, USD per million tokens (default: --price).
    #[arg(long)]
    pub price_reserved: Option<f64>,
    /// Price for interruptible (bronze) work, USD per million tokens (default: --price).
    #[arg(long)]
    pub price_interruptible: Option<f64>,
    /// Availability window, e.g. "mon-fri 09:00-17:00 UTC+02:00" (repeatable; none = always).
    #[arg(long, value_parser = crate::policy::parse_window)]
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
    /// Testnet adversary mode, e.g. `stall-after:5` (goes silent after 5 tokens).
    #[arg(long, hide = true)]
    pub adversary: Option<String>,
}

fn parse_adversary(mode: Option<&str>) -> Result<Option<u64>> {
    match mode {
        None => Ok(None),
        Some(mode) => match mode.strip_prefix("stall-after:").map(str::parse::<u64>) {
            Some(Ok(n)) => Ok(Some(n)),
            _ => anyhow::bail!("unknown adversary mode `{mode}` (known: stall-after:N)"),
        },
    }
}

#[derive(Args, Debug)]
pub struct GatewayArgs {
    #[command(flatten)]
    pub mesh: MeshArgs,
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
    /// Ranking score (SPEC §10): multiplier on the expected price of a request.
    #[arg(long, default_value_t = sharemesh_market::ScoreWeights::default().price)]
    pub score_price: f64,
    /// Ranking score: what a second of waiting is worth, in nano-USD.
    #[arg(long, default_value_t = sharemesh_market::ScoreWeights::default().nano_usd_per_second)]
    pub score_nano_usd_per_second: f64,
    /// Ranking score: how strongly an unreliable provider is penalised.
    #[arg(long, default_value_t = sharemesh_market::ScoreWeights::default().unreliability)]
    pub score_unreliability: f64,
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

fn usd(value: Option<f64>, flag: &str) -> Result<Option<NanoUsd>> {
    value
        .map(|v| {
            if v.is_finite() && v >= 0.0 {
                Ok(NanoUsd((v * 1e9).round() as u64))
            } else {
                anyhow::bail!("{flag} must be a non-negative number of USD")
            }
        })
        .transpose()
}

/// API keys are required off loopback (and on it when asked); refuses to start without any.
fn key_check(data_dir: &Path, address: SocketAddr, require: bool) -> Result<crate::keys::KeyCheck> {
    if !require && address.ip().is_loopback() {
        return Ok(crate::keys::KeyCheck::default());
    }
    let active = crate::keys::KeyStore::open(data_dir)?.active();
    if active.is_empty() {
        anyhow::bail!("the API on {address} needs API keys, but none exist: create one with `sharemesh keys create`");
    }
    Ok(crate::keys::KeyCheck {
        required: Some(active),
    })
}

/// Opens the node's ledger (`<data-dir>/ledger`).
pub fn open_ledger(data_dir: &Path) -> Result<std::sync::Arc<crate::ledger::Ledger>> {
    Ok(std::sync::Arc::new(crate::ledger::Ledger::open(
        &data_dir.join("ledger"),
    )?))
}

fn default_listen() -> Vec<Multiaddr> {
    ["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"]
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect()
}

fn mesh_config(data_dir: &Path, args: &MeshArgs, kad_server: bool) -> Result<MeshConfig> {
    let link = mesh::link::LinkProfile {
        latency: Duration::from_millis(args.link.link_latency_ms),
        jitter: Duration::from_millis(args.link.link_jitter_ms),
        loss: args.link.link_loss,
        retransmit_after: Duration::from_millis(200),
        seed: args.link.link_seed,
    };
    if !(0.0..1.0).contains(&args.link.link_loss) {
        bail!("--link-loss must be in [0, 1), got {}", args.link.link_loss);
    }
    if args.link.link_jitter_ms > args.link.link_latency_ms {
        bail!(
            "--link-jitter-ms ({}) cannot exceed --link-latency-ms ({})",
            args.link.link_jitter_ms,
            args.link.link_latency_ms
        );
    }
    let emulated = !link.is_ideal();
    let mut listen = if args.listen.is_empty() {
        default_listen()
    } else {
        args.listen.clone()
    };
    let transport = if emulated {
        let quic = |a: &Multiaddr| {
            a.iter()
                .any(|p| matches!(p, libp2p::multiaddr::Protocol::QuicV1))
        };
        if !args.listen.is_empty() && args.listen.iter().any(quic) {
            bail!("--link-* emulation wraps TCP streams only; drop the QUIC --listen address");
        }
        listen.retain(|a| !quic(a));
        mesh::MeshTransport::EmulatedTcp {
            link: Arc::new(move |_: &Multiaddr| link),
            counters: Arc::default(),
        }
    } else {
        mesh::MeshTransport::Network
    };
    Ok(MeshConfig {
        listen,
        bootstrap: args.bootstrap.clone(),
        kad_server,
        mdns: args.mdns,
        target_peers: args.target_peers,
        address_book: Some(data_dir.join("address_book.json")),
        transport,
        ..MeshConfig::default()
    })
}

/// Prints one JSON line on stdout once the node is up (the testnet reads it).
async fn announce(mesh: &mesh::MeshHandle, role: &str, http: Option<SocketAddr>) {
    for _ in 0..50 {
        if !mesh.listen_addrs().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready = serde_json::json!({
        "event": "ready",
        "role": role,
        "peer_id": mesh.peer_id.to_string(),
        "listen": mesh.listen_addrs().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "http": http.map(|a| a.to_string()),
    });
    println!("{ready}");
}

async fn wait_for_shutdown() {
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!("shutting down");
}

pub fn provide(data_dir: &Path, args: ProvideArgs) -> Result<()> {
    let key = crate::identity::load_or_create(data_dir)?;
    let threads = args
        .model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    engine::set_threads(threads);
    let hardware = crate::hardware::detect();
    hardware.log();
    let mut model: LoadedModel = crate::cli::load_model(data_dir, &args.model)?;
    // Measure what we advertise: a short greedy run on the benchmark prompt.
    let measured = crate::cli::measure_with(&mut model, "Hi", 16, 1)?;
    tracing::info!(model = %model.descriptor.name, tokens_per_second = measured.generation_tokens_per_second, "measured speed");
    let policy = ProviderPolicy {
        price_per_token: NanoUsd::per_token_from_usd_per_mtok(args.price)
            .context("--price must be a non-negative number")?,
        region: args.region.clone(),
        tiers: args.tier.clone(),
        max_concurrent: args.max_concurrent,
        credit_window_tokens: args.credit_window,
        advert_interval: Duration::from_secs(args.advert_interval.max(1)),
        measured_milli_tps: (measured.generation_tokens_per_second * 1000.0) as u32,
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
        thermal: crate::policy::ThermalGuard {
            max_temperature_celsius: args.max_temperature,
            max_power_watts: args.max_power,
        },
        stall_after: parse_adversary(args.adversary.as_deref())?,
        ..ProviderPolicy::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let engine = Engine::spawn(vec![model], args.max_concurrent as usize);
        let mesh = mesh::spawn(key.secret(), mesh_config(data_dir, &args.mesh, true)?).await?;
        let ledger = open_ledger(data_dir)?;
        // Uptime for the earnings report: a heartbeat per serving session.
        let heartbeat = ledger.clone();
        let started = crate::clock::now_ms();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            loop {
                tick.tick().await;
                if let Err(err) = heartbeat.heartbeat(started, crate::clock::now_ms()) {
                    tracing::warn!(%err, "could not record uptime");
                }
            }
        });
        let provider = Provider::new(
            key,
            engine,
            mesh.clone(),
            policy,
            hardware,
            Some(ledger.clone()),
        );
        tokio::spawn(provider.clone().serve());
        tokio::spawn(provider.clone().serve_quotes());
        tokio::spawn(provider.clone().advertise());
        let http = match args.mesh.http {
            Some(address) => {
                let gateway = if args.openai {
                    let dispatcher = Dispatcher::new(
                        mesh.clone(),
                        crate::identity::load_or_create(data_dir)?,
                        RoutingDefaults::default(),
                        Some(ledger.clone()),
                        crate::gateway::dispatch::Budget::default(),
                    );
                    dispatcher.set_local_provider(provider.clone());
                    let keys = key_check(data_dir, address, false)?;
                    Some(crate::gateway::GatewayState { dispatcher, keys })
                } else {
                    None
                };
                let state = AppState {
                    mesh: mesh.clone(),
                    ledger: Some(ledger.clone()),
                };
                Some(http::serve(address, state, gateway).await?)
            }
            None => None,
        };
        announce(&mesh, "provider", http).await;
        wait_for_shutdown().await;
        Ok(())
    })
}

pub fn gateway(data_dir: &Path, args: GatewayArgs) -> Result<()> {
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
            ..RoutingDefaults::default()
        };
        let budget = crate::gateway::dispatch::Budget {
            daily: usd(args.daily_budget, "--daily-budget")?,
            monthly: usd(args.monthly_budget, "--monthly-budget")?,
        };
        let ledger = open_ledger(data_dir)?;
        let dispatcher = Dispatcher::new(mesh.clone(), key, defaults, Some(ledger.clone()), budget);
        let gateway = crate::gateway::GatewayState { dispatcher, keys };
        let http = http::serve(
            address,
            AppState {
                mesh: mesh.clone(),
                ledger: Some(ledger),
            },
            Some(gateway),
        )
        .await?;
        announce(&mesh, "gateway", Some(http)).await;
        wait_for_shutdown().await;
        Ok(())
    })
}
