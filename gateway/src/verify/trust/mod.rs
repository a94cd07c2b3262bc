//! What the gateway does with verification's findings: reputation, the ledger's
//! disputes, routing, and the fraud-proof gossip (SPEC.md §12). The auditing itself is
//! [`crate::verify::audit`].

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sharemesh_ledger::Ledger;
use sharemesh_mesh::clock::{now_ms, SeqCounter};
use sharemesh_mesh::MeshHandle;
use sharemesh_protocol::commitment::audit_draw;
use sharemesh_protocol::{JobId, Keypair, ModelId, NanoUsd, NodeId, SignedEnvelope};
use sharemesh_reputation::{Outcome, ReputationBook};
use tracing::Instrument;

use crate::verify::attest::Attestations;
use crate::verify::audit::{AuditPolicy, Auditor, Replayer};
use crate::verify::escalate::{Escalation, HeldModels, ModelSource};
use crate::verify::examine::{examine, Finding};
use crate::verify::outsource::Outsourcing;
use crate::verify::standing::Standing;
use crate::verify::transcript::Transcript;

mod gossip;
mod ground_truth;
pub mod standings;

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
    /// Its reports and the gossip it listens to, for as long as it lives.
    pub(crate) background: crate::background::Background,
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
            background: Default::default(),
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
            Finding::Suspicious { gap, far_draws } => {
                // Across profiles nothing is provable: a local mark and full scrutiny.
                tracing::warn!(gap, far_draws, "the replay on another profile is far off");
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

    /// A confirmed fraud: the provider leaves routing, its reputation takes the
    /// heaviest mark, and its pending receipts in this ledger are voided.
    fn convict(&self, provider: NodeId, proof: &SignedEnvelope) {
        if self.auditor.is_banned(&provider) {
            return;
        }
        // Void first, ban last: whoever sees the provider dropped sees its pending pay
        // voided too (the ledger refuses bookings to it from the fraud record on, and
        // voiding twice voids nothing more, so a conviction racing this one is safe).
        if let Some(ledger) = &self.ledger {
            match ledger.record_fraud(&provider, proof, now_ms()) {
                Ok(voided) => tracing::warn!(
                    %provider,
                    receipts = voided.receipts,
                    nano_usd = voided.amount_nano_usd,
                    "provider convicted of fraud; its pending receipts are void"
                ),
                Err(err) => tracing::error!(%err, "could not void the provider's receipts"),
            }
        }
        if !self.auditor.ban(provider) {
            return;
        }
        self.auditor.verified_mismatch(provider);
        self.record(provider, Outcome::VerifiedMismatch);
    }
}
