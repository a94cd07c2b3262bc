//! `sharemesh demo --settle`: the demo with money that moves. A local devnet (anvil) with
//! a test dollar and the escrow; the buyer's gateway deposits; providers and gateway
//! settle on it with a short dispute window; after the answer (and the failover) the
//! killed provider comes back, the window passes, the gateway authorises each
//! provider's final receipts and both providers redeem — and each provider's on-chain
//! gain is compared with its final receipts, to the token's unit (rounded down).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;
use sharemesh_settlement::evm::{devnet, Escrow};
use sharemesh_settlement::units::Scale;
use sharemesh_settlement::{Address, TokenUnits};
use sharemesh_testnet::{NodeRole, TestnetFile};

/// The demo's dispute window: long enough for the answer, short enough to watch pass.
pub const DISPUTE_WINDOW_SECS: u64 = 10;
/// What the buyer deposits (USD of the test token), and mints itself first.
const DEPOSIT_USD: &str = "5";
const MINT_USD: &str = "10";

/// The devnet and the escrow on it, for one demo run (anvil stops when dropped).
pub struct DemoChain {
    _anvil: devnet::Anvil,
    url: reqwest::Url,
    deployer: Escrow,
    token: Address,
    scale: Scale,
}

impl DemoChain {
    pub async fn start() -> Result<DemoChain> {
        install_anvil_if_missing()?;
        let anvil = devnet::Anvil::start().context(
            "starting the local devnet (anvil): scripts/test installs it into target/evm-tools \
             (npm ci --prefix target/evm-tools, see settlement/evm-tools/package.json)",
        )?;
        let url = anvil.url.clone();
        let token = devnet::deploy_test_token(url.clone(), devnet::anvil_dev_key()).await?;
        // Withdrawals wait an hour: longer than the demo's dispute window, as SPEC requires.
        let deployer = Escrow::deploy(url.clone(), devnet::anvil_dev_key(), token, 3600).await?;
        let scale = deployer.scale().await?;
        eprintln!(
            "  devnet {url} (anvil pid {}), test dollar {token}, escrow {}",
            anvil.pid(),
            deployer.address()
        );
        Ok(DemoChain {
            _anvil: anvil,
            url,
            deployer,
            token,
            scale,
        })
    }

    /// The flags every node settles with.
    pub fn node_args(&self) -> String {
        format!(
            "--chain-rpc {} --escrow {} --dispute-window-secs {DISPUTE_WINDOW_SECS} --settle-every-secs 2",
            self.url,
            self.deployer.address()
        )
    }

    /// Extra provider flags: redeem whatever is authorised (the demo's sums are cents).
    pub fn provider_args(&self) -> String {
        format!("{} --min-redeem-usd 0.000001", self.node_args())
    }

    /// Gas for every node, and the buyer's deposit from its gateway's account.
    pub async fn fund(&self, file: &TestnetFile) -> Result<()> {
        for node in &file.nodes {
            devnet::fund_gas(self.url.clone(), account_of(&node.data_dir)?).await?;
        }
        let gateway = gateway_node(file)?;
        let (_, key) = crate::wallet::node_key(Path::new(&gateway.data_dir))?;
        let buyer = self.deployer.as_account(key)?;
        devnet::mint(
            &self.deployer,
            self.token,
            buyer.account(),
            self.scale.parse_usd(MINT_USD)?,
        )
        .await?;
        buyer
            .deposit(self.token, self.scale.parse_usd(DEPOSIT_USD)?)
            .await?;
        eprintln!(
            "  the buyer's gateway ({}) deposited {DEPOSIT_USD} test USD in the escrow",
            buyer.account()
        );
        Ok(())
    }

    async fn balance(&self, account: Address) -> Result<TokenUnits> {
        Ok(devnet::token_balance(&self.deployer, self.token, account).await?)
    }

    /// Every provider's token balance now.
    pub async fn provider_balances(&self, file: &TestnetFile) -> Result<Vec<(String, TokenUnits)>> {
        let mut balances = Vec::new();
        for node in providers(file) {
            let balance = self.balance(account_of(&node.data_dir)?).await?;
            balances.push((node.peer_id.clone(), balance));
        }
        Ok(balances)
    }

    /// Waits for the dispute window to pass and every provider to redeem its final
    /// receipts, then prints them side by side (or one JSON object).
    pub async fn settle(
        &self,
        gateway_http: &str,
        file: &TestnetFile,
        before: &[(String, TokenUnits)],
        json_out: bool,
    ) -> Result<()> {
        let finals = final_receipts(gateway_http).await?;
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut rows = Vec::new();
        for (peer, balance_before) in before {
            let node_id = sharemesh_protocol::NodeId::from_peer_id(
                &peer
                    .parse()
                    .context("a provider's peer id in the testnet file")?,
            )?
            .to_string();
            let final_nano = finals.get(&node_id).copied().unwrap_or(0);
            let expected = self.scale.units_of(u128::from(final_nano));
            let node = providers(file)
                .find(|n| &n.peer_id == peer)
                .context("a provider left the testnet file")?;
            let account = account_of(&node.data_dir)?;
            let gain = loop {
                let gain = self.balance(account).await?.saturating_sub(*balance_before);
                if gain >= expected || Instant::now() > deadline {
                    break gain;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            rows.push(Row {
                node_id,
                final_nano,
                expected,
                before: *balance_before,
                gain,
            });
        }
        let decimals = self.scale.decimals();
        let number = |units: TokenUnits| u64::try_from(units.0).unwrap_or(u64::MAX);
        if json_out {
            let providers: Vec<_> = rows
                .iter()
                .map(|row| {
                    json!({
                        "node_id": row.node_id,
                        "final_nano_usd": row.final_nano,
                        "onchain_gain_units": number(row.gain),
                        "balance_before_units": number(row.before),
                        "balance_after_units": number(TokenUnits(row.before.0 + row.gain.0)),
                    })
                })
                .collect();
            println!(
                "{}",
                json!({
                    "decimals": decimals,
                    "rounding": "each channel's final receipts in nano-USD, rounded down to whole token units",
                    "providers": providers,
                })
            );
        } else {
            for row in &rows {
                eprintln!(
                    "  {}  final receipts {:>7} nano-USD = {:>4} units | on chain {} → {} units: gain {:>4} {}",
                    row.node_id,
                    row.final_nano,
                    row.expected.0,
                    row.before.0,
                    row.before.0 + row.gain.0,
                    row.gain.0,
                    if row.gain == row.expected { "✓" } else { "✗" }
                );
            }
            eprintln!(
                "  (the token has {decimals} decimals: each channel's final receipts are authorised rounded down to whole units)"
            );
        }
        if let Some(row) = rows.iter().find(|row| row.gain != row.expected) {
            bail!(
                "provider {} gained {} units on chain for {} units of final receipts; see its node.log",
                row.node_id,
                row.gain.0,
                row.expected.0
            );
        }
        Ok(())
    }
}

/// One provider's line of the settlement table.
struct Row {
    node_id: String,
    final_nano: u64,
    /// The final receipts in whole token units (rounded down).
    expected: TokenUnits,
    before: TokenUnits,
    gain: TokenUnits,
}

/// From a checkout without anvil (scripts/test not run yet), installs the EVM tools the
/// way scripts/test does: `npm ci` of `settlement/evm-tools`'s pinned lock file into
/// `target/evm-tools` (or `$SHAREMESH_EVM_TOOLS`).
fn install_anvil_if_missing() -> Result<()> {
    if devnet::anvil_binary().is_absolute() {
        return Ok(());
    }
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let packages = checkout.join("settlement/evm-tools");
    if !packages.join("package-lock.json").exists() {
        return Ok(()); // not a checkout: anvil must be on the PATH
    }
    let tools = std::env::var_os("SHAREMESH_EVM_TOOLS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| checkout.join("target/evm-tools"));
    eprintln!(
        "  installing anvil (npm ci into {}) — once",
        tools.display()
    );
    std::fs::create_dir_all(&tools)?;
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(packages.join(file), tools.join(file))?;
    }
    let status = std::process::Command::new("npm")
        .args([
            "ci",
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
            "--loglevel=error",
            "--prefix",
        ])
        .arg(&tools)
        // stdout is the JSON summary's (with --json); npm's errors go to stderr.
        .stdout(std::process::Stdio::null())
        .status()
        .context(
            "running npm to install anvil (install Node.js and npm, or run scripts/test once)",
        )?;
    if !status.success() {
        bail!("npm could not install anvil into {}", tools.display());
    }
    Ok(())
}

fn providers(file: &TestnetFile) -> impl Iterator<Item = &sharemesh_testnet::NodeRecord> {
    file.nodes.iter().filter(|n| n.role == NodeRole::Provider)
}

fn gateway_node(file: &TestnetFile) -> Result<&sharemesh_testnet::NodeRecord> {
    file.nodes
        .iter()
        .find(|n| n.role == NodeRole::Gateway)
        .context("no gateway in the testnet")
}

fn account_of(data_dir: &str) -> Result<Address> {
    Ok(crate::wallet::node_key(Path::new(data_dir))?.1.address())
}

/// Waits until none of the gateway's receipts is pending, and returns each provider's
/// final receipts (nano-USD), from its ledger (`/v1/account/spend`).
async fn final_receipts(gateway_http: &str) -> Result<std::collections::HashMap<String, u64>> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(DISPUTE_WINDOW_SECS + 60);
    loop {
        let report: serde_json::Value = client
            .get(format!("http://{gateway_http}/v1/account/spend"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let pending = report["settlement"]["pending_nano_usd"]
            .as_u64()
            .unwrap_or(0);
        if pending == 0 {
            let per = report["per_counterparty_settlement"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            return Ok(per
                .into_iter()
                .map(|(peer, money)| (peer, money["final_nano_usd"].as_u64().unwrap_or(0)))
                .collect());
        }
        if Instant::now() > deadline {
            bail!("the gateway's receipts were still pending after the dispute window");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
