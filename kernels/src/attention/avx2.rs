//! AVX2 loops of the attention: scores eight keys at a time and value sums held in
//! registers, one head after another, each cached half-precision row widened by F16C
//! as it is loaded. The group kernels are generic over how many heads share each loaded
//! row, so the AVX-512 build (with twice the registers) inlines them for several heads
//! at once.

// Group kernels index heads (g), keys (i) and registers (r) of several arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use half::f16;

/// Keys whose scores are computed together.
pub(super) const KEYS: usize = 8;
/// Dimensions of the value sum held in registers at once (eight registers).
const RUN: usize = 64;
/// How many rows ahead of the one in use the cache is asked to fetch.
pub(super) const AHEAD: usize = 16;

/// Hints the cache to fetch `rows[span]` (those that exist).
#[inline(always)]
pub(super) fn prefetch_rows(rows: &[&[f16]], span: std::ops::Range<usize>) {
    let span = span.start.min(rows.len())..span.end.min(rows.len());
    for row in &rows[span] {
        super::prefetch_row::<_MM_HINT_T0>(row);
    }
}

/// `scores[h · n + j] ← dot(query_h, key_j) · scale` for every head `h` of `queries`
/// and key `j` (`n = keys.len()`), head after head, eight keys at a time.
///
/// # Safety
/// AVX2, F16C; every query and key is `dim` long, a multiple of 8; `scores` holds
/// heads · n.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn scores(
    queries: &[f32],
    dim: usize,
    keys: &[&[f16]],
    scale: f32,
    scores: &mut [f32],
) {
    let positions = keys.len();
    for (query, scores) in queries
        .chunks_exact(dim)
        .zip(scores.chunks_exact_mut(positions))
    {
        // SAFETY: the caller's promise, for one head.
        unsafe { scores_pass::<1>(query, dim, keys, scale, scores) };
    }
}

/// The scores of `G` heads (`queries`: G × dim; `scores`: G × n) over every key,
/// eight keys at a time (a last partial group computes its keys' dots alongside copies
/// of its last key, whose results are dropped: each key's dot is its own chain).
///
/// # Safety
/// AVX2, F16C; every query and key is `dim` long, a multiple of 8; `scores` holds
/// G · n.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn scores_pass<const G: usize>(
    queries: &[f32],
    dim: usize,
    keys: &[&[f16]],
    scale: f32,
    scores: &mut [f32],
) {
    let positions = keys.len();
    let query: [&[f32]; G] = std::array::from_fn(|g| &queries[g * dim..][..dim]);
    let mut at = 0;
    while at < positions {
        prefetch_rows(keys, at + AHEAD..at + AHEAD + KEYS);
        let count = KEYS.min(positions - at);
        let rows: [&[f16]; KEYS] = std::array::from_fn(|i| keys[at + i.min(count - 1)]);
        // SAFETY: the caller's promise.
        let dots = unsafe { scores_group::<G>(query, &rows) };
        for (g, eight) in dots.into_iter().enumerate() {
            for (score, d) in scores[g * positions + at..][..count].iter_mut().zip(eight) {
                *score = d * scale;
            }
        }
        at += count;
    }
}

/// `out_h = Σ_j weights[h · n + j] · values[j]` for every head `h`, head after head, in
/// runs of up to 64 dimensions.
///
/// # Safety
/// AVX2, F16C; every value row is `out.len() / heads` long, a multiple of 8.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn weighted_sums(weights: &[f32], values: &[&[f16]], out: &mut [f32]) {
    let heads = weights.len() / values.len().max(1);
    let dim = out.len() / heads.max(1);
    for (weights, out) in weights
        .chunks_exact(values.len().max(1))
        .zip(out.chunks_exact_mut(dim))
    {
        let mut at = 0;
        while at < dim {
            let width = RUN.min(dim - at);
            // SAFETY: `at + width ≤ dim`, every row `dim` long (the caller's promise).
            unsafe {
                match width / 8 {
                    8 => value_run::<8>(weights, values, at, out),
                    7 => value_run::<7>(weights, values, at, out),
                    6 => value_run::<6>(weights, values, at, out),
                    5 => value_run::<5>(weights, values, at, out),
                    4 => value_run::<4>(weights, values, at, out),
                    3 => value_run::<3>(weights, values, at, out),
                    2 => value_run::<2>(weights, values, at, out),
                    _ => value_run::<1>(weights, values, at, out),
                }
            }
            at += width;
        }
    }
}

/// Eight keys' dots with each of `G` queries, every key row loaded once: per (query,
/// key), eight lanes each summing its products in chunk order from zero, then
/// [`crate::quant::hsum8`]'s pairing — [`crate::ops::dot`]'s bits.
///
/// # Safety
/// AVX2, F16C; every key is as long as every query, a multiple of 8.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn scores_group<const G: usize>(
    queries: [&[f32]; G],
    keys: &[&[f16]; KEYS],
) -> [[f32; KEYS]; G] {
    let rows: [*const f16; KEYS] = std::array::from_fn(|i| keys[i].as_ptr());
    let mut acc = [[_mm256_setzero_ps(); KEYS]; G];
    for c in (0..queries[0].len()).step_by(8) {
        // SAFETY (all loads): c + 8 ≤ the length of every query and key.
        let q: [__m256; G] =
            std::array::from_fn(|g| unsafe { _mm256_loadu_ps(queries[g].as_ptr().add(c)) });
        for i in 0..KEYS {
            let k = unsafe { widen8(rows[i].add(c)) };
            for g in 0..G {
                acc[g][i] = _mm256_add_ps(acc[g][i], _mm256_mul_ps(q[g], k));
            }
        }
    }
    // Loops, not `map`: a closure would not inherit this function's target features.
    let mut dots = [[0f32; KEYS]; G];
    for g in 0..G {
        for i in 0..KEYS {
            dots[g][i] = hsum8(acc[g][i]);
        }
    }
    dots
}

/// The eight half-precision values at `at`, widened to f32 (exact).
///
/// # Safety
/// F16C; eight values are readable at `at`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn widen8(at: *const f16) -> __m256 {
    // SAFETY: the caller's promise.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(at.cast()) })
}

/// `(l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`, as [`crate::quant::hsum8`].
#[inline]
#[target_feature(enable = "avx2")]
fn hsum8(lanes: __m256) -> f32 {
    let quad = _mm_add_ps(
        _mm256_castps256_ps128(lanes),
        _mm256_extractf128_ps(lanes, 1),
    );
    let pairs = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)))
}

/// `out[at..at + 8R] = Σ_j p_j · values[j][at..at + 8R]`, each element summing its
/// positions in order from zero, held in R registers across the positions.
///
/// # Safety
/// AVX2, F16C; `at + 8R` ≤ the length of `out` and of every value row.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn value_run<const R: usize>(
    weights: &[f32],
    values: &[&[f16]],
    at: usize,
    out: &mut [f32],
) {
    let mut acc = [_mm256_setzero_ps(); R];
    for (&p, v) in weights.iter().zip(values) {
        let p = _mm256_set1_ps(p);
        let v = v.as_ptr();
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's promise.
            let x = unsafe { widen8(v.add(at + 8 * r)) };
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(p, x));
        }
    }
    for (r, acc) in acc.into_iter().enumerate() {
        // SAFETY: the caller's promise.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(at + 8 * r), acc) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F16C's widening (what the vector builds load) gives the software conversion's
    /// bits (what the portable build gets on a CPU without it) for all 2^16 values.
    #[test]
    fn widening_is_exact_on_every_half() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
            return;
        }
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        for (chunk, eight) in all.chunks_exact(8).zip(0..) {
            let mut got = [0f32; 8];
            // SAFETY: detected above; the chunk holds eight values.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), widen8(chunk.as_ptr())) };
            for (g, h) in got.iter().zip(chunk) {
                let want = h.to_f32_const();
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "half {:#06x} (chunk {eight})",
                    h.to_bits()
                );
            }
        }
    }
}
