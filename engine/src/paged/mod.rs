//! The llama family (llama, qwen2, qwen3) and Gemma (2 and 3) on candle's tensors,
//! with a paged KV cache, so the engine's continuous batching (`crate::batch`) drives it
//! as it drives the kernels: one graph generic over the device — the backend a CUDA
//! provider serves with, and `SHAREMESH_KERNELS=candle` on the CPU.
//!
//! A step takes several sequences of different lengths: each matrix multiplies all
//! their rows together (the weights are read once per step, whatever the batch),
//! attention runs per sequence over its own cached positions. The keys and values live
//! in one arena per layer on the device, addressed by the slots of a books-only
//! [`KvPool::elsewhere`]: the engine's block budget, copy-on-write and preemption work
//! unchanged.
//!
//! It reads what candle-transformers' `quantized_llama`/`qwen2`/`qwen3` skipped:
//! `rope_freqs` (Llama 3.1+) and linear rope scaling (`LlamaConfig::rope_scale`).
//! Rotary pairs are GGUF llama's interleaved ones, or NEOX halves for the others. Gemma
//! is llama.cpp's graph, as the kernels run it (`LlamaConfig::gemma`): embeddings
//! × √hidden, q/k norms (3), GELU, post-norms, sliding-window layers with their own
//! rotary base, soft caps (2); candle 0.11's own `quantized_gemma3` gates with SiLU and
//! masks the window wrongly.
//!
//! A row's arithmetic does not depend on the other sequences' rows on the CPU (candle's
//! quantized matmul quantizes and multiplies row by row, attention is per sequence), but
//! it does on how a sequence's own positions are split into steps (attention's
//! products round otherwise for other row counts): the engine feeds these jobs as the
//! single-job path does (`crate::batch::BatchModel::invariant`). On a GPU, cuBLAS picks
//! other kernels for other batch sizes, which is why candle's profile promises an exact
//! replay only on the CPU (`ExecutionProfile::replays_exactly`).

use std::io::{Read, Seek};
use std::sync::Mutex;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Module, Result, Tensor};
use candle_transformers::quantized_nn::RmsNorm;
use sharemesh_kernels::llama::{BatchEntry, KvPool, LlamaConfig, SequenceCache, BLOCK_POSITIONS};

use crate::embedding::EmbeddingRows;

mod arena;
mod matrix;
mod positions;
use arena::{reserve, write_rows, Arena};
use matrix::{Head, Matrix};
use positions::{attention_mask, rope_thetas};

/// Bytes of one cached key or value: the arenas hold f32, as the graph computes.
const VALUE_BYTES: usize = 4;

struct Layer {
    attention_norm: RmsNorm,
    q: Matrix,
    k: Matrix,
    v: Matrix,
    /// qwen2's q/k/v biases.
    biases: Option<[Tensor; 3]>,
    /// qwen3's and Gemma 3's per-head RMS norms of queries and keys, before the rotation.
    head_norms: Option<[RmsNorm; 2]>,
    output: Matrix,
    ffn_norm: RmsNorm,
    gate: Matrix,
    up: Matrix,
    down: Matrix,
    /// Gemma's norms of the attention's and the feed-forward's outputs, before each
    /// residual add.
    post_norms: Option<[RmsNorm; 2]>,
    /// Gemma's sliding layers: the last positions each query sees.
    window: Option<usize>,
    /// Which rotary table: 0 (the file's base), 1 (Gemma's local layers').
    rope_table: usize,
}

pub struct PagedLlama {
    config: LlamaConfig,
    embedding: EmbeddingRows,
    layers: Vec<Layer>,
    norm: RmsNorm,
    output: Head,
    /// Per rotary table (the file's, and Gemma's local layers'), each pair's angle per
    /// position (the kernels' formula: base, factors, scale).
    thetas: Vec<Vec<f32>>,
    device: Device,
    vocab: usize,
    arenas: Mutex<Vec<Arena>>,
    /// The one-job cache `forward` extends (generation one job at a time, replays).
    solo: SequenceCache,
}

/// The most a Gemma's weights may take in f32 to be held dequantized (Gemma 3 270M's
/// take 1.1 GB; Gemma 2 9B's would take 37 GB, and its matrices stay quantized).
const DENSE_GEMMA_BYTES: u64 = 4 << 30;

/// Bytes of every tensor of the file in f32.
fn f32_bytes(ct: &gguf_file::Content) -> u64 {
    ct.tensor_infos
        .values()
        .map(|info| info.shape.elem_count() as u64 * 4)
        .sum()
}

/// A row range of one step's activations: which sequence, from which row, how many.
struct Span {
    first_row: usize,
    tokens: usize,
    position: usize,
}

impl PagedLlama {
    /// Whether this graph runs `config`: every head rotated whole.
    pub fn runs(config: &LlamaConfig) -> bool {
        config.rope_dimensions == config.head_dim
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
        // A small Gemma's weights dequantized (`matrix.rs`); the llama family's, and a
        // Gemma too large to hold in f32, as stored.
        let dense = config.gemma.is_some() && f32_bytes(ct) <= DENSE_GEMMA_BYTES;
        let matmul = |t: QTensor| Matrix::new(t, dense, device);
        let table = ct.tensor(reader, "token_embd.weight", &Device::Cpu)?;
        let tied_q8_0 = dense && device.is_cpu() && table.dtype() == GgmlDType::Q8_0;
        let embedding = EmbeddingRows::new(table, config.hidden)?;
        let vocab = embedding.vocab();
        let output = match ct.tensor_infos.contains_key("output.weight") {
            true => Head::Matrix(matmul(ct.tensor(reader, "output.weight", device)?)?),
            false if tied_q8_0 => Head::TiedQ8_0,
            false => Head::Matrix(matmul(ct.tensor(reader, "token_embd.weight", device)?)?),
        };
        let factors = optional_vector(ct, reader, "rope_freqs.weight")?;
        let base = config.rope_base;
        let mut thetas = vec![rope_thetas(&config, base, factors, config.rope_scale)?];
        if let Some(gemma) = &config.gemma {
            // Gemma's local layers: their own base, unscaled (as llama.cpp).
            thetas.push(rope_thetas(&config, gemma.local_rope_base, None, 1.0)?);
        }
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
            let post_norms = match config.gemma.is_some() {
                true => Some([
                    norm(tensor("post_attention_norm")?)?,
                    norm(tensor("post_ffw_norm")?)?,
                ]),
                false => None,
            };
            let global = config
                .gemma
                .is_none_or(|g| (index + 1).is_multiple_of(g.global_every));
            layers.push(Layer {
                post_norms,
                window: config.gemma.filter(|_| !global).map(|g| g.sliding_window),
                rope_table: usize::from(!global),
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
        let tables = self
            .thetas
            .iter()
            .map(|thetas| self.rope_tables(thetas, &positions))
            .collect::<Result<Vec<_>>>()?;
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
        let mut embedded = self.embedding.rows(&tokens)?;
        if self.config.gemma.is_some() {
            let scale = (self.config.hidden as f32).sqrt();
            embedded.iter_mut().for_each(|v| *v *= scale);
        }
        let shape = (1, tokens.len(), self.config.hidden);
        let mut x = Tensor::from_vec(embedded, shape, &self.device)?;
        for (index, layer) in self.layers.iter().enumerate() {
            let (cos, sin) = &tables[layer.rope_table];
            let h = layer.attention_norm.forward(&x)?;
            let (q, k, v) = self.attend_inputs(layer, &h, cos, sin)?;
            let (keys, values) = (&arena.keys[index], &arena.values[index]);
            let mut attended = Vec::with_capacity(batch.len());
            for ((span, entry), gather) in spans.iter().zip(batch).zip(&gathers) {
                let k_new = k.narrow(0, span.first_row, span.tokens)?;
                let v_new = v.narrow(0, span.first_row, span.tokens)?;
                write_rows(keys, &k_new, entry.cache, span.position)?;
                write_rows(values, &v_new, entry.cache, span.position)?;
                let q_span = q.narrow(2, span.first_row, span.tokens)?.contiguous()?;
                let seen = Seen {
                    keys,
                    values,
                    gather,
                    window: layer.window,
                };
                attended.push(self.attend(&q_span, &seen, span)?);
            }
            let attended = Tensor::cat(&attended, 0)?.unsqueeze(0)?;
            x = (x + post_normed(layer, 0, layer.output.forward(&attended)?)?)?;
            let ffn = post_normed(layer, 1, self.feed_forward(layer, &x)?)?;
            x = (x + ffn)?;
        }
        self.logits(&x, &spans, rows)
    }

    /// The feed-forward block's output for the residual stream `x` (SiLU-gated, or
    /// GELU-gated for Gemma).
    fn feed_forward(&self, layer: &Layer, x: &Tensor) -> Result<Tensor> {
        let h = layer.ffn_norm.forward(x)?;
        let gate = layer.gate.forward(&h)?;
        let gate = match self.config.gemma {
            Some(_) => gate.gelu()?,
            None => candle_nn::ops::silu(&gate)?,
        };
        layer.down.forward(&(gate * layer.up.forward(&h)?)?)
    }

    /// The logits of each span's last `rows` rows of `x`, per span.
    fn logits(&self, x: &Tensor, spans: &[Span], rows: usize) -> Result<Vec<Vec<f32>>> {
        let last: Vec<u32> = spans
            .iter()
            .flat_map(|s| (s.first_row + s.tokens - rows..s.first_row + s.tokens).map(|r| r as u32))
            .collect();
        let picked = last.len();
        let last = Tensor::from_vec(last, picked, &self.device)?;
        let x = x.squeeze(0)?.index_select(&last, 0)?;
        let mut logits = self
            .output
            .logits(&self.norm.forward(&x)?, &self.embedding)?;
        if let Some(cap) = self.config.gemma.and_then(|g| g.final_softcap) {
            logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        }
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

    /// Attention of one sequence's new rows over all its positions (or, on a sliding
    /// layer, the last `window` of them): (rows, q width).
    fn attend(&self, q: &Tensor, seen: &Seen<'_>, span: &Span) -> Result<Tensor> {
        let c = &self.config;
        let (count, keys) = (span.tokens, span.position + span.tokens);
        let per_head = |t: &Tensor| -> Result<Tensor> {
            t.index_select(seen.gather, 0)?
                .reshape((keys, c.kv_heads, c.head_dim))?
                .transpose(0, 1)?
                .contiguous()?
                .unsqueeze(0)
        };
        let (k, v) = (per_head(seen.keys)?, per_head(seen.values)?);
        // Grouped-query attention without copying keys per head: the query heads of
        // one KV head stand as extra rows of that head's product.
        let group = c.heads / c.kv_heads;
        let q = q.reshape((1, c.kv_heads, group * count, c.head_dim))?;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let mut scores = (q.matmul(&k.t()?)? * scale)?.reshape((1, c.heads, count, keys))?;
        if let Some(cap) = c.gemma.and_then(|g| g.attn_softcap) {
            scores = ((scores / f64::from(cap))?.tanh()? * f64::from(cap))?;
        }
        if let Some(mask) = attention_mask(span.position, count, seen.window, &self.device)? {
            scores = scores.broadcast_add(&mask)?;
        }
        let weights = candle_nn::ops::softmax_last_dim(&scores)?.reshape((
            1,
            c.kv_heads,
            group * count,
            keys,
        ))?;
        weights
            .matmul(&v)?
            .reshape((1, c.heads, count, c.head_dim))?
            .transpose(1, 2)?
            .reshape((count, c.q_width()))
    }

    /// cos and sin of every rotary pair's angle at each row's position: (rows, head / 2).
    fn rope_tables(&self, thetas: &[f32], positions: &[usize]) -> Result<(Tensor, Tensor)> {
        let half = thetas.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for theta in thetas {
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

/// What one sequence's attention reads on one layer: the arena's keys and values, the
/// arena rows of its positions, and the layer's window.
struct Seen<'a> {
    keys: &'a Tensor,
    values: &'a Tensor,
    gather: &'a Tensor,
    window: Option<usize>,
}

/// `out` through the layer's Gemma norm `which` (0: the attention's, 1: the
/// feed-forward's) where it has them.
fn post_normed(layer: &Layer, which: usize, out: Tensor) -> Result<Tensor> {
    match &layer.post_norms {
        Some(norms) => norms[which].forward(&out),
        None => Ok(out),
    }
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
