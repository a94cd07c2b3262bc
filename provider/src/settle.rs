//! The provider side of `/sharemesh/settle/2` and of on-chain credit (SPEC §13): a
//! buyer offers its binding (and its newest authorisation), the provider keeps them and
//! answers with its own binding; every job then needs the buyer's deposit, as last read,
//! to cover what it owes plus what the job may cost. Rounds in the background read
//! deposits again and redeem what buyers authorised.

use std::sync::Arc;
use std::time::Duration;

use futures::AsyncReadExt;
use libp2p::PeerId;
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::framing::{read_frame, write_frame, FrameError};
use sharemesh_mesh::SETTLE_PROTOCOL;
use sharemesh_protocol::{JobRequest, NodeId, Prompt, RejectReason, SettlementBinding};
use sharemesh_settlement::payee::CreditHold;
use sharemesh_settlement::Payee;

use crate::Provider;

/// An offer's frames must arrive this soon.
const OFFER_TIMEOUT: Duration = Duration::from_secs(10);
/// Tokens a chat template may add around the messages' text (a bound for credit only).
const TEMPLATE_TOKENS: u64 = 256;

impl Provider {
    pub fn payee(&self) -> Option<&Arc<Payee>> {
        self.payee.as_ref().map(|(payee, _)| payee)
    }

    /// Answers `/sharemesh/settle/2` streams until the mesh stops (only while settling
    /// on chain: otherwise the protocol is not offered and buyers learn that at once).
    pub async fn serve_settlement(self: Arc<Self>) -> anyhow::Result<()> {
        self.accept_streams(
            SETTLE_PROTOCOL,
            "settle",
            |provider, peer, stream| async move { provider.answer_offer(peer, stream).await },
        )
        .await
    }

    async fn answer_offer(&self, peer: PeerId, stream: libp2p::Stream) -> Result<(), FrameError> {
        let Some(payee) = self.payee() else {
            return Ok(());
        };
        let origin = self
            .mesh
            .remote_address(&peer)
            .map_or_else(crate::unpaid::Origin::unknown, |address| {
                crate::unpaid::Origin::of(&address)
            });
        if !self.offer_limits.take(&origin, now_ms()) {
            tracing::info!(%peer, %origin, "too many settlement offers; closing");
            return Ok(());
        }
        let (mut reader, mut writer) = stream.split();
        let mut frames = vec![read_frame(&mut reader, OFFER_TIMEOUT).await?];
        // At most one more frame (the authorisation); the buyer closes its side after.
        if let Ok(frame) = read_frame(&mut reader, OFFER_TIMEOUT).await {
            frames.push(frame);
        }
        // The buyer is the node its binding names, if that node is the connection's.
        let Ok(named) = frames[0].open_archived::<SettlementBinding>() else {
            return Ok(());
        };
        let buyer: NodeId = named.body.node;
        if buyer.peer_id().ok() != Some(peer) {
            tracing::info!(%peer, "a settlement offer for another node; ignored");
            return Ok(());
        }
        match payee.offer(&buyer, &frames, now_ms()).await {
            Ok(binding) => write_frame(&mut writer, &binding).await,
            Err(err) => {
                tracing::info!(%buyer, %err, "refused a settlement offer");
                Ok(())
            }
        }
    }

    /// The credit check of a job when settling on chain: `None` when not.
    pub(crate) fn credit_for(
        &self,
        request: &JobRequest,
    ) -> Result<Option<CreditHold>, (RejectReason, String)> {
        let Some(payee) = self.payee() else {
            return Ok(None);
        };
        let price = u128::from(self.policy.price(request.tier).0);
        let most = u128::from(self.job_token_bound(request)).saturating_mul(price);
        payee
            .admit(&request.buyer, most)
            .map(Some)
            .map_err(|why| (RejectReason::Unfunded, why.to_string()))
    }

    /// The most tokens a job can be billed: its prompt (a resumed job's is not billed)
    /// and what is left of `max_tokens`, never more than the model's context.
    fn job_token_bound(&self, request: &JobRequest) -> u64 {
        let context = self
            .engine
            .models()
            .iter()
            .find(|m| m.id == request.model)
            .map_or(u64::MAX, |m| u64::from(m.context_length));
        let prompt = if request.resume.is_empty() {
            match &request.prompt {
                Prompt::Tokens(tokens) => tokens.len() as u64,
                // A token spells at least one byte of text.
                Prompt::Text(text) => text.len() as u64 + TEMPLATE_TOKENS,
                Prompt::Chat(messages) => {
                    messages.iter().map(|m| m.content.len() as u64).sum::<u64>() + TEMPLATE_TOKENS
                }
            }
        } else {
            0
        };
        let completion =
            u64::from(request.sampling.max_tokens).saturating_sub(request.resume.len() as u64);
        prompt.saturating_add(completion).min(context)
    }

    /// Settlement rounds until the process ends: deposits read again and due
    /// authorisations redeemed (failures are logged and retried next round).
    pub(crate) async fn run_settlement(self: Arc<Self>) -> anyhow::Result<()> {
        let Some((payee, every)) = self.payee.clone() else {
            return Ok(());
        };
        loop {
            tokio::time::sleep(every).await;
            match payee.settle_round(now_ms()).await {
                Ok(redemptions) => {
                    for redemption in redemptions {
                        if let Err(err) = redemption.outcome {
                            tracing::warn!(buyer = %redemption.buyer, %err, "redemption failed");
                        }
                    }
                }
                Err(err) => tracing::warn!(%err, "settlement round failed"),
            }
            if let Some(metrics) = &self.metrics {
                metrics.show_settlement(&payee.totals());
            }
        }
    }
}
