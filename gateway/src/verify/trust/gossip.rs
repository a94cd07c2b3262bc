//! What a gateway shares and keeps: its periodic report and EigenTrust view (handed to
//! gossipsub as application scores), its dealings and bans across restarts, and the
//! fraud proofs and attestations others gossip.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::MeshEvent;
use sharemesh_protocol::{FraudProof, NodeId, SignedEnvelope};
use sharemesh_reputation::{Dealings, Outcome};
use tokio::sync::broadcast;

use super::{
    Trust, CONVICTED_APPLICATION_SCORE, PROOF_CHECK_WAIT, REPORT_LIFETIME_MS,
    TRUSTED_APPLICATION_SCORE,
};
use crate::verify::examine::{check_proof, ProofCheck};

impl Trust {
    /// Every report interval: publish what this node verified, recompute its view,
    /// and hand the view to gossipsub as application scores (a convicted provider far
    /// below the graylist threshold, others by standing).
    /// A new interval takes effect at once (a wait under the old one is cut short).
    pub(super) fn keep_standing(self: &Arc<Self>) {
        let this = Arc::downgrade(self);
        let mut interval = self.report_interval.subscribe();
        self.background.spawn("reputation reports", async move {
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

    pub(super) async fn refresh_standing(&self) {
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
    pub(super) fn restore_bans(&self) {
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

    pub(super) async fn save_dealings(&self) {
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

    /// Checks fraud proofs gossiped by others.
    pub(super) fn listen_for_proofs(self: &Arc<Self>) {
        let mut events = self.mesh.subscribe();
        let this = Arc::downgrade(self);
        self.background
            .spawn("gossiped reports and proofs", async move {
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
                            tokio::spawn(async move {
                                this.on_gossiped_proof(*envelope, accused).await
                            });
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                        _ => {}
                    }
                }
            });
    }

    /// Checks an attestation against the node's advert and others' attestations; a
    /// node whose claims do not fit is suspected (every job verified).
    pub(super) fn on_attestation(&self, attestation: sharemesh_protocol::Attestation) {
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

    pub(super) async fn on_gossiped_proof(&self, envelope: SignedEnvelope, accused: NodeId) {
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
