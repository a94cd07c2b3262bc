#![allow(clippy::unwrap_used)]
//! Qwen 3 on the batch-invariant kernels (#42). No Qwen 3 file can be fetched here, so
//! the test writes one from SmolLM2's weights (`support::qwen2::write_qwen3_from_llama`:
//! NEOX q/k rows, a norm weight for each query and key head, no biases); the reference
//! is candle's own `quantized_qwen3` on the same weights dequantized, with float
//! activations — how far the kernels may be from it is the same bound as qwen2's.
//! Whether the kernels agree with llama.cpp on a real Qwen 3 file is not measured here.

mod support;

use std::fs::File;
use std::io::BufReader;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::Device;
use candle_transformers::models::quantized_qwen3;
use sharemesh_engine::LoadedModel;
use sharemesh_protocol::{ChatMessage, ModelId, Prompt, Role};

#[test]
fn qwen3_runs_on_the_kernels_near_candles_float_qwen3() {
    sharemesh_engine::set_threads(1);
    let id: ModelId = support::DEFAULT_MODEL_ID.parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2-as-qwen3.gguf");
    // Norm weights of a size that moves the answer (not all ones).
    let norm = |i: usize| 0.6 + (i * 37 % 101) as f32 / 101.0;
    support::qwen2::write_qwen3_from_llama(&support::default_model_path(), &path, norm);
    let mut qwen3 = LoadedModel::load(&path, id, "smollm2-as-qwen3", Device::Cpu).unwrap();
    assert_eq!(qwen3.descriptor.architecture, "qwen3");
    assert_eq!(qwen3.backend(), "cpu/sharemesh-kernels");
    assert!(qwen3.batch_invariant());
    let prompt = Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: "What is the capital of France? Answer in one word.".into(),
    }]);
    let tokens = qwen3.prompt_tokens(&prompt).unwrap();

    let f32_path = dir.path().join("smollm2-as-qwen3-f32.gguf");
    sharemesh_engine::weights::requantize(&path, &f32_path, 0, |_, _| GgmlDType::F32).unwrap();
    let mut reader = BufReader::new(File::open(&f32_path).unwrap());
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let mut reference =
        quantized_qwen3::ModelWeights::from_gguf(content, &mut reader, &Device::Cpu).unwrap();
    let steps = 12;
    let (path_tokens, want) = support::candle_steps(&tokens, steps, None, |input, at| {
        reference.forward(input, at)
    });
    let ours = support::kernel_logits_along(&mut qwen3, &path_tokens, steps);
    support::assert_near_float_reference("qwen3 on the kernels", &ours, &want, 0.05);
}
