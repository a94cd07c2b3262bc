//! The llama family (llama, qwen2, qwen3) on candle's tensors, with a paged KV cache, so
//! the engine's continuous batching (`crate::batch`) drives it as it drives the
//! kernels: one graph generic over the device — the backend a CUDA provider serves
//! with, and `SHAREMESH_KERNELS=candle` on the CPU.
//!
//! A step takes several sequences of different lengths: the matmuls run on all their
//! rows together (candle's quantized matmuls for the GGUF types, on the device: the
//! weights are read once per step, whatever the batch), attention per sequence over its
//! own cached positions. The keys and values live in one arena per layer on the device,
//! addressed by the slots of a books-only [`KvPool::elsewhere`]: the engine's block
//! budget, prefix sharing, copy-on-write and preemption work unchanged.
//!
//! It reads what candle-transformers' `quantized_llama`/`qwen2`/`qwen3` skipped:
//! `rope_freqs` (Llama 3.1+) and linear rope scaling (`LlamaConfig::rope_scale`).
//! Rotary pairs are GGUF llama's interleaved ones, or NEOX halves for qwen2/qwen3.
//!
//! Each row's arithmetic does not depend on the rows beside it on the CPU (candle's
//! quantized matmul quantizes and multiplies row by row, attention is per sequence), so
//! a job's tokens match its solo run within a float tolerance (tested); on a GPU,
//! cuBLAS may pick other kernels for other batch sizes, which is why candle's profile
//! promises an exact replay only on the same device (`ExecutionProfile`).

use std::io::{Read, Seek};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{gguf_file, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_transformers::quantized_nn::RmsNorm;
use sharemesh_kernels::llama::{BatchEntry, KvPool, LlamaConfig, SequenceCache, BLOCK_POSITIONS};

use crate::embedding::EmbeddingRows;

mod arena;
use arena::{reserve, write_rows, Arena};

/// Bytes of one cached key or value: the arenas hold f32, as the graph computes.
const VALUE_BYTES: usize = 4;

struct Layer {
    attention_norm: RmsNorm,
    q: QMatMul,
    k: QMatMul,
    v: QMatMul,
    /// qwen2's q/k/v biases.
    biases: Option<[Tensor; 3]>,
    /// qwen3's per-head RMS norms of queries and keys, before the rotation.
    head_norms: Option<[RmsNorm; 2]>,
    output: QMatMul,
    ffn_norm: RmsNorm,
    gate: QMatMul,
    up: QMatMul,
    down: QMatMul,
}

pub struct PagedLlama {
    config: LlamaConfig,
    embedding: EmbeddingRows,
    layers: Vec<Layer>,
    norm: RmsNorm,
    output: QMatMul,
    /// Each rotary pair's angle per position (the kernels' formula: base, factors,
    /// scale).
    thetas: Vec<f32>,
    device: Device,
    vocab: usize,
    arenas: Mutex<Vec<Arena>>,
    /// The one-job cache `forward` extends (generation one job at a time, replays).
    solo: SequenceCache,
}

/// A row range of one step's activations: which sequence, from which row, how many.
struct Span {
    first_row: usize,
    tokens: usize,
    position: usize,
}

impl PagedLlama {
    /// Whether this graph runs `config` (the llama family without Gemma's parts, every
    /// head rotated whole).
    pub fn runs(config: &LlamaConfig) -> bool {
        config.gemma.is_none() && config.rope_dimensions == config.head_dim
    }

    /// Loads the tensors of a file whose configuration [`Self::runs`] accepts.
    pub fn from_gguf<R: Read + Seek>(
        ct: &gguf_file::Content,
        reader: &mut R,
        config: LlamaConfig,
        device: &Device,
    ) -> Result<Self> {
        if !Self::runs(&config) {
            candle_core::bail!("the paged candle graph does not run this configuration");
        }
        let eps = f64::from(config.norm_eps);
        let norm = |t: QTensor| RmsNorm::from_qtensor(t, eps);
        let matmul = |t: QTensor| QMatMul::from_arc(Arc::new(t));
        let table = ct.tensor(reader, "token_embd.weight", &Device::Cpu)?;
        let embedding = EmbeddingRows::new(table, config.hidden)?;
        let vocab = embedding.vocab();
        let output = match ct.tensor_infos.contains_key("output.weight") {
            true => matmul(ct.tensor(reader, "output.weight", device)?)?,
            false => matmul(ct.tensor(reader, "token_embd.weight", device)?)?,
        };
        let thetas = rope_thetas(&config, optional_vector(ct, reader, "rope_freqs.weight")?)?;
        let mut layers = Vec::with_capacity(config.layers);
        for index in 0..config.layers {
            let name = |part: &str| format!("blk.{index}.{part}");
            let mut bias = |part: &str| -> Result<Tensor> {
                ct.tensor(reader, &name(&format!("{part}.bias")), device)?
                    .dequantize(device)
            };
            let biases = match ct.tensor_infos.contains_key(&name("attn_q.bias")) {
                true => Some([bias("attn_q")?, bias("attn_k")?, bias("attn_v")?]),
                false => None,
            };
            let mut tensor =
                |part: &str| ct.tensor(reader, &name(&format!("{part}.weight")), device);
            let head_norms = match config.head_norms {
                true => Some([norm(tensor("attn_q_norm")?)?, norm(tensor("attn_k_norm")?)?]),
                false => None,
            };
            layers.push(Layer {
                attention_norm: norm(tensor("attn_norm")?)?,
                q: matmul(tensor("attn_q")?)?,
                k: matmul(tensor("attn_k")?)?,
                v: matmul(tensor("attn_v")?)?,
                biases,
                head_norms,
                output: matmul(tensor("attn_output")?)?,
                ffn_norm: norm(tensor("ffn_norm")?)?,
                gate: matmul(tensor("ffn_gate")?)?,
                up: matmul(tensor("ffn_up")?)?,
                down: matmul(tensor("ffn_down")?)?,
            });
        }
        let solo_pool = Self::pool_for(&config, KvPool::blocks_for(config.context));
        Ok(Self {
            norm: norm(ct.tensor(reader, "output_norm.weight", device)?)?,
            solo: solo_pool.new_sequence(),
            config,
            embedding,
            layers,
            output,
            thetas,
            device: device.clone(),
            vocab,
            arenas: Mutex::new(Vec::new()),
        })
    }

    fn pool_for(config: &LlamaConfig, blocks: usize) -> KvPool {
        let blocks = blocks.min(u32::MAX as usize);
        KvPool::elsewhere(
            config.layers,
            config.kv_heads,
            config.head_dim,
            VALUE_BYTES,
            blocks,
        )
    }

    /// A pool of at most `blocks` KV blocks for this model's sequences (their values in
    /// this model's arenas on its device).
    pub fn kv_pool(&self, blocks: usize) -> KvPool {
        Self::pool_for(&self.config, blocks)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Empties the one-job cache.
    pub fn reset(&mut self) {
        self.solo.truncate(0);
    }

    /// Runs `tokens` at `position` on the one-job cache (dropping what it held past
    /// `position`); the logits of the last `rows` tokens, row after row.
    pub fn forward(&mut self, tokens: &[u32], position: usize, rows: usize) -> Result<Vec<f32>> {
        if position > self.solo.positions() {
            candle_core::bail!(
                "the KV cache holds {} positions, but the tokens start at {position}",
                self.solo.positions()
            );
        }
        self.solo.truncate(position);
        let placeholder = self.kv_pool(0).new_sequence();
        let mut solo = std::mem::replace(&mut self.solo, placeholder);
        let mut entry = [BatchEntry {
            cache: &mut solo,
            tokens,
            position,
        }];
        let outcome = self.forward_batch_rows(&mut entry, rows);
        self.solo = solo;
        outcome.map(|mut logits| logits.remove(0))
    }

    /// One step of several sequences together (each entry's `position` equal to its
    /// cache's length, its cache from [`Self::kv_pool`]): extends every cache and
    /// returns each entry's logits after its last token, in `batch` order. A failed
    /// check or a full pool fails the whole step before any cache changes.
    pub fn forward_batch(&self, batch: &mut [BatchEntry<'_>]) -> Result<Vec<Vec<f32>>> {
        self.forward_batch_rows(batch, 1)
    }

    /// [`Self::forward_batch`] with the logits of each entry's last `rows` tokens.
    fn forward_batch_rows(
        &self,
        batch: &mut [BatchEntry<'_>],
        rows: usize,
    ) -> Result<Vec<Vec<f32>>> {
        for entry in batch.iter() {
            self.check_entry(entry, rows)?;
        }
        let copies = reserve(batch)?;
        let mut arenas = self.arenas.lock().unwrap_or_else(|e| e.into_inner());
        let pool = batch.first().map(|e| e.cache.pool().clone());
        let Some(pool) = pool else {
            return Ok(Vec::new());
        };
        let arena = self.arena(&mut arenas, &pool, batch)?;
        for copy in copies {
            arena.copy_block(copy)?;
        }
        let logits = self.run(arena, batch, rows)?;
        for entry in batch.iter_mut() {
            entry.cache.advance(entry.tokens.len());
        }
        Ok(logits)
    }

    fn check_entry(&self, entry: &BatchEntry<'_>, rows: usize) -> Result<()> {
        let tokens = entry.tokens;
        if tokens.is_empty() || rows == 0 || rows > tokens.len() {
            candle_core::bail!("{rows} logit rows asked of {} tokens", tokens.len());
        }
        let pool = entry.cache.pool();
        let shape = (
            self.config.layers,
            self.config.kv_heads,
            self.config.head_dim,
        );
        if !pool.is_elsewhere() || pool.shape() != shape {
            candle_core::bail!("a KV cache made for another model or backend");
        }
        if entry.position != entry.cache.positions() {
            candle_core::bail!(
                "the KV cache holds {} positions, but the tokens start at {}",
                entry.cache.positions(),
                entry.position
            );
        }
        if entry.position + tokens.len() > self.config.context {
            candle_core::bail!(
                "{} positions exceed the model's context of {}",
                entry.position + tokens.len(),
                self.config.context
            );
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            candle_core::bail!(
                "token id {token} is outside the vocabulary of {}",
                self.vocab
            );
        }
        Ok(())
    }

    /// The arena of `pool` (every entry's), made or grown to hold every slot the
    /// entries' caches hold.
    fn arena<'a>(
        &self,
        arenas: &'a mut Vec<Arena>,
        pool: &KvPool,
        batch: &[BatchEntry<'_>],
    ) -> Result<&'a mut Arena> {
        if batch.iter().any(|e| !e.cache.pool().same(pool)) {
            candle_core::bail!("one step's sequences must share a KV pool");
        }
        // Arenas of pools nobody else holds any more are dropped with them.
        arenas.retain(|a| a.pool.held_elsewhere() || a.pool.same(pool));
        let index = match arenas.iter().position(|a| a.pool.same(pool)) {
            Some(index) => index,
            None => {
                arenas.push(Arena {
                    pool: pool.clone(),
                    keys: Vec::new(),
                    values: Vec::new(),
                });
                arenas.len() - 1
            }
        };
        let slots = batch
            .iter()
            .flat_map(|e| e.cache.slots())
            .max()
            .unwrap_or(0) as usize;
        let arena = &mut arenas[index];
        arena.grow((slots + 1) * BLOCK_POSITIONS, &self.config, &self.device)?;
        Ok(arena)
    }

    /// The forward pass of one step; the logits of each entry's last `rows` tokens.
    fn run(&self, arena: &Arena, batch: &[BatchEntry<'_>], rows: usize) -> Result<Vec<Vec<f32>>> {
        let mut spans = Vec::with_capacity(batch.len());
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        for entry in batch {
            spans.push(Span {
                first_row: tokens.len(),
                tokens: entry.tokens.len(),
                position: entry.position,
            });
            tokens.extend_from_slice(entry.tokens);
            positions.extend(entry.position..entry.position + entry.tokens.len());
        }
        let (cos, sin) = self.rope_tables(&positions)?;
        // Per entry: the arena rows of all its positions (cached and new), in order.
        let gathers = batch
            .iter()
            .map(|e| {
                let slots = e.cache.slots();
                let rows: Vec<u32> = (0..e.position + e.tokens.len())
                    .map(|p| {
                        slots[p / BLOCK_POSITIONS] * BLOCK_POSITIONS as u32
                            + (p % BLOCK_POSITIONS) as u32
                    })
                    .collect();
                let count = rows.len();
                Tensor::from_vec(rows, count, &self.device)
            })
            .collect::<Result<Vec<_>>>()?;
        let count = tokens.len();
        let mut x = Tensor::from_vec(
            self.embedding.rows(&tokens)?,
            (1, count, self.config.hidden),
            &self.device,
        )?;
        for (index, layer) in self.layers.iter().enumerate() {
            let h = layer.attention_norm.forward(&x)?;
            let (q, k, v) = self.attend_inputs(layer, &h, &cos, &sin)?;
            let (keys, values) = (&arena.keys[index], &arena.values[index]);
            let mut attended = Vec::with_capacity(batch.len());
            for ((span, entry), gather) in spans.iter().zip(batch).zip(&gathers) {
                let k_new = k.narrow(0, span.first_row, span.tokens)?;
                let v_new = v.narrow(0, span.first_row, span.tokens)?;
                write_rows(keys, &k_new, entry.cache, span.position)?;
                write_rows(values, &v_new, entry.cache, span.position)?;
                let q_span = q.narrow(2, span.first_row, span.tokens)?.contiguous()?;
                attended.push(self.attend(&q_span, keys, values, gather, span)?);
            }
            let attended = Tensor::cat(&attended, 0)?.unsqueeze(0)?;
            x = (x + layer.output.forward(&attended)?)?;
            let h = layer.ffn_norm.forward(&x)?;
            let gated =
                (candle_nn::ops::silu(&layer.gate.forward(&h)?)? * layer.up.forward(&h)?)?;
            x = (x + layer.down.forward(&gated)?)?;
        }
        let last: Vec<u32> = spans
            .iter()
            .flat_map(|s| (s.first_row + s.tokens - rows..s.first_row + s.tokens).map(|r| r as u32))
            .collect();
        let picked = last.len();
        let last = Tensor::from_vec(last, picked, &self.device)?;
        let x = x.squeeze(0)?.index_select(&last, 0)?;
        let logits = self.output.forward(&self.norm.forward(&x)?.unsqueeze(0)?)?;
        let logits = logits
            .squeeze(0)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(logits
            .chunks(rows * self.vocab)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// Queries (1, heads, rows, head) and the new keys and values (rows, KV width), the
    /// queries and keys normed (qwen3) and rotated at each row's position.
    fn attend_inputs(
        &self,
        layer: &Layer,
        h: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let c = &self.config;
        let rows = h.dim(1)?;
        let mut q = layer.q.forward(h)?;
        let mut k = layer.k.forward(h)?;
        let mut v = layer.v.forward(h)?;
        if let Some([qb, kb, vb]) = &layer.biases {
            q = q.broadcast_add(qb)?;
            k = k.broadcast_add(kb)?;
            v = v.broadcast_add(vb)?;
        }
        let heads = |t: Tensor, count: usize| -> Result<Tensor> {
            t.reshape((1, rows, count, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (mut q, mut k) = (heads(q, c.heads)?, heads(k, c.kv_heads)?);
        if let Some([q_norm, k_norm]) = &layer.head_norms {
            q = q_norm.forward(&q)?;
            k = k_norm.forward(&k)?;
        }
        let rotate = |t: &Tensor| match c.neox_rope {
            true => candle_nn::rotary_emb::rope(t, cos, sin),
            false => candle_nn::rotary_emb::rope_i(t, cos, sin),
        };
        let (q, k) = (rotate(&q)?, rotate(&k)?);
        let k = k
            .transpose(1, 2)?
            .reshape((rows, c.kv_width()))?
            .contiguous()?;
        let v = v.reshape((rows, c.kv_width()))?.contiguous()?;
        Ok((q, k, v))
    }

    /// Attention of one sequence's new rows over all its positions: (rows, q width).
    fn attend(
        &self,
        q: &Tensor,
        keys: &Tensor,
        values: &Tensor,
        gather: &Tensor,
        span: &Span,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (count, seen) = (span.tokens, span.position + span.tokens);
        let per_head = |t: &Tensor| -> Result<Tensor> {
            t.index_select(gather, 0)?
                .reshape((seen, c.kv_heads, c.head_dim))?
                .transpose(0, 1)?
                .contiguous()?
                .unsqueeze(0)
        };
        let (k, v) = (per_head(keys)?, per_head(values)?);
        // Grouped-query attention without copying keys per head: the query heads of
        // one KV head stand as extra rows of that head's product.
        let group = c.heads / c.kv_heads;
        let q = q.reshape((1, c.kv_heads, group * count, c.head_dim))?;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let mut scores = (q.matmul(&k.t()?)? * scale)?.reshape((1, c.heads, count, seen))?;
        if count > 1 {
            scores = scores.broadcast_add(&causal_mask(span.position, count, &self.device)?)?;
        }
        let weights = candle_nn::ops::softmax_last_dim(&scores)?.reshape((
            1,
            c.kv_heads,
            group * count,
            seen,
        ))?;
        weights
            .matmul(&v)?
            .reshape((1, c.heads, count, c.head_dim))?
            .transpose(1, 2)?
            .reshape((count, c.q_width()))
    }

    /// cos and sin of every rotary pair's angle at each row's position: (rows, head / 2).
    fn rope_tables(&self, positions: &[usize]) -> Result<(Tensor, Tensor)> {
        let half = self.thetas.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for theta in &self.thetas {
                let angle = p as f32 * theta;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        Ok((
            Tensor::from_vec(cos, (positions.len(), half), &self.device)?,
            Tensor::from_vec(sin, (positions.len(), half), &self.device)?,
        ))
    }
}

/// Additive causal mask (1, 1, count, start + count): the query at `start + i` sees the
/// keys up to its own position.
fn causal_mask(start: usize, count: usize, device: &Device) -> Result<Tensor> {
    let keys = start + count;
    let mask: Vec<f32> = (0..count)
        .flat_map(|i| {
            (0..keys).map(move |k| {
                if k <= start + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (1, 1, count, keys), device)
}

/// Each rotary pair's angle per position: `base^(−2i/d)`, divided by the pair's
/// `rope_freqs` factor where the file has them, times the linear scale.
fn rope_thetas(config: &LlamaConfig, factors: Option<Vec<f32>>) -> Result<Vec<f32>> {
    let dims = config.rope_dimensions;
    if let Some(f) = &factors {
        if f.len() != dims / 2 {
            candle_core::bail!(
                "rope_freqs.weight has {} factors for {} pairs",
                f.len(),
                dims / 2
            );
        }
    }
    Ok((0..dims / 2)
        .map(|pair| {
            let theta = 1f32 / config.rope_base.powf(2.0 * pair as f32 / dims as f32);
            factors.as_ref().map_or(theta, |f| theta / f[pair]) * config.rope_scale
        })
        .collect())
}

fn optional_vector<R: Read + Seek>(
    ct: &gguf_file::Content,
    reader: &mut R,
    name: &str,
) -> Result<Option<Vec<f32>>> {
    if !ct.tensor_infos.contains_key(name) {
        return Ok(None);
    }
    let tensor = ct
        .tensor(reader, name, &Device::Cpu)?
        .dequantize(&Device::Cpu)?;
    tensor.flatten_all()?.to_vec1::<f32>().map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_causal_mask_lets_each_row_see_up_to_its_own_position() {
        let mask = causal_mask(2, 2, &Device::Cpu).unwrap();
        let rows = mask
            .squeeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let visible: Vec<Vec<bool>> = rows
            .iter()
            .map(|r| r.iter().map(|v| *v == 0.0).collect())
            .collect();
        assert_eq!(
            visible,
            [[true, true, true, false], [true, true, true, true]]
        );
    }
}
