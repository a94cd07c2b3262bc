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
//! A job whose event channel is full (a slow client) sits out steps until it drains
//! instead of holding up the batch; a job whose client went away leaves at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use sharemesh_kernels::llama::{BatchEntry, Llama, SequenceCache};
use tokio::sync::mpsc::{self, error::TrySendError};

use crate::generate::{Decoder, Step};
use crate::{EngineError, EngineEvent, GenerateRequest, LoadedModel};

/// Jobs decoding together at most, unless the provider sets it (`--max-batch`).
pub const DEFAULT_MAX_BATCH: usize = 8;
/// Prompt tokens one job feeds per step: bounds a step's time, so a long prompt does
/// not stall the tokens of jobs already decoding.
const PREFILL_CHUNK: usize = 128;
/// Caches of finished jobs kept for their prefix (a chat's next turn, a failover's
/// warm standby, a resumed job).
const KEPT_CACHES: usize = 4;

/// A job in the batch: its generation state, cache, and client.
struct Running {
    model: usize,
    decoder: Decoder,
    cache: SequenceCache,
    events: mpsc::Sender<EngineEvent>,
    /// Tokens not in the cache yet: the rest of the prefill, or the last token.
    pending: Vec<u32>,
    prefilling: bool,
    reused: usize,
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
}

/// Finished jobs' caches and the tokens each holds.
#[derive(Default)]
struct KeptCaches {
    entries: VecDeque<(usize, Vec<u32>, SequenceCache)>,
}

impl KeptCaches {
    /// The kept cache of `model` sharing the longest prefix with `tokens` (at least
    /// one token is left to run, for the logits), cut to that prefix; or a fresh one.
    fn take(&mut self, model: usize, tokens: &[u32], llama: &Llama) -> (SequenceCache, usize) {
        let shared = |held: &[u32]| {
            let common = held.iter().zip(tokens).take_while(|(a, b)| a == b).count();
            common.min(tokens.len().saturating_sub(1))
        };
        let best = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, (m, _, _))| *m == model)
            .map(|(i, (_, held, _))| (i, shared(held)))
            .max_by_key(|&(_, reused)| reused)
            .filter(|&(_, reused)| reused > 0);
        match best.and_then(|(i, reused)| Some((self.entries.remove(i)?, reused))) {
            Some(((_, _, mut cache), reused)) => {
                cache.truncate(reused);
                (cache, reused)
            }
            None => (llama.new_sequence(), 0),
        }
    }

    fn keep(&mut self, model: usize, tokens: Vec<u32>, cache: SequenceCache) {
        self.entries.push_front((model, tokens, cache));
        self.entries.truncate(KEPT_CACHES);
    }
}

/// The jobs running on the kernels' models of one engine.
#[derive(Default)]
pub(crate) struct Batch {
    running: Vec<Running>,
    kept: KeptCaches,
}

/// The engine's counters the batch keeps current.
pub(crate) struct Counters<'a> {
    pub active: &'a AtomicUsize,
    pub committed: &'a AtomicUsize,
}

impl Batch {
    pub(crate) fn len(&self) -> usize {
        self.running.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Starts `request` on `models[model]` (which runs on the kernels): announces it
    /// with its prompt size, or fails it with the reason.
    pub(crate) fn admit(
        &mut self,
        models: &mut [LoadedModel],
        model: usize,
        request: GenerateRequest,
        events: mpsc::Sender<EngineEvent>,
        committed: usize,
        counters: &Counters<'_>,
    ) {
        let started = Decoder::new(&mut models[model], request).and_then(|decoder| {
            let llama = models[model].kernel_llama().ok_or_else(|| {
                EngineError::Unsupported("batching needs the sharemesh kernels".into())
            })?;
            Ok((self.kept.take(model, decoder.to_prefill(), llama), decoder))
        });
        let ((cache, reused), decoder) = match started {
            Ok(started) => started,
            Err(err) => {
                let _ = events.try_send(EngineEvent::Failed(err));
                counters.committed.fetch_sub(committed, Ordering::SeqCst);
                return;
            }
        };
        counters.active.fetch_add(1, Ordering::SeqCst);
        let mut running = Running {
            model,
            pending: decoder.to_prefill()[reused..].to_vec(),
            cache,
            events,
            prefilling: true,
            reused,
            unsent: VecDeque::new(),
            done: false,
            committed,
            decoder,
        };
        let prompt_tokens = running.decoder.prompt_tokens();
        running.send(EngineEvent::Started { prompt_tokens });
        self.running.push(running);
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
        if !moved && !self.running.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn step_model(&mut self, models: &[LoadedModel], model: usize) -> bool {
        let Some(llama) = models[model].kernel_llama() else {
            return false;
        };
        let tokenizer = &models[model].vocabulary.tokenizer;
        let mut ready: Vec<&mut Running> = self
            .running
            .iter_mut()
            .filter(|r| r.model == model && !r.done)
            .filter_map(|r| (r.flush() && r.unsent.is_empty()).then_some(r))
            .collect();
        if ready.is_empty() {
            return false;
        }
        let feeds: Vec<Vec<u32>> = ready
            .iter()
            .map(|r| r.pending[..r.pending.len().min(PREFILL_CHUNK)].to_vec())
            .collect();
        let mut entries: Vec<BatchEntry<'_>> = ready
            .iter_mut()
            .zip(&feeds)
            .map(|(r, tokens)| BatchEntry {
                position: r.cache.positions(),
                cache: &mut r.cache,
                tokens,
            })
            .collect();
        let outcome = llama.forward_batch(&mut entries);
        drop(entries);
        let logits = match outcome {
            Ok(logits) => logits,
            Err(err) => {
                for r in ready {
                    r.send(EngineEvent::Failed(EngineError::Inference(err.to_string())));
                    r.done = true;
                }
                return true;
            }
        };
        for ((r, fed), logits) in ready.into_iter().zip(&feeds).zip(logits) {
            r.pending.drain(..fed.len());
            if r.prefilling {
                if !r.pending.is_empty() {
                    continue; // More of the prompt first.
                }
                r.prefilling = false;
                r.decoder.prefilled(r.reused);
            }
            advance(r, logits, tokenizer);
        }
        true
    }

    /// Drops finished jobs whose last event went out and jobs whose client left;
    /// keeps their caches for a later job's prefix.
    fn retire(&mut self, counters: &Counters<'_>) {
        let mut index = 0;
        while index < self.running.len() {
            let r = &mut self.running[index];
            let open = r.flush();
            let leaves = !open || (r.done && r.unsent.is_empty()) || r.events.is_closed();
            if !leaves {
                index += 1;
                continue;
            }
            let r = self.running.swap_remove(index);
            counters.active.fetch_sub(1, Ordering::SeqCst);
            counters.committed.fetch_sub(r.committed, Ordering::SeqCst);
            let held = r.decoder.to_prefill()[..r.cache.positions()].to_vec();
            self.kept.keep(r.model, held, r.cache);
        }
    }
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
                finish(r);
                return;
            }
            Err(err) => {
                r.send(EngineEvent::Failed(err));
                r.done = true;
                return;
            }
        }
    }
}

fn finish(r: &mut Running) {
    let generation = r.decoder.result();
    r.send(EngineEvent::Finished(generation));
    r.done = true;
}
