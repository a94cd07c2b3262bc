//! Reading a GGUF file for sharemesh's kernels: the hyper-parameters from its metadata,
//! each tensor in the kernels' formats, and the parts of tensors a file fuses (phi3).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType};
use sharemesh_kernels::blocks::BlockType;
use sharemesh_kernels::llama::{self, Gemma, LlamaConfig, RawFormat, RawTensor, TensorBytes};
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
    progress: &indicatif::ProgressBar,
) -> Result<llama::Llama, EngineError> {
    let config = kernel_config(ct, architecture, rope_scale)?;
    let mut file = TensorSource::open(reader, path, progress);
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
                let Some(whole) = read_tensor(ct, &mut file, &fused_name, path)? else {
                    return Ok(None);
                };
                last_fused = Some((fused_name.clone(), whole));
            }
            let (_, whole) = last_fused.as_ref().expect("just read");
            return rows_of(whole, rows, &fused_name).map(Some);
        }
        read_tensor(ct, &mut file, name, path)
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
    file: &mut TensorSource<'_, R>,
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
    let bytes = file
        .bytes(ct, info)
        .map_err(|problem| KernelError::BadTensor {
            name: name.to_owned(),
            problem: format!("reading {} failed ({problem})", path.display()),
        })?;
    Ok(Some(RawTensor {
        format,
        dims: info.shape.dims().to_vec(),
        bytes,
    }))
}

/// Where tensors' bytes come from: the file mapped read-only, where it maps, so the
/// kernels repack straight from the page cache; else read once each into a buffer.
/// (Loading used candle's `Content::tensor`, which copied each tensor three times over
/// into freshly faulted pages: 2.3 million page faults and 26–34 s to load an 8B file
/// here, most of it in the kernel.)
struct TensorSource<'a, R> {
    map: Option<Arc<memmap2::Mmap>>,
    reader: &'a mut R,
    progress: &'a indicatif::ProgressBar,
}

impl<'a, R: Read + Seek> TensorSource<'a, R> {
    fn open(reader: &'a mut R, path: &Path, progress: &'a indicatif::ProgressBar) -> Self {
        let map = std::fs::File::open(path)
            .ok()
            .and_then(|file| map_read_only(&file));
        Self {
            map: map.map(Arc::new),
            reader,
            progress,
        }
    }

    /// A tensor's bytes as the file stores them. Its size is the header's claim:
    /// checked against what the file holds before anything is read or allocated.
    fn bytes(
        &mut self,
        ct: &gguf_file::Content,
        info: &gguf_file::TensorInfo,
    ) -> Result<TensorBytes, String> {
        let (elements, block) = (info.shape.elem_count(), info.ggml_dtype.block_size());
        if !elements.is_multiple_of(block) {
            return Err(format!(
                "{elements} elements are not whole blocks of {block}"
            ));
        }
        let size = elements / block * info.ggml_dtype.type_size();
        let start = ct.tensor_data_offset.saturating_add(info.offset);
        let file_size = match &self.map {
            Some(map) => map.len() as u64,
            None => self
                .reader
                .seek(SeekFrom::End(0))
                .map_err(|e| e.to_string())?,
        };
        if size as u64 > file_size.saturating_sub(start) {
            return Err(format!(
                "the tensor needs {size} bytes at offset {start}; the file ends at \
                 {file_size}: it may be truncated"
            ));
        }
        let start = start as usize;
        if let Some(map) = &self.map {
            // (A read below moves the bar itself: the reader is the bar's.)
            self.progress.inc(size as u64);
            return Ok(TensorBytes::new(MappedRange {
                map: Arc::clone(map),
                range: start..start + size,
            }));
        }
        self.reader
            .seek(SeekFrom::Start(start as u64))
            .map_err(|e| e.to_string())?;
        let mut bytes = vec![0u8; size];
        self.reader
            .read_exact(&mut bytes)
            .map_err(|e| e.to_string())?;
        Ok(bytes.into())
    }
}

/// The file mapped read-only, advised to be read ahead in order (`None` where it will
/// not map).
#[allow(unsafe_code)]
fn map_read_only(file: &std::fs::File) -> Option<memmap2::Mmap> {
    // SAFETY: a private read-only mapping of a model file in the node's data dir, read
    // only while the model loads (the kernels copy what they keep); a process that
    // truncated the file meanwhile would fault this one, as it would a reader.
    let map = unsafe { memmap2::Mmap::map(file) }.ok()?;
    Some(map)
}

/// A tensor's range of the mapped file.
struct MappedRange {
    map: Arc<memmap2::Mmap>,
    range: std::ops::Range<usize>,
}

impl Drop for MappedRange {
    /// Once repacked, a tensor's pages leave this process (they stay in the page
    /// cache), so loading holds the file's bytes only while it repacks them.
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: `DontNeed` on a private read-only file mapping that is never written
        // only unmaps its pages: a later read maps the same file bytes again (the range
        // is widened down to a page boundary, into the tail of the tensor before it,
        // which reads back unchanged too).
        let _ = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                self.range.start,
                self.range.len(),
            )
        };
    }
}

impl std::ops::Deref for MappedRange {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
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
        bytes: whole.bytes[rows.start * row_bytes..rows.end * row_bytes]
            .to_vec()
            .into(),
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
