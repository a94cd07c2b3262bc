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
use support::qwen2::write_qwen2_from_llama;

use candle_core::Device;
use sharemesh_engine::LoadedModel;
use sharemesh_protocol::{ChatMessage, ModelId, Prompt, Role};

#[test]
fn qwen2_on_smollm2_weights_answers_like_the_llama_path() {
    sharemesh_engine::set_threads(1);
    // The llama side through candle too, so both sides round the same way (the
    // default kernels quantise activations differently).
    std::env::set_var("SHAREMESH_KERNELS", "candle");
    let llama_path = support::default_model_path();
    let dir = tempfile::tempdir().unwrap();
    let qwen2_path = dir.path().join("smollm2-as-qwen2.gguf");
    write_qwen2_from_llama(&llama_path, &qwen2_path, |_| 0.0);

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
