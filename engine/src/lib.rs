//! The engine: loads GGUF models with candle and generates tokens, streaming each one
//! as it is produced. It runs on its own thread behind a bounded request channel, so
//! callers never block the async runtime and continuous batching can replace the
//! one-job-at-a-time loop later without changing them.
//!
//! Exact resume: a resumed job continues bit for bit as the uninterrupted run. On
//! sharemesh's batch-invariant kernels (llama on CPU) the delivered tokens are simply
//! prefilled with the prompt; on candle's backends they are replayed through the
//! one-token decode path, so the KV cache matches what decoding built (SPEC.md §7).

pub mod catalog;
mod gemma3;
mod generate;
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

use sharemesh_protocol::{ModelDescriptor, ModelId, Prompt, Sampling};

/// Where a model runs (candle's device), so callers need not depend on candle.
pub use candle_core::Device;
pub use generate::{GenerateRequest, Generation, TokenEvent};
pub use seam::{EngineEvent, TokenEngine, EVENT_BUFFER};
use sharemesh_tokenizer::{TokenizerError, Vocabulary};
use weights::Weights;
pub use worker::Engine;

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
}

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

impl LoadedModel {
    /// Loads a GGUF file. `id` is its sha256 (the catalog computes and caches it);
    /// `name` its catalog name.
    pub fn load(path: &Path, id: ModelId, name: &str, device: Device) -> Result<Self, EngineError> {
        let started = Instant::now();
        let file = File::open(path)
            .map_err(|e| EngineError::Io(format!("opening {}: {e}", path.display())))?;
        let mut reader = BufReader::new(file);
        let content = weights::read_content(&mut reader, path)?;
        let info = weights::info(&content)?;
        // The vocabulary from the header alone, as a buyer's gateway reads it.
        let header = File::open(path)
            .map_err(|e| EngineError::Io(format!("opening {}: {e}", path.display())))?;
        let vocabulary = Vocabulary::read(BufReader::new(header))?;
        let weights = Weights::load(content, &mut reader, &info.architecture, &device, path)?;
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

    /// Whether resume prefills delivered tokens (fast) rather than replaying them.
    pub fn batch_invariant(&self) -> bool {
        self.weights.batch_invariant()
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
