//! Settlement: where what a buyer's receipts say it owes becomes money a provider holds.
//!
//! Two implementations of one [`Settlement`] trait:
//! - [`InLedger`]: today's accounting, the default for the demo and the lab. A provider's
//!   final receipts are its earnings; nothing leaves the ledgers.
//! - [`evm::Escrow`]: an escrow contract on an EVM chain holding buyers'
//!   deposits in an ERC-20 stablecoin. Per (buyer, provider) channel the buyer's node
//!   signs an EIP-712 [`auth::SpendingAuth`] for the cumulative amount of that provider's
//!   final, unvoided receipts ([`owed`]); the provider redeems the newest whenever it
//!   likes, one transaction per channel per settlement, never per job (SPEC.md §13).
//!
//! Nodes that settle on a chain do it through [`Payee`] (a provider: buyers' bindings and
//! authorisations kept, deposits read and authorisations redeemed through the
//! [`Settlement`] trait, credit at admission) and [`Payer`] (a buyer: its binding offered,
//! each channel's final receipts authorised); [`offer`] is what they exchange over the
//! mesh. Nothing in the token stream waits for a chain: authorisations are signed
//! offline, deposits are read in the background, and [`credit`] decides from the last
//! reading.

pub mod auth;
pub mod credit;
pub mod evm;
mod in_ledger;
pub mod key;
pub mod offer;
pub mod owed;
pub mod payee;
pub mod payer;
pub mod units;

pub use alloy_primitives::{Address, B256};
pub use auth::{Channel, SignedSpendingAuth, SpendingAuth};
pub use in_ledger::InLedger;
pub use key::AccountKey;
pub use payee::{Payee, PayeeSettings, Unfunded};
pub use payer::Payer;
pub use units::TokenUnits;

/// What a buyer's funds still cover, as its provider reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Accounting only: the buyer's own budgets are the limit (in-ledger settlement).
    Unbounded,
    /// An escrow's reading: what the deposit holds now and what this channel already
    /// paid out.
    Deposit {
        balance: TokenUnits,
        redeemed: TokenUnits,
        /// A withdrawal waiting for its notice to end: the balance may drop by this much
        /// once it does.
        withdrawal_pending: TokenUnits,
    },
}

/// What one redemption did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Redeemed {
    /// Moved to the provider now.
    pub paid: TokenUnits,
    /// Paid on the channel in all, after this redemption.
    pub redeemed: TokenUnits,
}

/// The one interface nodes settle through.
#[allow(async_fn_in_trait)]
pub trait Settlement {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Reads what `buyer`'s funds cover on the channel to `provider`.
    async fn coverage(&self, buyer: Address, provider: Address) -> Result<Coverage, Self::Error>;

    /// Turns the buyer's newest authorisation on a channel into money for its provider.
    async fn redeem(&self, auth: &SignedSpendingAuth) -> Result<Redeemed, Self::Error>;
}
