//! The escrow contract on a real devnet (anvil), driven by the node's own client: what
//! the contract refuses and what it pays, for the attacks a buyer or provider can try.

#![allow(clippy::unwrap_used)]

mod support;

use alloy_primitives::Address;
use sharemesh_ledger::Ledger;
use sharemesh_protocol::Keypair;
use sharemesh_settlement::credit::{may_extend, BuyerPosition, CreditLimits, CreditRefused};
use sharemesh_settlement::evm::contracts::EscrowRevert;
use sharemesh_settlement::evm::{devnet, Escrow, EscrowError};
use sharemesh_settlement::owed::channel_owed;
use sharemesh_settlement::units::Scale;
use sharemesh_settlement::{AccountKey, Coverage, Settlement, SignedSpendingAuth, TokenUnits};
use support::{key, Anvil};

/// Longer than the nodes' default dispute window (24 h), as SPEC requires.
const NOTICE_SECONDS: u64 = 3 * 24 * 3600;

struct Market {
    anvil: Anvil,
    token: Address,
    buyer: Escrow,
    provider: Escrow,
    other_provider: Escrow,
    buyer_node: Keypair,
    provider_node: Keypair,
}

impl Market {
    async fn open(deposit: u128) -> Market {
        let anvil = Anvil::start();
        let token = devnet::deploy_test_token(anvil.url.clone(), anvil.dev_key())
            .await
            .unwrap();
        let deployer = Escrow::deploy(anvil.url.clone(), anvil.dev_key(), token, NOTICE_SECONDS)
            .await
            .unwrap();
        // Nodes' chain accounts come from their ed25519 identities.
        let (buyer_node, provider_node) = (
            Keypair::from_secret([11; 32]),
            Keypair::from_secret([12; 32]),
        );
        let account = |node: &Keypair| AccountKey::derive(&node.secret()).unwrap();
        let buyer = deployer.as_account(account(&buyer_node)).unwrap();
        let provider = deployer.as_account(account(&provider_node)).unwrap();
        let other_provider = deployer.as_account(key(13)).unwrap();
        for who in [&buyer, &provider, &other_provider] {
            anvil.fund_gas(who.account()).await;
        }
        devnet::mint(&deployer, token, buyer.account(), TokenUnits(1_000_000))
            .await
            .unwrap();
        if deposit > 0 {
            buyer.deposit(token, TokenUnits(deposit)).await.unwrap();
        }
        Market {
            anvil,
            token,
            buyer,
            provider,
            other_provider,
            buyer_node,
            provider_node,
        }
    }

    async fn held_by(&self, who: &Escrow) -> TokenUnits {
        devnet::token_balance(&self.buyer, self.token, who.account())
            .await
            .unwrap()
    }

    fn auth(&self, to: &Escrow, cumulative: u128) -> SignedSpendingAuth {
        self.buyer
            .authorise(to.account(), TokenUnits(cumulative))
            .unwrap()
    }
}

fn reverted(result: Result<impl std::fmt::Debug, EscrowError>) -> EscrowRevert {
    match result {
        Err(EscrowError::Reverted(revert)) => revert,
        other => panic!("expected the escrow to revert, got {other:?}"),
    }
}

#[tokio::test]
async fn a_client_refuses_an_address_that_holds_another_contract() {
    let market = Market::open(0).await;
    // The test token is a contract, but not an escrow: nothing may be deposited there.
    let err = Escrow::connect(market.anvil.url.clone(), key(21), market.token)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, EscrowError::NotAnEscrow(..)), "{err}");
    let err = Escrow::connect(
        market.anvil.url.clone(),
        key(21),
        Address::repeat_byte(0x77),
    )
    .await
    .err()
    .unwrap();
    assert!(matches!(err, EscrowError::NoContract(..)), "{err}");
    // The escrow itself, deployed with its own token and notice, is recognised.
    Escrow::connect(market.anvil.url.clone(), key(21), market.buyer.address())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_contract_signs_the_same_digest_the_node_does() {
    let market = Market::open(0).await;
    let channel = market.buyer.channel_to(market.provider.account());
    assert_eq!(
        market
            .buyer
            .digest_on_chain(&channel, TokenUnits(12_345))
            .await
            .unwrap(),
        channel.digest(TokenUnits(12_345))
    );
}

#[tokio::test]
async fn a_provider_is_paid_what_the_buyer_signed_and_never_more() {
    let market = Market::open(1_000).await;
    let auth = market.auth(&market.provider, 300);
    // A provider that raises the amount breaks the signature.
    let mut raised = auth.clone();
    raised.cumulative = TokenUnits(900);
    assert!(matches!(
        reverted(market.provider.redeem_unchecked(&raised).await),
        EscrowRevert::BadSignature(_)
    ));
    let paid = market.provider.redeem(&auth).await.unwrap();
    assert_eq!(
        (paid.paid, paid.redeemed),
        (TokenUnits(300), TokenUnits(300))
    );
    // The same authorisation again pays nothing.
    assert!(matches!(
        reverted(market.provider.redeem(&auth).await),
        EscrowRevert::AlreadyRedeemed(_)
    ));
    // A newer one pays the difference; the older one replayed after it pays nothing.
    let newer = market.auth(&market.provider, 450);
    assert_eq!(
        market.provider.redeem(&newer).await.unwrap().paid,
        TokenUnits(150)
    );
    assert!(matches!(
        reverted(market.provider.redeem(&auth).await),
        EscrowRevert::AlreadyRedeemed(_)
    ));
    assert_eq!(market.held_by(&market.provider).await, TokenUnits(450));
    let state = market
        .buyer
        .account_state(market.buyer.account())
        .await
        .unwrap();
    assert_eq!(state.balance, TokenUnits(550));
}

#[tokio::test]
async fn an_authorisation_redeems_only_on_its_own_channel_chain_and_contract() {
    let market = Market::open(1_000).await;
    let for_provider = market.auth(&market.provider, 200);
    // Another provider submitting it: the contract binds the caller into the digest.
    assert!(matches!(
        reverted(market.other_provider.redeem_unchecked(&for_provider).await),
        EscrowRevert::BadSignature(_)
    ));
    // ...and the node refuses it before spending gas.
    assert!(matches!(
        market.other_provider.redeem(&for_provider).await,
        Err(EscrowError::ForeignChannel { .. })
    ));
    // Signed for another chain, or another escrow contract.
    let buyer_key = AccountKey::derive(&market.buyer_node.secret()).unwrap();
    let mut channel = market.buyer.channel_to(market.provider.account());
    channel.chain_id = 1;
    let other_chain = SignedSpendingAuth::sign(&buyer_key, channel, TokenUnits(200)).unwrap();
    assert!(matches!(
        reverted(market.provider.redeem_unchecked(&other_chain).await),
        EscrowRevert::BadSignature(_)
    ));
    let mut channel = market.buyer.channel_to(market.provider.account());
    channel.escrow = Address::repeat_byte(0x42);
    let other_contract = SignedSpendingAuth::sign(&buyer_key, channel, TokenUnits(200)).unwrap();
    assert!(matches!(
        reverted(market.provider.redeem_unchecked(&other_contract).await),
        EscrowRevert::BadSignature(_)
    ));
    // Signed by someone other than the buyer, for the buyer's channel.
    let mut forged = SignedSpendingAuth::sign(
        &key(99),
        sharemesh_settlement::Channel {
            buyer: key(99).address(),
            ..for_provider.channel
        },
        TokenUnits(200),
    )
    .unwrap();
    forged.channel.buyer = market.buyer.account();
    assert!(matches!(
        reverted(market.provider.redeem_unchecked(&forged).await),
        EscrowRevert::BadSignature(_)
    ));
    assert_eq!(market.held_by(&market.provider).await, TokenUnits(0));
    // The genuine one still pays.
    assert_eq!(
        market.provider.redeem(&for_provider).await.unwrap().paid,
        TokenUnits(200)
    );
}

#[tokio::test]
async fn a_withdrawal_waits_out_its_notice_and_providers_redeem_during_it() {
    let market = Market::open(1_000).await;
    let owed = market.auth(&market.provider, 600);
    market
        .buyer
        .request_withdrawal(TokenUnits(1_000))
        .await
        .unwrap();
    assert!(matches!(
        reverted(market.buyer.withdraw().await),
        EscrowRevert::NoticeRunning(_)
    ));
    // The provider sees the withdrawal coming and redeems within the notice.
    let coverage = market
        .provider
        .coverage(market.buyer.account(), market.provider.account())
        .await
        .unwrap();
    assert_eq!(
        coverage,
        Coverage::Deposit {
            balance: TokenUnits(1_000),
            redeemed: TokenUnits(0),
            withdrawal_pending: TokenUnits(1_000)
        }
    );
    market.anvil.advance(NOTICE_SECONDS - 60).await;
    assert_eq!(
        market.provider.redeem(&owed).await.unwrap().paid,
        TokenUnits(600)
    );
    market.anvil.advance(120).await;
    // The buyer gets back what is left, not what it asked for.
    assert_eq!(market.buyer.withdraw().await.unwrap(), TokenUnits(400));
    assert_eq!(
        market.held_by(&market.buyer).await,
        TokenUnits(1_000_000 - 600)
    );
    assert!(matches!(
        reverted(market.buyer.withdraw().await),
        EscrowRevert::NothingToWithdraw(_)
    ));
}

#[tokio::test]
async fn a_deposit_that_runs_out_stops_credit_and_pays_what_it_holds() {
    let market = Market::open(100).await;
    // The provider's view mid-stream: 90 units of receipts so far, nothing redeemed; a
    // job of up to 20 more would exceed the deposit, so it gets no credit.
    let position = BuyerPosition {
        owed: TokenUnits(90),
        owed_final: TokenUnits(0),
        authorised: TokenUnits(0),
        redeemed: TokenUnits(0),
        deposit_balance: market
            .buyer
            .account_state(market.buyer.account())
            .await
            .unwrap()
            .balance,
        withdrawal_pending: TokenUnits(0),
    };
    let limits = CreditLimits {
        max_pending: TokenUnits(1_000),
    };
    may_extend(&position, &limits, TokenUnits(10)).unwrap();
    assert!(matches!(
        may_extend(&position, &limits, TokenUnits(20)),
        Err(CreditRefused::DepositExhausted { .. })
    ));
    // A buyer that authorised more than it holds: the provider takes what is there...
    let auth = market.auth(&market.provider, 150);
    let first = market.provider.redeem(&auth).await.unwrap();
    assert_eq!(
        (first.paid, first.redeemed),
        (TokenUnits(100), TokenUnits(100))
    );
    assert!(matches!(
        reverted(market.provider.redeem(&auth).await),
        EscrowRevert::DepositEmpty(_)
    ));
    // ...and the rest when the buyer tops up.
    market
        .buyer
        .deposit(market.token, TokenUnits(80))
        .await
        .unwrap();
    let rest = market.provider.redeem(&auth).await.unwrap();
    assert_eq!(
        (rest.paid, rest.redeemed),
        (TokenUnits(50), TokenUnits(150))
    );
    assert_eq!(market.held_by(&market.provider).await, TokenUnits(150));
}

#[tokio::test]
async fn the_buyer_authorises_final_receipts_and_voided_ones_are_never_paid() {
    let market = Market::open(100_000).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    const HOUR: u64 = 3_600_000;
    let now = 200 * 24 * HOUR;
    let book = |job: u8, nano: u64, at: u64| {
        let sealed =
            support::sealed_receipt(&market.buyer_node, &market.provider_node, job, nano, at);
        ledger.record_receipt(&sealed, None).unwrap();
        sealed
    };
    book(1, 20_000_000, now - 30 * HOUR); // final: 20_000 units
    book(2, 5_000_000, now - 2 * HOUR); // pending
    let proof = book(3, 9_000_000, now - HOUR); // pending, then voided
    let owed_now = channel_owed(
        &ledger,
        Scale::usdc(),
        &market.buyer_node.node_id(),
        &market.provider_node.node_id(),
        now,
    )
    .unwrap();
    assert_eq!(owed_now.final_units, TokenUnits(20_000));
    let first = market
        .buyer
        .authorise(market.provider.account(), owed_now.final_units)
        .unwrap();
    assert_eq!(
        market.provider.redeem(&first).await.unwrap().paid,
        TokenUnits(20_000)
    );

    // A fraud proof voids both pending receipts: a day later, when they would have been
    // final, the buyer's ledger still owes only the first, so that is all it authorises.
    ledger
        .record_fraud(&market.provider_node.node_id(), &proof, now)
        .unwrap();
    let later = now + 24 * HOUR;
    let owed_later = channel_owed(
        &ledger,
        Scale::usdc(),
        &market.buyer_node.node_id(),
        &market.provider_node.node_id(),
        later,
    )
    .unwrap();
    assert_eq!(owed_later.final_units, TokenUnits(20_000));
    assert!(matches!(
        reverted(
            market
                .provider
                .redeem(
                    &market
                        .buyer
                        .authorise(market.provider.account(), owed_later.final_units)
                        .unwrap()
                )
                .await
        ),
        EscrowRevert::AlreadyRedeemed(_)
    ));
    assert_eq!(market.held_by(&market.provider).await, TokenUnits(20_000));
}

/// The gas used by the last mined transaction (anvil mines one per block).
async fn last_gas(anvil: &Anvil) -> u64 {
    let rpc = sharemesh_settlement::evm::rpc::Rpc::new(anvil.url.clone()).unwrap();
    let block: serde_json::Value = rpc
        .request("eth_getBlockByNumber", serde_json::json!(["latest", false]))
        .await
        .unwrap();
    let gas = block["gasUsed"].as_str().unwrap().trim_start_matches("0x");
    u64::from_str_radix(gas, 16).unwrap()
}

/// What settling costs in gas (printed for README's table; the bounds catch a contract
/// change that makes a redemption several times dearer).
#[tokio::test]
async fn gas_per_deposit_and_redemption() {
    let market = Market::open(0).await;
    // A deposit is two transactions: the token's approve, then the escrow's deposit.
    market
        .buyer
        .deposit(market.token, TokenUnits(5_000))
        .await
        .unwrap();
    let deposit = last_gas(&market.anvil).await;
    let first = market.auth(&market.provider, 1_000);
    market.provider.redeem(&first).await.unwrap();
    let first_redemption = last_gas(&market.anvil).await;
    let later = market.auth(&market.provider, 2_000);
    market.provider.redeem(&later).await.unwrap();
    let later_redemption = last_gas(&market.anvil).await;
    println!(
        "gas: deposit {deposit} (plus the token's approve), first redemption on a channel \
         {first_redemption}, later redemptions {later_redemption}"
    );
    assert!(deposit < 120_000, "deposit {deposit}");
    assert!(
        first_redemption < 100_000,
        "first redemption {first_redemption}"
    );
    assert!(
        later_redemption < first_redemption,
        "{later_redemption} vs {first_redemption}"
    );
}
