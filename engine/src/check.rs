//! Whether a GGUF file will serve here, and why not, from its header alone (no weight is
//! read): `sharemesh models check FILE`. It asks the questions loading asks, through the
//! same functions (`weights::refused_by_either`, `kernel_file::kernel_config`, the
//! tokenizer's own reader), so the two cannot disagree on a refusal the header decides;
//! what only the weights show (a truncated tensor, a shape the kernels cannot tile) is
//! found when the file loads.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType};
use serde::Serialize;
use sharemesh_kernels::llama::{KvPool, RawFormat, BLOCK_POSITIONS};
use sharemesh_protocol::{ChatMessage, Role};
use sharemesh_tokenizer::Vocabulary;

use crate::kernel_file::{kernel_config, kernel_format};
use crate::weights::{self, CANDLE_ARCHITECTURES, KERNEL_ARCHITECTURES};
use crate::EngineError;

/// What a file's header says about serving it here.
#[derive(Clone, Debug, Serialize)]
pub struct FileCheck {
    pub file_bytes: u64,
    pub architecture: String,
    /// `general.file_type` as operators know it (`Q4_K_M`).
    pub quantization: String,
    pub name: Option<String>,
    pub context_length: u32,
    /// Tensors by storage type, most bytes first.
    pub tensor_types: Vec<TensorTypeCount>,
    /// The tokenizer, when it loads.
    pub tokenizer: Option<TokenizerSummary>,
    /// Where it would run, when it runs at all.
    pub runs_on: Option<Backend>,
    /// What the kernels could not take, where candle serves it instead.
    pub kernels_refused: Option<String>,
    /// Memory for the weights and the KV cache (the kernels' f16 cache; candle's is
    /// larger), when the header sizes them.
    pub memory: Option<MemoryNeed>,
    /// Each reason it will not serve; empty when it will.
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TensorTypeCount {
    pub dtype: String,
    pub tensors: usize,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TokenizerSummary {
    /// `tokenizer.ggml.model` (`gpt2`, `llama`).
    pub model: String,
    /// `tokenizer.ggml.pre`, where the file names one.
    pub pre: Option<String>,
    pub tokens: usize,
    /// Whether chat prompts render through the file's own template (else the generic
    /// presentation).
    pub template_from_file: bool,
    /// Whether the template shows system messages (Gemma 2's refuses one, Phi-3's drops
    /// it): where it does not, they are merged into the next user turn, as llama.cpp does.
    pub system_role: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// The batch-invariant kernels: batching, exact replay and resume.
    Kernels,
    /// candle's graph: one job at a time, and no exact replay across batch sizes.
    Candle,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct MemoryNeed {
    /// The weights as the file stores them.
    pub weights_bytes: u64,
    pub kv_bytes_per_token: u64,
    /// The KV cache of one sequence at the full context.
    pub kv_bytes_at_context: u64,
}

impl FileCheck {
    pub fn will_serve(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks `path`; `Err` only when it is not a readable GGUF header.
pub fn check_file(path: &Path) -> Result<FileCheck, EngineError> {
    let open = || {
        File::open(path)
            .map(BufReader::new)
            .map_err(|e| EngineError::Io(format!("opening {}: {e}", path.display())))
    };
    let file_bytes = std::fs::metadata(path)
        .map_err(|e| EngineError::Io(format!("reading {}: {e}", path.display())))?
        .len();
    let content = weights::read_content(&mut open()?, path)?;
    let info = weights::info(&content)?;
    let mut problems = Vec::new();
    let tokenizer = match Vocabulary::read(open()?) {
        Ok(vocabulary) => Some(summarise(&content, &vocabulary, &mut problems)),
        Err(err) => {
            problems.push(format!("tokenizer: {err}"));
            None
        }
    };
    let tensor_types = tensor_types(&content);
    let weights_bytes = tensor_types.iter().map(|t| t.bytes).sum();
    let (runs_on, kernels_refused, memory) = match engine_path(&content, &info.architecture) {
        Ok((runs_on, refused, kv)) => (
            Some(runs_on),
            refused,
            kv.map(|(kv_bytes_per_token, kv_bytes_at_context)| MemoryNeed {
                weights_bytes,
                kv_bytes_per_token,
                kv_bytes_at_context,
            }),
        ),
        Err(why) => {
            problems.push(why);
            (None, None, None)
        }
    };
    Ok(FileCheck {
        file_bytes,
        architecture: info.architecture,
        quantization: info.quantization,
        name: info.name,
        context_length: info.context_length,
        tensor_types,
        tokenizer,
        runs_on,
        kernels_refused,
        memory,
        problems,
    })
}

/// The tokenizer, and whether a chat renders through its template (a conversation of
/// every role, as a gateway sends).
fn summarise(
    content: &gguf_file::Content,
    vocabulary: &Vocabulary,
    problems: &mut Vec<String>,
) -> TokenizerSummary {
    let text = |key: &str| {
        content
            .metadata
            .get(key)
            .and_then(|v| v.to_string().ok())
            .cloned()
    };
    let message = |role, content: &str| ChatMessage {
        role,
        content: content.to_owned(),
    };
    let conversation = [
        message(Role::System, "You are a helpful assistant."),
        message(Role::User, "Hello."),
        message(Role::Assistant, "Hello! How can I help?"),
        message(Role::User, "Name a colour."),
    ];
    if let Err(err) = vocabulary.chat.render(&conversation) {
        problems.push(format!("chat template: {err}"));
    }
    TokenizerSummary {
        model: text("tokenizer.ggml.model").unwrap_or_default(),
        pre: text("tokenizer.ggml.pre"),
        tokens: vocabulary.tokenizer.vocab_size(),
        template_from_file: content.metadata.contains_key("tokenizer.chat_template"),
        system_role: vocabulary.chat.has_system_role(),
    }
}

/// Where the file runs, what the kernels refused (candle), and the kernels' KV cache
/// per token and at the full context (kernels).
type EnginePath = (Backend, Option<String>, Option<(u64, u64)>);

/// Where the file would run — the kernels where they take it, else candle — with what
/// the kernels refused, and their KV cache; `Err`: why neither runs it.
fn engine_path(content: &gguf_file::Content, architecture: &str) -> Result<EnginePath, String> {
    let rope_scale =
        weights::refused_by_either(content, architecture).map_err(|e| e.to_string())?;
    let kernels = if !KERNEL_ARCHITECTURES.contains(&architecture) {
        Err(weights::unsupported_architecture(architecture))
    } else if !weights::kernels_enabled() {
        Err("turned off here (SHAREMESH_KERNELS=candle)".to_owned())
    } else {
        kernels_take(content, architecture, rope_scale)
    };
    match kernels {
        Ok(kv) => Ok((Backend::Kernels, None, Some(kv))),
        Err(refused) if !CANDLE_ARCHITECTURES.contains(&architecture) => Err(refused),
        Err(refused) => match weights::candle_cannot_run(content, architecture, rope_scale) {
            Some(missing) => Err(format!(
                "{} (the kernels: {refused})",
                weights::only_the_kernels_run(&missing)
            )),
            None => Ok((Backend::Candle, Some(refused), None)),
        },
    }
}

/// Whether the kernels take the file's configuration and every tensor's storage type;
/// `Ok`: its KV cache's bytes per token and at the full context.
fn kernels_take(
    content: &gguf_file::Content,
    architecture: &str,
    rope_scale: f32,
) -> Result<(u64, u64), String> {
    let config = kernel_config(content, architecture, rope_scale).map_err(|e| e.to_string())?;
    config.validate().map_err(|e| e.to_string())?;
    // The tensors loading reads (others, a `rope_freqs` table say, are F32 or unread).
    let read = |name: &str| {
        name.starts_with("blk.") || name == "token_embd.weight" || name == "output.weight"
    };
    let mut names: Vec<_> = content.tensor_infos.iter().collect();
    names.sort_by(|a, b| a.0.cmp(b.0));
    if let Some((name, info)) = names.into_iter().find(|(name, info)| {
        read(name) && matches!(kernel_format(info.ggml_dtype), RawFormat::Other(_))
    }) {
        return Err(format!(
            "tensor `{name}` is {}, which they do not read",
            dtype_name(info.ggml_dtype)
        ));
    }
    let pool = config.kv_pool(0);
    let per_token = (pool.block_bytes() / BLOCK_POSITIONS) as u64;
    let at_context = (KvPool::blocks_for(config.context) * pool.block_bytes()) as u64;
    Ok((per_token, at_context))
}

fn tensor_types(content: &gguf_file::Content) -> Vec<TensorTypeCount> {
    let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for info in content.tensor_infos.values() {
        let dtype = info.ggml_dtype;
        let blocks = info.shape.elem_count() / dtype.block_size();
        let entry = by_type.entry(dtype_name(dtype)).or_default();
        entry.0 += 1;
        entry.1 += (blocks * dtype.type_size()) as u64;
    }
    let mut counts: Vec<_> = by_type
        .into_iter()
        .map(|(dtype, (tensors, bytes))| TensorTypeCount {
            dtype,
            tensors,
            bytes,
        })
        .collect();
    counts.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.dtype.cmp(&b.dtype)));
    counts
}

/// llama.cpp's name for a storage type (`Q4_K`, not candle's `Q4K`).
fn dtype_name(dtype: GgmlDType) -> String {
    match kernel_format(dtype) {
        RawFormat::Quantized(block) => block.name().to_owned(),
        _ => match dtype {
            GgmlDType::Q2K => "Q2_K".to_owned(),
            GgmlDType::Q3K => "Q3_K".to_owned(),
            GgmlDType::Q8K => "Q8_K".to_owned(),
            GgmlDType::Q8_1 => "Q8_1".to_owned(),
            other => format!("{other:?}"),
        },
    }
}
