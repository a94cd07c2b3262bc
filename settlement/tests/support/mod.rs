//! A local devnet for the settlement tests: Foundry's anvil (installed by scripts/test
//! from npm into target/evm-tools) on a free loopback port, stopped by pid on drop.

#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use alloy_primitives::{Address, B256, U256};
use serde_json::json;
use sharemesh_settlement::evm::rpc::Rpc;
use sharemesh_settlement::AccountKey;

/// Where scripts/test installs the EVM tools (anvil, solc-js).
pub fn evm_tools() -> PathBuf {
    std::env::var_os("SHAREMESH_EVM_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/evm-tools"))
}

fn anvil_binary() -> PathBuf {
    let path = evm_tools().join("node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil");
    assert!(
        path.exists(),
        "anvil is not installed at {} — scripts/test installs it (npm ci in target/evm-tools)",
        path.display()
    );
    path
}

pub struct Anvil {
    child: Child,
    pub url: reqwest::Url,
}

impl Anvil {
    pub fn start() -> Anvil {
        let mut child = Command::new(anvil_binary())
            .args(["--port", "0", "--host", "127.0.0.1", "--accounts", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let address = loop {
            let line = lines
                .next()
                .expect("anvil exited before listening")
                .unwrap();
            if let Some(address) = line.strip_prefix("Listening on ") {
                break address.trim().to_string();
            }
        };
        // Keep draining anvil's log so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Anvil {
            child,
            url: format!("http://{address}").parse().unwrap(),
        }
    }

    /// anvil's first funded dev account (the well-known test mnemonic's first key).
    pub fn dev_key(&self) -> AccountKey {
        let secret: B256 = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
            .parse()
            .unwrap();
        AccountKey::from_bytes(&secret).unwrap()
    }

    pub async fn fund_gas(&self, account: Address) {
        let rpc = Rpc::new(self.url.clone()).unwrap();
        let ten_eth = U256::from(10u128.pow(19));
        let _: serde_json::Value = rpc
            .request("anvil_setBalance", json!([account, ten_eth]))
            .await
            .unwrap();
    }

    /// Moves the chain's clock on and mines a block at the new time.
    pub async fn advance(&self, seconds: u64) {
        let rpc = Rpc::new(self.url.clone()).unwrap();
        let _: serde_json::Value = rpc
            .request("evm_increaseTime", json!([seconds]))
            .await
            .unwrap();
        let _: serde_json::Value = rpc.request("evm_mine", json!([])).await.unwrap();
    }
}

impl Drop for Anvil {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn key(byte: u8) -> AccountKey {
    AccountKey::from_bytes(&B256::repeat_byte(byte)).unwrap()
}
