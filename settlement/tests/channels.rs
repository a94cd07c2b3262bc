//! A buyer's [`Payer`] and a provider's [`Payee`] settling over a real devnet (anvil)
//! from two real sled ledgers holding the same receipts: the offer exchange the mesh
//! carries, credit decided from the last reading, authorisation of exactly the final
//! receipts, redemption, and what each side refuses.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use alloy_primitives::Address;
use sharemesh_ledger::Ledger;
use sharemesh_protocol::Keypair;
use sharemesh_settlement::credit::{CreditLimits, CreditRefused};
use sharemesh_settlement::evm::{devnet, Escrow};
use sharemesh_settlement::offer::OfferError;
use sharemesh_settlement::payee::PayeeError;
use sharemesh_settlement::{AccountKey, Payee, PayeeSettings, Payer, TokenUnits, Unfunded};
use support::{sealed_receipt, Anvil};

const HOUR: u64 = 3_600_000;
const DEPOSIT: u128 = 100_000; // 0.1 USD of a six-decimal token

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

struct Sides {
    _anvil: Anvil,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    token: Address,
    buyer_node: Arc<Keypair>,
    provider_node: Keypair,
    buyer_escrow: Escrow,
    provider_escrow: Escrow,
    buyer_ledger: Arc<Ledger>,
    provider_ledger: Arc<Ledger>,
    provider_dir: std::path::PathBuf,
}

async fn sides() -> Sides {
    let anvil = Anvil::start();
    let token = devnet::deploy_test_token(anvil.url.clone(), anvil.dev_key())
        .await
        .unwrap();
    let deployer = Escrow::deploy(anvil.url.clone(), anvil.dev_key(), token, 3 * 24 * 3600)
        .await
        .unwrap();
    let (buyer_node, provider_node) = (
        Keypair::from_secret([21; 32]),
        Keypair::from_secret([22; 32]),
    );
    let account = |node: &Keypair| AccountKey::derive(&node.secret()).unwrap();
    let buyer_escrow = deployer.as_account(account(&buyer_node)).unwrap();
    let provider_escrow = deployer.as_account(account(&provider_node)).unwrap();
    for who in [&buyer_escrow, &provider_escrow] {
        anvil.fund_gas(who.account()).await;
    }
    devnet::mint(
        &deployer,
        token,
        buyer_escrow.account(),
        TokenUnits(1_000_000),
    )
    .await
    .unwrap();
    buyer_escrow
        .deposit(token, TokenUnits(DEPOSIT))
        .await
        .unwrap();
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let buyer_ledger = Arc::new(Ledger::open(dirs.0.path()).unwrap());
    let provider_ledger = Arc::new(Ledger::open(dirs.1.path()).unwrap());
    // Both sides booked the same receipts: one final (20,000 units), one pending.
    let now = now_ms();
    for (job, nano, at) in [(1, 20_000_000, now - 30 * HOUR), (2, 5_000_000, now - HOUR)] {
        let receipt = sealed_receipt(&buyer_node, &provider_node, job, nano, at);
        buyer_ledger.record_receipt(&receipt, None).unwrap();
        provider_ledger.record_receipt(&receipt, None).unwrap();
    }
    Sides {
        _anvil: anvil,
        token,
        buyer_node: Arc::new(buyer_node),
        provider_node,
        buyer_escrow,
        provider_escrow,
        buyer_ledger,
        provider_ledger,
        provider_dir: dirs.1.path().to_owned(),
        _dirs: dirs,
    }
}

const SETTINGS: PayeeSettings = PayeeSettings {
    limits: CreditLimits {
        max_pending: TokenUnits(90_000),
    },
    min_redeem: TokenUnits(1),
    authorisation_grace: std::time::Duration::from_secs(3600),
    max_buyers: 10,
};

#[tokio::test]
async fn a_provider_is_paid_exactly_the_final_receipts_and_credit_follows_the_deposit() {
    let s = sides().await;
    let now = now_ms();
    let (buyer, provider) = (s.buyer_node.node_id(), s.provider_node.node_id());
    let reader = s.buyer_escrow.as_account(devnet::anvil_dev_key()).unwrap();
    let payee = s.payee(SETTINGS, now).await;
    let payer = s.payer(now).await;

    // No binding offered: no credit.
    assert_eq!(
        payee.admit(&buyer, 1_000).unwrap_err(),
        Unfunded::NoBinding(31337)
    );

    // The first offer carries only the binding (the provider's account is unknown).
    assert!(payer.needs_offer(&provider));
    let first = payer.offer(&provider, now).unwrap();
    assert_eq!((first.frames.len(), first.authorises), (1, None));
    // Relayed by another node, the buyer's binding is that node's claim, and refused.
    let stranger = Keypair::from_secret([23; 32]).node_id();
    assert!(matches!(
        payee.offer(&stranger, &first.frames, now).await,
        Err(PayeeError::Offer(OfferError::NotThePeer { .. }))
    ));
    let answer = payee.offer(&buyer, &first.frames, now).await.unwrap();
    payer
        .answered(&provider, &first, Some(&answer), now)
        .unwrap();
    assert!(!payer.needs_offer(&provider));

    // Final receipts unauthorised: the provider stops extending credit.
    payee.settle_round(now).await.unwrap();
    assert!(matches!(
        payee.admit(&buyer, 1_000),
        Err(Unfunded::Credit(CreditRefused::Unauthorised { .. }))
    ));

    // The buyer signs exactly its final receipts (20,000 units), not the pending one.
    assert_eq!(
        payer.due(now).unwrap(),
        vec![(provider, TokenUnits(20_000))]
    );
    let second = payer.offer(&provider, now).unwrap();
    assert_eq!(second.authorises, Some(TokenUnits(20_000)));
    payee.offer(&buyer, &second.frames, now).await.unwrap();
    payer
        .answered(&provider, &second, Some(&answer), now)
        .unwrap();
    assert!(payer.due(now).unwrap().is_empty());

    // Credit now: owed 25,000 of a 100,000 deposit. A job that may cost 10,000 units
    // fits; while it runs, one of 70,000 more does not.
    let running = payee.admit(&buyer, 10_000_000).unwrap();
    assert!(matches!(
        payee.admit(&buyer, 70_000_000),
        Err(Unfunded::Credit(CreditRefused::DepositExhausted { .. }))
    ));
    // What the buyer owes unauthorised is bounded too (25,000 owed − 20,000 authorised +
    // 10,000 running + 80,001 > 90,000).
    assert!(matches!(
        payee.admit(&buyer, 80_000_000),
        Err(Unfunded::Credit(CreditRefused::PendingLimit { .. }))
    ));
    drop(running);

    // The round redeems the authorisation: the provider's gain is its final receipts.
    let before = devnet::token_balance(&reader, s.token, payee.account())
        .await
        .unwrap();
    let redemptions = payee.settle_round(now).await.unwrap();
    assert_eq!(redemptions.len(), 1);
    assert_eq!(
        redemptions[0].outcome.as_ref().unwrap().paid,
        TokenUnits(20_000)
    );
    let after = devnet::token_balance(&reader, s.token, payee.account())
        .await
        .unwrap();
    assert_eq!(after.0 - before.0, 20_000);
    let totals = payee.totals();
    assert_eq!(
        (
            totals.authorised_units,
            totals.redeemed_units,
            totals.redeemable_units
        ),
        (20_000, 20_000, 0)
    );
    // Offering the same authorisation again changes nothing: nothing more is redeemed.
    payee.offer(&buyer, &second.frames, now).await.unwrap();
    assert!(payee.settle_round(now).await.unwrap().is_empty());
    drop(payee);

    // A restarted provider remembers the buyer's account and authorisation.
    let reopened = Payee::new(
        s.provider_escrow.as_account(provider_key(&s)).unwrap(),
        &s.provider_node,
        s.provider_ledger.clone(),
        SETTINGS,
        now,
    )
    .await
    .unwrap();
    reopened.settle_round(now).await.unwrap();
    assert_eq!(reopened.totals().redeemed_units, 20_000);
    reopened.admit(&buyer, 1_000).unwrap();
    drop(reopened);

    // Keys are free: a provider keeps a bounded number of buyers. A newcomer takes the
    // place of one that owes and authorised nothing, and is refused when none does.
    let one = PayeeSettings {
        max_buyers: 1,
        ..SETTINGS
    };
    let chain = payer_chain(&s);
    let offer_as = |node: &Keypair| {
        chain
            .bind(node, Address::repeat_byte(0x77), 1, now)
            .unwrap()
    };
    let full = Payee::new(
        s.provider_escrow.as_account(provider_key(&s)).unwrap(),
        &s.provider_node,
        s.provider_ledger.clone(),
        one,
        now,
    )
    .await
    .unwrap();
    let newcomer = Keypair::from_secret([31; 32]);
    assert!(matches!(
        full.offer(&newcomer.node_id(), &[offer_as(&newcomer)], now)
            .await,
        Err(PayeeError::Full(1))
    ));
    let dir = tempfile::tempdir().unwrap();
    let empty = Arc::new(Ledger::open(dir.path()).unwrap());
    let churn = Payee::new(s.provider_escrow, &s.provider_node, empty.clone(), one, now)
        .await
        .unwrap();
    let (idle, next) = (
        Keypair::from_secret([32; 32]),
        Keypair::from_secret([33; 32]),
    );
    churn
        .offer(&idle.node_id(), &[offer_as(&idle)], now)
        .await
        .unwrap();
    churn
        .offer(&next.node_id(), &[offer_as(&next)], now)
        .await
        .unwrap();
    let kept: Vec<_> = empty
        .channel_records()
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        kept,
        vec![next.node_id()],
        "the idle buyer made room, in the ledger too"
    );
    assert_eq!(
        churn.admit(&idle.node_id(), 1).unwrap_err(),
        Unfunded::NoBinding(31337)
    );
    let _ = s.provider_dir;
}

impl Sides {
    /// The provider's settlement on its own ledger, as a node starts it.
    async fn payee(&self, settings: PayeeSettings, now: u64) -> Payee {
        let escrow = self.provider_escrow.as_account(provider_key(self)).unwrap();
        Payee::new(
            escrow,
            &self.provider_node,
            self.provider_ledger.clone(),
            settings,
            now,
        )
        .await
        .unwrap()
    }

    /// The buyer's settlement on its own ledger.
    async fn payer(&self, now: u64) -> Payer {
        let key = AccountKey::derive(&self.buyer_node.secret()).unwrap();
        let escrow = self.buyer_escrow.as_account(key).unwrap();
        Payer::new(
            escrow,
            self.buyer_node.clone(),
            self.buyer_ledger.clone(),
            now,
        )
        .await
        .unwrap()
    }
}

/// The exchange a gateway's first job and its next round make: the binding offered
/// and answered, then the final receipts authorised.
async fn bind_and_authorise(payee: &Payee, payer: &Payer, s: &Sides, now: u64) {
    let (buyer, provider) = (s.buyer_node.node_id(), s.provider_node.node_id());
    let first = payer.offer(&provider, now).unwrap();
    let answer = payee.offer(&buyer, &first.frames, now).await.unwrap();
    payer
        .answered(&provider, &first, Some(&answer), now)
        .unwrap();
    let second = payer.offer(&provider, now).unwrap();
    payee.offer(&buyer, &second.frames, now).await.unwrap();
    payer
        .answered(&provider, &second, Some(&answer), now)
        .unwrap();
}

fn provider_key(s: &Sides) -> AccountKey {
    AccountKey::derive(&s.provider_node.secret()).unwrap()
}

fn payer_chain(s: &Sides) -> sharemesh_settlement::offer::Chain {
    sharemesh_settlement::offer::Chain {
        chain_id: s.buyer_escrow.chain_id(),
        escrow: s.buyer_escrow.address(),
    }
}

#[tokio::test]
async fn a_buyer_cannot_move_its_channel_to_a_fresh_account_while_authorised_pay_is_unredeemed() {
    let s = sides().await;
    let now = now_ms();
    let buyer = s.buyer_node.node_id();
    let (payee, payer) = (s.payee(SETTINGS, now).await, s.payer(now).await);
    bind_and_authorise(&payee, &payer, &s, now).await;
    // The same node now binds an empty account: refused until the old one is redeemed.
    let chain = payer.chain();
    let rebound = chain
        .bind(
            &s.buyer_node,
            AccountKey::derive(&[99; 32]).unwrap().address(),
            2,
            now,
        )
        .unwrap();
    assert!(matches!(
        payee.offer(&buyer, &[rebound], now).await,
        Err(PayeeError::AccountChanged { .. })
    ));
}

#[tokio::test]
async fn a_receipt_just_final_is_no_reason_to_refuse_until_the_grace_is_over() {
    let s = sides().await;
    let now = now_ms();
    let (buyer, provider) = (s.buyer_node.node_id(), s.provider_node.node_id());
    let (payee, payer) = (s.payee(SETTINGS, now).await, s.payer(now).await);
    bind_and_authorise(&payee, &payer, &s, now).await;
    // A receipt final for 30 minutes, not yet in any authorisation (the buyer's next
    // round would carry it).
    let late = sealed_receipt(
        &s.buyer_node,
        &s.provider_node,
        3,
        1_000_000,
        now - 24 * HOUR - HOUR / 2,
    );
    s.buyer_ledger.record_receipt(&late, None).unwrap();
    s.provider_ledger.record_receipt(&late, None).unwrap();
    payee.settle_round(now).await.unwrap();
    payee.admit(&buyer, 1_000).unwrap();
    drop(payee);
    // With a grace of 10 minutes it is overdue: no credit until it is authorised.
    let strict = s
        .payee(
            PayeeSettings {
                authorisation_grace: std::time::Duration::from_secs(600),
                ..SETTINGS
            },
            now,
        )
        .await;
    strict.settle_round(now).await.unwrap();
    assert!(matches!(
        strict.admit(&buyer, 1_000),
        Err(Unfunded::Credit(CreditRefused::Unauthorised { .. }))
    ));
    assert_eq!(
        payer.due(now).unwrap(),
        vec![(provider, TokenUnits(21_000))]
    );
    let third = payer.offer(&provider, now).unwrap();
    assert_eq!(third.authorises, Some(TokenUnits(21_000)));
    strict.offer(&buyer, &third.frames, now).await.unwrap();
    strict.admit(&buyer, 1_000).unwrap();
}
