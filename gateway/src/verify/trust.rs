//! What the gateway does with verification's findings: reputation, the ledger's
//! disputes, routing, and the fraud-proof gossip (SPEC.md §12). The auditing itself is
//! [`crate::verify::audit`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sharemesh_ledger::Ledger;
use sharemesh_mesh::clock::{now_ms, SeqCounter};
use sharemesh_mesh::{MeshEvent, MeshHandle};
use sharemesh_protocol::commitment::audit_draw;
use sharemesh_protocol::{FraudProof, JobId, Keypair, ModelId, NanoUsd, NodeId, SignedEnvelope};
use sharemesh_reputation::{Dealings, Outcome, ReputationBook};
use std::collections::{BTreeMap, HashMap};
use tokio::sync::broadcast;
use tracing::Instrument;

use crate::verify::attest::Attestations;
use crate::verify::audit::{AuditPolicy, Auditor, Replayer};
use crate::verify::escalate::{Escalation, HeldModels, ModelSource, Next};
use crate::verify::examine::{check_proof, examine, Finding, ProofCheck};
use crate::verify::outsource::Outsourcing;
use crate::verify::standing::Standing;
use crate::verify::transcript::Transcript;

/// How a node checks providers' work (`GET /v1/trust`'s `verification`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Not at all (`gateway --no-verify`).
    Off,
    /// Replayed on the model this node holds.
    Replay,
    /// Windows bought from other providers.
    Outsourced,
    /// Replayed where it holds the model, bought elsewhere.
    ReplayAndOutsourced,
}

impl Verification {
    pub fn name(self) -> &'static str {
        match self {
            Verification::Off => "off",
            Verification::Replay => "replay",
            Verification::Outsourced => "outsourced",
            Verification::ReplayAndOutsourced => "replay+outsourced",
        }
    }
}

/// A fraud proof is signed for this long (receivers open it within).
const PROOF_LIFETIME_MS: u64 = 30 * 24 * 3_600_000;
/// How long a gossiped proof waits for a replay slot before it is dropped.
const PROOF_CHECK_WAIT: Duration = Duration::from_secs(30);
/// A reputation report is valid this long (a node that stops reporting fades out).
const REPORT_LIFETIME_MS: u64 = 24 * 3_600_000;
/// How often a node reports and recomputes its view, by default.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(60);
/// gossipsub application score of a convicted provider: far below the graylist
/// threshold (−400), so its gossip is ignored.
const CONVICTED_APPLICATION_SCORE: f64 = -1000.0;
/// The application score of the most trusted node; others in proportion.
const TRUSTED_APPLICATION_SCORE: f64 = 10.0;

pub struct Trust {
    pub auditor: Auditor,
    /// Reports and this node's EigenTrust view.
    pub standing: Standing,
    /// Hardware attestations and what did not fit in them.
    pub attestations: Attestations,
    /// How often this node publishes its report and recomputes its view (ms).
    report_interval: tokio::sync::watch::Sender<Duration>,
    mesh: MeshHandle,
    key: Arc<Keypair>,
    ledger: Option<Arc<Ledger>>,
    reliability: Arc<Mutex<ReputationBook<NodeId>>>,
    /// Sequence numbers of this node's reports.
    seq: SeqCounter,
    /// Checks bought from other providers where this node cannot replay a model.
    outsourcing: OnceLock<Arc<Outsourcing>>,
    /// A hash of the dealings last saved to the ledger.
    saved_dealings: AtomicU64,
    /// How many gossiped proofs are checked per reporter and per accused.
    proof_limits: Mutex<crate::verify::proof_limits::ProofLimits>,
    /// Where an unsettled dispute's model comes from, and the disputes waiting for it.
    escalation: OnceLock<(Arc<dyn ModelSource>, Escalation)>,
    /// The models held by `hold`, one replayer for them all; `holding` orders holds.
    held: Arc<HeldModels>,
    holding: Mutex<()>,
}

/// One segment to consider for verification.
pub struct SegmentAudit {
    pub transcript: Transcript,
    pub secret: [u8; 32],
    pub job_id: JobId,
    pub price: NanoUsd,
    pub median_price: NanoUsd,
}

impl Trust {
    pub fn new(
        mesh: MeshHandle,
        key: Arc<Keypair>,
        ledger: Option<Arc<Ledger>>,
        reliability: Arc<Mutex<ReputationBook<NodeId>>>,
        policy: AuditPolicy,
    ) -> Arc<Self> {
        let trust = Arc::new(Self {
            auditor: Auditor::new(policy),
            standing: Standing::default(),
            attestations: Attestations::default(),
            report_interval: tokio::sync::watch::Sender::new(DEFAULT_REPORT_INTERVAL),
            mesh,
            key,
            ledger,
            reliability,
            seq: SeqCounter::default(),
            outsourcing: OnceLock::new(),
            saved_dealings: AtomicU64::new(0),
            proof_limits: Mutex::default(),
            escalation: OnceLock::new(),
            held: Arc::default(),
            holding: Mutex::default(),
        });
        trust.restore_bans();
        trust.listen_for_proofs();
        trust.keep_standing();
        trust
    }

    /// Buys checks from other providers for what this node cannot replay itself (set
    /// once; what `sharemesh gateway` does unless `--no-verify`). The windows they sign
    /// are witnesses, replayed here too if they ran while the model was fetched.
    pub fn outsource(self: &Arc<Self>, outsourcing: Outsourcing) {
        let trust = Arc::downgrade(self);
        outsourcing.witness_with(Box::new(move |window| {
            if let Some(trust) = trust.upgrade() {
                trust.witness(window);
            }
        }));
        let _ = self.outsourcing.set(Arc::new(outsourcing));
    }

    pub fn outsourcing(&self) -> Option<&Arc<Outsourcing>> {
        self.outsourcing.get()
    }

    /// On a bought check that ends unsettled, asks `source` for the model (once per
    /// model) and replays the disputed jobs here once it holds it (set once).
    pub fn escalate_with(&self, source: Arc<dyn ModelSource>) {
        let _ = self.escalation.set((source, Escalation::default()));
    }

    /// Adds `replayer` to what this node replays with (a replayer set before, such as
    /// `--verify`'s, is kept beside it).
    pub fn hold(&self, replayer: Arc<dyn Replayer>) {
        let Ok(_one_at_a_time) = self.holding.lock() else {
            return;
        };
        let held: Arc<dyn Replayer> = self.held.clone();
        match self.auditor.replayer() {
            Some(existing) if Arc::ptr_eq(&existing, &held) => {}
            Some(existing) => self.held.add(existing),
            None => {}
        }
        self.held.add(replayer);
        self.auditor.set_replayer(held);
    }

    /// How this node checks providers' work.
    pub fn verification(&self) -> Verification {
        match (
            self.auditor.replayer().is_some(),
            self.outsourcing().is_some(),
        ) {
            (false, false) => Verification::Off,
            (true, false) => Verification::Replay,
            (false, true) => Verification::Outsourced,
            (true, true) => Verification::ReplayAndOutsourced,
        }
    }

    /// Live adverts, less providers dropped for fraud.
    pub(crate) fn live(&self) -> Vec<Arc<sharemesh_mesh::orderbook::BookEntry>> {
        let mut live = self
            .mesh
            .book
            .read()
            .map(|b| b.live(now_ms()))
            .unwrap_or_default();
        live.retain(|entry| !self.auditor.is_banned(&entry.advert.provider));
        live
    }

    /// Sets how often this node publishes its report and recomputes its view.
    pub fn set_report_interval(&self, interval: Duration) {
        self.report_interval
            .send_replace(interval.max(Duration::from_millis(10)));
    }

    /// Every report interval: publish what this node verified, recompute its view,
    /// and hand the view to gossipsub as application scores (a convicted provider far
    /// below the graylist threshold, others by standing).
    /// A new interval takes effect at once (a wait under the old one is cut short).
    fn keep_standing(self: &Arc<Self>) {
        let this = Arc::downgrade(self);
        let mut interval = self.report_interval.subscribe();
        tokio::spawn(async move {
            loop {
                let wait = *interval.borrow_and_update();
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    changed = interval.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        continue;
                    }
                }
                let Some(this) = this.upgrade() else { return };
                this.refresh_standing().await;
            }
        });
    }

    async fn refresh_standing(&self) {
        let me = self.key.node_id();
        let now = now_ms();
        if let Some(report) = self.standing.own_report(me, &self.auditor, now / 60_000) {
            match self
                .key
                .seal(&report, self.seq.next(), now, REPORT_LIFETIME_MS)
            {
                Ok(envelope) => {
                    if let Err(err) = self.mesh.publish_reputation(&envelope).await {
                        tracing::debug!(%err, "could not gossip the reputation report");
                    }
                }
                Err(err) => tracing::warn!(%err, "could not sign the reputation report"),
            }
        }
        self.save_dealings().await;
        self.standing.recompute(me, &self.auditor);
        let convicted = self.auditor.convicted();
        let trust = self.standing.trust();
        let best = trust.values().copied().fold(0.0, f64::max);
        let mut scores: Vec<(libp2p::PeerId, f64)> = Vec::new();
        for provider in &convicted {
            if let Ok(peer) = provider.peer_id() {
                scores.push((peer, CONVICTED_APPLICATION_SCORE));
            }
        }
        for (node, t) in trust.iter() {
            if convicted.contains(node) || best <= 0.0 {
                continue;
            }
            if let Ok(peer) = node.peer_id() {
                scores.push((peer, TRUSTED_APPLICATION_SCORE * t / best));
            }
        }
        if let Err(err) = self.mesh.set_application_scores(scores).await {
            tracing::debug!(%err, "could not set application scores");
        }
    }

    /// Providers with a confirmed proof in the ledger stay dropped after a restart, and
    /// what this node verified is remembered.
    fn restore_bans(&self) {
        let Some(ledger) = &self.ledger else { return };
        let saved = ledger
            .dealings()
            .ok()
            .flatten()
            .and_then(|bytes| serde_json::from_slice::<Vec<(String, Dealings)>>(&bytes).ok());
        let saved: BTreeMap<NodeId, Dealings> = saved
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(id, d)| Some((id.parse().ok()?, d)))
            .collect();
        self.auditor.restore_dealings(saved);
        if let Err(err) = ledger.expire_frauds(now_ms()) {
            tracing::warn!(%err, "could not expire old fraud proofs");
        }
        match ledger.frauds() {
            Ok(frauds) => {
                for (provider, _) in frauds {
                    self.auditor.ban(provider);
                }
            }
            Err(err) => tracing::warn!(%err, "could not read fraud proofs from the ledger"),
        }
    }

    /// Whether `node` has standing here: this node verified its work, or its
    /// EigenTrust view gives it trust.
    fn has_standing(&self, node: &NodeId) -> bool {
        self.auditor.verified_jobs(node) > 0
            || self.standing.trust().get(node).is_some_and(|&t| t > 0.0)
    }

    fn record(&self, provider: NodeId, outcome: Outcome) {
        if let Ok(mut book) = self.reliability.lock() {
            book.record(&provider, outcome, now_ms());
        }
    }

    /// Draws whether to verify the segment and, if so, replays it in a task of its
    /// own (the response is not held up).
    pub fn consider(self: &Arc<Self>, audit: SegmentAudit) {
        let provider = audit.transcript.provider();
        if let Some(outsourcing) = self.outsourcing() {
            outsourcing.learn(provider, audit.transcript.profile());
        }
        let model = audit.transcript.request.model;
        self.auditor
            .note_profile(provider, model, audit.transcript.profile());
        let rate = self
            .auditor
            .rate(&provider, audit.price, audit.median_price);
        let drawn = audit_draw(&audit.secret, &audit.job_id) < rate;
        // The greedy rule costs nothing to check: every transcript gets it.
        let inconsistent = audit.transcript.first_inconsistency().is_some();
        if !drawn && !inconsistent {
            return;
        }
        self.auditor.count(|s| s.drawn += 1);
        let Some(permit) = self.auditor.permit() else {
            return;
        };
        let span = tracing::info_span!("audit", job = %audit.job_id, %provider);
        tokio::spawn(self.clone().check(audit, model, permit).instrument(span));
    }

    /// Checks one drawn segment (see [`Self::consider`]).
    async fn check(
        self: Arc<Self>,
        audit: SegmentAudit,
        model: ModelId,
        _permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let provider = audit.transcript.provider();
        let replayer = self.auditor.replayer();
        let here = replayer.as_ref().and_then(|r| r.profile(&model));
        if here.is_none() {
            self.want(model); // Checks are bought until it is held.
        }
        // Exact checks first: a replay here on the job's own profile, else a window
        // bought from a provider on it; a replay here on another profile (a tolerance,
        // no proof) only when neither could be made. The greedy rule is checked either
        // way.
        let exact_here = here
            .as_ref()
            .is_some_and(|p| p.replays_exactly(audit.transcript.profile()));
        let first = match self.outsourcing() {
            Some(_) if !exact_here => None,
            _ => replayer.clone(),
        };
        let reporter = self.key.node_id();
        let sent = audit.transcript.sent();
        let finding = examine(&audit.transcript, first, reporter).await;
        let outsourcing = match (&finding, self.outsourcing()) {
            (Finding::Unchecked(_), Some(outsourcing)) => outsourcing.clone(),
            _ => return self.act_on(provider, finding, sent).await,
        };
        let live = self.live();
        let finding = match outsourcing
            .examine(&audit.transcript, &live, reporter)
            .await
        {
            Finding::Unchecked(_) if here.is_some() && !exact_here => {
                examine(&audit.transcript, replayer, reporter).await
            }
            finding => finding,
        };
        let (unsettled, vouched) = match &finding {
            Finding::Disputed { .. } => (true, false),
            Finding::Fraud(_) => (false, false),
            _ => (false, here.is_none()),
        };
        self.act_on(provider, finding, sent).await;
        if unsettled {
            // Held by now (its fetch ended during the check): judged here at once.
            if !self.judge_if_held(&audit.transcript).await {
                self.escalate(audit.transcript);
            }
        } else if vouched {
            self.recheck_vouched(&audit.transcript).await;
        }
        // Planted after the check's effects are in place (a verifier the check just
        // convicted is not drawn again).
        if outsourcing.draws_canary() {
            if let Some(planted) = outsourcing.plant(&self.live(), reporter).await {
                self.act_on_planted(planted).await;
            }
        }
    }

    /// A job only providers vouched for while this node did not hold its model:
    /// replayed here if the model is held by now (its fetch ended during the check),
    /// else kept for when it is.
    async fn recheck_vouched(&self, transcript: &Transcript) {
        if !self.judge_if_held(transcript).await {
            self.witness(transcript);
        }
    }

    /// Replays `transcript` here if its model is held: ground truth, so a provider
    /// only suspected for disputes whose job replays honest is suspected no more.
    /// `false` when the model is not held.
    async fn judge_if_held(&self, transcript: &Transcript) -> bool {
        let model = transcript.request.model;
        let Some(held) = self
            .auditor
            .replayer()
            .filter(|r| r.profile(&model).is_some())
        else {
            return false;
        };
        let provider = transcript.provider();
        let finding = examine(transcript, Some(held), self.key.node_id()).await;
        let honest = matches!(finding, Finding::Honest { .. });
        self.act_on(provider, finding, transcript.sent()).await;
        if honest {
            self.auditor.vindicate(&provider);
        }
        true
    }

    /// The first job or check of a model this node cannot replay: ask for the model.
    fn want(self: &Arc<Self>, model: ModelId) {
        if let Some((_, escalation)) = self.escalation.get() {
            if escalation.ask(model, now_ms()) {
                self.fetch(model);
            }
        }
    }

    /// `provider` opened a segment of `model` for this node. Where this node fetches
    /// models it cannot replay, the fetch starts now (not at the job's check), and
    /// while it runs the provider is on credit ([`Self::on_credit`]).
    pub(crate) fn serving(self: &Arc<Self>, model: ModelId, provider: NodeId) {
        let Some((_, escalation)) = self.escalation.get() else {
            return;
        };
        let held = self
            .auditor
            .replayer()
            .is_some_and(|r| r.profile(&model).is_some());
        if !held {
            self.want(model);
            escalation.served(&model, provider);
        }
    }

    /// Whether `provider` is to wait before serving `model` again: it served it while
    /// this node fetches the model, and that work is not judged yet (at most `hold_ms`
    /// after the ask: [`crate::verify::escalate::credit_hold`]). What a ring serves before
    /// ground truth reaches it is then one job per member, not every job until the
    /// download ends.
    pub(crate) fn on_credit(&self, model: &ModelId, provider: &NodeId, hold_ms: u64) -> bool {
        self.escalation
            .get()
            .is_some_and(|(_, escalation)| escalation.on_credit(model, provider, now_ms(), hold_ms))
    }

    /// Work only providers vouched for (a job a bought check passed or could not check,
    /// a window a provider signed): kept while its model is fetched, to be replayed
    /// here once it is held (a ring whose members pass each other's jobs is convicted
    /// on both sides), dropped otherwise.
    fn witness(&self, transcript: &Transcript) {
        if let Some((_, escalation)) = self.escalation.get() {
            escalation.witness(transcript);
        }
    }

    /// A bought check ended unsettled: it waits for the model (asked for now if it was
    /// not yet) and is replayed here once the model is held.
    fn escalate(self: &Arc<Self>, transcript: Transcript) {
        let Some((_, escalation)) = self.escalation.get() else {
            return;
        };
        let model = transcript.request.model;
        if escalation.disputed(transcript, now_ms()) == Next::Fetch {
            self.fetch(model);
        }
    }

    /// Asks the model source for `model`; once held, replays every dispute and witness
    /// that waited.
    fn fetch(self: &Arc<Self>, model: ModelId) {
        let Some((source, _)) = self.escalation.get() else {
            return;
        };
        let (this, source) = (self.clone(), source.clone());
        tokio::spawn(async move {
            tracing::info!(%model, "fetching the model to replay its jobs here");
            let held = source.hold(model).await;
            let Some((_, escalation)) = this.escalation.get() else {
                return;
            };
            let Some(replayer) = held else {
                escalation.settled(&model);
                escalation.judged(&model);
                tracing::warn!(%model, "could not hold the model; its disputes stay unsettled");
                return;
            };
            // Held before the waiting work is taken: a check ending in between is kept
            // and replayed with the rest, one ending after is replayed by its own task
            // (only a verifier's window that ends after is not replayed).
            this.hold(replayer);
            let waiting = escalation.settled(&model);
            tracing::info!(%model, transcripts = waiting.len(), "holding the model: replaying the work only providers vouched for");
            let reporter = this.key.node_id();
            // Whether every piece of each party's waiting work replayed honest.
            let mut clean: HashMap<NodeId, bool> = HashMap::new();
            for transcript in waiting {
                let provider = transcript.provider();
                let finding = examine(&transcript, this.auditor.replayer(), reporter).await;
                let honest = matches!(finding, Finding::Honest { .. });
                *clean.entry(provider).or_insert(true) &= honest;
                this.act_on(provider, finding, transcript.sent()).await;
            }
            // A party whose disputed and vouched-for work all replayed honest is no
            // longer suspected for the disputes (an honest verifier a colluder split
            // with, say); other suspicions stay.
            for (party, _) in clean.into_iter().filter(|(_, clean)| *clean) {
                if this.auditor.vindicate(&party) {
                    tracing::info!(%party, "ground truth found its disputed work honest");
                }
            }
            escalation.judged(&model);
        });
    }

    async fn act_on(&self, provider: NodeId, finding: Finding, sent: usize) {
        match finding {
            Finding::Honest { steps } => {
                tracing::info!(steps, "verified: every step replays exactly");
                self.auditor.verified_ok(provider, steps as u64);
                self.auditor.count(|s| {
                    s.verified_ok += 1;
                    s.replayed_tokens += steps as u64;
                });
                self.record(provider, Outcome::VerifiedOk);
            }
            Finding::Disputed { parties } => {
                tracing::warn!(?parties, "two runs of a window differ, unsettled");
                for party in parties {
                    self.auditor.suspect_disputed(party);
                }
                self.auditor.count(|s| {
                    s.disputed += 1;
                    s.replayed_tokens += sent as u64;
                });
            }
            Finding::Fraud(proof) if proof.evidence().is_err() => {
                let provider = proof.provider;
                // A transcript can hold a chunk that failed other checks (a gap, a
                // broken link): a proof cut from it would not check anywhere, and
                // gossiping it would cost this node its gossip score.
                tracing::warn!("fraud found, but the transcript does not make a valid proof");
                self.auditor.count(|s| s.replayed_tokens += sent as u64);
                self.auditor.suspect(provider);
                self.record(provider, Outcome::Misbehaved);
            }
            Finding::Fraud(proof) => {
                // The audited provider, or a verifier proven wrong.
                let provider = proof.provider;
                tracing::warn!(step = proof.step, %provider, "verification found fraud");
                let sealed = self.key.seal(&*proof, 0, now_ms(), PROOF_LIFETIME_MS);
                if let Ok(envelope) = &sealed {
                    self.convict(provider, envelope);
                } else {
                    // Unsigned, nothing can be voided or told; it still leaves routing.
                    self.auditor.ban(provider);
                }
                // Counted once the provider is out of routing.
                self.auditor.count(|s| {
                    s.frauds_found += 1;
                    s.replayed_tokens += sent as u64;
                });
                match sealed {
                    Ok(envelope) => {
                        if let Err(err) = self.mesh.publish_fraud_proof(&envelope).await {
                            tracing::warn!(%err, "could not gossip the fraud proof");
                        }
                    }
                    Err(err) => tracing::error!(%err, "could not sign a fraud proof"),
                }
            }
            Finding::Suspicious { gap } => {
                // Across profiles nothing is provable: a local mark and full scrutiny.
                tracing::warn!(gap, "the replay on another profile is far off");
                self.auditor.count(|s| {
                    s.suspicious += 1;
                    s.replayed_tokens += sent as u64;
                });
                self.auditor.suspect(provider);
                self.record(provider, Outcome::VerifiedMismatch);
            }
            Finding::Unchecked(why) => {
                tracing::debug!(%why, "segment not verifiable here");
                self.auditor.count(|s| s.unchecked += 1);
            }
        }
    }

    /// A planted window's outcome: only a proven-wrong verifier is acted on (a pass is
    /// what a verifier is paid for, not a record).
    async fn act_on_planted(&self, finding: Finding) {
        match finding {
            Finding::Fraud(proof) => {
                let verifier = proof.provider;
                self.act_on(verifier, Finding::Fraud(proof), 0).await;
            }
            Finding::Disputed { parties } => {
                for party in parties {
                    self.auditor.suspect_disputed(party);
                }
            }
            _ => {}
        }
    }

    async fn save_dealings(&self) {
        let Some(ledger) = self.ledger.clone() else {
            return;
        };
        let dealings: Vec<(String, Dealings)> = self
            .auditor
            .dealings()
            .into_iter()
            .map(|(id, d)| (id.to_string(), d))
            .collect();
        let Ok(encoded) = serde_json::to_vec(&dealings) else {
            return;
        };
        // Unchanged since the last save (most intervals): no write, no flush.
        let digest = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            encoded.hash(&mut hasher);
            hasher.finish()
        };
        if self.saved_dealings.swap(digest, Ordering::Relaxed) == digest {
            return;
        }
        // sled flushes to disk: off the async runtime's threads.
        let saved = tokio::task::spawn_blocking(move || ledger.save_dealings(&encoded)).await;
        if !matches!(saved, Ok(Ok(()))) {
            // Tried again next interval.
            self.saved_dealings.store(0, Ordering::Relaxed);
        }
        if let Ok(Err(err)) = saved {
            tracing::warn!(%err, "could not save verified dealings");
        }
    }

    /// A confirmed fraud: the provider leaves routing, its reputation takes the
    /// heaviest mark, and its pending receipts in this ledger are voided.
    fn convict(&self, provider: NodeId, proof: &SignedEnvelope) {
        if !self.auditor.ban(provider) {
            return;
        }
        self.auditor.verified_mismatch(provider);
        self.record(provider, Outcome::VerifiedMismatch);
        let Some(ledger) = &self.ledger else { return };
        match ledger.record_fraud(&provider, proof, now_ms()) {
            Ok(voided) => tracing::warn!(
                %provider,
                receipts = voided.receipts,
                nano_usd = voided.amount_nano_usd,
                "provider dropped for fraud; its pending receipts are void"
            ),
            Err(err) => tracing::error!(%err, "could not void the provider's receipts"),
        }
    }

    /// Checks fraud proofs gossiped by others.
    fn listen_for_proofs(self: &Arc<Self>) {
        let mut events = self.mesh.subscribe();
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(MeshEvent::ReputationReport { report, .. }) => {
                        let Some(this) = this.upgrade() else { return };
                        this.standing.on_report(&report, now_ms());
                    }
                    Ok(MeshEvent::Attestation { attestation, .. }) => {
                        let Some(this) = this.upgrade() else { return };
                        this.on_attestation(*attestation);
                    }
                    Ok(MeshEvent::FraudProof {
                        envelope, accused, ..
                    }) => {
                        let Some(this) = this.upgrade() else { return };
                        if this.auditor.is_banned(&accused) {
                            continue;
                        }
                        // A replay can take a while: do not hold up other events.
                        tokio::spawn(
                            async move { this.on_gossiped_proof(*envelope, accused).await },
                        );
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                    _ => {}
                }
            }
        });
    }

    /// Checks an attestation against the node's advert and others' attestations; a
    /// node whose claims do not fit is suspected (every job verified).
    fn on_attestation(&self, attestation: sharemesh_protocol::Attestation) {
        let advertised = |node: &NodeId| {
            let book = self.mesh.book.read().ok()?;
            book.live(now_ms())
                .into_iter()
                .find(|e| &e.advert.provider == node)
                .map(|e| e.advert.hardware.clone())
        };
        for node in self.attestations.on_attestation(attestation, advertised) {
            if !self.auditor.is_suspected(&node) {
                tracing::warn!(%node, "hardware claims that do not fit together");
            }
            self.auditor.suspect(node);
        }
    }

    async fn on_gossiped_proof(&self, envelope: SignedEnvelope, accused: NodeId) {
        let Ok(opened) = envelope.open_archived::<FraudProof>() else {
            return;
        };
        let reporter = opened.body.reporter;
        let admitted = self
            .proof_limits
            .lock()
            .map_err(|_| crate::verify::proof_limits::ProofLimited::Reporter)
            .and_then(|mut limits| limits.admit(reporter, accused, now_ms()));
        if let Err(why) = admitted {
            tracing::debug!(%accused, %reporter, %why, "gossiped proof not checked");
            self.auditor.count(|s| s.proofs_rate_limited += 1);
            return;
        }
        // Replays are bounded: a flood of well-formed proofs (each needs the accused's
        // own signatures, so it costs the flooder identities) waits its turn, and what
        // waits too long is dropped.
        let Some(_permit) = self.auditor.permit_within(PROOF_CHECK_WAIT).await else {
            tracing::debug!(%accused, "no replay slot for a gossiped proof; dropped");
            return;
        };
        if self.auditor.is_banned(&accused) {
            return; // Another proof convicted it while this one waited.
        }
        let check = check_proof(&opened.body, self.auditor.gossip_replayer()).await;
        tracing::info!(%accused, %reporter, ?check, "fraud proof from the mesh");
        match check {
            // Each counter moves once its effect is in place.
            ProofCheck::Confirmed => {
                self.convict(accused, &envelope);
                self.auditor.count(|s| s.frauds_confirmed_from_gossip += 1);
            }
            ProofCheck::Refuted => {
                self.record(reporter, Outcome::Misbehaved);
                self.auditor.count(|s| s.proofs_refuted += 1);
            }
            ProofCheck::Unconfirmed(_) => {
                // An accusation this node cannot check only raises its scrutiny, and
                // only from a reporter of standing here: a fresh key's well-formed
                // proof against an honest provider would otherwise cost it every
                // light node's trust for good.
                if self.has_standing(&reporter) {
                    self.auditor.suspect(accused);
                }
                self.auditor.count(|s| s.proofs_unconfirmed += 1);
            }
        }
    }
}
