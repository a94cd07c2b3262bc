#![allow(clippy::unwrap_used)]
//! The kernels on the block types real GGUF files use beyond Q4_1/Q8_0: Q4_0, Q5_0,
//! Q5_1 and the K-quants Q4_K, Q5_K, Q6_K. No such llama file can be fetched here, so
//! the model test writes one from SmolLM2's weights with candle's quantizers (every
//! type in one file: SmolLM2's 576-wide rows only take 32-element types, its 1536-wide
//! `ffn_down` the K-quants) and checks it against candle's own llama on that file.

mod support;

use std::fs::File;
use std::io::BufReader;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use candle_transformers::models::quantized_llama;
use sharemesh_engine::LoadedModel;
use sharemesh_kernels::blocks::BlockType;
use sharemesh_kernels::quant::Matrix;
use sharemesh_protocol::{ChatMessage, ModelId, Prompt, Role};

const TYPES: [(GgmlDType, BlockType); 8] = [
    (GgmlDType::Q4_0, BlockType::Q4_0),
    (GgmlDType::Q4_1, BlockType::Q4_1),
    (GgmlDType::Q5_0, BlockType::Q5_0),
    (GgmlDType::Q5_1, BlockType::Q5_1),
    (GgmlDType::Q8_0, BlockType::Q8_0),
    (GgmlDType::Q4K, BlockType::Q4_K),
    (GgmlDType::Q5K, BlockType::Q5_K),
    (GgmlDType::Q6K, BlockType::Q6_K),
];

#[test]
fn every_block_type_dequantizes_as_candle_does() {
    let (rows, cols) = (6, 768);
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * (1.0 + (i % 37) as f32 / 9.0))
        .collect();
    let tensor = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
    for (ggml, block_type) in TYPES {
        let quantized = QTensor::quantize(&tensor, ggml).unwrap();
        let bytes = quantized.data().unwrap().into_owned();
        let matrix = Matrix::new("test", block_type, rows, cols, bytes).unwrap();
        let want: Vec<Vec<f32>> = quantized
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2()
            .unwrap();
        let mut row = vec![0f32; cols];
        for (r, want) in want.iter().enumerate() {
            matrix.dequantize_row(r, &mut row);
            for (e, (got, want)) in row.iter().zip(want).enumerate() {
                // == rather than bits: Q4_0/Q5_0 give +0 where candle may give −0.
                assert!(got == want, "{ggml:?} row {r} element {e}: {got} vs {want}");
            }
        }
    }
}

/// SmolLM2 with every layer matrix requantized, cycling through the block types by
/// layer and matrix; the embedding (the tied output head) in Q8_0.
fn write_mixed_file(target: &std::path::Path) {
    let small = [
        GgmlDType::Q4_0,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q8_0,
        GgmlDType::Q4_1,
    ];
    let large = [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K];
    sharemesh_engine::weights::requantize(
        &support::default_model_path(),
        target,
        15, // Q4_K_M: a mixed file, as llama.cpp's K-quant presets are
        |name, dims| {
            let layer: usize = name
                .strip_prefix("blk.")
                .and_then(|rest| rest.split('.').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let matrix_index = [
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_gate",
                "ffn_up",
            ]
            .iter()
            .position(|part| name.contains(part))
            .unwrap_or(0);
            if name == "token_embd.weight" {
                // Also the (tied) output head: llama.cpp's presets keep it at 6-8 bits.
                GgmlDType::Q8_0
            } else if dims[1] % 256 == 0 {
                large[layer % large.len()]
            } else {
                small[(layer + matrix_index) % small.len()]
            }
        },
    )
    .unwrap();
}

#[test]
fn a_k_quant_llama_file_runs_on_the_kernels_as_candle_computes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2-mixed-k-quants.gguf");
    write_mixed_file(&path);
    {
        // Every block type is in the file (the test would prove less otherwise).
        let mut reader = BufReader::new(File::open(&path).unwrap());
        let content = gguf_file::Content::read(&mut reader).unwrap();
        for (ggml, _) in TYPES {
            assert!(
                content.tensor_infos.values().any(|t| t.ggml_dtype == ggml),
                "no {ggml:?} tensor in the test file"
            );
        }
    }

    sharemesh_engine::set_threads(1);
    let id: ModelId = support::DEFAULT_MODEL_ID.parse().unwrap();
    let mut model = LoadedModel::load(&path, id, "smollm2-mixed", Device::Cpu).unwrap();
    assert_eq!(model.backend(), "cpu/sharemesh-kernels");
    assert!(model.batch_invariant());
    assert_eq!(model.profile().quantization, "Q4_K_M");

    // A sensible answer from the requantized weights, end to end.
    let prompt = Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: "What is the capital of France? Answer in one word.".into(),
    }]);
    let answer = support::greedy_job(&mut model, &prompt, 16, vec![]);
    assert!(answer.text.contains("Paris"), "{:?}", answer.text);

    // The reference: the same weights dequantized (F32 matrices, exact), through
    // candle's llama with float activations. The kernels quantize activations per 32
    // to i8; candle's quantized llama on the mixed file (per 32 for the 32-element
    // types, per 256 for the K-quants) is the yardstick for what that costs.
    let f32_path = dir.path().join("smollm2-mixed-dequantized.gguf");
    sharemesh_engine::weights::requantize(&path, &f32_path, 0, |_, _| GgmlDType::F32).unwrap();
    let candle_on = |file: &std::path::Path| {
        let mut reader = BufReader::new(File::open(file).unwrap());
        let content = gguf_file::Content::read(&mut reader).unwrap();
        quantized_llama::ModelWeights::from_gguf(content, &mut reader, &Device::Cpu).unwrap()
    };
    let steps = 12;
    let prompt_tokens = model.prompt_tokens(&prompt).unwrap();
    let mut reference = candle_on(&f32_path);
    let (path_tokens, want) = support::candle_steps(&prompt_tokens, steps, None, |input, at| {
        reference.forward(input, at)
    });
    let ours = support::kernel_logits_along(&mut model, &path_tokens, steps);
    let mut quantized = candle_on(&path);
    let (_, theirs) =
        support::candle_steps(&prompt_tokens, steps, Some(&path_tokens), |input, at| {
            quantized.forward(input, at)
        });
    let (ours_distance, ours_agree) = support::compare_logits(&ours, &want);
    let (candle_distance, candle_agree) = support::compare_logits(&theirs, &want);
    eprintln!(
        "{steps} greedy steps of the float reference: the kernels' logits within \
         {ours_distance:.4} on average (argmax {ours_agree}/{steps}), candle's quantized \
         llama within {candle_distance:.4} ({candle_agree}/{steps})"
    );
    // Both spike at the same uncertain steps (0.1-0.2 at a few), so the bound is on
    // the mean and against candle's rounding of the same weights.
    assert!(
        ours_distance < 0.1 && ours_distance <= 1.25 * candle_distance,
        "logits differ from the float reference by {ours_distance:.4} on average \
         (relative L2; candle's quantized llama: {candle_distance:.4})"
    );
    assert!(
        ours_agree >= steps - 1,
        "argmax agreed on {ours_agree} of {steps} steps"
    );
}
