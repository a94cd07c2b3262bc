//! Row-wise float operations of the forward pass. Each works on one row (or one
//! query and its keys) with a fixed operation order, so its result does not depend on
//! which other rows are processed alongside it.

use crate::quant::hsum8;

/// Σ a·b over equal-length slices, in eight interleaved lanes reduced by [`hsum8`].
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    for (i, (x, y)) in a[chunks * 8..].iter().zip(&b[chunks * 8..]).enumerate() {
        lanes[i] += x * y;
    }
    hsum8(lanes)
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
pub fn attend<'a>(
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
    let mut max = f32::NEG_INFINITY;
    for j in keys {
        let score = dot(query, key(j)) * scale;
        max = max.max(score);
        scores.push(score);
    }
    let mut total = 0f32;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        total += *score;
    }
    out.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        for (o, &v) in out.iter_mut().zip(value(first + j)) {
            *o += p * v;
        }
    }
    let inverse = 1.0 / total;
    for o in out.iter_mut() {
        *o *= inverse;
    }
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
