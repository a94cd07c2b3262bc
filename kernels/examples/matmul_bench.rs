//! Throughput of the quantized matmul on random weights shaped like SmolLM2-135M's
//! feed-forward layer: `cargo run --release -p sharemesh-kernels --example matmul_bench
//! [THREADS] [ISA]`. Prints GMAC/s for decode (1 row) and prefill (64 rows) per instruction set.

use std::time::Instant;

use sharemesh_kernels::dot::Isa;
use sharemesh_kernels::matmul::matmul;
use sharemesh_kernels::quant::{quantize_rows, Format, Matrix};

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

fn matrix(format: Format, rows: usize, cols: usize, seed: &mut u64) -> Matrix {
    let mut data = random_bytes(rows * cols / 32 * format.block_bytes(), seed);
    // Keep scales finite: a small positive f16 (0x2000 ≈ 0.0078) in every block.
    for block in data.chunks_exact_mut(format.block_bytes()) {
        block[0] = 0x00;
        block[1] = 0x20;
    }
    Matrix::new("bench", format, rows, cols, data).expect("well-formed")
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
    for format in [Format::Q4_1, Format::Q8_0] {
        let weights = matrix(format, 1536, 576, &mut seed);
        for rows in [1usize, 64] {
            let values: Vec<f32> = random_bytes(rows * 576, &mut seed)
                .into_iter()
                .map(|b| f32::from(b) / 64.0 - 2.0)
                .collect();
            let acts = quantize_rows(&values, 576);
            let mut out = vec![0f32; rows * 1536];
            for isa in &isas {
                let repeats = if rows == 1 { 2000 } else { 40 };
                let started = Instant::now();
                pool.install(|| {
                    for _ in 0..repeats {
                        matmul(*isa, &weights, &acts, &mut out);
                    }
                });
                let seconds = started.elapsed().as_secs_f64();
                let macs = (repeats * rows * 1536 * 576) as f64;
                println!(
                    "{:5} {:6} rows={rows:3} threads={threads}: {:6.2} GMAC/s",
                    format.name(),
                    isa.name(),
                    macs / seconds / 1e9
                );
            }
        }
    }
}
