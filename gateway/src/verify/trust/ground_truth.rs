//! Ground truth for work nobody here could replay when it was done: a gateway that
//! cannot replay a model fetches it (`escalate`), holds providers that served it to one
//! job on credit meanwhile, and replays what only providers vouched for once it holds
//! the model.

use std::collections::HashMap;
use std::sync::Arc;

use sharemesh_mesh::clock::now_ms;
use sharemesh_protocol::{ModelId, NodeId};

use super::Trust;
use crate::verify::escalate::Next;
use crate::verify::examine::{examine, Finding};
use crate::verify::transcript::Transcript;

impl Trust {
    /// A job only providers vouched for while this node did not hold its model:
    /// replayed here if the model is held by now (its fetch ended during the check),
    /// else kept for when it is.
    pub(super) async fn recheck_vouched(&self, transcript: &Transcript) {
        if !self.judge_if_held(transcript).await {
            self.witness(transcript);
        }
    }

    /// Replays `transcript` here if its model is held: ground truth, so a provider
    /// only suspected for disputes whose job replays honest is suspected no more.
    /// `false` when the model is not held.
    pub(super) async fn judge_if_held(&self, transcript: &Transcript) -> bool {
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
    pub(super) fn want(self: &Arc<Self>, model: ModelId) {
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
    pub(super) fn witness(&self, transcript: &Transcript) {
        if let Some((_, escalation)) = self.escalation.get() {
            escalation.witness(transcript);
        }
    }

    /// A bought check ended unsettled: it waits for the model (asked for now if it was
    /// not yet) and is replayed here once the model is held.
    pub(super) fn escalate(self: &Arc<Self>, transcript: Transcript) {
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
    pub(super) fn fetch(self: &Arc<Self>, model: ModelId) {
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
}
