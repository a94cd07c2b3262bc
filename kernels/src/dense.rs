//! Matrix–vector products with f32 activations, for graphs that keep activations in
//! float (sharemesh's Gemma 3 on candle tensors): f32 weight rows, and Q8_0 rows
//! multiplied block by block without rounding the activations to 8 bits. Parallel over
//! output rows; the AVX2 build of the same code is picked at run time and gives the same
//! bits (the operation order is spelled out, and Rust never fuses a multiply and add).

#![allow(unsafe_code)] // `target_feature` functions only, called after detection.

use rayon::prelude::*;

use crate::ops::dot;
use crate::quant::hsum8;

/// Output rows per parallel piece.
const PIECE: usize = 256;

/// Bytes of one Q8_0 block: an f16 scale, then 32 signed quants.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// `out[r] = weights[r·n .. (r+1)·n] · x` with `n = x.len()`.
pub fn matrix_vector_f32(weights: &[f32], x: &[f32], out: &mut [f32]) {
    assert_eq!(
        weights.len(),
        out.len() * x.len(),
        "weights are not out × x"
    );
    rows_in_parallel(
        out,
        |first, outputs| f32_rows(weights, x, first, outputs),
        // SAFETY: called only after the CPU reported AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        |first, outputs| unsafe { f32_rows_avx2(weights, x, first, outputs) },
    );
}

/// `out[r]` = Q8_0 row `r` of `blocks` · `x`: per block `d · Σ qᵢxᵢ` (eight lanes of
/// four products, then [`hsum8`]), blocks summed in order.
pub fn q8_0_matrix_vector(blocks: &[u8], x: &[f32], out: &mut [f32]) {
    assert!(
        x.len().is_multiple_of(32),
        "Q8_0 rows hold whole 32-element blocks"
    );
    let row_bytes = x.len() / 32 * Q8_0_BLOCK_BYTES;
    assert_eq!(
        blocks.len(),
        out.len() * row_bytes,
        "blocks are not out × x"
    );
    rows_in_parallel(
        out,
        |first, outputs| q8_0_rows(blocks, x, first, outputs),
        // SAFETY: called only after the CPU reported AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        |first, outputs| unsafe { q8_0_rows_avx2(blocks, x, first, outputs) },
    );
}

/// Runs pieces of `out` on the rayon pool, each through `avx2` where the CPU has AVX2
/// and FMA, else through `plain` (`work(first_row, outputs)`).
fn rows_in_parallel(
    out: &mut [f32],
    plain: impl Fn(usize, &mut [f32]) + Sync,
    #[cfg(target_arch = "x86_64")] avx2: impl Fn(usize, &mut [f32]) + Sync,
) {
    let use_avx2 = has_avx2();
    out.par_chunks_mut(PIECE)
        .enumerate()
        .for_each(|(piece, outputs)| {
            let first = piece * PIECE;
            #[cfg(target_arch = "x86_64")]
            if use_avx2 {
                return avx2(first, outputs);
            }
            plain(first, outputs);
        });
}

#[inline(always)]
fn f32_rows(weights: &[f32], x: &[f32], first: usize, outputs: &mut [f32]) {
    let inner = x.len();
    for (i, output) in outputs.iter_mut().enumerate() {
        *output = dot(&weights[(first + i) * inner..][..inner], x);
    }
}

#[inline(always)]
fn q8_0_rows(blocks: &[u8], x: &[f32], first: usize, outputs: &mut [f32]) {
    let row_bytes = x.len() / 32 * Q8_0_BLOCK_BYTES;
    for (i, output) in outputs.iter_mut().enumerate() {
        let row = &blocks[(first + i) * row_bytes..][..row_bytes];
        let mut total = 0f32;
        for (block, xs) in row.chunks_exact(Q8_0_BLOCK_BYTES).zip(x.chunks_exact(32)) {
            let scale = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            let mut lanes = [0f32; 8];
            for (q, v) in block[2..].chunks_exact(8).zip(xs.chunks_exact(8)) {
                for lane in 0..8 {
                    lanes[lane] += f32::from(q[lane] as i8) * v[lane];
                }
            }
            total += scale * hsum8(lanes);
        }
        *output = total;
    }
}

/// [`f32_rows`] compiled with AVX2 (it and the dot products it inlines).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn f32_rows_avx2(weights: &[f32], x: &[f32], first: usize, outputs: &mut [f32]) {
    f32_rows(weights, x, first, outputs);
}

/// [`q8_0_rows`] compiled with AVX2.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_0_rows_avx2(blocks: &[u8], x: &[f32], first: usize, outputs: &mut [f32]) {
    q8_0_rows(blocks, x, first, outputs);
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_rows_equal_their_dot_products() {
        let (rows, cols) = (300, 40);
        let weights: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.01).sin()).collect();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.7).cos()).collect();
        let mut out = vec![0f32; rows];
        matrix_vector_f32(&weights, &x, &mut out);
        for (r, value) in out.iter().enumerate() {
            assert_eq!(
                value.to_bits(),
                dot(&weights[r * cols..][..cols], &x).to_bits()
            );
        }
    }

    #[test]
    fn q8_0_rows_equal_the_dequantized_product() {
        let (rows, blocks) = (300, 3);
        let cols = blocks * 32;
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.3).sin()).collect();
        let mut bytes = Vec::new();
        let mut dequantized = Vec::new();
        for r in 0..rows {
            for b in 0..blocks {
                let scale = half::f16::from_f32(0.01 + (r * blocks + b) as f32 * 1e-4);
                bytes.extend(scale.to_le_bytes());
                for e in 0..32 {
                    let q = ((r * 7 + b * 13 + e * 29) % 255) as i32 - 127;
                    bytes.push(q as i8 as u8);
                    dequantized.push(f64::from(scale.to_f32()) * f64::from(q));
                }
            }
        }
        let mut out = vec![0f32; rows];
        q8_0_matrix_vector(&bytes, &x, &mut out);
        for (r, value) in out.iter().enumerate() {
            let reference: f64 = dequantized[r * cols..][..cols]
                .iter()
                .zip(&x)
                .map(|(w, v)| w * f64::from(*v))
                .sum();
            assert!(
                (f64::from(*value) - reference).abs() < 1e-4,
                "{value} vs {reference}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "whole 32-element blocks")]
    fn q8_0_rejects_partial_blocks() {
        q8_0_matrix_vector(&[], &[0.0; 31], &mut []);
    }
}
