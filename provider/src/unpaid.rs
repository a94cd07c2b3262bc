//! Work buyers took without paying, and what that costs them. A provider streams ahead
//! of a buyer's receipts (the credit window), so a buyer that stops paying, or leaves
//! without paying, takes up to a window of tokens (and the prompt's prefill) for free.
//! Keys are free to make, so every job's unpaid tokens (sent minus receipted, less its
//! first token: a standby warm-up's one unbilled token is the provider's bid) are
//! counted for an hour against the key and against the network origin it connects
//! from:
//!
//! - a key whose unpaid tokens in the last hour reach [`UNPAID_ALLOWANCE`] plus an
//!   eighth of what it paid in that hour is refused (an honest gateway leaves a few
//!   tokens in flight when it drops a hedge or its client leaves; it pays for every
//!   token it received, SPEC §8);
//! - once the keys of one origin, newcomers and paying buyers alike, left
//!   [`ORIGIN_UNPAID_ALLOWANCE`] tokens unpaid in the last hour beyond an eighth of
//!   what each paid, keys from there are refused, except paying buyers whose payments
//!   cover what they took (a key that paid for one token is no longer a newcomer, and
//!   keys are free: a crowd that each paid once must not get a key's allowance each);
//! - a newcomer runs at most [`NEWCOMER_JOBS_PER_BUYER`] jobs at once, and newcomers from
//!   one origin [`NEWCOMER_JOBS_PER_ORIGIN`], until a receipt makes them paying buyers.
//!
//! Prefill is work too, and the receipts leave some of it unpaid: a job's prompt is paid
//! with its first receipt, so a job that ends before one (a one-token job never
//! receipted, a stream closed right after `Accept`) had its whole prompt prefilled for
//! nothing, and a resume's prompt and resumed tokens are never billed (SPEC §8). Every
//! job's unpaid prefill (the positions the engine prefilled, its reused prefix aside,
//! that no receipt bills) is counted the same way: a key whose unpaid prefill in the last
//! hour reaches its allowance (a minute of this provider's measured prefill, at least
//! [`FREE_PREFILL_FLOOR`] tokens, plus [`FREE_PREFILL_PER_PAID_TOKEN`] per token it paid
//! for) is refused; and once the keys of one origin, paying buyers included, took
//! [`ORIGIN_PREFILL_SHARES`] allowances beyond what their payments earned, a key from
//! there is refused unless its own payments cover what it asks for.
//!
//! Pure: time is an argument.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use sharemesh_protocol::{NodeId, RejectReason};

mod origin;
mod tally;

pub use origin::Origin;
pub use tally::Tally;
use tally::{Excess, KeyTotals};

/// Tokens a key may leave unpaid in an hour beyond an eighth of what it paid (two
/// newcomer windows).
pub const UNPAID_ALLOWANCE: u64 = 32;
/// Tokens the keys of one origin may leave unpaid in an hour together beyond an eighth of
/// what each paid (eight newcomer windows).
pub const ORIGIN_UNPAID_ALLOWANCE: u64 = 128;
/// Jobs a buyer that has never paid here may run at once.
pub const NEWCOMER_JOBS_PER_BUYER: u32 = 4;
/// Jobs newcomers from one origin may run at once.
pub const NEWCOMER_JOBS_PER_ORIGIN: u32 = 16;
/// Unpaid prefill a key may take in an hour at least, whatever the measured speed (eight
/// full 8k-token contexts).
pub const FREE_PREFILL_FLOOR: u64 = 65_536;
/// Seconds of this provider's measured prefill a key may take unpaid in an hour.
pub const FREE_PREFILL_SECONDS: u64 = 60;
/// Unpaid prefill each paid token adds to its key's allowance (a gateway that hedges or
/// warms a standby here, and also buys here, is never held by its own stray prefill).
pub const FREE_PREFILL_PER_PAID_TOKEN: u64 = 8;
/// Key allowances of unpaid prefill the keys of one origin share beyond what their
/// payments earned.
pub const ORIGIN_PREFILL_SHARES: u64 = 4;
/// How long a job's tokens count.
pub const REMEMBERED_MS: u64 = 3_600_000;
/// Jobs remembered at most (the oldest are forgotten first).
const MAX_JOBS: usize = 10_000;

/// Who asks for a job, as the unpaid-work rules see it.
#[derive(Clone, Debug)]
pub struct Asker {
    pub buyer: NodeId,
    pub origin: Origin,
    /// Has never paid this provider a receipt (since it started).
    pub newcomer: bool,
    /// What the job it asks for could leave unpaid (none for a quote).
    pub at_risk: AtRisk,
}

/// What one job could leave unpaid: the positions it prefills (`JobRequest::
/// unpaid_prefill_bound`) and the completion tokens of its credit window.
#[derive(Clone, Copy, Debug, Default)]
pub struct AtRisk {
    pub prefill: u64,
    pub tokens: u64,
}

/// One finished job: whose, and its tally.
#[derive(Debug)]
struct Dealt {
    buyer: NodeId,
    origin: Origin,
    tally: Tally,
    at_ms: u64,
}

#[derive(Debug, Default)]
struct Table {
    /// Unpaid prefill one key may take in an hour before its paid tokens add to it.
    prefill_allowance: u64,
    jobs: VecDeque<Dealt>,
    newcomer_jobs: HashMap<NodeId, u32>,
    origin_jobs: HashMap<Origin, u32>,
}

/// The jobs of the last hour and the newcomers' jobs in progress.
#[derive(Clone, Debug)]
pub struct UnpaidWork(Arc<Mutex<Table>>);

impl Default for UnpaidWork {
    /// A provider whose prefill speed was not measured: the floor.
    fn default() -> Self {
        Self::new(0)
    }
}

/// A newcomer's hold on its share of jobs: released when dropped.
#[derive(Debug)]
pub struct NewcomerSlot {
    asker: Asker,
    table: Arc<Mutex<Table>>,
}

impl Drop for NewcomerSlot {
    fn drop(&mut self) {
        if let Ok(mut table) = self.table.lock() {
            release(&mut table.newcomer_jobs, &self.asker.buyer);
            release(&mut table.origin_jobs, &self.asker.origin);
        }
    }
}

fn release<K: std::hash::Hash + Eq>(jobs: &mut HashMap<K, u32>, key: &K) {
    if let Some(count) = jobs.get_mut(key) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            jobs.remove(key);
        }
    }
}

type Refusal = (RejectReason, String);

impl UnpaidWork {
    /// The table of a provider that prefills `prefill_milli_tps` thousandths of a token
    /// per second (0: not measured): a key's unpaid prefill allowance is a minute of it,
    /// at least [`FREE_PREFILL_FLOOR`].
    pub fn new(prefill_milli_tps: u32) -> Self {
        let minute = u64::from(prefill_milli_tps) * FREE_PREFILL_SECONDS / 1000;
        Self(Arc::new(Mutex::new(Table {
            prefill_allowance: minute.max(FREE_PREFILL_FLOOR),
            ..Table::default()
        })))
    }

    /// What [`Self::admit`] would say now, without taking a slot (for quotes).
    pub fn check(&self, asker: &Asker, now_ms: u64) -> Result<(), Refusal> {
        let mut table = self.lock()?;
        table.forget_before(now_ms.saturating_sub(REMEMBERED_MS));
        table.check(asker)
    }

    /// Admits one job of `asker` at `now_ms`, or says why not; a newcomer's job holds
    /// its slot until the returned guard drops.
    pub fn admit(&self, asker: &Asker, now_ms: u64) -> Result<Option<NewcomerSlot>, Refusal> {
        let mut table = self.lock()?;
        table.forget_before(now_ms.saturating_sub(REMEMBERED_MS));
        table.check(asker)?;
        if !asker.newcomer {
            return Ok(None);
        }
        *table.newcomer_jobs.entry(asker.buyer).or_default() += 1;
        *table.origin_jobs.entry(asker.origin.clone()).or_default() += 1;
        Ok(Some(NewcomerSlot {
            asker: asker.clone(),
            table: self.0.clone(),
        }))
    }

    /// Remembers a finished job of `asker`'s, as `tally` counts it.
    pub fn ended(&self, asker: &Asker, tally: Tally, now_ms: u64) {
        if let Ok(mut table) = self.0.lock() {
            if table.jobs.len() >= MAX_JOBS {
                table.jobs.pop_front();
            }
            table.jobs.push_back(Dealt {
                buyer: asker.buyer,
                origin: asker.origin.clone(),
                tally,
                at_ms: now_ms,
            });
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Table>, Refusal> {
        self.0
            .lock()
            .map_err(|_| (RejectReason::Internal, "unpaid-work table poisoned".into()))
    }
}

impl Table {
    /// What `buyer` took and paid for in the last hour.
    fn key_totals(&self, buyer: &NodeId) -> KeyTotals {
        self.jobs
            .iter()
            .filter(|j| j.buyer == *buyer)
            .fold(KeyTotals::default(), |totals, job| totals.add(&job.tally))
    }

    /// The key's own allowances: unpaid tokens, then unpaid prefill.
    fn check_key(&self, buyer: &NodeId) -> Result<KeyTotals, Refusal> {
        let own = self.key_totals(buyer);
        let KeyTotals {
            unpaid,
            paid,
            prefill,
            paid_tokens,
        } = own;
        if unpaid >= UNPAID_ALLOWANCE.saturating_add(paid / 8) {
            return Err((
                RejectReason::NotAllowed,
                format!(
                    "this buyer left {unpaid} tokens unpaid here in the last hour \
                     (paid {paid})"
                ),
            ));
        }
        let allowance = own.earned_prefill().saturating_add(self.prefill_allowance);
        if prefill >= allowance {
            return Err((
                RejectReason::NotAllowed,
                format!(
                    "this buyer had {prefill} prompt tokens prefilled here unpaid in the \
                     last hour (its allowance {allowance}; paid for {paid_tokens})"
                ),
            ));
        }
        Ok(own)
    }

    /// What the keys of `origin` took beyond what their own payments earned, summed
    /// over all of them, newcomers and paying buyers alike: a key that paid for one
    /// token is no longer a newcomer, and keys are free, so each key's own floors
    /// ([`UNPAID_ALLOWANCE`], [`FREE_PREFILL_FLOOR`]) would otherwise be had again by
    /// every key of a crowd that each paid once (leaving windows unpaid, or carrying
    /// long prompts in `resume`, which bills none).
    fn origin_excess(&self, origin: &Origin) -> Excess {
        let mut keys: HashMap<NodeId, KeyTotals> = HashMap::new();
        for job in self.jobs.iter().filter(|j| j.origin == *origin) {
            let totals = keys.entry(job.buyer).or_default();
            *totals = totals.add(&job.tally);
        }
        keys.values().fold(Excess::default(), |sum, key| Excess {
            tokens: sum.tokens.saturating_add(key.excess_tokens()),
            prefill: sum.prefill.saturating_add(key.excess_prefill()),
        })
    }

    /// Refuses a key that would take more unpaid work when the keys of its origin took
    /// [`ORIGIN_UNPAID_ALLOWANCE`] tokens, or [`ORIGIN_PREFILL_SHARES`] key allowances
    /// of prefill, beyond what their payments earned. A paying buyer whose payments
    /// cover what it asks for is still served from there (a neighbour behind the same
    /// address or relay cannot have it refused): what it earned and has not taken covers
    /// all this job could leave unpaid, its prefill and its credit window. Judging a
    /// key by its past alone would let every key of a crowd that each paid once leave
    /// one job unpaid.
    fn check_origin(&self, asker: &Asker, own: KeyTotals) -> Result<(), Refusal> {
        let covered = !asker.newcomer
            && own.prefill_headroom() >= asker.at_risk.prefill
            && own.token_headroom() >= asker.at_risk.tokens;
        if covered {
            return Ok(());
        }
        let origin = &asker.origin;
        let taken = self.origin_excess(origin);
        let shared_prefill = self.prefill_allowance.saturating_mul(ORIGIN_PREFILL_SHARES);
        let what = if taken.tokens >= ORIGIN_UNPAID_ALLOWANCE {
            format!("left {} tokens unpaid", taken.tokens)
        } else if taken.prefill >= shared_prefill {
            format!(
                "had {} prompt tokens prefilled unpaid (their shared allowance {shared_prefill})",
                taken.prefill
            )
        } else {
            return Ok(());
        };
        Err((
            RejectReason::NotAllowed,
            format!(
                "buyers from {origin} {what} here beyond what they paid for in the last \
                 hour; buyers whose payments cover what they take are still served from there"
            ),
        ))
    }

    fn forget_before(&mut self, cutoff_ms: u64) {
        while self.jobs.front().is_some_and(|j| j.at_ms < cutoff_ms) {
            self.jobs.pop_front();
        }
    }

    fn check(&self, asker: &Asker) -> Result<(), Refusal> {
        let own = self.check_key(&asker.buyer)?;
        self.check_origin(asker, own)?;
        if !asker.newcomer {
            return Ok(());
        }
        let running = self.newcomer_jobs.get(&asker.buyer).copied().unwrap_or(0);
        if running >= NEWCOMER_JOBS_PER_BUYER {
            return Err((
                RejectReason::BuyerLimit,
                format!(
                    "a buyer that has not paid here yet runs at most \
                     {NEWCOMER_JOBS_PER_BUYER} jobs at once"
                ),
            ));
        }
        let from_origin = self.origin_jobs.get(&asker.origin).copied().unwrap_or(0);
        if from_origin >= NEWCOMER_JOBS_PER_ORIGIN {
            return Err((
                RejectReason::BuyerLimit,
                format!(
                    "buyers new here from {} run {from_origin} jobs already, their limit",
                    asker.origin
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
