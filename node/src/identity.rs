//! The node's ed25519 identity, persisted in `<data-dir>/identity.key` (mode 0600) so
//! the PeerId survives restarts. The same secret signs protocol envelopes.

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use sharemesh_protocol::Keypair;

pub const IDENTITY_FILE: &str = "identity.key";

/// Loads the identity from `data_dir`, creating a fresh one on first start.
pub fn load_or_create(data_dir: &Path) -> Result<Keypair> {
    let path = data_dir.join(IDENTITY_FILE);
    match fs::read(&path) {
        Ok(bytes) => {
            let secret: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
                anyhow::anyhow!(
                    "{} is {} bytes, expected a 32-byte ed25519 secret; move it away to create a new identity",
                    path.display(),
                    bytes.len()
                )
            })?;
            Ok(Keypair::from_secret(secret))
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(data_dir)
                .with_context(|| format!("creating data directory {}", data_dir.display()))?;
            let mut secret = [0u8; 32];
            rand::fill(&mut secret);
            write_secret(&path, &secret)?;
            Ok(Keypair::from_secret(secret))
        }
        Err(err) => Err(err).with_context(|| format!("reading {}", path.display())),
    }
}

/// A deterministic identity from a seed, for testnets (node index → key).
pub fn from_seed(seed: u64) -> Keypair {
    let mut secret = [0u8; 32];
    secret[..8].copy_from_slice(&seed.to_le_bytes());
    secret[8..16].copy_from_slice(b"shrmesh!");
    Keypair::from_secret(secret)
}

fn write_secret(path: &Path, secret: &[u8; 32]) -> Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = match options.open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            bail!("{} appeared while creating it; start again", path.display())
        }
        Err(err) => return Err(err).with_context(|| format!("creating {}", path.display())),
    };
    file.write_all(secret)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes a seeded identity into `data_dir` if none exists (testnet launcher).
pub fn install_seeded(data_dir: &Path, seed: u64) -> Result<Keypair> {
    let path = data_dir.join(IDENTITY_FILE);
    if !path.exists() {
        fs::create_dir_all(data_dir)
            .with_context(|| format!("creating data directory {}", data_dir.display()))?;
        write_secret(&path, &from_seed(seed).secret())?;
    }
    load_or_create(data_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_persists_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        let second = load_or_create(dir.path()).unwrap();
        assert_eq!(first.node_id(), second.node_id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(IDENTITY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_corrupt_identity_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(IDENTITY_FILE), b"short").unwrap();
        let err = load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains("expected a 32-byte"), "{err}");
    }
}
