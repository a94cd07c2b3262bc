//! The engine: loads GGUF models with candle and generates tokens, streaming each one
//! as it is produced. It runs on its own thread behind a bounded request channel, so
//! callers never block the async runtime and continuous batching can replace the
//! one-job-at-a-time loop later without changing them.
//!
//! Exact resume: a resumed job continues bit for bit as the uninterrupted run. On
//! sharemesh's batch-invariant kernels (llama, qwen2, gemma3 on CPU) the delivered tokens are simply
//! prefilled with the prompt; on candle's backends they are replayed through the
//! one-token decode path, so the KV cache matches what decoding built (SPEC.md §7).

mod batch;
pub mod catalog;
#[cfg(feature = "adversary")]
pub mod cheat;
pub mod check;
mod embedding;
mod fair;
mod generate;
mod kernel_file;
mod paged;
mod prefix;
pub mod progress;
mod redraw;
pub mod sampler;
pub mod scripted;
mod seam;
pub mod weights;

/// The vocabulary side (tokenizers, chat templates, token text), from
/// `sharemesh-tokenizer`, which the gateway uses without the engine.
pub mod tokenizer {
    pub use sharemesh_tokenizer::{GgufTokenizer, StreamDecoder, Vocabulary};
}
mod worker;

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::time::Instant;

pub use sharemesh_protocol::commitment::{ReplayRequest, ReplayResult as Replayed};
use sharemesh_protocol::{
    ExecutionProfile, ModelDescriptor, ModelId, Prompt, Sampling, StepFingerprint,
};

/// Where a model runs (candle's device), so callers need not depend on candle.
pub use candle_core::Device;
pub use generate::{GenerateRequest, Generation, TokenEvent};
pub use seam::{BatchCapacity, EngineEvent, ReplayAnswer, TokenEngine, EVENT_BUFFER};
pub use sharemesh_kernels::llama::{BatchEntry, KvPool, SequenceCache, BLOCK_POSITIONS};
use sharemesh_tokenizer::{TokenizerError, Vocabulary};
use weights::Weights;
pub use worker::{BatchSettings, Engine, DEFAULT_KV_MEMORY_BYTES, DEFAULT_MAX_BATCH};

impl From<TokenizerError> for EngineError {
    fn from(err: TokenizerError) -> Self {
        match err {
            TokenizerError::Header(e) => EngineError::BadModel(e.to_string()),
            TokenizerError::BadModel(m) => EngineError::BadModel(m),
            TokenizerError::Unsupported(m) => EngineError::Unsupported(m),
            TokenizerError::BadRequest(m) => EngineError::BadRequest(m),
            TokenizerError::Tokenizer(m) => EngineError::Tokenizer(m),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("model file problem: {0}")]
    BadModel(String),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("I/O: {0}")]
    Io(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("prompt is {prompt_tokens} tokens, but the model's context is {context_length}")]
    ContextTooLong {
        prompt_tokens: usize,
        context_length: usize,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("inference failed: {0}")]
    Inference(String),
    #[error("model {0} is not loaded on this node")]
    UnknownModel(ModelId),
    #[error("the engine queue is full ({0} waiting)")]
    Busy(usize),
    #[error("the engine has stopped")]
    Stopped,
    #[error("over capacity: {0}")]
    OverCapacity(String),
}

/// The candle profile's arithmetic version: candle's release (0.11), then the revision
/// of sharemesh's own candle graphs (1: the paged graph, `paged/`, replaced
/// candle-transformers' llama/qwen2/qwen3 and the single-job Gemma 3 graph).
pub const CANDLE_ARITHMETIC_VERSION: &str = "0.11.1";

/// Logit rows a replay computes per forward pass (bounds its memory: rows × vocab f32).
const REPLAY_ROWS: usize = 64;

/// A model ready to generate: weights (pristine, empty KV cache), tokenizer, template.
pub struct LoadedModel {
    pub descriptor: ModelDescriptor,
    weights: Weights,
    /// Tokenizer and chat template (what a buyer counts with too).
    pub vocabulary: Vocabulary,
    /// The GGUF file it was loaded from.
    pub path: std::path::PathBuf,
    device: Device,
    pub load_seconds: f64,
    /// Adversary kit: how this engine cheats (`Cheat::None` unless a test says).
    #[cfg(feature = "adversary")]
    pub cheat: cheat::Cheat,
    /// Jobs generated so far (camouflage counts them).
    #[cfg(feature = "adversary")]
    jobs_run: u32,
    /// The vocabulary's constrained-decoding engine, built on the first job that asks
    /// for an output format (or why it could not be).
    formats: std::sync::OnceLock<Result<sharemesh_constrain::FormatEnv, String>>,
}

/// The device to run on: the first CUDA GPU when built with `cuda` and one is present.
pub fn default_device() -> Device {
    #[cfg(feature = "cuda")]
    {
        match Device::new_cuda(0) {
            Ok(device) => return device,
            Err(err) => tracing::warn!(%err, "CUDA build but no usable GPU; serving on CPU"),
        }
    }
    Device::Cpu
}

/// Where an operator asks a model to run (`--device`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The first CUDA GPU when the build has CUDA and one is present, else the CPU.
    #[default]
    Auto,
    /// The CPU, even where a GPU is present (a CPU provider beside a GPU one).
    Cpu,
    /// The first CUDA GPU, or an error saying why there is none.
    Cuda,
}

/// A CUDA device's compute capability as a profile names it (`sm_90`); `None` off CUDA
/// (or where the driver will not say).
fn gpu_isa(device: &Device) -> Option<String> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        let (major, minor) = cuda.cuda_stream().context().compute_capability().ok()?;
        return Some(format!("sm_{major}{minor}"));
    }
    let _ = device;
    None
}

/// Why the device asked for cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("this build has no CUDA (build with `--features cuda`)")]
    NoCudaInBuild,
    #[error("no usable CUDA GPU: {0}")]
    NoGpu(String),
}

/// The device `choice` names.
pub fn device(choice: DeviceChoice) -> Result<Device, DeviceError> {
    match choice {
        DeviceChoice::Auto => Ok(default_device()),
        DeviceChoice::Cpu => Ok(Device::Cpu),
        #[cfg(feature = "cuda")]
        DeviceChoice::Cuda => Device::new_cuda(0).map_err(|e| DeviceError::NoGpu(e.to_string())),
        #[cfg(not(feature = "cuda"))]
        DeviceChoice::Cuda => Err(DeviceError::NoCudaInBuild),
    }
}

impl LoadedModel {
    /// Loads a GGUF file. `id` is its sha256 (the catalog computes and caches it);
    /// `name` its catalog name.
    pub fn load(path: &Path, id: ModelId, name: &str, device: Device) -> Result<Self, EngineError> {
        Self::load_showing(path, id, name, device, indicatif::ProgressBar::hidden())
    }

    /// [`Self::load`], moving `bar` along the file as its weights are read (its length
    /// is set to the file's size).
    pub fn load_showing(
        path: &Path,
        id: ModelId,
        name: &str,
        device: Device,
        bar: indicatif::ProgressBar,
    ) -> Result<Self, EngineError> {
        let started = Instant::now();
        let file = File::open(path)
            .map_err(|e| EngineError::Io(format!("opening {}: {e}", path.display())))?;
        if let Ok(meta) = file.metadata() {
            bar.set_length(meta.len());
        }
        let mut reader = bar.wrap_read(BufReader::new(file));
        let content = weights::read_content(&mut reader, path)?;
        let info = weights::info(&content)?;
        // The vocabulary from the header alone, as a buyer's gateway reads it.
        let header = File::open(path)
            .map_err(|e| EngineError::Io(format!("opening {}: {e}", path.display())))?;
        let vocabulary = Vocabulary::read(BufReader::new(header))?;
        let weights = Weights::load(
            content,
            &mut reader,
            &info.architecture,
            &device,
            path,
            &bar,
        )?;
        reader.progress.finish_and_clear();
        Ok(Self {
            descriptor: ModelDescriptor {
                id,
                name: name.to_owned(),
                architecture: info.architecture,
                quantization: info.quantization,
                context_length: info.context_length,
            },
            weights,
            vocabulary,
            path: path.to_owned(),
            device,
            load_seconds: started.elapsed().as_secs_f64(),
            #[cfg(feature = "adversary")]
            cheat: cheat::Cheat::None,
            #[cfg(feature = "adversary")]
            jobs_run: 0,
            formats: std::sync::OnceLock::new(),
        })
    }

    /// A guide for `format` over this model's vocabulary (`None` for free text).
    fn format_guide(
        &self,
        format: &sharemesh_protocol::OutputFormat,
    ) -> Result<Option<sharemesh_constrain::Guide>, EngineError> {
        if format.is_free() {
            return Ok(None);
        }
        let env = self.formats.get_or_init(|| {
            sharemesh_constrain::FormatEnv::new(&self.vocabulary.tokenizer)
                .map_err(|e| e.to_string())
        });
        match env {
            Ok(env) => env
                .guide(format)
                .map_err(|e| EngineError::BadRequest(format!("response format: {e}"))),
            Err(why) => Err(EngineError::BadRequest(format!(
                "response format: this model cannot follow one: {why}"
            ))),
        }
    }

    /// Adversary kit: what the next job of this (cheating) engine does.
    #[cfg(feature = "adversary")]
    fn playing(&mut self, resumed: bool) -> cheat::Playing {
        let garbage = self.cheat.serves_garbage(self.jobs_run, resumed);
        self.jobs_run += 1;
        cheat::Playing {
            cheat: self.cheat,
            garbage,
        }
    }

    /// Adversary kit: runs only the first layers less `count` (kernels only).
    #[cfg(feature = "adversary")]
    pub fn truncate_layers(&mut self, count: usize) -> Result<(), EngineError> {
        match &mut self.weights {
            Weights::Kernels(m) => m.drop_last_layers(count),
            _ => Err(EngineError::Unsupported(
                "dropping layers needs the sharemesh kernels (on CPU)".into(),
            )),
        }
    }

    /// Runs this model behind serving work on the same cores (its kernel threads at
    /// the lowest priority, `sharemesh_kernels::priority`): for a model that only
    /// replays others' jobs, as a gateway's verifier. Refused on candle's paths, whose
    /// threads the process shares.
    pub fn run_in_background(&self) -> Result<(), EngineError> {
        match &self.weights {
            Weights::Kernels(kernels) => kernels
                .run_in_background()
                .map_err(|e| EngineError::Unsupported(format!("lowering its threads: {e}"))),
            Weights::Paged(_) | Weights::Phi3(_) => Err(EngineError::Unsupported(
                "candle's threads are the process's own: they keep their priority".into(),
            )),
        }
    }

    /// What this model's logits come from, as a job's `Accept` names it.
    pub fn profile(&self) -> ExecutionProfile {
        let device = match self.device.location() {
            candle_core::DeviceLocation::Cpu => "cpu",
            candle_core::DeviceLocation::Cuda { .. } => "cuda",
            candle_core::DeviceLocation::Metal { .. } => "metal",
        };
        let (engine, version, isa) = if matches!(self.weights, Weights::Kernels(_)) {
            (
                "sharemesh-kernels",
                sharemesh_kernels::ARITHMETIC_VERSION,
                sharemesh_kernels::dot::Isa::detect().name(),
            )
        } else {
            ("candle", CANDLE_ARITHMETIC_VERSION, std::env::consts::ARCH)
        };
        // On a GPU the arithmetic's instruction set is the GPU's, not the host's.
        let isa = gpu_isa(&self.device).unwrap_or_else(|| isa.into());
        ExecutionProfile {
            engine: engine.into(),
            version: version.into(),
            isa,
            quantization: self.descriptor.quantization.clone(),
            device: device.into(),
        }
    }

    /// Replays a delivered job teacher-forced and fingerprints its steps. On the
    /// kernels the whole transcript runs as batches (batch invariance makes each row
    /// the bits decoding gave); elsewhere the prompt is prefilled and each token
    /// decoded, as generation does.
    pub fn replay(&mut self, request: &ReplayRequest) -> Result<Replayed, EngineError> {
        self.bind_device_to_thread()?;
        let prompt = self.prompt_tokens(&request.prompt)?;
        let vocab = self.vocabulary.tokenizer.vocab_size() as u32;
        let outputs = &request.outputs;
        if prompt.is_empty() || outputs.is_empty() || request.from >= outputs.len() {
            return Err(EngineError::BadRequest("nothing to replay".into()));
        }
        if prompt.len() + outputs.len() > self.descriptor.context_length as usize {
            return Err(EngineError::ContextTooLong {
                prompt_tokens: prompt.len() + outputs.len(),
                context_length: self.descriptor.context_length as usize,
            });
        }
        if let Some(bad) = outputs.iter().find(|&&id| id >= vocab) {
            return Err(EngineError::BadRequest(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        let mut fingerprints = Vec::with_capacity(outputs.len() - request.from);
        let mut drawn = Vec::with_capacity(outputs.len() - request.from);
        let mut draw_distances = Vec::with_capacity(outputs.len() - request.from);
        let mut redraw =
            redraw::Redraw::new(self, &prompt, &request.sampling, &outputs[..request.from])?;
        let mut score = |logits: &[f32], step: usize| -> Result<(), EngineError> {
            fingerprints.push(StepFingerprint::from_logits(logits));
            let (token, distance) = redraw.step(logits, outputs[step])?;
            drawn.push(token);
            draw_distances.push(distance);
            Ok(())
        };
        if self.weights.batch_invariant() {
            // Step i's logits follow prompt ‖ outputs[..i]: the rows at positions
            // prompt.len() - 1 + i of that sequence.
            let mut sequence = prompt.clone();
            sequence.extend_from_slice(&outputs[..outputs.len() - 1]);
            let first = prompt.len() - 1 + request.from;
            let width = vocab as usize;
            self.weights.reset();
            let mut position = 0;
            while position < sequence.len() {
                let start_row = position.max(first);
                let end = (start_row + REPLAY_ROWS).min(sequence.len());
                let rows = end - start_row;
                let logits = self
                    .weights
                    .forward_rows(&sequence[position..end], position, rows)?;
                for (row, step_logits) in logits.chunks_exact(width).enumerate() {
                    score(step_logits, start_row + row + 1 - prompt.len())?;
                }
                position = end;
            }
        } else {
            let (mut logits, _) = self.weights.prefill(&prompt, &self.device)?;
            let mut position = prompt.len();
            for (i, &token) in outputs.iter().enumerate() {
                if i >= request.from {
                    score(&logits, i)?;
                }
                if i + 1 < outputs.len() {
                    logits = self.weights.forward(&[token], position, &self.device)?;
                    position += 1;
                }
            }
        }
        Ok(Replayed {
            fingerprints,
            drawn,
            draw_distances,
            profile: self.profile(),
        })
    }

    /// Turns a prompt into token ids (chat prompts through the model's template).
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        // The same function a buyer counts with.
        Ok(self.vocabulary.prompt_tokens(prompt)?)
    }

    /// The next-token logits after `tokens`, fed from an empty cache in chunks of
    /// `chunk` tokens (1 = the one-token decode path). Verification compares these;
    /// with batch-invariant weights every chunk size gives the same bits.
    pub fn logits_after(&mut self, tokens: &[u32], chunk: usize) -> Result<Vec<f32>, EngineError> {
        self.bind_device_to_thread()?;
        let vocab = self.vocabulary.tokenizer.vocab_size() as u32;
        if tokens.is_empty() || chunk == 0 {
            return Err(EngineError::BadRequest("no tokens to score".into()));
        }
        if let Some(bad) = tokens.iter().find(|&&id| id >= vocab) {
            return Err(EngineError::BadRequest(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        self.weights.reset();
        let mut logits = Vec::new();
        for (i, piece) in tokens.chunks(chunk).enumerate() {
            logits = self.weights.forward(piece, i * chunk, &self.device)?;
        }
        Ok(logits)
    }

    /// Aggregate tokens per second of `streams` sequences decoding together (each first
    /// prefilled with `prompt`), over `steps` batched decode steps: what a provider
    /// serving that many jobs at once makes. `None` for a model that does not batch.
    pub fn measure_batch(
        &self,
        prompt: &[u32],
        streams: usize,
        steps: usize,
    ) -> Result<Option<f64>, EngineError> {
        let Some(model) = self.batch_model() else {
            return Ok(None);
        };
        if prompt.is_empty() || streams == 0 || steps == 0 {
            return Err(EngineError::BadRequest("nothing to measure".into()));
        }
        self.bind_device_to_thread()?;
        let blocks = streams.saturating_mul(KvPool::blocks_for(prompt.len() + steps));
        let pool = model.kv_pool(blocks);
        let mut caches: Vec<SequenceCache> = (0..streams).map(|_| pool.new_sequence()).collect();
        for cache in &mut caches {
            let entry = BatchEntry {
                position: cache.positions(),
                cache,
                tokens: prompt,
            };
            model
                .forward_batch(&mut [entry])
                .map_err(EngineError::Inference)?;
        }
        let started = std::time::Instant::now();
        for step in 0..steps {
            let token = [prompt[step % prompt.len()]];
            let mut entries: Vec<BatchEntry<'_>> = caches
                .iter_mut()
                .map(|cache| BatchEntry {
                    position: cache.positions(),
                    cache,
                    tokens: &token,
                })
                .collect();
            model
                .forward_batch(&mut entries)
                .map_err(EngineError::Inference)?;
        }
        let seconds = started.elapsed().as_secs_f64().max(1e-9);
        Ok(Some((steps * streams) as f64 / seconds))
    }

    /// Whether resume prefills delivered tokens (fast) rather than replaying them.
    pub fn batch_invariant(&self) -> bool {
        self.weights.batch_invariant()
    }

    /// The batch-invariant kernels' model, for decoding several sequences in one batch
    /// (`Llama::forward_batch`); `None` on candle's backends.
    pub fn kernel_llama(&self) -> Option<&sharemesh_kernels::llama::Llama> {
        self.weights.kernel_llama()
    }

    /// The model as the engine's continuous batching drives it: the kernels', or the
    /// paged candle graph (llama, qwen2, qwen3 on any device); `None`: one job at a time.
    pub(crate) fn batch_model(&self) -> Option<batch::BatchModel<'_>> {
        self.weights.batch_model()
    }

    /// Whether jobs on it run in the engine's continuous batch.
    pub fn batches(&self) -> bool {
        self.batch_model().is_some()
    }

    /// Where and on what it runs, for reports: `cpu/sharemesh-kernels`, `cpu/candle`,
    /// `cuda:0/candle`.
    pub fn backend(&self) -> String {
        let device = match self.device.location() {
            candle_core::DeviceLocation::Cpu => "cpu".to_owned(),
            candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
            candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
        };
        let engine = if matches!(self.weights, weights::Weights::Kernels(_)) {
            "sharemesh-kernels"
        } else {
            "candle"
        };
        format!("{device}/{engine}")
    }

    /// Runs one job to the end, calling `on_token` for each new token; `on_token`
    /// returning `false` cancels the job before the next token is computed.
    pub fn generate(
        &mut self,
        request: &GenerateRequest,
        on_token: impl FnMut(&TokenEvent) -> bool,
    ) -> Result<Generation, EngineError> {
        self.bind_device_to_thread()?;
        generate::run(self, request, on_token)
    }

    /// A CUDA context is current per thread, and the engine thread is not the one that
    /// loaded the model: without this every job there failed with "invalid device
    /// context" (seen on an H200). Cheap when already bound.
    fn bind_device_to_thread(&self) -> Result<(), EngineError> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(cuda) = &self.device {
            cuda.cuda_stream().context().bind_to_thread().map_err(|e| {
                EngineError::Inference(format!(
                    "binding the CUDA context to the engine thread: {e}"
                ))
            })?;
        }
        Ok(())
    }
}

/// Convenience for one-shot local use: loads, generates, returns.
pub fn oneshot_generate(
    model: &mut LoadedModel,
    prompt: Prompt,
    sampling: Sampling,
) -> Result<Generation, EngineError> {
    model.generate(
        &GenerateRequest {
            model: model.descriptor.id,
            prompt,
            sampling,
            resume: Vec::new(),
            ignore_eos: false,
            interruptible: false,
            prefix_salt: [0; 32],
        },
        |_| true,
    )
}

/// Sets candle's thread count. candle sizes its global pools once, from
/// `CANDLE_NUM_THREADS`/`RAYON_NUM_THREADS`, at the first tensor operation, so this
/// must run before any model is loaded; later calls have no effect.
pub fn set_threads(threads: usize) {
    let threads = threads.max(1).to_string();
    std::env::set_var("CANDLE_NUM_THREADS", &threads);
    std::env::set_var("RAYON_NUM_THREADS", &threads);
}
