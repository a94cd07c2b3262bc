//! Command-line interface. Each subcommand lives in its own module; this file only
//! parses flags and dispatches.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::commands::{self, AccountArgs, KeysCommand};
#[cfg(feature = "provider")]
use crate::local_engine::{self, BenchArgs, GenerateArgs};
use crate::logging::{self, LogFormat};
#[cfg(feature = "provider")]
use crate::models::{self, ModelsCommand};

#[derive(Parser, Debug)]
#[command(
    name = "sharemesh",
    version,
    about = "Peer-to-peer market for LLM tokens: sell idle GPU time, buy tokens per use"
)]
pub struct Cli {
    /// Folder for the identity key, config, models and databases.
    #[arg(long, global = true, env = "SHAREMESH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Pretty, env = "SHAREMESH_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    #[cfg(feature = "provider")]
    /// Manage local models (fetch, add, list).
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    #[cfg(feature = "provider")]
    /// Generate locally with a model (no network).
    Generate(GenerateArgs),
    #[cfg(feature = "provider")]
    /// Measure prefill and generation speed, as providers advertise it.
    Bench(BenchArgs),
    #[cfg(feature = "provider")]
    /// Serve a model to the mesh and earn per token.
    Provide(Box<crate::provide::ProvideArgs>),
    /// Run the light client: order book and local HTTP API, no serving.
    Gateway(Box<crate::gateway::GatewayArgs>),
    #[cfg(feature = "provider")]
    /// Adversary kit (a build with `--features adversary` only): a buyer that misbehaves against one provider (free rider, free
    /// prefill); prints what it got as JSON.
    #[command(hide = true)]
    Attack(crate::attack::AttackArgs),
    #[cfg(feature = "provider")]
    /// Run a local testnet and see the whole system work (fetch, serve, stream, fail over, pay).
    Demo(crate::demo::DemoArgs),
    #[cfg(feature = "provider")]
    /// Local testnets of separate processes on loopback.
    Testnet {
        #[command(subcommand)]
        command: sharemesh_testnet::cli::TestnetCommand,
    },
    /// Terminal playground: chat with a model through a gateway.
    Chat(crate::chat::ChatArgs),
    /// A running node at a glance: peers, the order book, its books, what it verified,
    /// its recent jobs (from its HTTP API).
    Status(crate::status::StatusArgs),
    /// What this provider earned, from its ledger.
    Earnings(AccountArgs),
    /// What this gateway spent, from its ledger.
    Spend(AccountArgs),
    /// Every receipt in this node's ledger, one JSON object per line (job, provider,
    /// buyer, tokens, amount, issue time): for reconciling a buyer's and a provider's
    /// books receipt by receipt (the ledger is locked while the node runs).
    Receipts,
    /// Show the effective configuration (config.toml < SHAREMESH_* env < flags).
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Move money through the escrow on a chain: deposit, authorise what the ledger says
    /// is owed, redeem (SPEC §13).
    Wallet {
        #[command(subcommand)]
        command: crate::wallet::WalletCommand,
    },
    /// Manage API keys for a shared gateway.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    #[cfg(feature = "provider")]
    /// Show the detected hardware (GPUs via NVML, CPU fallback).
    Hardware {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print each flag of a role with its effective value and where it came from.
    Show {
        /// provide, gateway, or any other subcommand.
        #[arg(default_value = "provide")]
        role: String,
    },
}

pub fn run(cli: Cli) -> Result<()> {
    logging::init(cli.log_format);
    let data_dir = crate::config::data_dir(cli.data_dir)?;
    match cli.command {
        #[cfg(feature = "provider")]
        Command::Models { command } => models::models(&data_dir, command),
        #[cfg(feature = "provider")]
        Command::Generate(args) => local_engine::generate(&data_dir, args),
        #[cfg(feature = "provider")]
        Command::Bench(args) => local_engine::bench(&data_dir, args),
        Command::Keys { command } => commands::keys(&data_dir, command),
        Command::Receipts => commands::receipts(&data_dir),
        Command::Wallet { command } => crate::wallet::run(&data_dir, command),
        Command::Config {
            command: ConfigCommand::Show { role },
        } => {
            use clap::CommandFactory;
            let file = data_dir.join(crate::config::CONFIG_FILE);
            let file = file.exists().then_some(file);
            let values = crate::config::file_values(file.as_deref(), &role);
            print!(
                "{}",
                crate::config::show(
                    &crate::config::with_env(Cli::command()),
                    &role,
                    file.as_deref(),
                    &values
                )?
            );
            Ok(())
        }
        #[cfg(feature = "provider")]
        Command::Demo(args) => crate::demo::run(&data_dir, args),
        #[cfg(feature = "provider")]
        Command::Attack(args) => crate::attack::run(args),
        Command::Chat(args) => crate::chat::run(args),
        Command::Status(args) => crate::status::run(args),
        Command::Earnings(args) => {
            commands::account(&data_dir, sharemesh_ledger::Side::Earnings, args)
        }
        Command::Spend(args) => commands::account(&data_dir, sharemesh_ledger::Side::Spend, args),
        #[cfg(feature = "provider")]
        Command::Testnet { command } => {
            sharemesh_testnet::cli::run(&data_dir, command, crate::local_engine::model_for_testnet)
        }
        #[cfg(feature = "provider")]
        Command::Provide(args) => crate::provide::run(&data_dir, *args),
        Command::Gateway(args) => crate::gateway::run(&data_dir, *args),
        #[cfg(feature = "provider")]
        Command::Hardware { json } => {
            let hw = sharemesh_provider::hardware::detect();
            if json {
                println!("{}", serde_json::to_string_pretty(&hw)?);
            } else {
                hw.log();
                println!("{hw:#?}");
            }
            Ok(())
        }
    }
}
