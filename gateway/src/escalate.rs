//! Ground truth for a node that does not hold a model: at the first check of a model it
//! cannot replay, it asks its [`ModelSource`] to hold the model (a gateway fetches a
//! catalog model within its memory budget) and buys checks meanwhile. A bought check can
//! end unsettled (two runs differ and the tie-breakers do not all agree — two colluders
//! against two honest providers look alike to a node without the model): such disputes
//! wait for the model, and once it is held the node replays them itself — the ground
//! truth no vote between providers can give (SPEC.md §12).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use futures::future::BoxFuture;
use sharemesh_protocol::{ExecutionProfile, ModelId};

use crate::audit::{ReplayJob, ReplayResult, Replayer};
use crate::transcript::Transcript;

/// Disputed transcripts kept per model while its model is being fetched.
const PENDING_PER_MODEL: usize = 8;
/// Models asked for at most (each once).
const MAX_MODELS_ASKED: usize = 64;

/// Where a node gets a model to replay with: `None` when it cannot hold it (not a
/// model it can fetch, over its memory budget, the download or load failed).
pub trait ModelSource: Send + Sync + 'static {
    fn hold(&self, model: ModelId) -> BoxFuture<'static, Option<Arc<dyn Replayer>>>;
}

/// The replayers of the models a node holds, each found by the model it replays.
#[derive(Default)]
pub struct HeldModels(RwLock<Vec<Arc<dyn Replayer>>>);

impl HeldModels {
    pub fn add(&self, replayer: Arc<dyn Replayer>) {
        if let Ok(mut held) = self.0.write() {
            held.push(replayer);
        }
    }

    fn holding(&self, model: &ModelId) -> Option<Arc<dyn Replayer>> {
        let held = self.0.read().ok()?;
        held.iter().find(|r| r.profile(model).is_some()).cloned()
    }
}

impl Replayer for HeldModels {
    fn profile(&self, model: &ModelId) -> Option<ExecutionProfile> {
        self.holding(model)?.profile(model)
    }

    fn replay(&self, job: ReplayJob) -> BoxFuture<'static, Result<ReplayResult, String>> {
        match self.holding(&job.model) {
            Some(replayer) => replayer.replay(job),
            None => {
                let why = format!("model {} is not held here", job.model);
                Box::pin(async move { Err(why) })
            }
        }
    }
}

/// What an unsettled dispute does next for one model.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Ask the source for the model (it was not asked for yet).
    Fetch,
    /// Wait: the model is being fetched; the transcript is kept for then.
    Wait,
    /// Nothing: the model was asked for already and could not be held (or too many
    /// models were asked for).
    Drop,
}

/// Which models were asked for, and the disputed transcripts waiting for them.
#[derive(Default)]
pub struct Escalation {
    asked: Mutex<HashSet<ModelId>>,
    pending: Mutex<HashMap<ModelId, Vec<Transcript>>>,
}

impl Escalation {
    /// Whether `model` is to be asked for now: the first time it is wanted (its
    /// disputes are kept from then until [`Self::settled`]).
    pub fn ask(&self, model: ModelId) -> bool {
        let (Ok(mut asked), Ok(mut pending)) = (self.asked.lock(), self.pending.lock()) else {
            return false;
        };
        if asked.contains(&model) || asked.len() >= MAX_MODELS_ASKED {
            return false;
        }
        asked.insert(model);
        pending.insert(model, Vec::new());
        true
    }

    /// Records an unsettled dispute over `transcript`'s job.
    pub fn disputed(&self, transcript: Transcript) -> Next {
        let model = transcript.request.model;
        let (Ok(mut asked), Ok(mut pending)) = (self.asked.lock(), self.pending.lock()) else {
            return Next::Drop;
        };
        let first = !asked.contains(&model);
        if first && asked.len() >= MAX_MODELS_ASKED {
            return Next::Drop;
        }
        if !first && !pending.contains_key(&model) {
            return Next::Drop; // Asked before, and settled (held or not holdable).
        }
        asked.insert(model);
        let waiting = pending.entry(model).or_default();
        if waiting.len() < PENDING_PER_MODEL {
            waiting.push(transcript);
        }
        if first {
            Next::Fetch
        } else {
            Next::Wait
        }
    }

    /// The fetch of `model` ended: the transcripts that waited for it.
    pub fn settled(&self, model: &ModelId) -> Vec<Transcript> {
        self.pending
            .lock()
            .ok()
            .and_then(|mut pending| pending.remove(model))
            .unwrap_or_default()
    }
}
