//! `sin` and `cos` (the rotary embedding's tables) as glibc's x86-64 FMA build computes
//! `sinf`/`cosf` (ARM's optimized-routines algorithm, glibc ≥ 2.28): the angle in
//! double precision, reduced to r ∈ [−π/4, π/4] and a quadrant (one multiply-subtract
//! below 120, a 192-bit integer product with 4/π above), then a degree-7 sine or
//! degree-8 cosine polynomial in r, every `a + b·c` of that build fused. All 2^32
//! inputs give that build's bits (tested where it runs); musl, macOS and glibc's SSE2
//! build differ on a few, which a rope table computed by the library would pass on to
//! every key and query.

/// 2/π · 2^24: the quadrant lands in bits 24.. of the truncated product.
const HALF_PI_INVERSE: f64 = f64::from_bits(0x4164_5F30_6DC9_C883);
const HALF_PI: f64 = f64::from_bits(0x3FF9_21FB_5444_2D18);
/// 2π · 2^-64: one unit of the large reduction's 2.62 fixed-point result, in radians.
const FIXED_UNIT: f64 = f64::from_bits(0x3C19_21FB_5444_2D18);
/// π/4 as f32 (0x1.921fb6p-1).
const QUARTER_PI: f32 = f32::from_bits(0x3F49_0FDB);
/// Below 2^-12, sin x = x and cos x = 1 to the last bit.
const TINY: f32 = f32::from_bits(0x3980_0000);
/// Up to 120 the one-step reduction is exact enough (π/2 in a double carries 55 bits).
const FAST_LIMIT: f32 = 120.0;

/// The sine polynomial: x + x³·S1 + x⁵·(S2 + x²·S3).
const S1: f64 = f64::from_bits(0xBFC5_5554_5995_A603);
const S2: f64 = f64::from_bits(0x3F81_1076_0523_0BC4);
const S3: f64 = f64::from_bits(0xBF29_94EB_3774_CF24);
/// The cosine polynomial: C0 + x²·C1 + x⁴·C2 + x⁶·(C3 + x²·C4).
const COSINE: [f64; 5] = [
    1.0,
    f64::from_bits(0xBFDF_FFFF_FD0C_621C),
    f64::from_bits(0x3FA5_5553_E106_8F19),
    f64::from_bits(0xBF56_C087_E89A_359D),
    f64::from_bits(0x3EF9_9343_027B_F8C3),
];

/// Windows of 4/π's bits (0xa2f9836e…, 192 of them): entry i holds the 32 bits that
/// end 8·(i + 1) bits after the binary point of 2/π, so the reduction picks three
/// entries four apart by the input's exponent.
const FOUR_OVER_PI: [u32; 24] = [
    0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529, 0x441529fc,
    0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd, 0xf534ddc0, 0x34ddc0db,
    0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041,
];

/// sin x, as glibc's x86-64 FMA `sinf` gives it.
pub fn sin(x: f32) -> f32 {
    turned_sine(x, 0)
}

/// cos x, as glibc's x86-64 FMA `cosf` gives it.
pub fn cos(x: f32) -> f32 {
    turned_sine(x, 1)
}

/// sin(x + turns·π/2) for `turns` 0 (sine) or 1 (cosine): the two functions differ only
/// in which polynomial a quadrant takes and in their value near zero.
fn turned_sine(x: f32, turns: u64) -> f32 {
    if top12(x) < top12(QUARTER_PI) {
        if top12(x) < top12(TINY) {
            return if turns == 0 { x } else { 1.0 };
        }
        let r = f64::from(x);
        return polynomial(r, r * r, false, Quadrant::of(turns));
    }
    match reduce(x) {
        Some((r, n, negate)) => polynomial(r, r * r, negate, Quadrant::of(n ^ turns)),
        None => f32::NAN, // ±∞ or NaN
    }
}

/// Which polynomial a quadrant needs: sine for even ones, cosine for odd ones.
#[derive(Clone, Copy, PartialEq)]
enum Quadrant {
    Sine,
    Cosine,
}

impl Quadrant {
    fn of(n: u64) -> Self {
        if n & 1 == 0 {
            Quadrant::Sine
        } else {
            Quadrant::Cosine
        }
    }
}

/// x = n·π/2 + r: the signed r (already negated where the quadrant's sine is
/// negative), the quadrant n, and whether the cosine polynomial is negated (quadrants 2
/// and 3). `None` for ±∞ and NaN.
fn reduce(x: f32) -> Option<(f64, u64, bool)> {
    // The sign of the sine per quadrant.
    const SIGN: [f64; 4] = [1.0, -1.0, -1.0, 1.0];
    if top12(x) < top12(FAST_LIMIT) {
        let wide = f64::from(x);
        // Truncation after the 2^24 scale: the quadrant rounds to nearest, negative
        // angles included.
        let n = ((wide * HALF_PI_INVERSE) as i32).wrapping_add(0x80_0000) >> 24;
        let r = (-f64::from(n)).mul_add(HALF_PI, wide);
        let q = n as u64 & 3;
        Some((r * SIGN[q as usize], n as u64, q & 2 != 0))
    } else if top12(x) < top12(f32::INFINITY) {
        let bits = x.to_bits();
        let (r, n) = reduce_large(bits);
        // The reduction ignored the sign: −x lies in quadrant −n, which the table's
        // sign and the cosine's negation take care of through n + sign.
        let q = n.wrapping_add(u64::from(bits >> 31)) & 3;
        Some((r * SIGN[q as usize], n, q & 2 != 0))
    } else {
        None
    }
}

/// |x| (bits `bits`, |x| ≥ 120) = n·π/2 + r, exactly in 2.62 fixed point: the 24-bit
/// significand times the 96 bits of 4/π its exponent selects.
fn reduce_large(bits: u32) -> (f64, u64) {
    let window = ((bits >> 26) & 15) as usize;
    let significand = ((bits & 0xFF_FFFF) | 0x80_0000) << ((bits >> 23) & 7);
    let high = u64::from(significand.wrapping_mul(FOUR_OVER_PI[window]));
    let middle = u64::from(significand) * u64::from(FOUR_OVER_PI[window + 4]);
    let low = u64::from(significand) * u64::from(FOUR_OVER_PI[window + 8]);
    let fixed = ((low >> 32) | (high << 32)).wrapping_add(middle);
    let n = fixed.wrapping_add(1 << 61) >> 62;
    let residue = fixed.wrapping_sub(n << 62) as i64;
    (residue as f64 * FIXED_UNIT, n)
}

/// The sine or cosine polynomial at r (`r2 = r·r`), the cosine negated if asked.
fn polynomial(r: f64, r2: f64, negate: bool, quadrant: Quadrant) -> f32 {
    match quadrant {
        Quadrant::Sine => {
            let r3 = r * r2;
            let tail = r2.mul_add(S3, S2);
            let r5 = r3 * r2;
            let head = r3.mul_add(S1, r);
            r5.mul_add(tail, head) as f32
        }
        Quadrant::Cosine => {
            let c = if negate { COSINE.map(|c| -c) } else { COSINE };
            let r4 = r2 * r2;
            let tail = r2.mul_add(c[4], c[3]);
            let head = r2.mul_add(c[1], c[0]);
            let r6 = r4 * r2;
            let head = r4.mul_add(c[2], head);
            r6.mul_add(tail, head) as f32
        }
    }
}

/// The exponent and the top three significand bits, without the sign.
fn top12(x: f32) -> u32 {
    (x.to_bits() >> 20) & 0x7FF
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each window is 32 bits of 2/π's expansion (0.a2f9836e4e441529… in hex), so the
    /// table is what its comment says.
    #[test]
    fn the_four_over_pi_windows_are_two_over_pis_digits() {
        const DIGITS: &str = "a2f9836e4e441529fc2757d1f534ddc0db6295993c439041";
        for (i, &entry) in FOUR_OVER_PI.iter().enumerate() {
            let end = 2 * (i + 1);
            let window = &DIGITS[end.saturating_sub(8)..end];
            assert_eq!(u32::from_str_radix(window, 16), Ok(entry), "entry {i}");
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(sin(0.0).to_bits(), 0f32.to_bits());
        assert_eq!(sin(-0.0).to_bits(), (-0f32).to_bits());
        assert_eq!(cos(0.0), 1.0);
        assert_eq!(cos(-0.0), 1.0);
        for x in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            assert!(sin(x).is_nan() && cos(x).is_nan(), "{x}");
        }
        // Within one ulp of the double-precision value, in every reduction's range.
        for x in [
            0.5f32, 1.0, -2.0, 3.0, 100.0, 119.9, 120.1, -1000.5, 65_536.3, 1e30,
        ] {
            let ulps = |ours: f32, exact: f64| {
                (ours.to_bits() as i64 - (exact as f32).to_bits() as i64).abs()
            };
            assert!(ulps(sin(x), f64::from(x).sin()) <= 1, "sin {x}");
            assert!(ulps(cos(x), f64::from(x).cos()) <= 1, "cos {x}");
        }
    }
}
