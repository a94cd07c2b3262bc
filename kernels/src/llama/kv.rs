//! The KV cache in fixed-size blocks (paged): a sequence holds the blocks its positions
//! fill, taken from a pool with a budget, so memory follows what jobs have actually
//! cached instead of what they might (`max_tokens`) — and a full block, whose contents
//! depend only on the tokens up to its end, can be shared by every sequence with that
//! prefix (the engine indexes them by a hash of the prefix).
//!
//! A block is never written while shared: a sequence that goes on writing into a
//! shared, partly filled block (it continued a prefix ending mid-block) gets its own copy.
//!
//! The blocks' values live here (f16, for these kernels), or elsewhere: a pool made with
//! [`KvPool::elsewhere`] only keeps the books — which blocks are live, which sequences
//! hold them, sharing and copy-on-write — and numbers each block with a slot in
//! `0..capacity`, so another backend (candle's graph, on a GPU) keeps the values in an
//! arena of its own at that slot and the engine's batching runs unchanged on it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use half::f16;

use super::LlamaConfig;
use crate::KernelError;

/// Positions per block.
pub const BLOCK_POSITIONS: usize = 16;

/// Bytes of one cached key or value element (half precision).
pub(super) const VALUE_BYTES: usize = std::mem::size_of::<f16>();

struct PoolState {
    capacity: usize,
    live: AtomicUsize,
    /// Values per block: layers × (keys, values) × KV heads × positions × head width.
    block_values: usize,
    /// Bytes of one value where the blocks are kept.
    value_bytes: usize,
    layers: usize,
    heads: usize,
    dim: usize,
    /// For a pool whose values live elsewhere: the slots of dropped blocks, for reuse.
    slots: Option<Mutex<Slots>>,
}

/// Slot numbers of a pool whose values live elsewhere: never two live blocks on one.
#[derive(Default)]
struct Slots {
    free: Vec<u32>,
    next: u32,
}

/// A block the backend must copy before the sequence writes into it: the values at
/// slot `from` to slot `to` (a pool whose values live elsewhere; [`SequenceCache::reserve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    pub from: u32,
    pub to: u32,
}

/// Where a model's KV blocks come from: at most `capacity` live at once.
#[derive(Clone)]
pub struct KvPool {
    state: Arc<PoolState>,
}

impl KvPool {
    /// A pool for a model with `layers` layers of `heads` KV heads `dim` floats wide,
    /// holding at most `capacity` blocks.
    pub fn new(layers: usize, heads: usize, dim: usize, capacity: usize) -> Self {
        Self::with_state(layers, heads, dim, capacity, VALUE_BYTES, None)
    }

    /// A pool that keeps only the books for blocks whose values another backend stores,
    /// `value_bytes` each, at each block's [`KvBlock::slot`] (below `capacity`, which
    /// must fit a `u32`).
    pub fn elsewhere(
        layers: usize,
        heads: usize,
        dim: usize,
        value_bytes: usize,
        capacity: usize,
    ) -> Self {
        let slots = Some(Mutex::new(Slots::default()));
        Self::with_state(layers, heads, dim, capacity, value_bytes, slots)
    }

    fn with_state(
        layers: usize,
        heads: usize,
        dim: usize,
        capacity: usize,
        value_bytes: usize,
        slots: Option<Mutex<Slots>>,
    ) -> Self {
        Self {
            state: Arc::new(PoolState {
                capacity,
                live: AtomicUsize::new(0),
                block_values: layers * 2 * heads * BLOCK_POSITIONS * dim,
                value_bytes,
                layers,
                heads,
                dim,
                slots,
            }),
        }
    }

    /// Whether anything besides this handle holds the pool (another handle, a
    /// sequence, a block): a backend's arena for a pool nobody else holds can go.
    pub fn held_elsewhere(&self) -> bool {
        Arc::strong_count(&self.state) > 1
    }

    /// Whether the blocks' values live elsewhere ([`Self::elsewhere`]).
    pub fn is_elsewhere(&self) -> bool {
        self.state.slots.is_some()
    }

    /// (layers, KV heads, head width) of the model this pool is shaped for.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.state.layers, self.state.heads, self.state.dim)
    }

    /// Blocks this pool may hold.
    pub fn capacity(&self) -> usize {
        self.state.capacity
    }

    /// Blocks held now (by sequences, or by whoever keeps them for their prefix).
    pub fn in_use(&self) -> usize {
        self.state.live.load(Ordering::SeqCst)
    }

    /// Blocks that can still be taken.
    pub fn free(&self) -> usize {
        self.capacity().saturating_sub(self.in_use())
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.state.block_values * self.state.value_bytes
    }

    /// Blocks a sequence of `positions` positions holds.
    pub fn blocks_for(positions: usize) -> usize {
        positions.div_ceil(BLOCK_POSITIONS)
    }

    /// A new sequence cache drawing from this pool.
    pub fn new_sequence(&self) -> SequenceCache {
        SequenceCache {
            blocks: Vec::new(),
            positions: 0,
            pool: self.clone(),
        }
    }

    /// One block, zeroed (a forward pass fills it); refused when the pool is full.
    pub fn take_block(&self) -> Result<KvBlock, KernelError> {
        let state = &self.state;
        let taken = state
            .live
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |live| {
                (live < state.capacity).then_some(live + 1)
            });
        if taken.is_err() {
            return Err(KernelError::KvMemoryFull {
                needed: 1,
                free: 0,
                capacity: state.capacity,
            });
        }
        let (data, slot) = match &state.slots {
            None => (vec![f16::ZERO; state.block_values].into_boxed_slice(), None),
            Some(slots) => {
                let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
                let slot = slots.free.pop().unwrap_or_else(|| {
                    slots.next += 1;
                    slots.next - 1
                });
                (Box::default(), Some(slot))
            }
        };
        Ok(KvBlock {
            data,
            slot,
            state: Arc::clone(state),
        })
    }

    /// Whether `other` is this pool (not a pool of the same shape).
    pub fn same(&self, other: &KvPool) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }

    fn owns(&self, block: &KvBlock) -> bool {
        Arc::ptr_eq(&self.state, &block.state)
    }
}

/// Keys and values of [`BLOCK_POSITIONS`] positions in every layer, as IEEE half
/// precision: the forward pass computes them in f32 and stores each rounded to the
/// nearest f16 (ties to even), which halves what attention reads per position — the
/// memory traffic that bounds long contexts and batched decoding — and the positions a
/// KV budget holds. Every reader widens them exactly, so all builds see the same values.
pub struct KvBlock {
    /// Empty where the values live elsewhere.
    data: Box<[f16]>,
    /// Where another backend keeps this block's values ([`KvPool::elsewhere`]).
    slot: Option<u32>,
    state: Arc<PoolState>,
}

impl KvBlock {
    /// The slot of a block whose values live elsewhere (`None` in a pool of its own).
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }
}

impl Drop for KvBlock {
    fn drop(&mut self) {
        if let (Some(slot), Some(slots)) = (self.slot, &self.state.slots) {
            let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.free.push(slot);
        }
        self.state.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A block is laid out layer, then keys or values, then KV head, then position: one
/// head's 16 keys (or values) are one contiguous run, which attention streams through
/// (rows interleaving the heads made each head's reads strided, a third of every line
/// it fetched unused by the task reading it).
impl KvBlock {
    fn at(&self, layer: usize, kind: usize, head: usize, slot: usize) -> usize {
        let state = &self.state;
        (((layer * 2 + kind) * state.heads + head) * BLOCK_POSITIONS + slot) * state.dim
    }

    fn row(&self, layer: usize, kind: usize, head: usize, slot: usize) -> &[f16] {
        &self.data[self.at(layer, kind, head, slot)..][..self.state.dim]
    }

    /// Stores one position's row (every KV head, `heads × dim` floats) of `kind`,
    /// each value rounded to the nearest f16 ([`to_kv`]).
    fn put(&mut self, layer: usize, kind: usize, slot: usize, row: &[f32]) {
        let dim = self.state.dim;
        for (head, part) in row.chunks_exact(dim).enumerate() {
            let at = self.at(layer, kind, head, slot);
            to_kv(part, &mut self.data[at..at + dim]);
        }
    }
}

const KEYS: usize = 0;
const VALUES: usize = 1;

/// Rounds `values` to the nearest f16, ties to even (overflow to ±∞, NaN stays NaN):
/// F16C's `vcvtps2ph` where the CPU has it, otherwise the same rounding in software —
/// the same bits on every input (checked on all 2^32).
fn to_kv(values: &[f32], out: &mut [f16]) {
    use half::slice::HalfFloatSliceExt;
    out.convert_from_f32_slice(values);
}

/// One sequence's KV cache (one job's context): its blocks, in position order.
#[derive(Clone)]
pub struct SequenceCache {
    blocks: Vec<Arc<KvBlock>>,
    positions: usize,
    pool: KvPool,
}

impl SequenceCache {
    /// A cache that starts from `blocks` (another sequence's, shared) holding its first
    /// `positions` positions; they must come from `pool` and cover those positions.
    pub fn from_prefix(
        pool: &KvPool,
        mut blocks: Vec<Arc<KvBlock>>,
        positions: usize,
    ) -> Result<Self, KernelError> {
        if blocks.len() * BLOCK_POSITIONS < positions || !blocks.iter().all(|b| pool.owns(b)) {
            return Err(KernelError::BadConfig(format!(
                "a prefix of {positions} positions from {} blocks of another pool or too few",
                blocks.len()
            )));
        }
        blocks.truncate(KvPool::blocks_for(positions));
        Ok(Self {
            blocks,
            positions,
            pool: pool.clone(),
        })
    }

    /// Positions cached so far: where the sequence's next tokens go.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// The blocks every one of whose positions is cached, in order: what another
    /// sequence with the same prefix can start from.
    pub fn full_blocks(&self) -> &[Arc<KvBlock>] {
        &self.blocks[..self.positions / BLOCK_POSITIONS]
    }

    /// Keeps the first `positions` positions and drops the rest, with their blocks (the
    /// cache of a prefix does not depend on what followed it, so a job sharing the
    /// prefix continues here).
    pub fn truncate(&mut self, positions: usize) {
        self.positions = positions.min(self.positions);
        self.blocks.truncate(KvPool::blocks_for(self.positions));
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Bytes of the blocks held (some may be shared with other sequences).
    pub fn bytes(&self) -> usize {
        self.blocks.len() * self.pool.block_bytes()
    }

    /// New blocks that `tokens` more positions take from the pool: the blocks past the
    /// ones held, and a copy of the last one if it is shared and gets written.
    pub fn blocks_needed(&self, tokens: usize) -> usize {
        let grow = KvPool::blocks_for(self.positions + tokens).saturating_sub(self.blocks.len());
        let copy = usize::from(tokens > 0 && self.shared_tail());
        grow + copy
    }

    /// Whether the block the next position goes into exists, is shared, and so must be
    /// copied before it is written.
    fn shared_tail(&self) -> bool {
        let tail = self.positions / BLOCK_POSITIONS;
        !self.positions.is_multiple_of(BLOCK_POSITIONS)
            && self
                .blocks
                .get(tail)
                .is_some_and(|b| Arc::strong_count(b) > 1)
    }

    /// The pool its blocks come from.
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Makes room for `tokens` more positions: copies a shared tail block, takes new
    /// blocks. The caller checked the pool has [`Self::blocks_needed`] free. Where the
    /// values live elsewhere, the copy is the caller's to make: it is returned.
    pub fn reserve(&mut self, tokens: usize) -> Result<Option<BlockCopy>, KernelError> {
        let mut moved = None;
        if tokens > 0 && self.shared_tail() {
            let tail = self.positions / BLOCK_POSITIONS;
            let mut copy = self.pool.take_block()?;
            copy.data.copy_from_slice(&self.blocks[tail].data);
            if let (Some(from), Some(to)) = (self.blocks[tail].slot, copy.slot) {
                moved = Some(BlockCopy { from, to });
            }
            self.blocks[tail] = Arc::new(copy);
        }
        while self.blocks.len() < KvPool::blocks_for(self.positions + tokens) {
            self.blocks.push(Arc::new(self.pool.take_block()?));
        }
        Ok(moved)
    }

    /// The slot of each block held, in position order (a pool whose values live
    /// elsewhere; empty otherwise).
    pub fn slots(&self) -> Vec<u32> {
        self.blocks.iter().filter_map(|b| b.slot).collect()
    }

    /// Stores the key and value of `position` (reserved, not shared) in `layer`.
    pub(super) fn write(&mut self, layer: usize, position: usize, key: &[f32], value: &[f32]) {
        let block = &mut self.blocks[position / BLOCK_POSITIONS];
        let slot = position % BLOCK_POSITIONS;
        // `reserve` left every block at or after the first new position unshared.
        if let Some(block) = Arc::get_mut(block) {
            block.put(layer, KEYS, slot, key);
            block.put(layer, VALUES, slot, value);
        }
    }

    /// `layer`'s key of KV head `head` at `position` (head dimension long).
    #[inline]
    pub(super) fn key(&self, layer: usize, head: usize, position: usize) -> &[f16] {
        let slot = position % BLOCK_POSITIONS;
        self.blocks[position / BLOCK_POSITIONS].row(layer, KEYS, head, slot)
    }

    /// `layer`'s value of KV head `head` at `position`.
    #[inline]
    pub(super) fn value(&self, layer: usize, head: usize, position: usize) -> &[f16] {
        let slot = position % BLOCK_POSITIONS;
        self.blocks[position / BLOCK_POSITIONS].row(layer, VALUES, head, slot)
    }

    /// Counts `tokens` more positions as cached (reserved, and written by the
    /// backend that keeps the values).
    pub fn advance(&mut self, tokens: usize) {
        self.positions += tokens;
        debug_assert!(self.positions <= self.blocks.len() * BLOCK_POSITIONS);
    }

    /// Whether this cache has the shape of `config`'s pools.
    pub(super) fn fits(&self, config: &LlamaConfig) -> bool {
        let state = &self.pool.state;
        // Blocks whose values live elsewhere hold none here for the kernels to read.
        !self.pool.is_elsewhere()
            && (state.layers, state.heads, state.dim)
                == (config.layers, config.kv_heads, config.head_dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widened(row: &[f16]) -> Vec<f32> {
        row.iter().map(|v| v.to_f32()).collect()
    }

    fn filled(pool: &KvPool, positions: usize, seed: f32) -> SequenceCache {
        let mut cache = pool.new_sequence();
        cache.reserve(positions).unwrap();
        for p in 0..positions {
            for layer in 0..2 {
                // Two KV heads of three floats.
                let (at, l) = (seed + p as f32, layer as f32);
                let row = [at, l, 0.5, 100.0 + at, l, 1.5];
                cache.write(layer, p, &row, &row.map(|v| -v));
            }
        }
        cache.advance(positions);
        cache
    }

    #[test]
    fn blocks_follow_the_cached_positions_and_return_to_the_pool() {
        let pool = KvPool::new(2, 2, 3, 10);
        let mut cache = filled(&pool, 40, 0.0);
        assert_eq!((cache.blocks(), pool.in_use(), pool.free()), (3, 3, 7));
        assert_eq!(cache.full_blocks().len(), 2);
        assert_eq!(widened(cache.key(1, 0, 33)), [33.0, 1.0, 0.5]);
        assert_eq!(widened(cache.key(1, 1, 33)), [133.0, 1.0, 1.5]);
        assert_eq!(widened(cache.value(0, 0, 17)), [-17.0, -0.0, -0.5]);
        assert_eq!(widened(cache.value(0, 1, 17)), [-117.0, -0.0, -1.5]);
        cache.truncate(16);
        assert_eq!((cache.blocks(), pool.in_use()), (1, 1));
        drop(cache);
        assert_eq!(pool.in_use(), 0);
    }

    /// The cache rounds to the nearest f16, ties to even, overflowing to ±∞; F16C's
    /// conversion (what `to_kv` runs on this CPU, where it has one) and the software
    /// rounding (a CPU without) agree on every one of the 2^32 inputs, NaNs included.
    #[test]
    fn kv_rounding_is_the_same_with_and_without_f16c_on_every_input() {
        let stored = |x: f32| {
            let mut out = [f16::ZERO];
            to_kv(&[x], &mut out);
            out[0].to_bits()
        };
        let one = f16::ONE.to_bits();
        assert_eq!(
            stored(1.0 + 2f32.powi(-11)),
            one,
            "a tie rounds to even (down)"
        );
        assert_eq!(
            stored(1.0 + 3.0 * 2f32.powi(-11)),
            one + 2,
            "a tie rounds to even (up)"
        );
        assert_eq!(stored(65519.0), f16::MAX.to_bits());
        assert_eq!(stored(65520.0), f16::INFINITY.to_bits());
        assert_eq!(stored(-1e9), f16::NEG_INFINITY.to_bits());
        assert!(f16::from_bits(stored(f32::NAN)).is_nan());
        let slices: Vec<u32> = (0..1u32 << 16).collect();
        let mismatch = slices.chunks(64).find_map(|chunk| {
            let mut inputs = Vec::with_capacity(chunk.len() << 16);
            for &high in chunk {
                inputs.extend((0..1u32 << 16).map(|low| f32::from_bits(high << 16 | low)));
            }
            let mut out = vec![f16::ZERO; inputs.len()];
            to_kv(&inputs, &mut out);
            inputs
                .iter()
                .zip(&out)
                .find(|(x, h)| f16::from_f32_const(**x).to_bits() != h.to_bits())
                .map(|(x, _)| x.to_bits())
        });
        assert_eq!(mismatch, None, "f32 bits {mismatch:x?} round differently");
    }

    #[test]
    fn blocks_kept_elsewhere_get_distinct_slots_reused_once_dropped() {
        let pool = KvPool::elsewhere(2, 2, 3, 4, 4);
        assert_eq!(pool.block_bytes(), 2 * 2 * 2 * BLOCK_POSITIONS * 3 * 4);
        let mut first = pool.new_sequence();
        assert_eq!(first.reserve(40).unwrap(), None);
        first.advance(40);
        assert_eq!(first.slots(), [0, 1, 2]);
        // Continuing 18 positions (mid-block) shares two blocks and copies the second
        // before writing: the copy is the backend's to make.
        let mut second = SequenceCache::from_prefix(&pool, first.blocks.clone(), 18).unwrap();
        assert_eq!(
            second.reserve(1).unwrap(),
            Some(BlockCopy { from: 1, to: 3 })
        );
        second.advance(1);
        assert_eq!(second.slots(), [0, 3]);
        assert_eq!(pool.free(), 0);
        drop(first);
        assert_eq!(pool.in_use(), 2, "the shared first block is still held");
        let mut third = pool.new_sequence();
        assert_eq!(third.reserve(32).unwrap(), None);
        let mut reused = third.slots();
        reused.sort_unstable();
        assert_eq!(reused, [1, 2], "dropped slots are reused");
        third.advance(32);
        assert!(third.reserve(1).is_err(), "the pool is full");
        let config = LlamaConfig {
            neox_rope: false,
            hidden: 6,
            feed_forward: 6,
            layers: 2,
            heads: 2,
            kv_heads: 2,
            head_dim: 3,
            rope_dimensions: 3,
            rope_base: 10_000.0,
            rope_scale: 1.0,
            norm_eps: 1e-5,
            context: 64,
            head_norms: false,
            gemma: None,
        };
        assert!(!third.fits(&config), "the kernels hold no values for it");
        assert!(KvPool::new(2, 2, 3, 1).new_sequence().fits(&config));
    }

    #[test]
    fn a_full_pool_refuses_with_the_numbers() {
        let pool = KvPool::new(2, 2, 3, 2);
        let mut cache = pool.new_sequence();
        assert_eq!(cache.blocks_needed(33), 3);
        let err = cache.reserve(33).unwrap_err();
        assert_eq!(
            err,
            KernelError::KvMemoryFull {
                needed: 1,
                free: 0,
                capacity: 2
            }
        );
        assert!(err.to_string().contains("KV cache"), "{err}");
    }

    #[test]
    fn a_shared_partial_block_is_copied_before_it_is_written() {
        let pool = KvPool::new(2, 2, 3, 10);
        let first = filled(&pool, 20, 0.0);
        // A second sequence continues the first 18 positions (mid-block).
        let mut second = SequenceCache::from_prefix(&pool, first.blocks.clone(), 18).unwrap();
        assert_eq!(pool.in_use(), 2, "shared, not copied");
        assert_eq!(second.blocks_needed(1), 1, "the shared tail is copied");
        second.reserve(1).unwrap();
        second.write(0, 18, &[9.0; 6], &[8.0; 6]);
        second.advance(1);
        assert_eq!(pool.in_use(), 3);
        assert_eq!(widened(second.key(0, 1, 18)), [9.0, 9.0, 9.0]);
        assert_eq!(
            widened(first.key(0, 0, 18)),
            [18.0, 0.0, 0.5],
            "the original is untouched"
        );
        assert_eq!(
            widened(second.key(1, 1, 17)),
            widened(first.key(1, 1, 17)),
            "the prefix is the same"
        );
        // Whole shared blocks are never copied: appending after a block boundary.
        let third = SequenceCache::from_prefix(&pool, first.blocks.clone(), 16).unwrap();
        assert_eq!(third.blocks_needed(4), 1);
    }

    #[test]
    fn a_prefix_must_come_from_the_same_pool_and_cover_its_positions() {
        let (pool, other) = (KvPool::new(2, 2, 3, 10), KvPool::new(2, 2, 3, 10));
        let cache = filled(&other, 16, 0.0);
        assert!(SequenceCache::from_prefix(&pool, cache.blocks.clone(), 16).is_err());
        assert!(SequenceCache::from_prefix(&other, cache.blocks.clone(), 17).is_err());
    }
}
