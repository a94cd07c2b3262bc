//! Verification by re-execution, on the buyer's side (SPEC.md §12).
//!
//! After a segment ends, the buyer draws from the secret it committed to in the request
//! whether to verify it, at a rate that is 1 for providers it has not yet verified
//! enough, for cheap and for suspected ones, and falls with a verified record. A
//! verified segment is replayed teacher-forced by a [`Replayer`] (the node's own
//! engine: a gateway with `--verify`, or a provider's gateway) and compared with the
//! fingerprints the provider committed to: on the same execution profile any
//! difference is fraud (`crate::verify::examine`). Fraud is signed into a `FraudProof`, gossiped, and voids the
//! provider's pending receipts; every node that can replay the proof confirms it and
//! drops the provider; one that cannot only raises its audit rate for it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, RwLock};

use futures::future::BoxFuture;
use sharemesh_mesh::clock::now_ms;
pub use sharemesh_protocol::commitment::{ReplayRequest as ReplayJob, ReplayResult};
use sharemesh_protocol::{ExecutionProfile, JobId, ModelId, NanoUsd, NodeId};
use sharemesh_reputation::{AuditRule, Dealings, DEALINGS_HALF_LIFE_MS};
use tokio::sync::Semaphore;

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
    /// Jobs replayed on another profile beyond the tolerance (no proof; suspected).
    pub suspicious: u64,
    pub frauds_confirmed_from_gossip: u64,
    pub proofs_unconfirmed: u64,
    pub proofs_refuted: u64,
    /// Gossiped proofs over their reporter's or accused's hourly budget, not checked.
    pub proofs_rate_limited: u64,
    pub skipped: u64,
    /// Checks whose two runs differed and were not settled (both parties suspected).
    pub disputed: u64,
    /// Checks drawn that could not be made (no verifier, a window that failed).
    pub unchecked: u64,
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
    /// Verified jobs reporters this node trusts vouched for, per provider.
    pub vouched_jobs: std::collections::BTreeMap<String, u32>,
}

/// The auditor's state: who is verified, suspected or dropped.
pub struct Auditor {
    pub policy: AuditPolicy,
    replayer: RwLock<Option<Arc<dyn Replayer>>>,
    /// Whether gossiped proofs (anyone's to send) are replayed on `replayer`; off where
    /// it is a provider's serving engine.
    replays_gossip: std::sync::atomic::AtomicBool,
    /// What this node verified itself, per provider (what its reports say).
    dealings: Mutex<BTreeMap<NodeId, Dealings>>,
    /// Verified jobs per provider that reporters this node trusts vouched for.
    vouched: RwLock<BTreeMap<NodeId, u32>>,
    suspected: Mutex<HashMap<NodeId, Suspicion>>,
    /// The profile each provider last named: a lone one means every job is verified.
    profiles: Mutex<crate::verify::profiles::ProfileCensus>,
    banned: RwLock<Convicted>,
    stats: Mutex<AuditStats>,
    in_flight: Arc<Semaphore>,
    /// Tokens/s measured on the last jobs of each provider (newest last, ≤ 3).
    speeds: Mutex<HashMap<NodeId, VecDeque<f64>>>,
}

/// Why a provider is suspected here (every job verified).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Suspicion {
    /// Only a party to unsettled disputes: cleared when ground truth (a replay here)
    /// finds the work the disputes left open honest ([`Auditor::vindicate`]).
    Disputed,
    /// Something no replay answers (a finding about its claims, a replay on another
    /// profile far off, a fraud without a valid proof): for good.
    Lasting,
}

/// Providers dropped for fraud, at most [`MAX_CONVICTED`], the oldest conviction
/// forgotten first: each entry cost a replayed proof, so growing the set is expensive,
/// but not free (keys are), and memory is bounded. The ledger keeps the proofs
/// themselves (fewer, `ledger::MAX_FRAUD_PROOFS`).
#[derive(Default)]
struct Convicted {
    set: HashSet<NodeId>,
    order: VecDeque<NodeId>,
}

const MAX_CONVICTED: usize = 100_000;

impl Convicted {
    fn contains(&self, provider: &NodeId) -> bool {
        self.set.contains(provider)
    }

    /// `true` if `provider` was not convicted before.
    fn insert(&mut self, provider: NodeId) -> bool {
        if !self.set.insert(provider) {
            return false;
        }
        self.order.push_back(provider);
        while self.order.len() > MAX_CONVICTED {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
        true
    }

    fn iter(&self) -> impl Iterator<Item = &NodeId> {
        self.order.iter()
    }
}

/// Speed measurements kept per provider.
const SPEED_SAMPLES: usize = 3;
/// Providers whose speed is remembered; beyond it the map starts over.
const MAX_SPEED_RECORDS: usize = 10_000;

impl Auditor {
    pub fn new(policy: AuditPolicy) -> Self {
        let permits = policy.max_in_flight.max(1);
        Self {
            policy,
            replayer: RwLock::new(None),
            replays_gossip: std::sync::atomic::AtomicBool::new(true),
            dealings: Mutex::default(),
            vouched: RwLock::default(),
            suspected: Mutex::default(),
            profiles: Mutex::default(),
            banned: RwLock::default(),
            stats: Mutex::default(),
            in_flight: Arc::new(Semaphore::new(permits)),
            speeds: Mutex::default(),
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

    /// Keeps gossiped proofs off the replayer (a provider's own gateway, whose replayer
    /// is the engine its paying jobs run on): they are then handled as by a node that
    /// cannot replay them. Its own audits still replay there.
    pub fn keep_gossip_off_the_replayer(&self) {
        self.replays_gossip
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// The replayer for a gossiped proof, if gossip may use it.
    pub(crate) fn gossip_replayer(&self) -> Option<Arc<dyn Replayer>> {
        self.replays_gossip
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| self.replayer())
            .flatten()
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
                    .map(|s| s.keys().copied().collect())
                    .unwrap_or_default(),
            ),
            verified_jobs: self
                .dealings()
                .iter()
                .map(|(id, d)| (id.to_string(), d.verified_jobs))
                .collect(),
            vouched_jobs: self
                .vouched
                .read()
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

    pub fn is_suspected(&self, provider: &NodeId) -> bool {
        self.suspected
            .lock()
            .is_ok_and(|s| s.contains_key(provider))
    }

    /// Suspects `provider` for good.
    pub(crate) fn suspect(&self, provider: NodeId) {
        if let Ok(mut suspected) = self.suspected.lock() {
            suspected.insert(provider, Suspicion::Lasting);
        }
    }

    /// Suspects `party` to a dispute nothing settled, until ground truth does.
    pub(crate) fn suspect_disputed(&self, party: NodeId) {
        if let Ok(mut suspected) = self.suspected.lock() {
            suspected.entry(party).or_insert(Suspicion::Disputed);
        }
    }

    /// Ground truth found the work `party`'s disputes left open honest: a suspicion
    /// that came only from disputes ends (`true` if one did).
    pub(crate) fn vindicate(&self, party: &NodeId) -> bool {
        let Ok(mut suspected) = self.suspected.lock() else {
            return false;
        };
        if suspected.get(party) == Some(&Suspicion::Disputed) {
            suspected.remove(party);
            return true;
        }
        false
    }

    /// Changes `provider`'s record, aged to now first.
    fn deal(&self, provider: NodeId, change: impl FnOnce(&mut Dealings)) {
        if let Ok(mut dealings) = self.dealings.lock() {
            let entry = dealings.entry(provider).or_default();
            *entry = entry.aged(now_ms(), DEALINGS_HALF_LIFE_MS);
            change(entry);
        }
    }

    pub(crate) fn verified_ok(&self, provider: NodeId, tokens: u64) {
        self.deal(provider, |d| {
            d.verified_jobs = d.verified_jobs.saturating_add(1);
            d.verified_tokens = d.verified_tokens.saturating_add(tokens);
        });
    }

    pub(crate) fn verified_mismatch(&self, provider: NodeId) {
        self.deal(provider, |d| d.mismatches = d.mismatches.saturating_add(1));
    }

    /// What this node verified itself, per provider, aged to now (verified work counts
    /// half as much every `DEALINGS_HALF_LIFE_MS`).
    pub fn dealings(&self) -> BTreeMap<NodeId, Dealings> {
        let now = now_ms();
        self.dealings
            .lock()
            .map(|d| {
                d.iter()
                    .map(|(id, d)| (*id, d.aged(now, DEALINGS_HALF_LIFE_MS)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Restores dealings saved before a restart (unknown providers only).
    pub(crate) fn restore_dealings(&self, saved: BTreeMap<NodeId, Dealings>) {
        if let Ok(mut dealings) = self.dealings.lock() {
            for (provider, d) in saved {
                dealings.entry(provider).or_insert(d);
            }
        }
    }

    /// Replaces what trusted reporters vouched for (after a view is recomputed).
    pub(crate) fn set_vouched(&self, vouched: BTreeMap<NodeId, u32>) {
        if let Ok(mut slot) = self.vouched.write() {
            *slot = vouched;
        }
    }

    /// Records the decode speed a job of `provider` arrived at (first token to last:
    /// the round trip and the prefill are not in it).
    pub fn record_speed(&self, provider: NodeId, tokens_per_second: f64) {
        if !tokens_per_second.is_finite() || tokens_per_second <= 0.0 {
            return;
        }
        let Ok(mut speeds) = self.speeds.lock() else {
            return;
        };
        if speeds.len() >= MAX_SPEED_RECORDS && !speeds.contains_key(&provider) {
            speeds.clear();
        }
        let samples = speeds.entry(provider).or_default();
        samples.push_back(tokens_per_second);
        if samples.len() > SPEED_SAMPLES {
            samples.pop_front();
        }
    }

    /// The median of the last three measured speeds of `provider`, once there are three.
    pub fn measured_speed(&self, provider: &NodeId) -> Option<f64> {
        let speeds = self.speeds.lock().ok()?;
        let samples = speeds.get(provider)?;
        if samples.len() < SPEED_SAMPLES {
            return None;
        }
        let mut sorted: Vec<f64> = samples.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        Some(sorted[sorted.len() / 2])
    }

    /// Providers dropped for fraud.
    pub fn convicted(&self) -> BTreeSet<NodeId> {
        self.banned
            .read()
            .map(|b| b.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The share of `provider`'s jobs to verify (see [`AuditRule`]): its verified
    /// record is what this node verified plus what reporters it trusts vouched for.
    pub fn rate(&self, provider: &NodeId, price: NanoUsd, median_price: NanoUsd) -> f64 {
        let own = self.verified_jobs(provider);
        let vouched = self
            .vouched
            .read()
            .map_or(0, |v| v.get(provider).copied().unwrap_or(0));
        let verified = self.policy.rule.record(own, vouched);
        // A profile no other provider of its model runs is as good as a suspicion.
        let suspected =
            self.is_suspected(provider) || self.profiles.lock().is_ok_and(|p| p.is_lone(provider));
        let cheap = (price.0 as f64) < self.policy.cheap_below * median_price.0 as f64;
        self.policy.rule.rate(verified, suspected, cheap)
    }

    /// Remembers the profile `provider` named in an `Accept` for `model`.
    pub fn note_profile(&self, provider: NodeId, model: ModelId, profile: &ExecutionProfile) {
        if let Ok(mut profiles) = self.profiles.lock() {
            profiles.note(provider, model, profile);
        }
    }

    /// The jobs of `provider` this node verified itself, aged to now.
    pub fn verified_jobs(&self, provider: &NodeId) -> u32 {
        self.dealings.lock().map_or(0, |d| {
            d.get(provider)
                .map_or(0, |d| d.aged(now_ms(), DEALINGS_HALF_LIFE_MS).verified_jobs)
        })
    }

    /// A permit to replay now, or `None` (skipped) when enough replays are running.
    pub(crate) fn permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let permit = self.in_flight.clone().try_acquire_owned().ok();
        if permit.is_none() {
            self.count(|s| s.skipped += 1);
        }
        permit
    }

    /// A permit to replay, waiting up to `limit` for one (gossiped proofs queue behind
    /// the audits instead of running beside them all at once).
    pub(crate) async fn permit_within(
        &self,
        limit: std::time::Duration,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let permit = tokio::time::timeout(limit, self.in_flight.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok);
        if permit.is_none() {
            self.count(|s| s.skipped += 1);
        }
        permit
    }
}

/// The buyer's audit secret for a job, and the commitment the request carries.
pub fn audit_secret(job: &JobId) -> ([u8; 32], sharemesh_protocol::Digest) {
    use rand::Rng;
    let secret: [u8; 32] = rand::rng().random();
    let commitment = sharemesh_protocol::commitment::audit_commitment(&secret, job);
    (secret, commitment)
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sharemesh_protocol::{
        Accept, Digest, JobRequest, Keypair, Prompt, Sampling, StepFingerprint, Tier,
    };

    #[test]
    fn convictions_are_bounded_and_the_oldest_is_forgotten_first() {
        let mut convicted = Convicted::default();
        let id = |i: usize| {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
            NodeId::from_bytes(bytes)
        };
        for i in 0..MAX_CONVICTED {
            assert!(convicted.insert(id(i)));
        }
        assert!(
            !convicted.insert(id(7)),
            "a second conviction changes nothing"
        );
        assert!(convicted.insert(id(MAX_CONVICTED)));
        assert!(!convicted.contains(&id(0)));
        assert!(convicted.contains(&id(1)) && convicted.contains(&id(MAX_CONVICTED)));
        assert_eq!(convicted.iter().count(), MAX_CONVICTED);
    }

    pub(crate) fn profile(engine: &str) -> ExecutionProfile {
        ExecutionProfile {
            engine: engine.into(),
            version: "1".into(),
            isa: "avx2".into(),
            quantization: "Q4_1".into(),
            device: "cpu".into(),
        }
    }

    pub(crate) fn fp(token: u32, logit: f32) -> StepFingerprint {
        StepFingerprint {
            top: vec![
                (token, logit.to_bits()),
                (token + 1, (logit - 2.0).to_bits()),
            ],
        }
    }

    /// A job `buyer` asks `provider` to run of `model` ("hi", temperature 0.7, nothing
    /// resumed), and the provider's `Accept` of it on the kernels.
    pub(crate) fn job(buyer: &Keypair, provider: &Keypair, model: ModelId) -> (JobRequest, Accept) {
        let request = JobRequest {
            job_id: JobId::from_bytes([3; 16]),
            buyer: buyer.node_id(),
            provider: provider.node_id(),
            model,
            prompt: Prompt::Text("hi".into()),
            sampling: Sampling {
                temperature: 0.7,
                ..Sampling::default()
            },
            max_price_per_token: NanoUsd(10),
            tier: Tier::OnDemand,
            deadline_ms: 0,
            resume: vec![],
            audit_commitment: Digest::from_bytes([0; 32]),
        };
        let accept = Accept {
            job_id: request.job_id,
            provider: provider.node_id(),
            price_per_token: NanoUsd(10),
            prompt_tokens: 2,
            credit_window_tokens: 64,
            profile: profile("sharemesh-kernels"),
        };
        (request, accept)
    }

    /// A provider with a verified record is checked at a falling rate — unless the
    /// profile it names is one no other provider of the model runs (nobody can hold it
    /// to the bit): then every job again.
    #[test]
    fn a_profile_nobody_else_runs_means_every_job_is_verified() {
        let auditor = Auditor::new(AuditPolicy::default());
        let (lone, other) = (NodeId::from_bytes([1; 32]), NodeId::from_bytes([2; 32]));
        let model = ModelId::from_bytes([4; 32]);
        for _ in 0..20 {
            auditor.verified_ok(lone, 64);
        }
        let rate = || auditor.rate(&lone, NanoUsd(100), NanoUsd(100));
        assert!(rate() < 0.2, "{}", rate());
        auditor.note_profile(other, model, &profile("sharemesh-kernels"));
        auditor.note_profile(lone, model, &profile("sharemesh-kernels"));
        assert!(rate() < 0.2, "the same profile as another provider");
        auditor.note_profile(lone, model, &profile("candle"));
        assert_eq!(rate(), 1.0);
    }

    /// A dispute's suspicion ends when ground truth finds the party honest; a lasting
    /// one (a claim that does not fit, a far-off replay) does not.
    #[test]
    fn only_a_suspicion_from_disputes_is_vindicated() {
        let auditor = Auditor::new(AuditPolicy::default());
        let (disputed, lasting) = (NodeId::from_bytes([1; 32]), NodeId::from_bytes([2; 32]));
        auditor.suspect_disputed(disputed);
        auditor.suspect(lasting);
        auditor.suspect_disputed(lasting); // A dispute does not soften a lasting one.
        assert!(auditor.is_suspected(&disputed) && auditor.is_suspected(&lasting));
        assert_eq!(auditor.rate(&disputed, NanoUsd(100), NanoUsd(100)), 1.0);
        assert!(auditor.vindicate(&disputed));
        assert!(!auditor.vindicate(&lasting));
        assert!(!auditor.is_suspected(&disputed));
        assert!(auditor.is_suspected(&lasting));
        assert_eq!(auditor.view().suspected, vec![lasting.to_string()]);
        // A lasting suspicion after a dispute replaces it.
        auditor.suspect_disputed(disputed);
        auditor.suspect(disputed);
        assert!(!auditor.vindicate(&disputed));
    }
}
