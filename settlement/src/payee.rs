//! The provider's side of on-chain settlement: keeps each buyer's bound account and
//! newest authorisation (durably, in the ledger), reads buyers' deposits in the
//! background, decides credit at admission from the last reading without waiting for
//! the chain ([`crate::credit::may_extend`]), and redeems what buyers authorised.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloy_primitives::Address;
use serde::{Deserialize, Serialize};
use sharemesh_ledger::{Ledger, LedgerError, Side};
use sharemesh_protocol::{Keypair, NodeId, SignedEnvelope};

use crate::credit::{may_extend, BuyerPosition, CreditLimits, CreditRefused};
use crate::evm::{Escrow, EscrowError};
use crate::offer::{Chain, OfferError};
use crate::units::{Scale, TokenUnits};
use crate::{Coverage, Settlement, SignedSpendingAuth};

/// How a provider settles.
#[derive(Clone, Copy, Debug)]
pub struct PayeeSettings {
    pub limits: CreditLimits,
    /// A channel is redeemed once its authorised-but-unredeemed amount reaches this
    /// (a redemption costs gas: see docs/operations.md for choosing it).
    pub min_redeem: TokenUnits,
    /// How long a receipt may be final before its buyer must have authorised it: a buyer
    /// authorises in rounds (a gateway every `--settle-every-secs`, 5 min by default), so
    /// a receipt that just became final is not yet a reason to refuse it
    /// ([`DEFAULT_AUTHORISATION_GRACE`]). What it owes meanwhile counts against
    /// `max_pending`.
    pub authorisation_grace: Duration,
    /// Buyers kept at most ([`DEFAULT_MAX_BUYERS`]). Keys are free, so a new buyer past
    /// the bound takes the place of one that owes nothing and authorised nothing; when
    /// none does, it is refused.
    pub max_buyers: usize,
}

/// What the chain said about one buyer, at the last reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reading {
    balance: TokenUnits,
    withdrawal_pending: TokenUnits,
    /// What this provider's channel from the buyer has paid out.
    redeemed: TokenUnits,
}

/// What the ledger keeps per buyer (JSON in its `channels` tree).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Kept {
    account: Address,
    authorisation: Option<SignedSpendingAuth>,
}

/// The usual authorisation grace: an hour, well above a gateway's default round.
pub const DEFAULT_AUTHORISATION_GRACE: Duration = Duration::from_secs(3600);
/// The usual bound on buyers kept (the ledger keeps at most as many records).
pub const DEFAULT_MAX_BUYERS: usize = sharemesh_ledger::MAX_CHANNEL_RECORDS;
/// An offer reads the buyer's deposit again only if the last reading is older than this
/// (offers are free to send; the provider's RPC node is not).
const OFFER_READ_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct BuyerBook {
    kept: Kept,
    reading: Option<Reading>,
    read_at: Option<Instant>,
    /// From the ledger's last pass: receipts not voided, and of them the final ones.
    owed_nano: u128,
    owed_final_nano: u128,
    /// The most that admitted jobs still running may cost.
    reserved_nano: u128,
    /// What jobs that ended since the last ledger pass may have cost (they count until
    /// the pass that sees their receipts).
    ended_nano: u128,
}

/// Why a job is refused credit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unfunded {
    #[error(
        "this provider settles on chain {0}; the buyer has not offered a settlement binding there"
    )]
    NoBinding(u64),
    #[error("the buyer's deposit has not been read yet")]
    NotRead,
    #[error(transparent)]
    Credit(#[from] CreditRefused),
}

#[derive(Debug, thiserror::Error)]
pub enum PayeeError {
    #[error(transparent)]
    Offer(#[from] OfferError),
    #[error(transparent)]
    Chain(#[from] EscrowError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("the buyer's account changed from {kept} to {offered} while {unredeemed} of its authorisation is unredeemed")]
    AccountChanged {
        kept: Address,
        offered: Address,
        unredeemed: TokenUnits,
    },
    #[error("sealing this provider's binding: {0}")]
    Seal(String),
    #[error(
        "this provider keeps as many buyers as it may ({0}), each owing or authorised something"
    )]
    Full(usize),
}

/// Totals over every buyer, for metrics and the console.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PayeeTotals {
    pub buyers: u64,
    /// Authorised by buyers (cumulative, all channels).
    pub authorised_units: u128,
    /// Paid out to this provider on chain.
    pub redeemed_units: u128,
    /// Authorised and not yet redeemed.
    pub redeemable_units: u128,
}

/// One redemption attempt.
#[derive(Debug)]
pub struct Redemption {
    pub buyer: NodeId,
    pub outcome: Result<crate::Redeemed, EscrowError>,
}

pub struct Payee {
    escrow: Escrow,
    chain: Chain,
    me: NodeId,
    binding: SignedEnvelope,
    scale: Scale,
    ledger: Arc<Ledger>,
    settings: PayeeSettings,
    books: Arc<Mutex<HashMap<NodeId, BuyerBook>>>,
}

/// A job's hold on its buyer's credit: what it may cost counts as owed until its
/// receipts are in the ledger's next pass.
#[derive(Debug)]
pub struct CreditHold {
    books: Arc<Mutex<HashMap<NodeId, BuyerBook>>>,
    buyer: NodeId,
    nano: u128,
}

impl Drop for CreditHold {
    fn drop(&mut self) {
        if let Ok(mut books) = self.books.lock() {
            if let Some(book) = books.get_mut(&self.buyer) {
                book.reserved_nano = book.reserved_nano.saturating_sub(self.nano);
                book.ended_nano = book.ended_nano.saturating_add(self.nano);
            }
        }
    }
}

impl Payee {
    /// Settles through `escrow` (this provider's account) as node `key`; buyers kept in
    /// `ledger` are loaded.
    pub async fn new(
        escrow: Escrow,
        key: &Keypair,
        ledger: Arc<Ledger>,
        settings: PayeeSettings,
        now_ms: u64,
    ) -> Result<Self, PayeeError> {
        let scale = escrow.scale().await?;
        let (chain, binding) = Chain::bind_escrow_account(&escrow, key, now_ms)
            .map_err(|e| PayeeError::Seal(e.to_string()))?;
        let mut books = HashMap::new();
        for (buyer, bytes) in ledger.channel_records()? {
            match serde_json::from_slice::<Kept>(&bytes) {
                Ok(kept) => {
                    books.insert(buyer, BuyerBook::new(kept));
                }
                Err(err) => tracing::warn!(%buyer, %err, "skipping an unreadable channel record"),
            }
        }
        Ok(Payee {
            escrow,
            chain,
            me: key.node_id(),
            binding,
            scale,
            ledger,
            settings,
            books: Arc::new(Mutex::new(books)),
        })
    }

    pub fn chain(&self) -> Chain {
        self.chain
    }

    pub fn account(&self) -> Address {
        self.escrow.account()
    }

    pub fn scale(&self) -> Scale {
        self.scale
    }

    /// Takes a buyer's offer (its binding, and maybe its newest authorisation) and
    /// answers with this provider's binding. The buyer's deposit is read before the
    /// answer, so its first job finds a reading (this stream is not a job's).
    pub async fn offer(
        &self,
        buyer: &NodeId,
        frames: &[SignedEnvelope],
        now_ms: u64,
    ) -> Result<SignedEnvelope, PayeeError> {
        let (binding, authorisation) = match frames {
            [binding] => (binding, None),
            [binding, authorisation] => (binding, Some(authorisation)),
            _ => return Err(OfferError::Shape.into()),
        };
        let account = self.chain.open_binding(binding, buyer, now_ms)?;
        let authorisation = authorisation
            .map(|a| {
                self.chain
                    .open_authorisation(a, buyer, account, self.account(), now_ms)
            })
            .transpose()?;
        let (kept, evicted) = self.keep(buyer, account, authorisation)?;
        let bytes = serde_json::to_vec(&kept).map_err(|e| PayeeError::Seal(e.to_string()))?;
        let (ledger, who) = (self.ledger.clone(), *buyer);
        tokio::task::spawn_blocking(move || {
            if let Some(evicted) = evicted {
                ledger.remove_channel(&evicted)?;
            }
            ledger.save_channel(&who, &bytes)
        })
        .await
        .map_err(|e| PayeeError::Seal(e.to_string()))??;
        let fresh = self
            .lock()
            .get(buyer)
            .and_then(|book| book.read_at)
            .is_some_and(|at| at.elapsed() < OFFER_READ_INTERVAL);
        if !fresh {
            self.read_deposit(buyer, account).await?;
        }
        Ok(self.binding.clone())
    }

    /// Updates the book of `buyer`: its account, and the authorisation if it is newer;
    /// with the buyer whose book made room for it, if one had to.
    fn keep(
        &self,
        buyer: &NodeId,
        account: Address,
        authorisation: Option<SignedSpendingAuth>,
    ) -> Result<(Kept, Option<NodeId>), PayeeError> {
        let mut books = self.lock();
        let mut evicted = None;
        let most = self.settings.max_buyers;
        if !books.contains_key(buyer) && books.len() >= most {
            let idle = books
                .iter()
                .find(|(_, book)| book.is_idle())
                .map(|(idle, _)| *idle)
                .ok_or(PayeeError::Full(most))?;
            books.remove(&idle);
            evicted = Some(idle);
        }
        let book = books.entry(*buyer).or_insert_with(|| {
            BuyerBook::new(Kept {
                account,
                authorisation: None,
            })
        });
        if book.kept.account != account {
            let unredeemed = book.unredeemed();
            if unredeemed > TokenUnits(0) {
                return Err(PayeeError::AccountChanged {
                    kept: book.kept.account,
                    offered: account,
                    unredeemed,
                });
            }
            *book = BuyerBook::new(Kept {
                account,
                authorisation: None,
            });
        }
        if let Some(auth) = authorisation {
            let newer = book
                .kept
                .authorisation
                .as_ref()
                .is_none_or(|kept| auth.cumulative > kept.cumulative);
            if newer {
                book.kept.authorisation = Some(auth);
            }
        }
        Ok((book.kept.clone(), evicted))
    }

    async fn read_deposit(&self, buyer: &NodeId, account: Address) -> Result<(), EscrowError> {
        let reading = match Settlement::coverage(&self.escrow, account, self.account()).await? {
            Coverage::Deposit {
                balance,
                redeemed,
                withdrawal_pending,
            } => Reading {
                balance,
                withdrawal_pending,
                redeemed,
            },
            // Not an escrow's answer; nothing is owed on chain then, nothing limits.
            Coverage::Unbounded => Reading {
                balance: TokenUnits(u128::MAX),
                withdrawal_pending: TokenUnits(0),
                redeemed: TokenUnits(0),
            },
        };
        if let Some(book) = self.lock().get_mut(buyer) {
            if book.kept.account == account {
                book.reading = Some(reading);
                book.read_at = Some(Instant::now());
            }
        }
        Ok(())
    }

    /// Whether a job of `buyer` that may cost up to `job_max_nano` gets credit; the hold
    /// keeps it counted while it runs. Never waits for the chain.
    pub fn admit(&self, buyer: &NodeId, job_max_nano: u128) -> Result<CreditHold, Unfunded> {
        let mut books = self.lock();
        let book = books
            .get_mut(buyer)
            .ok_or(Unfunded::NoBinding(self.chain.chain_id))?;
        let reading = book.reading.ok_or(Unfunded::NotRead)?;
        let owed = book
            .owed_nano
            .saturating_add(book.reserved_nano)
            .saturating_add(book.ended_nano);
        let position = BuyerPosition {
            owed: self.scale.units_of(owed),
            owed_final: self.scale.units_of(book.owed_final_nano),
            authorised: book.authorised(),
            redeemed: reading.redeemed,
            deposit_balance: reading.balance,
            withdrawal_pending: reading.withdrawal_pending,
        };
        // Rounded up: a job worth a fraction of a unit still needs that unit covered.
        let job = TokenUnits(self.scale.units_of(job_max_nano).0 + 1);
        may_extend(&position, &self.settings.limits, job)?;
        book.reserved_nano = book.reserved_nano.saturating_add(job_max_nano);
        Ok(CreditHold {
            books: self.books.clone(),
            buyer: *buyer,
            nano: job_max_nano,
        })
    }

    /// One settlement round: the ledger's view of every channel, every known buyer's
    /// deposit read again, and each channel whose redeemable amount reached the
    /// threshold redeemed. Returns the redemptions tried.
    pub async fn settle_round(&self, now_ms: u64) -> Result<Vec<Redemption>, PayeeError> {
        let ended_before: HashMap<NodeId, u128> = self
            .lock()
            .iter()
            .map(|(buyer, book)| (*buyer, book.ended_nano))
            .collect();
        let (ledger, me) = (self.ledger.clone(), self.me);
        // Final as of the grace ago: what the buyer must have authorised by now. Final and
        // pending together are every unvoided receipt, whatever the moment.
        let grace_ms =
            u64::try_from(self.settings.authorisation_grace.as_millis()).unwrap_or(u64::MAX);
        let as_of = now_ms.saturating_sub(grace_ms);
        let channels =
            tokio::task::spawn_blocking(move || ledger.channels_of(&me, Side::Earnings, as_of))
                .await
                .map_err(|e| PayeeError::Seal(e.to_string()))??;
        let accounts: Vec<(NodeId, Address)> = {
            let mut books = self.lock();
            for (buyer, book) in books.iter_mut() {
                let money = channels.get(buyer).cloned().unwrap_or_default();
                book.owed_final_nano = u128::from(money.final_nano_usd);
                book.owed_nano = book.owed_final_nano + u128::from(money.pending_nano_usd);
                let seen = ended_before.get(buyer).copied().unwrap_or(0);
                book.ended_nano = book.ended_nano.saturating_sub(seen);
            }
            books
                .iter()
                .map(|(b, book)| (*b, book.kept.account))
                .collect()
        };
        for (buyer, account) in &accounts {
            if let Err(err) = self.read_deposit(buyer, *account).await {
                tracing::warn!(%buyer, %err, "could not read a buyer's deposit");
            }
        }
        let due: Vec<(NodeId, SignedSpendingAuth)> = self
            .lock()
            .iter()
            .filter(|(_, book)| book.unredeemed() >= self.settings.min_redeem.max(TokenUnits(1)))
            .filter_map(|(buyer, book)| Some((*buyer, book.kept.authorisation.clone()?)))
            .collect();
        let mut redemptions = Vec::new();
        for (buyer, auth) in due {
            let outcome = Settlement::redeem(&self.escrow, &auth).await;
            if let Ok(redeemed) = &outcome {
                tracing::info!(%buyer, paid = redeemed.paid.0, "redeemed a buyer's authorisation");
                if let Some(reading) = self.lock().get_mut(&buyer).and_then(|b| b.reading.as_mut())
                {
                    reading.redeemed = redeemed.redeemed;
                    reading.balance = reading.balance.saturating_sub(redeemed.paid);
                }
            }
            redemptions.push(Redemption { buyer, outcome });
        }
        Ok(redemptions)
    }

    pub fn totals(&self) -> PayeeTotals {
        let books = self.lock();
        let mut totals = PayeeTotals {
            buyers: books.len() as u64,
            ..PayeeTotals::default()
        };
        for book in books.values() {
            totals.authorised_units += book.authorised().0;
            totals.redeemed_units += book.reading.map_or(0, |r| r.redeemed.0);
            totals.redeemable_units += book.unredeemed().0;
        }
        totals
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, BuyerBook>> {
        self.books
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl BuyerBook {
    fn new(kept: Kept) -> Self {
        BuyerBook {
            kept,
            reading: None,
            read_at: None,
            owed_nano: 0,
            owed_final_nano: 0,
            reserved_nano: 0,
            ended_nano: 0,
        }
    }

    /// Owes nothing, runs nothing, authorised nothing: its book can make room.
    fn is_idle(&self) -> bool {
        self.kept.authorisation.is_none()
            && self.owed_nano == 0
            && self.reserved_nano == 0
            && self.ended_nano == 0
    }

    fn authorised(&self) -> TokenUnits {
        self.kept
            .authorisation
            .as_ref()
            .map_or(TokenUnits(0), |a| a.cumulative)
    }

    /// Authorised and not yet paid out, as last read (all of it before any reading).
    fn unredeemed(&self) -> TokenUnits {
        self.authorised()
            .saturating_sub(self.reading.map_or(TokenUnits(0), |r| r.redeemed))
    }
}
