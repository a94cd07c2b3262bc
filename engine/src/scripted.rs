//! A scripted engine: deterministic tokens without a model.
//!
//! For tests and simulations about the network and the market only (failover, hedging,
//! quotes, budgets, preemption, stalls, adversaries): it says so in its backend name
//! (`scripted`) and its models' architecture (`scripted`). Exactness, resume of real
//! text and the demo stay on the real model.
//!
//! Token `i` of a job is a pure function of (model, prompt, seed, i), so a job resumed on
//! another scripted provider continues exactly as the uninterrupted run would have, and
//! a test can compute the whole expected answer with [`ScriptedEngine::expected`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use sharemesh_protocol::{
    ExecutionProfile, FinishReason, ModelDescriptor, ModelId, Prompt, StepFingerprint,
};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::{
    EngineError, EngineEvent, GenerateRequest, Generation, ReplayAnswer, ReplayRequest, Replayed,
    TokenEngine, TokenEvent, EVENT_BUFFER,
};

/// Distinct scripted tokens (ids 1..=VOCABULARY; 0 is never produced).
const VOCABULARY: u32 = 512;
/// The script's end token: never one of its words (those are 1..=VOCABULARY), what its
/// sampler draws where the script ends.
pub const END_TOKEN: u32 = 0;

/// How the scripted engine behaves.
#[derive(Clone, Debug)]
pub struct Script {
    /// Wait before the first token of a job (an emulated prefill).
    pub prefill_delay: Duration,
    /// Wait before every token (an emulated decoding speed).
    pub token_delay: Duration,
    /// Jobs generating at once; more wait in the queue.
    pub slots: usize,
    /// Jobs that may wait for a slot before `submit` answers `Busy`.
    pub queue_capacity: usize,
    /// End of text after this many completion tokens (`None`: only `max_tokens` ends a
    /// job).
    pub stop_after: Option<u32>,
    /// Adversary kit: garbage tokens (another seed's) under the model's name.
    #[cfg(feature = "adversary")]
    pub cheat: crate::cheat::Cheat,
    /// Report a batching engine's room (`slots` jobs per batch, this many KV blocks;
    /// each running job holds the blocks of its `max_tokens`), so quotes and adverts
    /// can be tested on it. `None`: an engine that does not batch.
    pub kv_blocks: Option<usize>,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            prefill_delay: Duration::ZERO,
            token_delay: Duration::from_millis(1),
            slots: 1,
            queue_capacity: 16,
            stop_after: None,
            #[cfg(feature = "adversary")]
            cheat: crate::cheat::Cheat::None,
            kv_blocks: None,
        }
    }
}

/// The scripted engine: cheap to clone, every clone shares its counters.
#[derive(Clone)]
pub struct ScriptedEngine {
    models: Arc<Vec<ModelDescriptor>>,
    script: Script,
    slots: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
    committed: Arc<AtomicUsize>,
    /// Jobs started (a camouflaged cheat counts them).
    #[cfg(feature = "adversary")]
    jobs_run: Arc<AtomicUsize>,
    /// KV blocks the running jobs hold (with `Script::kv_blocks`).
    held_blocks: Arc<AtomicUsize>,
}

impl ScriptedEngine {
    pub fn new(models: Vec<ModelDescriptor>, script: Script) -> Self {
        Self {
            models: Arc::new(models),
            slots: Arc::new(Semaphore::new(script.slots.max(1))),
            script,
            queued: Arc::new(AtomicUsize::new(0)),
            active: Arc::new(AtomicUsize::new(0)),
            committed: Arc::new(AtomicUsize::new(0)),
            #[cfg(feature = "adversary")]
            jobs_run: Arc::new(AtomicUsize::new(0)),
            held_blocks: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A model descriptor for scripted serving: its id is the sha256 of its name, as a
    /// real model's id is the sha256 of its file.
    pub fn model(name: &str) -> ModelDescriptor {
        ModelDescriptor {
            id: ModelId::from_bytes(Sha256::digest(name.as_bytes()).into()),
            name: name.to_owned(),
            architecture: "scripted".into(),
            quantization: "none".into(),
            context_length: 4096,
        }
    }

    /// Prompt size as this engine counts it: one token per whitespace-separated word
    /// (plus one for a text prompt's start, four per chat message for its turn markers).
    pub fn prompt_tokens(prompt: &Prompt) -> u32 {
        let words = |text: &str| text.split_whitespace().count() as u32;
        match prompt {
            Prompt::Text(text) => 1 + words(text),
            Prompt::Chat(messages) => messages.iter().map(|m| 4 + words(&m.content)).sum(),
            Prompt::Tokens(ids) => ids.len() as u32,
        }
    }

    /// Token `index` of the completion of `request` (resumed tokens included).
    pub fn token(request: &GenerateRequest, index: u32) -> u32 {
        Self::token_of(
            &request.model,
            &request.prompt,
            request.sampling.seed,
            index,
        )
    }

    fn token_of(model: &ModelId, prompt: &Prompt, seed: u64, index: u32) -> u32 {
        let mut hasher = Sha256::new();
        hasher.update(model.as_bytes());
        hasher.update(serde_json::to_vec(prompt).unwrap_or_default());
        hasher.update(seed.to_le_bytes());
        hasher.update(index.to_le_bytes());
        let digest = hasher.finalize();
        1 + u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]]) % VOCABULARY
    }

    /// The scripted "logits" of a step: the token alone, at 1.0.
    pub fn fingerprint(token: u32) -> StepFingerprint {
        StepFingerprint {
            top: vec![(token, 1.0f32.to_bits())],
        }
    }

    /// The profile scripted jobs name: replays of it are exact by construction.
    pub fn scripted_profile() -> ExecutionProfile {
        ExecutionProfile {
            engine: "scripted".into(),
            version: "1".into(),
            isa: "none".into(),
            quantization: "none".into(),
            device: "none".into(),
        }
    }

    /// The text a token stands for (a word with its leading space).
    pub fn text(token: u32) -> String {
        format!(" w{token}")
    }

    /// The whole answer an uninterrupted job gives: its token ids and text.
    pub fn expected(&self, request: &GenerateRequest) -> (Vec<u32>, String) {
        let count = self.completion_length(request);
        let ids: Vec<u32> = (0..count).map(|i| Self::token(request, i)).collect();
        let text = ids.iter().map(|&t| Self::text(t)).collect();
        (ids, text)
    }

    fn completion_length(&self, request: &GenerateRequest) -> u32 {
        let max = request.sampling.max_tokens;
        // The never-stop cheat goes on where the script ends, to bill `max_tokens`.
        #[cfg(feature = "adversary")]
        if self.script.cheat == crate::cheat::Cheat::NeverStop {
            return max;
        }
        match self.script.stop_after {
            Some(stop) if !request.ignore_eos => stop.min(max),
            _ => max,
        }
    }

    /// A cheating scripted engine's token at `index` and its fingerprint, or `None` where
    /// it plays honest: garbage is another seed's token; a token chooser reports the
    /// script's own "logits" (the honest token's fingerprint) over a token of its choice.
    #[cfg(feature = "adversary")]
    fn cheating_step(
        playing: crate::cheat::Playing,
        request: &crate::GenerateRequest,
        index: u32,
    ) -> Option<(u32, StepFingerprint)> {
        let other_seed = |seed: u64| Self::token_of(&request.model, &request.prompt, seed, index);
        if playing.garbage {
            let token = other_seed(request.sampling.seed.wrapping_add(0x5eed));
            return Some((token, Self::fingerprint(token)));
        }
        if playing.cheat == crate::cheat::Cheat::ChooseTokens {
            let token = other_seed(request.sampling.seed ^ crate::cheat::OWN_STREAM);
            return Some((token, Self::fingerprint(Self::token(request, index))));
        }
        None
    }

    async fn run(self, request: GenerateRequest, events: mpsc::Sender<EngineEvent>) {
        let started = Instant::now();
        let prompt_tokens = Self::prompt_tokens(&request.prompt);
        if events
            .send(EngineEvent::Started { prompt_tokens })
            .await
            .is_err()
        {
            return;
        }
        tokio::time::sleep(self.script.prefill_delay).await;
        let prefill_seconds = started.elapsed().as_secs_f64();
        let length = self.completion_length(&request);
        let resumed = request.resume.len() as u32;
        let mut token_ids = request.resume.clone();
        let mut text = String::new();
        #[cfg(feature = "adversary")]
        let playing = {
            let jobs_run = self.jobs_run.fetch_add(1, Ordering::SeqCst);
            let jobs_run = u32::try_from(jobs_run).unwrap_or(u32::MAX);
            crate::cheat::Playing {
                cheat: self.script.cheat,
                garbage: self.script.cheat.serves_garbage(jobs_run, resumed > 0),
            }
        };
        for index in resumed..length {
            tokio::time::sleep(self.script.token_delay).await;
            let honest = Self::token(&request, index);
            let (token_id, fingerprint) = (honest, Self::fingerprint(honest));
            #[cfg(feature = "adversary")]
            let (token_id, fingerprint) =
                Self::cheating_step(playing, &request, index).unwrap_or((token_id, fingerprint));
            let delta = Self::text(token_id);
            token_ids.push(token_id);
            text.push_str(&delta);
            let event = TokenEvent {
                index,
                token_id,
                text_delta: delta,
                prompt_tokens,
                fingerprint,
                // A script has no distribution to report.
                logprobs: None,
            };
            if events.send(EngineEvent::Token(event)).await.is_err() {
                return; // The consumer left: the job is cancelled.
            }
        }
        let finish = if length < request.sampling.max_tokens {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        let generation = Generation {
            prompt_tokens,
            generated_tokens: length.saturating_sub(resumed),
            token_ids,
            text,
            finish,
            prefill_seconds,
            prefilled_tokens: prompt_tokens + resumed,
            reused_tokens: 0,
            generation_seconds: (started.elapsed().as_secs_f64() - prefill_seconds).max(0.0),
        };
        let _ = events.send(EngineEvent::Finished(generation)).await;
    }
}

impl TokenEngine for ScriptedEngine {
    fn models(&self) -> &[ModelDescriptor] {
        &self.models
    }

    fn submit(&self, request: GenerateRequest) -> Result<mpsc::Receiver<EngineEvent>, EngineError> {
        if !self.models.iter().any(|m| m.id == request.model) {
            return Err(EngineError::UnknownModel(request.model));
        }
        if self.queued.load(Ordering::SeqCst) >= self.script.queue_capacity.max(1) {
            return Err(EngineError::Busy(self.script.queue_capacity.max(1)));
        }
        let committed = (request.sampling.max_tokens as usize).saturating_sub(request.resume.len());
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.committed.fetch_add(committed, Ordering::SeqCst);
        let (events, receiver) = mpsc::channel(EVENT_BUFFER);
        let this = self.clone();
        tokio::spawn(async move {
            let permit = this.slots.clone().acquire_owned().await;
            this.queued.fetch_sub(1, Ordering::SeqCst);
            if permit.is_ok() {
                let blocks = crate::KvPool::blocks_for(request.sampling.max_tokens as usize);
                this.active.fetch_add(1, Ordering::SeqCst);
                this.held_blocks.fetch_add(blocks, Ordering::SeqCst);
                this.clone().run(request, events).await;
                this.held_blocks.fetch_sub(blocks, Ordering::SeqCst);
                this.active.fetch_sub(1, Ordering::SeqCst);
            }
            this.committed.fetch_sub(committed, Ordering::SeqCst);
        });
        Ok(receiver)
    }

    fn active_jobs(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    fn batch_capacity(&self) -> Option<crate::BatchCapacity> {
        let total_blocks = self.script.kv_blocks?;
        let held = self.held_blocks.load(Ordering::SeqCst);
        Some(crate::BatchCapacity {
            max_batch: self.script.slots.max(1),
            total_blocks,
            available_blocks: total_blocks.saturating_sub(held),
            preemptions: 0,
        })
    }

    fn queue_depth(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    fn committed_tokens(&self) -> usize {
        self.committed.load(Ordering::SeqCst)
    }

    fn backend(&self) -> String {
        "scripted".into()
    }

    fn profile(&self, model: &ModelId) -> Option<ExecutionProfile> {
        self.models
            .iter()
            .any(|m| m.id == *model)
            .then(Self::scripted_profile)
    }

    /// The honest script's fingerprints for the delivered tokens' steps, at once.
    fn replay(&self, request: ReplayRequest) -> Result<ReplayAnswer, EngineError> {
        if !self.models.iter().any(|m| m.id == request.model) {
            return Err(EngineError::UnknownModel(request.model));
        }
        let (answer, receiver) = oneshot::channel();
        // The script's token is both its step's only "logit" and what its sampler draws,
        // but where the script ends: there it draws the end token.
        let script_token = |i: usize| {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            Self::token_of(
                &request.model,
                &request.prompt,
                request.sampling.seed,
                index,
            )
        };
        let ends_at = self.script.stop_after.map_or(usize::MAX, |s| s as usize);
        let steps = request.from..request.outputs.len();
        let drawn: Vec<u32> = steps
            .clone()
            .map(|i| {
                if i >= ends_at {
                    END_TOKEN
                } else {
                    script_token(i)
                }
            })
            .collect();
        // The script's distribution is all on its token: a draw lies fully away from
        // any other.
        let draw_distances = drawn
            .iter()
            .zip(&request.outputs[request.from..])
            .map(|(drawn, delivered)| if drawn == delivered { 0.0 } else { 1.0 })
            .collect();
        let _ = answer.send(Ok(Replayed {
            fingerprints: steps.map(|i| Self::fingerprint(script_token(i))).collect(),
            drawn,
            draw_distances,
            profile: Self::scripted_profile(),
        }));
        Ok(receiver)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sharemesh_protocol::Sampling;

    fn request(engine: &ScriptedEngine, resume: Vec<u32>) -> GenerateRequest {
        GenerateRequest {
            model: engine.models()[0].id,
            prompt: Prompt::Text("hello there".into()),
            sampling: Sampling {
                max_tokens: 12,
                ..Sampling::default()
            },
            resume,
            ignore_eos: false,
            interruptible: false,
            prefix_salt: [0; 32],
        }
    }

    async fn collect(engine: &ScriptedEngine, request: GenerateRequest) -> Generation {
        let mut events = engine.submit(request).unwrap();
        loop {
            match events.recv().await.unwrap() {
                EngineEvent::Finished(generation) => return generation,
                EngineEvent::Failed(err) => panic!("{err}"),
                _ => {}
            }
        }
    }

    #[tokio::test]
    async fn a_resumed_job_continues_exactly() {
        let engine = ScriptedEngine::new(vec![ScriptedEngine::model("m")], Script::default());
        let whole = collect(&engine, request(&engine, vec![])).await;
        assert_eq!(whole.token_ids.len(), 12);
        assert_eq!(whole.finish, FinishReason::Length);
        assert_eq!(whole.prompt_tokens, 3);
        let resumed = collect(&engine, request(&engine, whole.token_ids[..5].to_vec())).await;
        assert_eq!(resumed.token_ids, whole.token_ids);
        assert_eq!(resumed.generated_tokens, 7);
        let (ids, text) = engine.expected(&request(&engine, vec![]));
        assert_eq!(ids, whole.token_ids);
        assert_eq!(text, whole.text);
    }

    #[tokio::test]
    async fn refuses_unknown_models_and_a_full_queue() {
        let script = Script {
            queue_capacity: 1,
            token_delay: Duration::from_millis(50),
            ..Script::default()
        };
        let engine = ScriptedEngine::new(vec![ScriptedEngine::model("m")], script);
        let mut other = request(&engine, vec![]);
        other.model = ScriptedEngine::model("other").id;
        assert!(matches!(
            engine.submit(other),
            Err(EngineError::UnknownModel(_))
        ));
        let _running = engine.submit(request(&engine, vec![])).unwrap();
        tokio::task::yield_now().await;
        let _waiting = engine.submit(request(&engine, vec![])).unwrap();
        assert!(matches!(
            engine.submit(request(&engine, vec![])),
            Err(EngineError::Busy(1))
        ));
    }
}
