//! The event loop's gossip checks: adverts go to the order book, standing messages
//! (attestations, reputation reports) are admitted newest-first, fraud proofs when their
//! evidence checks; what is malformed is rejected (the sender penalised), what is
//! untimely ignored.

use libp2p::gossipsub::{self, MessageAcceptance};
use libp2p::PeerId;

use super::EventLoop;
use crate::behaviour;
use crate::clock::now_ms;
use crate::MeshEvent;
use sharemesh_protocol::{
    Attestation, FraudProof, OpenError, ReputationReport, SignedEnvelope, WireMessage,
};

/// Why a standing gossip message (attestation, report, fraud proof) was not taken.
#[derive(Debug, thiserror::Error)]
enum GossipRefusal {
    /// No honest node sends or forwards it: the sender is penalised.
    #[error("malformed: {0}")]
    Malformed(String),
    /// It arrived outside its validity window (a slow path or a slow receiver).
    #[error("untimely: {0}")]
    Untimely(OpenError),
}

impl GossipRefusal {
    fn verdict(&self) -> MessageAcceptance {
        match self {
            GossipRefusal::Malformed(_) => MessageAcceptance::Reject,
            GossipRefusal::Untimely(_) => MessageAcceptance::Ignore,
        }
    }
}

fn open_gossip<T: WireMessage>(
    data: &[u8],
    now: u64,
) -> Result<(SignedEnvelope, sharemesh_protocol::Opened<T>), GossipRefusal> {
    let envelope =
        SignedEnvelope::from_bytes(data).map_err(|e| GossipRefusal::Malformed(e.to_string()))?;
    let opened = envelope.open::<T>(now).map_err(|e| {
        if e.is_untimely() {
            GossipRefusal::Untimely(e)
        } else {
            GossipRefusal::Malformed(e.to_string())
        }
    })?;
    Ok((envelope, opened))
}

impl EventLoop {
    fn count_gossip(&self, topic: &gossipsub::TopicHash, verdict: &MessageAcceptance) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        let outcome = match verdict {
            MessageAcceptance::Accept => "accepted",
            MessageAcceptance::Reject => "rejected",
            MessageAcceptance::Ignore => "ignored",
        };
        metrics
            .gossip
            .get_or_create(&crate::metrics::GossipLabels {
                topic: topic.to_string(),
                outcome: outcome.into(),
            })
            .inc();
    }

    pub(super) fn on_gossip(
        &mut self,
        source: PeerId,
        id: gossipsub::MessageId,
        message: gossipsub::Message,
    ) {
        let adverts = behaviour::adverts_topic().hash();
        let verdict = if message.topic == adverts {
            let offered = self
                .book
                .write()
                .map(|mut book| book.offer(&message.data, now_ms()));
            match offered {
                Err(_) => {
                    tracing::error!("order book lock poisoned");
                    MessageAcceptance::Ignore
                }
                Ok(Ok(accepted)) => {
                    self.emit(MeshEvent::AdvertAccepted {
                        provider: accepted.provider,
                        seq: accepted.seq,
                        from: source,
                    });
                    MessageAcceptance::Accept
                }
                Ok(Err(refusal)) => {
                    let violation = refusal.is_violation();
                    tracing::debug!(from = %source, %refusal, violation, "advert not taken");
                    self.emit(MeshEvent::AdvertRejected {
                        from: source,
                        reason: refusal.to_string(),
                        violation,
                        signed_fault: refusal.signed_fault(),
                    });
                    if violation {
                        MessageAcceptance::Reject
                    } else {
                        MessageAcceptance::Ignore
                    }
                }
            }
        } else if message.topic == behaviour::fraud_proofs_topic().hash() {
            self.check_fraud_proof(source, &message.data)
        } else if message.topic == behaviour::reputation_topic().hash() {
            self.check_report(source, &message.data)
        } else if message.topic == behaviour::attestations_topic().hash() {
            self.check_attestation(source, &message.data)
        } else {
            // Attestation and reputation gossip are validated by the trust layer (not
            // yet built): do not forward what nobody checked.
            MessageAcceptance::Ignore
        };
        self.count_gossip(&message.topic, &verdict);
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(&id, &source, verdict);
    }

    /// An attestation is forwarded when it opens and is the node's newest; it proves
    /// only what its key claims (the trust layer checks it for consistency).
    fn check_attestation(&mut self, source: PeerId, data: &[u8]) -> MessageAcceptance {
        self.admit_newest::<Attestation>(source, data, |attestation| MeshEvent::Attestation {
            attestation: Box::new(attestation),
            from: source,
        })
    }

    /// A reputation report is forwarded when it opens and is the reporter's newest;
    /// what it is worth is the trust layer's (the reporter's own trust in each view).
    fn check_report(&mut self, source: PeerId, data: &[u8]) -> MessageAcceptance {
        self.admit_newest::<ReputationReport>(source, data, |report| MeshEvent::ReputationReport {
            report: Box::new(report),
            from: source,
        })
    }

    /// Standing messages (one signer's newest wins): malformed → reject, stale or
    /// untimely → ignore, otherwise the event and forward.
    fn admit_newest<T: WireMessage>(
        &mut self,
        source: PeerId,
        data: &[u8],
        event: impl FnOnce(T) -> MeshEvent,
    ) -> MessageAcceptance {
        let now = now_ms();
        let opened = match open_gossip::<T>(data, now) {
            Ok((_, opened)) => opened,
            Err(refusal) => {
                tracing::debug!(from = %source, %refusal, kind = ?T::KIND, "gossip not taken");
                return refusal.verdict();
            }
        };
        if self.reports.admit(&opened, T::KIND, [0; 16], now).is_err() {
            return MessageAcceptance::Ignore;
        }
        self.emit(event(opened.body));
        MessageAcceptance::Accept
    }

    /// A fraud proof is forwarded when its signatures and chain check (anyone can
    /// check those); a malformed one is a violation, an expired one is dropped. Whether
    /// it is fraud takes a replay, which the trust layer does where it holds the model.
    fn check_fraud_proof(&mut self, source: PeerId, data: &[u8]) -> MessageAcceptance {
        let checked = open_gossip::<FraudProof>(data, now_ms()).and_then(|(envelope, opened)| {
            opened
                .body
                .evidence()
                .map_err(|e| GossipRefusal::Malformed(e.to_string()))?;
            Ok((envelope, opened.body.provider))
        });
        match checked {
            Ok((envelope, accused)) => {
                self.emit(MeshEvent::FraudProof {
                    envelope: Box::new(envelope),
                    accused,
                    from: source,
                });
                MessageAcceptance::Accept
            }
            Err(refusal) => {
                tracing::debug!(from = %source, %refusal, "fraud proof not taken");
                refusal.verdict()
            }
        }
    }
}
