//! Continuous batching for models on the batch-invariant kernels: the engine thread
//! keeps several jobs running and every step feeds each of them together —
//! a prompt chunk for a job still prefilling, one token for a job decoding — so the
//! weights are read once for the whole batch. Jobs join and leave at step boundaries.
//! (Up to `--max-batch` jobs, default [`DEFAULT_MAX_BATCH`].)
//!
//! Each job's tokens are the ones it gets alone: the kernels give every sequence its
//! solo bits whatever shares the step (`Llama::forward_batch`), and the per-job
//! generation logic ([`Decoder`]) is the single-job loop's.
//!
//! KV memory is paged ([`sharemesh_kernels::llama::KvPool`]: blocks of 16 positions,
//! a budget per model). A job joins the running set when the blocks its prompt needs
//! are free; its full blocks are indexed by prefix ([`crate::prefix`]) for later jobs.
//! When decoding runs out of blocks, unused indexed blocks go first, then the bronze
//! (interruptible) job that joined last, or else the job that joined last, is
//! preempted: its blocks return to the pool and it waits at the front of the queue, to
//! be recomputed (from whatever of its prefix is still indexed) and continue with the
//! same tokens.
//!
//! A job whose event channel is full (a slow client) sits out steps until it drains
//! instead of holding up the batch; a job whose client went away leaves at once.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use sharemesh_kernels::llama::{BatchEntry, KvPool, Llama, SequenceCache, BLOCK_POSITIONS};
use sharemesh_kernels::KernelError;
use tokio::sync::mpsc::{self, error::TrySendError};

use crate::generate::{Decoder, Step};
use crate::paged::PagedLlama;
use crate::prefix::{extend_chain, parent_of, BlockHash, PrefixIndex, PrefixMatch};
use crate::{EngineError, EngineEvent, GenerateRequest, LoadedModel};

/// Jobs decoding together at most, unless the provider sets it (`--max-batch`).
pub const DEFAULT_MAX_BATCH: usize = 8;
/// KV-cache memory per model unless the provider sets it (`--kv-memory-mib`).
pub const DEFAULT_KV_MEMORY_BYTES: usize = 1 << 30;
/// Prompt tokens fed per step, all prefilling jobs together (oldest first): bounds a
/// step's time, so prompts arriving together or a long one do not stall the tokens of
/// jobs already decoding, and the first job's prompt is not held up by the later ones'.
const PREFILL_BUDGET: usize = 128;

/// A model the batch drives: the kernels' (each sequence's solo bits), or the paged
/// candle graph (any device; solo within a float tolerance, `crate::paged`).
#[derive(Clone, Copy)]
pub(crate) enum BatchModel<'a> {
    Kernels(&'a Llama),
    Paged(&'a PagedLlama),
}

impl BatchModel<'_> {
    /// A pool of at most `blocks` KV blocks for this model's sequences.
    pub(crate) fn kv_pool(self, blocks: usize) -> KvPool {
        match self {
            BatchModel::Kernels(llama) => llama.kv_pool(blocks),
            BatchModel::Paged(paged) => paged.kv_pool(blocks),
        }
    }

    /// Whether a sequence's bits are the same however its positions are split into
    /// steps (the kernels). The paged graph's attention products are not (a prompt
    /// prefilled in two chunks, or a token prefilled rather than decoded, rounds
    /// otherwise), so its jobs are fed as the single-job path feeds them: the prompt in
    /// one piece, every later position one token at a time, and no prefix reused from
    /// another job — which keeps each job's bits its solo run's on the CPU, and a
    /// resumed or preempted job exact.
    fn invariant(self) -> bool {
        matches!(self, BatchModel::Kernels(_))
    }

    /// One step of the entries together; each one's logits after its last token.
    pub(crate) fn forward_batch(
        self,
        entries: &mut [BatchEntry<'_>],
    ) -> Result<Vec<Vec<f32>>, String> {
        match self {
            BatchModel::Kernels(llama) => llama.forward_batch(entries).map_err(|e| e.to_string()),
            BatchModel::Paged(paged) => paged.forward_batch(entries).map_err(|e| e.to_string()),
        }
    }
}

/// A job of the batch: its generation state, cache, and client.
struct Running {
    model: usize,
    decoder: Decoder,
    cache: SequenceCache,
    events: mpsc::Sender<EngineEvent>,
    /// Tokens not in the cache yet: the rest of the prefill, or the last token.
    pending: Vec<u32>,
    prefilling: bool,
    reused: usize,
    /// Bronze work: preempted first when KV memory runs out.
    interruptible: bool,
    /// The first link of its blocks' hash chain (`GenerateRequest::prefix_salt`).
    prefix_salt: BlockHash,
    /// Hashes of the cache's full blocks, and how many of them are indexed.
    chain: Vec<BlockHash>,
    indexed: usize,
    /// Started, but nothing fed yet: it may still pick up prefix blocks that jobs ahead
    /// of it fill meanwhile.
    fresh: bool,
    /// Hashes of every full block of its history but the last token (what it would
    /// index once prefilled).
    history_chain: Vec<BlockHash>,
    /// Events the client's channel had no room for yet, oldest first.
    unsent: VecDeque<EngineEvent>,
    /// Finished (its last event may still be unsent).
    done: bool,
    committed: usize,
}

impl Running {
    /// Sends what waits; `false` when the client went away.
    fn flush(&mut self) -> bool {
        while let Some(event) = self.unsent.pop_front() {
            match self.events.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Full(event)) => {
                    self.unsent.push_front(event);
                    return true;
                }
                Err(TrySendError::Closed(_)) => return false,
            }
        }
        true
    }

    fn send(&mut self, event: EngineEvent) {
        self.unsent.push_back(event);
        let _ = self.flush();
    }

    fn fail(&mut self, err: EngineError) {
        self.send(EngineEvent::Failed(err));
        self.done = true;
    }

    /// The hash chain of the job's history but its last token (at least one token runs,
    /// for logits), and its longest indexed prefix.
    fn longest_prefix(&self, kv: &mut ModelKv) -> (Vec<BlockHash>, PrefixMatch) {
        let history = self.decoder.to_prefill();
        let mut chain = Vec::new();
        extend_chain(&mut chain, &self.prefix_salt, &history[..history.len() - 1]);
        let found = self.prefix_of(kv, &chain);
        (chain, found)
    }

    /// The longest indexed prefix of the job's history but its last token, whose full
    /// blocks hash to `chain`.
    fn prefix_of(&self, kv: &mut ModelKv, chain: &[BlockHash]) -> PrefixMatch {
        let history = self.decoder.to_prefill();
        let usable = &history[..history.len() - 1];
        kv.prefixes.longest(&self.prefix_salt, chain, usable)
    }

    /// Starts the cache from `found` (whose whole blocks are the first links of
    /// `chain`), the rest of the history pending.
    fn start_from(
        &mut self,
        pool: &KvPool,
        mut chain: Vec<BlockHash>,
        found: PrefixMatch,
    ) -> Result<(), KernelError> {
        let reused = found.positions;
        self.cache = SequenceCache::from_prefix(pool, found.blocks, reused)?;
        self.history_chain.clone_from(&chain);
        chain.truncate(reused / BLOCK_POSITIONS);
        self.indexed = chain.len();
        self.chain = chain;
        self.pending = self.decoder.to_prefill()[reused..].to_vec();
        if self.prefilling {
            self.reused = reused;
        }
        self.fresh = true;
        Ok(())
    }

    /// Indexes the cache's newly full blocks under their prefix hashes.
    fn index_blocks(&mut self, index: &mut PrefixIndex) {
        let cached = &self.decoder.to_prefill()[..self.cache.positions()];
        extend_chain(&mut self.chain, &self.prefix_salt, cached);
        let blocks = self.cache.full_blocks();
        let (block_tokens, _) = cached.as_chunks::<BLOCK_POSITIONS>();
        let full = self.chain.iter().zip(blocks).zip(block_tokens);
        for (i, ((hash, block), tokens)) in full.enumerate().skip(self.indexed) {
            index.insert(
                *hash,
                parent_of(&self.chain, &self.prefix_salt, i),
                tokens,
                block,
            );
        }
        self.indexed = blocks.len();
    }
}

/// One model's KV memory: its pool and the index of full blocks by prefix.
struct ModelKv {
    pool: KvPool,
    prefixes: PrefixIndex,
}

impl ModelKv {
    /// Blocks that can be had now: free, or held only by the prefix index.
    fn available(&self) -> usize {
        self.pool.free() + self.prefixes.evictable()
    }
}

/// KV memory figures the engine shares with the provider (quotes, adverts, metrics).
#[derive(Default)]
pub struct KvStats {
    /// Blocks of the budget (all models together; 0 until a kernels' job ran).
    pub capacity_blocks: AtomicUsize,
    /// Blocks free or held only for prefix reuse.
    pub available_blocks: AtomicUsize,
    /// Jobs preempted (and recomputed later) because decoding ran out of blocks.
    pub preemptions: AtomicU64,
}

/// The jobs on the kernels' models of one engine: running, and waiting for KV memory.
pub(crate) struct Batch {
    running: Vec<Running>,
    waiting: VecDeque<Running>,
    kv: Vec<Option<ModelKv>>,
    kv_bytes: usize,
    stats: Arc<KvStats>,
}

/// The engine's counters the batch keeps current.
pub(crate) struct Counters<'a> {
    pub active: &'a AtomicUsize,
    pub committed: &'a AtomicUsize,
}

impl Batch {
    pub(crate) fn new(kv_bytes: usize, stats: Arc<KvStats>) -> Self {
        Self {
            running: Vec::new(),
            waiting: VecDeque::new(),
            kv: Vec::new(),
            kv_bytes,
            stats,
        }
    }

    /// Jobs taken in: running and waiting.
    pub(crate) fn len(&self) -> usize {
        self.running.len() + self.waiting.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn model_kv(&mut self, model: usize, llama: BatchModel<'_>) -> &mut ModelKv {
        if self.kv.len() <= model {
            self.kv.resize_with(model + 1, || None);
        }
        let kv_bytes = self.kv_bytes;
        let kv = self.kv[model].get_or_insert_with(|| {
            let probe = llama.kv_pool(0);
            let blocks = (kv_bytes / probe.block_bytes().max(1)).max(1);
            ModelKv {
                pool: llama.kv_pool(blocks),
                prefixes: PrefixIndex::default(),
            }
        });
        kv
    }

    /// Sets up every kernels' model's KV pool and publishes the figures, so quotes and
    /// adverts carry them before the first job.
    pub(crate) fn prepare(&mut self, models: &[LoadedModel]) {
        for (index, model) in models.iter().enumerate() {
            if let Some(llama) = model.batch_model() {
                self.model_kv(index, llama);
            }
        }
        self.publish();
    }

    /// Takes in `request` on `models[model]` (which runs on the kernels): announces it
    /// with its prompt size and queues it for KV memory, or fails it with the reason
    /// (a job whose context could outgrow the whole KV budget is refused here).
    pub(crate) fn admit(
        &mut self,
        models: &mut [LoadedModel],
        model: usize,
        request: GenerateRequest,
        events: mpsc::Sender<EngineEvent>,
        committed: usize,
        counters: &Counters<'_>,
    ) {
        let (interruptible, prefix_salt) = (request.interruptible, request.prefix_salt);
        let started = Decoder::new(&mut models[model], request).and_then(|decoder| {
            let llama = models[model].batch_model().ok_or_else(|| {
                EngineError::Unsupported("this model's graph does not batch".into())
            })?;
            let pool = &self.model_kv(model, llama).pool;
            let blocks = KvPool::blocks_for(decoder.final_positions());
            if blocks > pool.capacity() {
                return Err(EngineError::OverCapacity(format!(
                    "the job may reach {} positions, {} MiB of KV cache; this provider's \
                     KV budget for the model is {} MiB",
                    decoder.final_positions(),
                    (blocks * pool.block_bytes()) >> 20,
                    (pool.capacity() * pool.block_bytes()) >> 20,
                )));
            }
            Ok((decoder, pool.new_sequence()))
        });
        let (decoder, cache) = match started {
            Ok(started) => started,
            Err(err) => {
                let _ = events.try_send(EngineEvent::Failed(err));
                counters.committed.fetch_sub(committed, Ordering::SeqCst);
                return;
            }
        };
        counters.active.fetch_add(1, Ordering::SeqCst);
        let mut job = Running {
            model,
            decoder,
            cache,
            events,
            pending: Vec::new(),
            prefilling: true,
            reused: 0,
            interruptible,
            prefix_salt,
            chain: Vec::new(),
            indexed: 0,
            fresh: false,
            history_chain: Vec::new(),
            unsent: VecDeque::new(),
            done: false,
            committed,
        };
        let prompt_tokens = job.decoder.prompt_tokens();
        job.send(EngineEvent::Started { prompt_tokens });
        self.waiting.push_back(job);
    }

    /// Moves waiting jobs into the running set, oldest first, while their prompts'
    /// blocks are available (the first job always: alone, it has the whole budget).
    pub(crate) fn start_waiting(&mut self, models: &[LoadedModel], max_batch: usize) {
        while self.running.len() < max_batch {
            let Some(mut job) = self.waiting.pop_front() else {
                return;
            };
            let Some(llama) = models[job.model].batch_model() else {
                job.fail(EngineError::Unsupported(
                    "this model's graph does not batch".into(),
                ));
                self.running.push(job);
                continue;
            };
            let alone = self.running.iter().all(|r| r.model != job.model);
            let kv = self.model_kv(job.model, llama);
            let (chain, found) = job.longest_prefix(kv);
            // A partly shared last block is copied when written: it counts as needed.
            let whole = found.positions / BLOCK_POSITIONS;
            let needed = KvPool::blocks_for(job.decoder.to_prefill().len()) - whole + 1;
            if !alone && needed > kv.available() {
                self.waiting.push_front(job);
                return;
            }
            if let Err(err) = job.start_from(&kv.pool, chain, found) {
                job.fail(EngineError::Inference(err.to_string()));
            }
            self.running.push(job);
        }
    }

    /// One step: every job that can move feeds its next tokens, together per model;
    /// finished and abandoned jobs leave. Sleeps a moment when every job waits on its
    /// client.
    pub(crate) fn step(&mut self, models: &[LoadedModel], counters: &Counters<'_>) {
        let mut moved = false;
        for model in 0..models.len() {
            moved |= self.step_model(models, model);
        }
        self.retire(counters);
        self.publish();
        if !moved && !self.running.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The jobs of `model` that move this step and the tokens each feeds, in joining
    /// order: every decoding job its last token; prefilling (or recomputing) jobs the
    /// rest of their prompt, oldest first, within [`PREFILL_BUDGET`]. A job whose
    /// client does not keep up sits out, and so does a job not fed yet whose next block
    /// an earlier job completes in this step: it starts from that block next step
    /// ([`Self::catch_up_prefixes`]) instead of computing it again.
    fn plan(&mut self, model: usize, invariant: bool) -> Vec<(usize, usize)> {
        let mut budget = PREFILL_BUDGET;
        let mut plan = Vec::new();
        let mut completing: HashSet<BlockHash> = HashSet::new();
        for (i, r) in self.running.iter_mut().enumerate() {
            if r.model != model || r.done || !r.flush() || !r.unsent.is_empty() {
                continue;
            }
            let feed = match r.pending.len() {
                0 => continue,
                1 if !r.prefilling => 1,
                _ if !invariant => {
                    match r.decoder.prompt().len().checked_sub(r.cache.positions()) {
                        // The whole prompt in one piece, within the budget or alone.
                        Some(prompt) if prompt > 0 => {
                            if prompt > budget && budget < PREFILL_BUDGET {
                                continue;
                            }
                            budget = budget.saturating_sub(prompt);
                            prompt
                        }
                        _ => 1,
                    }
                }
                pending => {
                    let next = r.cache.positions() / BLOCK_POSITIONS;
                    let chain = &r.history_chain;
                    if r.fresh && chain.get(next).is_some_and(|h| completing.contains(h)) {
                        continue;
                    }
                    let feed = pending.min(budget);
                    budget -= feed;
                    let filled = ((r.cache.positions() + feed) / BLOCK_POSITIONS).min(chain.len());
                    completing.extend(chain.get(next..filled).unwrap_or_default());
                    feed
                }
            };
            if feed > 0 {
                plan.push((i, feed));
            }
        }
        plan
    }

    fn step_model(&mut self, models: &[LoadedModel], model: usize) -> bool {
        let Some(llama) = models[model].batch_model() else {
            return false;
        };
        let invariant = llama.invariant();
        if invariant {
            self.catch_up_prefixes(model);
        }
        let mut plan = self.plan(model, invariant);
        if plan.is_empty() || !self.make_room(model, llama, &mut plan) {
            return false;
        }
        let tokenizer = &models[model].vocabulary.tokenizer;
        let mut entries: Vec<BatchEntry<'_>> = Vec::with_capacity(plan.len());
        let mut planned = plan.iter().peekable();
        for (i, r) in self.running.iter_mut().enumerate() {
            if let Some(&(_, feed)) = planned.next_if(|&&(j, _)| j == i) {
                entries.push(BatchEntry {
                    position: r.cache.positions(),
                    tokens: &r.pending[..feed],
                    cache: &mut r.cache,
                });
            }
        }
        // `plan` follows `self.running`'s order, so `entries` does too.
        let outcome = llama.forward_batch(&mut entries);
        drop(entries);
        let logits = match outcome {
            Ok(logits) => logits,
            Err(err) => {
                for &(i, _) in &plan {
                    self.running[i].fail(EngineError::Inference(err.clone()));
                }
                return true;
            }
        };
        let Some(kv) = self.kv.get_mut(model).and_then(Option::as_mut) else {
            return true;
        };
        for (&(i, fed), logits) in plan.iter().zip(logits) {
            let r = &mut self.running[i];
            r.fresh = false;
            r.pending.drain(..fed);
            if invariant {
                r.index_blocks(&mut kv.prefixes);
            }
            if !r.pending.is_empty() {
                continue; // More of the prompt (or of a recomputation) first.
            }
            if r.prefilling {
                r.prefilling = false;
                r.decoder.prefilled(r.reused);
            }
            advance(r, logits, tokenizer);
        }
        true
    }

    /// Jobs not fed yet start from any longer prefix indexed since they joined: a burst
    /// of one buyer's requests that share a system prompt computes it once per step's
    /// worth of prefill, not once per request, and the later ones reach their first
    /// token sooner.
    fn catch_up_prefixes(&mut self, model: usize) {
        let Some(kv) = self.kv.get_mut(model).and_then(Option::as_mut) else {
            return;
        };
        for r in self.running.iter_mut() {
            if r.model != model || !r.fresh || r.done {
                continue;
            }
            // The history is unchanged since the job started: its chain still holds.
            let found = r.prefix_of(kv, &r.history_chain);
            if found.positions > r.cache.positions() {
                let chain = r.history_chain.clone();
                if let Err(err) = r.start_from(&kv.pool, chain, found) {
                    r.fail(EngineError::Inference(err.to_string()));
                }
            }
        }
    }

    /// Frees blocks until the planned feeds fit: indexed blocks nobody holds first,
    /// then the jobs that joined last are preempted (and dropped from `plan`). `false`
    /// when nothing is left to run.
    fn make_room(
        &mut self,
        model: usize,
        llama: BatchModel<'_>,
        plan: &mut Vec<(usize, usize)>,
    ) -> bool {
        loop {
            let needed: usize = plan
                .iter()
                .map(|&(i, feed)| self.running[i].cache.blocks_needed(feed))
                .sum();
            let kv = self.model_kv(model, llama);
            let short = needed.saturating_sub(kv.pool.free());
            if short == 0 || kv.prefixes.evict(short) == short {
                return true;
            }
            let candidate = |r: &Running| r.model == model && !r.done;
            let jobs: Vec<(bool, bool)> = self
                .running
                .iter()
                .map(|r| (candidate(r), r.interruptible))
                .collect();
            let Some(victim) = preemption_victim(&jobs) else {
                return false;
            };
            let holders = self.running.iter().filter(|r| candidate(r)).count();
            if holders == 1 {
                // Alone and still short: the budget is too small for this job here.
                let kv = self.model_kv(model, llama);
                let err = EngineError::OverCapacity(format!(
                    "the KV cache is full: {needed} more blocks needed, {} free of a budget \
                     of {}",
                    kv.pool.free(),
                    kv.pool.capacity()
                ));
                self.running[victim].fail(err);
                plan.retain(|&(i, _)| i != victim);
                return !plan.is_empty();
            }
            self.preempt(victim);
            plan.retain(|&(i, _)| i != victim);
            for (i, _) in plan.iter_mut() {
                if *i > victim {
                    *i -= 1;
                }
            }
            if plan.is_empty() {
                return false;
            }
        }
    }

    /// Takes a running job back to the front of the queue without its cache (its
    /// indexed blocks stay indexed while the pool can keep them).
    fn preempt(&mut self, index: usize) {
        let mut job = self.running.remove(index);
        tracing::info!(
            positions = job.cache.positions(),
            "KV cache full: preempting the job that joined last (it is recomputed later)"
        );
        job.cache.truncate(0);
        job.pending.clear();
        job.chain.clear();
        job.indexed = 0;
        self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
        self.waiting.push_front(job);
    }

    /// Drops finished jobs whose last event went out and jobs whose client left
    /// (running or waiting); their indexed blocks stay for later jobs' prefixes.
    fn retire(&mut self, counters: &Counters<'_>) {
        let leaves = |r: &mut Running| {
            let open = r.flush();
            !open || (r.done && r.unsent.is_empty()) || r.events.is_closed()
        };
        let mut index = 0;
        while index < self.running.len() {
            if !leaves(&mut self.running[index]) {
                index += 1;
                continue;
            }
            let r = self.running.remove(index);
            counters.active.fetch_sub(1, Ordering::SeqCst);
            counters.committed.fetch_sub(r.committed, Ordering::SeqCst);
        }
        let before = self.waiting.len();
        self.waiting.retain_mut(|r| !leaves(r));
        for _ in self.waiting.len()..before {
            counters.active.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Shares the KV figures with the engine's handle.
    fn publish(&self) {
        let (capacity, available) = self.kv.iter().flatten().fold((0, 0), |(c, a), kv| {
            (c + kv.pool.capacity(), a + kv.available())
        });
        self.stats
            .capacity_blocks
            .store(capacity, Ordering::Relaxed);
        self.stats
            .available_blocks
            .store(available, Ordering::Relaxed);
    }
}

/// Which job to preempt, given each running job's (candidate, interruptible) in joining
/// order: the interruptible (bronze) candidate that joined last, or else the candidate
/// that joined last.
fn preemption_victim(jobs: &[(bool, bool)]) -> Option<usize> {
    let last = |bronze_only: bool| {
        jobs.iter()
            .rposition(|&(candidate, bronze)| candidate && (bronze || !bronze_only))
    };
    last(true).or_else(|| last(false))
}

/// Takes the job's next token(s) from `logits` and queues its events.
fn advance(r: &mut Running, mut logits: Vec<f32>, tokenizer: &sharemesh_tokenizer::GgufTokenizer) {
    loop {
        let mut events = Vec::new();
        let step = r.decoder.take(logits, tokenizer, |event| {
            events.push(EngineEvent::Token(event.clone()));
            true
        });
        for event in events {
            r.send(event);
        }
        match step {
            Ok(Step::Feed(token)) => {
                r.pending = vec![token];
                return;
            }
            Ok(Step::Again) => logits = Vec::new(),
            Ok(Step::Done) => {
                let generation = r.decoder.result();
                r.send(EngineEvent::Finished(generation));
                r.done = true;
                return;
            }
            Err(err) => {
                r.fail(err);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::preemption_victim;

    #[test]
    fn bronze_work_is_preempted_first_then_the_last_to_join() {
        // (candidate: this model's and running, interruptible)
        let bronze_early = [(true, true), (true, false), (true, false)];
        assert_eq!(preemption_victim(&bronze_early), Some(0));
        let two_bronze = [(true, true), (true, false), (true, true), (true, false)];
        assert_eq!(preemption_victim(&two_bronze), Some(2));
        let none_bronze = [(true, false), (true, false), (false, false)];
        assert_eq!(preemption_victim(&none_bronze), Some(1));
        // Another model's bronze job is not this model's to preempt.
        let other_model = [(false, true), (true, false)];
        assert_eq!(preemption_victim(&other_model), Some(1));
        assert_eq!(preemption_victim(&[(false, true)]), None);
    }
}
