//! Settlement channels' records: per counterparty, what the settlement layer keeps about
//! its channel (a provider: the buyer's bound account and newest authorisation; a buyer:
//! the provider's account and what it authorised). The encoding is the settlement
//! crate's; the ledger only keeps it durably beside the receipts it settles.

use sharemesh_protocol::NodeId;

use crate::{Ledger, LedgerError};

/// Records kept at most: one per counterparty settled with. A new counterparty past the
/// bound is refused (the settlement layer removes an idle record first, if it has one).
pub const MAX_CHANNEL_RECORDS: usize = 100_000;

impl Ledger {
    /// Keeps `record` for the channel with `counterparty` (replacing the last), flushed.
    pub fn save_channel(&self, counterparty: &NodeId, record: &[u8]) -> Result<(), LedgerError> {
        if !self.channels.contains_key(counterparty.as_bytes())?
            && self.channels.len() >= MAX_CHANNEL_RECORDS
        {
            return Err(LedgerError::Full("settlement channels"));
        }
        self.channels.insert(counterparty.as_bytes(), record)?;
        self.db.flush()?;
        Ok(())
    }

    /// Forgets the record of `counterparty`'s channel, flushed.
    pub fn remove_channel(&self, counterparty: &NodeId) -> Result<(), LedgerError> {
        self.channels.remove(counterparty.as_bytes())?;
        self.db.flush()?;
        Ok(())
    }

    /// Every channel record, by counterparty (entries whose key is not a node id are
    /// skipped: nothing here writes one).
    pub fn channel_records(&self) -> Result<Vec<(NodeId, Vec<u8>)>, LedgerError> {
        let mut records = Vec::new();
        for entry in self.channels.iter() {
            let (key, value) = entry?;
            if let Ok(bytes) = <[u8; 32]>::try_from(key.as_ref()) {
                records.push((NodeId::from_bytes(bytes), value.to_vec()));
            }
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sharemesh_protocol::Keypair;

    #[test]
    fn channel_records_survive_a_reopen_and_the_newest_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let peer = Keypair::from_secret([3; 32]).node_id();
        {
            let ledger = Ledger::open(dir.path()).unwrap();
            ledger.save_channel(&peer, b"first").unwrap();
            ledger.save_channel(&peer, b"second").unwrap();
        }
        let ledger = Ledger::open(dir.path()).unwrap();
        assert_eq!(
            ledger.channel_records().unwrap(),
            vec![(peer, b"second".to_vec())]
        );
    }
}
