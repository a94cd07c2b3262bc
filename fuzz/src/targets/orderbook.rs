//! Sequences of gossip offers to one order book: `[u16 length][envelope][u8 seconds
//! later]…`. Invariants: the book stays within its entry and byte bounds, never
//! holds an expired advert, and holds at most one advert per provider.

use std::collections::HashSet;

use sharemesh_mesh::orderbook::{BookLimits, OrderBook};

use super::samples;
use crate::Target;

const LIMITS: BookLimits = BookLimits {
    max_entries: 4,
    max_bytes: 2_048,
    refill_ms: 1_000,
    burst: 2,
};

/// Adverts of several signers and sequence numbers, framed as the target reads them.
fn seeds() -> Vec<Vec<u8>> {
    let mut sequence = Vec::new();
    for signer in 1..=6u8 {
        let key = samples::key(signer);
        for seq in 1..=3u64 {
            let advert = sharemesh_mesh::orderbook::tests_support::advert(&key);
            let Ok(bytes) = key
                .seal(&advert, seq, samples::NOW + seq * 500, 60_000)
                .and_then(|e| e.to_bytes())
            else {
                continue;
            };
            sequence.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
            sequence.extend_from_slice(&bytes);
            sequence.push(signer % 3);
        }
    }
    vec![sequence]
}

pub fn target() -> Target {
    Target {
        name: "orderbook",
        seeds,
        run: Box::new(|input: &[u8]| {
            let mut book = OrderBook::new(LIMITS);
            let mut now = samples::NOW;
            let mut rest = input;
            while rest.len() >= 2 {
                let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
                let end = (2 + len).min(rest.len());
                let _ = book.offer(&rest[2..end], now);
                now += 1_000 * u64::from(rest.get(end).copied().unwrap_or(0));
                rest = rest.get(end + 1..).unwrap_or_default();
                assert!(book.len() <= LIMITS.max_entries, "{} entries", book.len());
                assert!(book.bytes() <= LIMITS.max_bytes, "{} bytes", book.bytes());
                let live = book.live(now);
                let providers: HashSet<_> = live.iter().map(|e| e.advert.provider).collect();
                assert_eq!(providers.len(), live.len(), "two adverts of one provider");
                assert!(live.iter().all(|e| e.expires_at_ms >= now));
            }
        }),
    }
}
