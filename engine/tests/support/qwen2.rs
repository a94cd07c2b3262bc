#![allow(clippy::unwrap_used)]
//! A qwen2 GGUF written from SmolLM2's llama weights (no qwen2 file can be fetched
//! here): qwen2 is llama plus q/k/v biases and the NEOX rotary layout, so the
//! `llama.*` metadata becomes `qwen2.*`, zero biases are added, and the q/k rows are
//! put back in NEOX order (llama.cpp's converter interleaves them for llama's rope;
//! rows are whole quantized blocks, so this is a byte shuffle, not a requantisation).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::{ggml_file, gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// Rows of one head's q or k in GGUF-llama order (pairs interleaved: row 2k+s) back to
/// NEOX order (halves: row s·half + k).
fn neox_rows(tensor: &QTensor, heads: usize) -> QTensor {
    let dims = tensor.shape().dims().to_vec();
    let rows = dims[0];
    let bytes = tensor.data().unwrap();
    let row_bytes = bytes.len() / rows;
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = vec![0u8; bytes.len()];
    for head in 0..heads {
        for k in 0..half {
            for s in 0..2 {
                let from = head * head_dim + 2 * k + s;
                let to = head * head_dim + s * half + k;
                out[to * row_bytes..][..row_bytes]
                    .copy_from_slice(&bytes[from * row_bytes..][..row_bytes]);
            }
        }
    }
    ggml_file::qtensor_from_ggml(tensor.dtype(), &out, dims, &Device::Cpu).unwrap()
}

/// The shape of SmolLM2's attention, as the added tensors need it.
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub layers: usize,
    pub head_dim: usize,
}

/// A vector tensor (F32) of `n` elements, element `i` being `value(i)`.
fn vector(n: usize, value: impl Fn(usize) -> f32) -> QTensor {
    let values: Vec<f32> = (0..n).map(value).collect();
    QTensor::quantize(
        &Tensor::from_vec(values, n, &Device::Cpu).unwrap(),
        GgmlDType::F32,
    )
    .unwrap()
}

/// Writes SmolLM2's llama file as architecture `arch`: its `llama.*` metadata renamed,
/// the q/k rows in NEOX order, and what `added` gives (more metadata and tensors).
fn write_neox_from_llama(
    llama: &Path,
    target: &Path,
    arch: &str,
    added: impl Fn(&Heads) -> (Vec<(String, gguf_file::Value)>, Vec<(String, QTensor)>),
) {
    let mut reader = BufReader::new(File::open(llama).unwrap());
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let number = |key: &str| content.metadata[key].to_u32().unwrap() as usize;
    let heads = number("llama.attention.head_count");
    let shape = Heads {
        heads,
        kv_heads: number("llama.attention.head_count_kv"),
        layers: number("llama.block_count"),
        head_dim: number("llama.embedding_length") / heads,
    };
    let (more_metadata, more_tensors) = added(&shape);
    let mut metadata: Vec<(String, gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(key, value)| match key.strip_prefix("llama.") {
            Some(rest) => (format!("{arch}.{rest}"), value.clone()),
            None if key == "general.architecture" => {
                (key.clone(), gguf_file::Value::String(arch.into()))
            }
            None => (key.clone(), value.clone()),
        })
        .chain(more_metadata)
        .collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));

    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    for name in names {
        let tensor = content.tensor(&mut reader, name, &Device::Cpu).unwrap();
        let tensor = if name.ends_with("attn_q.weight") {
            neox_rows(&tensor, shape.heads)
        } else if name.ends_with("attn_k.weight") {
            neox_rows(&tensor, shape.kv_heads)
        } else {
            tensor
        };
        tensors.push((name.clone(), tensor));
    }
    tensors.extend(more_tensors);
    let metadata_refs: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = File::create(target).unwrap();
    gguf_file::write(&mut out, &metadata_refs, &tensor_refs).unwrap();
}

/// Writes the qwen2 file; `bias(i)` is the value of element `i` of every q, k and v
/// bias (`|_| 0.0`: the llama network itself).
pub fn write_qwen2_from_llama(llama: &Path, target: &Path, bias: impl Fn(usize) -> f32) {
    write_neox_from_llama(llama, target, "qwen2", |shape| {
        let mut tensors = Vec::new();
        for layer in 0..shape.layers {
            for (part, width) in [
                ("q", shape.heads),
                ("k", shape.kv_heads),
                ("v", shape.kv_heads),
            ] {
                tensors.push((
                    format!("blk.{layer}.attn_{part}.bias"),
                    vector(width * shape.head_dim, &bias),
                ));
            }
        }
        (Vec::new(), tensors)
    });
}

/// Writes a qwen3 file from SmolLM2's llama weights: qwen3 is llama with the NEOX
/// rotary layout and an RMS norm of each query and key head before the rotation, and no
/// biases. `norm(i)` is element `i` of every q and k head norm's weight.
pub fn write_qwen3_from_llama(llama: &Path, target: &Path, norm: impl Fn(usize) -> f32) {
    write_neox_from_llama(llama, target, "qwen3", |shape| {
        // candle's qwen3 reads the head width from the file, as Qwen 3's own files give it.
        let metadata = vec![(
            "qwen3.attention.key_length".to_owned(),
            gguf_file::Value::U32(shape.head_dim as u32),
        )];
        let mut tensors = Vec::new();
        for layer in 0..shape.layers {
            for part in ["q", "k"] {
                tensors.push((
                    format!("blk.{layer}.attn_{part}_norm.weight"),
                    vector(shape.head_dim, &norm),
                ));
            }
        }
        (metadata, tensors)
    });
}
