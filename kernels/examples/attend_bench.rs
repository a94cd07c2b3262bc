//! Attention alone at decode shape: SmolLM2's 30 layers × 3 KV heads × 3 query heads of
//! width 64, over POSITIONS cached positions (half precision) in 16-position blocks laid
//! out as the KV pool lays them out. Prints ns per (query head, key). A benchmark, not a test.
//! `cargo run --release -p sharemesh-kernels --example attend_bench [POSITIONS] [ROUNDS]`;
//! `EVICT=1` streams 96 MB (SmolLM2's weights) before each round, so the cache comes
//! from memory as it does between two decoded tokens.
use std::time::Instant;

use half::f16;
use sharemesh_kernels::attention::{attend_heads, AttendScratch};

fn main() {
    let positions: usize = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(600);
    let rounds: usize = std::env::args()
        .nth(2)
        .and_then(|p| p.parse().ok())
        .unwrap_or(20);
    let (layers, kv_heads, group, dim, block) = (30, 3, 3, 64, 16);
    let block_len = layers * 2 * kv_heads * block * dim;
    let blocks: Vec<Vec<f16>> = (0..positions.div_ceil(block))
        .map(|b| {
            (0..block_len)
                .map(|i| f16::from_f32(((i + b) as f32 * 0.001).sin()))
                .collect()
        })
        .collect();
    let at = |layer: usize, kind: usize, head: usize, j: usize| {
        let offset = (((layer * 2 + kind) * kv_heads + head) * block + j % block) * dim;
        &blocks[j / block][offset..][..dim]
    };
    let queries: Vec<f32> = (0..group * dim).map(|i| (i as f32 * 0.01).cos()).collect();
    let mut out = vec![0f32; group * dim];
    let mut scratch = AttendScratch::default();
    let mut best = f64::MAX;
    let evict = std::env::var_os("EVICT").is_some();
    let mut weights = vec![1u8; if evict { 96 << 20 } else { 0 }];
    for _ in 0..rounds {
        for byte in weights.iter_mut() {
            *byte = byte.wrapping_add(1);
        }
        let started = Instant::now();
        for layer in 0..layers {
            for head in 0..kv_heads {
                attend_heads(
                    &queries,
                    dim,
                    |j| at(layer, 0, head, j),
                    |j| at(layer, 1, head, j),
                    0..positions,
                    0.125,
                    None,
                    &mut scratch,
                    &mut out,
                );
            }
        }
        best = best.min(started.elapsed().as_secs_f64());
    }
    let pairs = (layers * kv_heads * group * positions) as f64;
    println!(
        "{positions} positions: {:.3} ms per token, {:.2} ns per (query head, key), KV {:.1} MB",
        best * 1e3,
        best * 1e9 / pairs,
        (layers * kv_heads * 2 * positions * dim * 2) as f64 / 1e6
    );
}
