//! Row-wise float operations of the forward pass. Each works on one row (or one
//! query and its keys) with a fixed operation order, so its result does not depend on
//! which other rows are processed alongside it.

#![allow(unsafe_code)] // one `target_feature` build of `attend`, called after detection.

use crate::quant::hsum8;

/// Σ a·b over equal-length slices, in eight interleaved lanes reduced by [`hsum8`].
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dots(a, [b])[0]
}

/// `out = x / sqrt(mean(x²) + eps) · weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mean = dot(x, x) / x.len() as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// Rotary position embedding in GGML's "normal" (interleaved) layout: pairs
/// (2i, 2i+1) rotate by `position · θ_i`; `cos`/`sin` hold that position's angles.
pub fn rope_interleaved(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (pair, (&c, &s)) in head.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
        let (x0, x1) = (pair[0], pair[1]);
        pair[0] = x0 * c - x1 * s;
        pair[1] = x0 * s + x1 * c;
    }
}

/// SiLU(gate) · up, element-wise, into `gate`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// GELU (tanh approximation, as Gemma's `gelu_pytorch_tanh`) of `gate`, times `up`,
/// element-wise, into `gate`.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        *g = 0.5 * x * (1.0 + inner.tanh()) * u;
    }
}

/// One query attending to the cached positions `keys` of one KV head (all of them up
/// to the query's own, or a sliding window's last ones), whose key and value at
/// position `j` are `key(j)` and `value(j)` (head dimension long): scores are scaled
/// dot products, softmaxed with the maximum subtracted, and the output is
/// Σ p_j v_j / Σ p_j, every sum in position order.
///
/// Where the CPU has AVX2 the same code runs compiled for it: the same operations in
/// the same order (Rust never fuses or reorders float operations), so the same bits.
pub fn attend<'a>(
    query: &[f32],
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
    keys: std::ops::Range<usize>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU reported AVX2.
        return unsafe { attend_avx2(query, key, value, keys, scale, scores, out) };
    }
    attend_portable(query, key, value, keys, scale, scores, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attend_avx2<'a>(
    query: &[f32],
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
    keys: std::ops::Range<usize>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_portable(query, key, value, keys, scale, scores, out);
}

#[inline(always)]
fn attend_portable<'a>(
    query: &[f32],
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
    keys: std::ops::Range<usize>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    scores.clear();
    let first = keys.start;
    // Four keys at a time: four independent chains, each key's sum in [`dot`]'s order.
    let mut j = keys.start;
    while j + 4 <= keys.end {
        let four = dots(query, [key(j), key(j + 1), key(j + 2), key(j + 3)]);
        scores.extend(four.map(|d| d * scale));
        j += 4;
    }
    scores.extend((j..keys.end).map(|j| dot(query, key(j)) * scale));
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let mut total = 0f32;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        total += *score;
    }
    // Σ p_j v_j in runs of 64 dimensions held in registers across the positions (each
    // element still sums its positions in order, from zero).
    for (run, outs) in out.chunks_mut(VALUE_RUN).enumerate() {
        let at = run * VALUE_RUN;
        let mut acc = [0f32; VALUE_RUN];
        if outs.len() == VALUE_RUN {
            for (j, &p) in scores.iter().enumerate() {
                let v: &[f32; VALUE_RUN] = value(first + j)[at..at + VALUE_RUN]
                    .try_into()
                    .expect("a run of the head");
                for (a, &v) in acc.iter_mut().zip(v) {
                    *a += p * v;
                }
            }
        } else {
            for (j, &p) in scores.iter().enumerate() {
                let v = &value(first + j)[at..at + outs.len()];
                for (a, &v) in acc.iter_mut().zip(v) {
                    *a += p * v;
                }
            }
        }
        outs.copy_from_slice(&acc[..outs.len()]);
    }
    let inverse = 1.0 / total;
    for o in out.iter_mut() {
        *o *= inverse;
    }
}

/// Dimensions of the value sum kept in registers at once (eight AVX2 registers).
const VALUE_RUN: usize = 64;

/// [`dot`] of `a` with `N` slices at once, each with its own lanes: `N` independent
/// chains, each in `dot`'s order.
#[inline(always)]
fn dots<const N: usize>(a: &[f32], b: [&[f32]; N]) -> [f32; N] {
    let mut lanes = [[0f32; 8]; N];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let x = &a[c * 8..c * 8 + 8];
        for (lanes, b) in lanes.iter_mut().zip(&b) {
            let y = &b[c * 8..c * 8 + 8];
            for l in 0..8 {
                lanes[l] += x[l] * y[l];
            }
        }
    }
    for (lanes, b) in lanes.iter_mut().zip(&b) {
        for (i, (x, y)) in a[chunks * 8..].iter().zip(&b[chunks * 8..]).enumerate() {
            lanes[i] += x * y;
        }
    }
    lanes.map(hsum8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_the_plain_sum_closely() {
        let a: Vec<f32> = (0..67).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..67).map(|i| (i as f32 * 0.11).cos()).collect();
        let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y)).sum();
        assert!((f64::from(dot(&a, &b)) - plain).abs() < 1e-4);
    }

    #[test]
    fn rms_norm_gives_unit_root_mean_square() {
        let x = [3.0, -4.0, 0.0, 5.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_their_length() {
        let mut head = [1.0, 0.0, 0.0, 2.0];
        let angle = std::f32::consts::FRAC_PI_2;
        rope_interleaved(&mut head, &[angle.cos(), 1.0], &[angle.sin(), 0.0]);
        assert!((head[0]).abs() < 1e-6 && (head[1] - 1.0).abs() < 1e-6);
        assert_eq!(&head[2..], &[0.0, 2.0]);
    }

    #[test]
    fn attention_weighs_values_by_softmaxed_scores() {
        // Two positions, one head of dim 2; the second key matches the query strongly.
        let query = [1.0, 0.0];
        let keys = [0.0, 0.0, 10.0, 0.0];
        let values = [1.0, 1.0, 3.0, 5.0];
        let attend_to = |positions: std::ops::Range<usize>| {
            let mut out = [0.0; 2];
            let key = |j: usize| &keys[j * 2..][..2];
            let value = |j: usize| &values[j * 2..][..2];
            attend(
                &query,
                key,
                value,
                positions,
                1.0,
                &mut Vec::new(),
                &mut out,
            );
            out
        };
        let out = attend_to(0..2);
        let p = 1.0 / (1.0 + (-10f32).exp());
        assert!((out[0] - (p * 3.0 + (1.0 - p))).abs() < 1e-5);
        assert!((out[1] - (p * 5.0 + (1.0 - p))).abs() < 1e-5);
        // Only the first position visible: its value exactly; only the second (a
        // sliding window of one), its value.
        assert_eq!(attend_to(0..1), [1.0, 1.0]);
        assert_eq!(attend_to(1..2), [3.0, 5.0]);
    }

    /// The attention as first written (one key at a time, the value sum through
    /// memory): the four-key scores and the value runs in registers, portable or built
    /// for AVX2, give its bits for every head width (runs of 64 and a shorter last one)
    /// and key count (groups of four and leftovers, windows not starting at zero).
    #[test]
    fn attention_keeps_the_one_key_at_a_time_bits() {
        fn one_at_a_time(
            q: &[f32],
            keys: &[f32],
            values: &[f32],
            span: std::ops::Range<usize>,
        ) -> Vec<f32> {
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
        for dim in [40, 64, 72, 256] {
            let (keys, values) = (wave(13 * dim, 0.37), wave(13 * dim, 0.11));
            let q = wave(dim, 0.73);
            for span in [0..1, 0..4, 0..7, 3..13, 5..9] {
                let want = one_at_a_time(&q, &keys, &values, span.clone());
                let key = |j: usize| &keys[j * dim..][..dim];
                let value = |j: usize| &values[j * dim..][..dim];
                let mut dispatched = vec![0f32; dim];
                attend(
                    &q,
                    key,
                    value,
                    span.clone(),
                    0.125,
                    &mut Vec::new(),
                    &mut dispatched,
                );
                let mut portable = vec![0f32; dim];
                attend_portable(
                    &q,
                    key,
                    value,
                    span.clone(),
                    0.125,
                    &mut Vec::new(),
                    &mut portable,
                );
                for (k, got) in [dispatched, portable].iter().enumerate() {
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "dim {dim} span {span:?} path {k}");
                }
            }
        }
    }

    #[test]
    fn geglu_is_gelu_tanh_times_up() {
        let mut gate = [-3.0, -0.5, 0.0, 0.5, 3.0];
        let up = [2.0; 5];
        geglu(&mut gate, &up);
        for (x, got) in [-3.0f64, -0.5, 0.0, 0.5, 3.0].into_iter().zip(gate) {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let want = 0.5 * x * (1.0 + (c * (x + 0.044715 * x.powi(3))).tanh()) * 2.0;
            assert!(
                (f64::from(got) - want).abs() < 1e-6,
                "gelu({x}): {got} vs {want}"
            );
        }
    }
}
