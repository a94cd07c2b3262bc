//! The node's engine as the gateway's [`Replayer`]: verification replays run on the
//! same engine (and queue) as the node's own jobs.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use sharemesh_engine::TokenEngine;
use sharemesh_gateway::verify::audit::{ReplayJob, ReplayResult, Replayer};
use sharemesh_protocol::{ExecutionProfile, ModelId};

pub struct EngineReplayer(pub Arc<dyn TokenEngine>);

impl Replayer for EngineReplayer {
    fn profile(&self, model: &ModelId) -> Option<ExecutionProfile> {
        self.0.profile(model)
    }

    fn replay(&self, job: ReplayJob) -> BoxFuture<'static, Result<ReplayResult, String>> {
        let queued = self.0.replay(job);
        async move {
            let answer = queued.map_err(|e| e.to_string())?;
            answer
                .await
                .map_err(|_| "the engine stopped".to_owned())?
                .map_err(|e| e.to_string())
        }
        .boxed()
    }
}
