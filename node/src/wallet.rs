//! `sharemesh wallet`: moving money through the escrow (SPEC §13) from this node's
//! ledger. A buyer deposits and signs what it owes each provider (that provider's final
//! receipts); a provider hands buyers its signed binding and redeems what they sign.
//! Run while the node is stopped (the ledger is locked while it runs).
//!
//! The chain key is `<data-dir>/wallet.key` (64 hex digits: an account you already
//! fund) if that file exists, else derived from the node's identity; it is never
//! printed.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::json;
use sharemesh_protocol::{SettlementBinding, SignedEnvelope};
use sharemesh_settlement::evm::{devnet, Escrow};
use sharemesh_settlement::owed::channel_owed;
use sharemesh_settlement::{AccountKey, SignedSpendingAuth, TokenUnits};

/// How long a printed binding is valid.
const BINDING_LIFETIME_MS: u64 = 180 * 24 * 3_600_000;

#[derive(Args, Debug)]
pub struct ChainArgs {
    /// The chain's JSON-RPC address (env SHAREMESH_CHAIN_RPC, like every flag).
    #[arg(long)]
    chain_rpc: String,
    /// The escrow contract's address, 0x… (env SHAREMESH_ESCROW).
    #[arg(long)]
    escrow: String,
}

#[derive(Subcommand, Debug)]
pub enum WalletCommand {
    /// This node's chain account; with an escrow, its deposit and wallet, or a buyer's
    /// (and what that buyer paid this node).
    Show {
        /// A buyer's account (0x…).
        #[arg(long)]
        buyer: Option<String>,
        #[arg(long)]
        chain_rpc: Option<String>,
        #[arg(long)]
        escrow: Option<String>,
    },
    /// What this node's ledger says each counterparty owes or is owed, by settlement
    /// state (no chain needed): final is what a buyer authorises and a provider redeems.
    Owed,
    /// Provider: this node's binding (its account for this escrow, signed by the
    /// node's identity), to hand to its buyers.
    Binding(ChainArgs),
    /// Buyer: deposit USD of the escrow's stablecoin to pay providers from.
    Deposit {
        /// Amount in USD, e.g. 25 or 2.50.
        usd: String,
        #[command(flatten)]
        chain: ChainArgs,
    },
    /// Buyer: ask to withdraw USD (starts the notice period; providers may still redeem
    /// during it), or with --complete take out what the notice released.
    Withdraw {
        usd: Option<String>,
        #[arg(long, conflicts_with = "usd")]
        complete: bool,
        #[command(flatten)]
        chain: ChainArgs,
    },
    /// Buyer: sign what this node owes the provider of BINDING: its receipts past the
    /// dispute window, never voided ones. Prints the authorisation for the provider.
    Authorise {
        /// The provider's `wallet binding` output (a file).
        #[arg(long)]
        binding: PathBuf,
        #[command(flatten)]
        chain: ChainArgs,
    },
    /// Provider: redeem a buyer's authorisation (a file written by `wallet authorise`).
    Redeem {
        authorisation: PathBuf,
        #[command(flatten)]
        chain: ChainArgs,
    },
    /// Devnet only (anvil): deploy a test stablecoin and an escrow, give the accounts
    /// gas and test dollars. Prints the escrow's address.
    Devnet {
        #[arg(long)]
        chain_rpc: String,
        /// Withdrawal notice; must exceed the nodes' dispute window (24 h by default).
        #[arg(long, default_value_t = 3 * 24 * 3600)]
        notice_secs: u64,
        /// Accounts (0x…) to fund.
        #[arg(long, value_delimiter = ',')]
        fund: Vec<String>,
        /// Test dollars minted to each funded account.
        #[arg(long, default_value = "1000")]
        usd: String,
    },
}

pub(crate) fn address(text: &str, what: &str) -> Result<sharemesh_settlement::Address> {
    text.trim()
        .parse()
        .with_context(|| format!("{what} `{text}` is not an address (0x and 40 hex digits)"))
}

pub(crate) fn url(text: &str) -> Result<reqwest::Url> {
    text.parse()
        .with_context(|| format!("--chain-rpc `{text}` is not a URL"))
}

/// An imported chain key, in place of the one derived from the node's identity.
const WALLET_KEY_FILE: &str = "wallet.key";

pub(crate) fn node_key(data_dir: &Path) -> Result<(sharemesh_protocol::Keypair, AccountKey)> {
    let node = crate::identity::load_or_create(data_dir)?;
    let path = data_dir.join(WALLET_KEY_FILE);
    let account = match std::fs::read_to_string(&path) {
        Ok(text) => {
            let secret: sharemesh_settlement::B256 = text
                .trim()
                .parse()
                .with_context(|| format!("{} is not a key (64 hex digits)", path.display()))?;
            AccountKey::from_bytes(&secret)
                .with_context(|| format!("{} is not a valid secp256k1 key", path.display()))?
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            AccountKey::derive(&node.secret()).context("deriving this node's chain account")?
        }
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    Ok((node, account))
}

async fn escrow(
    data_dir: &Path,
    chain: &ChainArgs,
) -> Result<(sharemesh_protocol::Keypair, Escrow)> {
    let (node, account) = node_key(data_dir)?;
    let escrow = Escrow::connect(
        url(&chain.chain_rpc)?,
        account,
        address(&chain.escrow, "--escrow")?,
    )
    .await
    .with_context(|| {
        format!(
            "connecting to the escrow at {} via {}",
            chain.escrow, chain.chain_rpc
        )
    })?;
    Ok((node, escrow))
}

/// Largest binding or authorisation file read: both come from the other party, and a
/// real one is well under 2 KiB.
const MAX_EXCHANGED_FILE_BYTES: u64 = 64 * 1024;

fn read_json(path: &Path) -> Result<serde_json::Value> {
    use std::io::Read;
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_EXCHANGED_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    if text.len() as u64 > MAX_EXCHANGED_FILE_BYTES {
        bail!(
            "{} is over {MAX_EXCHANGED_FILE_BYTES} bytes: not a binding or authorisation",
            path.display()
        );
    }
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

pub fn run(data_dir: &Path, command: WalletCommand) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let printed = runtime.block_on(settle(data_dir, command))?;
    println!("{}", serde_json::to_string_pretty(&printed)?);
    Ok(())
}

async fn settle(data_dir: &Path, command: WalletCommand) -> Result<serde_json::Value> {
    match command {
        WalletCommand::Show {
            buyer,
            chain_rpc: Some(chain_rpc),
            escrow: Some(escrow),
        } => status(data_dir, buyer.as_deref(), &ChainArgs { chain_rpc, escrow }).await,
        WalletCommand::Show { buyer: Some(_), .. } => {
            bail!("--buyer needs the chain: --chain-rpc and --escrow")
        }
        WalletCommand::Show { .. } => {
            let (node, account) = node_key(data_dir)?;
            Ok(json!({
                "node": node.node_id().to_string(),
                "account": account.address().to_string(),
            }))
        }
        WalletCommand::Binding(chain) => binding(data_dir, &chain).await,
        WalletCommand::Owed => owed(data_dir),
        WalletCommand::Deposit { usd, chain } => deposit(data_dir, &usd, &chain).await,
        WalletCommand::Withdraw {
            usd,
            complete,
            chain,
        } => withdraw(data_dir, usd.as_deref(), complete, &chain).await,
        WalletCommand::Authorise { binding, chain } => authorise(data_dir, &binding, &chain).await,
        WalletCommand::Redeem {
            authorisation,
            chain,
        } => redeem(data_dir, &authorisation, &chain).await,
        WalletCommand::Devnet {
            chain_rpc,
            notice_secs,
            fund,
            usd,
        } => devnet_setup(&chain_rpc, notice_secs, &fund, &usd).await,
    }
}

/// Per counterparty, from the ledger: what is final, pending and voided on each channel
/// this node is part of.
fn owed(data_dir: &Path) -> Result<serde_json::Value> {
    let node = crate::identity::load_or_create(data_dir)?.node_id();
    let ledger = sharemesh_ledger::Ledger::open(&data_dir.join("ledger"))
        .context("opening this node's ledger (is the node running?)")?;
    let now = sharemesh_mesh::clock::now_ms();
    let (mut providers, mut buyers) = (
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    for (receipt, _) in ledger.receipts()? {
        if receipt.buyer == node {
            providers.insert(receipt.provider);
        }
        if receipt.provider == node {
            buyers.insert(receipt.buyer);
        }
    }
    let channel = |buyer, provider, key: &str, other: &sharemesh_protocol::NodeId| {
        ledger
            .channel_settlement(buyer, provider, now)
            .map(|money| {
                json!({
                    key: other.to_string(),
                    "final_nano_usd": money.final_nano_usd,
                    "pending_nano_usd": money.pending_nano_usd,
                    "voided_nano_usd": money.voided_nano_usd,
                })
            })
    };
    let to_providers = providers
        .iter()
        .map(|provider| channel(&node, provider, "provider", provider))
        .collect::<Result<Vec<_>, _>>()?;
    let from_buyers = buyers
        .iter()
        .map(|buyer| channel(buyer, &node, "buyer", buyer))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(json!({
        "node": node.to_string(),
        "dispute_window_ms": ledger.dispute_window_ms(),
        "owed_to_providers": to_providers,
        "owed_by_buyers": from_buyers,
    }))
}

async fn deposit(data_dir: &Path, usd: &str, chain: &ChainArgs) -> Result<serde_json::Value> {
    let (_, escrow) = escrow(data_dir, chain).await?;
    let scale = escrow.scale().await?;
    let amount = scale.parse_usd(usd)?;
    let wallet = escrow.token_balance(escrow.account()).await?;
    if wallet < amount {
        bail!(
            "the account {} holds {} USD of the escrow's token, less than {}",
            escrow.account(),
            scale.usd_text(wallet),
            scale.usd_text(amount)
        );
    }
    let token = escrow.token().await?;
    escrow.deposit(token, amount).await.context("depositing")?;
    let state = escrow.account_state(escrow.account()).await?;
    Ok(json!({
        "deposited_usd": scale.usd_text(amount),
        "balance_usd": scale.usd_text(state.balance),
    }))
}

async fn withdraw(
    data_dir: &Path,
    usd: Option<&str>,
    complete: bool,
    chain: &ChainArgs,
) -> Result<serde_json::Value> {
    let (_, escrow) = escrow(data_dir, chain).await?;
    let scale = escrow.scale().await?;
    if complete {
        let paid = escrow.withdraw().await.context("withdrawing")?;
        return Ok(json!({"withdrawn_usd": scale.usd_text(paid)}));
    }
    let Some(usd) = usd else {
        bail!("say how much to withdraw (USD), or --complete after the notice");
    };
    escrow
        .request_withdrawal(scale.parse_usd(usd)?)
        .await
        .context("requesting a withdrawal")?;
    let state = escrow.account_state(escrow.account()).await?;
    Ok(json!({
        "requested_usd": scale.usd_text(state.withdrawal_amount),
        "withdrawable_at_unix": state.withdrawable_at,
    }))
}

async fn redeem(data_dir: &Path, file: &Path, chain: &ChainArgs) -> Result<serde_json::Value> {
    let (_, escrow) = escrow(data_dir, chain).await?;
    let json = read_json(file)?;
    let auth: SignedSpendingAuth =
        serde_json::from_value(json.get("authorisation").cloned().unwrap_or(json))
            .with_context(|| format!("{} is not an authorisation", file.display()))?;
    let scale = escrow.scale().await?;
    let redeemed = escrow.redeem(&auth).await.context("redeeming")?;
    Ok(json!({
        "buyer": auth.channel.buyer.to_string(),
        "paid_usd": scale.usd_text(redeemed.paid),
        "channel_paid_usd": scale.usd_text(redeemed.redeemed),
    }))
}

async fn status(
    data_dir: &Path,
    buyer: Option<&str>,
    chain: &ChainArgs,
) -> Result<serde_json::Value> {
    let (_, escrow) = escrow(data_dir, chain).await?;
    let scale = escrow.scale().await?;
    let me = escrow.account();
    let whose = match buyer {
        Some(text) => address(text, "--buyer")?,
        None => me,
    };
    let state = escrow.account_state(whose).await?;
    let mut status = json!({
        "account": whose.to_string(),
        "deposit_usd": scale.usd_text(state.balance),
        "withdrawal_requested_usd": scale.usd_text(state.withdrawal_amount),
        "withdrawable_at_unix": state.withdrawable_at,
        "wallet_usd": scale.usd_text(escrow.token_balance(whose).await?),
    });
    if buyer.is_some() {
        status["paid_to_me_usd"] = json!(scale.usd_text(escrow.redeemed(whose, me).await?));
    }
    Ok(status)
}

async fn binding(data_dir: &Path, chain: &ChainArgs) -> Result<serde_json::Value> {
    let (node, escrow) = escrow(data_dir, chain).await?;
    let binding = SettlementBinding {
        node: node.node_id(),
        chain_id: escrow.chain_id(),
        escrow: escrow.address().into_array(),
        account: escrow.account().into_array(),
    };
    let now = sharemesh_mesh::clock::now_ms();
    let sealed = node.seal(&binding, now, now, BINDING_LIFETIME_MS)?;
    Ok(json!({
        "node": node.node_id().to_string(),
        "account": escrow.account().to_string(),
        "chain_id": escrow.chain_id(),
        "escrow": escrow.address().to_string(),
        "binding": hex::encode(sealed.to_bytes()?),
    }))
}

async fn authorise(
    data_dir: &Path,
    binding: &Path,
    chain: &ChainArgs,
) -> Result<serde_json::Value> {
    let (node, escrow) = escrow(data_dir, chain).await?;
    let file = read_json(binding)?;
    let bytes = file
        .get("binding")
        .and_then(|b| b.as_str())
        .and_then(|b| hex::decode(b).ok())
        .with_context(|| {
            format!(
                "{} has no hex `binding` (write it with `wallet binding`)",
                binding.display()
            )
        })?;
    let now = sharemesh_mesh::clock::now_ms();
    let opened = SignedEnvelope::from_bytes(&bytes)
        .ok()
        .and_then(|envelope| envelope.open::<SettlementBinding>(now).ok())
        .with_context(|| {
            format!(
                "{}: the binding does not open (forged, expired or damaged)",
                binding.display()
            )
        })?;
    let provider = opened.body;
    if provider.chain_id != escrow.chain_id() || provider.escrow != escrow.address().into_array() {
        bail!(
            "the binding is for chain {} escrow 0x{}, not this chain {} escrow {}",
            provider.chain_id,
            hex::encode(provider.escrow),
            escrow.chain_id(),
            escrow.address()
        );
    }
    let ledger = sharemesh_ledger::Ledger::open(&data_dir.join("ledger"))
        .context("opening this node's ledger (is the node running?)")?;
    let scale = escrow.scale().await?;
    let owed = channel_owed(&ledger, scale, &node.node_id(), &provider.node, now)?;
    if owed.final_units == TokenUnits(0) {
        bail!(
            "nothing owed to {} is past the dispute window yet (pending: {} USD)",
            provider.node,
            scale.usd_text(owed.all_units)
        );
    }
    let auth = escrow.authorise(provider.account.into(), owed.final_units)?;
    Ok(json!({
        "provider": provider.node.to_string(),
        "authorised_usd": scale.usd_text(owed.final_units),
        "pending_usd": scale.usd_text(owed.all_units.saturating_sub(owed.final_units)),
        "authorisation": auth,
    }))
}

async fn devnet_setup(
    rpc: &str,
    notice_secs: u64,
    fund: &[String],
    usd: &str,
) -> Result<serde_json::Value> {
    let url = url(rpc)?;
    let deployer = devnet::anvil_dev_key();
    let token = devnet::deploy_test_token(url.clone(), deployer.clone())
        .await
        .context("deploying the test stablecoin (is this an anvil devnet?)")?;
    let escrow = Escrow::deploy(url.clone(), deployer, token, notice_secs)
        .await
        .context("deploying the escrow")?;
    let amount = escrow.scale().await?.parse_usd(usd)?;
    for account in fund {
        let account = address(account, "--fund")?;
        devnet::fund_gas(url.clone(), account).await?;
        devnet::mint(&escrow, token, account, amount).await?;
    }
    Ok(
        json!({"escrow": escrow.address().to_string(), "token": token.to_string(), "chain_id": escrow.chain_id()}),
    )
}
