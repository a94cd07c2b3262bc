//! The in-process route from this node's gateway to its own provider (`provide
//! --openai`): a node cannot dial itself, so the gateway's [`LocalRoute`] runs the job on
//! the provider directly. The provider admits it as it admits mesh jobs; its engine's
//! events become the events a remote provider's stream yields. Nothing is metered: a
//! node does not pay itself.

use std::sync::Arc;

use sharemesh_engine::EngineEvent;
use sharemesh_gateway::buyer::{JobEvent, SegmentError};
use sharemesh_gateway::segment::LocalRoute;
use sharemesh_protocol::Digest;
use sharemesh_protocol::{JobRequest, TokenChunk};
use sharemesh_provider::{LocalJob, Provider};
use tokio::sync::mpsc;

pub struct LocalProvider(pub Arc<Provider>);

impl LocalRoute for LocalProvider {
    fn run(&self, job: JobRequest) -> mpsc::Receiver<JobEvent> {
        let (tx, rx) = mpsc::channel(sharemesh_engine::EVENT_BUFFER);
        let provider = self.0.clone();
        tokio::spawn(async move {
            let LocalJob { accept, mut events } = match provider.start_local(&job).await {
                Ok(started) => started,
                Err(reject) => {
                    let _ = tx.send(JobEvent::Rejected(reject)).await;
                    return;
                }
            };
            let node = accept.provider;
            if tx.send(JobEvent::Accepted(accept)).await.is_err() {
                return;
            }
            while let Some(event) = events.recv().await {
                let out = match event {
                    EngineEvent::Token(token) => JobEvent::Token(TokenChunk {
                        job_id: job.job_id,
                        provider: node,
                        first_index: token.index,
                        token_ids: vec![token.token_id],
                        text_delta: token.text_delta,
                        finish: None,
                        // The node's own provider is not audited: no chain kept.
                        fingerprints: vec![token.fingerprint],
                        commitment: Digest::from_bytes([0; 32]),
                        logprobs: token.logprobs.into_iter().collect(),
                    }),
                    EngineEvent::Finished(generation) => JobEvent::Finished {
                        finish: generation.finish,
                    },
                    EngineEvent::Failed(err) => {
                        JobEvent::Failed(SegmentError::EngineFailed(err.to_string()))
                    }
                    EngineEvent::Started { .. } => continue,
                };
                // The gateway leaving drops `events`, which cancels the engine job.
                if tx.send(out).await.is_err() {
                    return;
                }
            }
        });
        rx
    }
}
