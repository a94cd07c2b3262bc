//! What the gateway does with verification's findings: reputation, the ledger's
//! disputes, routing, and the fraud-proof gossip (SPEC.md §12). The auditing itself is
//! [`crate::audit`].

use std::sync::{Arc, Mutex};

use sharemesh_ledger::Ledger;
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::{MeshEvent, MeshHandle};
use sharemesh_protocol::commitment::audit_draw;
use sharemesh_protocol::{FraudProof, JobId, Keypair, NanoUsd, NodeId, SignedEnvelope};
use sharemesh_reputation::{Outcome, ReputationBook};
use tokio::sync::broadcast;
use tracing::Instrument;

use crate::audit::{check_proof, examine, AuditPolicy, Auditor, Finding, ProofCheck};
use crate::transcript::Transcript;

/// A fraud proof is signed for this long (receivers open it within).
const PROOF_LIFETIME_MS: u64 = 30 * 24 * 3_600_000;

pub struct Trust {
    pub auditor: Auditor,
    mesh: MeshHandle,
    key: Arc<Keypair>,
    ledger: Option<Arc<Ledger>>,
    reliability: Arc<Mutex<ReputationBook<NodeId>>>,
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
            mesh,
            key,
            ledger,
            reliability,
        });
        trust.restore_bans();
        trust.listen_for_proofs();
        trust
    }

    /// Providers with a confirmed proof in the ledger stay dropped after a restart.
    fn restore_bans(&self) {
        let Some(ledger) = &self.ledger else { return };
        match ledger.frauds() {
            Ok(frauds) => {
                for (provider, _) in frauds {
                    self.auditor.ban(provider);
                }
            }
            Err(err) => tracing::warn!(%err, "could not read fraud proofs from the ledger"),
        }
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
        let this = self.clone();
        let span = tracing::info_span!("audit", job = %audit.job_id, %provider);
        tokio::spawn(
            async move {
                let _permit = permit;
                let replayer = this.auditor.replayer();
                let reporter = this.key.node_id();
                let finding = examine(&audit.transcript, replayer, reporter).await;
                this.act_on(provider, finding, audit.transcript.sent())
                    .await;
            }
            .instrument(span),
        );
    }

    async fn act_on(&self, provider: NodeId, finding: Finding, sent: usize) {
        match finding {
            Finding::Honest { steps } => {
                tracing::info!(steps, "verified: every step replays exactly");
                self.auditor.verified_ok(provider);
                self.auditor.count(|s| {
                    s.verified_ok += 1;
                    s.replayed_tokens += steps as u64;
                });
                self.record(provider, Outcome::VerifiedOk);
            }
            Finding::Fraud(proof) => {
                tracing::warn!(step = proof.step, "verification found fraud");
                self.auditor.count(|s| {
                    s.frauds_found += 1;
                    s.replayed_tokens += sent as u64;
                });
                match self.key.seal(&*proof, 0, now_ms(), PROOF_LIFETIME_MS) {
                    Ok(envelope) => {
                        self.convict(provider, &envelope);
                        if let Err(err) = self.mesh.publish_fraud_proof(&envelope).await {
                            tracing::warn!(%err, "could not gossip the fraud proof");
                        }
                    }
                    Err(err) => tracing::error!(%err, "could not sign a fraud proof"),
                }
            }
            Finding::Unchecked(why) => tracing::debug!(%why, "segment not verifiable here"),
        }
    }

    /// A confirmed fraud: the provider leaves routing, its reputation takes the
    /// heaviest mark, and its pending receipts in this ledger are voided.
    fn convict(&self, provider: NodeId, proof: &SignedEnvelope) {
        if !self.auditor.ban(provider) {
            return;
        }
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
                    Ok(MeshEvent::FraudProof {
                        envelope, accused, ..
                    }) => {
                        let Some(this) = this.upgrade() else { return };
                        if this.auditor.is_banned(&accused) {
                            continue;
                        }
                        // A replay can take a while: do not hold up other events.
                        tokio::spawn(
                            async move { this.on_gossiped_proof(envelope, accused).await },
                        );
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                    _ => {}
                }
            }
        });
    }

    async fn on_gossiped_proof(&self, envelope: SignedEnvelope, accused: NodeId) {
        let Ok(opened) = envelope.open_archived::<FraudProof>() else {
            return;
        };
        let reporter = opened.body.reporter;
        let check = check_proof(&opened.body, self.auditor.replayer()).await;
        tracing::info!(%accused, %reporter, ?check, "fraud proof from the mesh");
        match check {
            ProofCheck::Confirmed => {
                self.auditor.count(|s| s.frauds_confirmed_from_gossip += 1);
                self.convict(accused, &envelope);
            }
            ProofCheck::Refuted => {
                self.auditor.count(|s| s.proofs_refuted += 1);
                self.record(reporter, Outcome::Misbehaved);
            }
            ProofCheck::Unconfirmed(_) => {
                // An accusation this node cannot check only raises its scrutiny.
                self.auditor.count(|s| s.proofs_unconfirmed += 1);
                self.auditor.suspect(accused);
            }
        }
    }
}
