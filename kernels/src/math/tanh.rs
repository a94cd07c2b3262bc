//! `tanh` (GELU's) as glibc ≤ 2.40 computes `tanhf`: fdlibm's float algorithm through its
//! `expm1f` (five-term rational correction), every operation in f32 as written there.
//! glibc 2.41 replaced both with correctly rounded versions, which differ in the last
//! bit on some inputs: a library call would make a Gemma replay depend on the
//! verifier's glibc release.

pub(super) const LN2_HI: f32 = f32::from_bits(0x3F31_7180);
pub(super) const LN2_LO: f32 = f32::from_bits(0x3717_F7D1);
pub(super) const INV_LN2: f32 = f32::from_bits(0x3FB8_AA3B);
/// Above this `expm1` overflows (0x42b17180).
const EXPM1_OVERFLOW: f32 = f32::from_bits(0x42B1_7180);
pub(super) const Q1: f32 = f32::from_bits(0xBD08_8889);
pub(super) const Q2: f32 = f32::from_bits(0x3AD0_0D01);
pub(super) const Q3: f32 = f32::from_bits(0xB8A6_70CD);
pub(super) const Q4: f32 = f32::from_bits(0x3686_7E54);
pub(super) const Q5: f32 = f32::from_bits(0xB457_EDBB);

/// tanh x, as glibc 2.36's `tanhf` (fdlibm) gives it.
pub fn tanh(x: f32) -> f32 {
    let bits = x.to_bits();
    let magnitude = bits & 0x7FFF_FFFF;
    let negative = bits >> 31 != 0;
    if magnitude >= 0x7F80_0000 {
        // ±1 for ±∞, NaN for NaN.
        return if negative {
            1.0 / x - 1.0
        } else {
            1.0 / x + 1.0
        };
    }
    let z = if magnitude >= 0x41B0_0000 {
        // |x| ≥ 22: ±1 (fdlibm's `1 − tiny`).
        1.0 - 1.0e-30
    } else if magnitude == 0 {
        return x;
    } else if magnitude < 0x2400_0000 {
        // |x| < 2^-55.
        return x * (1.0 + x);
    } else if magnitude >= 0x3F80_0000 {
        let t = expm1(2.0 * x.abs());
        1.0 - 2.0 / (t + 2.0)
    } else {
        let t = expm1(-2.0 * x.abs());
        -t / (t + 2.0)
    };
    if negative {
        -z
    } else {
        z
    }
}

/// e^x − 1, as fdlibm's `expm1f`.
pub(super) fn expm1(x: f32) -> f32 {
    let magnitude = x.to_bits() & 0x7FFF_FFFF;
    let negative = x.to_bits() >> 31 != 0;
    if magnitude >= 0x4195_B844 {
        // |x| ≥ 27 ln 2.
        if magnitude >= 0x42B1_7218 {
            if magnitude > 0x7F80_0000 {
                return x + x;
            }
            if magnitude == 0x7F80_0000 {
                return if negative { -1.0 } else { x };
            }
            if x > EXPM1_OVERFLOW {
                return f32::INFINITY;
            }
        }
        if negative {
            return -1.0;
        }
    }
    let (x, k, c) = if magnitude > 0x3EB1_7218 {
        // |x| > ln 2 / 2: x = k ln 2 + (hi − lo), c the rounding of hi − lo.
        let (hi, lo, k) = if magnitude < 0x3F85_1592 {
            if negative {
                (x + LN2_HI, -LN2_LO, -1)
            } else {
                (x - LN2_HI, LN2_LO, 1)
            }
        } else {
            let k = (INV_LN2 * x + if negative { -0.5 } else { 0.5 }) as i32;
            let t = k as f32;
            (x - t * LN2_HI, t * LN2_LO, k)
        };
        let reduced = hi - lo;
        (reduced, k, (hi - reduced) - lo)
    } else if magnitude < 0x3300_0000 {
        // |x| < 2^-25.
        return x;
    } else {
        (x, 0, 0.0)
    };
    let half = 0.5 * x;
    let square_half = x * half;
    let r1 = 1.0
        + square_half
            * (Q1
                + square_half * (Q2 + square_half * (Q3 + square_half * (Q4 + square_half * Q5))));
    let t = 3.0 - r1 * half;
    let e = square_half * ((r1 - t) / (6.0 - x * t));
    if k == 0 {
        return x - (x * e - square_half);
    }
    let e = (x * (e - c) - c) - square_half;
    if k == -1 {
        return 0.5 * (x - e) - 0.5;
    }
    if k == 1 {
        return if x < -0.25 {
            -2.0 * (e - (x + 0.5))
        } else {
            1.0 + 2.0 * (x - e)
        };
    }
    // Adds k to the exponent of y.
    let scaled = |y: f32| f32::from_bits((y.to_bits() as i32).wrapping_add(k << 23) as u32);
    if k <= -2 || k > 56 {
        return scaled(1.0 - (e - x)) - 1.0;
    }
    if k < 23 {
        // t = 1 − 2^-k.
        let t = f32::from_bits(0x3F80_0000 - (0x0100_0000 >> k));
        scaled(t - (e - x))
    } else {
        // t = 2^-k.
        let t = f32::from_bits(((0x7F - k) << 23) as u32);
        scaled((x - (e + t)) + 1.0)
    }
}
