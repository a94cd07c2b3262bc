//! Prefix reuse by block hashing: every full KV block a job fills is indexed under a
//! hash of all the tokens up to its end (a chain: each block's hash covers the one
//! before it), so a later job — a chat's next turn, jobs sharing a system prompt, a
//! failover resuming at the standby that warmed up on the same job — starts from the
//! blocks of its longest indexed prefix instead of prefilling it. A block's contents
//! depend only on those tokens (batch invariance), so reuse is exact.
//!
//! A prefix need not end at a block boundary: past its last whole indexed block, a job
//! also takes the first positions of an indexed block that continues the same chain
//! with tokens its own next ones begin with (a system prompt of 24 tokens shares 24
//! positions, not 16). It shares that block too, and copies it before writing into it
//! (`SequenceCache`); positions past the shared ones are never read before the job
//! writes its own.
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

/// The hash block `index` of a chain continues: the previous block's, or the salt for
/// the first.
pub(crate) fn parent_of<'a>(
    chain: &'a [BlockHash],
    salt: &'a BlockHash,
    index: usize,
) -> &'a BlockHash {
    index
        .checked_sub(1)
        .map_or(salt, |previous| &chain[previous])
}

struct Indexed {
    block: Arc<KvBlock>,
    /// The hash of the block before it (the salt for a first block) and its tokens: what
    /// a job that shares only part of it compares with.
    parent: BlockHash,
    tokens: [u32; BLOCK_POSITIONS],
    last_used: u64,
}

/// The longest indexed prefix of a job's tokens: its blocks, in order (the last one
/// possibly shared only in part), and how many positions they give.
#[derive(Default)]
pub(crate) struct PrefixMatch {
    pub(crate) blocks: Vec<Arc<KvBlock>>,
    pub(crate) positions: usize,
}

/// One model's indexed blocks.
#[derive(Default)]
pub(crate) struct PrefixIndex {
    blocks: HashMap<BlockHash, Indexed>,
    /// Indexed blocks by the hash they continue (the salt for first blocks).
    children: HashMap<BlockHash, Vec<BlockHash>>,
    clock: u64,
}

impl PrefixIndex {
    /// The longest indexed prefix of `tokens` (salted with `salt`; `chain` the hashes of
    /// its full blocks): every indexed whole block in order, then the first positions of
    /// the indexed block after them whose tokens begin as the job's next ones do.
    pub(crate) fn longest(
        &mut self,
        salt: &BlockHash,
        chain: &[BlockHash],
        tokens: &[u32],
    ) -> PrefixMatch {
        self.clock += 1;
        let mut found = PrefixMatch::default();
        for hash in chain {
            let Some(indexed) = self.blocks.get_mut(hash) else {
                break;
            };
            indexed.last_used = self.clock;
            found.blocks.push(Arc::clone(&indexed.block));
        }
        let whole = found.blocks.len();
        found.positions = whole * BLOCK_POSITIONS;
        let next = &tokens[found.positions.min(tokens.len())..];
        let parent = parent_of(chain, salt, whole);
        let partial = self
            .children
            .get(parent)
            .into_iter()
            .flatten()
            .map(|child| {
                let shared = self.blocks[child]
                    .tokens
                    .iter()
                    .zip(next)
                    .take_while(|(a, b)| a == b)
                    .count();
                (shared, *child)
            })
            .max_by_key(|&(shared, _)| shared);
        if let Some((shared, child)) = partial.filter(|&(shared, _)| shared > 0) {
            let indexed = self.blocks.get_mut(&child).expect("children are indexed");
            indexed.last_used = self.clock;
            found.blocks.push(Arc::clone(&indexed.block));
            found.positions += shared;
        }
        found
    }

    /// Indexes `block`, whose tokens are `tokens`, under `hash`, continuing the block
    /// hashed `parent` (a block already indexed there stays).
    pub(crate) fn insert(
        &mut self,
        hash: BlockHash,
        parent: &BlockHash,
        tokens: &[u32; BLOCK_POSITIONS],
        block: &Arc<KvBlock>,
    ) {
        self.clock += 1;
        let clock = self.clock;
        if let Some(indexed) = self.blocks.get_mut(&hash) {
            indexed.last_used = clock;
            return;
        }
        self.blocks.insert(
            hash,
            Indexed {
                block: Arc::clone(block),
                parent: *parent,
                tokens: *tokens,
                last_used: clock,
            },
        );
        self.children.entry(*parent).or_default().push(hash);
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
            let Some(gone) = self.blocks.remove(hash) else {
                continue;
            };
            if let Some(siblings) = self.children.get_mut(&gone.parent) {
                siblings.retain(|sibling| sibling != hash);
                if siblings.is_empty() {
                    self.children.remove(&gone.parent);
                }
            }
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
        index_into(&mut index, &chain, &tokens, filled.full_blocks());
        assert_eq!(index.evictable(), 0, "the sequence still holds them");
        let mut other = tokens.clone();
        other[40] = 7;
        let longest = |index: &mut PrefixIndex, tokens: &[u32]| {
            let found = index.longest(&SALT, &chain_of(tokens), tokens);
            (found.blocks.len(), found.positions)
        };
        // Two whole blocks, then block 2's first eight positions (40 differs).
        assert_eq!(longest(&mut index, &other), (3, 40));
        assert_eq!(longest(&mut index, &other[..36]), (3, 36));
        assert_eq!(longest(&mut index, &tokens[..47]), (3, 47));
        other[20] = 7;
        assert_eq!(longest(&mut index, &other), (2, 20), "block 1 in part");
        other[0] = 7;
        assert_eq!(longest(&mut index, &other), (0, 0));
        drop(filled);
        assert_eq!((index.evictable(), pool.in_use()), (3, 3));
        // Block 0 was used last by the lookups above: 2, then 1, go first.
        assert_eq!(index.evict(1), 1);
        assert_eq!((index.len(), pool.in_use()), (2, 2));
        assert_eq!(
            longest(&mut index, &tokens),
            (2, 32),
            "an evicted block is no part"
        );
        assert_eq!(index.evict(5), 2);
        assert_eq!(pool.in_use(), 0);
        assert!(index.children.is_empty(), "no child outlives its block");
    }

    const SALT: BlockHash = [0; 32];

    /// Indexes `blocks` as the full blocks of `tokens` (hashed `chain`, salted `SALT`).
    fn index_into(
        index: &mut PrefixIndex,
        chain: &[BlockHash],
        tokens: &[u32],
        blocks: &[Arc<KvBlock>],
    ) {
        let (block_tokens, _) = tokens.as_chunks::<BLOCK_POSITIONS>();
        let full = chain.iter().zip(blocks).zip(block_tokens);
        for (i, ((hash, block), tokens)) in full.enumerate() {
            index.insert(*hash, parent_of(chain, &SALT, i), tokens, block);
        }
    }

    /// Of two indexed blocks continuing the same prefix, a job takes the one sharing
    /// more of its next tokens; another buyer's (another salt) shares nothing.
    #[test]
    fn a_partial_block_is_the_continuation_sharing_most_tokens() {
        let pool = KvPool::new(1, 1, 2, 10);
        let shared: Vec<u32> = (0..16).collect();
        let tail = |from: u32, same: usize| -> Vec<u32> {
            let mut tokens = shared.clone();
            tokens.extend((0..16).map(|i| {
                if i < same {
                    100 + i as u32
                } else {
                    from + i as u32
                }
            }));
            tokens
        };
        let (a, b) = (tail(500, 3), tail(900, 9));
        let mut index = PrefixIndex::default();
        for tokens in [&a, &b] {
            let blocks: Vec<_> = (0..2)
                .map(|_| Arc::new(pool.take_block().unwrap()))
                .collect();
            index_into(&mut index, &chain_of(tokens), tokens, &blocks);
        }
        assert_eq!(index.len(), 3, "block 0 is indexed once");
        let mut job = tail(0, 12);
        job.truncate(30);
        let found = index.longest(&SALT, &chain_of(&job), &job);
        assert_eq!((found.blocks.len(), found.positions), (2, 16 + 9));
        let other_buyer = index.longest(&[7; 32], &salted_chain(&[7; 32], &job), &job);
        assert_eq!((other_buyer.blocks.len(), other_buyer.positions), (0, 0));
    }
}
