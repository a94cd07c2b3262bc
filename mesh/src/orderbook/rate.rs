//! Per-signer rate: a token bucket per node id, checked before the work it guards (an
//! advert's signature check: a flood costs no verification once its signer's bucket is
//! empty) and drawn only after (a forged signer cannot drain an honest provider's
//! bucket). The gateway bounds gossiped fraud proofs with it too.

use std::collections::HashMap;

use sharemesh_protocol::NodeId;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: u32,
    refilled_at_ms: u64,
}

#[derive(Debug)]
pub struct RateBuckets {
    refill_ms: u64,
    burst: u32,
    capacity: usize,
    buckets: HashMap<NodeId, Bucket>,
}

impl RateBuckets {
    /// One token back every `refill_ms`, at most `burst` held, buckets for at most
    /// `capacity` ids (full ones forgotten first).
    pub fn new(refill_ms: u64, burst: u32, capacity: usize) -> Self {
        Self {
            refill_ms: refill_ms.max(1),
            burst: burst.max(1),
            capacity: capacity.max(1),
            buckets: HashMap::new(),
        }
    }

    fn refilled(&self, bucket: Bucket, now_ms: u64) -> Bucket {
        let elapsed = now_ms.saturating_sub(bucket.refilled_at_ms);
        let earned = elapsed / self.refill_ms;
        if earned == 0 {
            return bucket;
        }
        Bucket {
            tokens: (u64::from(bucket.tokens) + earned).min(u64::from(self.burst)) as u32,
            refilled_at_ms: bucket.refilled_at_ms + earned * self.refill_ms,
        }
    }

    /// Whether `signer` may send one more advert now (nothing is drawn).
    pub fn allows(&self, signer: &NodeId, now_ms: u64) -> bool {
        self.buckets
            .get(signer)
            .is_none_or(|b| self.refilled(*b, now_ms).tokens > 0)
    }

    /// Draws one advert from `signer`'s bucket (after its signature was verified).
    pub fn draw(&mut self, signer: NodeId, now_ms: u64) {
        if !self.buckets.contains_key(&signer) && self.buckets.len() >= self.capacity {
            // Forget full buckets first: they carry no state a fresh one would not.
            let (burst, refill_ms) = (self.burst, self.refill_ms);
            self.buckets.retain(|_, b| {
                let elapsed = now_ms.saturating_sub(b.refilled_at_ms) / refill_ms;
                u64::from(b.tokens) + elapsed < u64::from(burst)
            });
            if self.buckets.len() >= self.capacity {
                self.buckets.clear();
            }
        }
        let fresh = Bucket {
            tokens: self.burst,
            refilled_at_ms: now_ms,
        };
        let bucket = self.buckets.get(&signer).copied().unwrap_or(fresh);
        let mut bucket = self.refilled(bucket, now_ms);
        if bucket.tokens == self.burst {
            bucket.refilled_at_ms = now_ms;
        }
        bucket.tokens = bucket.tokens.saturating_sub(1);
        self.buckets.insert(signer, bucket);
    }

    /// Ids with a bucket.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> NodeId {
        NodeId::from_bytes([n; 32])
    }

    #[test]
    fn a_burst_then_one_per_refill() {
        let mut rate = RateBuckets::new(1_000, 3, 10);
        for _ in 0..3 {
            assert!(rate.allows(&id(1), 0));
            rate.draw(id(1), 0);
        }
        assert!(!rate.allows(&id(1), 999));
        assert!(rate.allows(&id(2), 999), "buckets are per signer");
        assert!(rate.allows(&id(1), 1_000));
        rate.draw(id(1), 1_000);
        assert!(!rate.allows(&id(1), 1_500));
        // A long silence refills to the burst, never past it.
        for _ in 0..3 {
            assert!(rate.allows(&id(1), 100_000));
            rate.draw(id(1), 100_000);
        }
        assert!(!rate.allows(&id(1), 100_000));
    }

    #[test]
    fn the_table_stays_bounded() {
        let mut rate = RateBuckets::new(1_000, 2, 4);
        for n in 0..50u8 {
            rate.draw(id(n), u64::from(n));
            assert!(rate.len() <= 4);
        }
    }
}
