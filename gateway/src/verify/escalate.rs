//! Ground truth for a node that does not hold a model: at the first check of a model it
//! cannot replay, it asks its [`ModelSource`] to hold the model (a gateway fetches a
//! catalog model within its memory budget) and buys checks meanwhile. A bought check can
//! end unsettled (two runs differ and the tie-breakers do not all agree — two colluders
//! against two honest providers look alike to a node without the model): such disputes
//! wait for the model, and once it is held the node replays them itself — the ground
//! truth no vote between providers can give (SPEC.md §12). So does every other piece of
//! work only providers vouched for while the model was fetched: each job a bought check
//! passed, and each window a verifier or tie-breaker signed — a colluder that passed its
//! partner's job signed the same wrong steps, and is convicted with them.
//!
//! What is paid back is not prevented, so while a model is fetched its providers are
//! held to one job on credit each: a provider that served the model since it was asked
//! for serves it again only once that work is judged here (or a hold after the ask —
//! [`credit_hold`] — so a slow download delays requests, never refuses them). A ring cheaper
//! than everyone serves one request per member before ground truth reaches it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use futures::future::BoxFuture;
use sharemesh_protocol::{ExecutionProfile, ModelId, NodeId};

use crate::verify::audit::{ReplayJob, ReplayResult, Replayer};
use crate::verify::transcript::Transcript;

/// Transcripts kept per model while its model is being fetched.
const PENDING_PER_MODEL: usize = 64;
/// Steps (prompt bound, resumed and sent tokens) kept in all models' transcripts: about
/// 70 bytes each (a token and its top-8 fingerprint), so a few MB at most.
const PENDING_STEPS: usize = 65_536;
/// Models asked for at most (each once).
const MAX_MODELS_ASKED: usize = 64;
/// The longest a provider that served a model being fetched waits for that work to be
/// judged ([`credit_hold`]).
pub const CREDIT_HOLD_MS: u64 = 20_000;

/// How long after a model was asked for a provider that served it meanwhile waits for
/// that work to be judged, where requests wait at most `max_wait` for a provider: two
/// thirds of it, at most [`CREDIT_HOLD_MS`] (20 s of the default 30), so a request held
/// back is served, not refused, when the download is slow; none where requests never
/// wait.
pub fn credit_hold(max_wait: std::time::Duration) -> u64 {
    let two_thirds = max_wait.as_millis().saturating_mul(2) / 3;
    u64::try_from(two_thirds).map_or(CREDIT_HOLD_MS, |ms| ms.min(CREDIT_HOLD_MS))
}
/// Providers held per model at most (beyond it, one more is not held).
const CREDIT_PROVIDERS: usize = 4_096;

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

/// Which models were asked for, and the transcripts waiting for them.
#[derive(Default)]
pub struct Escalation {
    asked: Mutex<HashSet<ModelId>>,
    pending: Mutex<Pending>,
}

/// The transcripts waiting for their models, and the steps they hold in all; the
/// providers on credit for each model asked for and not yet judged.
#[derive(Default)]
struct Pending {
    by_model: HashMap<ModelId, Vec<Transcript>>,
    steps: usize,
    credit: HashMap<ModelId, Credit>,
}

/// A model being fetched (or its waiting work replayed): when it was asked for, and
/// who served it since.
struct Credit {
    asked_ms: u64,
    served: HashSet<NodeId>,
}

impl Pending {
    /// Keeps `transcript` for its model (which must be waited for) while it fits the
    /// bounds; a transcript that does not fit is dropped (it stays as checked).
    fn keep(&mut self, transcript: &Transcript) {
        let steps = steps_held(transcript);
        let Some(waiting) = self.by_model.get_mut(&transcript.request.model) else {
            return;
        };
        if waiting.len() < PENDING_PER_MODEL && self.steps + steps <= PENDING_STEPS {
            self.steps += steps;
            waiting.push(transcript.clone());
        }
    }

    fn remove(&mut self, model: &ModelId) -> Vec<Transcript> {
        let waiting = self.by_model.remove(model).unwrap_or_default();
        let freed: usize = waiting.iter().map(steps_held).sum();
        self.steps = self.steps.saturating_sub(freed);
        waiting
    }
}

impl Credit {
    fn since(asked_ms: u64) -> Self {
        Self {
            asked_ms,
            served: HashSet::new(),
        }
    }
}

/// What keeping a transcript holds: its prompt's bound, its resumed and its sent steps.
fn steps_held(transcript: &Transcript) -> usize {
    let prompt = usize::try_from(transcript.request.prompt.token_bound()).unwrap_or(usize::MAX);
    prompt
        .saturating_add(transcript.request.resume.len())
        .saturating_add(transcript.sent())
}

impl Escalation {
    /// Whether `model` is to be asked for now (at `now_ms`): the first time it is
    /// wanted (its disputes and witnesses are kept from then until [`Self::settled`],
    /// its providers held to one job on credit until [`Self::judged`]).
    pub fn ask(&self, model: ModelId, now_ms: u64) -> bool {
        let (Ok(mut asked), Ok(mut pending)) = (self.asked.lock(), self.pending.lock()) else {
            return false;
        };
        if asked.contains(&model) || asked.len() >= MAX_MODELS_ASKED {
            return false;
        }
        asked.insert(model);
        pending.by_model.insert(model, Vec::new());
        pending.credit.insert(model, Credit::since(now_ms));
        true
    }

    /// `provider` serves `model` now: held to it, if the model is being fetched.
    pub fn served(&self, model: &ModelId, provider: NodeId) {
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        if let Some(credit) = pending.credit.get_mut(model) {
            if credit.served.len() < CREDIT_PROVIDERS {
                credit.served.insert(provider);
            }
        }
    }

    /// Whether `provider` is to wait before serving `model` again (at `now_ms`): it
    /// served the model since it was asked for, that work is not judged yet, and the
    /// hold (`hold_ms` from the ask) has not run out.
    pub fn on_credit(&self, model: &ModelId, provider: &NodeId, now_ms: u64, hold_ms: u64) -> bool {
        let Ok(pending) = self.pending.lock() else {
            return false;
        };
        pending.credit.get(model).is_some_and(|credit| {
            now_ms < credit.asked_ms.saturating_add(hold_ms) && credit.served.contains(provider)
        })
    }

    /// The work that waited for `model` has been judged (or the model could not be
    /// held): its providers serve it freely again.
    pub fn judged(&self, model: &ModelId) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.credit.remove(model);
        }
    }

    /// Keeps work that only providers vouched for (a job a bought check passed, a
    /// window a verifier signed) while its model is being fetched, to replay once it
    /// is held; nothing otherwise.
    pub fn witness(&self, transcript: &Transcript) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.keep(transcript);
        }
    }

    /// Records an unsettled dispute over `transcript`'s job (at `now_ms`).
    pub fn disputed(&self, transcript: Transcript, now_ms: u64) -> Next {
        let model = transcript.request.model;
        let (Ok(mut asked), Ok(mut pending)) = (self.asked.lock(), self.pending.lock()) else {
            return Next::Drop;
        };
        let first = !asked.contains(&model);
        if first && asked.len() >= MAX_MODELS_ASKED {
            return Next::Drop;
        }
        if !first && !pending.by_model.contains_key(&model) {
            return Next::Drop; // Asked before, and settled (held or not holdable).
        }
        asked.insert(model);
        pending.by_model.entry(model).or_default();
        pending.keep(&transcript);
        if first {
            pending.credit.insert(model, Credit::since(now_ms));
            Next::Fetch
        } else {
            Next::Wait
        }
    }

    /// The fetch of `model` ended: the transcripts that waited for it.
    pub fn settled(&self, model: &ModelId) -> Vec<Transcript> {
        self.pending
            .lock()
            .map(|mut pending| pending.remove(model))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharemesh_protocol::Keypair;

    /// A transcript of no chunks for `model` that resumed `resumed` steps.
    fn transcript(model: u8, resumed: usize) -> Transcript {
        let (buyer, provider) = (Keypair::from_secret([1; 32]), Keypair::from_secret([2; 32]));
        let (mut request, accept) =
            crate::verify::audit::tests::job(&buyer, &provider, self::model(model));
        request.resume = vec![7; resumed];
        Transcript::new(
            buyer.seal(&request, 1, 0, 60_000).unwrap(),
            provider.seal(&accept, 1, 0, 60_000).unwrap(),
            request,
            accept,
        )
    }

    fn model(byte: u8) -> ModelId {
        ModelId::from_bytes([byte; 32])
    }

    #[test]
    fn witnesses_are_kept_only_while_their_model_is_fetched() {
        let escalation = Escalation::default();
        escalation.witness(&transcript(1, 0));
        assert!(escalation.ask(model(1), 0));
        assert!(!escalation.ask(model(1), 0), "a model is asked for once");
        escalation.witness(&transcript(1, 0));
        escalation.witness(&transcript(2, 0)); // Another model, not asked for.
        assert_eq!(escalation.disputed(transcript(1, 3), 0), Next::Wait);
        let waiting = escalation.settled(&model(1));
        assert_eq!(
            waiting.len(),
            2,
            "the witness after asking, and the dispute"
        );
        assert!(escalation.settled(&model(2)).is_empty());
        // Settled: later work is checked here, not kept.
        escalation.witness(&transcript(1, 0));
        assert_eq!(escalation.disputed(transcript(1, 0), 0), Next::Drop);
        assert!(escalation.settled(&model(1)).is_empty());
        // A dispute over a model never asked for asks for it.
        assert_eq!(escalation.disputed(transcript(2, 0), 0), Next::Fetch);
        assert_eq!(escalation.settled(&model(2)).len(), 1);
    }

    #[test]
    fn what_is_kept_is_bounded_per_model_and_in_steps() {
        let escalation = Escalation::default();
        assert!(escalation.ask(model(1), 0) && escalation.ask(model(2), 0));
        for _ in 0..PENDING_PER_MODEL + 5 {
            escalation.witness(&transcript(1, 0));
        }
        assert_eq!(escalation.settled(&model(1)).len(), PENDING_PER_MODEL);
        assert!(escalation.ask(model(3), 0));
        let long = PENDING_STEPS / 2;
        escalation.witness(&transcript(2, long));
        escalation.witness(&transcript(3, long)); // Over the steps left: dropped.
        escalation.witness(&transcript(3, 10));
        assert_eq!(escalation.settled(&model(3)).len(), 1);
        assert_eq!(escalation.settled(&model(2)).len(), 1);
        // Settling frees the steps.
        assert!(escalation.ask(model(4), 0));
        escalation.witness(&transcript(4, long));
        assert_eq!(escalation.settled(&model(4)).len(), 1);
    }

    #[test]
    fn providers_serve_a_model_being_fetched_once_until_it_is_judged() {
        let escalation = Escalation::default();
        let (a, b) = (NodeId::from_bytes([1; 32]), NodeId::from_bytes([2; 32]));
        escalation.served(&model(1), a); // Before the ask: not held.
        assert!(!escalation.on_credit(&model(1), &a, 0, CREDIT_HOLD_MS));
        assert!(escalation.ask(model(1), 1_000));
        escalation.served(&model(1), a);
        assert!(escalation.on_credit(&model(1), &a, 1_001, CREDIT_HOLD_MS));
        assert!(
            !escalation.on_credit(&model(1), &b, 1_001, CREDIT_HOLD_MS),
            "b has not served"
        );
        assert!(
            !escalation.on_credit(&model(2), &a, 1_001, CREDIT_HOLD_MS),
            "another model"
        );
        // Settling (the model is held) keeps the hold until the waiting work is judged.
        escalation.settled(&model(1));
        assert!(escalation.on_credit(&model(1), &a, 1_002, CREDIT_HOLD_MS));
        // A slow download lets it serve again once the hold runs out.
        let out = 1_000 + CREDIT_HOLD_MS;
        assert!(escalation.on_credit(&model(1), &a, out - 1, CREDIT_HOLD_MS));
        assert!(!escalation.on_credit(&model(1), &a, out, CREDIT_HOLD_MS));
        escalation.judged(&model(1));
        assert!(!escalation.on_credit(&model(1), &a, 1_003, CREDIT_HOLD_MS));
        escalation.served(&model(1), b);
        assert!(
            !escalation.on_credit(&model(1), &b, 1_003, CREDIT_HOLD_MS),
            "judged: held no more"
        );
        // A dispute that asks for a model starts its hold.
        assert_eq!(escalation.disputed(transcript(3, 0), 5), Next::Fetch);
        escalation.served(&model(3), b);
        assert!(escalation.on_credit(&model(3), &b, 6, CREDIT_HOLD_MS));
        assert!(
            !escalation.on_credit(&model(3), &b, 6, 0),
            "no hold where nobody waits"
        );
    }

    #[test]
    fn the_hold_ends_before_a_held_request_stops_waiting() {
        use std::time::Duration;
        assert_eq!(credit_hold(Duration::from_secs(30)), 20_000);
        assert_eq!(credit_hold(Duration::from_secs(300)), CREDIT_HOLD_MS);
        assert_eq!(credit_hold(Duration::from_secs(6)), 4_000);
        assert_eq!(credit_hold(Duration::ZERO), 0);
        assert_eq!(credit_hold(Duration::MAX), CREDIT_HOLD_MS);
    }
}
