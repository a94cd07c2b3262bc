//! Row-wise float operations of the forward pass. Each works on one row with a fixed
//! operation order, so its result does not depend on
//! which other rows are processed alongside it.

use crate::quant::hsum8;

/// Σ a·b over equal-length slices, in eight interleaved lanes reduced by [`hsum8`].
#[inline(always)]
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

/// SiLU(gate) · up, element-wise, into `gate` (with the kernels' own `exp`).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    crate::math::silu_mul(gate, up);
}

/// GELU (tanh approximation, as Gemma's `gelu_pytorch_tanh`) of `gate`, times `up`,
/// element-wise, into `gate` (with the kernels' own `tanh`).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    crate::math::gelu_mul(gate, up);
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
