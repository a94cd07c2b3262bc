//! The buyer's side of on-chain settlement: offers its binding to each provider it
//! uses (once per run, before the first job there), learns the provider's account from
//! the answer, and signs for each channel exactly its final, unvoided receipts
//! ([`crate::owed`]) as they pass the dispute window.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use alloy_primitives::Address;
use serde::{Deserialize, Serialize};
use sharemesh_ledger::{Ledger, LedgerError, Side};
use sharemesh_protocol::{Keypair, NodeId, SignedEnvelope};

use crate::auth::AuthError;
use crate::evm::{Escrow, EscrowError};
use crate::offer::{to_wire, Chain, OfferError, AUTHORISATION_LIFETIME_MS};
use crate::units::{Scale, TokenUnits};

/// What the ledger keeps per provider (JSON in its `channels` tree).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Kept {
    account: Address,
    /// The newest cumulative amount signed for the channel.
    authorised: TokenUnits,
}

#[derive(Clone, Copy, Debug, Default)]
struct ProviderBook {
    /// The provider's account, once it answered an offer (`None`: not yet, or it does
    /// not settle on this chain).
    kept: Option<Kept>,
    /// Offered this run (the provider has this buyer's binding).
    offered: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PayerError {
    #[error(transparent)]
    Offer(#[from] OfferError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Chain(#[from] EscrowError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("sealing a settlement message: {0}")]
    Seal(String),
}

/// An offer ready to send to one provider.
#[derive(Debug)]
pub struct Offer {
    pub frames: Vec<SignedEnvelope>,
    /// The cumulative amount its authorisation signs (`None`: no authorisation in it).
    pub authorises: Option<TokenUnits>,
}

/// Totals over every provider, for metrics and the console.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PayerTotals {
    pub providers: u64,
    pub authorised_units: u128,
}

pub struct Payer {
    escrow: Escrow,
    chain: Chain,
    key: Arc<Keypair>,
    /// Envelope sequence numbers (from the start time, so a restart never reuses one).
    seq: std::sync::atomic::AtomicU64,
    binding: SignedEnvelope,
    scale: Scale,
    ledger: Arc<Ledger>,
    books: Mutex<HashMap<NodeId, ProviderBook>>,
}

impl Payer {
    pub async fn new(
        escrow: Escrow,
        key: Arc<Keypair>,
        ledger: Arc<Ledger>,
        now_ms: u64,
    ) -> Result<Self, PayerError> {
        let scale = escrow.scale().await?;
        let (chain, binding) = Chain::bind_escrow_account(&escrow, &key, now_ms)
            .map_err(|e| PayerError::Seal(e.to_string()))?;
        let mut books = HashMap::new();
        for (provider, bytes) in ledger.channel_records()? {
            match serde_json::from_slice::<Kept>(&bytes) {
                Ok(kept) => {
                    books.insert(
                        provider,
                        ProviderBook {
                            kept: Some(kept),
                            offered: false,
                        },
                    );
                }
                Err(err) => {
                    tracing::warn!(%provider, %err, "skipping an unreadable channel record")
                }
            }
        }
        Ok(Payer {
            escrow,
            chain,
            key,
            seq: std::sync::atomic::AtomicU64::new(now_ms.saturating_add(1)),
            binding,
            scale,
            ledger,
            books: Mutex::new(books),
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

    /// The escrow client (to read this buyer's deposit).
    pub fn escrow(&self) -> &Escrow {
        &self.escrow
    }

    /// Whether `provider` has not had this buyer's binding yet in this run.
    pub fn needs_offer(&self, provider: &NodeId) -> bool {
        !self.lock().get(provider).is_some_and(|book| book.offered)
    }

    /// Offers to `provider` again before the next job there (it refused one `Unfunded`:
    /// it may have lost this buyer's binding).
    pub fn forget_offer(&self, provider: &NodeId) {
        if let Some(book) = self.lock().get_mut(provider) {
            book.offered = false;
        }
    }

    /// The offer for `provider` at `now_ms`: the binding, and an authorisation for the
    /// channel's final receipts if they grew past what was signed. Reads the ledger.
    pub fn offer(&self, provider: &NodeId, now_ms: u64) -> Result<Offer, PayerError> {
        let known = self
            .lock()
            .get(provider)
            .and_then(|book| book.kept)
            .is_some();
        let owed = if known {
            let money = self
                .ledger
                .channel_settlement(&self.key.node_id(), provider, now_ms)?;
            Some(self.scale.units_of(u128::from(money.final_nano_usd)))
        } else {
            None
        };
        self.offer_owing(provider, owed, now_ms)
    }

    /// The offer for `provider` when the channel's final receipts are `owed` (read by
    /// [`Payer::due`]; `None`: authorise nothing).
    pub fn offer_owing(
        &self,
        provider: &NodeId,
        owed: Option<TokenUnits>,
        now_ms: u64,
    ) -> Result<Offer, PayerError> {
        let mut frames = vec![self.binding.clone()];
        let kept = self.lock().get(provider).and_then(|book| book.kept);
        let (Some(kept), Some(owed)) = (kept, owed) else {
            return Ok(Offer {
                frames,
                authorises: None,
            });
        };
        if owed <= kept.authorised {
            return Ok(Offer {
                frames,
                authorises: None,
            });
        }
        let auth = self.escrow.authorise(kept.account, owed)?;
        let wire = to_wire(&auth, self.key.node_id(), *provider);
        frames.push(
            self.key
                .seal(
                    &wire,
                    self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    now_ms,
                    AUTHORISATION_LIFETIME_MS,
                )
                .map_err(|e| PayerError::Seal(e.to_string()))?,
        );
        Ok(Offer {
            frames,
            authorises: Some(owed),
        })
    }

    /// What `provider` answered to `offer`: its binding (it settles here), or nothing
    /// (it does not settle on this chain and escrow; it may still serve on its own
    /// terms). What was authorised counts once the provider took the offer.
    pub fn answered(
        &self,
        provider: &NodeId,
        offer: &Offer,
        answer: Option<&SignedEnvelope>,
        now_ms: u64,
    ) -> Result<(), PayerError> {
        let account = answer
            .map(|binding| self.chain.open_binding(binding, provider, now_ms))
            .transpose()?;
        let kept = {
            let mut books = self.lock();
            let book = books.entry(*provider).or_default();
            book.offered = true;
            match account {
                None => None,
                Some(account) => {
                    let authorised = match book.kept {
                        Some(kept) if kept.account == account => {
                            kept.authorised.max(offer.authorises.unwrap_or_default())
                        }
                        _ => TokenUnits(0),
                    };
                    book.kept = Some(Kept {
                        account,
                        authorised,
                    });
                    book.kept
                }
            }
        };
        if let Some(kept) = kept {
            let bytes = serde_json::to_vec(&kept).map_err(|e| PayerError::Seal(e.to_string()))?;
            self.ledger.save_channel(provider, &bytes)?;
        }
        Ok(())
    }

    /// Providers whose channel's final receipts grew past what was signed, with what
    /// they now come to: each is due an offer carrying a new authorisation. One pass
    /// over the ledger.
    pub fn due(&self, now_ms: u64) -> Result<Vec<(NodeId, TokenUnits)>, PayerError> {
        let channels = self
            .ledger
            .channels_of(&self.key.node_id(), Side::Spend, now_ms)?;
        let books = self.lock();
        Ok(books
            .iter()
            .filter_map(|(provider, book)| {
                let kept = book.kept?;
                let owed = self
                    .scale
                    .units_of(u128::from(channels.get(provider)?.final_nano_usd));
                (owed > kept.authorised).then_some((*provider, owed))
            })
            .collect())
    }

    pub fn totals(&self) -> PayerTotals {
        let books = self.lock();
        PayerTotals {
            providers: books.values().filter(|b| b.kept.is_some()).count() as u64,
            authorised_units: books
                .values()
                .filter_map(|b| b.kept)
                .map(|k| k.authorised.0)
                .sum(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, ProviderBook>> {
        self.books
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
