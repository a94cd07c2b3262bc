//! Verification by re-execution, on the buyer's side (SPEC.md §12).
//!
//! After a segment ends, the buyer draws from the secret it committed to in the request
//! whether to verify it, at a rate that is 1 for providers it has not yet verified
//! enough, for cheap and for suspected ones, and falls with a verified record. A
//! verified segment is replayed teacher-forced by a [`Replayer`] (the node's own
//! engine: a gateway with `--verify`, or a provider's gateway) and compared with the
//! fingerprints the provider committed to: on the same execution profile any
//! difference is fraud. Fraud is signed into a [`FraudProof`], gossiped, and voids the
//! provider's pending receipts; every node that can replay the proof confirms it and
//! drops the provider; one that cannot only raises its audit rate for it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use futures::future::BoxFuture;
pub use sharemesh_protocol::commitment::{ReplayRequest as ReplayJob, ReplayResult};
use sharemesh_protocol::{ExecutionProfile, FraudProof, JobId, ModelId, NanoUsd, NodeId};
use sharemesh_reputation::AuditRule;
use tokio::sync::Semaphore;

use crate::transcript::Transcript;

/// Something that holds models and can replay jobs on them. The node implements it
/// over its engine; the gateway does not link one.
pub trait Replayer: Send + Sync + 'static {
    /// The profile `model` would be replayed on, if this node holds it.
    fn profile(&self, model: &ModelId) -> Option<ExecutionProfile>;
    fn replay(&self, job: ReplayJob) -> BoxFuture<'static, Result<ReplayResult, String>>;
}

/// How often to verify.
#[derive(Clone, Debug)]
pub struct AuditPolicy {
    /// The rate rule (`sharemesh_reputation::AuditRule`: every job of a newcomer,
    /// falling with the verified record to a floor).
    pub rule: AuditRule,
    /// A price below this share of the quoted median counts as cheap: verified always.
    pub cheap_below: f64,
    /// Replays in flight at once; more are skipped (and counted).
    pub max_in_flight: usize,
}

impl Default for AuditPolicy {
    fn default() -> Self {
        Self {
            rule: AuditRule::default(),
            cheap_below: 0.5,
            max_in_flight: 2,
        }
    }
}

/// Counters for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditStats {
    pub drawn: u64,
    pub verified_ok: u64,
    pub frauds_found: u64,
    pub frauds_confirmed_from_gossip: u64,
    pub proofs_unconfirmed: u64,
    pub proofs_refuted: u64,
    pub skipped: u64,
    pub replayed_tokens: u64,
}

/// The auditor's state as `GET /v1/trust` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AuditView {
    pub stats: AuditStats,
    /// Whether this node holds a model to replay with (`--verify`, or a provider's).
    pub replays: bool,
    pub dropped_for_fraud: Vec<String>,
    pub suspected: Vec<String>,
    pub verified_jobs: std::collections::BTreeMap<String, u32>,
}

/// The auditor's state: who is verified, suspected or dropped.
pub struct Auditor {
    pub policy: AuditPolicy,
    replayer: RwLock<Option<Arc<dyn Replayer>>>,
    verified: Mutex<HashMap<NodeId, u32>>,
    suspected: Mutex<HashSet<NodeId>>,
    banned: RwLock<HashSet<NodeId>>,
    stats: Mutex<AuditStats>,
    in_flight: Arc<Semaphore>,
}

/// What a segment's audit found.
#[derive(Debug)]
pub enum Finding {
    /// Every committed step replayed exactly.
    Honest { steps: usize },
    /// A step differs on a profile that replays exactly (or breaks the greedy rule):
    /// the unsigned proof.
    Fraud(Box<FraudProof>),
    /// Nothing provable: another profile, no replayer for the model, or a replay error.
    Unchecked(String),
}

impl Auditor {
    pub fn new(policy: AuditPolicy) -> Self {
        let permits = policy.max_in_flight.max(1);
        Self {
            policy,
            replayer: RwLock::new(None),
            verified: Mutex::default(),
            suspected: Mutex::default(),
            banned: RwLock::default(),
            stats: Mutex::default(),
            in_flight: Arc::new(Semaphore::new(permits)),
        }
    }

    pub fn set_replayer(&self, replayer: Arc<dyn Replayer>) {
        if let Ok(mut slot) = self.replayer.write() {
            *slot = Some(replayer);
        }
    }

    pub fn replayer(&self) -> Option<Arc<dyn Replayer>> {
        self.replayer.read().ok().and_then(|r| r.clone())
    }

    pub fn stats(&self) -> AuditStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    pub(crate) fn count(&self, change: impl FnOnce(&mut AuditStats)) {
        if let Ok(mut stats) = self.stats.lock() {
            change(&mut stats);
        }
    }

    /// What this gateway knows, for `GET /v1/trust`.
    pub fn view(&self) -> AuditView {
        let sorted = |mut ids: Vec<NodeId>| {
            ids.sort();
            ids.into_iter().map(|id| id.to_string()).collect()
        };
        AuditView {
            stats: self.stats(),
            replays: self.replayer().is_some(),
            dropped_for_fraud: sorted(
                self.banned
                    .read()
                    .map(|b| b.iter().copied().collect())
                    .unwrap_or_default(),
            ),
            suspected: sorted(
                self.suspected
                    .lock()
                    .map(|s| s.iter().copied().collect())
                    .unwrap_or_default(),
            ),
            verified_jobs: self
                .verified
                .lock()
                .map(|v| v.iter().map(|(id, n)| (id.to_string(), *n)).collect())
                .unwrap_or_default(),
        }
    }

    pub fn is_banned(&self, provider: &NodeId) -> bool {
        self.banned
            .read()
            .is_ok_and(|banned| banned.contains(provider))
    }

    /// Drops `provider` from routing; `true` if it was not dropped before.
    pub(crate) fn ban(&self, provider: NodeId) -> bool {
        self.banned
            .write()
            .is_ok_and(|mut banned| banned.insert(provider))
    }

    pub(crate) fn suspect(&self, provider: NodeId) {
        if let Ok(mut suspected) = self.suspected.lock() {
            suspected.insert(provider);
        }
    }

    pub(crate) fn verified_ok(&self, provider: NodeId) {
        if let Ok(mut verified) = self.verified.lock() {
            *verified.entry(provider).or_default() += 1;
        }
    }

    /// The share of `provider`'s jobs to verify (see [`AuditRule`]).
    pub fn rate(&self, provider: &NodeId, price: NanoUsd, median_price: NanoUsd) -> f64 {
        let verified = self
            .verified
            .lock()
            .map_or(0, |v| v.get(provider).copied().unwrap_or(0));
        let suspected = self.suspected.lock().is_ok_and(|s| s.contains(provider));
        let cheap = (price.0 as f64) < self.policy.cheap_below * median_price.0 as f64;
        self.policy.rule.rate(verified, suspected, cheap)
    }

    /// A permit to replay now, or `None` (skipped) when enough replays are running.
    pub(crate) fn permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let permit = self.in_flight.clone().try_acquire_owned().ok();
        if permit.is_none() {
            self.count(|s| s.skipped += 1);
        }
        permit
    }
}

/// Audits one transcript: the greedy rule first (no model needed), then a replay of
/// every step this provider committed to.
pub async fn examine(
    transcript: &Transcript,
    replayer: Option<Arc<dyn Replayer>>,
    reporter: NodeId,
) -> Finding {
    let profile = transcript.profile().clone();
    if let Some(index) = transcript.first_inconsistency() {
        let committed = transcript.committed();
        let step = index - transcript.request.resume.len();
        let fingerprint = committed
            .get(step)
            .map(|f| (*f).clone())
            .unwrap_or_default();
        return match transcript.proof(reporter, index, fingerprint, profile) {
            Some(proof) => Finding::Fraud(Box::new(proof)),
            None => Finding::Unchecked("the inconsistent step is too far in to prove".into()),
        };
    }
    let Some(replayer) = replayer else {
        return Finding::Unchecked("this node holds no model to replay with".into());
    };
    let model = transcript.request.model;
    let Some(own) = replayer.profile(&model) else {
        return Finding::Unchecked(format!("this node does not hold model {model}"));
    };
    if !profile.replays_exactly(&own) {
        return Finding::Unchecked(format!(
            "the job ran on {profile}, which {own} cannot replay bit for bit"
        ));
    }
    let sent = transcript.sent();
    if sent == 0 {
        return Finding::Honest { steps: 0 };
    }
    let job = ReplayJob {
        model,
        prompt: transcript.request.prompt.clone(),
        outputs: transcript.outputs(),
        from: transcript.request.resume.len(),
        seed: transcript.request.sampling.seed,
    };
    let replayed = match replayer.replay(job).await {
        Ok(replayed) => replayed,
        Err(err) => return Finding::Unchecked(format!("replay failed: {err}")),
    };
    match transcript.first_disagreement(&replayed.fingerprints) {
        None if replayed.fingerprints.len() >= sent => Finding::Honest { steps: sent },
        None => Finding::Unchecked("the replay scored fewer steps than were sent".into()),
        Some(found) => {
            match transcript.proof(reporter, found.index, found.replayed, replayed.profile) {
                Some(proof) => Finding::Fraud(Box::new(proof)),
                None => Finding::Unchecked("the differing step is too far in to prove".into()),
            }
        }
    }
}

/// What checking a gossiped proof showed.
#[derive(Debug, PartialEq, Eq)]
pub enum ProofCheck {
    /// Fraud: the greedy rule broken, or this node's replay differs as well.
    Confirmed,
    /// This node's exact replay matches what the provider committed to: the proof is
    /// false (its reporter lied or erred).
    Refuted,
    /// This node cannot replay it (no model, another profile).
    Unconfirmed(String),
}

/// Checks a proof whose signatures and chain already check: the greedy rule, or one
/// replayed step on this node's own model.
pub async fn check_proof(proof: &FraudProof, replayer: Option<Arc<dyn Replayer>>) -> ProofCheck {
    let evidence = match proof.evidence() {
        Ok(evidence) => evidence,
        Err(err) => return ProofCheck::Unconfirmed(err.to_string()),
    };
    if evidence.self_inconsistent() {
        return ProofCheck::Confirmed;
    }
    let Some(replayer) = replayer else {
        return ProofCheck::Unconfirmed("no model here to replay it".into());
    };
    let model = evidence.request.model;
    let Some(own) = replayer.profile(&model) else {
        return ProofCheck::Unconfirmed(format!("model {model} is not held here"));
    };
    if !evidence.profile.replays_exactly(&own) {
        return ProofCheck::Unconfirmed(format!("{} is not replayable on {own}", evidence.profile));
    }
    let from = evidence.before.len();
    let mut outputs = evidence.before.clone();
    outputs.push(evidence.token);
    let job = ReplayJob {
        model,
        prompt: evidence.request.prompt.clone(),
        outputs,
        from,
        seed: evidence.request.sampling.seed,
    };
    match replayer.replay(job).await {
        Ok(replayed) => match replayed.fingerprints.first() {
            Some(step) if evidence.contradicted_by(step, &replayed.profile) => {
                ProofCheck::Confirmed
            }
            Some(_) => ProofCheck::Refuted,
            None => ProofCheck::Unconfirmed("the replay scored nothing".into()),
        },
        Err(err) => ProofCheck::Unconfirmed(format!("replay failed: {err}")),
    }
}

/// The buyer's audit secret for a job, and the commitment the request carries.
pub fn audit_secret(job: &JobId) -> ([u8; 32], sharemesh_protocol::Digest) {
    use rand::Rng;
    let secret: [u8; 32] = rand::rng().random();
    let commitment = sharemesh_protocol::commitment::audit_commitment(&secret, job);
    (secret, commitment)
}
