//! The persisted address book: peers we reached, so a restarted node rejoins without
//! `--bootstrap` flags.

use std::collections::BTreeSet;
use std::path::PathBuf;

use libp2p::Multiaddr;

/// At most this many addresses are kept (newest first out when full).
const CAPACITY: usize = 64;

pub struct AddressBook {
    path: Option<PathBuf>,
    addresses: BTreeSet<String>,
}

impl AddressBook {
    pub fn in_memory() -> Self {
        Self {
            path: None,
            addresses: BTreeSet::new(),
        }
    }

    /// Loads the book; an unreadable file is logged and treated as empty.
    pub fn load(path: PathBuf) -> Self {
        let addresses = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<Vec<String>>(&bytes).unwrap_or_else(|err| {
                tracing::warn!(path = %path.display(), %err, "ignoring unreadable address book");
                Vec::new()
            }),
            Err(_) => Vec::new(),
        };
        Self {
            path: Some(path),
            addresses: addresses.into_iter().collect(),
        }
    }

    pub fn addresses(&self) -> Vec<Multiaddr> {
        self.addresses
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect()
    }

    /// Records a dialable address (with `/p2p/`); persists when it is new.
    pub fn remember(&mut self, address: &Multiaddr) {
        if self.addresses.len() >= CAPACITY || !self.addresses.insert(address.to_string()) {
            return;
        }
        let Some(path) = &self.path else { return };
        let list: Vec<&String> = self.addresses.iter().collect();
        let tmp = path.with_extension("json.tmp");
        let written = serde_json::to_vec_pretty(&list)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(err) = written {
            tracing::warn!(path = %path.display(), %err, "could not save the address book");
        }
    }
}
