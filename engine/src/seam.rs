//! The seam between the market and inference: what a provider needs of an engine.
//!
//! The real [`crate::Engine`] (a worker thread over loaded GGUF models) and the
//! [`crate::scripted::ScriptedEngine`] (deterministic tokens, no model; for tests and
//! simulations about the network and the market) both implement [`TokenEngine`], so a
//! provider, a buyer and a dispatcher can run together in one process in milliseconds.

use std::sync::Arc;

use sharemesh_protocol::{ExecutionProfile, ModelDescriptor, ModelId};
use sharemesh_tokenizer::ModelHeader;
use tokio::sync::{mpsc, oneshot};

use crate::{EngineError, GenerateRequest, Generation, ReplayRequest, Replayed, TokenEvent};

/// Where a queued replay's result arrives.
pub type ReplayAnswer = oneshot::Receiver<Result<Replayed, EngineError>>;

/// What a job's event channel carries, in order: `Started`, `Token`s, then `Finished`
/// or `Failed`.
#[derive(Debug, Clone)]
pub enum EngineEvent {
    Started { prompt_tokens: u32 },
    Token(TokenEvent),
    Finished(Generation),
    Failed(EngineError),
}

/// Tokens buffered between the engine and a slow consumer before generation pauses.
pub const EVENT_BUFFER: usize = 16;

/// An engine a provider can sell: it names its models, queues jobs, and streams each
/// job's events. Dropping a job's receiver cancels the job within one token.
pub trait TokenEngine: Send + Sync + 'static {
    /// The models this engine serves.
    fn models(&self) -> &[ModelDescriptor];
    /// Queues a job; its events arrive on the returned channel.
    fn submit(&self, request: GenerateRequest) -> Result<mpsc::Receiver<EngineEvent>, EngineError>;
    /// Jobs generating now.
    fn active_jobs(&self) -> usize;
    /// Jobs waiting for a slot.
    fn queue_depth(&self) -> usize;
    /// Completion tokens already promised to queued and running jobs: what a new job
    /// waits behind, at most.
    fn committed_tokens(&self) -> usize;
    /// Where and on what it runs, for reports (`cpu/sharemesh-kernels`, `scripted`).
    fn backend(&self) -> String;
    /// What `model`'s logits come from: the execution profile a job's `Accept` names
    /// and a verifier must match to replay it bit for bit.
    fn profile(&self, model: &ModelId) -> Option<ExecutionProfile>;
    /// Queues a teacher-forced replay of a delivered job (verification work); it waits
    /// behind the jobs already queued.
    fn replay(&self, request: ReplayRequest) -> Result<ReplayAnswer, EngineError>;
    /// The batching engine's room: jobs per batch and KV-cache memory (`None`: not a
    /// batching engine, or nothing ran on the kernels yet).
    fn batch_capacity(&self) -> Option<BatchCapacity> {
        None
    }
    /// `model`'s GGUF header and tensor digest, for buyers that count with its
    /// vocabulary (`None`: not served here, or no GGUF behind it). May read and hash
    /// the whole model file the first time: call it off the async runtime.
    fn model_header(&self, model: &ModelId) -> Option<Arc<ModelHeader>> {
        let _ = model;
        None
    }
}

/// A batching engine's room: jobs per batch, and KV-cache memory in blocks of
/// [`crate::BLOCK_POSITIONS`] positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchCapacity {
    /// Jobs decoding together at most.
    pub max_batch: usize,
    /// Blocks of the budget.
    pub total_blocks: usize,
    /// Blocks free now, or held only for prefix reuse (given back on demand).
    pub available_blocks: usize,
    /// Jobs preempted so far because decoding ran out of blocks.
    pub preemptions: u64,
}
