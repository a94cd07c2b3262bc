//! Where the paged graph keeps keys and values: per KV pool an arena on the device,
//! rows addressed by the pool's block slots.

use candle_core::{DType, Device, Result, Tensor};
use sharemesh_kernels::llama::{
    BatchEntry, BlockCopy, KvPool, LlamaConfig, SequenceCache, BLOCK_POSITIONS,
};

/// One pool's keys and values: per layer a (rows, KV width) tensor on the device, a
/// block's [`BLOCK_POSITIONS`] rows at `slot × BLOCK_POSITIONS`; grown on demand.
pub(super) struct Arena {
    pub(super) pool: KvPool,
    pub(super) keys: Vec<Tensor>,
    pub(super) values: Vec<Tensor>,
}

impl Arena {
    /// Makes every layer's tensors hold at least `rows` rows (doubling, so a growing
    /// batch copies each row O(1) times).
    pub(super) fn grow(
        &mut self,
        rows: usize,
        config: &LlamaConfig,
        device: &Device,
    ) -> Result<()> {
        let held = self.keys.first().map_or(0, |t| t.dim(0).unwrap_or(0));
        if rows <= held {
            return Ok(());
        }
        let target = rows.max(2 * held).max(4 * BLOCK_POSITIONS);
        let grown = |old: Option<&Tensor>| -> Result<Tensor> {
            let fresh = Tensor::zeros((target, config.kv_width()), DType::F32, device)?;
            if let Some(old) = old {
                fresh.slice_set(old, 0, 0)?;
            }
            Ok(fresh)
        };
        for layer in 0..config.layers {
            let keys = grown(self.keys.get(layer))?;
            let values = grown(self.values.get(layer))?;
            match self.keys.get_mut(layer) {
                Some(slot) => {
                    *slot = keys;
                    self.values[layer] = values;
                }
                None => {
                    self.keys.push(keys);
                    self.values.push(values);
                }
            }
        }
        Ok(())
    }

    /// Copies a shared block's rows to the block a sequence writes instead, in every
    /// layer.
    pub(super) fn copy_block(&self, copy: BlockCopy) -> Result<()> {
        let from = copy.from as usize * BLOCK_POSITIONS;
        let to = copy.to as usize * BLOCK_POSITIONS;
        for tensor in self.keys.iter().chain(&self.values) {
            let rows = tensor.narrow(0, from, BLOCK_POSITIONS)?.copy()?;
            tensor.slice_set(&rows, 0, to)?;
        }
        Ok(())
    }
}

/// Stores a sequence's new rows (rows, KV width) at `position` onward, block by block.
pub(super) fn write_rows(
    arena: &Tensor,
    rows: &Tensor,
    cache: &SequenceCache,
    position: usize,
) -> Result<()> {
    let slots = cache.slots();
    let count = rows.dim(0)?;
    let mut done = 0;
    while done < count {
        let at = position + done;
        let in_block = (BLOCK_POSITIONS - at % BLOCK_POSITIONS).min(count - done);
        let row = slots[at / BLOCK_POSITIONS] as usize * BLOCK_POSITIONS + at % BLOCK_POSITIONS;
        arena.slice_set(&rows.narrow(0, done, in_block)?.contiguous()?, 0, row)?;
        done += in_block;
    }
    Ok(())
}

/// Takes the blocks every entry's new tokens need, after checking the pools have them
/// all (nothing changes when they do not); the shared blocks to copy first.
pub(super) fn reserve(batch: &mut [BatchEntry<'_>]) -> Result<Vec<BlockCopy>> {
    let needed: usize = batch
        .iter()
        .map(|e| e.cache.blocks_needed(e.tokens.len()))
        .sum();
    if let Some(pool) = batch.first().map(|e| e.cache.pool()) {
        if needed > pool.free() {
            candle_core::bail!(
                "the KV cache is full: {needed} more blocks needed, {} free of {}",
                pool.free(),
                pool.capacity()
            );
        }
    }
    let mut copies = Vec::new();
    for entry in batch.iter_mut() {
        let copy = entry
            .cache
            .reserve(entry.tokens.len())
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        copies.extend(copy);
    }
    Ok(copies)
}
