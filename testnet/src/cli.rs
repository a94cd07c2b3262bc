//! `sharemesh testnet up|status|logs|down|scenario|market-sim`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::launcher::{self, UpOptions};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum TestnetCommand {
    /// Start providers and gateways on loopback and wait until every advert is everywhere.
    Up(UpArgs),
    /// Show each node and whether it is running.
    Status(DirArgs),
    /// Print a node's log (index, peer id or name like provider-0).
    Logs {
        #[command(flatten)]
        dir: DirArgs,
        node: String,
    },
    /// Stop the processes this testnet started (by pid) and wait for them.
    Down(DirArgs),
    /// Simulate the market without inference: the gateway's auction against random and
    /// round-robin on synthetic providers and a bursty trace (table; optional CSV/JSON).
    MarketSim(MarketSimArgs),
    /// Simulate the trust layer against adversaries (garbage, substitution, truncated
    /// models, camouflage, whitewashing, drop-outs, a sybil ring, lazy verifiers):
    /// verification at the gateway's audit rate, fraud proofs, voided pay and EigenTrust
    /// views; prints a table per seed and ring size.
    TrustSim(TrustSimArgs),
    /// Simulate many mesh nodes in this process on the memory transport (synthetic
    /// adverts, no inference) and report how adverts spread.
    Simulate(crate::sim::SimulateArgs),
    /// Run a bounded scenario (load, churn) against the running testnet and report.
    Scenario {
        #[command(flatten)]
        dir: DirArgs,
        #[command(flatten)]
        args: crate::scenario::ScenarioArgs,
    },
}

#[derive(Args, Debug)]
pub struct DirArgs {
    /// Testnet folder (default: <data-dir>/testnet).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct UpArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    #[arg(long, default_value_t = 3)]
    pub providers: usize,
    #[arg(long, default_value_t = 1)]
    pub gateways: usize,
    /// First port (0: free ports).
    #[arg(long, default_value_t = 0)]
    pub base_port: u16,
    #[arg(long, default_value = crate::DEFAULT_MODEL)]
    pub model: String,
    /// Extra flags for every provider, e.g. "--price 0.2 --region eu".
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub provider_args: String,
    /// Extra flags for the first provider only, every node's bootstrap (after
    /// --provider-args), e.g. "--allow-buyer NODE_ID" to keep it from serving buyers.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub bootstrap_args: String,
    /// Extra flags for every gateway, e.g. "--relay-circuit-kib 64".
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub gateway_args: String,
    /// Run each node in its own network namespace joined by veth pairs to a bridge, as
    /// separate hosts (root only).
    #[arg(long)]
    pub netns: bool,
    /// With --netns: put the last N providers behind NAT routers of their own
    /// (masquerade out, no unsolicited inbound; needs nftables).
    #[arg(long, default_value_t = 0, requires = "netns")]
    pub nat: usize,
    /// With --netns: put the last N gateways (the buyers' nodes) behind NAT routers too.
    #[arg(long = "nat-buyers", default_value_t = 0, requires = "netns")]
    pub nat_buyers: usize,
    /// The kind of every NAT router: restricted (most home routers: hole punching works),
    /// cone (anyone may reach a port the node sent from), symmetric (a new port per
    /// connection: hole punching fails, relays carry the jobs).
    #[arg(long, value_enum, default_value_t = crate::netns::NatKind::Restricted)]
    pub nat_kind: crate::netns::NatKind,
    /// The kind of the gateways' routers, when it differs from --nat-kind (mixed pairs:
    /// a symmetric NAT on either side defeats hole punching).
    #[arg(long, value_enum, requires = "netns")]
    pub nat_buyer_kind: Option<crate::netns::NatKind>,
    /// The emulated link of every node (providers and gateways).
    #[command(flatten)]
    pub link: crate::LinkArgs,
}

#[derive(Args, Debug)]
pub struct TrustSimArgs {
    #[arg(long, default_value_t = 100)]
    pub providers: usize,
    /// Share of providers that cheat or drop out.
    #[arg(long, default_value_t = 0.3)]
    pub malicious: f64,
    #[arg(long, default_value_t = 20_000)]
    pub jobs: usize,
    #[arg(long, default_value_t = 20)]
    pub buyers: usize,
    #[arg(long, default_value_t = 3)]
    pub lazy_verifiers: usize,
    /// Sybil ring sizes to run (each is a row per seed).
    #[arg(long, value_delimiter = ',', default_value = "5,100")]
    pub ring: Vec<usize>,
    /// Reporters that accuse every honest provider of a mismatch.
    #[arg(long, default_value_t = 3)]
    pub slanderers: usize,
    /// Seeds to run.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub seeds: Vec<u64>,
    /// Run without verification too (the control rows).
    #[arg(long)]
    pub control: bool,
    /// Print the reports as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

fn trust_sim(args: &TrustSimArgs) -> Result<()> {
    use crate::trust_sim::{simulate, table, TrustSimConfig};
    if !(0.0..=1.0).contains(&args.malicious)
        || args.providers == 0
        || args.jobs == 0
        || args.buyers == 0
    {
        anyhow::bail!(
            "--malicious must be within 0..=1 and --providers, --jobs, --buyers at least 1"
        );
    }
    let mut reports = Vec::new();
    let verify_modes: &[bool] = if args.control {
        &[false, true]
    } else {
        &[true]
    };
    for &verify in verify_modes {
        for &ring in &args.ring {
            for &seed in &args.seeds {
                let config = TrustSimConfig {
                    providers: args.providers,
                    malicious: args.malicious,
                    jobs: args.jobs,
                    buyers: args.buyers,
                    lazy_verifiers: args.lazy_verifiers,
                    ring,
                    slanderers: args.slanderers,
                    seed,
                    verify,
                    ..TrustSimConfig::default()
                };
                reports.push(simulate(&config));
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        print!("{}", table(&reports));
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct MarketSimArgs {
    #[arg(long, default_value_t = 40)]
    pub providers: usize,
    #[arg(long, default_value_t = 4000)]
    pub requests: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Mean demand as a share of the fleet's token capacity.
    #[arg(long, default_value_t = 0.35)]
    pub load: f64,
    /// Providers asked for a quote per auction round.
    #[arg(long, default_value_t = 4)]
    pub quote_k: usize,
    /// Every n-th provider commits reserved (gold) slots.
    #[arg(long, default_value_t = 3)]
    pub reserved_every: usize,
    /// Start gold work on one provider only (by default it is hedged on two, as a
    /// gateway with `--hedge-gold` does).
    #[arg(long)]
    pub no_hedge_gold: bool,
    /// Share of providers that batch: one engine decoding up to 8 jobs together, each
    /// job slower the fuller the batch (aggregate with k jobs = single-stream speed ·
    /// kᵉ, e drawn in 0.45–0.9).
    #[arg(long, default_value_t = 0.0)]
    pub batching_share: f64,
    /// Also write the table as CSV here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Print the full reports as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

fn market_sim(args: &MarketSimArgs) -> Result<()> {
    use crate::market_sim;
    if !(args.load.is_finite() && args.load > 0.0 && args.load <= 10.0) {
        anyhow::bail!("--load must be in (0, 10], got {}", args.load);
    }
    if !(0.0..=1.0).contains(&args.batching_share) {
        anyhow::bail!(
            "--batching-share must be in [0, 1], got {}",
            args.batching_share
        );
    }
    if args.providers == 0 || args.requests == 0 || args.quote_k == 0 || args.reserved_every == 0 {
        anyhow::bail!("--providers, --requests, --quote-k and --reserved-every must be at least 1");
    }
    let config = market_sim::SimConfig {
        providers: args.providers,
        requests: args.requests,
        seed: args.seed,
        load: args.load,
        quote_k: args.quote_k,
        reserved_every: args.reserved_every,
        hedge_gold: !args.no_hedge_gold,
        weights: sharemesh_market::ScoreWeights::default(),
        batching_share: args.batching_share,
    };
    let reports = market_sim::simulate(&config);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        println!("{}", market_sim::table(&reports));
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, market_sim::csv(&reports))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn progress(message: &str) {
    eprintln!("  … {message}");
}

fn dir(data_dir: &Path, args: &DirArgs) -> PathBuf {
    args.dir.clone().unwrap_or_else(|| data_dir.join("testnet"))
}

/// Resolves a model name (catalog name, id or GGUF path) to the file providers load,
/// fetching a known catalog model if needed. The node supplies it: the testnet names
/// models but does not link the engine's catalog.
pub type ModelResolver = fn(&Path, &str) -> Result<String>;

pub fn up_options(
    data_dir: &Path,
    args: &UpArgs,
    resolve_model: ModelResolver,
) -> Result<UpOptions> {
    // Each provider of a one-machine testnet gets one thread (pools collapse under
    // contention) unless `--provider-args` sets its own.
    let extra: Vec<String> = args
        .provider_args
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let mut provider_args = vec!["--advert-interval".to_owned(), "1".to_owned()];
    if !extra
        .iter()
        .any(|arg| arg == "--threads" || arg.starts_with("--threads="))
    {
        provider_args.extend(["--threads".to_owned(), "1".to_owned()]);
    }
    provider_args.extend(extra);
    Ok(UpOptions {
        binary: std::env::current_exe().context("locating the sharemesh binary")?,
        dir: dir(data_dir, &args.dir),
        providers: args.providers,
        gateways: args.gateways,
        base_port: args.base_port,
        model: resolve_model(data_dir, &args.model)?,
        provider_args,
        gateway_args: args
            .gateway_args
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
        per_provider_args: match args.bootstrap_args.trim() {
            "" => Vec::new(),
            flags => vec![(0, flags.split_whitespace().map(str::to_owned).collect())],
        },
        link_args: args.link.flags(),
        link_seed: args.link.link_seed,
        progress: std::sync::Arc::new(crate::progress::Reporter::stderr()),
        ready_timeout: Duration::from_secs(120),
        netns: args.netns,
        nat: args.nat,
        nat_gateways: args.nat_buyers,
        nat_kind: args.nat_kind,
        nat_buyer_kind: args.nat_buyer_kind.unwrap_or(args.nat_kind),
    })
}

pub fn run(data_dir: &Path, command: TestnetCommand, resolve_model: ModelResolver) -> Result<()> {
    match command {
        TestnetCommand::Up(args) => {
            let options = up_options(data_dir, &args, resolve_model)?;
            let file = match launcher::up(&options) {
                Ok(file) => file,
                Err(err) => {
                    let _ = launcher::down(&options.dir);
                    return Err(err.context("the testnet did not come up (its nodes were stopped)"));
                }
            };
            for node in file
                .nodes
                .iter()
                .filter(|n| n.role == crate::NodeRole::Gateway)
            {
                println!(
                    "gateway: http://{}/v1",
                    node.http.as_deref().unwrap_or_default()
                );
                if let Some(key) = &node.api_key {
                    println!("api key: {key}");
                }
            }
            println!(
                "testnet: {}",
                options.dir.join(launcher::TESTNET_FILE).display()
            );
        }
        TestnetCommand::Status(args) => {
            for (node, alive) in launcher::status(&dir(data_dir, &args))? {
                println!(
                    "{:<9} {:<8} {:<53} {}  {}",
                    format!("{:?}", node.role).to_lowercase(),
                    node.pid,
                    node.peer_id,
                    if alive { "running" } else { "stopped" },
                    node.http.unwrap_or_default()
                );
            }
        }
        TestnetCommand::Logs { dir: d, node } => {
            let path = launcher::log_path(&dir(data_dir, &d), &node)?;
            print!(
                "{}",
                std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?
            );
        }
        TestnetCommand::MarketSim(args) => market_sim(&args)?,
        TestnetCommand::TrustSim(args) => trust_sim(&args)?,
        TestnetCommand::Simulate(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?;
            let report = runtime.block_on(crate::sim::run(&args, progress))?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                crate::sim::print(&report);
            }
        }
        TestnetCommand::Scenario { dir: d, args } => {
            let report = crate::scenario::run(
                &dir(data_dir, &d),
                &args,
                &crate::progress::Reporter::stderr(),
            )?;
            crate::scenario::print(&report);
        }
        TestnetCommand::Down(args) => {
            let stopped = launcher::down(&dir(data_dir, &args))?;
            println!("stopped {stopped} node(s)");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::TestnetCommand;

    /// `sharemesh testnet …` as the binary nests it.
    #[derive(Parser)]
    struct Testnet {
        #[command(subcommand)]
        command: TestnetCommand,
    }

    #[test]
    fn provider_args_may_start_with_a_dash_and_link_flags_become_node_flags() {
        let cli = Testnet::try_parse_from([
            "testnet",
            "up",
            "--provider-args",
            "--price 0.1 --region eu",
            "--link-latency-ms",
            "40",
            "--link-loss",
            "0.01",
        ])
        .expect("parses");
        let TestnetCommand::Up(args) = cli.command else {
            panic!("not testnet up");
        };
        assert_eq!(args.provider_args, "--price 0.1 --region eu");
        assert_eq!(
            args.link.flags(),
            [
                "--link-latency-ms",
                "40",
                "--link-jitter-ms",
                "0",
                "--link-loss",
                "0.01"
            ]
        );
    }
}
