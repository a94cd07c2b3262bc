//! API keys for a gateway shared by a team: `sharemesh keys create|list|revoke`.
//! Only sha256 hashes are stored (`<data-dir>/api_keys.json`); the key is shown once.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KeyRecord {
    pub id: String,
    pub name: String,
    pub sha256: String,
    pub created_ms: u64,
    pub revoked: bool,
    /// Spend limits for this key, nano-USD per UTC day / month.
    #[serde(default)]
    pub daily_budget_nano_usd: Option<u64>,
    #[serde(default)]
    pub monthly_budget_nano_usd: Option<u64>,
    /// May call the routes that change the node (block/unblock peers).
    #[serde(default)]
    pub admin: bool,
}

pub struct KeyStore {
    path: PathBuf,
    pub records: Vec<KeyRecord>,
}

fn hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

impl KeyStore {
    pub fn open(data_dir: &Path) -> Result<Self> {
        let path = data_dir.join("api_keys.json");
        let records = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is corrupt", path.display()))?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Self { path, records })
    }

    fn save(&self) -> Result<()> {
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir)?;
        }
        let tmp = self
            .path
            .with_extension(format!("{}.tmp", std::process::id()));
        fs::write(&tmp, serde_json::to_vec_pretty(&self.records)?)?;
        fs::rename(&tmp, &self.path).with_context(|| format!("writing {}", self.path.display()))
    }

    /// Creates a key and returns its secret text (shown once).
    pub fn create(&mut self, name: &str) -> Result<(KeyRecord, String)> {
        self.create_with_budget(name, None, None)
    }

    /// Creates a key with its own daily and monthly budgets (nano-USD).
    pub fn create_with_budget(
        &mut self,
        name: &str,
        daily: Option<u64>,
        monthly: Option<u64>,
    ) -> Result<(KeyRecord, String)> {
        let mut secret = [0u8; 24];
        rand::fill(&mut secret);
        let key = format!("sk-sm-{}", hex::encode(secret));
        let record = KeyRecord {
            id: hash(&key)[..12].to_owned(),
            name: name.to_owned(),
            sha256: hash(&key),
            created_ms: sharemesh_mesh::clock::now_ms(),
            revoked: false,
            daily_budget_nano_usd: daily,
            monthly_budget_nano_usd: monthly,
            admin: false,
        };
        self.records.push(record.clone());
        self.save()?;
        Ok((record, key))
    }

    /// Creates an admin key: it may also block and unblock peers.
    pub fn create_admin(&mut self, name: &str) -> Result<(KeyRecord, String)> {
        let (_, key) = self.create(name)?;
        let record = self.records.last_mut().context("the key just created")?;
        record.admin = true;
        let record = record.clone();
        self.save()?;
        Ok((record, key))
    }

    /// Revokes by id or name.
    pub fn revoke(&mut self, id_or_name: &str) -> Result<KeyRecord> {
        let Some(record) = self
            .records
            .iter_mut()
            .find(|r| r.id == id_or_name || r.name == id_or_name)
        else {
            bail!("no API key with id or name `{id_or_name}` (see `sharemesh keys list`)");
        };
        record.revoked = true;
        let record = record.clone();
        self.save()?;
        Ok(record)
    }

    pub fn active(&self) -> Vec<KeyRecord> {
        self.records
            .iter()
            .filter(|r| !r.revoked)
            .cloned()
            .collect()
    }
}

/// What the API checks keys against: the key file, re-read whenever it changes, so
/// `keys create` and `keys revoke` take effect on a running node without a restart.
/// The default requires no key.
#[derive(Clone, Debug, Default)]
pub struct KeyCheck {
    live: Option<Arc<LiveKeys>>,
}

#[derive(Debug)]
struct LiveKeys {
    path: PathBuf,
    cache: Mutex<Cached>,
}

#[derive(Debug, Default)]
struct Cached {
    /// The file's modification time and length when `active` was read.
    stamp: Option<(SystemTime, u64)>,
    active: Vec<KeyRecord>,
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

impl KeyCheck {
    /// Requires a key from `<data_dir>/api_keys.json` (read now, and again whenever it
    /// changes).
    pub fn open(data_dir: &Path) -> Result<Self> {
        let store = KeyStore::open(data_dir)?;
        let cached = Cached {
            stamp: stamp(&store.path),
            active: store.active(),
        };
        Ok(Self {
            live: Some(Arc::new(LiveKeys {
                path: store.path,
                cache: Mutex::new(cached),
            })),
        })
    }

    pub fn is_required(&self) -> bool {
        self.live.is_some()
    }

    /// Runs `look` over the active keys, re-reading the file first if it changed
    /// (`None` when keys are not required).
    fn with_active<T>(&self, look: impl FnOnce(&[KeyRecord]) -> T) -> Option<T> {
        let live = self.live.as_ref()?;
        let mut cache = live.cache.lock().ok()?;
        let now = stamp(&live.path);
        if now != cache.stamp {
            cache.stamp = now;
            match KeyStore::open(live.path.parent().unwrap_or(Path::new("."))) {
                Ok(store) => cache.active = store.active(),
                // A half-edited file must not let anyone in nor lock everyone out: the
                // keys read last stay in force until the file reads again.
                Err(err) => tracing::warn!(%err, "API keys not reloaded"),
            }
        }
        Some(look(&cache.active))
    }

    /// Every active key now (empty when keys are not required).
    pub fn active(&self) -> Vec<KeyRecord> {
        self.with_active(<[KeyRecord]>::to_vec).unwrap_or_default()
    }

    /// The active key matching `presented`, if keys are required and it is one.
    pub fn identify(&self, presented: &str) -> Option<KeyRecord> {
        let digest = hash(presented);
        self.with_active(|keys| keys.iter().find(|r| r.sha256 == digest).cloned())?
    }

    pub fn allows(&self, presented: &str) -> bool {
        !self.is_required() || self.identify(presented).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stored_hashed_and_can_be_revoked() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut store = KeyStore::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let (record, key) = store.create("ci").unwrap_or_else(|e| panic!("{e}"));
        let text = fs::read_to_string(dir.path().join("api_keys.json")).unwrap_or_default();
        assert!(!text.contains(&key), "the secret must not be stored");
        let check = KeyCheck::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert!(check.allows(&key));
        assert!(!check.allows("sk-sm-wrong"));
        // A revocation takes effect on the running check, without reopening it.
        store.revoke(&record.id).unwrap_or_else(|e| panic!("{e}"));
        assert!(!check.allows(&key));
        assert!(KeyStore::open(dir.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .active()
            .is_empty());
        // A key created later is taken too; a corrupt file keeps the keys read last.
        let (_, later) = store.create("later").unwrap_or_else(|e| panic!("{e}"));
        assert!(check.allows(&later));
        fs::write(dir.path().join("api_keys.json"), b"{ half-written").unwrap_or_default();
        assert!(check.allows(&later));
        assert!(!check.allows(&key));
    }
}
