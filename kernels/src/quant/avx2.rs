//! [`super::quantize_block`] in eight-lane AVX2 vectors, operation for operation.

use std::arch::x86_64::*;

use super::BLOCK;

/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_block(
    block: &[f32; BLOCK],
    quants: &mut [i8; BLOCK],
) -> (f32, [i32; 2]) {
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    // SAFETY (loads and the store): a block is 32 floats, its quants 32 bytes.
    let v: [__m256; 4] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_ps(block.as_ptr().add(8 * i)) });
    // The reference's lanes: lane l is the maximum of elements l, l+8, l+16, l+24 (the
    // reference's `max` ignores NaN, as `max_ps` does when the NaN is its first operand).
    let mut lanes = _mm256_setzero_ps();
    for x in v {
        lanes = _mm256_max_ps(_mm256_and_ps(x, magnitude), lanes);
    }
    // Across the lanes in registers: the lanes hold magnitudes, never NaN, so their
    // maximum is the reference's in any order.
    let halves = _mm_max_ps(
        _mm256_castps256_ps128(lanes),
        _mm256_extractf128_ps::<1>(lanes),
    );
    let pairs = _mm_max_ps(halves, _mm_movehl_ps(halves, halves));
    let amax = _mm_cvtss_f32(_mm_max_ss(pairs, _mm_shuffle_ps::<0b01>(pairs, pairs)));
    let scale = amax / 127.0;
    let inverse = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let inverse = _mm256_set1_ps(inverse);
    let sign = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let (one, half) = (_mm256_set1_ps(1.0), _mm256_set1_ps(0.5));
    let (low, high) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    let ints: [__m256i; 4] = v.map(|x| {
        let x = _mm256_mul_ps(x, inverse);
        // round(x), halves away from zero: x − trunc(x) is exact, and so is trunc(x) ± 1.
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
        let fraction = _mm256_andnot_ps(sign, _mm256_sub_ps(x, t));
        let away = _mm256_or_ps(one, _mm256_and_ps(x, sign));
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(fraction, half);
        let rounded = _mm256_add_ps(t, _mm256_and_ps(away, up));
        // `as i8`: NaN to 0, saturated to [-128, 127].
        let number = _mm256_cmp_ps::<_CMP_ORD_Q>(x, x);
        let clamped = _mm256_min_ps(_mm256_max_ps(_mm256_and_ps(rounded, number), low), high);
        _mm256_cvttps_epi32(clamped)
    });
    let words = _mm256_packs_epi16(
        _mm256_packs_epi32(ints[0], ints[1]),
        _mm256_packs_epi32(ints[2], ints[3]),
    );
    let ordered = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: as above.
    unsafe { _mm256_storeu_si256(quants.as_mut_ptr().cast(), ordered) };
    // Integer sums, exact in any order, across the lanes in registers.
    let sum = |a: __m256i, b: __m256i| {
        let eight = _mm256_add_epi32(a, b);
        let four = _mm_add_epi32(
            _mm256_castsi256_si128(eight),
            _mm256_extracti128_si256::<1>(eight),
        );
        let two = _mm_add_epi32(four, _mm_unpackhi_epi64(four, four));
        _mm_cvtsi128_si32(_mm_add_epi32(two, _mm_shuffle_epi32::<0b01>(two)))
    };
    (scale, [sum(ints[0], ints[1]), sum(ints[2], ints[3])])
}
