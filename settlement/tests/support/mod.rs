//! The settlement tests' devnet: the library's own (anvil on a free loopback port,
//! stopped by pid on drop), with the calls the tests make unwrapped.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;

use alloy_primitives::{Address, B256};
use sharemesh_settlement::evm::devnet;
use sharemesh_settlement::AccountKey;

/// Where scripts/test installs the EVM tools (anvil, solc-js).
pub fn evm_tools() -> PathBuf {
    std::env::var_os("SHAREMESH_EVM_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/evm-tools"))
}

pub struct Anvil {
    devnet: devnet::Anvil,
    pub url: reqwest::Url,
}

impl Anvil {
    pub fn start() -> Anvil {
        let devnet = devnet::Anvil::start().unwrap();
        let url = devnet.url.clone();
        Anvil { devnet, url }
    }

    pub fn dev_key(&self) -> AccountKey {
        devnet::anvil_dev_key()
    }

    pub async fn fund_gas(&self, account: Address) {
        devnet::fund_gas(self.url.clone(), account).await.unwrap();
    }

    pub async fn advance(&self, seconds: u64) {
        devnet::advance_time(self.url.clone(), seconds)
            .await
            .unwrap();
    }
}

pub fn key(byte: u8) -> AccountKey {
    AccountKey::from_bytes(&B256::repeat_byte(byte)).unwrap()
}

/// A receipt from `buyer` to `provider` for job `job` worth `nano` nano-USD (100 tokens
/// at the price that makes it so), signed by the buyer at `at_ms`.
pub fn sealed_receipt(
    buyer: &sharemesh_protocol::Keypair,
    provider: &sharemesh_protocol::Keypair,
    job: u8,
    nano: u64,
    at_ms: u64,
) -> sharemesh_protocol::SignedEnvelope {
    use sharemesh_protocol::{Digest, JobId, NanoUsd, Receipt};
    let receipt = Receipt::new(
        JobId::from_bytes([job; 16]),
        provider.node_id(),
        buyer.node_id(),
        10,
        90,
        NanoUsd(nano / 100),
        Digest::from_bytes([job; 32]),
    )
    .unwrap();
    buyer.seal(&receipt, 1, at_ms, 60_000).unwrap()
}
