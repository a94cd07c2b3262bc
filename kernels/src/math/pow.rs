//! `pow` (the rotary embedding's frequencies, base^(−2i/d)) as glibc ≥ 2.28 computes
//! `powf` (ARM's optimized-routines algorithm): log2 x from a 16-entry table and a
//! degree-5 polynomial in double precision, times y, then 2^(y·log2 x) from the same
//! 2^(k/32) table [`super::exp`] uses and a cubic. glibc's FMA and SSE2 builds agree
//! on every input tried (the algorithm keeps ~2^-26 of slack before rounding to f32);
//! this is written with the FMA build's fused operations. musl shares the algorithm;
//! other libraries need not.

use super::TABLE as EXP2_TABLE;

/// Per subinterval of [0x3f330000, 2·0x3f330000) (z's range after removing 2^k): 1/c
/// and log2 c for c near the subinterval's centre.
const LOG2_TABLE: [(u64, u64); 16] = [
    (0x3FF6_61EC_79F8_F3BE, 0xBFDE_FEC6_5B96_3019),
    (0x3FF5_71ED_4AAF_883D, 0xBFDB_0B68_32D4_FCA4),
    (0x3FF4_9539_F0F0_10B0, 0xBFD7_418B_0A1F_B77B),
    (0x3FF3_C995_B0B8_0385, 0xBFD3_9DE9_1A6D_CF7B),
    (0x3FF3_0D19_0C88_64A5, 0xBFD0_1D9B_F3F2_B631),
    (0x3FF2_5E22_7B0B_8EA0, 0xBFC9_7C1D_1B3B_7AF0),
    (0x3FF1_BB4A_4A1A_343F, 0xBFC2_F9E3_93AF_3C9F),
    (0x3FF1_2358_F08A_E5BA, 0xBFB9_60CB_BF78_8D5C),
    (0x3FF0_953F_4199_00A7, 0xBFAA_6F9D_B647_5FCE),
    (0x3FF0_0000_0000_0000, 0x0000_0000_0000_0000),
    (0x3FEE_608C_FD9A_47AC, 0x3FB3_38CA_9F24_F53D),
    (0x3FEC_A4B3_1F02_6AA0, 0x3FC4_76A9_5438_91BA),
    (0x3FEB_2036_576A_FCE6, 0x3FCE_840B_4AC4_E4D2),
    (0x3FE9_C2D1_63A1_AA2D, 0x3FD4_0645_F0C6_651C),
    (0x3FE8_86E6_0378_41ED, 0x3FD8_8E9C_2C1B_9FF8),
    (0x3FE7_67DC_F553_4862, 0x3FDC_E0A4_4EB1_7BCC),
];
/// log1p(r)/ln 2 ≈ A4·r + A3·r² + A2·r³ + A1·r⁴ + A0·r⁵.
const LOG2_POLY: [u64; 5] = [
    0x3FD2_7616_C949_6E0B,
    0xBFD7_1969_A075_C67A,
    0x3FDE_C70A_6CA7_BADD,
    0xBFE7_1547_48BE_F6C8,
    0x3FF7_1547_652A_B82B,
];
/// The bits of z's range start: x's bits minus this split into 2^k and a subinterval.
const RANGE_START: u32 = 0x3F33_0000;
/// 1.5 · 2^47: adding it rounds a double to a multiple of 1/32.
const SHIFT: f64 = f64::from_bits(0x42E8_0000_0000_0000);
/// 2^r − 1 ≈ P2·r + P1·r² + P0·r³ for |r| ≤ 1/64.
const EXP2_POLY: [u64; 3] = [
    0x3FAC_6AF8_4B91_2394,
    0x3FCE_BFCE_50FA_C4F3,
    0x3FE6_2E42_FF0C_52D6,
];
/// The result's sign bit, added to k so that it lands in the double's sign.
const NEGATIVE: u64 = 1 << 16;

/// x^y, as glibc's x86-64 FMA `powf` gives it (IEEE 754's special cases included).
pub fn pow(x: f32, y: f32) -> f32 {
    let (mut ix, iy) = (x.to_bits(), y.to_bits());
    let mut negative = false;
    if ix.wrapping_sub(0x0080_0000) >= 0x7F80_0000 - 0x0080_0000 || zero_inf_nan(iy) {
        // x subnormal, zero, negative, ∞ or NaN, or y zero, ∞ or NaN.
        if zero_inf_nan(iy) {
            return special_exponent(x, y);
        }
        if zero_inf_nan(ix) {
            let square = x * x;
            let odd = ix >> 31 != 0 && integer(iy) == Integer::Odd;
            let square = if odd { -square } else { square };
            return if iy >> 31 != 0 { 1.0 / square } else { square };
        }
        if ix >> 31 != 0 {
            match integer(iy) {
                Integer::No => return f32::NAN,
                Integer::Odd => negative = true,
                Integer::Even => {}
            }
            ix &= 0x7FFF_FFFF;
        }
        if ix < 0x0080_0000 {
            // Subnormal: normalized, its exponent below the normal range.
            ix = (f32::from_bits(ix) * f32::from_bits(0x4B00_0000)).to_bits() & 0x7FFF_FFFF;
            ix = ix.wrapping_sub(23 << 23);
        }
    }
    let exponent = f64::from(y) * log2(ix);
    if (exponent.to_bits() >> 47 & 0xFFFF) >= 126f64.to_bits() >> 47 {
        // |y·log2 x| ≥ 126.
        if exponent > f64::from_bits(0x405F_FFFF_FFD1_D571) {
            return if negative {
                f32::NEG_INFINITY
            } else {
                f32::INFINITY
            };
        }
        if exponent <= -150.0 {
            return if negative { -0.0 } else { 0.0 };
        }
    }
    exp2(exponent, negative)
}

/// x^y where y is 0, ±∞ or NaN.
fn special_exponent(x: f32, y: f32) -> f32 {
    let (ix, iy) = (x.to_bits(), y.to_bits());
    if iy << 1 == 0 {
        return if signaling(x) { x + y } else { 1.0 };
    }
    if ix == 0x3F80_0000 {
        return if signaling(y) { x + y } else { 1.0 };
    }
    if ix << 1 > 0x7F80_0000 << 1 || iy << 1 > 0x7F80_0000 << 1 {
        return x + y;
    }
    if ix << 1 == 0x3F80_0000 << 1 {
        return 1.0;
    }
    // |x| < 1 with y = +∞, or |x| > 1 with y = −∞.
    if (ix << 1 < 0x3F80_0000 << 1) == (iy >> 31 == 0) {
        return 0.0;
    }
    y * y
}

/// log2 of the positive float with bits `ix` (a subnormal's exponent already lowered).
fn log2(ix: u32) -> f64 {
    let offset = ix.wrapping_sub(RANGE_START);
    let (inverse, log) = LOG2_TABLE[((offset >> 19) % 16) as usize];
    let top = offset & 0xFF80_0000;
    let z = f64::from(f32::from_bits(ix.wrapping_sub(top)));
    let k = f64::from(top as i32 >> 23);
    let a = LOG2_POLY.map(f64::from_bits);
    let r = z.mul_add(f64::from_bits(inverse), -1.0);
    let head = f64::from_bits(log) + k;
    let r2 = r * r;
    let high = a[0].mul_add(r, a[1]);
    let middle = a[2].mul_add(r, a[3]);
    let r4 = r2 * r2;
    let low = a[4].mul_add(r, head);
    let low = middle.mul_add(r2, low);
    high.mul_add(r4, low)
}

/// 2^x for |x| < 150, negated if asked.
fn exp2(x: f64, negative: bool) -> f32 {
    let shifted = x + SHIFT;
    let k = shifted.to_bits();
    let r = x - (shifted - SHIFT);
    let signed = k.wrapping_add(if negative { NEGATIVE } else { 0 });
    let scale = f64::from_bits(EXP2_TABLE[(k % 32) as usize].wrapping_add(signed << 47));
    let p = EXP2_POLY.map(f64::from_bits);
    let cubic = p[0].mul_add(r, p[1]);
    let r2 = r * r;
    let linear = p[2].mul_add(r, 1.0);
    (cubic.mul_add(r2, linear) * scale) as f32
}

#[derive(PartialEq)]
enum Integer {
    No,
    Odd,
    Even,
}

/// Whether the finite, non-zero float with bits `iy` is an integer, and which kind.
fn integer(iy: u32) -> Integer {
    let exponent = iy >> 23 & 0xFF;
    if exponent < 0x7F {
        return Integer::No;
    }
    if exponent > 0x7F + 23 {
        return Integer::Even;
    }
    let unit = 1 << (0x7F + 23 - exponent);
    if iy & (unit - 1) != 0 {
        Integer::No
    } else if iy & unit != 0 {
        Integer::Odd
    } else {
        Integer::Even
    }
}

/// 0, ±∞ or NaN (bits, either sign).
fn zero_inf_nan(bits: u32) -> bool {
    (bits << 1).wrapping_sub(1) >= (0x7F80_0000 << 1) - 1
}

fn signaling(x: f32) -> bool {
    x.is_nan() && x.to_bits() & 0x0040_0000 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IEEE 754's pow special cases (C99 Annex F), which the rotary code never reaches
    /// but a general `pow` must keep.
    #[test]
    fn special_cases() {
        let cases: &[(f32, f32, f32)] = &[
            (2.0, 0.0, 1.0),
            (f32::NAN, 0.0, 1.0),
            (1.0, f32::NAN, 1.0),
            (-1.0, f32::INFINITY, 1.0),
            (0.5, f32::INFINITY, 0.0),
            (2.0, f32::INFINITY, f32::INFINITY),
            (0.5, f32::NEG_INFINITY, f32::INFINITY),
            (2.0, f32::NEG_INFINITY, 0.0),
            (0.0, 3.0, 0.0),
            (-0.0, 3.0, -0.0),
            (-0.0, 2.0, 0.0),
            (0.0, -1.0, f32::INFINITY),
            (-0.0, -3.0, f32::NEG_INFINITY),
            (f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY),
            (f32::NEG_INFINITY, -3.0, -0.0),
            (-2.0, 3.0, -8.0),
            (-2.0, 2.0, 4.0),
            (-2.0, -1.0, -0.5),
            (4.0, 0.5, 2.0),
            (2.0, 10.0, 1024.0),
            (10.0, 39.0, f32::INFINITY),
            (10.0, -46.0, 0.0),
            (-10.0, -47.0, -0.0),
        ];
        for &(x, y, want) in cases {
            let got = pow(x, y);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "pow({x}, {y}) = {got}, want {want}"
            );
        }
        for (x, y) in [
            (-2.0f32, 0.5f32),
            (f32::NAN, 1.0),
            (2.0, f32::NAN),
            (-1.5, 1e-3),
        ] {
            assert!(pow(x, y).is_nan(), "pow({x}, {y})");
        }
        // A subnormal base takes the normalizing path: (2^-140)^0.5 = 2^-70 exactly.
        assert_eq!(
            pow(f32::from_bits(1 << 9), 0.5),
            f32::from_bits((127 - 70) << 23)
        );
    }
}
