//! The EVM adapter: a client for the escrow contract (`settlement/contracts/`), signing
//! its own transactions with the node's chain key and sending them over JSON-RPC.

pub mod contracts;
pub mod rpc;
mod tx;

use std::time::Duration;

use alloy_primitives::{Address, Bytes, B256, U256};
use alloy_sol_types::{SolCall, SolConstructor, SolEvent, SolInterface};

use crate::auth::{AuthError, Channel, SignedSpendingAuth};
use crate::key::AccountKey;
use crate::units::{Scale, TokenUnits, UnsupportedDecimals};
use crate::{Coverage, Redeemed, Settlement};
use contracts::{EscrowRevert, SharemeshEscrow, TestToken};
use rpc::{Rpc, RpcError, TxReceipt};
use tx::Eip1559Tx;

/// How long a sent transaction may take to be mined before the call gives up (it may
/// still be mined later; the next call's nonce accounts for it).
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(120);
const RECEIPT_POLL: Duration = Duration::from_millis(100);
/// No escrow or token call needs more (a first redemption is ~90k; an RPC node that
/// estimates more is wrong or lying, and the account would pay for it).
const MAX_CALL_GAS: u64 = 500_000;
/// The tip is capped at the base fee, or this much when the base fee is lower: an RPC
/// node suggesting a larger tip would spend the account's gas money on it.
const MIN_PRIORITY_CAP: u128 = 2_000_000_000;

#[derive(Debug, thiserror::Error)]
pub enum EscrowError {
    #[error(transparent)]
    Rpc(#[from] RpcError),
    #[error("the escrow refused: {}", contracts::describe(.0))]
    Reverted(EscrowRevert),
    #[error("the token contract refused the call: {0}")]
    TokenRefused(String),
    #[error("transaction {0} was mined but failed")]
    Failed(B256),
    #[error("transaction {0} was not mined within {1:?}")]
    Unconfirmed(B256, Duration),
    #[error("no contract at {0} on chain {1}")]
    NoContract(Address, u64),
    #[error("the contract at {0} on chain {1} is not a sharemesh escrow (its code differs)")]
    NotAnEscrow(Address, u64),
    #[error("the deployment transaction {0} created no contract")]
    NotDeployed(B256),
    #[error("unreadable answer from the contract: {0}")]
    Decode(String),
    #[error("the authorisation is for {got:?}, this escrow client serves {expected:?}")]
    ForeignChannel {
        got: Box<Channel>,
        expected: Box<Channel>,
    },
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("the chain's node estimates {0} gas for an escrow call, more than any needs")]
    ImplausibleGas(u64),
    #[error("the chain reported an amount over 128 bits")]
    AmountOverflow,
    #[error(transparent)]
    Token(UnsupportedDecimals),
}

/// A buyer's account in the escrow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccountState {
    pub balance: TokenUnits,
    pub withdrawal_amount: TokenUnits,
    /// Unix seconds; 0 when no withdrawal is requested.
    pub withdrawable_at: u64,
}

/// A client of one escrow contract on one chain, acting as one account.
pub struct Escrow {
    rpc: Rpc,
    key: AccountKey,
    chain_id: u64,
    address: Address,
    /// One transaction at a time per account: nonces are read, not tracked.
    sending: tokio::sync::Mutex<()>,
    confirm_timeout: Duration,
    /// The stablecoin, read once: it is immutable in the contract.
    token: tokio::sync::OnceCell<Address>,
}

/// (tip, fee cap) for a base fee and the tip an RPC node suggests: the tip at most the
/// base fee (or [`MIN_PRIORITY_CAP`] when that is lower), the cap twice the base fee plus
/// the tip, so a base fee that doubles before inclusion still fits.
fn fees_to_offer(base_fee: u128, asked_priority: u128) -> (u128, u128) {
    let priority = asked_priority.min(base_fee.max(MIN_PRIORITY_CAP));
    (
        priority,
        base_fee.saturating_mul(2).saturating_add(priority),
    )
}

fn units(value: U256) -> Result<TokenUnits, EscrowError> {
    TokenUnits::from_u256(value).ok_or(EscrowError::AmountOverflow)
}

impl Escrow {
    /// Connects to the escrow at `address`, checking that code is deployed there.
    pub async fn connect(
        url: reqwest::Url,
        key: AccountKey,
        address: Address,
    ) -> Result<Self, EscrowError> {
        let rpc = Rpc::new(url)?;
        let chain_id = rpc.chain_id().await?;
        let code = rpc.code(address).await?;
        if code.is_empty() {
            return Err(EscrowError::NoContract(address, chain_id));
        }
        if !contracts::is_escrow_code(&code) {
            return Err(EscrowError::NotAnEscrow(address, chain_id));
        }
        Ok(Self::with(rpc, key, chain_id, address))
    }

    fn with(rpc: Rpc, key: AccountKey, chain_id: u64, address: Address) -> Self {
        Escrow {
            rpc,
            key,
            chain_id,
            address,
            sending: tokio::sync::Mutex::new(()),
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            token: tokio::sync::OnceCell::new(),
        }
    }

    /// Deploys a new escrow for `token` with `notice_seconds` of withdrawal notice.
    pub async fn deploy(
        url: reqwest::Url,
        key: AccountKey,
        token: Address,
        notice_seconds: u64,
    ) -> Result<Self, EscrowError> {
        let rpc = Rpc::new(url)?;
        let chain_id = rpc.chain_id().await?;
        let mut code = contracts::escrow_bytecode().to_vec();
        code.extend(
            SharemeshEscrow::constructorCall {
                token_: token,
                noticeSeconds_: notice_seconds,
            }
            .abi_encode(),
        );
        let deployer = Self::with(rpc, key, chain_id, Address::ZERO);
        let receipt = deployer.send(None, code.into()).await?;
        let address = receipt
            .contract_address
            .ok_or(EscrowError::NotDeployed(receipt.transaction_hash))?;
        Ok(Escrow {
            address,
            ..deployer
        })
    }

    /// Another account's client of the same escrow (tests and the devnet command).
    pub fn as_account(&self, key: AccountKey) -> Result<Self, EscrowError> {
        Ok(Self::with(
            Rpc::new(self.rpc_url())?,
            key,
            self.chain_id,
            self.address,
        ))
    }

    fn rpc_url(&self) -> reqwest::Url {
        self.rpc.url().clone()
    }

    pub fn address(&self) -> Address {
        self.address
    }

    pub fn chain_id(&self) -> u64 {
        self.chain_id
    }

    pub fn account(&self) -> Address {
        self.key.address()
    }

    pub fn set_confirm_timeout(&mut self, timeout: Duration) {
        self.confirm_timeout = timeout;
    }

    /// This (buyer) account's channel toward `provider`.
    pub fn channel_to(&self, provider: Address) -> Channel {
        Channel {
            chain_id: self.chain_id,
            escrow: self.address,
            buyer: self.key.address(),
            provider,
        }
    }

    /// Signs, offline, that the channel to `provider` may pay `cumulative` in all.
    pub fn authorise(
        &self,
        provider: Address,
        cumulative: TokenUnits,
    ) -> Result<SignedSpendingAuth, AuthError> {
        SignedSpendingAuth::sign(&self.key, self.channel_to(provider), cumulative)
    }

    /// Approves the escrow to take `amount` of `token` and deposits it.
    pub async fn deposit(&self, token: Address, amount: TokenUnits) -> Result<(), EscrowError> {
        let approve = TestToken::approveCall {
            spender: self.address,
            amount: amount.to_u256(),
        };
        self.send_to_token(token, approve.abi_encode()).await?;
        let call = SharemeshEscrow::depositCall {
            amount: amount.to_u256(),
        };
        self.send(Some(self.address), call.abi_encode().into())
            .await?;
        Ok(())
    }

    pub async fn request_withdrawal(&self, amount: TokenUnits) -> Result<(), EscrowError> {
        let call = SharemeshEscrow::requestWithdrawalCall {
            amount: amount.to_u256(),
        };
        self.send(Some(self.address), call.abi_encode().into())
            .await?;
        Ok(())
    }

    /// Withdraws what the notice released; returns the amount paid out.
    pub async fn withdraw(&self) -> Result<TokenUnits, EscrowError> {
        let receipt = self
            .send(
                Some(self.address),
                SharemeshEscrow::withdrawCall {}.abi_encode().into(),
            )
            .await?;
        let event = self.event::<SharemeshEscrow::Withdrawn>(&receipt)?;
        units(event.amount)
    }

    /// Redeems a buyer's authorisation on this (provider) account's channel.
    pub async fn redeem(&self, auth: &SignedSpendingAuth) -> Result<Redeemed, EscrowError> {
        let expected = Channel {
            buyer: auth.channel.buyer,
            ..self.channel_to(self.key.address())
        };
        if auth.channel != expected {
            return Err(EscrowError::ForeignChannel {
                got: Box::new(auth.channel),
                expected: Box::new(expected),
            });
        }
        auth.verify()?;
        self.redeem_unchecked(auth).await
    }

    /// Sends a redemption as given, without the local checks [`Escrow::redeem`] makes
    /// first: the tests of the contract's own checks use it.
    #[doc(hidden)]
    pub async fn redeem_unchecked(
        &self,
        auth: &SignedSpendingAuth,
    ) -> Result<Redeemed, EscrowError> {
        let call = SharemeshEscrow::redeemCall {
            buyer: auth.channel.buyer,
            cumulative: auth.cumulative.to_u256(),
            v: auth.v(),
            r: auth.r,
            s: auth.s,
        };
        let receipt = self
            .send(Some(self.address), call.abi_encode().into())
            .await?;
        let event = self.event::<SharemeshEscrow::Redeemed>(&receipt)?;
        let redeemed = self
            .redeemed(auth.channel.buyer, self.key.address())
            .await?;
        Ok(Redeemed {
            paid: units(event.paid)?,
            redeemed,
        })
    }

    /// The stablecoin the escrow holds.
    pub async fn token(&self) -> Result<Address, EscrowError> {
        self.token
            .get_or_try_init(|| self.view(SharemeshEscrow::tokenCall {}))
            .await
            .copied()
    }

    /// How the escrow's token relates to the ledger's nano-USD (its `decimals()`).
    pub async fn scale(&self) -> Result<Scale, EscrowError> {
        let token = self.token().await?;
        let answer = self
            .rpc
            .call(token, &TestToken::decimalsCall {}.abi_encode().into())
            .await?;
        let decimals = TestToken::decimalsCall::abi_decode_returns(&answer)
            .map_err(|e| EscrowError::Decode(e.to_string()))?;
        Scale::for_decimals(decimals).map_err(EscrowError::Token)
    }

    /// What `owner` holds of the escrow's token, outside the escrow.
    pub async fn token_balance(&self, owner: Address) -> Result<TokenUnits, EscrowError> {
        let token = self.token().await?;
        devnet::token_balance(self, token, owner).await
    }

    pub async fn account_state(&self, buyer: Address) -> Result<AccountState, EscrowError> {
        let state = self.view(SharemeshEscrow::accountsCall(buyer)).await?;
        Ok(AccountState {
            balance: units(state.balance)?,
            withdrawal_amount: units(state.withdrawalAmount)?,
            withdrawable_at: state.withdrawableAt,
        })
    }

    pub async fn redeemed(
        &self,
        buyer: Address,
        provider: Address,
    ) -> Result<TokenUnits, EscrowError> {
        units(
            self.view(SharemeshEscrow::redeemedCall {
                _0: buyer,
                _1: provider,
            })
            .await?,
        )
    }

    /// The contract's own EIP-712 digest (to check it matches [`Channel::digest`]).
    pub async fn digest_on_chain(
        &self,
        channel: &Channel,
        cumulative: TokenUnits,
    ) -> Result<B256, EscrowError> {
        self.view(SharemeshEscrow::spendingAuthDigestCall {
            buyer: channel.buyer,
            provider: channel.provider,
            cumulative: cumulative.to_u256(),
        })
        .await
    }

    async fn view<C: SolCall>(&self, call: C) -> Result<C::Return, EscrowError> {
        let answer = self
            .rpc
            .call(self.address, &call.abi_encode().into())
            .await?;
        C::abi_decode_returns(&answer).map_err(|e| EscrowError::Decode(e.to_string()))
    }

    fn event<E: SolEvent>(&self, receipt: &TxReceipt) -> Result<E, EscrowError> {
        receipt
            .logs
            .iter()
            .filter(|log| log.address == self.address)
            .find(|log| log.topics.first() == Some(&E::SIGNATURE_HASH))
            .ok_or_else(|| EscrowError::Decode(format!("no {} event", E::SIGNATURE)))
            .and_then(|log| {
                E::decode_raw_log(log.topics.iter().copied(), &log.data)
                    .map_err(|e| EscrowError::Decode(e.to_string()))
            })
    }

    async fn send_to_token(
        &self,
        token: Address,
        input: Vec<u8>,
    ) -> Result<TxReceipt, EscrowError> {
        self.send(Some(token), input.into())
            .await
            .map_err(|e| match e {
                // The escrow's errors do not decode a token's revert.
                EscrowError::Reverted(_) => EscrowError::TokenRefused(e.to_string()),
                other => other,
            })
    }

    /// Estimates (a revert surfaces here, decoded), signs, sends, and waits for the receipt.
    async fn send(&self, to: Option<Address>, input: Bytes) -> Result<TxReceipt, EscrowError> {
        let _one_at_a_time = self.sending.lock().await;
        let from = self.key.address();
        let gas = self.rpc.estimate_gas(from, to, &input).await.map_err(|e| {
            match e.revert_data().map(|d| EscrowRevert::abi_decode(d)) {
                Some(Ok(revert)) => EscrowError::Reverted(revert),
                _ => EscrowError::Rpc(e),
            }
        })?;
        // The RPC node's numbers decide what this account pays: bounded, not believed.
        if to.is_some() && gas > MAX_CALL_GAS {
            return Err(EscrowError::ImplausibleGas(gas));
        }
        let nonce = self.rpc.nonce(from).await?;
        let (base_fee, asked_priority) = self.rpc.fees().await?;
        let (priority_fee, max_fee) = fees_to_offer(base_fee, asked_priority);
        let tx = Eip1559Tx {
            chain_id: self.chain_id,
            nonce,
            max_priority_fee_per_gas: priority_fee,
            max_fee_per_gas: max_fee,
            // Headroom: the estimate is for the state now, a block may move it.
            gas_limit: gas.saturating_add(gas / 4),
            to,
            input,
        };
        let hash = self.rpc.send_raw(tx.sign(&self.key)).await?;
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        loop {
            if let Some(receipt) = self.rpc.receipt(hash).await? {
                if !receipt.succeeded() {
                    return Err(EscrowError::Failed(hash));
                }
                return Ok(receipt);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(EscrowError::Unconfirmed(hash, self.confirm_timeout));
            }
            tokio::time::sleep(RECEIPT_POLL).await;
        }
    }
}

/// The escrow as the nodes' [`Settlement`].
impl Settlement for Escrow {
    type Error = EscrowError;

    async fn coverage(&self, buyer: Address, provider: Address) -> Result<Coverage, EscrowError> {
        let state = self.account_state(buyer).await?;
        Ok(Coverage::Deposit {
            balance: state.balance,
            redeemed: self.redeemed(buyer, provider).await?,
            withdrawal_pending: state.withdrawal_amount,
        })
    }

    async fn redeem(&self, auth: &SignedSpendingAuth) -> Result<Redeemed, EscrowError> {
        Escrow::redeem(self, auth).await
    }
}

pub mod devnet;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suggested_tip_is_capped_and_the_fee_cap_follows_the_base_fee() {
        const GWEI: u128 = 1_000_000_000;
        assert_eq!(fees_to_offer(10 * GWEI, GWEI), (GWEI, 21 * GWEI));
        // A lying node's 1000-gwei tip is cut to the base fee.
        assert_eq!(
            fees_to_offer(10 * GWEI, 1000 * GWEI),
            (10 * GWEI, 30 * GWEI)
        );
        // Under a tiny base fee (an L2) the tip may still reach 2 gwei.
        assert_eq!(
            fees_to_offer(GWEI / 100, 5 * GWEI),
            (2 * GWEI, 2 * GWEI + GWEI / 50)
        );
        assert_eq!(fees_to_offer(u128::MAX, 1).1, u128::MAX);
    }
}
