//! Small random-weight GGUFs of the families GPU owners run, carrying the real
//! vocabulary (and chat template) from llama.cpp's own vocab files: a Llama 3.1-family
//! file (`llama-bpe`, its `rope_freqs` table and Llama 3's template) and a Qwen 2-family
//! file (`qwen2`: attention biases, NEOX rotary, Qwen's template from the vocab file).
//! No model hub is reached; the weights' values only decide which text comes out.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// Llama 3 Instruct's chat template, as Meta publishes it (the `llama-bpe` vocab file
/// carries none).
const LLAMA3_TEMPLATE: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// One family's layout.
pub struct Family {
    /// `general.architecture`.
    pub arch: &'static str,
    /// The llama.cpp vocab file (`ggml-vocab-<vocab>.gguf`).
    pub vocab: &'static str,
    pub rope_base: f32,
    pub eps: f32,
    /// q/k/v biases (Qwen 2).
    pub biases: bool,
    /// Llama 3.1's `rope_freqs` table (factor 8, low/high frequency factors 1 and 4,
    /// original context 8192).
    pub rope_freqs: bool,
    /// Used when the vocab file has no `tokenizer.chat_template`.
    pub template: Option<&'static str>,
}

pub const LLAMA3: Family = Family {
    arch: "llama",
    vocab: "llama-bpe",
    rope_base: 500_000.0,
    eps: 1e-5,
    biases: false,
    rope_freqs: true,
    template: Some(LLAMA3_TEMPLATE),
};

pub const QWEN2: Family = Family {
    arch: "qwen2",
    vocab: "qwen2",
    rope_base: 1_000_000.0,
    eps: 1e-6,
    biases: true,
    rope_freqs: false,
    template: None,
};

const HIDDEN: usize = 128;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
const FFN: usize = 256;

/// llama.cpp's vocab files, fetched into the test cache by `scripts/test`.
pub fn vocab_file(name: &str) -> PathBuf {
    let dir = std::env::var_os("SHAREMESH_TEST_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-model-cache")
        })
        .join("llama-vocab");
    let path = dir.join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/test once (it fetches llama.cpp's vocab files with \
         scripts/fetch-llama-vocab.py), or set SHAREMESH_TEST_MODEL_CACHE",
        path.display()
    );
    path
}

/// A deterministic stream of values in [-scale, scale) (a 64-bit LCG's high bits).
struct Noise(u64);

impl Noise {
    fn next(&mut self, scale: f32) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }

    /// A `rows × cols` matrix in Q8_0.
    fn matrix(&mut self, rows: usize, cols: usize, scale: f32) -> QTensor {
        let values: Vec<f32> = (0..rows * cols).map(|_| self.next(scale)).collect();
        let tensor = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
        QTensor::quantize(&tensor, GgmlDType::Q8_0).unwrap()
    }
}

fn vector(values: Vec<f32>) -> QTensor {
    let n = values.len();
    let tensor = Tensor::from_vec(values, n, &Device::Cpu).unwrap();
    QTensor::quantize(&tensor, GgmlDType::F32).unwrap()
}

/// Llama 3.1's rope frequency factors for `HEAD_DIM` (llama.cpp's converter).
fn llama31_rope_freqs(base: f32) -> Vec<f32> {
    let (factor, low, high, original) = (8.0f32, 1.0f32, 4.0f32, 8192.0f32);
    (0..HEAD_DIM / 2)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f32 / HEAD_DIM as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < original / high {
                1.0
            } else if wavelen > original / low {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// Writes `family`'s random-weight file (seeded by `seed`) to `out`.
pub fn write(family: &Family, seed: u64, out: &Path) {
    write_with_template(family, seed, out, None);
}

/// [`write`], with `template` as the file's chat template instead of the family's.
pub fn write_with_template(family: &Family, seed: u64, out: &Path, template: Option<&str>) {
    let mut vocab_reader = std::fs::File::open(vocab_file(family.vocab)).unwrap();
    let vocab = gguf_file::Content::read(&mut vocab_reader).unwrap();
    let vocab_size = match &vocab.metadata["tokenizer.ggml.tokens"] {
        Value::Array(tokens) => tokens.len(),
        other => panic!("tokenizer.ggml.tokens is {other:?}"),
    };
    let arch = family.arch;
    let mut metadata: Vec<(String, Value)> = vocab
        .metadata
        .iter()
        .filter(|(key, _)| key.starts_with("tokenizer."))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    // A template given replaces the vocab file's; the family's fills in where it has none.
    let has_own = vocab.metadata.contains_key("tokenizer.chat_template");
    if let Some(template) = template.or(family.template.filter(|_| !has_own)) {
        metadata.retain(|(key, _)| key != "tokenizer.chat_template");
        metadata.push((
            "tokenizer.chat_template".into(),
            Value::String(template.into()),
        ));
    }
    let u32_value = |v: usize| Value::U32(v as u32);
    metadata.extend([
        ("general.architecture".into(), Value::String(arch.into())),
        (
            "general.name".into(),
            Value::String(format!("random-weight {arch} ({})", family.vocab)),
        ),
        (format!("{arch}.context_length"), u32_value(2048)),
        (format!("{arch}.embedding_length"), u32_value(HIDDEN)),
        (format!("{arch}.block_count"), u32_value(LAYERS)),
        (format!("{arch}.feed_forward_length"), u32_value(FFN)),
        (format!("{arch}.attention.head_count"), u32_value(HEADS)),
        (
            format!("{arch}.attention.head_count_kv"),
            u32_value(KV_HEADS),
        ),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Value::F32(family.eps),
        ),
        (
            format!("{arch}.rope.freq_base"),
            Value::F32(family.rope_base),
        ),
        (format!("{arch}.rope.dimension_count"), u32_value(HEAD_DIM)),
    ]);

    let mut noise = Noise(seed);
    let kv = HEAD_DIM * KV_HEADS;
    let mut tensors: Vec<(String, QTensor)> = vec![
        (
            "token_embd.weight".into(),
            noise.matrix(vocab_size, HIDDEN, 0.5),
        ),
        ("output_norm.weight".into(), vector(vec![1.0; HIDDEN])),
        // Untied, as in Llama 3.1 8B and Qwen 2.5 7B: a random tied output would mostly
        // pick the input token again.
        (
            "output.weight".into(),
            noise.matrix(vocab_size, HIDDEN, 0.5),
        ),
    ];
    if family.rope_freqs {
        tensors.push((
            "rope_freqs.weight".into(),
            vector(llama31_rope_freqs(family.rope_base)),
        ));
    }
    for layer in 0..LAYERS {
        let name = |part: &str| format!("blk.{layer}.{part}");
        let projection = 1.0 / (HIDDEN as f32).sqrt();
        tensors.extend([
            (name("attn_norm.weight"), vector(vec![1.0; HIDDEN])),
            (
                name("attn_q.weight"),
                noise.matrix(HIDDEN, HIDDEN, projection),
            ),
            (name("attn_k.weight"), noise.matrix(kv, HIDDEN, projection)),
            (name("attn_v.weight"), noise.matrix(kv, HIDDEN, projection)),
            (
                name("attn_output.weight"),
                noise.matrix(HIDDEN, HIDDEN, projection),
            ),
            (name("ffn_norm.weight"), vector(vec![1.0; HIDDEN])),
            (
                name("ffn_gate.weight"),
                noise.matrix(FFN, HIDDEN, projection),
            ),
            (name("ffn_up.weight"), noise.matrix(FFN, HIDDEN, projection)),
            (
                name("ffn_down.weight"),
                noise.matrix(HIDDEN, FFN, 1.0 / (FFN as f32).sqrt()),
            ),
        ]);
        if family.biases {
            tensors.extend([
                (
                    name("attn_q.bias"),
                    vector((0..HIDDEN).map(|_| noise.next(0.1)).collect()),
                ),
                (
                    name("attn_k.bias"),
                    vector((0..kv).map(|_| noise.next(0.1)).collect()),
                ),
                (
                    name("attn_v.bias"),
                    vector((0..kv).map(|_| noise.next(0.1)).collect()),
                ),
            ]);
        }
    }

    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut file = std::fs::File::create(out).unwrap();
    gguf_file::write(&mut file, &metadata, &tensors).unwrap();
}
