//! Reading a GGUF file for sharemesh's kernels: the hyper-parameters from its metadata,
//! each tensor in the kernels' formats, and the parts of tensors a file fuses (phi3).

use std::io::{Read, Seek};
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::Device;
use sharemesh_kernels::blocks::BlockType;
use sharemesh_kernels::llama::{self, Gemma, LlamaConfig, RawFormat, RawTensor};
use sharemesh_kernels::KernelError;

use crate::EngineError;

/// llama, qwen2 (llama with q/k/v biases and NEOX rotary pairs), qwen3, phi3 (llama
/// with NEOX pairs and fused tensors) or gemma3 on the kernels.
pub(crate) fn load_kernels<R: Read + Seek>(
    ct: &gguf_file::Content,
    reader: &mut R,
    architecture: &str,
    rope_scale: f32,
    path: &Path,
) -> Result<llama::Llama, EngineError> {
    let config = kernel_config(ct, architecture, rope_scale)?;
    let fused = FusedRows::of(architecture, &config);
    let threads = candle_core::utils::get_num_threads();
    // The fused tensor last read, for the next part of it.
    let mut last_fused: Option<(String, RawTensor)> = None;
    let model = llama::Llama::load(config, threads, |name| {
        if let Some((fused_name, rows)) = fused.as_ref().and_then(|f| f.part(name)) {
            if last_fused
                .as_ref()
                .is_none_or(|(held, _)| *held != fused_name)
            {
                let Some(whole) = read_tensor(ct, reader, &fused_name, path)? else {
                    return Ok(None);
                };
                last_fused = Some((fused_name.clone(), whole));
            }
            let (_, whole) = last_fused.as_ref().expect("just read");
            return rows_of(whole, rows, &fused_name).map(Some);
        }
        read_tensor(ct, reader, name, path)
    });
    model.map_err(|e| match e {
        KernelError::UnsupportedFormat { .. } | KernelError::BadConfig(_) => {
            EngineError::Unsupported(e.to_string())
        }
        other => EngineError::BadModel(format!(
            "{}: {other}; the file may be truncated or corrupt",
            path.display()
        )),
    })
}

/// Tensor `name` of the file as the kernels take it (`None`: not in the file).
fn read_tensor<R: Read + Seek>(
    ct: &gguf_file::Content,
    reader: &mut R,
    name: &str,
    path: &Path,
) -> Result<Option<RawTensor>, KernelError> {
    let Some(info) = ct.tensor_infos.get(name) else {
        return Ok(None);
    };
    let format = kernel_format(info.ggml_dtype);
    if let RawFormat::Other(kind) = format {
        return Err(KernelError::UnsupportedFormat {
            name: name.to_owned(),
            format: kind,
        });
    }
    let read_failed = |e: candle_core::Error| KernelError::BadTensor {
        name: name.to_owned(),
        problem: format!("reading {} failed ({e})", path.display()),
    };
    let tensor = ct.tensor(reader, name, &Device::Cpu).map_err(read_failed)?;
    let bytes = tensor.data().map_err(read_failed)?.into_owned();
    Ok(Some(RawTensor {
        format,
        dims: info.shape.dims().to_vec(),
        bytes,
    }))
}

/// How the kernels take a tensor stored as `dtype` (`Other`: they do not).
pub(crate) fn kernel_format(dtype: GgmlDType) -> RawFormat {
    match dtype {
        GgmlDType::F32 => RawFormat::F32,
        GgmlDType::F16 => RawFormat::F16,
        GgmlDType::Q4_0 => RawFormat::Quantized(BlockType::Q4_0),
        GgmlDType::Q4_1 => RawFormat::Quantized(BlockType::Q4_1),
        GgmlDType::Q5_0 => RawFormat::Quantized(BlockType::Q5_0),
        GgmlDType::Q5_1 => RawFormat::Quantized(BlockType::Q5_1),
        GgmlDType::Q8_0 => RawFormat::Quantized(BlockType::Q8_0),
        GgmlDType::Q4K => RawFormat::Quantized(BlockType::Q4_K),
        GgmlDType::Q5K => RawFormat::Quantized(BlockType::Q5_K),
        GgmlDType::Q6K => RawFormat::Quantized(BlockType::Q6_K),
        other => RawFormat::Other(format!("{other:?}")),
    }
}

/// Where a file fuses tensors the kernels load apart — phi3: q, k and v in one
/// `attn_qkv` (rows q, then k, then v), gate and up in one `ffn_up` (gate's rows first,
/// as llama.cpp's fused SwiGLU splits it) — the widths of the parts.
struct FusedRows {
    q: usize,
    kv: usize,
    feed_forward: usize,
}

impl FusedRows {
    fn of(architecture: &str, config: &LlamaConfig) -> Option<Self> {
        (architecture == "phi3").then(|| Self {
            q: config.heads * config.head_dim,
            kv: config.kv_heads * config.head_dim,
            feed_forward: config.feed_forward,
        })
    }

    /// The fused tensor that holds `name`, and which of its rows it is.
    fn part(&self, name: &str) -> Option<(String, std::ops::Range<usize>)> {
        let (block, part) = name.strip_prefix("blk.")?.split_once('.')?;
        let (fused, start, rows) = match part {
            "attn_q.weight" => ("attn_qkv", 0, self.q),
            "attn_k.weight" => ("attn_qkv", self.q, self.kv),
            "attn_v.weight" => ("attn_qkv", self.q + self.kv, self.kv),
            "ffn_gate.weight" => ("ffn_up", 0, self.feed_forward),
            "ffn_up.weight" => ("ffn_up", self.feed_forward, self.feed_forward),
            _ => return None,
        };
        Some((format!("blk.{block}.{fused}.weight"), start..start + rows))
    }
}

/// Rows `rows` of the matrix `whole` (row-major, each row whole quantized blocks, so a
/// row range is a byte range).
fn rows_of(
    whole: &RawTensor,
    rows: std::ops::Range<usize>,
    name: &str,
) -> Result<RawTensor, KernelError> {
    let bad = |problem: String| KernelError::BadTensor {
        name: name.to_owned(),
        problem,
    };
    let [height, width] = whole.dims[..] else {
        return Err(bad(format!("a fused matrix of shape {:?}", whole.dims)));
    };
    if rows.end > height || height == 0 || !whole.bytes.len().is_multiple_of(height) {
        return Err(bad(format!(
            "{height} rows of {} bytes, but rows {}..{} are wanted",
            whole.bytes.len(),
            rows.start,
            rows.end
        )));
    }
    let row_bytes = whole.bytes.len() / height;
    Ok(RawTensor {
        format: whole.format.clone(),
        dims: vec![rows.len(), width],
        bytes: whole.bytes[rows.start * row_bytes..rows.end * row_bytes].to_vec(),
    })
}

/// The kernels' hyper-parameters from the file's `{architecture}.*` metadata.
pub(crate) fn kernel_config(
    ct: &gguf_file::Content,
    architecture: &str,
    rope_scale: f32,
) -> Result<LlamaConfig, EngineError> {
    let number = |key: &str| -> Result<f64, EngineError> {
        let value = ct
            .metadata
            .get(&format!("{architecture}.{key}"))
            .ok_or_else(|| {
                EngineError::BadModel(format!("GGUF metadata lacks `{architecture}.{key}`"))
            })?;
        value
            .to_u32()
            .map(f64::from)
            .or_else(|_| value.to_f32().map(f64::from))
            .or_else(|_| value.to_u64().map(|v| v as f64))
            .map_err(|e| EngineError::BadModel(format!("`{architecture}.{key}`: {e}")))
    };
    // Keys some files leave out; one that is there but not a number is an error.
    let optional = |key: &str| -> Result<Option<f64>, EngineError> {
        match ct.metadata.contains_key(&format!("{architecture}.{key}")) {
            true => number(key).map(Some),
            false => Ok(None),
        }
    };
    let (hidden, heads) = (
        number("embedding_length")? as usize,
        number("attention.head_count")? as usize,
    );
    let head_dim = optional("attention.key_length")?.map_or(hidden / heads.max(1), |d| d as usize);
    if let Some(value_length) = optional("attention.value_length")? {
        if value_length as usize != head_dim {
            return Err(EngineError::Unsupported(format!(
                "value heads of {value_length} beside key heads of {head_dim} on the sharemesh kernels"
            )));
        }
    }
    let rope_base = optional("rope.freq_base")?.unwrap_or(10_000.0) as f32;
    let gemma = match architecture {
        "gemma3" => Some(Gemma::gemma3(number("attention.sliding_window")? as usize)),
        "gemma2" => Some(Gemma::gemma2(
            number("attention.sliding_window")? as usize,
            rope_base,
            optional("attn_logit_softcapping")?.map(|c| c as f32),
            optional("final_logit_softcapping")?.map(|c| c as f32),
        )),
        _ => None,
    };
    Ok(LlamaConfig {
        neox_rope: architecture != "llama",
        hidden,
        feed_forward: number("feed_forward_length")? as usize,
        layers: number("block_count")? as usize,
        heads,
        kv_heads: number("attention.head_count_kv")? as usize,
        head_dim,
        // qwen2 and Gemma files often leave it out: the whole head rotates.
        rope_dimensions: optional("rope.dimension_count")?.map_or(head_dim, |d| d as usize),
        rope_base,
        rope_scale,
        norm_eps: number("attention.layer_norm_rms_epsilon")? as f32,
        context: number("context_length")? as usize,
        head_norms: matches!(architecture, "qwen3" | "gemma3"),
        gemma,
    })
}
