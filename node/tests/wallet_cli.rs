#![allow(clippy::unwrap_used)]
//! `sharemesh wallet` in real processes against a real devnet (anvil): a buyer's and a
//! provider's ledgers hold the same receipts; the buyer deposits and authorises what is
//! final, the provider redeems it, and money moves by exactly that much. Forged
//! bindings, replays and bad amounts are refused by name.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use sharemesh_ledger::Ledger;
use sharemesh_protocol::{Digest, JobId, Keypair, NanoUsd, Receipt};
use sharemesh_settlement::evm::devnet::Anvil;
use sharemesh_settlement::AccountKey;

const HOUR: u64 = 3_600_000;

struct Settle<'a> {
    rpc: String,
    escrow: String,
    dir: &'a Path,
}

impl Settle<'_> {
    fn run(&self, args: &[&str]) -> Result<Value, String> {
        let out = Command::new(common::sharemesh_bin())
            .arg("--data-dir")
            .arg(self.dir)
            .arg("wallet")
            .args(args)
            .env("SHAREMESH_CHAIN_RPC", &self.rpc)
            .env("SHAREMESH_ESCROW", &self.escrow)
            .output()
            .unwrap();
        if out.status.success() {
            Ok(serde_json::from_slice(&out.stdout).unwrap())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

fn book(
    ledgers: &[&Ledger],
    buyer: &Keypair,
    provider: &Keypair,
    job: u8,
    cents_per_100_tokens: u64,
    at: u64,
) {
    // 100 tokens at a price per token that makes the amount `cents` cents.
    let receipt = Receipt::new(
        JobId::from_bytes([job; 16]),
        provider.node_id(),
        buyer.node_id(),
        10,
        90,
        NanoUsd(cents_per_100_tokens * 10_000_000 / 100),
        Digest::from_bytes([job; 32]),
    )
    .unwrap();
    let sealed = buyer.seal(&receipt, 1, at, 60_000).unwrap();
    for ledger in ledgers {
        ledger.record_receipt(&sealed, None).unwrap();
    }
}

#[test]
fn a_buyer_pays_a_provider_its_final_receipts_through_the_escrow() {
    let anvil = Anvil::start().unwrap();
    let (buyer_dir, provider_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let buyer = sharemesh_node::identity::install_seeded(buyer_dir.path(), 41).unwrap();
    let provider = sharemesh_node::identity::install_seeded(provider_dir.path(), 42).unwrap();
    let account = |node: &Keypair| {
        AccountKey::derive(&node.secret())
            .unwrap()
            .address()
            .to_string()
    };

    // Without an escrow, `wallet show` prints the account alone (for funding it).
    let out = Command::new(common::sharemesh_bin())
        .arg("--data-dir")
        .arg(buyer_dir.path())
        .args(["wallet", "show"])
        .env_remove("SHAREMESH_CHAIN_RPC")
        .env_remove("SHAREMESH_ESCROW")
        .output()
        .unwrap();
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["account"].as_str().unwrap(), account(&buyer));
    assert!(printed.get("binding").is_none());
    // An imported key (an account the user already funds) replaces the derived one; a
    // damaged key file is an error naming it, never a silent fallback.
    let imported = tempfile::tempdir().unwrap();
    let show = |dir: &Path| {
        Command::new(common::sharemesh_bin())
            .arg("--data-dir")
            .arg(dir)
            .args(["wallet", "show"])
            .env_remove("SHAREMESH_CHAIN_RPC")
            .env_remove("SHAREMESH_ESCROW")
            .output()
            .unwrap()
    };
    let key = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";
    std::fs::write(imported.path().join("wallet.key"), format!("{key}\n")).unwrap();
    let printed: Value = serde_json::from_slice(&show(imported.path()).stdout).unwrap();
    assert_eq!(
        printed["account"],
        "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    );
    assert!(!String::from_utf8_lossy(&show(imported.path()).stdout).contains(key));
    std::fs::write(imported.path().join("wallet.key"), "not a key").unwrap();
    let damaged = show(imported.path());
    assert!(!damaged.status.success());
    assert!(String::from_utf8_lossy(&damaged.stderr).contains("wallet.key is not a key"));

    let mut as_buyer = Settle {
        rpc: anvil.url.to_string(),
        escrow: String::new(),
        dir: buyer_dir.path(),
    };
    let setup = as_buyer
        .run(&[
            "devnet",
            "--fund",
            &format!("{},{}", account(&buyer), account(&provider)),
            "--usd",
            "100",
        ])
        .unwrap();
    as_buyer.escrow = setup["escrow"].as_str().unwrap().to_owned();
    let as_provider = Settle {
        rpc: as_buyer.rpc.clone(),
        escrow: as_buyer.escrow.clone(),
        dir: provider_dir.path(),
    };

    // Both ledgers hold the buyer-signed receipts of two jobs: one past the 24 h
    // dispute window ($2.50), one still pending ($1.00).
    {
        let now = sharemesh_mesh::clock::now_ms();
        let buyer_ledger = Ledger::open(&buyer_dir.path().join("ledger")).unwrap();
        let provider_ledger = Ledger::open(&provider_dir.path().join("ledger")).unwrap();
        let both = [&buyer_ledger, &provider_ledger];
        book(&both, &buyer, &provider, 1, 250, now - 30 * HOUR);
        book(&both, &buyer, &provider, 2, 100, now - HOUR);
    }

    // Each side's ledger view of the channel, before any chain.
    let owed = as_buyer.run(&["owed"]).unwrap();
    let channel = &owed["owed_to_providers"][0];
    assert_eq!(channel["provider"], provider.node_id().to_string());
    assert_eq!(channel["final_nano_usd"], 2_500_000_000u64);
    assert_eq!(channel["pending_nano_usd"], 1_000_000_000u64);
    let owed = as_provider.run(&["owed"]).unwrap();
    assert_eq!(
        owed["owed_by_buyers"][0]["buyer"],
        buyer.node_id().to_string()
    );
    assert_eq!(
        owed["owed_by_buyers"][0]["final_nano_usd"],
        2_500_000_000u64
    );
    assert_eq!(owed["owed_to_providers"], Value::Array(vec![]));

    let deposited = as_buyer.run(&["deposit", "10"]).unwrap();
    assert_eq!(deposited["balance_usd"], "10.000000");
    let binding = as_provider.run(&["binding"]).unwrap();
    assert_eq!(binding["account"].as_str().unwrap(), account(&provider));
    let binding_file = provider_dir.path().join("binding.json");
    std::fs::write(&binding_file, binding.to_string()).unwrap();

    let auth = as_buyer
        .run(&["authorise", "--binding", binding_file.to_str().unwrap()])
        .unwrap();
    assert_eq!(auth["authorised_usd"], "2.500000");
    assert_eq!(auth["pending_usd"], "1.000000");
    let auth_file = provider_dir.path().join("auth.json");
    std::fs::write(&auth_file, auth.to_string()).unwrap();

    let redeemed = as_provider
        .run(&["redeem", auth_file.to_str().unwrap()])
        .unwrap();
    assert_eq!(redeemed["paid_usd"], "2.500000");
    let status = as_provider
        .run(&["show", "--buyer", &account(&buyer)])
        .unwrap();
    assert_eq!(status["deposit_usd"], "7.500000");
    assert_eq!(status["paid_to_me_usd"], "2.500000");
    let mine = as_provider.run(&["show"]).unwrap();
    assert_eq!(mine["wallet_usd"], "102.500000");

    // The same authorisation again: nothing more, and the refusal says why.
    let again = as_provider
        .run(&["redeem", auth_file.to_str().unwrap()])
        .unwrap_err();
    assert!(again.contains("already paid"), "{again}");
    // A binding changed by one byte (say, to redirect the pay) does not open.
    let mut forged = binding.clone();
    let mut hex_text = forged["binding"].as_str().unwrap().to_owned();
    let last = hex_text.pop().unwrap();
    hex_text.push(if last == '0' { '1' } else { '0' });
    forged["binding"] = Value::from(hex_text);
    std::fs::write(&binding_file, forged.to_string()).unwrap();
    let refused = as_buyer
        .run(&["authorise", "--binding", binding_file.to_str().unwrap()])
        .unwrap_err();
    assert!(refused.contains("does not open"), "{refused}");
    // A huge "binding" from a hostile provider is refused unread.
    std::fs::write(&binding_file, vec![b' '; 200 * 1024]).unwrap();
    let refused = as_buyer
        .run(&["authorise", "--binding", binding_file.to_str().unwrap()])
        .unwrap_err();
    assert!(
        refused.contains("not a binding or authorisation"),
        "{refused}"
    );
    // Amounts the token cannot hold are refused, not rounded.
    let bad = as_buyer.run(&["deposit", "1.0000001"]).unwrap_err();
    assert!(bad.contains("more decimals"), "{bad}");
    let bad = as_buyer.run(&["deposit", "ten"]).unwrap_err();
    assert!(bad.contains("not an amount"), "{bad}");
    // More than the wallet holds (100 minted, 10 deposited) is refused before any
    // transaction is sent.
    let bad = as_buyer.run(&["deposit", "90.5"]).unwrap_err();
    assert!(bad.contains("holds 90.000000 USD"), "{bad}");
}
