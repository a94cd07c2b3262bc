//! Decode-shaped matmuls streaming from memory: 64 distinct 1536×576 Q4_1 matrices
//! (~68 MB, beyond the caches), one activation row each, as one decode step walks a
//! model's layers. Prints the effective weight bandwidth against a plain read of the
//! same bytes. `cargo run --release -p sharemesh-kernels --example decode_stream [ISA] [MATRICES]`;
//! `ROWS=192` sets another row count (SmolLM2's k/v shape), `Q8=1` Q8_0 blocks (its head).
use std::time::Instant;

use sharemesh_kernels::blocks::BlockType;
use sharemesh_kernels::dot::Isa;
use sharemesh_kernels::matmul::matmul;
use sharemesh_kernels::quant::{quantize_rows, Matrix};

fn main() {
    let only = std::env::args().nth(1);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 24) as u8
    };
    // A second argument sets how many matrices (1 stays in cache: the kernel's own speed).
    let count: usize = std::env::args()
        .nth(2)
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let rows: usize = std::env::var("ROWS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1536);
    let cols = 576;
    let (kind, block) = if std::env::var("Q8").is_ok() {
        (BlockType::Q8_0, 34)
    } else {
        (BlockType::Q4_1, 20)
    };
    let matrices: Vec<Matrix> = (0..count)
        .map(|_| {
            let mut data: Vec<u8> = (0..rows * cols / 32 * block).map(|_| next()).collect();
            for block in data.chunks_exact_mut(block) {
                block[1] = 0x20;
                block[3] = 0x20;
            }
            Matrix::new("bench", kind, rows, cols, data).expect("well-formed")
        })
        .collect();
    let gguf_bytes = (count * rows * cols / 32 * block) as f64;
    let values: Vec<f32> = (0..cols).map(|_| f32::from(next()) / 64.0 - 2.0).collect();
    let acts = quantize_rows(&values, cols);
    let mut out = vec![0f32; rows];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    for isa in Isa::available()
        .into_iter()
        .filter(|isa| only.as_deref().is_none_or(|name| name == isa.name()))
    {
        for _ in 0..3 {
            let started = Instant::now();
            let passes = (3000 / count).max(10);
            pool.install(|| {
                for _ in 0..passes {
                    for m in &matrices {
                        matmul(isa, m, &acts, &mut out);
                    }
                }
            });
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "{:12} {:6.2} GB/s of GGUF weights ({:.2} ms per pass)",
                isa.name(),
                gguf_bytes * passes as f64 / seconds / 1e9,
                seconds * 1e3 / passes as f64
            );
        }
    }
}
