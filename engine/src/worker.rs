//! The real engine's worker: one thread runs the loaded models' jobs from a bounded
//! queue, streaming each job's events to its own channel. Models on the batch-invariant
//! kernels run up to `max_batch` jobs together (continuous batching, `crate::batch`);
//! others, and replays, one at a time.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sharemesh_protocol::{ExecutionProfile, ModelDescriptor, ModelId};
use sharemesh_tokenizer::ModelHeader;
use tokio::sync::{mpsc, oneshot};

use crate::batch::{Batch, Counters, KvStats};
pub use crate::batch::{DEFAULT_KV_MEMORY_BYTES, DEFAULT_MAX_BATCH};
use crate::fair::{FairQueue, PartyKey};
use crate::{
    BatchCapacity, EngineError, EngineEvent, GenerateRequest, Generation, LoadedModel,
    ReplayAnswer, ReplayRequest, Replayed, TokenEngine, EVENT_BUFFER,
};

/// How the engine batches the kernels' models.
#[derive(Clone, Copy, Debug)]
pub struct BatchSettings {
    /// Jobs decoding together at most (1: one at a time).
    pub max_batch: usize,
    /// KV-cache memory per model, in bytes.
    pub kv_memory_bytes: usize,
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self {
            max_batch: DEFAULT_MAX_BATCH,
            kv_memory_bytes: DEFAULT_KV_MEMORY_BYTES,
        }
    }
}

/// Handle to the engine thread. Cloneable; dropping every clone stops the thread.
#[derive(Clone)]
pub struct Engine {
    requests: mpsc::Sender<Submission>,
    models: Arc<Vec<ModelDescriptor>>,
    queued: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
    /// Completion tokens the queued and running jobs may still produce (their
    /// `max_tokens` less any resumed prefix, counted until each job ends).
    committed_tokens: Arc<AtomicUsize>,
    queue_capacity: usize,
    /// The first model's backend (every model of one engine runs on one device).
    backend: String,
    /// Each model's file, and its header once a buyer asked for it.
    files: Arc<Vec<(ModelId, PathBuf)>>,
    profiles: Arc<Vec<(ModelId, ExecutionProfile)>>,
    headers: Arc<Mutex<HashMap<ModelId, Arc<ModelHeader>>>>,
    kv: Arc<KvStats>,
    max_batch: usize,
}

/// Work for the engine thread, in arrival order.
enum Submission {
    Generate {
        request: GenerateRequest,
        events: mpsc::Sender<EngineEvent>,
    },
    Replay {
        request: ReplayRequest,
        answer: oneshot::Sender<Result<Replayed, EngineError>>,
    },
}

/// The party verification replays wait as (no buyer's salt is all ones: it is a hash).
const REPLAY_PARTY: PartyKey = [0xff; 32];

impl Submission {
    /// Whom the work is for: a job's buyer (its prefix salt), or the verifier.
    fn party(&self) -> PartyKey {
        match self {
            Submission::Generate { request, .. } => request.prefix_salt,
            Submission::Replay { .. } => REPLAY_PARTY,
        }
    }
}

impl Engine {
    /// Starts the engine thread with `models`; `queue_capacity` jobs may wait; up to
    /// [`DEFAULT_MAX_BATCH`] run together.
    pub fn spawn(models: Vec<LoadedModel>, queue_capacity: usize) -> Self {
        Self::spawn_batched(models, queue_capacity, DEFAULT_MAX_BATCH)
    }

    /// [`Self::spawn`] with up to `max_batch` jobs decoding together (kernels' models;
    /// 1: one at a time).
    pub fn spawn_batched(
        models: Vec<LoadedModel>,
        queue_capacity: usize,
        max_batch: usize,
    ) -> Self {
        let settings = BatchSettings {
            max_batch,
            ..BatchSettings::default()
        };
        Self::spawn_with(models, queue_capacity, settings)
    }

    /// [`Self::spawn`] with the batching `settings`.
    pub fn spawn_with(
        models: Vec<LoadedModel>,
        queue_capacity: usize,
        settings: BatchSettings,
    ) -> Self {
        let (requests, inbox) = mpsc::channel::<Submission>(queue_capacity.max(1));
        let descriptors = Arc::new(
            models
                .iter()
                .map(|m| m.descriptor.clone())
                .collect::<Vec<_>>(),
        );
        let backend = models
            .first()
            .map_or_else(|| "none".to_owned(), LoadedModel::backend);
        let files = Arc::new(
            models
                .iter()
                .map(|m| (m.descriptor.id, m.path.clone()))
                .collect::<Vec<_>>(),
        );
        let profiles = Arc::new(
            models
                .iter()
                .map(|m| (m.descriptor.id, m.profile()))
                .collect::<Vec<_>>(),
        );
        let queued = Arc::new(AtomicUsize::new(0));
        let active = Arc::new(AtomicUsize::new(0));
        let committed_tokens = Arc::new(AtomicUsize::new(0));
        let (thread_queued, thread_active) = (queued.clone(), active.clone());
        let thread_committed = committed_tokens.clone();
        let kv = Arc::new(KvStats::default());
        let batch = Batch::new(settings.kv_memory_bytes, kv.clone());
        let spawned = std::thread::Builder::new()
            .name("sharemesh-engine".into())
            .spawn(move || {
                let counters = Counters {
                    active: &thread_active,
                    committed: &thread_committed,
                };
                let max_batch = settings.max_batch.max(1);
                work_loop(models, inbox, &thread_queued, &counters, batch, max_batch);
            });
        if let Err(err) = spawned {
            tracing::error!(%err, "could not start the engine thread");
        }
        Self {
            requests,
            models: descriptors,
            queued,
            active,
            committed_tokens,
            queue_capacity: queue_capacity.max(1),
            backend,
            files,
            profiles,
            headers: Arc::default(),
            kv,
            max_batch: settings.max_batch.max(1),
        }
    }

    /// Runs a job to completion and returns the whole generation (for the CLI and tests).
    pub async fn complete(&self, request: GenerateRequest) -> Result<Generation, EngineError> {
        let mut events = self.submit(request)?;
        while let Some(event) = events.recv().await {
            match event {
                EngineEvent::Finished(generation) => return Ok(generation),
                EngineEvent::Failed(err) => return Err(err),
                EngineEvent::Started { .. } | EngineEvent::Token(_) => {}
            }
        }
        Err(EngineError::Stopped)
    }
}

impl TokenEngine for Engine {
    /// Completion tokens already promised to queued and running jobs: what a new job
    /// waits behind, at most.
    fn committed_tokens(&self) -> usize {
        self.committed_tokens.load(Ordering::SeqCst)
    }

    fn models(&self) -> &[ModelDescriptor] {
        &self.models
    }

    fn model_header(&self, model: &ModelId) -> Option<Arc<ModelHeader>> {
        if let Some(header) = self.headers.lock().ok()?.get(model) {
            return Some(header.clone());
        }
        let (_, path) = self.files.iter().find(|(id, _)| id == model)?;
        let header = match ModelHeader::read_file(path) {
            Ok(header) => Arc::new(header),
            Err(err) => {
                tracing::warn!(%model, %err, "could not read the model's header");
                return None;
            }
        };
        if header.id() != *model {
            // The catalog's id is not this file's: buyers would refuse the header.
            tracing::warn!(%model, file = %path.display(), "the model file does not match its id");
            return None;
        }
        self.headers.lock().ok()?.insert(*model, header.clone());
        Some(header)
    }

    fn batch_capacity(&self) -> Option<BatchCapacity> {
        let total_blocks = self.kv.capacity_blocks.load(Ordering::Relaxed);
        (total_blocks > 0).then(|| BatchCapacity {
            max_batch: self.max_batch,
            total_blocks,
            available_blocks: self.kv.available_blocks.load(Ordering::Relaxed),
            preemptions: self.kv.preemptions.load(Ordering::Relaxed),
        })
    }

    fn active_jobs(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    fn queue_depth(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Queues a job; its events arrive on the returned channel. Dropping the receiver
    /// cancels the job within one token.
    fn submit(&self, request: GenerateRequest) -> Result<mpsc::Receiver<EngineEvent>, EngineError> {
        if !self.models.iter().any(|m| m.id == request.model) {
            return Err(EngineError::UnknownModel(request.model));
        }
        let (events, receiver) = mpsc::channel(EVENT_BUFFER);
        let committed = committed_tokens_of(&request);
        // The engine thread takes submissions off the channel into its fair queue at
        // once: the count of waiting jobs, not the channel, is what is bounded.
        if self.queued.fetch_add(1, Ordering::SeqCst) >= self.queue_capacity {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::Busy(self.queue_capacity));
        }
        self.committed_tokens.fetch_add(committed, Ordering::SeqCst);
        let refused = match self
            .requests
            .try_send(Submission::Generate { request, events })
        {
            Ok(()) => return Ok(receiver),
            Err(mpsc::error::TrySendError::Full(_)) => EngineError::Busy(self.queue_capacity),
            Err(mpsc::error::TrySendError::Closed(_)) => EngineError::Stopped,
        };
        self.queued.fetch_sub(1, Ordering::SeqCst);
        self.committed_tokens.fetch_sub(committed, Ordering::SeqCst);
        Err(refused)
    }

    fn backend(&self) -> String {
        self.backend.clone()
    }

    fn profile(&self, model: &ModelId) -> Option<ExecutionProfile> {
        self.profiles
            .iter()
            .find(|(id, _)| id == model)
            .map(|(_, profile)| profile.clone())
    }

    fn replay(&self, request: ReplayRequest) -> Result<ReplayAnswer, EngineError> {
        if !self.models.iter().any(|m| m.id == request.model) {
            return Err(EngineError::UnknownModel(request.model));
        }
        let (answer, receiver) = oneshot::channel();
        if self.queued.fetch_add(1, Ordering::SeqCst) >= self.queue_capacity {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::Busy(self.queue_capacity));
        }
        match self
            .requests
            .try_send(Submission::Replay { request, answer })
        {
            Ok(()) => Ok(receiver),
            Err(refused) => {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                Err(match refused {
                    mpsc::error::TrySendError::Full(_) => EngineError::Busy(self.queue_capacity),
                    mpsc::error::TrySendError::Closed(_) => EngineError::Stopped,
                })
            }
        }
    }
}

/// The engine thread: takes work while the batch has room (waiting only when idle),
/// then runs one batch step.
fn work_loop(
    mut models: Vec<LoadedModel>,
    mut inbox: mpsc::Receiver<Submission>,
    queued: &AtomicUsize,
    counters: &Counters<'_>,
    mut batch: Batch,
    max_batch: usize,
) {
    batch.prepare(&models);
    // Everything submitted waits here, fairly across buyers, until the batch has room.
    let mut waiting: FairQueue<Submission> = FairQueue::default();
    loop {
        while let Ok(work) = inbox.try_recv() {
            waiting.push(work.party(), work);
        }
        while batch.len() < max_batch {
            let work = match waiting.pop() {
                Some(work) => work,
                None if batch.is_empty() => match inbox.blocking_recv() {
                    Some(work) => work,
                    None => return, // Every handle dropped.
                },
                None => break, // Nothing waiting: run the batch.
            };
            queued.fetch_sub(1, Ordering::SeqCst);
            match work {
                Submission::Generate { request, events } => {
                    let committed = committed_tokens_of(&request);
                    let batchable = models
                        .iter()
                        .position(|m| m.descriptor.id == request.model && m.batches());
                    if let Some(model) = batchable {
                        batch.admit(&mut models, model, request, events, committed, counters);
                        continue;
                    }
                    counters.active.fetch_add(1, Ordering::SeqCst);
                    run_job(&mut models, request, &events);
                    counters.committed.fetch_sub(committed, Ordering::SeqCst);
                    counters.active.fetch_sub(1, Ordering::SeqCst);
                }
                Submission::Replay { request, answer } => {
                    counters.active.fetch_add(1, Ordering::SeqCst);
                    let replayed = models
                        .iter_mut()
                        .find(|m| m.descriptor.id == request.model)
                        .ok_or(EngineError::UnknownModel(request.model))
                        .and_then(|model| model.replay(&request));
                    let _ = answer.send(replayed);
                    counters.active.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        batch.start_waiting(&models, max_batch);
        batch.step(&models, counters);
    }
}

fn committed_tokens_of(request: &GenerateRequest) -> usize {
    (request.sampling.max_tokens as usize).saturating_sub(request.resume.len())
}

/// A single-job run's events on their way to its consumer: sent at once where the
/// channel has room and queued here where it has not, so the engine thread never waits
/// on a consumer (one that stops reading — a provider waiting on a buyer that does not
/// pay — would otherwise hold every job behind it). What is left when the job ends is
/// delivered by a thread of its own as the consumer reads, ending when the consumer
/// does; a job's queue is bounded by its tokens.
struct Outbox<'a> {
    events: &'a mpsc::Sender<EngineEvent>,
    queued: std::collections::VecDeque<EngineEvent>,
}

impl<'a> Outbox<'a> {
    fn new(events: &'a mpsc::Sender<EngineEvent>) -> Self {
        Self {
            events,
            queued: std::collections::VecDeque::new(),
        }
    }

    /// Queues `event` and sends what the channel takes; `false` when the consumer is
    /// gone.
    fn send(&mut self, event: EngineEvent) -> bool {
        self.queued.push_back(event);
        while let Some(event) = self.queued.pop_front() {
            match self.events.try_send(event) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(event)) => {
                    self.queued.push_front(event);
                    return true;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.queued.clear();
                    return false;
                }
            }
        }
        true
    }

    /// Hands what the consumer has not taken yet to a delivering thread.
    fn finish(self) {
        if self.queued.is_empty() {
            return;
        }
        let (events, queued) = (self.events.clone(), self.queued);
        let spawned = std::thread::Builder::new()
            .name("engine-outbox".into())
            .spawn(move || {
                for event in queued {
                    if events.blocking_send(event).is_err() {
                        return; // The consumer is gone.
                    }
                }
            });
        if let Err(err) = spawned {
            tracing::warn!(%err, "could not start a thread to deliver a finished job's events");
        }
    }
}

fn run_job(
    models: &mut [LoadedModel],
    request: GenerateRequest,
    events: &mpsc::Sender<EngineEvent>,
) {
    let mut outbox = Outbox::new(events);
    let Some(model) = models.iter_mut().find(|m| m.descriptor.id == request.model) else {
        outbox.send(EngineEvent::Failed(EngineError::UnknownModel(
            request.model,
        )));
        return outbox.finish();
    };
    // Announce the job (with its prompt size) before the prefill, so the buyer hears
    // back at once; a prompt that does not tokenise fails here with the reason.
    let prompt_tokens = match model.prompt_tokens(&request.prompt) {
        Ok(tokens) => tokens.len() as u32,
        Err(err) => {
            outbox.send(EngineEvent::Failed(err));
            return outbox.finish();
        }
    };
    if !outbox.send(EngineEvent::Started { prompt_tokens }) {
        return;
    }
    // A consumer that went away cancels the job; one that is slow never holds it.
    let result = model.generate(&request, |event| {
        outbox.send(EngineEvent::Token(event.clone()))
    });
    let last = match result {
        Ok(generation) => EngineEvent::Finished(generation),
        Err(err) => EngineEvent::Failed(err),
    };
    outbox.send(last);
    outbox.finish();
}
