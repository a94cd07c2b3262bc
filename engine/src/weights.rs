//! GGUF loading and the per-architecture forward pass. Each architecture plugs in as
//! one enum arm; the generation loop only sees `forward(tokens, position) -> logits`.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_phi3;
use sharemesh_kernels::llama;

use super::kernel_file::{kernel_config, load_kernels};
use super::paged::PagedLlama;
use super::EngineError;

/// Loaded weights for one architecture, with the KV cache of the job in progress.
pub enum Weights {
    /// sharemesh's own batch-invariant kernels (llama, qwen2, qwen3, phi3 and gemma3 on
    /// CPU; see `sharemesh-kernels`).
    Kernels(Box<KernelModel>),
    /// llama, qwen2, qwen3, gemma2 and gemma3 on candle's tensors with a paged KV cache
    /// (the engine batches it as it batches the kernels): CUDA, `SHAREMESH_KERNELS=candle`.
    Paged(Box<PagedLlama>),
    Phi3(Box<quantized_phi3::ModelWeights>),
}

/// The kernels' model and the tokens its KV cache holds, so the next job can reuse a
/// shared prefix (the previous turn of a chat, or a failover standby's warm-up).
pub struct KernelModel {
    model: llama::Llama,
    cached: Vec<u32>,
}

impl KernelModel {
    pub fn run_in_background(&self) -> std::io::Result<()> {
        self.model.run_in_background()
    }

    /// Adversary kit: see `Llama::drop_last_layers`.
    #[cfg(feature = "adversary")]
    pub fn drop_last_layers(&mut self, count: usize) -> Result<(), EngineError> {
        self.cached.clear();
        self.model
            .drop_last_layers(count)
            .map_err(|e| EngineError::BadRequest(e.to_string()))
    }
}

/// GGUF general.file_type → the quantization name operators know.
pub fn file_type_name(file_type: u32) -> &'static str {
    match file_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => "unknown",
    }
}

/// What the GGUF header says about a model, read without loading tensors.
#[derive(Clone, Debug)]
pub struct GgufInfo {
    pub architecture: String,
    pub quantization: String,
    pub context_length: u32,
    pub name: Option<String>,
}

pub fn read_content<R: Read + Seek>(
    reader: &mut R,
    path: &Path,
) -> Result<gguf_file::Content, EngineError> {
    gguf_file::Content::read(reader).map_err(|e| {
        EngineError::BadModel(format!(
            "{} is not a readable GGUF file ({e}); it may be truncated or corrupt — fetch it again",
            path.display()
        ))
    })
}

pub fn info(ct: &gguf_file::Content) -> Result<GgufInfo, EngineError> {
    let architecture = ct
        .metadata
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .cloned()
        .ok_or_else(|| {
            EngineError::BadModel("GGUF metadata lacks `general.architecture`".into())
        })?;
    let quantization = ct
        .metadata
        .get("general.file_type")
        .and_then(|v| v.to_u32().ok())
        .map_or("unknown", file_type_name)
        .to_owned();
    let context_length = ct
        .metadata
        .get(&format!("{architecture}.context_length"))
        .and_then(|v| v.to_u32().ok())
        .unwrap_or(2048);
    let name = ct
        .metadata
        .get("general.name")
        .and_then(|v| v.to_string().ok())
        .cloned();
    Ok(GgufInfo {
        architecture,
        quantization,
        context_length,
        name,
    })
}

pub fn read_info(path: &Path) -> Result<GgufInfo, EngineError> {
    let file = File::open(path)
        .map_err(|e| EngineError::Io(format!("opening {}: {e}", path.display())))?;
    let mut reader = BufReader::new(file);
    info(&read_content(&mut reader, path)?)
}

impl Weights {
    pub fn load<R: Read + Seek>(
        ct: gguf_file::Content,
        reader: &mut R,
        architecture: &str,
        device: &Device,
        path: &Path,
        progress: &indicatif::ProgressBar,
    ) -> Result<Self, EngineError> {
        let corrupt = |e: candle_core::Error| {
            EngineError::BadModel(format!(
                "loading tensors of {} failed ({e}); the file may be truncated or corrupt",
                path.display()
            ))
        };
        let rope_scale = refused_by_either(&ct, architecture)?;
        if KERNEL_ARCHITECTURES.contains(&architecture) && device.is_cpu() && kernels_enabled() {
            apply_isa_ceiling()?;
            match load_kernels(&ct, reader, architecture, rope_scale, path, progress) {
                Ok(model) => {
                    let cached = Vec::new();
                    return Ok(Weights::Kernels(Box::new(KernelModel { model, cached })));
                }
                // Formats or shapes the kernels do not cover yet: candle serves them.
                Err(EngineError::Unsupported(reason)) => {
                    tracing::info!(%reason, "sharemesh kernels cannot run this file; using candle");
                }
                Err(other) => return Err(other),
            }
        }
        if let Some(missing) = candle_cannot_run(&ct, architecture, rope_scale) {
            return Err(EngineError::Unsupported(only_the_kernels_run(&missing)));
        }
        match architecture {
            "llama" | "qwen2" | "qwen3" | "gemma2" | "gemma3" => {
                let config = kernel_config(&ct, architecture, rope_scale)?;
                if !PagedLlama::runs(&config) {
                    return Err(EngineError::Unsupported(only_the_kernels_run(
                        "rope on part of each head",
                    )));
                }
                PagedLlama::from_gguf(&ct, reader, config, device)
                    .map(|m| Weights::Paged(Box::new(m)))
                    .map_err(corrupt)
            }
            "phi3" => quantized_phi3::ModelWeights::from_gguf(false, ct, reader, device)
                .map(|m| Weights::Phi3(Box::new(m)))
                .map_err(corrupt),
            other => Err(EngineError::Unsupported(unsupported_architecture(other))),
        }
    }

    /// Whether a batch prefill gives the same bits as one-token decoding, so a resume
    /// may prefill the delivered tokens instead of replaying them (SPEC.md §7).
    pub fn batch_invariant(&self) -> bool {
        matches!(self, Weights::Kernels(_))
    }

    /// The kernels' model, which decodes several sequences in one batch with each
    /// sequence's own bits (`None` on candle's graphs, which promise no such thing).
    pub fn kernel_llama(&self) -> Option<&llama::Llama> {
        match self {
            Weights::Kernels(m) => Some(&m.model),
            _ => None,
        }
    }

    /// The model as the engine's continuous batching drives it (`None`: one job at a
    /// time).
    pub(crate) fn batch_model(&self) -> Option<crate::batch::BatchModel<'_>> {
        use crate::batch::BatchModel;
        match self {
            Weights::Kernels(m) => Some(BatchModel::Kernels(&m.model)),
            Weights::Paged(m) => Some(BatchModel::Paged(m)),
            _ => None,
        }
    }

    /// Runs `tokens` from position 0, reusing the longest prefix the cache already holds
    /// where that is exact (batch-invariant kernels); returns the last logits and how
    /// many positions were reused.
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        device: &Device,
    ) -> Result<(Vec<f32>, usize), EngineError> {
        let reused = match self {
            Weights::Kernels(m) => {
                // At least one token must run to produce logits.
                let shared = m
                    .cached
                    .iter()
                    .zip(tokens)
                    .take_while(|(a, b)| a == b)
                    .count();
                let reused = shared.min(tokens.len().saturating_sub(1));
                m.model.truncate(reused);
                m.cached.truncate(reused);
                reused
            }
            _ => {
                self.reset();
                0
            }
        };
        let logits = self.forward(&tokens[reused..], reused, device)?;
        Ok((logits, reused))
    }

    /// Runs `tokens` at `position` on the batch-invariant kernels and returns the
    /// logits of the last `rows` tokens (see `Llama::forward_rows`).
    pub fn forward_rows(
        &mut self,
        tokens: &[u32],
        position: usize,
        rows: usize,
    ) -> Result<Vec<f32>, EngineError> {
        if let Weights::Paged(m) = self {
            return m
                .forward(tokens, position, rows)
                .map_err(|e| EngineError::Inference(e.to_string()));
        }
        let Weights::Kernels(m) = self else {
            return Err(EngineError::Unsupported(
                "logits of many positions need the sharemesh kernels or the paged graph".into(),
            ));
        };
        let logits = m.model.forward_rows(tokens, position, rows).map_err(|e| {
            m.cached.clear();
            EngineError::Inference(e.to_string())
        })?;
        m.cached.truncate(position);
        m.cached.extend_from_slice(tokens);
        Ok(logits)
    }

    /// Empties the KV cache before a new job.
    pub fn reset(&mut self) {
        match self {
            Weights::Kernels(m) => {
                m.model.reset();
                m.cached.clear();
            }
            Weights::Paged(m) => m.reset(),
            // Its cache starts over at every run from position 0 (all a reset is for).
            Weights::Phi3(_) => {}
        }
    }

    /// Runs `tokens` at `position` through the model (extending the KV cache) and
    /// returns the logits of the last position.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        position: usize,
        device: &Device,
    ) -> Result<Vec<f32>, EngineError> {
        if let Weights::Kernels(m) = self {
            let logits = m.model.forward(tokens, position).map_err(|e| {
                m.cached.clear();
                EngineError::Inference(e.to_string())
            })?;
            m.cached.truncate(position);
            m.cached.extend_from_slice(tokens);
            return Ok(logits);
        }
        if let Weights::Paged(m) = self {
            return m
                .forward(tokens, position, 1)
                .map_err(|e| EngineError::Inference(e.to_string()));
        }
        let mut run = || -> candle_core::Result<Vec<f32>> {
            let input = Tensor::new(tokens, device)?.unsqueeze(0)?;
            let logits = match self {
                Weights::Phi3(m) => m.forward(&input, position)?,
                Weights::Kernels(_) | Weights::Paged(_) => unreachable!("answered above"),
            };
            logits
                .squeeze(0)?
                .to_dtype(candle_core::DType::F32)?
                .to_vec1::<f32>()
        };
        run().map_err(|e| EngineError::Inference(e.to_string()))
    }
}

/// `SHAREMESH_KERNELS=candle` serves llama through candle instead (for comparisons).
/// Architectures the sharemesh kernels run (on the CPU).
pub(crate) const KERNEL_ARCHITECTURES: [&str; 6] =
    ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"];
/// Architectures with a candle graph here (`Weights::load`'s arms), for CUDA or
/// `SHAREMESH_KERNELS=candle`.
pub(crate) const CANDLE_ARCHITECTURES: [&str; 6] =
    ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"];

pub(crate) fn unsupported_architecture(architecture: &str) -> String {
    format!("architecture `{architecture}` (supported: llama, qwen2, qwen3, phi3, gemma2, gemma3)")
}

pub(crate) fn only_the_kernels_run(missing: &str) -> String {
    format!(
        "this file needs {missing}, which only the sharemesh kernels run (CPU; quantized or \
         F16/F32 weights they cover), and they could not load it"
    )
}

/// What the header alone refuses before either path is tried — a rope scaling neither
/// runs, LongRoPE factors — else the rotary scale both apply.
pub(crate) fn refused_by_either(
    ct: &gguf_file::Content,
    architecture: &str,
) -> Result<f32, EngineError> {
    let rope_scale = rope_scale(ct, architecture)?;
    if let Some(factors) = ["rope_factors_long.weight", "rope_factors_short.weight"]
        .into_iter()
        .find(|name| ct.tensor_infos.contains_key(*name))
    {
        return Err(EngineError::Unsupported(format!(
            "LongRoPE frequency factors (`{factors}`, Phi-3's 128k-context files), which \
             neither the sharemesh kernels nor candle read"
        )));
    }
    Ok(rope_scale)
}

/// `SHAREMESH_MAX_ISA=avx2` holds the kernels to their AVX2 builds on an AVX-512 CPU
/// (`sharemesh_kernels::hold_to_avx2`: benchmarks of what an AVX2-only CPU runs); unset
/// or `avx512`, the fastest the CPU has.
pub(crate) fn apply_isa_ceiling() -> Result<(), EngineError> {
    match std::env::var("SHAREMESH_MAX_ISA").as_deref() {
        Err(_) | Ok("" | "avx512") => Ok(()),
        Ok("avx2") => {
            sharemesh_kernels::hold_to_avx2();
            Ok(())
        }
        Ok(other) => Err(EngineError::BadRequest(format!(
            "SHAREMESH_MAX_ISA={other}: expected avx2 or avx512"
        ))),
    }
}

pub(crate) fn kernels_enabled() -> bool {
    std::env::var("SHAREMESH_KERNELS").map_or(true, |v| v != "candle")
}

/// The factor every rotary angle is multiplied by for the file's
/// `<arch>.rope.scaling.type`: 1 for none (or no key), `1 / rope.scaling.factor` for
/// `linear` (llama.cpp's `freq_scale`); any other kind (`yarn`, `longrope`) is refused
/// by name — a model that ignored it would answer wrongly with no warning.
pub fn rope_scale(ct: &gguf_file::Content, architecture: &str) -> Result<f32, EngineError> {
    let key = |name: &str| format!("{architecture}.rope.scaling.{name}");
    let kind = match ct.metadata.get(&key("type")) {
        None => return Ok(1.0),
        Some(value) => value
            .to_string()
            .map_err(|e| EngineError::BadModel(format!("`{}`: {e}", key("type"))))?
            .clone(),
    };
    match kind.as_str() {
        "none" => Ok(1.0),
        "linear" => {
            let factor = ct
                .metadata
                .get(&key("factor"))
                .and_then(|v| v.to_f32().ok())
                .ok_or_else(|| {
                    EngineError::BadModel(format!(
                        "linear rope scaling without a number at `{}`",
                        key("factor")
                    ))
                })?;
            if !(factor.is_finite() && factor >= 1.0) {
                return Err(EngineError::BadModel(format!(
                    "`{}` is {factor}: a linear rope scaling factor must be at least 1",
                    key("factor")
                )));
            }
            Ok(1.0 / factor)
        }
        other => Err(EngineError::Unsupported(format!(
            "rope scaling `{other}` (`{}`; supported: none, linear)",
            key("type")
        ))),
    }
}

/// Why candle's graphs cannot run this file right, if they cannot: they read neither
/// linear rope scaling nor Llama 3.1's `rope_freqs.weight`, and candle's phi3 turns
/// every head whole at base 10,000 whatever the file says; each would answer wrongly
/// with no warning.
pub(crate) fn candle_cannot_run(
    ct: &gguf_file::Content,
    architecture: &str,
    rope_scale: f32,
) -> Option<String> {
    // The paged graph reads both rope scalings and Gemma 2's soft caps (`crate::paged`).
    if matches!(
        architecture,
        "llama" | "qwen2" | "qwen3" | "gemma2" | "gemma3"
    ) {
        return None;
    }
    if rope_scale != 1.0 {
        return Some("linear rope scaling".into());
    }
    if architecture == "phi3" {
        let number = |key: &str| {
            let value = ct.metadata.get(&format!("phi3.{key}"))?;
            value
                .to_f32()
                .ok()
                .or_else(|| value.to_u32().ok().map(|v| v as f32))
        };
        let heads = number("attention.head_count").unwrap_or(1.0).max(1.0);
        let head_dim = number("embedding_length").unwrap_or(0.0) / heads;
        if number("rope.freq_base").is_some_and(|base| base != 10_000.0) {
            return Some("a rope base other than 10,000 (phi3)".into());
        }
        if number("rope.dimension_count").is_some_and(|dims| dims != head_dim) {
            return Some("rope on part of each head (phi3)".into());
        }
    }
    ct.tensor_infos
        .contains_key("rope_freqs.weight")
        .then(|| "rope frequency factors (`rope_freqs.weight`)".into())
}

/// Testnet adversary kit: writes `src` to `dst` with every matrix requantized to Q8_0
/// (norms and vectors as they were) and `general.file_type` set to match — another
/// file of the same network and vocabulary, for `provide --adversary substitute:PATH`
/// and the tests that show verification catches any file swap.
pub fn requantize_to_q8_0(src: &Path, dst: &Path) -> Result<(), EngineError> {
    requantize(src, dst, 7, |_, _| GgmlDType::Q8_0)
}

/// Writes `src` to `dst` with each matrix (a 2-D tensor) requantized to the block type
/// `choose(name, dims)` picks (dims outermost first; the last must be a multiple of
/// the type's block) and `general.file_type` set to `file_type`; vectors are kept.
/// Tests use it to make files of block types no catalog model has.
pub fn requantize(
    src: &Path,
    dst: &Path,
    file_type: u32,
    mut choose: impl FnMut(&str, &[usize]) -> GgmlDType,
) -> Result<(), EngineError> {
    let io = |e: std::io::Error| EngineError::Io(e.to_string());
    let bad = |e: candle_core::Error| EngineError::BadModel(e.to_string());
    let mut reader = BufReader::new(File::open(src).map_err(io)?);
    let content = read_content(&mut reader, src)?;
    let mut tensors = Vec::new();
    for name in content.tensor_infos.keys() {
        let tensor = content
            .tensor(&mut reader, name, &Device::Cpu)
            .map_err(bad)?;
        let requantized = if tensor.shape().dims().len() == 2 {
            let block_type = choose(name, tensor.shape().dims());
            let values = tensor.dequantize(&Device::Cpu).map_err(bad)?;
            candle_core::quantized::QTensor::quantize(&values, block_type)
                .map_err(|e| EngineError::BadModel(format!("{name} as {block_type:?}: {e}")))?
        } else {
            tensor
        };
        tensors.push((name.clone(), requantized));
    }
    let mut metadata = content.metadata.clone();
    metadata.insert("general.file_type".into(), gguf_file::Value::U32(file_type));
    let metadata: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = std::io::BufWriter::new(File::create(dst).map_err(io)?);
    gguf_file::write(&mut out, &metadata, &tensors).map_err(bad)?;
    std::io::Write::flush(&mut out).map_err(io)
}
