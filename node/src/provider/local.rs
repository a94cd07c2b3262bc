//! Jobs for this process's own gateway, served without a stream.

use std::sync::Arc;

use sharemesh_protocol::{Accept, JobRequest, NanoUsd, Reject, RejectReason, TokenChunk};

use super::Provider;
use crate::engine::EngineEvent;

impl Provider {
    /// Runs a job for this node's own gateway (a process that both provides and buys
    /// cannot dial itself): the engine's events become the same `JobEvent`s a remote
    /// provider's stream yields. Nothing is metered: a node does not pay itself.
    pub fn run_local(
        self: &Arc<Self>,
        request: JobRequest,
    ) -> tokio::sync::mpsc::Receiver<crate::buyer::JobEvent> {
        use crate::buyer::JobEvent;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let this = self.clone();
        tokio::spawn(async move {
            let reject = |reason, detail: String| {
                JobEvent::Rejected(Reject {
                    job_id: request.job_id,
                    provider: this.key.node_id(),
                    reason,
                    detail,
                })
            };
            if !this.engine.models().iter().any(|m| m.id == request.model) {
                let _ = tx
                    .send(reject(
                        RejectReason::UnknownModel,
                        "model not served here".into(),
                    ))
                    .await;
                return;
            }
            let mut events = match this.engine.submit(super::engine_request(&request)) {
                Ok(events) => events,
                Err(err) => {
                    let _ = tx
                        .send(reject(RejectReason::OverCapacity, err.to_string()))
                        .await;
                    return;
                }
            };
            while let Some(event) = events.recv().await {
                let out = match event {
                    EngineEvent::Started { prompt_tokens } => JobEvent::Accepted(Accept {
                        job_id: request.job_id,
                        provider: this.key.node_id(),
                        price_per_token: NanoUsd::ZERO,
                        prompt_tokens,
                        credit_window_tokens: u32::MAX,
                    }),
                    EngineEvent::Token(token) => JobEvent::Token(TokenChunk {
                        job_id: request.job_id,
                        provider: this.key.node_id(),
                        first_index: token.index,
                        token_ids: vec![token.token_id],
                        text_delta: token.text_delta,
                        finish: None,
                    }),
                    EngineEvent::Finished(generation) => JobEvent::Finished {
                        finish: generation.finish,
                        commitment: None,
                        last_receipt: None,
                    },
                    EngineEvent::Failed(err) => JobEvent::Failed(err.to_string()),
                };
                // The caller leaving drops `events`, which cancels the engine job.
                if tx.send(out).await.is_err() {
                    return;
                }
            }
        });
        rx
    }
}
