#![allow(clippy::unwrap_used)]
//! The qwen2 path on real weights. No qwen2 GGUF can be fetched here, so the test writes
//! one from SmolLM2's: qwen2 is llama plus q/k/v biases and the NEOX rotary layout, so
//! the `llama.*` metadata becomes `qwen2.*`, zero biases are added, and the q/k rows are
//! put back in NEOX order (llama.cpp's converter interleaves them for llama's rope;
//! rows are whole quantized blocks, so this is a byte shuffle, not a requantisation).
//! The same weights must then give the same answers through candle's qwen2 as through
//! the llama path.

mod support;

use support::greedy_job as run;

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::{ggml_file, gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use sharemesh_engine::LoadedModel;
use sharemesh_protocol::{ChatMessage, ModelId, Prompt, Role};

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

fn write_qwen2_from_llama(llama: &Path, target: &Path) {
    let mut reader = BufReader::new(File::open(llama).unwrap());
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let number = |key: &str| content.metadata[key].to_u32().unwrap() as usize;
    let heads = number("llama.attention.head_count");
    let kv_heads = number("llama.attention.head_count_kv");
    let layers = number("llama.block_count");
    let hidden = number("llama.embedding_length");
    let head_dim = hidden / heads;

    let mut metadata: Vec<(String, gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(key, value)| match key.strip_prefix("llama.") {
            Some(rest) => (format!("qwen2.{rest}"), value.clone()),
            None if key == "general.architecture" => {
                (key.clone(), gguf_file::Value::String("qwen2".into()))
            }
            None => (key.clone(), value.clone()),
        })
        .collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));

    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    for name in names {
        let tensor = content.tensor(&mut reader, name, &Device::Cpu).unwrap();
        let tensor = if name.ends_with("attn_q.weight") {
            neox_rows(&tensor, heads)
        } else if name.ends_with("attn_k.weight") {
            neox_rows(&tensor, kv_heads)
        } else {
            tensor
        };
        tensors.push((name.clone(), tensor));
    }
    let zeros = |n: usize| {
        QTensor::quantize(
            &Tensor::zeros(n, DType::F32, &Device::Cpu).unwrap(),
            GgmlDType::F32,
        )
        .unwrap()
    };
    for layer in 0..layers {
        tensors.push((format!("blk.{layer}.attn_q.bias"), zeros(heads * head_dim)));
        tensors.push((
            format!("blk.{layer}.attn_k.bias"),
            zeros(kv_heads * head_dim),
        ));
        tensors.push((
            format!("blk.{layer}.attn_v.bias"),
            zeros(kv_heads * head_dim),
        ));
    }

    let metadata_refs: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = File::create(target).unwrap();
    gguf_file::write(&mut out, &metadata_refs, &tensor_refs).unwrap();
}

#[test]
fn qwen2_on_smollm2_weights_answers_like_the_llama_path() {
    sharemesh_engine::set_threads(1);
    // The llama side through candle too, so both sides round the same way (the
    // default kernels quantise activations differently).
    std::env::set_var("SHAREMESH_KERNELS", "candle");
    let llama_path = support::default_model_path();
    let dir = tempfile::tempdir().unwrap();
    let qwen2_path = dir.path().join("smollm2-as-qwen2.gguf");
    write_qwen2_from_llama(&llama_path, &qwen2_path);

    let id: ModelId = support::DEFAULT_MODEL_ID.parse().unwrap();
    let mut qwen2 = LoadedModel::load(&qwen2_path, id, "smollm2-as-qwen2", Device::Cpu).unwrap();
    assert_eq!(qwen2.descriptor.architecture, "qwen2");
    assert_eq!(qwen2.backend(), "cpu/candle");
    let mut llama = LoadedModel::load(&llama_path, id, "smollm2", Device::Cpu).unwrap();
    assert_eq!(llama.descriptor.architecture, "llama");

    let chat = |text: &str| {
        Prompt::Chat(vec![ChatMessage {
            role: Role::User,
            content: text.into(),
        }])
    };
    let france = chat("What is the capital of France? Answer in one word.");
    let answer = run(&mut qwen2, &france, 16, vec![]);
    assert_eq!(answer.text, "The capital of France is Paris.");
    for prompt in [france, chat("Write a short poem about the sea.")] {
        let ours = run(&mut qwen2, &prompt, 16, vec![]);
        let reference = run(&mut llama, &prompt, 16, vec![]);
        assert_eq!(ours.token_ids, reference.token_ids, "{:?}", ours.text);
    }

    // Not batch-invariant: a resume replays the delivered tokens and stays exact.
    assert!(!qwen2.batch_invariant());
    let poem = chat("Write a short poem about the sea.");
    let full = run(&mut qwen2, &poem, 12, vec![]);
    for cut in [1, 5, 11] {
        let resumed = run(&mut qwen2, &poem, 12, full.token_ids[..cut].to_vec());
        assert_eq!(resumed.token_ids, full.token_ids, "resume at {cut}");
    }
}
