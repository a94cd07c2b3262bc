//! The llama-family forward pass (SmolLM2 and other GGUF `llama` models, and `qwen2`:
//! llama with q/k/v biases and the NEOX rotary layout) on the quantized kernels, with
//! an f32 KV cache.
//!
//! Batch invariant: every step is per row (norms, activation quantization, each matmul
//! element, rotary embedding, residuals) or per (row, head) with the attention length
//! set by the row's absolute position, so prefilling tokens together gives the same
//! bits, logits and cache as feeding them one at a time.

use std::sync::Arc;

use crate::blocks::BlockType;
use crate::dot::Isa;
use crate::ops::rms_norm;
use crate::quant::Matrix;
use crate::KernelError;

/// Hyper-parameters, from the GGUF's `llama.*` (or `qwen2.*`) metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Rotary pairs are (i, i + half) within a head (qwen2's NEOX layout) rather than
    /// (2i, 2i + 1) (GGUF llama, whose converter interleaved the q/k rows). The loader
    /// puts NEOX q/k rows (and biases) in the interleaved order, which rotates the same
    /// pairs and leaves every q·k product's terms as they were, only summed in another
    /// order.
    pub neox_rope: bool,
    pub hidden: usize,
    pub feed_forward: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub rope_dimensions: usize,
    pub rope_base: f32,
    pub norm_eps: f32,
    pub context: usize,
}

impl LlamaConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    fn validate(&self) -> Result<(), KernelError> {
        let bad = |m: &str| Err(KernelError::BadConfig(m.to_owned()));
        if self.heads == 0 || self.kv_heads == 0 || !self.hidden.is_multiple_of(self.heads) {
            return bad("head counts must be positive and divide the embedding length");
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad("attention heads must be a multiple of the KV heads");
        }
        if self.rope_dimensions != self.head_dim() || !self.head_dim().is_multiple_of(2) {
            return bad("rotary dimensions must equal the (even) head dimension");
        }
        if self.context == 0 || self.layers == 0 {
            return bad("context length and block count must be positive");
        }
        Ok(())
    }
}

/// Element type of a tensor as stored in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawFormat {
    F32,
    F16,
    Quantized(BlockType),
    Other(String),
}

/// A tensor's bytes as read from the file; `dims` outermost first (rows, then columns).
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub format: RawFormat,
    pub dims: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// qwen2's biases of the q, k and v projections.
struct QkvBias {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// A tensor by name from the file: `Ok(None)` when the file lacks it.
pub type Fetched = Result<Option<RawTensor>, KernelError>;

struct Layer {
    attention_norm: Vec<f32>,
    bias: Option<QkvBias>,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    wo: Matrix,
    ffn_norm: Vec<f32>,
    gate: Matrix,
    up: Matrix,
    down: Matrix,
}

mod batch;
mod kv;

pub use batch::BatchEntry;
pub use kv::{KvBlock, KvPool, SequenceCache, BLOCK_POSITIONS};

pub struct Llama {
    config: LlamaConfig,
    /// Each rotary pair's angle per position ([`rope_thetas`]).
    rope_thetas: Vec<f32>,
    embeddings: Matrix,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    /// `None`: the output projection is tied to the embeddings.
    output: Option<Matrix>,
    /// The sequence [`Self::forward`] continues (batched decoding brings its own).
    cache: SequenceCache,
    isa: Isa,
    pool: Arc<rayon::ThreadPool>,
}

fn vector(name: &str, raw: RawTensor, len: usize) -> Result<Vec<f32>, KernelError> {
    let values: Vec<f32> = match raw.format {
        RawFormat::F32 => raw
            .bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        RawFormat::F16 => raw
            .bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(KernelError::UnsupportedFormat {
                name: name.to_owned(),
                format: format!("{other:?}"),
            })
        }
    };
    if values.len() != len {
        return Err(KernelError::BadTensor {
            name: name.to_owned(),
            problem: format!("{} values, expected {len}", values.len()),
        });
    }
    Ok(values)
}

fn matrix(name: &str, raw: RawTensor, rows: usize, cols: usize) -> Result<Matrix, KernelError> {
    let RawFormat::Quantized(block_type) = raw.format else {
        return Err(KernelError::UnsupportedFormat {
            name: name.to_owned(),
            format: format!("{:?}", raw.format),
        });
    };
    if raw.dims != [rows, cols] {
        return Err(KernelError::BadTensor {
            name: name.to_owned(),
            problem: format!("shape {:?}, expected [{rows}, {cols}]", raw.dims),
        });
    }
    Matrix::new(name, block_type, rows, cols, raw.bytes)
}

impl Llama {
    /// Builds the model from `tensor(name)` (`Ok(None)` when the file lacks it).
    /// `threads` sizes the pool every forward pass runs on.
    pub fn load(
        config: LlamaConfig,
        threads: usize,
        mut tensor: impl FnMut(&str) -> Fetched,
    ) -> Result<Self, KernelError> {
        config.validate()?;
        let required = |tensor: &mut dyn FnMut(&str) -> Fetched, name: &str| {
            tensor(name)?.ok_or_else(|| KernelError::BadTensor {
                name: name.to_owned(),
                problem: "missing from the file".into(),
            })
        };
        let (hidden, ffn) = (config.hidden, config.feed_forward);
        let kv_width = config.kv_heads * config.head_dim();
        let raw_embeddings = required(&mut tensor, "token_embd.weight")?;
        let vocab = raw_embeddings.dims.first().copied().unwrap_or(0);
        let embeddings = matrix("token_embd.weight", raw_embeddings, vocab, hidden)?;
        let mut layers = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            let mut m = |part: &str, rows, cols| {
                let name = format!("blk.{i}.{part}.weight");
                matrix(&name, required(&mut tensor, &name)?, rows, cols)
            };
            let (mut wq, mut wk, wv, wo) = (
                m("attn_q", hidden, hidden)?,
                m("attn_k", kv_width, hidden)?,
                m("attn_v", kv_width, hidden)?,
                m("attn_output", hidden, hidden)?,
            );
            let (gate, up, down) = (
                m("ffn_gate", ffn, hidden)?,
                m("ffn_up", ffn, hidden)?,
                m("ffn_down", hidden, ffn)?,
            );
            // None or all three (a file with some would otherwise run without them).
            let mut b = |part: &str, len| {
                let name = format!("blk.{i}.{part}.bias");
                tensor(&name)?
                    .map(|raw| vector(&name, raw, len))
                    .transpose()
            };
            let mut bias = match (
                b("attn_q", hidden)?,
                b("attn_k", kv_width)?,
                b("attn_v", kv_width)?,
            ) {
                (None, None, None) => None,
                (Some(q), Some(k), Some(v)) => Some(QkvBias { q, k, v }),
                _ => {
                    return Err(KernelError::BadTensor {
                        name: format!("blk.{i}.attn_q/k/v.bias"),
                        problem: "some of the q, k and v biases are missing".into(),
                    })
                }
            };
            if config.neox_rope {
                let head_dim = config.head_dim();
                let q_order = interleaved_order(config.heads, head_dim);
                let k_order = interleaved_order(config.kv_heads, head_dim);
                wq = wq.with_rows_from(&q_order);
                wk = wk.with_rows_from(&k_order);
                if let Some(bias) = bias.as_mut() {
                    bias.q = q_order.iter().map(|&from| bias.q[from]).collect();
                    bias.k = k_order.iter().map(|&from| bias.k[from]).collect();
                }
            }
            let mut v = |part: &str| {
                let name = format!("blk.{i}.{part}.weight");
                vector(&name, required(&mut tensor, &name)?, hidden)
            };
            let (attention_norm, ffn_norm) = (v("attn_norm")?, v("ffn_norm")?);
            layers.push(Layer {
                attention_norm,
                bias,
                wq,
                wk,
                wv,
                wo,
                ffn_norm,
                gate,
                up,
                down,
            });
        }
        let output_norm = vector(
            "output_norm.weight",
            required(&mut tensor, "output_norm.weight")?,
            hidden,
        )?;
        let rope_factors = match tensor("rope_freqs.weight")? {
            Some(raw) => Some(vector(
                "rope_freqs.weight",
                raw,
                config.rope_dimensions / 2,
            )?),
            None => None,
        };
        let rope_thetas = rope_thetas(&config, rope_factors.as_deref());
        let output = match tensor("output.weight")? {
            Some(raw) => Some(matrix("output.weight", raw, vocab, hidden)?),
            None => None,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("sharemesh-kernel-{i}"))
            .build()
            .map_err(|e| KernelError::ThreadPool(e.to_string()))?;
        let pool = Arc::new(pool);
        Ok(Self {
            cache: KvPool::new(
                config.layers,
                config.kv_heads * config.head_dim(),
                usize::MAX,
            )
            .new_sequence(),
            config,
            rope_thetas,
            embeddings,
            layers,
            output_norm,
            output,
            isa: Isa::detect(),
            pool,
        })
    }

    /// Testnet adversary kit only: drops the last `count` layers, so the model runs
    /// cheaper and answers worse under its honest name (a verifier must catch it).
    pub fn drop_last_layers(&mut self, count: usize) -> Result<(), KernelError> {
        if count >= self.layers.len() {
            return Err(KernelError::BadConfig(format!(
                "cannot drop {count} of {} layers",
                self.layers.len()
            )));
        }
        self.reset();
        let keep = self.layers.len() - count;
        self.layers.truncate(keep);
        self.cache = self.new_sequence();
        Ok(())
    }

    pub fn vocab_size(&self) -> usize {
        self.embeddings.rows
    }

    /// Empties the KV cache.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Keeps the first `positions` cached positions and drops the rest, so a job that
    /// shares a prefix with the previous one continues from there (exact: the cache of a
    /// prefix does not depend on what followed it).
    pub fn truncate(&mut self, positions: usize) {
        self.cache.truncate(positions);
    }

    /// Runs `tokens` at `position` (which must equal the cached length), extends the
    /// cache, and returns the logits of the last token.
    pub fn forward(&mut self, tokens: &[u32], position: usize) -> Result<Vec<f32>, KernelError> {
        self.forward_rows(tokens, position, 1)
    }

    /// [`Self::forward`], returning the logits of the last `rows` tokens (row after
    /// row, `rows × vocab`): a verifier's teacher-forced replay scores every step of
    /// a job in one pass, and batch invariance makes each row the bits decoding gave.
    pub fn forward_rows(
        &mut self,
        tokens: &[u32],
        position: usize,
        rows: usize,
    ) -> Result<Vec<f32>, KernelError> {
        let empty = self.cache.pool().new_sequence();
        let mut cache = std::mem::replace(&mut self.cache, empty);
        let result = self
            .forward_batch_rows(
                &mut [BatchEntry {
                    cache: &mut cache,
                    tokens,
                    position,
                }],
                rows,
            )
            .map(|mut logits| logits.pop().unwrap_or_default());
        self.cache = cache;
        result
    }
}

/// For `heads` heads of `head_dim` rows in NEOX order (pair k: rows k and k + half),
/// the row each interleaved row (pair k: rows 2k and 2k + 1) comes from.
fn interleaved_order(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    (0..heads * head_dim)
        .map(|row| {
            let (head, within) = (row / head_dim, row % head_dim);
            head * head_dim + (within % 2) * half + within / 2
        })
        .collect()
}

/// Each rotary pair's angle per position: `base^(−2i/d)`, divided by the file's
/// `rope_freqs.weight` factor for pair `i` where it has one (Llama 3.1+ files scale
/// long wavelengths so, as llama.cpp's `freq_factors`).
fn rope_thetas(c: &LlamaConfig, factors: Option<&[f32]>) -> Vec<f32> {
    let dims = c.rope_dimensions;
    (0..dims)
        .step_by(2)
        .enumerate()
        .map(|(pair, i)| {
            let theta = 1f32 / c.rope_base.powf(i as f32 / dims as f32);
            factors.map_or(theta, |f| theta / f[pair])
        })
        .collect()
}

/// cos and sin of every rotary pair's angle at each of `positions`.
fn rope_angles(thetas: &[f32], positions: &[usize]) -> Vec<(Vec<f32>, Vec<f32>)> {
    positions
        .iter()
        .map(|&p| {
            let angles: Vec<f32> = thetas.iter().map(|t| p as f32 * t).collect();
            (
                angles.iter().map(|a| a.cos()).collect(),
                angles.iter().map(|a| a.sin()).collect(),
            )
        })
        .collect()
}

fn norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    for (row, out_row) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        rms_norm(row, weight, eps, out_row);
    }
}

/// Adds `bias` to every row of `x` (rows of `bias.len()`).
fn add_to_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add(row, bias);
    }
}

fn add(x: &mut [f32], delta: &[f32]) {
    for (a, b) in x.iter_mut().zip(delta) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LlamaConfig {
        LlamaConfig {
            neox_rope: false,
            hidden: 64,
            feed_forward: 128,
            layers: 1,
            heads: 4,
            kv_heads: 2,
            rope_dimensions: 16,
            rope_base: 500_000.0,
            norm_eps: 1e-5,
            context: 128,
        }
    }

    #[test]
    fn rope_frequency_factors_divide_each_pairs_angle() {
        let c = config();
        let plain = rope_thetas(&c, None);
        assert_eq!(plain.len(), 8);
        for (i, theta) in plain.iter().enumerate() {
            let want = 1f32 / 500_000f32.powf((2 * i) as f32 / 16.0);
            assert_eq!(theta.to_bits(), want.to_bits(), "pair {i}");
        }
        let factors: Vec<f32> = (0..8).map(|i| if i < 4 { 1.0 } else { 8.0 }).collect();
        let scaled = rope_thetas(&c, Some(&factors));
        for i in 0..8 {
            assert_eq!(scaled[i], plain[i] / factors[i], "pair {i}");
        }
        // A factor of one changes no bit: files without long-context scaling are as before.
        assert_eq!(rope_thetas(&c, Some(&[1.0; 8])), plain);
    }

    /// A tiny all-zero model's tensors (Q8_0 matrices, F32 vectors), with the q/k/v
    /// biases `biases` names.
    fn tiny_tensor(name: &str, biases: &[&str]) -> Fetched {
        let c = config();
        let kv = c.kv_heads * c.head_dim();
        let quantized = |rows: usize, cols: usize| RawTensor {
            format: RawFormat::Quantized(BlockType::Q8_0),
            dims: vec![rows, cols],
            bytes: vec![0; rows * cols / 32 * 34],
        };
        let floats = |len: usize| RawTensor {
            format: RawFormat::F32,
            dims: vec![len],
            bytes: vec![0; len * 4],
        };
        let part = name.split('.').nth(2).unwrap_or("");
        Ok(Some(match (name, part) {
            ("token_embd.weight", _) => quantized(32, c.hidden),
            ("output_norm.weight", _) | (_, "attn_norm" | "ffn_norm") => floats(c.hidden),
            (_, "attn_q" | "attn_output") if name.ends_with(".weight") => {
                quantized(c.hidden, c.hidden)
            }
            (_, "attn_k" | "attn_v") if name.ends_with(".weight") => quantized(kv, c.hidden),
            (_, "ffn_gate" | "ffn_up") => quantized(c.feed_forward, c.hidden),
            (_, "ffn_down") => quantized(c.hidden, c.feed_forward),
            (_, "attn_q") if biases.contains(&"q") => floats(c.hidden),
            (_, "attn_k") if biases.contains(&"k") => floats(kv),
            (_, "attn_v") if biases.contains(&"v") => floats(kv),
            _ => return Ok(None),
        }))
    }

    #[test]
    fn q_k_v_biases_come_all_three_or_not_at_all() {
        for (biases, loads) in [(&[][..], true), (&["q", "k", "v"][..], true)] {
            let model = Llama::load(config(), 1, |name| tiny_tensor(name, biases));
            assert_eq!(model.is_ok(), loads, "{biases:?}");
        }
        for biases in [&["q"][..], &["k", "v"][..], &["q", "v"][..]] {
            let Err(err) = Llama::load(config(), 1, |name| tiny_tensor(name, biases)) else {
                panic!("{biases:?} loaded");
            };
            assert!(err.to_string().contains("biases are missing"), "{err}");
        }
    }

    #[test]
    fn qwen2_rows_go_back_to_interleaved_pairs() {
        // Head of 8: NEOX pairs (k, k + 4); interleaved pairs (2k, 2k + 1).
        let order = interleaved_order(2, 8);
        assert_eq!(order[..8], [0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(order[8..], [8, 12, 9, 13, 10, 14, 11, 15]);
    }
}
