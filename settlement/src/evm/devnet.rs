//! A local devnet for trying settlement and for tests: Foundry's anvil (from npm, as
//! scripts/test installs it) on a free loopback port, a test stablecoin with open
//! minting, and anvil's funding calls. Never for real money.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use alloy_primitives::{Address, B256, U256};
use alloy_sol_types::SolCall;
use serde_json::json;

use super::contracts::{self, TestToken};
use super::rpc::Rpc;
use super::{units, Escrow, EscrowError};
use crate::key::AccountKey;
use crate::units::TokenUnits;

/// anvil's first dev account: a published key, funded on every anvil. Devnets only.
const ANVIL_DEV_KEY: &str = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

pub fn anvil_dev_key() -> AccountKey {
    // A constant that parses: checked by the tests.
    #[allow(clippy::expect_used)]
    let secret: B256 = ANVIL_DEV_KEY
        .parse()
        .expect("the dev key is 32 bytes of hex");
    #[allow(clippy::expect_used)]
    AccountKey::from_bytes(&secret).expect("the dev key is a valid scalar")
}

/// Where anvil is: `$SHAREMESH_EVM_TOOLS` (scripts/test sets it), `target/evm-tools` of
/// this checkout, or `anvil` on the PATH.
pub fn anvil_binary() -> PathBuf {
    let tools = std::env::var_os("SHAREMESH_EVM_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/evm-tools"));
    let installed = tools.join("node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil");
    if installed.exists() {
        installed
    } else {
        PathBuf::from("anvil")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AnvilError {
    #[error("starting {binary}: {source} (scripts/test installs anvil into target/evm-tools)")]
    Start {
        binary: String,
        #[source]
        source: std::io::Error,
    },
    #[error("anvil exited before it listened")]
    NoAddress,
}

/// A running anvil, stopped (by pid) when dropped.
pub struct Anvil {
    child: Child,
    pub url: reqwest::Url,
}

impl Anvil {
    pub fn start() -> Result<Anvil, AnvilError> {
        let binary = anvil_binary();
        let mut child = Command::new(&binary)
            .args(["--port", "0", "--host", "127.0.0.1", "--accounts", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| AnvilError::Start {
                binary: binary.display().to_string(),
                source,
            })?;
        let mut lines = BufReader::new(child.stdout.take().ok_or(AnvilError::NoAddress)?).lines();
        let address = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(address) = line.strip_prefix("Listening on ") {
                        break address.trim().to_owned();
                    }
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(AnvilError::NoAddress);
                }
            }
        };
        // Keep draining anvil's log so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let url = format!("http://{address}")
            .parse()
            .map_err(|_| AnvilError::NoAddress)?;
        Ok(Anvil { child, url })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Anvil {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Gives `account` 10 ETH for gas (anvil's `anvil_setBalance`).
pub async fn fund_gas(url: reqwest::Url, account: Address) -> Result<(), EscrowError> {
    let ten_eth = U256::from(10u128.pow(19));
    let _: serde_json::Value = Rpc::new(url)?
        .request("anvil_setBalance", json!([account, ten_eth]))
        .await?;
    Ok(())
}

/// Moves the devnet's clock on and mines a block at the new time.
pub async fn advance_time(url: reqwest::Url, seconds: u64) -> Result<(), EscrowError> {
    let rpc = Rpc::new(url)?;
    let _: serde_json::Value = rpc.request("evm_increaseTime", json!([seconds])).await?;
    let _: serde_json::Value = rpc.request("evm_mine", json!([])).await?;
    Ok(())
}

/// Deploys the test token from `key`'s account; returns its address.
pub async fn deploy_test_token(url: reqwest::Url, key: AccountKey) -> Result<Address, EscrowError> {
    let rpc = Rpc::new(url)?;
    let chain_id = rpc.chain_id().await?;
    let deployer = Escrow::with(rpc, key, chain_id, Address::ZERO);
    let receipt = deployer
        .send(None, contracts::test_token_bytecode())
        .await?;
    receipt
        .contract_address
        .ok_or(EscrowError::NotDeployed(receipt.transaction_hash))
}

/// Mints `amount` of the test token to `to`, sent from `escrow`'s account.
pub async fn mint(
    escrow: &Escrow,
    token: Address,
    to: Address,
    amount: TokenUnits,
) -> Result<(), EscrowError> {
    let call = TestToken::mintCall {
        to,
        amount: amount.to_u256(),
    };
    escrow.send_to_token(token, call.abi_encode()).await?;
    Ok(())
}

pub async fn token_balance(
    escrow: &Escrow,
    token: Address,
    owner: Address,
) -> Result<TokenUnits, EscrowError> {
    let call = TestToken::balanceOfCall(owner);
    let answer = escrow.rpc.call(token, &call.abi_encode().into()).await?;
    units(
        TestToken::balanceOfCall::abi_decode_returns(&answer)
            .map_err(|e| EscrowError::Decode(e.to_string()))?,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_dev_key_is_anvils_first_account() {
        assert_eq!(
            super::anvil_dev_key().address(),
            "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
                .parse::<alloy_primitives::Address>()
                .unwrap_or_default()
        );
    }
}
