//! Jobs for this process's own gateway, served without a stream (a process that both
//! provides and buys cannot dial itself). They pass the same admission check as mesh
//! jobs; nothing is metered: a node does not pay itself.

use std::sync::Arc;

use sharemesh_engine::EngineEvent;
use sharemesh_protocol::{Accept, JobRequest, NanoUsd, Reject};
use tokio::sync::mpsc;

use super::Provider;
use sharemesh_mesh::clock::now_ms;

/// A local job the provider admitted: its terms and the engine's events. Dropping
/// `events` cancels the job within one token.
pub struct LocalJob {
    pub accept: Accept,
    pub events: mpsc::Receiver<EngineEvent>,
}

impl Provider {
    /// Admits and starts a job from this node's own gateway.
    pub async fn start_local(self: &Arc<Self>, request: &JobRequest) -> Result<LocalJob, Reject> {
        let reject = |(reason, detail)| Reject {
            job_id: request.job_id,
            provider: self.key.node_id(),
            reason,
            detail,
        };
        if request.provider != self.key.node_id() {
            return Err(reject((
                sharemesh_protocol::RejectReason::BadRequest,
                "request addressed to another provider".into(),
            )));
        }
        self.admit(request, now_ms()).map_err(reject)?;
        let (prompt_tokens, events) = self.start(request).await.map_err(reject)?;
        let accept = Accept {
            job_id: request.job_id,
            provider: self.key.node_id(),
            price_per_token: NanoUsd::ZERO,
            prompt_tokens,
            credit_window_tokens: u32::MAX,
            profile: self.engine.profile(&request.model).unwrap_or_default(),
        };
        Ok(LocalJob { accept, events })
    }
}
