//! Attention of one row's query heads that share a KV head, over that head's cached
//! positions. The arithmetic is fixed per (row, head): scores are scaled dot products
//! in [`dot`]'s order, softmaxed with the maximum subtracted, and the output is
//! Σ p_j v_j / Σ p_j, every sum in position order (`exp` the kernels' own,
//! [`crate::math`]) — so no output depends on which other heads, rows or sequences are
//! computed alongside it.
//!
//! Where the CPU has AVX2 the same operations run on eight keys at a time (eight
//! independent chains, each key's lanes as [`dot`] orders them) and on the value sum in
//! registers; with AVX-512 each cached row is loaded once for several heads of the group
//! (`attention/avx512.rs`). The same bits (tested against the one-key-at-a-time form),
//! without the per-key lookups and the single dependency chain that made attention a
//! quarter of a batched decode step.

#![allow(unsafe_code)] // the AVX2 / AVX-512 builds of the loops, called after detection.

use std::ops::Range;

use half::f16;

use crate::ops::dot;

/// Reusable buffers of [`attend_heads`]: one task's scores and the rows it reads.
#[derive(Default)]
pub struct AttendScratch<'a> {
    /// Every head's scores (then softmax weights), head after head.
    scores: Vec<f32>,
    totals: Vec<f32>,
    keys: Vec<&'a [f16]>,
    values: Vec<&'a [f16]>,
    /// The portable build's one row widened to f32.
    widened: Vec<f32>,
}

/// Queries of consecutive heads (`queries.len() = heads × dim`) that share one KV head,
/// attending to its positions `keys` (all of them up to the row's own, or a sliding
/// window's last ones), whose key and value at position `j` are `key(j)` and
/// `value(j)` (each `dim` long, half precision as the KV cache keeps them: widened to
/// f32 exactly, so the arithmetic is the f32 one on those values). Each head's output
/// goes to its `dim` values of `out`.
#[allow(clippy::too_many_arguments)] // the accessors and the span are one call's inputs
pub fn attend_heads<'a>(
    queries: &[f32],
    dim: usize,
    key: impl Fn(usize) -> &'a [f16],
    value: impl Fn(usize) -> &'a [f16],
    keys: Range<usize>,
    scale: f32,
    softcap: Option<f32>,
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
        // The gather walks every cached row of the head before the scores start, so the
        // rows of blocks scattered through memory arrive in parallel (into L2) rather
        // than one block's run at a time.
        #[cfg(target_arch = "x86_64")]
        for row in [k, v] {
            prefetch_row::<{ std::arch::x86_64::_MM_HINT_T1 }>(row);
        }
        scratch.keys.push(k);
        scratch.values.push(v);
    }
    assert!(!scratch.keys.is_empty(), "attention over no positions");
    attend_rows(
        Build::for_dim(dim),
        queries,
        dim,
        scale,
        softcap,
        scratch,
        out,
    );
}

/// Hints the cache (`HINT`: which level) to fetch every line of `row`: no effect on any
/// result.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_row<const HINT: i32>(row: &[f16]) {
    let start = row.as_ptr().cast::<i8>();
    for line in (0..std::mem::size_of_val(row)).step_by(64) {
        // SAFETY: a prefetch only hints the cache; it reads nothing the program sees and
        // does not fault.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(start.wrapping_add(line)) };
    }
}

/// [`attend_heads`] over the rows already gathered in `scratch`, on `build`'s loops.
fn attend_rows(
    build: Build,
    queries: &[f32],
    dim: usize,
    scale: f32,
    softcap: Option<f32>,
    scratch: &mut AttendScratch<'_>,
    out: &mut [f32],
) {
    let AttendScratch {
        scores,
        totals,
        keys,
        values,
        widened,
    } = scratch;
    let positions = keys.len();
    scores.clear();
    scores.resize(queries.len() / dim * positions, 0.0);
    match build {
        Build::Portable => {
            for (query, scores) in queries
                .chunks_exact(dim)
                .zip(scores.chunks_exact_mut(positions))
            {
                for (score, k) in scores.iter_mut().zip(keys.iter()) {
                    widen(k, widened);
                    *score = dot(query, widened) * scale;
                }
            }
        }
        // SAFETY (each build below): handed out only where the CPU has its features,
        // for widths a multiple of 8; every row is `dim` long (checked above).
        #[cfg(target_arch = "x86_64")]
        Build::Avx2 => unsafe { avx2::scores(queries, dim, keys, scale, scores) },
        #[cfg(target_arch = "x86_64")]
        Build::Avx512 => unsafe { avx512::scores(queries, dim, keys, scale, scores) },
    }
    if let Some(cap) = softcap {
        soft_cap(scores, cap);
    }
    totals.clear();
    totals.extend(scores.chunks_exact_mut(positions).map(softmax_in_place));
    match build {
        Build::Portable => {
            out.fill(0.0);
            for (weights, out) in scores
                .chunks_exact(positions)
                .zip(out.chunks_exact_mut(dim))
            {
                for (&p, v) in weights.iter().zip(values.iter()) {
                    widen(v, widened);
                    for (o, &v) in out.iter_mut().zip(widened.iter()) {
                        *o += p * v;
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Build::Avx2 => unsafe { avx2::weighted_sums(scores, values, out) },
        #[cfg(target_arch = "x86_64")]
        Build::Avx512 => unsafe { avx512::weighted_sums(scores, values, out) },
    }
    for (out, &total) in out.chunks_exact_mut(dim).zip(totals.iter()) {
        let inverse = 1.0 / total;
        for o in out.iter_mut() {
            *o *= inverse;
        }
    }
}

/// `row` widened to f32 (exact) into `out`.
fn widen(row: &[f16], out: &mut Vec<f32>) {
    out.clear();
    out.extend(row.iter().map(|v| v.to_f32()));
}

/// Which build of the score and value loops runs; all give the same bits.
#[derive(Clone, Copy, Debug)]
enum Build {
    /// The reference order, one key at a time.
    Portable,
    /// Eight keys at a time and value sums in registers, one head after another: only
    /// handed out where the CPU has AVX2 and F16C and the head width is a multiple of 8.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// As AVX2, but each key and value row is loaded once for up to three (scores) or
    /// four (values) heads of the group, in AVX-512's 32 registers.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Build {
    fn for_dim(dim: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        if dim.is_multiple_of(8)
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("f16c")
        {
            if crate::avx512_allowed()
                && std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512vl")
                && std::is_x86_feature_detected!("avx512bw")
            {
                return Build::Avx512;
            }
            return Build::Avx2;
        }
        let _ = dim;
        Build::Portable
    }

    /// Every build this CPU runs for width `dim`, the portable one first.
    #[cfg(test)]
    fn all(dim: usize) -> Vec<Build> {
        let mut builds = vec![Build::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            let best = Build::for_dim(dim);
            if matches!(best, Build::Avx2 | Build::Avx512) {
                builds.push(Build::Avx2);
            }
            if matches!(best, Build::Avx512) {
                builds.push(Build::Avx512);
            }
        }
        builds
    }
}

/// `s ← exp(s − max)` for every score (the kernels' own `exp`); returns their sum in
/// order.
#[inline(always)]
/// Gemma 2's soft capping, `cap · tanh(x / cap)` in llama.cpp's order (scale by `1/cap`,
/// tanh, scale by `cap`), on the kernels' own `tanh`: scores (or logits) squashed into
/// (−cap, cap).
pub fn soft_cap(values: &mut [f32], cap: f32) {
    let inverse = 1.0 / cap;
    for value in values {
        *value = crate::math::tanh(*value * inverse) * cap;
    }
}

fn softmax_in_place(scores: &mut [f32]) -> f32 {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for score in scores.iter_mut() {
        *score -= max;
    }
    crate::math::exp_in_place(scores);
    scores.iter().fold(0f32, |total, &p| total + p)
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::*;

    fn halves(values: &[f32]) -> Vec<f16> {
        values.iter().map(|&v| f16::from_f32(v)).collect()
    }

    fn attend_single(q: &[f32], keys: &[f32], values: &[f32], span: Range<usize>) -> Vec<f32> {
        let dim = q.len();
        let (keys, values) = (halves(keys), halves(values));
        let mut out = vec![0f32; dim];
        attend_heads(
            q,
            dim,
            |j| &keys[j * dim..][..dim],
            |j| &values[j * dim..][..dim],
            span,
            1.0,
            None,
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
    /// sum through memory): every build this CPU runs — portable, AVX2 (eight keys at a
    /// time, value runs in registers), AVX-512 (rows shared by up to three or four
    /// heads) — gives its bits for every group size (passes of three and four heads and
    /// their leftovers), head width (runs of 64, shorter and masked last runs, widths
    /// not a multiple of 8) and key count (batches of eight and leftovers, windows not
    /// starting at zero).
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
                *score = crate::math::exp(*score - max);
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
        // The cache's half-precision values, and the same values widened.
        let cached = |n: usize, f: f32| {
            let values = halves(&wave(n, f));
            let widened: Vec<f32> = values.iter().map(|v| v.to_f32()).collect();
            (values, widened)
        };
        for heads in [1, 3, 4, 7] {
            for dim in [36, 40, 64, 72, 256] {
                let ((keys_f16, keys), (values_f16, values)) =
                    (cached(29 * dim, 0.37), cached(29 * dim, 0.11));
                let queries = wave(heads * dim, 0.73);
                for span in [0..1, 0..4, 0..8, 0..7, 3..13, 5..9, 0..29, 2..27] {
                    let key = |j: usize| &keys_f16[j * dim..][..dim];
                    let value = |j: usize| &values_f16[j * dim..][..dim];
                    let want: Vec<f32> = queries
                        .chunks_exact(dim)
                        .flat_map(|q| one_at_a_time(q, &keys, &values, span.clone()))
                        .collect();
                    let mut scratch = AttendScratch::default();
                    let mut paths = vec![vec![0f32; heads * dim]];
                    attend_heads(
                        &queries,
                        dim,
                        key,
                        value,
                        span.clone(),
                        0.125,
                        None,
                        &mut scratch,
                        &mut paths[0],
                    );
                    for build in Build::all(dim) {
                        let mut got = vec![0f32; heads * dim];
                        attend_rows(build, &queries, dim, 0.125, None, &mut scratch, &mut got);
                        paths.push(got);
                    }
                    for (k, got) in paths.iter().enumerate() {
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "heads {heads} dim {dim} span {span:?} path {k}");
                    }
                }
            }
        }
    }
}
