//! Prefix reuse by block hashing: every full KV block a job fills is indexed under a
//! hash of all the tokens up to its end (a chain: each block's hash covers the one
//! before it), so a later job — a chat's next turn, jobs sharing a system prompt, a
//! failover resuming at the standby that warmed up on the same job — starts from the
//! blocks of its longest indexed prefix instead of prefilling it. A block's contents
//! depend only on those tokens (batch invariance), so reuse is exact.
//!
//! Indexed blocks nobody else holds stay in the pool until it needs room; then the
//! least recently used go first.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use sharemesh_kernels::llama::{KvBlock, BLOCK_POSITIONS};

/// The hash of a prefix that ends at a block boundary.
pub(crate) type BlockHash = [u8; 32];

const DOMAIN: &[u8] = b"sharemesh/kv-prefix/v1";

/// The hash of the block of `tokens` (one block's worth) that follows the block hashed
/// `previous` (for the first block: the job's salt).
pub(crate) fn next_hash(previous: &BlockHash, tokens: &[u32]) -> BlockHash {
    let mut hasher = Sha256::new();
    hasher.update(DOMAIN);
    hasher.update(previous);
    for token in tokens {
        hasher.update(token.to_le_bytes());
    }
    hasher.finalize().into()
}

/// Extends `chain` (the hashes of the first `chain.len()` blocks of `tokens`, salted
/// with `salt`) to every full block of `tokens`.
pub(crate) fn extend_chain(chain: &mut Vec<BlockHash>, salt: &BlockHash, tokens: &[u32]) {
    for block in tokens.chunks_exact(BLOCK_POSITIONS).skip(chain.len()) {
        let hash = next_hash(chain.last().unwrap_or(salt), block);
        chain.push(hash);
    }
}

struct Indexed {
    block: Arc<KvBlock>,
    last_used: u64,
}

/// One model's indexed blocks.
#[derive(Default)]
pub(crate) struct PrefixIndex {
    blocks: HashMap<BlockHash, Indexed>,
    clock: u64,
}

impl PrefixIndex {
    /// The blocks of the longest indexed prefix of `chain`, in order.
    pub(crate) fn longest(&mut self, chain: &[BlockHash]) -> Vec<Arc<KvBlock>> {
        self.clock += 1;
        let mut found = Vec::new();
        for hash in chain {
            let Some(indexed) = self.blocks.get_mut(hash) else {
                break;
            };
            indexed.last_used = self.clock;
            found.push(Arc::clone(&indexed.block));
        }
        found
    }

    /// Indexes `block` under `hash` (a block already indexed there stays).
    pub(crate) fn insert(&mut self, hash: BlockHash, block: &Arc<KvBlock>) {
        self.clock += 1;
        let clock = self.clock;
        self.blocks
            .entry(hash)
            .and_modify(|indexed| indexed.last_used = clock)
            .or_insert_with(|| Indexed {
                block: Arc::clone(block),
                last_used: clock,
            });
    }

    /// Indexed blocks that only the index holds: what eviction can give back.
    pub(crate) fn evictable(&self) -> usize {
        self.blocks
            .values()
            .filter(|indexed| Arc::strong_count(&indexed.block) == 1)
            .count()
    }

    /// Drops up to `count` blocks only the index holds, least recently used first, and
    /// says how many it dropped (each one's memory back in the pool).
    pub(crate) fn evict(&mut self, count: usize) -> usize {
        let mut candidates: Vec<(u64, BlockHash)> = self
            .blocks
            .iter()
            .filter(|(_, indexed)| Arc::strong_count(&indexed.block) == 1)
            .map(|(hash, indexed)| (indexed.last_used, *hash))
            .collect();
        candidates.sort_unstable();
        let dropped = candidates.len().min(count);
        for (_, hash) in &candidates[..dropped] {
            self.blocks.remove(hash);
        }
        dropped
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharemesh_kernels::llama::{KvPool, SequenceCache};

    fn chain_of(tokens: &[u32]) -> Vec<BlockHash> {
        salted_chain(&[0; 32], tokens)
    }

    fn salted_chain(salt: &BlockHash, tokens: &[u32]) -> Vec<BlockHash> {
        let mut chain = Vec::new();
        extend_chain(&mut chain, salt, tokens);
        chain
    }

    #[test]
    fn a_block_hash_covers_every_token_before_it() {
        let tokens: Vec<u32> = (0..40).collect();
        let chain = chain_of(&tokens);
        assert_eq!(chain.len(), 2, "only full blocks are hashed");
        let mut changed = tokens.clone();
        changed[3] = 99;
        let other = chain_of(&changed);
        assert_ne!(other[0], chain[0]);
        assert_ne!(
            other[1], chain[1],
            "a change in block 0 changes block 1's hash"
        );
        let mut late = tokens.clone();
        late[20] = 99;
        let late = chain_of(&late);
        assert_eq!(late[0], chain[0]);
        assert_ne!(late[1], chain[1]);
        // Extending a chain continues it.
        let mut grown = chain_of(&tokens[..20]);
        extend_chain(&mut grown, &[0; 32], &tokens);
        assert_eq!(grown, chain);
        // Another salt (another buyer): no block in common.
        let other_buyer = salted_chain(&[7; 32], &tokens);
        assert!(other_buyer.iter().all(|hash| !chain.contains(hash)));
    }

    #[test]
    fn the_longest_prefix_is_found_and_unused_blocks_evicted_oldest_first() {
        let pool = KvPool::new(1, 1, 2, 10);
        let tokens: Vec<u32> = (0..48).collect();
        let chain = chain_of(&tokens);
        // A sequence of 48 positions on three blocks of the pool (the index never
        // looks inside a block, so fresh ones stand in for a forward pass's).
        let blocks = (0..3)
            .map(|_| Arc::new(pool.take_block().unwrap()))
            .collect();
        let filled = SequenceCache::from_prefix(&pool, blocks, 48).unwrap();
        let mut index = PrefixIndex::default();
        for (hash, block) in chain.iter().zip(filled.full_blocks()) {
            index.insert(*hash, block);
        }
        assert_eq!(index.evictable(), 0, "the sequence still holds them");
        let mut other = tokens.clone();
        other[40] = 7;
        assert_eq!(index.longest(&chain_of(&other)).len(), 2);
        assert_eq!(index.longest(&chain_of(&tokens[..47])).len(), 2);
        drop(filled);
        assert_eq!((index.evictable(), pool.in_use()), (3, 3));
        // Block 2 was used last by neither lookup above: it goes first.
        assert_eq!(index.evict(1), 1);
        assert_eq!((index.len(), pool.in_use()), (2, 2));
        assert_eq!(index.longest(&chain).len(), 2);
        assert_eq!(index.evict(5), 2);
        assert_eq!(pool.in_use(), 0);
    }
}
