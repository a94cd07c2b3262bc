//! Several sequences in one forward pass (continuous batching): each brings its own KV
//! cache and position, and the rows of all of them go through the matmuls together —
//! the weights are read once for the whole batch instead of once per sequence.
//!
//! Every sequence's logits are the bits it would get alone: norms, activation
//! quantization, rotary embedding, residuals and each matmul element are per row, and
//! attention is per (row, head) over that row's own sequence's cache up to its own
//! position. So a job's tokens do not depend on which jobs share its steps, where in the
//! batch it sits, or how many threads run it.

use rayon::prelude::*;

use super::kv::{KvPool, SequenceCache};
use super::{add, add_to_rows, norm_rows, rope_angles, Llama};
use crate::matmul::matmul;
use crate::ops::{attend, rope_interleaved, swiglu};
use crate::quant::quantize_rows;
use crate::KernelError;

/// One sequence's part of a batched step: its cache, and its next tokens at `position`
/// (which must equal the cache's length) — one token to decode, or a prompt chunk.
pub struct BatchEntry<'a> {
    pub cache: &'a mut SequenceCache,
    pub tokens: &'a [u32],
    pub position: usize,
}

impl Llama {
    /// A pool of at most `blocks` KV blocks for this model's sequences.
    pub fn kv_pool(&self, blocks: usize) -> KvPool {
        let width = self.config.kv_heads * self.config.head_dim();
        KvPool::new(self.layers.len(), width, blocks)
    }

    /// A fresh, empty cache for a sequence of this model, in a pool of its own with no
    /// budget.
    pub fn new_sequence(&self) -> SequenceCache {
        self.kv_pool(usize::MAX).new_sequence()
    }

    /// Runs one step of several sequences together, extends each one's cache, and
    /// returns each one's logits after its last token (in `batch` order). The bits are
    /// each sequence's alone (module docs). An entry that fails a check, or KV blocks
    /// the pools cannot give, fail the whole step before any cached position changes.
    pub fn forward_batch(
        &self,
        batch: &mut [BatchEntry<'_>],
    ) -> Result<Vec<Vec<f32>>, KernelError> {
        self.forward_batch_rows(batch, 1)
    }

    /// [`Self::forward_batch`] with the logits of each entry's last `rows` tokens.
    pub(super) fn forward_batch_rows(
        &self,
        batch: &mut [BatchEntry<'_>],
        rows: usize,
    ) -> Result<Vec<Vec<f32>>, KernelError> {
        for entry in batch.iter() {
            self.check_entry(entry, rows)?;
        }
        reserve_blocks(batch)?;
        let pool = std::sync::Arc::clone(&self.pool);
        let logits = pool.install(|| self.forward_entries(batch, rows));
        for entry in batch.iter_mut() {
            entry.cache.advance(entry.tokens.len());
        }
        Ok(logits)
    }

    fn check_entry(&self, entry: &BatchEntry<'_>, rows: usize) -> Result<(), KernelError> {
        let tokens = entry.tokens;
        if tokens.is_empty() {
            return Err(KernelError::NoTokens);
        }
        if rows == 0 || rows > tokens.len() {
            return Err(KernelError::BadConfig(format!(
                "{rows} logit rows asked of {} tokens",
                tokens.len()
            )));
        }
        let width = self.config.kv_heads * self.config.head_dim();
        if !entry.cache.fits(self.layers.len(), width) {
            return Err(KernelError::BadConfig(
                "a KV cache made for another model's shape".into(),
            ));
        }
        if entry.position != entry.cache.positions() {
            return Err(KernelError::PositionMismatch {
                position: entry.position,
                cached: entry.cache.positions(),
            });
        }
        if entry.position + tokens.len() > self.config.context {
            return Err(KernelError::ContextExceeded {
                position: entry.position,
                tokens: tokens.len(),
                context: self.config.context,
            });
        }
        let vocab = self.vocab_size();
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(KernelError::TokenOutOfRange { token, vocab });
        }
        Ok(())
    }

    fn forward_entries(&self, batch: &mut [BatchEntry<'_>], rows: usize) -> Vec<Vec<f32>> {
        let c = &self.config;
        let hidden = c.hidden;
        let head_dim = c.head_dim();
        let kv_width = c.kv_heads * head_dim;
        let group = c.heads / c.kv_heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let isa = self.isa;
        // Each row's sequence and absolute position.
        let (row_entry, row_position): (Vec<usize>, Vec<usize>) = batch
            .iter()
            .enumerate()
            .flat_map(|(e, entry)| (0..entry.tokens.len()).map(move |i| (e, entry.position + i)))
            .unzip();
        let n = row_entry.len();
        let angles = rope_angles(&self.rope_thetas, &row_position);

        let mut x = vec![0f32; n * hidden];
        let tokens = batch.iter().flat_map(|entry| entry.tokens.iter());
        for (row, &token) in x.chunks_exact_mut(hidden).zip(tokens) {
            self.embeddings.dequantize_row(token as usize, row);
        }
        let mut normed = vec![0f32; n * hidden];
        let mut q = vec![0f32; n * hidden];
        let mut k = vec![0f32; n * kv_width];
        let mut v = vec![0f32; n * kv_width];
        let mut attended = vec![0f32; n * hidden];
        let mut projected = vec![0f32; n * hidden];
        let mut gate = vec![0f32; n * c.feed_forward];
        let mut up = vec![0f32; n * c.feed_forward];
        for (index, layer) in self.layers.iter().enumerate() {
            norm_rows(&x, &layer.attention_norm, c.norm_eps, &mut normed);
            let acts = quantize_rows(&normed, hidden);
            matmul(isa, &layer.wq, &acts, &mut q);
            matmul(isa, &layer.wk, &acts, &mut k);
            matmul(isa, &layer.wv, &acts, &mut v);
            if let Some(bias) = &layer.bias {
                add_to_rows(&mut q, &bias.q);
                add_to_rows(&mut k, &bias.k);
                add_to_rows(&mut v, &bias.v);
            }
            for (i, (q_row, k_row)) in q
                .chunks_exact_mut(hidden)
                .zip(k.chunks_exact_mut(kv_width))
                .enumerate()
            {
                let (cos, sin) = &angles[i];
                for head in q_row
                    .chunks_exact_mut(head_dim)
                    .chain(k_row.chunks_exact_mut(head_dim))
                {
                    rope_interleaved(head, cos, sin);
                }
            }
            // Each sequence's new keys and values join its own cache.
            let mut first_row = 0;
            for entry in batch.iter_mut() {
                for i in 0..entry.tokens.len() {
                    let row = (first_row + i) * kv_width..(first_row + i + 1) * kv_width;
                    let position = entry.position + i;
                    let (key, value) = (&k[row.clone()], &v[row]);
                    entry.cache.write(index, position, key, value);
                }
                first_row += entry.tokens.len();
            }
            let caches: Vec<&SequenceCache> = batch.iter().map(|entry| &*entry.cache).collect();
            attended.par_chunks_mut(head_dim).enumerate().for_each_init(
                Vec::new,
                |scores, (at, out)| {
                    let (row, head) = (at / c.heads, at % c.heads);
                    let query = &q[row * hidden + head * head_dim..][..head_dim];
                    let cache = caches[row_entry[row]];
                    let offset = (head / group) * head_dim;
                    let key = |j| &cache.key(index, j)[offset..offset + head_dim];
                    let value = |j| &cache.value(index, j)[offset..offset + head_dim];
                    attend(query, key, value, row_position[row] + 1, scale, scores, out);
                },
            );
            matmul(
                isa,
                &layer.wo,
                &quantize_rows(&attended, hidden),
                &mut projected,
            );
            add(&mut x, &projected);

            norm_rows(&x, &layer.ffn_norm, c.norm_eps, &mut normed);
            let acts = quantize_rows(&normed, hidden);
            matmul(isa, &layer.gate, &acts, &mut gate);
            matmul(isa, &layer.up, &acts, &mut up);
            swiglu(&mut gate, &up);
            let acts = quantize_rows(&gate, c.feed_forward);
            matmul(isa, &layer.down, &acts, &mut projected);
            add(&mut x, &projected);
        }
        self.output_logits(batch, &x, rows)
    }

    /// The logits of each entry's last `rows` rows of `x`, in one output matmul.
    fn output_logits(&self, batch: &[BatchEntry<'_>], x: &[f32], rows: usize) -> Vec<Vec<f32>> {
        let hidden = self.config.hidden;
        let mut last = Vec::with_capacity(batch.len() * rows * hidden);
        let mut end = 0;
        for entry in batch {
            end += entry.tokens.len();
            last.extend_from_slice(&x[(end - rows) * hidden..end * hidden]);
        }
        let mut final_norm = vec![0f32; last.len()];
        norm_rows(
            &last,
            &self.output_norm,
            self.config.norm_eps,
            &mut final_norm,
        );
        let output = self.output.as_ref().unwrap_or(&self.embeddings);
        let mut logits = vec![0f32; batch.len() * rows * output.rows];
        matmul(
            self.isa,
            output,
            &quantize_rows(&final_norm, hidden),
            &mut logits,
        );
        logits
            .chunks_exact(rows * output.rows)
            .map(<[f32]>::to_vec)
            .collect()
    }
}

/// Takes from the pools the blocks every entry's new positions need — all of them, or
/// none when a pool has too few free.
fn reserve_blocks(batch: &mut [BatchEntry<'_>]) -> Result<(), KernelError> {
    let mut needs: Vec<(KvPool, usize)> = Vec::new();
    for entry in batch.iter() {
        let needed = entry.cache.blocks_needed(entry.tokens.len());
        let pool = entry.cache.pool();
        match needs.iter_mut().find(|(p, _)| p.same(pool)) {
            Some((_, total)) => *total += needed,
            None => needs.push((pool.clone(), needed)),
        }
    }
    if let Some((pool, needed)) = needs.iter().find(|(pool, needed)| *needed > pool.free()) {
        return Err(KernelError::KvMemoryFull {
            needed: *needed,
            free: pool.free(),
            capacity: pool.capacity(),
        });
    }
    for entry in batch.iter_mut() {
        entry.cache.reserve(entry.tokens.len())?;
    }
    Ok(())
}
