//! `exp`, `tanh`, `sin`, `cos` and `pow` defined by the kernels, not by the C library.
//!
//! A verifier replays a provider's arithmetic bit for bit, so every operation in it must
//! give the same bits on every machine. `f32::exp` calls the C library's `expf`, whose
//! last bit depends on which libm and which build of it runs (glibc picks an FMA or an
//! SSE2 build by CPU; musl and macOS have their own): an honest provider on one could
//! be accused of fraud by a verifier on another. This is the algorithm glibc's
//! x86-64 FMA build runs (ARM's optimized-routines `expf`: 2^(k/32) from a table times a
//! cubic in double precision), written out with the fused multiply-adds that build
//! uses, so it gives that build's bits — on every input (tested exhaustively where that
//! build is present) — but from IEEE operations alone. The vector builds (AVX2 + FMA,
//! AVX-512) compute the same operations per lane, and let softmax and SiLU run eight or
//! sixteen at a time instead of a library call per element. [`tanh`] (Gemma's GELU) is
//! fdlibm's, as glibc up to 2.40 runs it, with an AVX-512 build for GELU. [`sin`],
//! [`cos`] and [`pow`] (the rotary tables) are glibc's FMA build's `sinf`, `cosf` and
//! `powf`, the same way.

#![allow(unsafe_code)] // the vector builds, called after detection.

/// 2^(i/32) as binary64 words, each minus `i << 47`, so that adding `k << 47` for the
/// integer `k = 32·q + i` gives the bits of 2^(k/32) (q lands in the exponent).
const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// 32 / ln 2 (0x1.71547652b82fep+5).
const INV_LN2_N: f64 = f64::from_bits(0x4047_1547_652B_82FE);
/// 1.5 · 2^52: adding it rounds a double of magnitude < 2^51 to an integer, ties to even,
/// leaving the integer in the low bits.
const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// The cubic's coefficients for 2^(r/32) − 1 (0x1.c6af84b912394p-20,
/// 0x1.ebfce50fac4f3p-13, 0x1.62e42ff0c52d6p-6).
const C0: f64 = f64::from_bits(0x3EBC_6AF8_4B91_2394);
const C1: f64 = f64::from_bits(0x3F2E_BFCE_50FA_C4F3);
const C2: f64 = f64::from_bits(0x3F96_2E42_FF0C_52D6);
/// Above this, `exp` overflows to +∞ (0x1.62e42ep6, ln 2^128 rounded down).
const OVERFLOW: f32 = f32::from_bits(0x42B1_7217);
/// Below this, `exp` is +0 (-0x1.9fe368p6, ln 2^-150 rounded up).
const UNDERFLOW: f32 = f32::from_bits(0xC2CF_F1B4);

/// e^x, as glibc's x86-64 FMA `expf` gives it (±0.502 ulp), from IEEE operations only.
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x + x;
    }
    if x > OVERFLOW {
        return f32::INFINITY;
    }
    if x < UNDERFLOW {
        return 0.0;
    }
    let x = f64::from(x);
    // x · 32 / ln 2 = k + r, k an integer, |r| ≤ 1/2 (r from the exact product).
    let shifted = INV_LN2_N * x + SHIFT;
    let k = shifted.to_bits();
    let r = INV_LN2_N.mul_add(x, -(shifted - SHIFT));
    let scale = f64::from_bits(TABLE[(k % 32) as usize].wrapping_add(k << 47));
    let y = C0.mul_add(r, C1).mul_add(r * r, C2.mul_add(r, 1.0));
    (y * scale) as f32
}

/// `v ← exp(v)` for every value, eight or sixteen at a time where the CPU can.
pub fn exp_in_place(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match Vector::detect() {
        // SAFETY (both): detected.
        Some(Vector::Avx512) => return unsafe { x86::exp_in_place_avx512(values) },
        Some(Vector::Avx2) => return unsafe { x86::exp_in_place_avx2(values) },
        None => {}
    }
    for v in values {
        *v = exp(*v);
    }
}

/// `gate ← gate / (1 + exp(−gate)) · up` (SiLU(gate) · up), element-wise.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "SiLU's gate and up differ in length");
    #[cfg(target_arch = "x86_64")]
    match Vector::detect() {
        // SAFETY (both): detected; the lengths are equal.
        Some(Vector::Avx512) => return unsafe { x86::silu_mul_avx512(gate, up) },
        Some(Vector::Avx2) => return unsafe { x86::silu_mul_avx2(gate, up) },
        None => {}
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu_mul_one(*g, u);
    }
}

/// One element of [`silu_mul`], in the operation order every build keeps.
fn silu_mul_one(x: f32, up: f32) -> f32 {
    x / (1.0 + exp(-x)) * up
}

/// √(2/π), GELU's tanh-form constant (as f32).
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `gate ← 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))·up` with `x = gate` (Gemma's
/// `gelu_pytorch_tanh` times up), element-wise, on the kernels' own `tanh`.
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "GELU's gate and up differ in length");
    #[cfg(target_arch = "x86_64")]
    if Vector::detect() == Some(Vector::Avx512) {
        // SAFETY: detected; the lengths are equal.
        return unsafe { tanh_avx512::gelu_mul_avx512(gate, up) };
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_mul_one(*g, u);
    }
}

/// One element of [`gelu_mul`], in the operation order every build keeps.
fn gelu_mul_one(x: f32, up: f32) -> f32 {
    let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    0.5 * x * (1.0 + tanh(inner)) * up
}

/// Which vector build runs `exp`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq)]
enum Vector {
    Avx2,
    Avx512,
}

#[cfg(target_arch = "x86_64")]
impl Vector {
    fn detect() -> Option<Self> {
        if crate::avx512_allowed()
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512dq")
        {
            Some(Vector::Avx512)
        } else if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            Some(Vector::Avx2)
        } else {
            None
        }
    }
}

mod pow;
mod tanh;
#[cfg(target_arch = "x86_64")]
mod tanh_avx512;
mod trig;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use pow::pow;
pub use tanh::tanh;
pub use trig::{cos, sin};

#[cfg(test)]
mod tests;
