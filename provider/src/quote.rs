//! The provider side of `/sharemesh/quote/2`: answers a signed `QuoteRequest` with a
//! signed `Quote` (price, expected queue wait, expected speed) or a `Reject`, then
//! closes. A quote commits the provider to nothing and changes no state.

use std::sync::Arc;
use std::time::Duration;

use futures::AsyncReadExt;
use libp2p::PeerId;
use sharemesh_engine::KvPool;
use sharemesh_protocol::{Quote, QuoteRequest, Reject, RejectReason, Tier};

use super::Provider;
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::framing::{read_frame, write_frame, FrameError};
use sharemesh_mesh::QUOTE_PROTOCOL;

/// A quote request must arrive this soon after the stream opens.
const QUOTE_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

impl Provider {
    /// Answers `/sharemesh/quote/2` streams until the mesh stops.
    pub async fn serve_quotes(self: Arc<Self>) -> anyhow::Result<()> {
        self.accept_streams(
            QUOTE_PROTOCOL,
            "quote",
            |provider, peer, stream| async move { provider.answer_quote(peer, stream).await },
        )
        .await
    }

    async fn answer_quote(&self, peer: PeerId, stream: libp2p::Stream) -> Result<(), FrameError> {
        let (mut reader, mut writer) = stream.split();
        let envelope = read_frame(&mut reader, QUOTE_REQUEST_TIMEOUT).await?;
        let now = now_ms();
        let request = match envelope.open::<QuoteRequest>(now) {
            Ok(opened) if opened.signer.peer_id().ok() == Some(peer) => opened.body,
            // Nothing trustworthy to answer to: close.
            Ok(_) | Err(_) => return Ok(()),
        };
        let answer = if request.provider != self.key.node_id() {
            Err((
                RejectReason::BadRequest,
                "quote request addressed to another provider".to_owned(),
            ))
        } else {
            self.buyer_limits
                .check(&request.buyer, now)
                .and_then(|()| {
                    let asker = self.asker(request.buyer, &peer, None);
                    self.unpaid.check(&asker, now)
                })
                .and_then(|()| {
                    self.terms(
                        &request.model,
                        request.tier,
                        request.max_price_per_token,
                        now,
                    )
                })
                .and_then(|()| self.queue_wait_ms(&request))
        };
        let frame = match answer {
            Ok(queue_wait_ms) => self.seal(&Quote {
                job_id: request.job_id,
                provider: self.key.node_id(),
                price_per_token: self.policy.price(request.tier),
                queue_wait_ms,
                expected_milli_tokens_per_second: self.policy.measured_milli_tps,
            })?,
            Err((reason, detail)) => self.seal(&Reject {
                job_id: request.job_id,
                provider: self.key.node_id(),
                reason,
                detail,
            })?,
        };
        write_frame(&mut writer, &frame).await
    }

    /// How long a job like `request` would wait before its prefill starts. A batching
    /// engine with a free place in its batch and KV blocks for the whole completion
    /// starts it at the next step: no wait. Otherwise the completion tokens already
    /// promised to running and queued jobs, at the measured speed — the aggregate of a
    /// full batch where the engine batches (for reserved work, which preempts
    /// interruptible jobs, every job ahead that is not interruptible is assumed as long
    /// as this one). Over capacity (for tiers that do not preempt, or a completion
    /// larger than the whole KV budget) is a rejection, as it would be for the job.
    fn queue_wait_ms(&self, request: &QuoteRequest) -> Result<u32, (RejectReason, String)> {
        if crate::adversary::claims_full(self.policy.adversary()) {
            return Err((RejectReason::OverCapacity, "all slots are busy".into()));
        }
        let busy = self.engine.active_jobs() + self.engine.queue_depth();
        let preemptible = self.interruptible.lock().map_or(0, |jobs| jobs.len());
        let batch = self.engine.batch_capacity();
        let completion_blocks = KvPool::blocks_for(request.max_tokens as usize);
        if let Some(batch) = batch.filter(|b| completion_blocks > b.total_blocks) {
            return Err((
                RejectReason::OverCapacity,
                format!(
                    "{} completion tokens need {completion_blocks} KV blocks; this provider's \
                     budget is {}",
                    request.max_tokens, batch.total_blocks
                ),
            ));
        }
        let tokens_ahead = if request.tier == Tier::Reserved {
            busy.saturating_sub(preemptible) as f64 * f64::from(request.max_tokens)
        } else if busy >= self.policy.max_concurrent as usize {
            return Err((RejectReason::OverCapacity, "all slots are busy".into()));
        } else {
            self.engine.committed_tokens() as f64
        };
        let starts_now = batch.is_some_and(|b| {
            self.engine.active_jobs() < b.max_batch && completion_blocks < b.available_blocks
        });
        if starts_now {
            return Ok(0);
        }
        let milli_tps = if batch.is_some() && self.policy.batch_milli_tps > 0 {
            self.policy.batch_milli_tps
        } else {
            self.policy.measured_milli_tps
        };
        let tokens_per_second = f64::from(milli_tps.max(1)) / 1000.0;
        Ok((tokens_ahead / tokens_per_second * 1000.0).min(f64::from(u32::MAX)) as u32)
    }
}
