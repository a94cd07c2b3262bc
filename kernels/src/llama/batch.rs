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
use super::{add, add_to_rows, norm_rows, rope_angles, Layer, Llama};
use crate::attention::{attend_heads, AttendScratch};
use crate::matmul::matmul;
use crate::ops::{geglu, rms_norm, rope_interleaved, swiglu};
use crate::quant::quantize_rows;
use crate::KernelError;

/// One sequence's part of a batched step: its cache, and its next tokens at `position`
/// (which must equal the cache's length) — one token to decode, or a prompt chunk.
pub struct BatchEntry<'a> {
    pub cache: &'a mut SequenceCache,
    pub tokens: &'a [u32],
    pub position: usize,
}

/// Query heads per attention task: a KV head's whole group, which then gathers its
/// cached rows once, unless that leaves fewer than two tasks per thread (Gemma 3 has one
/// KV head: one decoding row would be one task), then the largest divisor that does not.
fn heads_per_task(group: usize, groups: usize) -> usize {
    let wanted = 2 * rayon::current_num_threads();
    (1..=group)
        .rev()
        .find(|&h| group.is_multiple_of(h) && groups * (group / h) >= wanted)
        .unwrap_or(1)
}

/// Values per task of an element-wise pass.
const ELEMENTWISE_PIECE: usize = 4096;

/// Which sequence, and which absolute position, each row of a step is.
struct Rows<'a> {
    entry: &'a [usize],
    position: &'a [usize],
}

/// One step's activations, row after row, reused by every layer.
struct Step<'a> {
    rows: Rows<'a>,
    /// The residual stream.
    x: Vec<f32>,
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attended: Vec<f32>,
    projected: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl Llama {
    /// A pool of at most `blocks` KV blocks for this model's sequences.
    pub fn kv_pool(&self, blocks: usize) -> KvPool {
        self.config.kv_pool(blocks)
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
        if !entry.cache.fits(&self.config) {
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
        let (hidden, q_width, kv_width) = (c.hidden, c.q_width(), c.kv_width());
        // Each row's sequence and absolute position.
        let (row_entry, row_position): (Vec<usize>, Vec<usize>) = batch
            .iter()
            .enumerate()
            .flat_map(|(e, entry)| (0..entry.tokens.len()).map(move |i| (e, entry.position + i)))
            .unzip();
        let n = row_entry.len();
        let angles: Vec<_> = self
            .rope_tables
            .iter()
            .map(|thetas| rope_angles(thetas, &row_position))
            .collect();
        let mut step = Step {
            rows: Rows {
                entry: &row_entry,
                position: &row_position,
            },
            x: vec![0f32; n * hidden],
            normed: vec![0f32; n * hidden],
            q: vec![0f32; n * q_width],
            k: vec![0f32; n * kv_width],
            v: vec![0f32; n * kv_width],
            attended: vec![0f32; n * q_width],
            projected: vec![0f32; n * hidden],
            gate: vec![0f32; n * c.feed_forward],
            up: vec![0f32; n * c.feed_forward],
        };
        // Gemma scales its embeddings by √hidden.
        let embedding_scale = c.gemma.map(|_| (hidden as f32).sqrt());
        let tokens = batch.iter().flat_map(|entry| entry.tokens.iter());
        for (row, &token) in step.x.chunks_exact_mut(hidden).zip(tokens) {
            self.embeddings.dequantize_row(token as usize, row);
            if let Some(scale) = embedding_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        for (index, layer) in self.layers.iter().enumerate() {
            self.attention(&mut step, batch, index, layer, &angles[layer.rope_table]);
            self.feed_forward(&mut step, layer);
        }
        self.output_logits(batch, &step.x, rows)
    }

    /// One layer's attention block: `step.x` += its output (Gemma: normed first).
    fn attention(
        &self,
        step: &mut Step<'_>,
        batch: &mut [BatchEntry<'_>],
        index: usize,
        layer: &Layer,
        angles: &[(Vec<f32>, Vec<f32>)],
    ) {
        let c = &self.config;
        let (hidden, head_dim, kv_width) = (c.hidden, c.head_dim, c.kv_width());
        let isa = self.isa;
        norm_rows(&step.x, &layer.attention_norm, c.norm_eps, &mut step.normed);
        let acts = quantize_rows(&step.normed, hidden);
        matmul(isa, &layer.wq, &acts, &mut step.q);
        matmul(isa, &layer.wk, &acts, &mut step.k);
        matmul(isa, &layer.wv, &acts, &mut step.v);
        if let Some(bias) = &layer.bias {
            add_to_rows(&mut step.q, &bias.q);
            add_to_rows(&mut step.k, &bias.k);
            add_to_rows(&mut step.v, &bias.v);
        }
        if let Some(norms) = &layer.head_norms {
            norm_in_place(&mut step.q, &norms.q, c.norm_eps);
            norm_in_place(&mut step.k, &norms.k, c.norm_eps);
        }
        for (i, (q_row, k_row)) in step
            .q
            .chunks_exact_mut(c.q_width())
            .zip(step.k.chunks_exact_mut(kv_width))
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
                let (key, value) = (&step.k[row.clone()], &step.v[row]);
                entry.cache.write(index, entry.position + i, key, value);
            }
            first_row += entry.tokens.len();
        }
        let caches: Vec<&SequenceCache> = batch.iter().map(|entry| &*entry.cache).collect();
        let group = c.heads / c.kv_heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let softcap = c.gemma.and_then(|g| g.attn_softcap);
        let (q, rows) = (&step.q, &step.rows);
        let per_task = heads_per_task(group, rows.entry.len() * c.kv_heads);
        step.attended
            .par_chunks_mut(per_task * head_dim)
            .enumerate()
            .for_each_init(AttendScratch::default, |scratch, (task, out)| {
                let at = task * per_task;
                let (row, head) = (at / c.heads, at % c.heads);
                let queries = &q[at * head_dim..][..per_task * head_dim];
                let cache = caches[rows.entry[row]];
                let kv_head = head / group;
                let key = |j| cache.key(index, kv_head, j);
                let value = |j| cache.value(index, kv_head, j);
                let end = rows.position[row] + 1;
                let start = layer.window.map_or(0, |w| end.saturating_sub(w));
                let span = start..end;
                attend_heads(
                    queries, head_dim, key, value, span, scale, softcap, scratch, out,
                );
            });
        let acts = quantize_rows(&step.attended, c.q_width());
        matmul(isa, &layer.wo, &acts, &mut step.projected);
        if let Some(norms) = &layer.gemma {
            norm_in_place(&mut step.projected, &norms.post_attention, c.norm_eps);
        }
        add(&mut step.x, &step.projected);
    }

    /// One layer's feed-forward block: `step.x` += its output (Gemma: normed first).
    fn feed_forward(&self, step: &mut Step<'_>, layer: &Layer) {
        let c = &self.config;
        norm_rows(&step.x, &layer.ffn_norm, c.norm_eps, &mut step.normed);
        let acts = quantize_rows(&step.normed, c.hidden);
        matmul(self.isa, &layer.gate, &acts, &mut step.gate);
        matmul(self.isa, &layer.up, &acts, &mut step.up);
        // Element by element, so any split gives the same bits; in pieces across the
        // pool (GELU's tanh was 6% of a one-thread Gemma prefill, all on one thread).
        let activate = if layer.gemma.is_some() { geglu } else { swiglu };
        step.gate
            .par_chunks_mut(ELEMENTWISE_PIECE)
            .zip(step.up.par_chunks(ELEMENTWISE_PIECE))
            .for_each(|(gate, up)| activate(gate, up));
        let acts = quantize_rows(&step.gate, c.feed_forward);
        matmul(self.isa, &layer.down, &acts, &mut step.projected);
        if let Some(norms) = &layer.gemma {
            norm_in_place(&mut step.projected, &norms.post_ffn, c.norm_eps);
        }
        add(&mut step.x, &step.projected);
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
        if let Some(cap) = self.config.gemma.and_then(|g| g.final_softcap) {
            crate::attention::soft_cap(&mut logits, cap);
        }
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

/// RMS-normalizes every piece of `weight.len()` values of `x` in place: each head
/// (Gemma's q/k norms) or each row (its post-norms).
fn norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let mut normed = vec![0f32; weight.len()];
    for head in x.chunks_exact_mut(weight.len()) {
        rms_norm(head, weight, eps, &mut normed);
        head.copy_from_slice(&normed);
    }
}
