//! Replay protection: per (signer, kind, scope) the sequence number must strictly
//! increase. Scope is the job id for job-bound messages and empty for standing ones
//! (adverts, attestations, reports). An entry is forgotten once the newest message it
//! guards has expired, since an expired message is refused anyway; the table is also
//! bounded, evicting the entry that expires first.

use std::collections::{BTreeSet, HashMap};

use crate::envelope::Opened;
use crate::error::ReplayError;
use crate::ids::NodeId;
use crate::kind::MessageKind;

type Key = (NodeId, MessageKind, [u8; 16]);

#[derive(Debug)]
pub struct ReplayGuard {
    capacity: usize,
    highest: HashMap<Key, (u64, u64)>,
    by_expiry: BTreeSet<(u64, Key)>,
}

impl ReplayGuard {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            highest: HashMap::new(),
            by_expiry: BTreeSet::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.highest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.highest.is_empty()
    }

    /// The highest sequence accepted so far for this key, if remembered.
    pub fn highest(&self, signer: &NodeId, kind: MessageKind, scope: [u8; 16]) -> Option<u64> {
        self.highest
            .get(&(*signer, kind, scope))
            .map(|(seq, _)| *seq)
    }

    /// Accepts `opened` if its sequence is above every earlier one for the same key.
    pub fn admit<T>(
        &mut self,
        opened: &Opened<T>,
        kind: MessageKind,
        scope: [u8; 16],
        now_ms: u64,
    ) -> Result<(), ReplayError> {
        self.admit_raw(
            opened.signer,
            kind,
            scope,
            opened.seq,
            opened.expires_at_ms,
            now_ms,
        )
    }

    pub fn admit_raw(
        &mut self,
        signer: NodeId,
        kind: MessageKind,
        scope: [u8; 16],
        seq: u64,
        expires_at_ms: u64,
        now_ms: u64,
    ) -> Result<(), ReplayError> {
        self.forget_expired(now_ms);
        let key = (signer, kind, scope);
        if let Some(&(highest, old_expiry)) = self.highest.get(&key) {
            if seq <= highest {
                return Err(ReplayError::Stale { got: seq, highest });
            }
            self.by_expiry.remove(&(old_expiry, key));
        } else if self.highest.len() >= self.capacity {
            if let Some(first) = self.by_expiry.pop_first() {
                self.highest.remove(&first.1);
            }
        }
        let expiry = expires_at_ms.max(self.highest.get(&key).map_or(0, |e| e.1));
        self.highest.insert(key, (seq, expiry));
        self.by_expiry.insert((expiry, key));
        Ok(())
    }

    fn forget_expired(&mut self, now_ms: u64) {
        while let Some(&(expiry, key)) = self.by_expiry.first() {
            if expiry >= now_ms {
                break;
            }
            self.by_expiry.pop_first();
            self.highest.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: NodeId = NodeId::from_bytes([9; 32]);

    #[test]
    fn rejects_equal_and_lower_sequences() {
        let mut guard = ReplayGuard::new(16);
        guard
            .admit_raw(NODE, MessageKind::Advert, [0; 16], 5, 1000, 0)
            .unwrap();
        assert_eq!(
            guard.admit_raw(NODE, MessageKind::Advert, [0; 16], 5, 1000, 0),
            Err(ReplayError::Stale { got: 5, highest: 5 })
        );
        assert!(guard
            .admit_raw(NODE, MessageKind::Advert, [0; 16], 4, 1000, 0)
            .is_err());
        guard
            .admit_raw(NODE, MessageKind::Advert, [0; 16], 6, 1000, 0)
            .unwrap();
    }

    #[test]
    fn scopes_and_kinds_are_independent() {
        let mut guard = ReplayGuard::new(16);
        guard
            .admit_raw(NODE, MessageKind::Receipt, [1; 16], 5, 1000, 0)
            .unwrap();
        guard
            .admit_raw(NODE, MessageKind::Receipt, [2; 16], 3, 1000, 0)
            .unwrap();
        guard
            .admit_raw(NODE, MessageKind::Advert, [1; 16], 1, 1000, 0)
            .unwrap();
    }

    #[test]
    fn capacity_is_bounded() {
        let mut guard = ReplayGuard::new(4);
        for i in 0..100u8 {
            guard
                .admit_raw(
                    NODE,
                    MessageKind::Receipt,
                    [i; 16],
                    1,
                    1000 + u64::from(i),
                    0,
                )
                .unwrap();
        }
        assert_eq!(guard.len(), 4);
    }

    #[test]
    fn expired_entries_are_forgotten() {
        let mut guard = ReplayGuard::new(4);
        guard
            .admit_raw(NODE, MessageKind::Advert, [0; 16], 5, 1000, 0)
            .unwrap();
        guard
            .admit_raw(NODE, MessageKind::Advert, [1; 16], 5, 5000, 2000)
            .unwrap();
        assert_eq!(guard.len(), 1);
    }
}
