//! AVX-512 loops of the attention: the AVX2 arithmetic per (head, key) and per output
//! element, but each cached row is loaded once for several heads of the group. Scores
//! run the AVX2 group kernel with AVX-512's 32 registers (three heads × eight keys of
//! accumulators); value sums run 16 dimensions per register, which changes nothing in
//! the arithmetic (each element sums its own positions, in order, from zero).

// Group kernels index heads (g), keys (i) and registers (r) of several arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use half::f16;

use super::avx2::{prefetch_rows, scores_pass, AHEAD, KEYS};

/// Heads whose scores share each loaded key row.
const SCORE_HEADS: usize = 3;
/// Heads whose value sums share each loaded value row.
const VALUE_HEADS: usize = 4;
/// Registers of one head's value sum (64 dimensions).
const VALUE_REGISTERS: usize = 4;
/// As [`super::avx2::scores`], up to three heads per pass over the keys.
///
/// # Safety
/// AVX2, F16C, AVX-512 F/VL/BW; every query and key is `dim` long, a multiple of 8;
/// `scores` holds heads · n.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw")]
pub(super) unsafe fn scores(
    queries: &[f32],
    dim: usize,
    keys: &[&[f16]],
    scale: f32,
    scores: &mut [f32],
) {
    let positions = keys.len();
    let heads = queries.len() / dim;
    let mut first = 0;
    while first < heads {
        let count = SCORE_HEADS.min(heads - first);
        let queries = &queries[first * dim..(first + count) * dim];
        let scores = &mut scores[first * positions..(first + count) * positions];
        // SAFETY (each): the caller's promise, for the heads of this pass.
        unsafe {
            match count {
                1 => scores_pass::<1>(queries, dim, keys, scale, scores),
                2 => scores_pass::<2>(queries, dim, keys, scale, scores),
                _ => scores_pass::<3>(queries, dim, keys, scale, scores),
            }
        }
        first += count;
    }
}

/// As [`super::avx2::weighted_sums`], up to four heads per pass over the values, in
/// runs of 64 dimensions (four registers per head; a last partial register masked).
///
/// # Safety
/// AVX2, F16C, AVX-512 F/VL/BW; every value row is `out.len() / heads` long.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw")]
pub(super) unsafe fn weighted_sums(weights: &[f32], values: &[&[f16]], out: &mut [f32]) {
    let positions = values.len().max(1);
    let heads = weights.len() / positions;
    let dim = out.len() / heads.max(1);
    let mut first = 0;
    while first < heads {
        let count = VALUE_HEADS.min(heads - first);
        let weights = &weights[first * positions..(first + count) * positions];
        let out = &mut out[first * dim..(first + count) * dim];
        let mut at = 0;
        while at < dim {
            let width = (16 * VALUE_REGISTERS).min(dim - at);
            // SAFETY (each): `at + width ≤ dim`, every row `dim` long.
            unsafe {
                match count {
                    1 => value_pass::<1>(weights, values, dim, at, width, out),
                    2 => value_pass::<2>(weights, values, dim, at, width, out),
                    3 => value_pass::<3>(weights, values, dim, at, width, out),
                    _ => value_pass::<4>(weights, values, dim, at, width, out),
                }
            }
            at += width;
        }
        first += count;
    }
}

/// `out_h[at..at + width] = Σ_j weights_h[j] · values[j][at..at + width]` for `G`
/// heads, each element summing its positions in order from zero.
///
/// # Safety
/// As [`weighted_sums`]; `width ≤ 64`, `at + width ≤ dim`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw")]
unsafe fn value_pass<const G: usize>(
    weights: &[f32],
    values: &[&[f16]],
    dim: usize,
    at: usize,
    width: usize,
    out: &mut [f32],
) {
    let positions = values.len();
    let masks: [__mmask16; VALUE_REGISTERS] = std::array::from_fn(|r| {
        let lanes = width.saturating_sub(16 * r).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    });
    let mut acc = [[_mm512_setzero_ps(); VALUE_REGISTERS]; G];
    for (j, v) in values.iter().enumerate() {
        if at == 0 && j % KEYS == 0 {
            prefetch_rows(values, j + AHEAD..j + AHEAD + KEYS);
        }
        let v = v.as_ptr();
        // SAFETY: masked lanes are not read; the rest lie inside the row.
        let x: [__m512; VALUE_REGISTERS] = std::array::from_fn(|r| {
            _mm512_cvtph_ps(unsafe {
                _mm256_maskz_loadu_epi16(masks[r], v.add(at + 16 * r).cast())
            })
        });
        for g in 0..G {
            let p = _mm512_set1_ps(weights[g * positions + j]);
            for r in 0..VALUE_REGISTERS {
                acc[g][r] = _mm512_add_ps(acc[g][r], _mm512_mul_ps(p, x[r]));
            }
        }
    }
    for g in 0..G {
        for r in 0..VALUE_REGISTERS {
            // SAFETY: masked lanes are not written; the rest lie inside head g's output.
            unsafe {
                _mm512_mask_storeu_ps(
                    out.as_mut_ptr().add(g * dim + at + 16 * r),
                    masks[r],
                    acc[g][r],
                )
            };
        }
    }
}
