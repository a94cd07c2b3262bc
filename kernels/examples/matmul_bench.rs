//! Throughput of the quantized matmul on random weights shaped like SmolLM2-135M's
//! feed-forward layer: `cargo run --release -p sharemesh-kernels --example matmul_bench
//! [THREADS] [ISA]`. Prints GMAC/s per block type for decode (1 row), batched decode (8 rows) and prefill (64 rows) per instruction set.

use std::time::Instant;

use sharemesh_kernels::blocks::BlockType;
use sharemesh_kernels::dot::Isa;
use sharemesh_kernels::matmul::matmul;
use sharemesh_kernels::quant::{quantize_rows, Matrix};

fn random_bytes(len: usize, seed: &mut u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 24) as u8
        })
        .collect()
}

fn matrix(block_type: BlockType, rows: usize, cols: usize, seed: &mut u64) -> Matrix {
    let bytes = block_type.bytes();
    let mut data = random_bytes(rows * cols / block_type.elements() * bytes, seed);
    // Keep scales finite: a small positive f16 (0x2000 ≈ 0.0078) for every block's
    // f16 fields (Q6_K keeps its one at the end).
    let halves: &[usize] = match block_type {
        BlockType::Q6_K => &[208],
        BlockType::Q4_0 | BlockType::Q5_0 | BlockType::Q8_0 => &[0],
        _ => &[0, 2],
    };
    for block in data.chunks_exact_mut(bytes) {
        for &at in halves {
            block[at] = 0x00;
            block[at + 1] = 0x20;
        }
    }
    Matrix::new("bench", block_type, rows, cols, data).expect("well-formed")
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool");
    let mut seed = 0x9E37_79B9_7F4A_7C15;
    let only = std::env::args().nth(2);
    let isas: Vec<Isa> = Isa::available()
        .into_iter()
        .filter(|isa| only.as_deref().is_none_or(|name| name == isa.name()))
        .collect();
    for block_type in [
        BlockType::Q4_1,
        BlockType::Q5_1,
        BlockType::Q8_0,
        BlockType::Q6_K,
    ] {
        // K-quants need rows of whole 256-element super-blocks.
        let cols = if block_type.elements() == 256 {
            512
        } else {
            576
        };
        let weights = matrix(block_type, 1536, cols, &mut seed);
        for rows in [1usize, 8, 64] {
            let values: Vec<f32> = random_bytes(rows * cols, &mut seed)
                .into_iter()
                .map(|b| f32::from(b) / 64.0 - 2.0)
                .collect();
            let acts = quantize_rows(&values, cols);
            let mut out = vec![0f32; rows * 1536];
            for isa in &isas {
                let repeats = 2560 / rows;
                let started = Instant::now();
                pool.install(|| {
                    for _ in 0..repeats {
                        matmul(*isa, &weights, &acts, &mut out);
                    }
                });
                let seconds = started.elapsed().as_secs_f64();
                let macs = (repeats * rows * 1536 * cols) as f64;
                println!(
                    "{:5} {:6} rows={rows:3} threads={threads}: {:6.2} GMAC/s",
                    block_type.name(),
                    isa.name(),
                    macs / seconds / 1e9
                );
            }
        }
    }
}
