//! The order book: the newest valid advert of every provider. Adverts are checked
//! (signature, expiry, per-provider sequence) before they enter or are forwarded.

use std::collections::HashMap;

use serde::Serialize;
use sharemesh_protocol::{
    Advert, MessageKind, ModelId, NodeId, OpenError, ReplayError, ReplayGuard, SignedEnvelope,
    SignerKeys,
};

#[derive(Debug, thiserror::Error)]
pub enum AdvertRejection {
    #[error("undecodable: {0}")]
    Decode(#[from] sharemesh_protocol::DecodeError),
    #[error("invalid: {0}")]
    Open(#[from] OpenError),
    #[error("replayed: {0}")]
    Replay(#[from] ReplayError),
}

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
}

pub struct OrderBook {
    entries: HashMap<NodeId, BookEntry>,
    replay: ReplayGuard,
    /// Providers re-advertise every few seconds: keep their keys decompressed.
    keys: SignerKeys,
    capacity: usize,
}

impl OrderBook {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            replay: ReplayGuard::new(capacity * 2),
            keys: SignerKeys::new(capacity),
            capacity,
        }
    }

    /// Checks and records an advert received at `now_ms`; returns its provider.
    pub fn offer(&mut self, bytes: &[u8], now_ms: u64) -> Result<Accepted, AdvertRejection> {
        let envelope = SignedEnvelope::from_bytes(bytes)?;
        let opened = envelope.open_cached::<Advert>(now_ms, &mut self.keys)?;
        self.replay
            .admit(&opened, MessageKind::Advert, [0; 16], now_ms)?;
        let provider = opened.signer;
        let seq = opened.seq;
        self.prune(now_ms);
        if !self.entries.contains_key(&provider) && self.entries.len() >= self.capacity {
            // Full: make room by dropping the advert closest to expiry.
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.expires_at_ms)
                .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(
            provider,
            BookEntry {
                advert: opened.body,
                seq: opened.seq,
                issued_at_ms: opened.issued_at_ms,
                expires_at_ms: opened.expires_at_ms,
                last_seen_ms: now_ms,
            },
        );
        Ok(Accepted { provider, seq })
    }

    fn prune(&mut self, now_ms: u64) {
        self.entries.retain(|_, e| e.expires_at_ms >= now_ms);
    }

    /// Every unexpired advert.
    pub fn live(&self, now_ms: u64) -> Vec<BookEntry> {
        let mut live: Vec<BookEntry> = self
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
    }

    /// Unexpired adverts offering `model`.
    pub fn offering(&self, model: &ModelId, now_ms: u64) -> Vec<BookEntry> {
        self.live(now_ms)
            .into_iter()
            .filter(|e| e.advert.offer(model).is_some())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
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

    #[test]
    fn accepts_newer_and_rejects_forged_expired_replayed() {
        let key = Keypair::from_secret([1; 32]);
        let mut book = OrderBook::new(10);
        let first = key
            .seal(&advert(&key), 1, NOW, 60_000)
            .unwrap()
            .to_bytes()
            .unwrap();
        assert_eq!(book.offer(&first, NOW).unwrap().provider, key.node_id());
        assert!(matches!(
            book.offer(&first, NOW + 1),
            Err(AdvertRejection::Replay(_))
        ));
        let expired = key
            .seal(&advert(&key), 2, NOW - 120_000, 60_000)
            .unwrap()
            .to_bytes()
            .unwrap();
        assert!(matches!(
            book.offer(&expired, NOW),
            Err(AdvertRejection::Open(_))
        ));
        let mut forged = key.seal(&advert(&key), 3, NOW, 60_000).unwrap();
        forged.payload[0] ^= 1;
        assert!(book.offer(&forged.to_bytes().unwrap(), NOW).is_err());
        let second = key
            .seal(&advert(&key), 4, NOW, 60_000)
            .unwrap()
            .to_bytes()
            .unwrap();
        book.offer(&second, NOW).unwrap();
        assert_eq!(book.live(NOW)[0].seq, 4);
        assert!(book.live(NOW + 61_000).is_empty());
    }
}
