//! The order book: the newest valid advert of every provider. Adverts are checked
//! (rate, signature, expiry, per-provider sequence) before they enter or are
//! forwarded, and the book's memory is bounded per signer (one advert, at most
//! `Advert::MAX_BYTES`) and in total (entries and bytes), evicting fresh keys before
//! providers this node has been served by.

mod rate;
mod refusal;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use serde::Serialize;
use sharemesh_protocol::{
    Advert, MessageKind, ModelId, NodeId, OpenError, ReplayGuard, SignedEnvelope, SignerKeys,
};

pub use rate::RateBuckets;
pub use refusal::AdvertRefusal;

/// An advert the book took: whose, and which of their sequence numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub provider: NodeId,
    pub seq: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct BookEntry {
    pub advert: Advert,
    pub seq: u64,
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
    pub last_seen_ms: u64,
    /// When this provider's first advert entered the book (kept across refreshes).
    pub first_seen_ms: u64,
    /// Encoded size of the advert's envelope: what the book's byte bound counts.
    pub bytes: usize,
}

/// One advert as it arrived, for the live view (`GET /v1/network/adverts`): the entry
/// the book took, or why it did not.
#[derive(Clone, Debug)]
pub struct AdvertArrival {
    /// Counts every advert offered to this book, from 1: a reader asks for what came
    /// after the last one it saw.
    pub arrival: u64,
    pub received_ms: u64,
    /// The signer the envelope names (checked only when the advert was accepted: a
    /// refused one may name anyone); `None` when the bytes did not decode.
    pub signer: Option<NodeId>,
    pub outcome: ArrivalOutcome,
}

#[derive(Clone, Debug)]
pub enum ArrivalOutcome {
    Accepted(Arc<BookEntry>),
    Refused {
        reason: String,
        /// Whether gossip penalises its sender for it ([`AdvertRefusal::is_violation`]).
        violation: bool,
    },
}

/// How many arrivals the live view keeps: a screenful, bounded whatever peers send.
pub const RECENT_ARRIVALS: usize = 64;

/// How much the book holds and how fast one signer may refresh.
#[derive(Clone, Copy, Debug)]
pub struct BookLimits {
    pub max_entries: usize,
    pub max_bytes: usize,
    /// One advert per signer per `refill_ms` on average…
    pub refill_ms: u64,
    /// …with up to `burst` at once (a reconnect delivers a few together).
    pub burst: u32,
}

impl Default for BookLimits {
    /// Honest providers advertise every 10 s (at most every second); one a second
    /// with a burst of 8 leaves room for reordering and reconnects and none for a flood.
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            max_bytes: 32 << 20,
            refill_ms: 1_000,
            burst: 8,
        }
    }
}

pub struct OrderBook {
    entries: HashMap<NodeId, Arc<BookEntry>>,
    bytes: usize,
    replay: ReplayGuard,
    /// Providers re-advertise every few seconds: keep their keys decompressed.
    keys: SignerKeys,
    rate: RateBuckets,
    /// Providers that served this node well: never evicted to make room.
    known_good: HashSet<NodeId>,
    limits: BookLimits,
    /// The last [`RECENT_ARRIVALS`] adverts offered, oldest first.
    recent: VecDeque<AdvertArrival>,
    arrivals: u64,
}

impl OrderBook {
    pub fn new(limits: BookLimits) -> Self {
        let capacity = limits.max_entries.max(1);
        Self {
            entries: HashMap::new(),
            bytes: 0,
            replay: ReplayGuard::new(capacity * 2),
            keys: SignerKeys::new(capacity),
            rate: RateBuckets::new(limits.refill_ms, limits.burst, capacity * 2),
            known_good: HashSet::new(),
            limits: BookLimits {
                max_entries: capacity,
                ..limits
            },
            recent: VecDeque::with_capacity(RECENT_ARRIVALS),
            arrivals: 0,
        }
    }

    /// Checks and records an advert received at `now_ms`; returns its provider. The
    /// outcome, taken or refused, joins the live view ([`Self::arrivals_after`]).
    pub fn offer(&mut self, bytes: &[u8], now_ms: u64) -> Result<Accepted, AdvertRefusal> {
        let (signer, result) = match SignedEnvelope::from_bytes(bytes) {
            Ok(envelope) => (
                Some(envelope.signer),
                self.check_and_insert(envelope, bytes.len(), now_ms),
            ),
            Err(error) => (None, Err(error.into())),
        };
        let outcome = match &result {
            Ok(accepted) => match self.entries.get(&accepted.provider) {
                Some(entry) => ArrivalOutcome::Accepted(entry.clone()),
                None => return result,
            },
            Err(refusal) => ArrivalOutcome::Refused {
                reason: refusal.to_string(),
                violation: refusal.is_violation(),
            },
        };
        self.arrivals += 1;
        if self.recent.len() == RECENT_ARRIVALS {
            self.recent.pop_front();
        }
        self.recent.push_back(AdvertArrival {
            arrival: self.arrivals,
            received_ms: now_ms,
            signer,
            outcome,
        });
        result
    }

    /// How many adverts were offered so far (the newest arrival's number).
    pub fn latest_arrival(&self) -> u64 {
        self.arrivals
    }

    /// The kept arrivals numbered above `after`, oldest first.
    pub fn arrivals_after(&self, after: u64) -> Vec<AdvertArrival> {
        self.recent
            .iter()
            .filter(|a| a.arrival > after)
            .cloned()
            .collect()
    }

    fn check_and_insert(
        &mut self,
        envelope: SignedEnvelope,
        size: usize,
        now_ms: u64,
    ) -> Result<Accepted, AdvertRefusal> {
        let signer = envelope.signer;
        if !self.rate.allows(&signer, now_ms) {
            return Err(AdvertRefusal::RateLimited {
                signer,
                refill_ms: self.limits.refill_ms,
                burst: self.limits.burst,
            });
        }
        let opened = envelope
            .open_cached::<Advert>(now_ms, &mut self.keys)
            .map_err(|error| match error {
                OpenError::Invalid(error) => AdvertRefusal::Invalid { signer, error },
                other => AdvertRefusal::Open(other),
            })?;
        // Only a new, valid advert draws from its signer's rate: replayed copies of an
        // honest provider's adverts cannot use up its allowance.
        self.replay
            .admit(&opened, MessageKind::Advert, [0; 16], now_ms)?;
        self.rate.draw(signer, now_ms);
        self.make_room(signer, size, now_ms)?;
        let first_seen_ms = self
            .entries
            .get(&signer)
            .map_or(now_ms, |e| e.first_seen_ms);
        let entry = Arc::new(BookEntry {
            advert: opened.body,
            seq: opened.seq,
            issued_at_ms: opened.issued_at_ms,
            expires_at_ms: opened.expires_at_ms,
            last_seen_ms: now_ms,
            first_seen_ms,
            bytes: size,
        });
        self.insert(signer, entry);
        Ok(Accepted {
            provider: signer,
            seq: opened.seq,
        })
    }

    /// Frees room for `incoming` bytes from `signer`: expired adverts first, then the
    /// newest keys not known to be good. A full book of known-good providers declines.
    fn make_room(
        &mut self,
        signer: NodeId,
        incoming: usize,
        now_ms: u64,
    ) -> Result<(), AdvertRefusal> {
        let replaced = self.entries.get(&signer).map_or(0, |e| e.bytes);
        let is_new = usize::from(replaced == 0);
        let fits = |book: &Self| {
            book.entries.len() + is_new <= book.limits.max_entries
                && book.bytes - replaced + incoming <= book.limits.max_bytes
        };
        if fits(self) {
            return Ok(());
        }
        self.prune(now_ms);
        while !fits(self) {
            let victim = self
                .entries
                .values()
                .filter(|e| e.advert.provider != signer)
                .filter(|e| !self.known_good.contains(&e.advert.provider))
                .max_by_key(|e| (e.first_seen_ms, e.advert.provider))
                .map(|e| e.advert.provider);
            match victim {
                Some(victim) => self.remove(&victim),
                None => {
                    return Err(AdvertRefusal::Full {
                        entries: self.entries.len(),
                        bytes: self.bytes,
                    })
                }
            }
        }
        Ok(())
    }

    fn insert(&mut self, signer: NodeId, entry: Arc<BookEntry>) {
        self.bytes += entry.bytes;
        if let Some(old) = self.entries.insert(signer, entry) {
            self.bytes -= old.bytes;
        }
    }

    fn remove(&mut self, provider: &NodeId) {
        if let Some(old) = self.entries.remove(provider) {
            self.bytes -= old.bytes;
        }
    }

    fn prune(&mut self, now_ms: u64) {
        let expired: Vec<NodeId> = self
            .entries
            .values()
            .filter(|e| e.expires_at_ms < now_ms)
            .map(|e| e.advert.provider)
            .collect();
        for provider in expired {
            self.remove(&provider);
        }
    }

    /// Marks `provider` as one that served this node well: its advert is never evicted
    /// to make room for others. At most `max_entries` are remembered.
    pub fn mark_known_good(&mut self, provider: NodeId) {
        if self.known_good.len() < self.limits.max_entries {
            self.known_good.insert(provider);
        }
    }

    /// Whether `provider` served this node well ([`Self::mark_known_good`]).
    pub fn is_known_good(&self, provider: &NodeId) -> bool {
        self.known_good.contains(provider)
    }

    /// Every unexpired advert, in provider order (shared, not copied).
    pub fn live(&self, now_ms: u64) -> Vec<Arc<BookEntry>> {
        let mut live: Vec<Arc<BookEntry>> = self
            .entries
            .values()
            .filter(|e| e.expires_at_ms >= now_ms)
            .cloned()
            .collect();
        live.sort_by_key(|e| e.advert.provider);
        live
    }

    pub fn get(&self, provider: &NodeId, now_ms: u64) -> Option<&BookEntry> {
        self.entries
            .get(provider)
            .filter(|e| e.expires_at_ms >= now_ms)
            .map(|e| &**e)
    }

    /// Unexpired adverts offering `model`.
    pub fn offering(&self, model: &ModelId, now_ms: u64) -> Vec<Arc<BookEntry>> {
        let mut offering = self.live(now_ms);
        offering.retain(|e| e.advert.offer(model).is_some());
        offering
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Encoded bytes of every advert held (the quantity `max_bytes` bounds).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A minimal advert for unit tests here and in crates above (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub mod tests_support {
    use sharemesh_protocol::{Advert, HardwareSummary, Keypair, Load};

    pub fn advert(key: &Keypair) -> Advert {
        Advert {
            provider: key.node_id(),
            region: "local".into(),
            hardware: HardwareSummary::Cpu {
                cores: 2,
                ram_bytes: 1,
            },
            models: vec![],
            tiers: vec![],
            windows: vec![],
            load: Load::default(),
            addresses: vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::advert;
    use super::*;
    use sharemesh_protocol::Keypair;

    const NOW: u64 = 1_796_029_200_000;

    fn limits(max_entries: usize) -> BookLimits {
        BookLimits {
            max_entries,
            ..BookLimits::default()
        }
    }

    fn sealed(key: &Keypair, seq: u64, issued_at_ms: u64) -> Vec<u8> {
        key.seal(&advert(key), seq, issued_at_ms, 60_000)
            .unwrap()
            .to_bytes()
            .unwrap()
    }

    #[test]
    fn accepts_newer_and_refuses_forged_expired_replayed() {
        let key = Keypair::from_secret([1; 32]);
        let mut book = OrderBook::new(limits(10));
        let first = sealed(&key, 1, NOW);
        assert_eq!(book.offer(&first, NOW).unwrap().provider, key.node_id());
        let replayed = book.offer(&first, NOW + 1).unwrap_err();
        assert!(matches!(replayed, AdvertRefusal::Replay(_)));
        assert!(
            !replayed.is_violation(),
            "gossip reorders: ignore, not reject"
        );
        let expired = book
            .offer(&sealed(&key, 2, NOW - 120_000), NOW)
            .unwrap_err();
        assert!(matches!(
            expired,
            AdvertRefusal::Open(OpenError::Expired { .. })
        ));
        assert!(!expired.is_violation(), "clocks drift: ignore, not reject");
        let mut forged = key.seal(&advert(&key), 3, NOW, 60_000).unwrap();
        forged.payload[0] ^= 1;
        let forged = book.offer(&forged.to_bytes().unwrap(), NOW).unwrap_err();
        assert!(forged.is_violation());
        assert_eq!(
            forged.signed_fault(),
            None,
            "anyone can forge a bad signature"
        );
        book.offer(&sealed(&key, 4, NOW), NOW + 1_000).unwrap();
        assert_eq!(book.live(NOW)[0].seq, 4);
        assert!(book.live(NOW + 61_000).is_empty());
    }

    #[test]
    fn an_advert_may_not_outlive_a_few_refreshes() {
        let key = Keypair::from_secret([2; 32]);
        let mut envelope = key.seal(&advert(&key), 1, NOW, 60_000).unwrap();
        // What a modified node would send: a 30-minute advert (the lifetime is
        // checked before the signature, so the signature need not match here).
        envelope.expires_at_ms = NOW + 30 * 60_000;
        let long = envelope.to_bytes().unwrap();
        let refused = OrderBook::new(limits(10)).offer(&long, NOW).unwrap_err();
        assert!(
            matches!(
                refused,
                AdvertRefusal::Open(OpenError::LifetimeTooLong { .. })
            ),
            "{refused}"
        );
        assert!(refused.is_violation());
    }

    #[test]
    fn a_catalog_name_on_another_model_is_the_signers_fault() {
        let key = Keypair::from_secret([3; 32]);
        let mut hijack = advert(&key);
        hijack.models.push(sharemesh_protocol::ModelOffer {
            model: sharemesh_protocol::ModelDescriptor {
                id: ModelId::from_bytes([7; 32]),
                name: sharemesh_protocol::catalog::CATALOG[0].name.to_owned(),
                architecture: "llama".into(),
                quantization: "q4_1".into(),
                context_length: 2048,
            },
            generation_milli_tokens_per_second: 1,
            prices: vec![],
        });
        let bytes = key
            .seal(&hijack, 1, NOW, 60_000)
            .unwrap()
            .to_bytes()
            .unwrap();
        let refused = OrderBook::new(limits(10)).offer(&bytes, NOW).unwrap_err();
        assert!(refused.is_violation());
        assert_eq!(refused.signed_fault(), Some(key.node_id()));
    }

    #[test]
    fn one_signer_cannot_refresh_faster_than_its_rate() {
        let key = Keypair::from_secret([4; 32]);
        let mut book = OrderBook::new(limits(10));
        let burst = BookLimits::default().burst as u64;
        for seq in 1..=burst {
            book.offer(&sealed(&key, seq, NOW), NOW).unwrap();
        }
        let over = book.offer(&sealed(&key, burst + 1, NOW), NOW).unwrap_err();
        assert!(matches!(over, AdvertRefusal::RateLimited { .. }), "{over}");
        assert!(!over.is_violation());
        // Replays of its old adverts do not use up an honest signer's allowance.
        let mut book = OrderBook::new(limits(10));
        let old = sealed(&key, 1, NOW);
        book.offer(&old, NOW).unwrap();
        for _ in 0..20 {
            assert!(book.offer(&old, NOW).is_err());
        }
        book.offer(&sealed(&key, 2, NOW), NOW).unwrap();
        // After a refill interval the signer may refresh again.
        let mut book = OrderBook::new(limits(10));
        for seq in 1..=burst {
            book.offer(&sealed(&key, seq, NOW), NOW).unwrap();
        }
        book.offer(&sealed(&key, burst + 1, NOW), NOW + 1_000)
            .unwrap();
    }

    #[test]
    fn a_flood_of_fresh_keys_stays_bounded_and_leaves_known_providers_in_place() {
        let mut book = OrderBook::new(limits(8));
        let honest: Vec<Keypair> = (0..6u8)
            .map(|n| Keypair::from_secret([100 + n; 32]))
            .collect();
        for key in &honest {
            book.offer(&sealed(key, 1, NOW), NOW).unwrap();
        }
        book.mark_known_good(honest[5].node_id());
        for n in 0..500u32 {
            let mut secret = [0u8; 32];
            secret[..4].copy_from_slice(&n.to_le_bytes());
            secret[31] = 9;
            let flooder = Keypair::from_secret(secret);
            let _ = book.offer(&sealed(&flooder, 1, NOW + 1_000), NOW + 1_000);
            assert!(book.len() <= 8);
            assert!(book.bytes() <= BookLimits::default().max_bytes);
        }
        // Established providers were never the victims: fresh keys evicted fresh keys.
        for key in &honest {
            assert!(book.get(&key.node_id(), NOW + 1_000).is_some());
        }
        // A full book of known-good providers declines a newcomer without evicting.
        let mut book = OrderBook::new(limits(2));
        for key in &honest[..2] {
            book.offer(&sealed(key, 1, NOW), NOW).unwrap();
            book.mark_known_good(key.node_id());
        }
        let refused = book.offer(&sealed(&honest[2], 1, NOW), NOW).unwrap_err();
        assert!(matches!(refused, AdvertRefusal::Full { .. }), "{refused}");
        assert!(!refused.is_violation());
        assert_eq!(book.len(), 2);
    }

    #[test]
    fn the_byte_bound_holds_for_large_adverts() {
        let mut book = OrderBook::new(BookLimits {
            max_entries: 100,
            max_bytes: 2_000,
            ..BookLimits::default()
        });
        for n in 0..40u8 {
            let key = Keypair::from_secret([n; 32]);
            let mut big = advert(&key);
            big.region = "r".repeat(60);
            let _ = book.offer(
                &key.seal(&big, 1, NOW, 60_000).unwrap().to_bytes().unwrap(),
                NOW,
            );
            assert!(book.bytes() <= 2_000, "{} bytes", book.bytes());
        }
        assert!(!book.is_empty());
    }

    #[test]
    fn the_live_view_keeps_the_last_arrivals_taken_or_refused() {
        let key = Keypair::from_secret([1; 32]);
        let mut book = OrderBook::new(limits(10));
        book.offer(&sealed(&key, 1, NOW), NOW).unwrap();
        book.offer(&sealed(&key, 1, NOW), NOW + 1).unwrap_err();
        book.offer(b"not an advert", NOW + 2).unwrap_err();
        let seen = book.arrivals_after(0);
        assert_eq!(seen.len(), 3);
        assert!(matches!(&seen[0].outcome, ArrivalOutcome::Accepted(e) if e.seq == 1));
        assert!(matches!(&seen[1].outcome,
            ArrivalOutcome::Refused { reason, violation: false } if reason.starts_with("replayed")));
        assert_eq!(seen[1].signer, Some(key.node_id()));
        assert!(matches!(
            &seen[2].outcome,
            ArrivalOutcome::Refused {
                violation: true,
                ..
            }
        ));
        assert_eq!(seen[2].signer, None);
        // A reader that saw the first two gets only the third.
        let newer = book.arrivals_after(seen[1].arrival);
        assert_eq!(newer.len(), 1);
        assert_eq!(newer[0].arrival, seen[2].arrival);
        // Bounded however many arrive.
        for n in 0..200 {
            let _ = book.offer(&[n as u8], NOW);
        }
        let kept = book.arrivals_after(0);
        assert_eq!(kept.len(), RECENT_ARRIVALS);
        assert_eq!(kept.last().unwrap().arrival, 203);
    }
}
