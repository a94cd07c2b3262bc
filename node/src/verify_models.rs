//! The models a gateway replays with (SPEC §12): those its data dir holds, loaded at
//! start, and a catalog model fetched when a check bought from providers ends
//! unsettled — all within one memory budget (bytes of model files).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Result};
use futures::future::BoxFuture;
use sharemesh_engine::catalog::{Catalog, CatalogEntry, KNOWN_MODELS};
use sharemesh_engine::{Engine, LoadedModel, TokenEngine};
use sharemesh_gateway::verify::audit::Replayer;
use sharemesh_gateway::verify::escalate::ModelSource;
use sharemesh_gateway::verify::trust::Trust;
use sharemesh_protocol::ModelId;

use crate::replay::EngineReplayer;

/// Loads the models `data_dir` holds within `budget` bytes (smallest first) in the
/// background and replays with them; with `fetch`, what is left of the budget is for
/// catalog models fetched on an unsettled dispute.
pub fn hold(data_dir: &Path, budget: u64, fetch: bool, trust: &Arc<Trust>) {
    let held = held_models(data_dir, budget).unwrap_or_else(|err| {
        tracing::warn!(%err, "could not read the models this data dir holds");
        Vec::new()
    });
    let used: u64 = held.iter().map(|entry| entry.size_bytes).sum();
    if fetch && used < budget {
        trust.escalate_with(Arc::new(CatalogFetch {
            data_dir: data_dir.to_path_buf(),
            left: Arc::new(AtomicU64::new(budget - used)),
        }));
    }
    if held.is_empty() {
        return;
    }
    let trust = trust.clone();
    tokio::spawn(async move {
        let loading = tokio::task::spawn_blocking(move || {
            held.iter()
                .filter_map(|entry| {
                    load(entry)
                        .map_err(
                            |err| tracing::warn!(model = %entry.name, %err, "not held for replay"),
                        )
                        .ok()
                })
                .collect::<Vec<_>>()
        });
        let Ok(models) = loading.await else { return };
        if models.is_empty() {
            return;
        }
        let names: Vec<String> = models.iter().map(|m| m.descriptor.name.clone()).collect();
        trust.hold(replayer(models));
        tracing::info!(models = ?names, "verifying the jobs of held models by replay");
    });
}

/// The models this data dir holds that fit `budget` bytes of model files, smallest first.
fn held_models(data_dir: &Path, budget: u64) -> Result<Vec<CatalogEntry>> {
    let mut held: Vec<CatalogEntry> = Catalog::open(data_dir)?
        .entries()
        .iter()
        .filter(|entry| entry.path.is_file())
        .cloned()
        .collect();
    held.sort_by_key(|entry| entry.size_bytes);
    let mut left = budget;
    held.retain(|entry| {
        let fits = entry.size_bytes <= left;
        if fits {
            left -= entry.size_bytes;
        }
        fits
    });
    Ok(held)
}

fn load(entry: &CatalogEntry) -> Result<LoadedModel> {
    let device = sharemesh_engine::default_device();
    Ok(LoadedModel::load(
        &entry.path,
        entry.id,
        &entry.name,
        device,
    )?)
}

fn replayer(models: Vec<LoadedModel>) -> Arc<dyn Replayer> {
    for model in &models {
        in_background(model);
    }
    let engine: Arc<dyn TokenEngine> = Arc::new(Engine::spawn(models, 4));
    Arc::new(EngineReplayer(engine))
}

/// Fetches a catalog model into the data dir (`sharemesh models fetch`) and loads it,
/// while the budget left allows.
#[derive(Clone)]
struct CatalogFetch {
    data_dir: PathBuf,
    /// Bytes of model files still allowed.
    left: Arc<AtomicU64>,
}

impl CatalogFetch {
    fn fetch_and_load(&self, name: &str) -> Result<LoadedModel> {
        let entry = Catalog::open(&self.data_dir)?.fetch_known(name)?;
        let size = entry.size_bytes;
        let taken = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(size)
            });
        if taken.is_err() {
            bail!("{name} ({size} bytes) does not fit what is left of --verify-memory-mib");
        }
        load(&entry)
    }
}

impl ModelSource for CatalogFetch {
    fn hold(&self, model: ModelId) -> BoxFuture<'static, Option<Arc<dyn Replayer>>> {
        let known = KNOWN_MODELS.iter().find(|m| m.id == model.to_string());
        let Some(name) = known.map(|m| m.name) else {
            return Box::pin(async { None }); // Not a catalog model: nothing to fetch.
        };
        let this = self.clone();
        Box::pin(async move {
            let fetched = tokio::task::spawn_blocking(move || this.fetch_and_load(name)).await;
            match fetched {
                Ok(Ok(loaded)) => Some(replayer(vec![loaded])),
                Ok(Err(err)) => {
                    tracing::warn!(model = name, %err, "could not fetch the model to verify with");
                    None
                }
                Err(_) => None,
            }
        })
    }
}

/// Lowers a replaying model's threads, so that verification takes only the cores serving
/// leaves (a gateway beside a provider on one host slowed its decode by a fifth before).
pub(crate) fn in_background(model: &LoadedModel) {
    match model.run_in_background() {
        Ok(()) => {
            tracing::debug!(model = %model.descriptor.name, "replays run at background priority")
        }
        Err(err) => {
            tracing::info!(model = %model.descriptor.name, %err, "replays run at normal priority")
        }
    }
}
