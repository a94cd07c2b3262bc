//! Attention of one row's query heads that share a KV head, over that head's cached
//! positions. The arithmetic is fixed per (row, head): scores are scaled dot products
//! in [`dot`]'s order, softmaxed with the maximum subtracted, and the output is
//! Σ p_j v_j / Σ p_j, every sum in position order — so no output depends on which other
//! heads, rows or sequences are computed alongside it.
//!
//! Where the CPU has AVX2 the same operations run on eight keys at a time (eight
//! independent chains, each key's lanes as [`dot`] orders them) and on the value sum in
//! registers: the same bits (tested against the one-key-at-a-time form), without the
//! per-key lookups and the single dependency chain that made attention a quarter of a
//! batched decode step.

#![allow(unsafe_code)] // the AVX2 build of the loops, called after detection.

use std::ops::Range;

use crate::ops::dot;

/// Reusable buffers of [`attend_heads`]: one task's scores and the rows it reads.
#[derive(Default)]
pub struct AttendScratch<'a> {
    scores: Vec<f32>,
    keys: Vec<&'a [f32]>,
    values: Vec<&'a [f32]>,
}

/// Queries of consecutive heads (`queries.len() = heads × dim`) that share one KV head,
/// attending to its positions `keys` (all of them up to the row's own, or a sliding
/// window's last ones), whose key and value at position `j` are `key(j)` and
/// `value(j)` (each `dim` long). Each head's output goes to its `dim` values of `out`.
#[allow(clippy::too_many_arguments)] // the accessors and the span are one call's inputs
pub fn attend_heads<'a>(
    queries: &[f32],
    dim: usize,
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
    keys: Range<usize>,
    scale: f32,
    scratch: &mut AttendScratch<'a>,
    out: &mut [f32],
) {
    assert!(dim > 0 && queries.len() == out.len() && queries.len().is_multiple_of(dim));
    scratch.keys.clear();
    scratch.values.clear();
    for j in keys {
        let (k, v) = (key(j), value(j));
        assert!(
            k.len() == dim && v.len() == dim,
            "a cached row is not one head wide"
        );
        scratch.keys.push(k);
        scratch.values.push(v);
    }
    let AttendScratch {
        scores,
        keys,
        values,
    } = scratch;
    let build = Build::for_dim(dim);
    for (query, out) in queries.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        attend_one(build, query, keys, values, scale, scores, out);
    }
}

/// Which build of the score and value loops runs; both give the same bits.
#[derive(Clone, Copy)]
enum Build {
    /// The reference order, one key at a time.
    Portable,
    /// Eight keys at a time and value sums in registers: only handed out where the CPU
    /// has AVX2 and the head width is a multiple of 8.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Build {
    fn for_dim(dim: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        if dim.is_multiple_of(8) && std::is_x86_feature_detected!("avx2") {
            return Build::Avx2;
        }
        let _ = dim;
        Build::Portable
    }
}

/// One head: scaled scores, softmax, `Σ p_j v_j`, divided by `Σ p_j`. Every row is
/// `query.len()` long (checked by [`attend_heads`]).
fn attend_one(
    build: Build,
    query: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    scores.clear();
    match build {
        Build::Portable => scores.extend(keys.iter().map(|k| dot(query, k) * scale)),
        // SAFETY: `Build::Avx2` exists only on AVX2 CPUs, for widths a multiple of 8.
        #[cfg(target_arch = "x86_64")]
        Build::Avx2 => unsafe { avx2::scores(query, keys, scale, scores) },
    }
    let total = softmax_in_place(scores);
    match build {
        Build::Portable => {
            out.fill(0.0);
            for (&p, v) in scores.iter().zip(values) {
                for (o, &v) in out.iter_mut().zip(*v) {
                    *o += p * v;
                }
            }
        }
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Build::Avx2 => unsafe { avx2::weighted_sum(scores, values, out) },
    }
    let inverse = 1.0 / total;
    for o in out.iter_mut() {
        *o *= inverse;
    }
}

/// `s ← exp(s − max)` for every score, in order; returns their sum in order.
#[inline(always)]
fn softmax_in_place(scores: &mut [f32]) -> f32 {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
    }
    // Summed apart from the `exp` calls, so the running total stays in a register.
    scores.iter().fold(0f32, |total, &p| total + p)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::ops::dot;

    /// Keys whose scores are computed together.
    const KEYS: usize = 8;
    /// Dimensions of the value sum held in registers at once (eight registers).
    const RUN: usize = 64;

    /// `scores ← dot(query, k) · scale` for every key, eight keys at a time.
    ///
    /// # Safety
    /// AVX2; `query` and every key are the same length, a multiple of 8.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scores(query: &[f32], keys: &[&[f32]], scale: f32, scores: &mut Vec<f32>) {
        let mut batches = keys.chunks_exact(KEYS);
        for batch in &mut batches {
            // SAFETY: the caller's promise.
            let eight = unsafe { scores8(query, batch) };
            scores.extend(eight.map(|d| d * scale));
        }
        scores.extend(batches.remainder().iter().map(|k| dot(query, k) * scale));
    }

    /// `out = Σ_j weights[j] · values[j]` in runs of up to 64 dimensions.
    ///
    /// # Safety
    /// AVX2; `out` and every value row are the same length, a multiple of 8.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn weighted_sum(weights: &[f32], values: &[&[f32]], out: &mut [f32]) {
        let dim = out.len();
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

    /// Eight keys' dots with `query`: per key, eight lanes each summing its products in
    /// chunk order from zero, then [`crate::quant::hsum8`]'s pairing — [`dot`]'s bits.
    ///
    /// # Safety
    /// AVX2; every key is `query.len()` long, a multiple of 8.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scores8(query: &[f32], keys: &[&[f32]]) -> [f32; KEYS] {
        let rows: [*const f32; KEYS] = std::array::from_fn(|i| keys[i].as_ptr());
        let mut acc = [_mm256_setzero_ps(); KEYS];
        for c in (0..query.len()).step_by(8) {
            // SAFETY (all loads): c + 8 ≤ len of the query and of every key.
            let q = unsafe { _mm256_loadu_ps(query.as_ptr().add(c)) };
            for i in 0..KEYS {
                let k = unsafe { _mm256_loadu_ps(rows[i].add(c)) };
                acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(q, k));
            }
        }
        acc.map(|lanes| hsum8(lanes))
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
    /// AVX2; `at + 8R` ≤ the length of `out` and of every value row.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn value_run<const R: usize>(
        weights: &[f32],
        values: &[&[f32]],
        at: usize,
        out: &mut [f32],
    ) {
        let mut acc = [_mm256_setzero_ps(); R];
        for (&p, v) in weights.iter().zip(values) {
            let p = _mm256_set1_ps(p);
            let v = v.as_ptr();
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: the caller's promise.
                let x = unsafe { _mm256_loadu_ps(v.add(at + 8 * r)) };
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(p, x));
            }
        }
        for (r, acc) in acc.into_iter().enumerate() {
            // SAFETY: the caller's promise.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(at + 8 * r), acc) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attend_single(q: &[f32], keys: &[f32], values: &[f32], span: Range<usize>) -> Vec<f32> {
        let dim = q.len();
        let mut out = vec![0f32; dim];
        attend_heads(
            q,
            dim,
            |j| &keys[j * dim..][..dim],
            |j| &values[j * dim..][..dim],
            span,
            1.0,
            &mut AttendScratch::default(),
            &mut out,
        );
        out
    }

    #[test]
    fn attention_weighs_values_by_softmaxed_scores() {
        // Two positions, one head of dim 2; the second key matches the query strongly.
        let (query, keys, values) = ([1.0, 0.0], [0.0, 0.0, 10.0, 0.0], [1.0, 1.0, 3.0, 5.0]);
        let out = attend_single(&query, &keys, &values, 0..2);
        let p = 1.0 / (1.0 + (-10f32).exp());
        assert!((out[0] - (p * 3.0 + (1.0 - p))).abs() < 1e-5);
        assert!((out[1] - (p * 5.0 + (1.0 - p))).abs() < 1e-5);
        // Only the first position visible: its value exactly; only the second (a
        // sliding window of one), its value.
        assert_eq!(attend_single(&query, &keys, &values, 0..1), [1.0, 1.0]);
        assert_eq!(attend_single(&query, &keys, &values, 1..2), [3.0, 5.0]);
    }

    /// The attention as first written (one key at a time through [`dot`], the value
    /// sum through memory): every path — several heads at once, eight keys at a time
    /// and the value runs in registers on AVX2, the portable one — gives its bits for
    /// every head width (runs of 64, shorter last runs, widths not a multiple of 8) and
    /// key count (batches of eight and leftovers, windows not starting at zero).
    #[test]
    fn attention_keeps_the_one_key_at_a_time_bits() {
        fn one_at_a_time(q: &[f32], keys: &[f32], values: &[f32], span: Range<usize>) -> Vec<f32> {
            let dim = q.len();
            let mut scores = Vec::new();
            let mut max = f32::NEG_INFINITY;
            for j in span.clone() {
                let score = dot(q, &keys[j * dim..][..dim]) * 0.125;
                max = max.max(score);
                scores.push(score);
            }
            let mut total = 0f32;
            for score in scores.iter_mut() {
                *score = (*score - max).exp();
                total += *score;
            }
            let mut out = vec![0f32; dim];
            for (j, &p) in scores.iter().enumerate() {
                for (o, &v) in out.iter_mut().zip(&values[(span.start + j) * dim..][..dim]) {
                    *o += p * v;
                }
            }
            out.iter().map(|o| o * (1.0 / total)).collect()
        }
        let wave =
            |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin() * 2.0).collect() };
        const HEADS: usize = 3;
        for dim in [36, 40, 64, 72, 256] {
            let (keys, values) = (wave(29 * dim, 0.37), wave(29 * dim, 0.11));
            let queries = wave(HEADS * dim, 0.73);
            for span in [0..1, 0..4, 0..8, 0..7, 3..13, 5..9, 0..29, 2..27] {
                let key = |j: usize| &keys[j * dim..][..dim];
                let value = |j: usize| &values[j * dim..][..dim];
                let mut together = vec![0f32; HEADS * dim];
                let mut scratch = AttendScratch::default();
                let run = span.clone();
                attend_heads(
                    &queries,
                    dim,
                    key,
                    value,
                    run,
                    0.125,
                    &mut scratch,
                    &mut together,
                );
                for (h, q) in queries.chunks_exact(dim).enumerate() {
                    let want = one_at_a_time(q, &keys, &values, span.clone());
                    let rows: Vec<&[f32]> = span.clone().map(key).collect();
                    let vals: Vec<&[f32]> = span.clone().map(value).collect();
                    let mut portable = vec![0f32; dim];
                    let build = Build::Portable;
                    attend_one(
                        build,
                        q,
                        &rows,
                        &vals,
                        0.125,
                        &mut Vec::new(),
                        &mut portable,
                    );
                    let paths = [&together[h * dim..][..dim], &portable[..]];
                    for (k, got) in paths.iter().enumerate() {
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "dim {dim} span {span:?} head {h} path {k}");
                    }
                }
            }
        }
    }
}
