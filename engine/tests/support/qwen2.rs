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
/// the q/k rows in NEOX order, and what `change` makes of it: it edits the tensors and
/// gives metadata to add (a key already there takes the new value).
fn write_neox_from_llama(
    llama: &Path,
    target: &Path,
    arch: &str,
    change: impl Fn(&Heads, &mut Vec<(String, QTensor)>) -> Vec<(String, gguf_file::Value)>,
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
    let mut metadata: std::collections::BTreeMap<String, gguf_file::Value> = content
        .metadata
        .iter()
        .map(|(key, value)| match key.strip_prefix("llama.") {
            Some(rest) => (format!("{arch}.{rest}"), value.clone()),
            None if key == "general.architecture" => {
                (key.clone(), gguf_file::Value::String(arch.into()))
            }
            None => (key.clone(), value.clone()),
        })
        .collect();

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
    metadata.extend(change(&shape, &mut tensors));
    let metadata_refs: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = File::create(target).unwrap();
    gguf_file::write(&mut out, &metadata_refs, &tensor_refs).unwrap();
}

/// Writes the qwen2 file; `bias(i)` is the value of element `i` of every q, k and v
/// bias (`|_| 0.0`: the llama network itself).
pub fn write_qwen2_from_llama(llama: &Path, target: &Path, bias: impl Fn(usize) -> f32) {
    write_neox_from_llama(llama, target, "qwen2", |shape, tensors| {
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
        Vec::new()
    });
}

/// The q, k and v biases of the biased qwen2 files the tests write: a size that moves
/// the answer.
pub fn qwen2_bias(i: usize) -> f32 {
    ((i * 37 % 101) as f32 / 101.0 - 0.5) * 0.8
}

/// The q/k head norm weights of the qwen3 files the tests write: a size that moves the
/// answer (not all ones).
pub fn qwen3_norm(i: usize) -> f32 {
    0.6 + (i * 37 % 101) as f32 / 101.0
}

/// Writes a qwen3 file from SmolLM2's llama weights: qwen3 is llama with the NEOX
/// rotary layout and an RMS norm of each query and key head before the rotation, and no
/// biases. `norm(i)` is element `i` of every q and k head norm's weight.
pub fn write_qwen3_from_llama(llama: &Path, target: &Path, norm: impl Fn(usize) -> f32) {
    write_neox_from_llama(llama, target, "qwen3", |shape, tensors| {
        // candle's qwen3 reads the head width from the file, as Qwen 3's own files give it.
        let metadata = vec![(
            "qwen3.attention.key_length".to_owned(),
            gguf_file::Value::U32(shape.head_dim as u32),
        )];
        for layer in 0..shape.layers {
            for part in ["q", "k"] {
                tensors.push((
                    format!("blk.{layer}.attn_{part}_norm.weight"),
                    vector(shape.head_dim, &norm),
                ));
            }
        }
        metadata
    });
}

/// Writes a phi3 file from SmolLM2's llama weights: phi3 is llama with the NEOX rotary
/// layout, q, k and v fused in one `attn_qkv` (rows q, k, v) and gate and up in one
/// `ffn_up` (gate's rows first), and its own output matrix (SmolLM2 ties it to the
/// embeddings). Its rope base is 10,000, as candle's phi3 assumes. Rows are whole
/// blocks, so fusing is byte concatenation where the parts share a format (else F32).
pub fn write_phi3_from_llama(llama: &Path, target: &Path) {
    write_neox_from_llama(llama, target, "phi3", |shape, tensors| {
        for layer in 0..shape.layers {
            for (fused, parts) in [
                ("attn_qkv", &["attn_q", "attn_k", "attn_v"][..]),
                ("ffn_up", &["ffn_gate", "ffn_up"][..]),
            ] {
                let names: Vec<String> = parts
                    .iter()
                    .map(|part| format!("blk.{layer}.{part}.weight"))
                    .collect();
                let taken: Vec<QTensor> = names
                    .iter()
                    .map(|name| {
                        let at = tensors.iter().position(|(n, _)| n == name).unwrap();
                        tensors.remove(at).1
                    })
                    .collect();
                tensors.push((format!("blk.{layer}.{fused}.weight"), rows_stacked(&taken)));
            }
        }
        if !tensors.iter().any(|(name, _)| name == "output.weight") {
            let embeddings = tensors
                .iter()
                .find(|(n, _)| n == "token_embd.weight")
                .unwrap();
            let copy = rows_stacked(std::slice::from_ref(&embeddings.1));
            tensors.push(("output.weight".to_owned(), copy));
        }
        vec![(
            "phi3.rope.freq_base".to_owned(),
            gguf_file::Value::F32(10_000.0),
        )]
    });
}

/// The matrices' rows one after another (their bytes, where they share a format).
fn rows_stacked(parts: &[QTensor]) -> QTensor {
    let width = parts[0].shape().dims()[1];
    let rows: usize = parts.iter().map(|t| t.shape().dims()[0]).sum();
    if parts.iter().all(|t| t.dtype() == parts[0].dtype()) {
        let bytes: Vec<u8> = parts
            .iter()
            .flat_map(|t| t.data().unwrap().into_owned())
            .collect();
        return ggml_file::qtensor_from_ggml(
            parts[0].dtype(),
            &bytes,
            vec![rows, width],
            &Device::Cpu,
        )
        .unwrap();
    }
    let floats: Vec<Tensor> = parts
        .iter()
        .map(|t| t.dequantize(&Device::Cpu).unwrap())
        .collect();
    QTensor::quantize(&Tensor::cat(&floats, 0).unwrap(), GgmlDType::F32).unwrap()
}
