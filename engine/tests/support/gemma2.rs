//! A Gemma 2 file written from Gemma 3 270M's weights (no Gemma 2 file can be fetched
//! here): the same blocks less the per-head query and key norms, every `gemma3.*` key
//! under `gemma2.*`, and Gemma 2's soft-capping values (attention 50, output 30, as its
//! released files carry). llama.cpp's `gemma2` graph loads it as it would a real one.
//! Without the norms Gemma 3's queries and keys are far larger than a Gemma 2's, which
//! makes the attention so peaked that llama.cpp's own logits move by 17 between its F16
//! and F32 caches; the query weights are scaled down (`Q_SCALE`, stored Q8_0) so the
//! file is as well-conditioned as a trained model and the comparison means something.

use std::path::Path;

use candle_core::quantized::{gguf_file, QTensor};

/// Gemma 2's released attention and final-logit soft caps.
pub const ATTN_SOFTCAP: f32 = 50.0;
pub const FINAL_SOFTCAP: f32 = 30.0;
/// What the query weights are multiplied by.
pub const Q_SCALE: f64 = 0.05;

pub fn write_gemma2_from_gemma3(gemma3: &Path, target: &Path) {
    let mut reader = std::io::BufReader::new(std::fs::File::open(gemma3).unwrap());
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let mut metadata: Vec<(String, gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(key, value)| match key.strip_prefix("gemma3.") {
            Some(rest) => (format!("gemma2.{rest}"), value.clone()),
            None if key == "general.architecture" => {
                (key.clone(), gguf_file::Value::String("gemma2".into()))
            }
            None => (key.clone(), value.clone()),
        })
        .collect();
    metadata.push((
        "gemma2.attn_logit_softcapping".into(),
        gguf_file::Value::F32(ATTN_SOFTCAP),
    ));
    metadata.push((
        "gemma2.final_logit_softcapping".into(),
        gguf_file::Value::F32(FINAL_SOFTCAP),
    ));
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    let mut names: Vec<&String> = content
        .tensor_infos
        .keys()
        .filter(|name| {
            !name.ends_with("attn_q_norm.weight") && !name.ends_with("attn_k_norm.weight")
        })
        .collect();
    names.sort();
    let tensors: Vec<(String, QTensor)> = names
        .into_iter()
        .map(|name| {
            let tensor = content
                .tensor(&mut reader, name, &candle_core::Device::Cpu)
                .unwrap();
            if !name.ends_with("attn_q.weight") {
                return (name.clone(), tensor);
            }
            let scaled = (tensor.dequantize(&candle_core::Device::Cpu).unwrap() * Q_SCALE).unwrap();
            let scaled =
                QTensor::quantize(&scaled, candle_core::quantized::GgmlDType::Q8_0).unwrap();
            (name.clone(), scaled)
        })
        .collect();
    let metadata_refs: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = std::fs::File::create(target).unwrap();
    gguf_file::write(&mut out, &metadata_refs, &tensor_refs).unwrap();
}
