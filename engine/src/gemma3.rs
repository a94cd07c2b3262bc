//! Gemma 3 on candle's tensors, written to match llama.cpp's graph: the backend where
//! the batch-invariant kernels (`sharemesh_kernels::llama`, the CPU default, the same
//! graph) do not run — CUDA, and `SHAREMESH_KERNELS=candle`.
//!
//! candle 0.11.1 ships `quantized_gemma3`, but its feed-forward gates with SiLU where
//! Gemma 3 uses GELU (tanh approximation), so its tokens leave llama.cpp's from the
//! second one (found with `scripts/exact-gemma3.py`). It also skips the sliding-window
//! mask when decoding one token, masks one key too few inside the window, and builds a
//! 131,072-position rope table per layer (~2.4 GB for 18 layers). This module fixes
//! those and otherwise follows the same GGUF layout:
//!
//! * embeddings scaled by √hidden; every norm is an RMS norm whose stored weight
//!   already includes Gemma's `+1`;
//! * attention: per-head RMS norms of q and k, NEOX rope, scores scaled by
//!   1/√head_dim; every sixth layer is global (rope base `rope.freq_base`), the others
//!   see the last `attention.sliding_window` positions (rope base 10,000);
//! * post-attention and post-feed-forward norms before each residual add;
//! * the output head is the token embedding (tied).
//!
//! Weights are dequantized to f32 at load, so products are exact float math: candle's
//! quantized matmul rounds activations to 8 bits per block, which moved the logits of
//! this 270M model by ~0.4 (France prompt, position 6: 18.63 against llama.cpp's 19.11
//! and a float64 pass's 19.07) and flipped greedy choices with margins up to 0.44.
//! Dequantized, logits equal the float64 pass to ~1e-4. The tied output head (262k
//! rows, most of the model) stays Q8_0 on the CPU and is multiplied block by block with
//! f32 activations (`sharemesh_kernels::dense`), which keeps that precision at a quarter of
//! the memory. The price is still memory (~670 MB resident for this 253 MB file) and
//! speed (~7–10 tok/s on one core: decoding streams ~0.6 GB per token), which the
//! kernels' Gemma removes.

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{DType, Device, IndexOp, Module, Result, Tensor};
use candle_nn::kv_cache::KvCache;
use candle_transformers::quantized_nn::RmsNorm;
use std::io::{Read, Seek};

use sharemesh_kernels::dense;
use sharemesh_kernels::llama::Gemma;

use crate::embedding::EmbeddingRows;

/// An f32 weight matrix (out × in, row-major) applied to activation rows.
struct Dense(Tensor);

impl Dense {
    /// `x`: (1, rows, in) → (1, rows, out).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (batch, rows, inner) = x.dims3()?;
        if batch * rows == 1 {
            if let Some(y) = self.matrix_vector_on_cpu(x)? {
                return Ok(y);
            }
        }
        let x = x.reshape((batch * rows, inner))?;
        x.matmul(&self.0.t()?)?.reshape((batch, rows, ()))
    }

    /// One row (decoding) on the CPU: each output is a dot product of a weight row
    /// with `x`, streaming every weight once. candle's matmul repacked the whole
    /// transposed matrix for each token instead (three quarters of decoding time).
    fn matrix_vector_on_cpu(&self, x: &Tensor) -> Result<Option<Tensor>> {
        if !self.0.device().is_cpu() || !self.0.is_contiguous() {
            return Ok(None);
        }
        let (features, inner) = self.0.dims2()?;
        let input = x.flatten_all()?.to_vec1::<f32>()?;
        let (storage, layout) = self.0.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else {
            return Ok(None);
        };
        let weights = &cpu.as_slice::<f32>()?[layout.start_offset()..][..features * inner];
        let mut out = vec![0f32; features];
        dense::matrix_vector_f32(weights, &input, &mut out);
        Tensor::from_vec(out, (1, 1, features), &Device::Cpu).map(Some)
    }
}

/// The output head: tied to the embedding, or a matrix of its own.
enum Head {
    /// The CPU reads the Q8_0 embedding itself (a quarter of the bytes of f32 weights,
    /// and no second copy), with f32 activations: [`dense::q8_0_matrix_vector`].
    TiedQ8_0,
    Dense(Dense),
}

/// KV cache growth step, in positions.
const CACHE_STEP: usize = 512;

struct Layer {
    attention_norm: RmsNorm,
    q: Dense,
    k: Dense,
    v: Dense,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    output: Dense,
    post_attention_norm: RmsNorm,
    ffn_norm: RmsNorm,
    gate: Dense,
    up: Dense,
    down: Dense,
    post_ffn_norm: RmsNorm,
    /// `None` for global layers.
    window: Option<usize>,
    rope_base: f64,
    /// Grows in steps of [`CACHE_STEP`] positions, so a token appends in place.
    cache: KvCache,
}

pub struct Gemma3 {
    /// Kept on the CPU: one row is dequantized per prompt token.
    embedding: EmbeddingRows,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: Vec<Layer>,
    norm: RmsNorm,
    head: Head,
    device: Device,
}

impl Gemma3 {
    pub fn from_gguf<R: Read + Seek>(
        ct: &gguf_file::Content,
        reader: &mut R,
        device: &Device,
    ) -> Result<Self> {
        let number = |key: &str| -> Result<f64> {
            let full = format!("gemma3.{key}");
            let value = ct
                .metadata
                .get(&full)
                .ok_or_else(|| candle_core::Error::Msg(format!("GGUF metadata lacks `{full}`")))?;
            value
                .to_u32()
                .map(f64::from)
                .or_else(|_| value.to_f32().map(f64::from))
        };
        let heads = number("attention.head_count")? as usize;
        let kv_heads = number("attention.head_count_kv")? as usize;
        let layer_count = number("block_count")? as usize;
        let hidden = number("embedding_length")? as usize;
        let head_dim = number("attention.key_length")? as usize;
        let eps = number("attention.layer_norm_rms_epsilon")?;
        let window = number("attention.sliding_window")? as usize;
        let global_rope_base = number("rope.freq_base").unwrap_or(1_000_000.0);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) || window == 0 {
            candle_core::bail!(
                "gemma3 metadata is inconsistent: {heads} heads, {kv_heads} key/value heads, window {window}"
            );
        }

        let norm = |reader: &mut R, name: &str| -> Result<RmsNorm> {
            RmsNorm::from_qtensor(ct.tensor(reader, name, device)?, eps)
        };
        // Dequantized: see the module comment.
        let matmul = |reader: &mut R, name: &str| -> Result<Dense> {
            Ok(Dense(ct.tensor(reader, name, device)?.dequantize(device)?))
        };
        let embedding = EmbeddingRows::new(
            ct.tensor(reader, "token_embd.weight", &Device::Cpu)?,
            hidden,
        )?;
        let dtype = embedding.table().dtype();
        let head = match ct.tensor_infos.contains_key("output.weight") {
            true => Head::Dense(matmul(reader, "output.weight")?),
            false if device.is_cpu() && dtype == GgmlDType::Q8_0 => Head::TiedQ8_0,
            false => Head::Dense(Dense(embedding.table().dequantize(device)?)),
        };

        let mut layers = Vec::with_capacity(layer_count);
        for index in 0..layer_count {
            let name = |part: &str| format!("blk.{index}.{part}.weight");
            let global = (index + 1) % Gemma::GEMMA3_GLOBAL_EVERY == 0;
            layers.push(Layer {
                attention_norm: norm(reader, &name("attn_norm"))?,
                q: matmul(reader, &name("attn_q"))?,
                k: matmul(reader, &name("attn_k"))?,
                v: matmul(reader, &name("attn_v"))?,
                q_norm: norm(reader, &name("attn_q_norm"))?,
                k_norm: norm(reader, &name("attn_k_norm"))?,
                output: matmul(reader, &name("attn_output"))?,
                post_attention_norm: norm(reader, &name("post_attention_norm"))?,
                ffn_norm: norm(reader, &name("ffn_norm"))?,
                gate: matmul(reader, &name("ffn_gate"))?,
                up: matmul(reader, &name("ffn_up"))?,
                down: matmul(reader, &name("ffn_down"))?,
                post_ffn_norm: norm(reader, &name("post_ffw_norm"))?,
                window: (!global).then_some(window),
                rope_base: if global {
                    global_rope_base
                } else {
                    f64::from(Gemma::GEMMA3_LOCAL_ROPE_BASE)
                },
                cache: KvCache::new(2, CACHE_STEP),
            });
        }
        Ok(Self {
            embedding,
            hidden,
            heads,
            kv_heads,
            head_dim,
            layers,
            norm: norm(reader, "output_norm.weight")?,
            head,
            device: device.clone(),
        })
    }

    pub fn clear_kv_cache(&mut self) {
        for layer in &mut self.layers {
            layer.cache.reset();
        }
    }

    /// Embeddings of `tokens`, scaled by √hidden: (1, tokens, hidden).
    fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        let rows = self.embedding.rows(tokens)?;
        let scale = (self.hidden as f64).sqrt();
        Tensor::from_vec(rows, (1, tokens.len(), self.hidden), &self.device)? * scale
    }

    /// Runs `tokens` at `position` (extending the KV cache); the last position's logits.
    pub fn forward(&mut self, tokens: &[u32], position: usize) -> Result<Tensor> {
        let count = tokens.len();
        if count == 0 {
            candle_core::bail!("no tokens to run");
        }
        let mut x = self.embed(tokens)?;
        let (heads, kv_heads, head_dim) = (self.heads, self.kv_heads, self.head_dim);
        for layer in &mut self.layers {
            let residual = x.clone();
            let h = layer.attention_norm.forward(&x)?;
            let q = layer
                .q
                .forward(&h)?
                .reshape((1, count, heads, head_dim))?
                .transpose(1, 2)?
                .contiguous()?;
            let k = layer
                .k
                .forward(&h)?
                .reshape((1, count, kv_heads, head_dim))?
                .transpose(1, 2)?
                .contiguous()?;
            let v = layer
                .v
                .forward(&h)?
                .reshape((1, count, kv_heads, head_dim))?
                .transpose(1, 2)?
                .contiguous()?;
            let q = layer.q_norm.forward(&q)?;
            let k = layer.k_norm.forward(&k)?;
            let (cos, sin) = rope_tables(position, count, head_dim, layer.rope_base, &self.device)?;
            let q = candle_nn::rotary_emb::rope(&q, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope(&k, &cos, &sin)?;
            if layer.cache.current_seq_len() != position {
                candle_core::bail!(
                    "the KV cache holds {} positions, but the tokens start at {position}",
                    layer.cache.current_seq_len()
                );
            }
            let (k, v) = layer.cache.append(&k, &v)?;
            let (k, v) = (k.contiguous()?, v.contiguous()?);
            let keys = position + count;
            // Grouped-query attention without copying keys per head: the query heads
            // of one key/value head stand as extra rows of that head's product.
            let group = heads / kv_heads;
            let q = q.reshape((1, kv_heads, group * count, head_dim))?;
            let scale = 1.0 / (head_dim as f64).sqrt();
            let mut scores = (q.matmul(&k.t()?)? * scale)?.reshape((1, heads, count, keys))?;
            if let Some(mask) = attention_mask(position, count, layer.window, &self.device)? {
                scores = scores.broadcast_add(&mask)?;
            }
            let weights = candle_nn::ops::softmax_last_dim(&scores)?.reshape((
                1,
                kv_heads,
                group * count,
                keys,
            ))?;
            let attended = weights
                .matmul(&v)?
                .reshape((1, heads, count, head_dim))?
                .transpose(1, 2)?
                .reshape((1, count, heads * head_dim))?;
            let attended = layer.output.forward(&attended)?;
            let x_mid = (layer.post_attention_norm.forward(&attended)? + residual)?;

            let h = layer.ffn_norm.forward(&x_mid)?;
            let gated = (layer.gate.forward(&h)?.gelu()? * layer.up.forward(&h)?)?;
            let ffn = layer.down.forward(&gated)?;
            x = (layer.post_ffn_norm.forward(&ffn)? + x_mid)?;
        }
        let last = x.i((.., count - 1, ..))?;
        let last = self.norm.forward(&last)?;
        match &self.head {
            Head::Dense(dense) => dense
                .forward(&last.unsqueeze(1)?)?
                .squeeze(1)?
                .to_dtype(DType::F32),
            Head::TiedQ8_0 => {
                let data = self.embedding.table().data()?;
                let x = last.flatten_all()?.to_vec1::<f32>()?;
                let vocab = data.len() / (self.embedding.row_bytes().max(1));
                let mut logits = vec![0f32; vocab];
                dense::q8_0_matrix_vector(&data, &x, &mut logits);
                Tensor::from_vec(logits, (1, vocab), &self.device)
            }
        }
    }
}

/// cos and sin for positions `start..start + count`: (count, head_dim / 2), computed
/// in f64 like llama.cpp's per-position theta (no table for the whole context).
fn rope_tables(
    start: usize,
    count: usize,
    head_dim: usize,
    base: f64,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(count * half);
    let mut sin = Vec::with_capacity(count * half);
    for position in start..start + count {
        for i in 0..half {
            let angle = position as f64 * base.powf(-2.0 * i as f64 / head_dim as f64);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    Ok((
        Tensor::from_vec(cos, (count, half), device)?,
        Tensor::from_vec(sin, (count, half), device)?,
    ))
}

/// Additive mask (count, start + count): a query at position p sees keys at positions
/// k ≤ p, and for sliding layers only those with p − k < window (llama.cpp's rule).
/// `None` where nothing is masked (one token and the window holds every key).
fn attention_mask(
    start: usize,
    count: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let keys = start + count;
    let slides_out = window.is_some_and(|w| keys > w);
    if count == 1 && !slides_out {
        return Ok(None);
    }
    let mut mask = Vec::with_capacity(count * keys);
    for query in start..start + count {
        for key in 0..keys {
            let visible = key <= query && window.is_none_or(|w| query - key < w);
            mask.push(if visible { 0f32 } else { f32::NEG_INFINITY });
        }
    }
    Tensor::from_vec(mask, (count, keys), device)
        .and_then(|m| m.reshape((1, 1, count, keys)))
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn visible(start: usize, count: usize, window: Option<usize>) -> Vec<Vec<bool>> {
        match attention_mask(start, count, window, &Device::Cpu).unwrap() {
            None => vec![vec![true; start + count]; count],
            Some(mask) => mask
                .squeeze(0)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
                .into_iter()
                .map(|row| row.into_iter().map(|v| v == 0.0).collect())
                .collect(),
        }
    }

    #[test]
    fn causal_mask_hides_later_keys() {
        let rows = visible(0, 3, None);
        assert_eq!(
            rows,
            vec![
                vec![true, false, false],
                vec![true, true, false],
                vec![true, true, true]
            ]
        );
        assert!(attention_mask(7, 1, None, &Device::Cpu).unwrap().is_none());
    }

    #[test]
    fn sliding_window_keeps_the_last_window_positions_when_decoding_too() {
        // Window 2: position 3 sees keys 2 and 3 only, in a batch or alone.
        assert_eq!(visible(3, 1, Some(2)), vec![vec![false, false, true, true]]);
        let batch = visible(0, 4, Some(2));
        assert_eq!(batch[3], vec![false, false, true, true]);
        assert_eq!(batch[1], vec![true, true, false, false]);
        // While every key is inside the window, one-token decoding needs no mask.
        assert!(attention_mask(1, 1, Some(2), &Device::Cpu)
            .unwrap()
            .is_none());
    }

    #[test]
    fn rope_tables_start_at_the_given_position() {
        let (cos, sin) = rope_tables(2, 1, 4, 10_000.0, &Device::Cpu).unwrap();
        let cos = cos.to_vec2::<f32>().unwrap();
        let sin = sin.to_vec2::<f32>().unwrap();
        assert!((cos[0][0] - 2f32.cos()).abs() < 1e-6);
        assert!((sin[0][1] - (2.0f64 * 0.01).sin() as f32).abs() < 1e-6);
    }
}
