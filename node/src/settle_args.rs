//! The flags that make `provide` and `gateway` settle on an EVM chain (SPEC §13), and
//! what they open: a provider's [`Payee`], a buyer's [`Payer`]. Without `--chain-rpc`
//! and `--escrow`, a node settles in its ledger only, as before.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sharemesh_ledger::Ledger;
use sharemesh_protocol::Keypair;
use sharemesh_settlement::credit::CreditLimits;
use sharemesh_settlement::evm::Escrow;
use sharemesh_settlement::{Payee, PayeeSettings, Payer};

#[derive(Args, Debug, Clone, Default)]
pub struct SettleArgs {
    /// Settle on an EVM chain through this JSON-RPC address (with --escrow): a provider
    /// serves only buyers whose escrow deposit covers them and redeems what they
    /// authorise; a gateway offers its binding and authorises its final receipts. The
    /// chain key is `<data-dir>/wallet.key` or derived from the node's identity
    /// (`sharemesh wallet show`).
    #[arg(long, requires = "escrow")]
    pub chain_rpc: Option<String>,
    /// The escrow contract's address, 0x… (with --chain-rpc).
    #[arg(long, requires = "chain_rpc")]
    pub escrow: Option<String>,
    /// Seconds between settlement rounds: a provider reads its buyers' deposits again
    /// and redeems due authorisations; a gateway authorises receipts that became final.
    #[arg(long, default_value_t = 300)]
    pub settle_every_secs: u64,
}

#[derive(Args, Debug, Clone)]
pub struct PayeeArgs {
    #[command(flatten)]
    pub chain: SettleArgs,
    /// Provider: the most, in USD, one buyer may owe unauthorised (receipts inside the
    /// dispute window, and final ones its next authorisation has not reached yet): at
    /// risk if it walks away.
    #[arg(long, default_value = "5")]
    pub max_pending_usd: String,
    /// Provider: redeem a channel once what its buyer authorised and the escrow has not
    /// paid reaches this many USD (each redemption costs gas; docs/operations.md).
    #[arg(long, default_value = "1")]
    pub min_redeem_usd: String,
    /// Seconds a receipt stays pending before it is final (what buyers authorise).
    #[arg(long, default_value_t = sharemesh_ledger::DEFAULT_DISPUTE_WINDOW_MS / 1000)]
    pub dispute_window_secs: u64,
}

impl SettleArgs {
    fn escrow_flags(&self) -> Option<(&str, &str)> {
        Some((self.chain_rpc.as_deref()?, self.escrow.as_deref()?))
    }

    pub fn every(&self) -> Result<Duration> {
        anyhow::ensure!(
            self.settle_every_secs > 0,
            "--settle-every-secs must be at least 1"
        );
        Ok(Duration::from_secs(self.settle_every_secs))
    }

    /// The escrow client of this node's account, when the flags name a chain.
    async fn connect(&self, data_dir: &Path) -> Result<Option<Escrow>> {
        let Some((rpc, escrow)) = self.escrow_flags() else {
            return Ok(None);
        };
        let (_, account) = crate::wallet::node_key(data_dir)?;
        let client = Escrow::connect(
            crate::wallet::url(rpc)?,
            account,
            crate::wallet::address(escrow, "--escrow")?,
        )
        .await
        .with_context(|| format!("connecting to the escrow at {escrow} via {rpc}"))?;
        Ok(Some(client))
    }

    /// A buyer's settlement, when the flags name a chain.
    pub async fn payer(
        &self,
        data_dir: &Path,
        key: Arc<Keypair>,
        ledger: Arc<Ledger>,
    ) -> Result<Option<Arc<Payer>>> {
        let Some(escrow) = self.connect(data_dir).await? else {
            return Ok(None);
        };
        let payer = Payer::new(escrow, key, ledger, sharemesh_mesh::clock::now_ms())
            .await
            .context("starting on-chain settlement")?;
        tracing::info!(account = %payer.account(), "settling on chain {}", payer.chain().chain_id);
        Ok(Some(Arc::new(payer)))
    }
}

impl PayeeArgs {
    /// A provider's settlement, when the flags name a chain.
    pub async fn payee(
        &self,
        data_dir: &Path,
        key: &Keypair,
        ledger: Arc<Ledger>,
    ) -> Result<Option<Arc<Payee>>> {
        let Some(escrow) = self.chain.connect(data_dir).await? else {
            return Ok(None);
        };
        let scale = escrow.scale().await.context("reading the escrow's token")?;
        let usd = |text: &str, flag: &str| {
            scale
                .parse_usd(text)
                .with_context(|| format!("{flag} {text}"))
        };
        let settings = PayeeSettings {
            limits: CreditLimits {
                max_pending: usd(&self.max_pending_usd, "--max-pending-usd")?,
            },
            min_redeem: usd(&self.min_redeem_usd, "--min-redeem-usd")?,
            authorisation_grace: sharemesh_settlement::payee::DEFAULT_AUTHORISATION_GRACE,
            max_buyers: sharemesh_settlement::payee::DEFAULT_MAX_BUYERS,
        };
        let payee = Payee::new(
            escrow,
            key,
            ledger,
            settings,
            sharemesh_mesh::clock::now_ms(),
        )
        .await
        .context("starting on-chain settlement")?;
        tracing::info!(account = %payee.account(), "settling on chain {}", payee.chain().chain_id);
        Ok(Some(Arc::new(payee)))
    }
}
