//! AVX2 kernels: one block per 256-bit register, maddubs + madd for the exact lane sums.
//! Tiles of W weight rows × A activation rows share loads; each element keeps its own
//! even and odd chains, so it is the reference arithmetic of `super`.

// Tiles index weight rows (i) and activation rows (j) into several arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::quant::{Format, QuantizedRows, WeightRow, BLOCK};

/// Same tree as `crate::quant::hsum8`: ((0+4)+(2+6)) + ((1+5)+(3+7)).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum8(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)))
}

/// The eight offset lanes `Σ m·s` by block index modulo 8 over padded rows.
///
/// # Safety
/// AVX2 and FMA; `mins` and `sums` of equal length, a multiple of 8.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn offset_lanes(mins: &[f32], sums: &[f32]) -> __m256 {
    let mut acc = _mm256_setzero_ps();
    for c in 0..mins.len() / 8 {
        // SAFETY: 8c + 8 <= len for both slices.
        let (m, s) = unsafe {
            (
                _mm256_loadu_ps(mins.as_ptr().add(c * 8)),
                _mm256_loadu_ps(sums.as_ptr().add(c * 8)),
            )
        };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(m, s));
    }
    acc
}

/// `(even + odd) + offset lanes` for formats with minimums, `even + odd` for signed
/// ones, reduced.
///
/// # Safety
/// AVX2 and FMA; the activation row exists.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn finish(
    format: Format,
    weights: &WeightRow<'_>,
    activations: &QuantizedRows,
    row: usize,
    even: __m256,
    odd: __m256,
) -> f32 {
    let mut total = _mm256_add_ps(even, odd);
    if format.has_min() {
        let width = weights.mins.len();
        let sums = &activations.sums[row * width..][..width];
        // SAFETY: equal, padded lengths.
        total = _mm256_add_ps(total, unsafe { offset_lanes(weights.mins, sums) });
    }
    hsum8(total)
}

/// Weight block `b` of `row` (of `blocks`): the unsigned operand for maddubs and, for
/// signed formats, the raw signed bytes whose signs move onto the activations.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn weight_block(
    format: Format,
    row: &WeightRow<'_>,
    blocks: usize,
    b: usize,
) -> (__m256i, __m256i) {
    match format {
        Format::Q4_1 => {
            // SAFETY: the caller checked 16 bytes per block.
            let packed = unsafe { _mm_loadu_si128(row.quants.as_ptr().add(b * 16).cast()) };
            let mask = _mm_set1_epi8(0x0F);
            let low = _mm_and_si128(packed, mask);
            let high = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
            (_mm256_set_m128i(high, low), _mm256_setzero_si256())
        }
        Format::Q5_1 => {
            // SAFETY: the caller checked 20 bytes per block: 16 of nibbles at b·16, and
            // the fifth bits after the row's nibbles.
            let (packed, bits) = unsafe {
                (
                    _mm_loadu_si128(row.quants.as_ptr().add(b * 16).cast()),
                    std::ptr::read_unaligned(
                        row.quants.as_ptr().add(blocks * 16 + b * 4).cast::<u32>(),
                    ),
                )
            };
            let mask = _mm_set1_epi8(0x0F);
            let low = _mm_and_si128(packed, mask);
            let high = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
            let nibbles = _mm256_set_m128i(high, low);
            (
                _mm256_or_si256(nibbles, fifth_bits(u32::from_le(bits))),
                _mm256_setzero_si256(),
            )
        }
        Format::Q8_0 | Format::Q6_K => {
            // SAFETY: the caller checked 32 bytes per block.
            let raw = unsafe { _mm256_loadu_si256(row.quants.as_ptr().add(b * BLOCK).cast()) };
            (_mm256_sign_epi8(raw, raw), raw)
        }
    }
}

/// 16 in byte `e` where bit `e` of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn fifth_bits(bits: u32) -> __m256i {
    let repeated = _mm256_set1_epi32(bits as i32);
    // Byte e takes byte e / 8 of `bits` (each 128-bit lane holds all four)…
    let spread = _mm256_shuffle_epi8(
        repeated,
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        ),
    );
    // …and keeps bit e % 8 of it.
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Block `b`'s weight scale for each of the eight lanes (Q6_K: lanes 0–3 the first
/// half's, 4–7 the second's).
///
/// # Safety
/// AVX2; the row has block `b`'s scales.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weight_scales(format: Format, row: &WeightRow<'_>, b: usize) -> __m256 {
    // SAFETY: the caller checked `scales_per_block` scales per block.
    unsafe {
        if format == Format::Q6_K {
            let first = _mm_set1_ps(*row.scales.get_unchecked(2 * b));
            _mm256_set_m128(_mm_set1_ps(*row.scales.get_unchecked(2 * b + 1)), first)
        } else {
            _mm256_set1_ps(*row.scales.get_unchecked(b))
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn accumulate<const W: usize, const A: usize>(
    format: Format,
    weights: &[WeightRow<'_>; W],
    activations: &QuantizedRows,
    first: usize,
    b: usize,
    chain: &mut [[__m256; A]; W],
) {
    let ones = _mm256_set1_epi16(1);
    let blocks = activations.cols / BLOCK;
    let mut unsigned = [_mm256_setzero_si256(); W];
    let mut signs = [_mm256_setzero_si256(); W];
    let mut weight_scale = [_mm256_setzero_ps(); W];
    for i in 0..W {
        // SAFETY: block `b` of every row was checked by the caller.
        (unsigned[i], signs[i]) = unsafe { weight_block(format, &weights[i], blocks, b) };
        weight_scale[i] = unsafe { weight_scales(format, &weights[i], b) };
    }
    for j in 0..A {
        let row = first + j;
        // SAFETY: row < rows and b < blocks, checked by the caller.
        let (quants, scale) = unsafe {
            (
                _mm256_loadu_si256(
                    activations
                        .quants
                        .as_ptr()
                        .add(row * activations.cols + b * BLOCK)
                        .cast(),
                ),
                _mm256_set1_ps(*activations.scales.get_unchecked(row * blocks + b)),
            )
        };
        for i in 0..W {
            let operand = if format.is_signed() {
                _mm256_sign_epi8(quants, signs[i])
            } else {
                quants
            };
            let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned[i], operand), ones);
            let scale = _mm256_mul_ps(weight_scale[i], scale);
            chain[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, chain[i][j]);
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const W: usize, const A: usize>(
    format: Format,
    weights: &[WeightRow<'_>; W],
    activations: &QuantizedRows,
    first: usize,
    out: &mut [f32],
) {
    let blocks = activations.cols / BLOCK;
    let rows = activations.rows();
    let mut even = [[_mm256_setzero_ps(); A]; W];
    let mut odd = [[_mm256_setzero_ps(); A]; W];
    for pair in 0..blocks / 2 {
        if A == 1 {
            // Decoding: the weights stream from memory (see `prefetch_ahead`).
            super::prefetch_ahead(weights, format, 2 * pair);
        }
        // SAFETY: both blocks are below `blocks`.
        unsafe {
            accumulate(format, weights, activations, first, 2 * pair, &mut even);
            accumulate(format, weights, activations, first, 2 * pair + 1, &mut odd);
        }
    }
    if blocks % 2 == 1 {
        // SAFETY: as above.
        unsafe { accumulate(format, weights, activations, first, blocks - 1, &mut even) };
    }
    for i in 0..W {
        for j in 0..A {
            let row = first + j;
            // SAFETY: row `row` exists.
            out[i * rows + row] =
                unsafe { finish(format, &weights[i], activations, row, even[i][j], odd[i][j]) };
        }
    }
}

/// # Safety
/// AVX2 and FMA; `Isa::dot_rows` checked every slice length.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_rows<const W: usize>(
    format: Format,
    weights: [WeightRow<'_>; W],
    activations: &QuantizedRows,
    span: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let wide = if W <= 2 { 2 } else { 1 };
    super::walk_rows(span, wide, |r, tiled| {
        // SAFETY: `walk_rows` hands out rows inside the checked span.
        unsafe {
            if tiled {
                tile::<W, 2>(format, &weights, activations, r, out)
            } else {
                tile::<W, 1>(format, &weights, activations, r, out)
            }
        }
    });
}
