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

use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;
use sharemesh_protocol::{NodeId, RejectReason};

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
/// Key allowances of unpaid prefill the newcomers of one origin share.
pub const ORIGIN_PREFILL_SHARES: u64 = 4;
/// How long a job's tokens count.
pub const REMEMBERED_MS: u64 = 3_600_000;
/// Jobs remembered at most (the oldest are forgotten first).
const MAX_JOBS: usize = 10_000;

/// Where a buyer's connection comes from, as coarse as one host: an IPv4 address, an
/// IPv6 /64, a DNS name, or "memory" (every in-process peer is one host). A relayed
/// connection's origin is its relay's: everyone behind one relay shares it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Origin(String);

impl Origin {
    pub fn of(address: &Multiaddr) -> Self {
        for part in address.iter() {
            match part {
                Protocol::Ip4(ip) => return Self(ip.to_string()),
                Protocol::Ip6(ip) => {
                    let [a, b, c, d, ..] = ip.segments();
                    return Self(format!("{a:x}:{b:x}:{c:x}:{d:x}::/64"));
                }
                Protocol::Dns(name) | Protocol::Dns4(name) | Protocol::Dns6(name) => {
                    return Self(name.to_string())
                }
                Protocol::Memory(_) => return Self("memory".into()),
                _ => {}
            }
        }
        Self(address.to_string())
    }

    /// A peer whose address is not known (it disconnected already): all such share one.
    pub fn unknown() -> Self {
        Self("unknown".into())
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

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

/// What one job of a buyer's took and paid for, as the provider counted it (nothing
/// here is the buyer's word: the provider sent, prefilled and read the receipts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Completion tokens sent (resumed ones not included).
    pub sent: u64,
    /// Of those, the ones its receipts cover.
    pub paid: u64,
    /// Positions the engine prefilled: prompt and resumed tokens, less a prefix reused
    /// from its cache (all of them when the job ended before the engine said).
    pub prefilled: u64,
    /// Prompt tokens its receipts bill: all of a fresh job's prompt, none of a resume's.
    pub billed_prompt: u64,
}

impl Tally {
    /// Tokens sent and not paid for, less a job's first token: that one is the
    /// provider's bid (a gateway's standby warm-up is one unbilled token, SPEC §10), and
    /// counting it would have a provider refuse the gateways it stands by for.
    fn unpaid(&self) -> u64 {
        self.sent.saturating_sub(self.paid.max(1))
    }

    /// Prefill no receipt pays for: all of it before the first receipt (which pays the
    /// billed prompt), then what the receipts do not bill (a resume's prefill).
    fn unpaid_prefill(&self) -> u64 {
        if self.paid == 0 {
            self.prefilled
        } else {
            self.prefilled.saturating_sub(self.billed_prompt)
        }
    }

    /// Tokens its receipts paid for, prompt included.
    fn paid_tokens(&self) -> u64 {
        if self.paid == 0 {
            0
        } else {
            self.paid.saturating_add(self.billed_prompt)
        }
    }
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

/// What one key took and paid for in the last hour.
#[derive(Clone, Copy, Debug, Default)]
struct KeyTotals {
    /// Completion tokens sent and not paid for ([`Tally::unpaid`]).
    unpaid: u64,
    /// Completion tokens paid for.
    paid: u64,
    /// Prefill no receipt paid for.
    prefill: u64,
    /// Tokens paid for, prompts included.
    paid_tokens: u64,
}

impl KeyTotals {
    fn add(self, job: &Tally) -> Self {
        Self {
            unpaid: self.unpaid.saturating_add(job.unpaid()),
            paid: self.paid.saturating_add(job.paid),
            prefill: self.prefill.saturating_add(job.unpaid_prefill()),
            paid_tokens: self.paid_tokens.saturating_add(job.paid_tokens()),
        }
    }

    /// Unpaid prefill its payments earned ([`FREE_PREFILL_PER_PAID_TOKEN`] per token).
    fn earned_prefill(self) -> u64 {
        self.paid_tokens.saturating_mul(FREE_PREFILL_PER_PAID_TOKEN)
    }

    /// Unpaid tokens beyond the eighth of its paid ones it may leave.
    fn excess_tokens(self) -> u64 {
        self.unpaid.saturating_sub(self.paid / 8)
    }

    /// Unpaid prefill beyond what its payments earned.
    fn excess_prefill(self) -> u64 {
        self.prefill.saturating_sub(self.earned_prefill())
    }

    /// Unpaid tokens its payments earned (an eighth of them) and it has not left.
    fn token_headroom(self) -> u64 {
        (self.paid / 8).saturating_sub(self.unpaid)
    }

    /// Unpaid prefill its payments earned and it has not taken.
    fn prefill_headroom(self) -> u64 {
        self.earned_prefill().saturating_sub(self.prefill)
    }
}

/// What the keys of one origin took beyond what their payments earned.
#[derive(Clone, Copy, Debug, Default)]
struct Excess {
    tokens: u64,
    prefill: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job's completion tokens, sent and paid, with nothing prefilled.
    fn tokens(sent: u64, paid: u64) -> Tally {
        Tally {
            sent,
            paid,
            ..Tally::default()
        }
    }

    /// How many jobs like `job` `buyer` ends before it is refused (at most 1,000).
    fn jobs_until_refused(table: &UnpaidWork, buyer: &Asker, job: Tally) -> u64 {
        let mut served = 0;
        while table.check(buyer, 0).is_ok() {
            table.ended(buyer, job, 0);
            served += 1;
            assert!(served < 1_000, "never refused");
        }
        served
    }

    fn asker(n: u8, origin: &str, newcomer: bool) -> Asker {
        Asker {
            buyer: NodeId::from_bytes([n; 32]),
            origin: Origin(origin.into()),
            newcomer,
            at_risk: AtRisk::default(),
        }
    }

    /// `asker` asking for a job that prefills `prefill` positions, with a credit window
    /// of `tokens`.
    fn asking(asker: Asker, prefill: u64, tokens: u64) -> Asker {
        Asker {
            at_risk: AtRisk { prefill, tokens },
            ..asker
        }
    }

    #[test]
    fn origins_are_one_host() {
        let of = |a: &str| Origin::of(&a.parse().unwrap()).to_string();
        assert_eq!(of("/ip4/10.0.0.7/tcp/4001"), "10.0.0.7");
        assert_eq!(of("/ip4/10.0.0.7/udp/9/quic-v1"), "10.0.0.7");
        assert_eq!(of("/ip6/2001:db8:1:2:3:4:5:6/tcp/1"), "2001:db8:1:2::/64");
        assert_eq!(of("/dns4/example.org/tcp/1"), "example.org");
        assert_eq!(of("/memory/123"), of("/memory/456"));
        // Relayed: our relayed listen address, which starts with the relay's.
        let relayed = "/ip4/203.0.113.9/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit";
        assert_eq!(of(relayed), "203.0.113.9");
    }

    #[test]
    fn a_key_that_leaves_tokens_unpaid_is_refused_for_an_hour() {
        let table = UnpaidWork::default();
        let free_rider = asker(1, "a", true);
        assert!(table.admit(&free_rider, 0).is_ok());
        table.ended(&free_rider, tokens(16, 0), 10);
        table.ended(&free_rider, tokens(16, 0), 20);
        assert!(
            table.check(&free_rider, 30).is_ok(),
            "under two newcomer windows"
        );
        table.ended(&free_rider, tokens(3, 0), 30);
        let (reason, why) = table.admit(&free_rider, 40).unwrap_err();
        assert_eq!(reason, RejectReason::NotAllowed);
        assert!(why.contains("32 tokens unpaid"), "{why}");
        // Paying since does not wash it: the key itself is refused.
        let paid = Asker {
            newcomer: false,
            ..free_rider.clone()
        };
        assert!(table.check(&paid, 40).is_err(), "the key itself is refused");
        assert!(
            table.check(&free_rider, 30 + REMEMBERED_MS).is_ok(),
            "forgotten"
        );
    }

    #[test]
    fn an_honest_buyer_s_stray_tokens_stay_within_its_allowance() {
        // A gateway that hedges or whose clients leave: a few tokens in flight each
        // time, and what it pays for grows the allowance by an eighth.
        let table = UnpaidWork::default();
        let gateway = asker(1, "a", false);
        for n in 0..100 {
            table.ended(&gateway, tokens(200, 200), n);
            table.ended(&gateway, tokens(3, 0), n);
        }
        assert!(table.check(&gateway, 100).is_ok());
        // Paying one job does not buy a stream of free ones.
        let table = UnpaidWork::default();
        let payer_once = asker(2, "a", false);
        table.ended(&payer_once, tokens(8, 8), 0);
        table.ended(&payer_once, tokens(33, 0), 1);
        assert!(table.check(&payer_once, 2).is_ok());
        table.ended(&payer_once, tokens(2, 0), 1);
        assert!(table.check(&payer_once, 2).is_err());
    }

    #[test]
    fn standby_warm_ups_cost_a_gateway_nothing() {
        // One unbilled token each, by design: a gateway standing by all hour is served.
        let table = UnpaidWork::default();
        let gateway = asker(1, "a", true);
        for n in 0..1_000 {
            table.ended(&gateway, tokens(1, 0), n);
        }
        assert!(table.check(&gateway, 1_000).is_ok());
        // Each warm-up prefills what was delivered since the last (64 tokens) on an
        // engine that reuses the cached prefix: a thousand an hour stay inside the floor.
        let warm_up = Tally {
            prefilled: 64,
            ..tokens(1, 0)
        };
        let table = UnpaidWork::default();
        for n in 0..1_000 {
            table.ended(&gateway, warm_up, n);
        }
        assert!(table.check(&gateway, 1_000).is_ok());
    }

    /// One-token jobs never receipted (or closed right after `Accept`): the token rule
    /// never sees them (a job's first token is the provider's bid), so before the
    /// prefill rule a key had any number of long prompts prefilled for nothing.
    #[test]
    fn unpaid_prefill_holds_a_key_that_never_pays() {
        let table = UnpaidWork::default();
        let classifier = asker(1, "a", false);
        let one_token = Tally {
            prefilled: 8_000,
            billed_prompt: 8_000,
            ..tokens(1, 0)
        };
        let served = jobs_until_refused(&table, &classifier, one_token);
        assert_eq!(served, FREE_PREFILL_FLOOR.div_ceil(8_000));
        let (reason, why) = table.admit(&classifier, 0).unwrap_err();
        assert_eq!(reason, RejectReason::NotAllowed);
        assert!(why.contains("prompt tokens prefilled here unpaid"), "{why}");
        assert!(
            table.check(&classifier, REMEMBERED_MS + 1).is_ok(),
            "forgotten"
        );
        // The same jobs paid for cost nothing: the first receipt pays the prompt.
        let table = UnpaidWork::default();
        let paid = Tally {
            paid: 1,
            ..one_token
        };
        for n in 0..1_000 {
            table.ended(&classifier, paid, n);
        }
        assert!(table.check(&classifier, 1_000).is_ok());
    }

    /// A resume bills no prompt (a failover's re-prefill is the provider's cost to bid),
    /// so a buyer that carries its prompt in `resume` and pays for the new tokens alone
    /// has the rest prefilled unpaid; each paid token still adds to the allowance.
    #[test]
    fn a_resume_s_prefill_counts_even_when_its_tokens_are_paid() {
        let table = UnpaidWork::default();
        let buyer = asker(1, "a", false);
        let carried = Tally {
            sent: 2,
            paid: 2,
            prefilled: 8_003,
            billed_prompt: 0,
        };
        let served = jobs_until_refused(&table, &buyer, carried);
        // 72,027 unpaid against 65,536 plus 16 for each job's two paid tokens.
        assert_eq!(served, 9);
        // An honest failover now and then beside paid work stays inside.
        let table = UnpaidWork::default();
        let job = Tally {
            sent: 300,
            paid: 300,
            prefilled: 500,
            billed_prompt: 500,
        };
        let failover = Tally {
            sent: 150,
            paid: 150,
            prefilled: 650,
            billed_prompt: 0,
        };
        for n in 0..200 {
            table.ended(&buyer, job, n);
            table.ended(&buyer, failover, n);
        }
        assert!(table.check(&buyer, 200).is_ok());
    }

    #[test]
    fn the_prefill_allowance_is_a_minute_of_measured_prefill_at_least_the_floor() {
        let never_pays = Tally {
            prefilled: 10_000,
            ..tokens(0, 0)
        };
        let buyer = asker(1, "a", false);
        let refused_after = |table: UnpaidWork| jobs_until_refused(&table, &buyer, never_pays);
        assert_eq!(refused_after(UnpaidWork::default()), 7);
        assert_eq!(refused_after(UnpaidWork::new(500_000)), 7, "the floor");
        // 20,000 tokens/s: 1.2 M tokens a minute.
        assert_eq!(refused_after(UnpaidWork::new(20_000_000)), 120);
    }

    #[test]
    fn newcomers_of_one_origin_share_four_prefill_allowances() {
        let table = UnpaidWork::default();
        let long_unpaid = Tally {
            prefilled: 8_192,
            ..tokens(1, 0)
        };
        // Two jobs per fresh key (each within its own allowance), keys without end.
        let mut jobs = 0u64;
        for n in 0..=255u8 {
            let key = asker(n, "a", true);
            if table.check(&key, 0).is_err() {
                break;
            }
            table.ended(&key, long_unpaid, 0);
            table.ended(&key, long_unpaid, 0);
            jobs += 2;
        }
        assert_eq!(jobs * 8_192, ORIGIN_PREFILL_SHARES * FREE_PREFILL_FLOOR);
        let (_, why) = table.check(&asker(255, "a", true), 0).unwrap_err();
        assert!(why.contains("buyers from a had"), "{why}");
        assert!(
            table.check(&asker(255, "b", true), 0).is_ok(),
            "another origin"
        );
        assert!(
            table.check(&asker(255, "a", false), 0).is_ok(),
            "a paying buyer"
        );
    }

    #[test]
    fn keys_that_each_paid_once_share_their_origin_s_prefill_allowances() {
        // Each key pays for one tiny job, then asks for long prefills it will not pay
        // for: prompts moved into `resume` (which bills none), or fresh jobs left before
        // their first receipt. Before, every such key had a whole floor of its own.
        let paid_once = tokens(2, 2);
        let resumed = Tally {
            prefilled: 8_192,
            ..tokens(1, 1)
        };
        let left_early = Tally {
            prefilled: 8_192,
            ..tokens(16, 0)
        };
        for (unpaid_job, window) in [(resumed, 64), (left_early, 64)] {
            let table = UnpaidWork::default();
            let (mut free, mut earned, mut keys) = (0u64, 0u64, 0u64);
            for n in 0..=255u8 {
                let key = asking(asker(n, "a", false), 8_192, window);
                table.ended(&key, paid_once, 0);
                earned += 2 * FREE_PREFILL_PER_PAID_TOKEN;
                let mut took = 0;
                while took < 8 && table.check(&key, 0).is_ok() {
                    table.ended(&key, unpaid_job, 0);
                    earned += unpaid_job.paid * FREE_PREFILL_PER_PAID_TOKEN;
                    free += 8_192;
                    took += 1;
                }
                keys += 1;
                if took == 0 {
                    break;
                }
            }
            assert!(keys < 10, "the crowd ran out after {keys} keys");
            let bound = ORIGIN_PREFILL_SHARES * FREE_PREFILL_FLOOR + 8_192 + earned;
            assert!(free <= bound, "{free} taken, bound {bound}");
            let (reason, why) = table.check(&asker(250, "a", true), 0).unwrap_err();
            assert_eq!(reason, RejectReason::NotAllowed);
            assert!(why.contains("buyers from a "), "{why}");
            // A buyer there whose payments cover what its job could leave unpaid is
            // still served; so is everyone elsewhere.
            let honest = asker(251, "a", false);
            table.ended(&honest, tokens(1_000, 1_000), 0);
            let warm_up = Tally {
                prefilled: 2_000,
                ..tokens(1, 1)
            };
            table.ended(&honest, warm_up, 0);
            // Earned 8 × 1,001 prefill (6,008 left) and 1,001 / 8 = 125 tokens.
            let ask = |prefill, window| table.check(&asking(honest.clone(), prefill, window), 0);
            assert!(ask(6_000, 64).is_ok(), "a job it earned");
            assert!(ask(6_100, 64).is_err(), "more prefill than it earned");
            assert!(ask(100, 200).is_err(), "a wider window than it earned");
            // A key that paid for one tiny job is held with the crowd.
            let paid_once_key = asker(253, "a", false);
            table.ended(&paid_once_key, paid_once, 0);
            assert!(table.check(&asking(paid_once_key, 100, window), 0).is_err());
            assert!(table.check(&asker(252, "b", true), 0).is_ok());
            let later = REMEMBERED_MS + 1;
            assert!(
                table.check(&asker(250, "a", true), later).is_ok(),
                "forgotten"
            );
        }
    }

    #[test]
    fn fresh_keys_from_one_origin_run_out_but_paying_buyers_there_do_not() {
        let table = UnpaidWork::default();
        for n in 0..(ORIGIN_UNPAID_ALLOWANCE / 16) as u8 {
            let key = asker(n, "a", true);
            assert!(table.admit(&key, u64::from(n)).is_ok(), "key {n}");
            table.ended(&key, tokens(17, 0), u64::from(n));
        }
        let (reason, why) = table.check(&asker(100, "a", true), 50).unwrap_err();
        assert_eq!(reason, RejectReason::NotAllowed);
        assert!(why.contains("from a"), "{why}");
        assert!(
            table.check(&asker(101, "a", false), 50).is_ok(),
            "a paying buyer"
        );
        assert!(
            table.check(&asker(102, "b", true), 50).is_ok(),
            "another origin"
        );
        // Keys that each paid once, then left windows unpaid, count against their
        // origin too: the crowd runs out, a buyer there that pays for what it takes does
        // not.
        let table = UnpaidWork::default();
        let mut left = 0;
        for n in 0..=255u8 {
            let key = asking(asker(n, "a", false), 0, 64);
            table.ended(&key, tokens(2, 2), 0);
            if table.check(&key, 0).is_err() {
                break;
            }
            table.ended(&key, tokens(30, 0), 0);
            left += 29;
        }
        assert!(
            left <= ORIGIN_UNPAID_ALLOWANCE + 29,
            "{left} tokens left unpaid"
        );
        let (_, why) = table.check(&asker(200, "a", true), 1).unwrap_err();
        assert!(why.contains("buyers from a left"), "{why}");
        let honest = asking(asker(201, "a", false), 0, 64);
        table.ended(&honest, tokens(600, 600), 0);
        table.ended(&honest, tokens(3, 0), 0);
        assert!(
            table.check(&honest, 1).is_ok(),
            "its payments cover its window"
        );
        assert!(
            table.check(&asker(202, "b", true), 1).is_ok(),
            "another origin"
        );
    }

    #[test]
    fn newcomers_share_a_bounded_number_of_jobs() {
        let table = UnpaidWork::default();
        let newcomer = asker(1, "a", true);
        let held: Vec<_> = (0..NEWCOMER_JOBS_PER_BUYER)
            .map(|_| table.admit(&newcomer, 0).unwrap())
            .collect();
        let (reason, _) = table.admit(&newcomer, 0).unwrap_err();
        assert_eq!(reason, RejectReason::BuyerLimit);
        assert!(
            table.admit(&asker(1, "a", false), 0).unwrap().is_none(),
            "once paid"
        );
        drop(held);
        assert!(table.admit(&newcomer, 0).is_ok(), "slots come back");
        let table = UnpaidWork::default();
        let mut held = Vec::new();
        for n in 0..NEWCOMER_JOBS_PER_ORIGIN as u8 {
            held.push(table.admit(&asker(n, "a", true), 0).unwrap());
        }
        let (reason, why) = table.admit(&asker(200, "a", true), 0).unwrap_err();
        assert_eq!(reason, RejectReason::BuyerLimit);
        assert!(why.contains("from a"), "{why}");
        assert!(table.admit(&asker(200, "b", true), 0).is_ok());
    }

    #[test]
    fn the_table_is_bounded() {
        let table = UnpaidWork::default();
        for n in 0..MAX_JOBS + 10 {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&(n as u64).to_le_bytes());
            let buyer = NodeId::from_bytes(bytes);
            let asker = Asker {
                buyer,
                origin: Origin::unknown(),
                newcomer: false,
                at_risk: AtRisk::default(),
            };
            table.ended(&asker, tokens(1, 0), 0);
        }
        assert_eq!(table.0.lock().unwrap().jobs.len(), MAX_JOBS);
    }
}
