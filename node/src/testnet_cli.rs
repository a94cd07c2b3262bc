//! `sharemesh testnet up|status|logs|down`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use sharemesh_testnet::launcher::{self, UpOptions};

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
    #[arg(long, default_value = crate::catalog::DEFAULT_MODEL)]
    pub model: String,
    /// Extra flags for every provider, e.g. "--price 0.2 --region eu".
    #[arg(long, default_value = "")]
    pub provider_args: String,
}

fn progress(message: &str) {
    eprintln!("  … {message}");
}

fn dir(data_dir: &Path, args: &DirArgs) -> PathBuf {
    args.dir.clone().unwrap_or_else(|| data_dir.join("testnet"))
}

/// The model path for providers: a catalog name is resolved (and the default fetched).
pub fn model_for_testnet(data_dir: &Path, model: &str) -> Result<String> {
    let mut catalog = crate::catalog::Catalog::open(data_dir)?;
    let entry = match catalog.resolve(model) {
        Ok(entry) => entry,
        Err(_) if crate::catalog::KNOWN_MODELS.iter().any(|m| m.name == model) => {
            catalog.fetch_known(model)?
        }
        Err(err) => return Err(err),
    };
    Ok(entry.path.display().to_string())
}

pub fn up_options(data_dir: &Path, args: &UpArgs) -> Result<UpOptions> {
    // Each provider of a one-machine testnet gets one thread: pools collapse under contention.
    let mut provider_args = vec![
        "--threads".to_owned(),
        "1".to_owned(),
        "--advert-interval".to_owned(),
        "1".to_owned(),
    ];
    provider_args.extend(args.provider_args.split_whitespace().map(str::to_owned));
    Ok(UpOptions {
        binary: std::env::current_exe().context("locating the sharemesh binary")?,
        dir: dir(data_dir, &args.dir),
        providers: args.providers,
        gateways: args.gateways,
        base_port: args.base_port,
        model: model_for_testnet(data_dir, &args.model)?,
        provider_args,
        per_provider_args: Vec::new(),
        progress,
        ready_timeout: Duration::from_secs(120),
    })
}

pub fn run(data_dir: &Path, command: TestnetCommand) -> Result<()> {
    match command {
        TestnetCommand::Up(args) => {
            let options = up_options(data_dir, &args)?;
            let file = match launcher::up(&options) {
                Ok(file) => file,
                Err(err) => {
                    let _ = launcher::down(&options.dir);
                    return Err(err.context("the testnet did not come up (its nodes were stopped)"));
                }
            };
            for node in file.nodes.iter().filter(|n| n.http.is_some()) {
                println!(
                    "gateway: http://{}/v1",
                    node.http.as_deref().unwrap_or_default()
                );
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
        TestnetCommand::Scenario { dir: d, args } => {
            let report = crate::scenario::run(&dir(data_dir, &d), &args)?;
            crate::scenario::print(&report);
        }
        TestnetCommand::Down(args) => {
            let stopped = launcher::down(&dir(data_dir, &args))?;
            println!("stopped {stopped} node(s)");
        }
    }
    Ok(())
}
