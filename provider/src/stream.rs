//! One accepted job's stream on the provider side: a signed chunk per token while the
//! buyer's receipts keep within the credit window, then the final chunk; or a
//! `Cancelled` chunk when gold work preempts it. Every chunk carries its tokens' logit
//! fingerprints and extends the job's commitment chain (SPEC.md §12).

use std::sync::Arc;
use std::time::Duration;

use futures::io::WriteHalf;
use sharemesh_engine::{EngineEvent, Generation};
use sharemesh_mesh::framing::{write_frame, FrameError};
use sharemesh_protocol::commitment::commitment_step;
use sharemesh_protocol::{Digest, FinishReason, JobRequest, StepFingerprint, TokenChunk};
use tokio::sync::{mpsc, watch, Notify};

/// One token as the stream sends it.
struct SentToken {
    id: u32,
    text: String,
    fingerprint: StepFingerprint,
    logprobs: Option<sharemesh_protocol::TokenLogprobs>,
}

use crate::adversary::{self, Outgoing};
use crate::Provider;

/// The state of one job's stream after `Accept`.
pub(crate) struct JobStream<'a> {
    pub request: &'a JobRequest,
    pub prompt_tokens: u32,
    pub writer: WriteHalf<libp2p::Stream>,
    /// Completion tokens the buyer's receipts cover.
    pub acked: watch::Receiver<u64>,
    /// Tokens this provider sent (resumed ones not included).
    pub sent: u64,
    /// The commitment chain's head: the root until the first chunk, then the last
    /// chunk's link.
    pub head: Digest,
    /// Every head sent, with the tokens sent by then: a receipt must acknowledge one.
    pub heads: SentHeads,
    /// Tokens this provider sends beyond the last receipt (the `Accept`'s window).
    pub window: u64,
    /// When the job was accepted, and when its last token went out (for the
    /// time-to-first-token and inter-token metrics).
    pub accepted_at: std::time::Instant,
    pub last_token: Option<std::time::Instant>,
    /// Positions the engine prefilled (its reused prefix aside), once it finished.
    pub prefilled: Option<u32>,
}

/// The commitment heads a provider sent for one job, with its token count at each.
pub(crate) type SentHeads = Arc<std::sync::Mutex<Vec<(u64, Digest)>>>;

/// How a stream ended on the provider's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Streamed {
    /// The final chunk went out (finished, failed, or preempted).
    Ended,
    /// The buyer closed its side: the job is cancelled.
    BuyerLeft,
    /// The buyer's receipts lagged the credit window (or it stopped reading) longer
    /// than the credit timeout: the job is cancelled and its slot freed.
    Unpaid,
    /// Testnet adversary: went silent on purpose.
    Stalled,
}

impl JobStream<'_> {
    /// Index of the next completion token (a resumed prefix counts).
    fn next_index(&self) -> u32 {
        (self.request.resume.len() as u64 + self.sent) as u32
    }

    /// The next chunk of this job (tokens with their text, fingerprints and, if asked,
    /// log-probabilities, or none
    /// with the finish), linked into the commitment chain.
    fn chunk(
        &mut self,
        provider: &Provider,
        first_index: u32,
        token: Option<SentToken>,
        finish: Option<FinishReason>,
    ) -> TokenChunk {
        let (token_ids, text_delta, fingerprints, logprobs) = match token {
            Some(token) => (
                vec![token.id],
                token.text,
                vec![token.fingerprint],
                token.logprobs.into_iter().collect(),
            ),
            None => (Vec::new(), String::new(), Vec::new(), Vec::new()),
        };
        self.head = commitment_step(&self.head, first_index, &token_ids, &fingerprints, finish);
        let sent = self.sent + token_ids.len() as u64;
        if let Ok(mut heads) = self.heads.lock() {
            heads.push((sent, self.head));
        }
        TokenChunk {
            job_id: self.request.job_id,
            provider: provider.job_key().node_id(),
            first_index,
            token_ids,
            text_delta,
            finish,
            fingerprints,
            commitment: self.head,
            logprobs,
        }
    }

    /// Writes a chunk; a buyer that does not read it within `limit` times out.
    async fn write(
        &mut self,
        provider: &Provider,
        chunk: &TokenChunk,
        limit: Duration,
    ) -> Result<(), FrameError> {
        let envelope = provider.seal_job(chunk)?;
        tokio::time::timeout(limit, write_frame(&mut self.writer, &envelope))
            .await
            .map_err(|_| FrameError::Timeout(limit))?
    }

    /// Waits until the buyer's receipts leave room in the credit window, at most
    /// `limit` in all (receipts that do not raise the count do not extend it).
    async fn wait_for_credit(&mut self, window: u64, limit: Duration) -> Option<Streamed> {
        let wait = async {
            while self.sent.saturating_sub(*self.acked.borrow()) >= window {
                if self.acked.changed().await.is_err() {
                    return Some(Streamed::BuyerLeft);
                }
            }
            None
        };
        tokio::time::timeout(limit, wait)
            .await
            .unwrap_or(Some(Streamed::Unpaid))
    }
}

impl Provider {
    /// Streams the engine's events for an accepted job until it ends. A write error
    /// means the buyer closed the stream: returning drops `events`, which cancels the
    /// engine job within one token.
    pub(crate) async fn stream_job(
        &self,
        job: &mut JobStream<'_>,
        mut events: mpsc::Receiver<EngineEvent>,
        preempt: &Arc<Notify>,
    ) -> Result<Streamed, FrameError> {
        let window = job.window;
        let limit = self.policy.credit_timeout;
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                () = preempt.notified() => {
                    let chunk = job.chunk(self, job.next_index(), None, Some(FinishReason::Cancelled));
                    job.write(self, &chunk, limit).await?;
                    return Ok(Streamed::Ended);
                }
            };
            match event {
                None => return Ok(Streamed::Ended),
                Some(EngineEvent::Token(token)) => {
                    let playing = self.policy.adversary();
                    if adversary::stalls(playing, job.sent) {
                        // Adversary: go silent but hold the stream until the buyer leaves.
                        tracing::warn!("adversary: stalling");
                        while job.acked.changed().await.is_ok() {}
                        return Ok(Streamed::Stalled);
                    }
                    adversary::drip(playing).await;
                    if job.acked.has_changed().is_err() {
                        // The buyer closed its side (after paying what it received):
                        // nothing more is read, so nothing more is sent.
                        return Ok(Streamed::BuyerLeft);
                    }
                    if let Some(ended) = job.wait_for_credit(window, limit).await {
                        tracing::info!(?ended, "the buyer stopped paying; cancelling the job");
                        return Ok(ended);
                    }
                    let (mut index, mut text) = (token.index, token.text_delta);
                    let (mut logprobs, mut fingerprint) = (token.logprobs, token.fingerprint);
                    let outgoing = Outgoing {
                        index: &mut index,
                        text: &mut text,
                        logprobs: logprobs.as_mut(),
                        fingerprint: &mut fingerprint,
                    };
                    adversary::tamper_token(playing, job.sent, outgoing);
                    let token = SentToken {
                        id: token.token_id,
                        text,
                        fingerprint,
                        logprobs,
                    };
                    let chunk = job.chunk(self, index, Some(token), None);
                    job.write(self, &chunk, limit).await?;
                    job.sent += 1;
                    self.count_token(job);
                }
                Some(EngineEvent::Finished(generation)) => {
                    self.finish(job, &generation).await?;
                    return Ok(Streamed::Ended);
                }
                Some(EngineEvent::Failed(err)) => {
                    tracing::warn!(%err, "generation failed");
                    let chunk = job.chunk(self, job.next_index(), None, Some(FinishReason::Error));
                    job.write(self, &chunk, limit).await?;
                    return Ok(Streamed::Ended);
                }
                Some(EngineEvent::Started { .. }) => {}
            }
        }
    }

    fn count_token(&self, job: &mut JobStream<'_>) {
        let now = std::time::Instant::now();
        if let Some(metrics) = &self.metrics {
            metrics.tokens_served.inc();
            match job.last_token {
                None => metrics
                    .time_to_first_token
                    .observe((now - job.accepted_at).as_secs_f64()),
                Some(last) => metrics.inter_token.observe((now - last).as_secs_f64()),
            }
        }
        job.last_token = Some(now);
    }

    /// The final chunk and the job's record.
    async fn finish(
        &self,
        job: &mut JobStream<'_>,
        generation: &Generation,
    ) -> Result<(), FrameError> {
        job.prefilled = Some(generation.prefilled_tokens);
        let end = generation.token_ids.len() as u32;
        let chunk = job.chunk(self, end, None, Some(generation.finish));
        let limit = self.policy.credit_timeout;
        job.write(self, &chunk, limit).await?;
        tracing::info!(
            tokens = generation.generated_tokens,
            prefilled = generation.prefilled_tokens,
            reused = generation.reused_tokens,
            finish = ?generation.finish,
            "job done"
        );
        if let Some(metrics) = &self.metrics {
            if generation.generation_seconds > 0.0 && generation.generated_tokens > 1 {
                metrics
                    .engine_tokens_per_second
                    .set(f64::from(generation.generated_tokens) / generation.generation_seconds);
            }
        }
        self.book_job(job.request, job.prompt_tokens, generation)
            .await;
        Ok(())
    }
}
