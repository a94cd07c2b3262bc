//! AVX-512 VNNI kernels: an even and an odd block side by side in one 512-bit register
//! (lanes 0–7 and 8–15), `vpdpbusd` for the exact lane sums, so the low half is the
//! even chain and the high half the odd chain of the reference arithmetic.

// Tiles index weight rows (i) and activation rows (j) into several arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx2;
use crate::quant::{Format, QuantizedRows, WeightRow, BLOCK};

/// Two f32 values, each broadcast to one 256-bit half.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves(low: f32, high: f32) -> __m512 {
    let low = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_set1_ps(low)));
    _mm512_castpd_ps(_mm512_insertf64x4(
        low,
        _mm256_castps_pd(_mm256_set1_ps(high)),
        1,
    ))
}

/// Weight blocks `b` and `b + 1` of `row` (of `blocks`): unsigned operand and (signed
/// formats) sign mask. The format (`Format::ALL[F]`) is fixed at compile time, so each
/// tile kernel inlines only its own unpacking (a runtime match kept this a call: 8.5%
/// of a Gemma prefill).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn weight_pair<const F: usize>(
    row: &WeightRow<'_>,
    blocks: usize,
    b: usize,
) -> (__m512i, __mmask64) {
    match Format::ALL[F] {
        Format::Q4_1 => {
            // SAFETY: the caller checked 16 bytes per block; blocks b and b+1 are adjacent.
            let packed = unsafe { _mm256_loadu_si256(row.quants.as_ptr().add(b * 16).cast()) };
            let mask = _mm256_set1_epi8(0x0F);
            let low = _mm256_and_si256(packed, mask);
            let high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
            // [low b, low b+1, high b, high b+1] → [low b, high b, low b+1, high b+1].
            let joined = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
            (_mm512_shuffle_i64x2(joined, joined, 0b11_01_10_00), 0)
        }
        Format::Q5_1 => {
            // SAFETY: the caller checked 20 bytes per block (see `quant_of`).
            unsafe { (q5_pair(row.quants.as_ptr(), blocks, b), 0) }
        }
        Format::Q8_0 | Format::Q6_K => {
            // SAFETY: the caller checked 32 bytes per block; blocks b and b+1 are adjacent.
            let raw = unsafe { _mm512_loadu_si512(row.quants.as_ptr().add(b * BLOCK).cast()) };
            (_mm512_abs_epi8(raw), _mm512_movepi8_mask(raw))
        }
    }
}

/// The weight scales of blocks `b` and `b + 1` from `scales` (the row's): one per
/// 256-bit half, or (Q6_K) one per four lanes, each half's own.
///
/// # Safety
/// AVX-512 F; `scales` holds blocks `b` and `b + 1`'s scales.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair_scales(format: Format, scales: *const f32, b: usize) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe {
        if format == Format::Q6_K {
            let four = _mm512_castps128_ps512(_mm_loadu_ps(scales.add(2 * b)));
            let spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
            _mm512_permutexvar_ps(spread, four)
        } else {
            halves(*scales.add(b), *scales.add(b + 1))
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn accumulate_pair<const F: usize, const W: usize, const A: usize>(
    weights: &[WeightRow<'_>; W],
    activations: &QuantizedRows,
    first: usize,
    b: usize,
    acc: &mut [[__m512; A]; W],
) {
    let format = Format::ALL[F];
    let blocks = activations.cols / BLOCK;
    let mut unsigned = [_mm512_setzero_si512(); W];
    let mut negative = [0 as __mmask64; W];
    let mut weight_scale = [_mm512_setzero_ps(); W];
    for i in 0..W {
        // SAFETY: blocks b and b+1 of every row were checked by the caller.
        (unsigned[i], negative[i]) = unsafe { weight_pair::<F>(&weights[i], blocks, b) };
        // SAFETY: as above, for the scales.
        weight_scale[i] = unsafe { pair_scales(format, weights[i].scales.as_ptr(), b) };
    }
    for j in 0..A {
        let row = first + j;
        // SAFETY: row < rows and b + 1 < blocks, checked by the caller.
        let quants = unsafe {
            _mm512_loadu_si512(
                activations
                    .quants
                    .as_ptr()
                    .add(row * activations.cols + b * BLOCK)
                    .cast(),
            )
        };
        let scales = &activations.scales[row * blocks + b..][..2];
        let scale = halves(scales[0], scales[1]);
        for i in 0..W {
            let operand = if format.is_signed() {
                _mm512_mask_sub_epi8(quants, negative[i], _mm512_setzero_si512(), quants)
            } else {
                quants
            };
            let lanes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), unsigned[i], operand);
            let scale = _mm512_mul_ps(weight_scale[i], scale);
            acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), scale, acc[i][j]);
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const F: usize, const W: usize, const A: usize>(
    weights: &[WeightRow<'_>; W],
    activations: &QuantizedRows,
    first: usize,
    out: &mut [f32],
) {
    let format = Format::ALL[F];
    let blocks = activations.cols / BLOCK;
    let rows = activations.rows();
    let mut acc = [[_mm512_setzero_ps(); A]; W];
    for pair in 0..blocks / 2 {
        // A few rows (a decoding batch) read each weight once per step from memory, as
        // one row does: ask for the rows ahead too.
        super::prefetch_ahead(weights, format, 2 * pair);
        // SAFETY: blocks 2·pair and 2·pair + 1 are below `blocks`.
        unsafe { accumulate_pair::<F, W, A>(weights, activations, first, 2 * pair, &mut acc) };
    }
    for i in 0..W {
        for j in 0..A {
            let row = first + j;
            // SAFETY: row `row` exists and every block of weight row `i`.
            out[i * rows + row] =
                unsafe { finish_pairs(format, &weights[i], activations, row, acc[i][j]) };
        }
    }
}

/// One output from its paired chains (even blocks in the low half, odd in the high):
/// the unpaired last block of an odd count joins the even chain, as in the reference,
/// then [`avx2::finish`].
///
/// # Safety
/// AVX-512 F; activation row `row` and every block of `weights` exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn finish_pairs(
    format: Format,
    weights: &WeightRow<'_>,
    activations: &QuantizedRows,
    row: usize,
    acc: __m512,
) -> f32 {
    let blocks = activations.cols / BLOCK;
    let mut even = _mm512_castps512_ps256(acc);
    let odd = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    if blocks % 2 == 1 {
        let single = [*weights];
        let mut chain = [[even]];
        // SAFETY: AVX2 and FMA are implied by AVX-512 F; block `blocks - 1` exists.
        unsafe { avx2::accumulate(format, &single, activations, row, blocks - 1, &mut chain) };
        even = chain[0][0];
    }
    // SAFETY: as above.
    unsafe { avx2::finish(format, weights, activations, row, even, odd) }
}

/// Q4_1 blocks `b` and `b + 1` at `quants` (32 bytes): `[low b, high b, low b+1, high
/// b+1]`, the same operand as [`weight_pair`], in three operations instead of five.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn nibbles_pair(quants: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 32 readable bytes.
    let packed = _mm512_castsi256_si512(unsafe { _mm256_loadu_si256(quants.cast()) });
    // 128-bit lanes [block b, block b, block b+1, block b+1]…
    let doubled = _mm512_shuffle_i64x2(packed, packed, 0b01_01_00_00);
    // …and the second copy of each shifted down to its high nibbles.
    const FOUR: i64 = 0x0004_0004_0004_0004; // a shift count per 16-bit element
    let shifts = _mm512_set_epi64(FOUR, FOUR, 0, 0, FOUR, FOUR, 0, 0);
    _mm512_and_si512(_mm512_srlv_epi16(doubled, shifts), _mm512_set1_epi8(0x0F))
}

/// Q5_1 blocks `b` and `b + 1` of a row whose quants start at `quants` (`blocks`
/// blocks): Q4_1's nibbles with 16 added where the row's fifth bits (two blocks' are
/// one little-endian u64) are set.
///
/// # Safety
/// The row holds `blocks` Q5_1 blocks and `b + 1 < blocks`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q5_pair(quants: *const u8, blocks: usize, b: usize) -> __m512i {
    // SAFETY: the caller's promise: nibbles at b·16 (32 bytes for both blocks), bits at
    // blocks·16 + b·4 (8 bytes).
    unsafe {
        let nibbles = nibbles_pair(quants.add(b * 16));
        let bits = u64::from_le(std::ptr::read_unaligned(
            quants.add(blocks * 16 + b * 4).cast::<u64>(),
        ));
        _mm512_mask_add_epi8(nibbles, bits, nibbles, _mm512_set1_epi8(16))
    }
}

/// One activation row against `W` weight rows (decoding, and the rows a 4-row tile
/// leaves over): the arithmetic of [`tile`] with `A = 1`, with every pointer hoisted
/// out of the loop and the format (`Format::ALL[F]`) fixed at compile time.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn single_row<const F: usize, const W: usize>(
    weights: &[WeightRow<'_>; W],
    activations: &QuantizedRows,
    row: usize,
    out: &mut [f32],
) {
    let format = Format::ALL[F];
    let blocks = activations.cols / BLOCK;
    let rows = activations.rows();
    let packed = format.packed_bytes();
    let quants: [*const u8; W] = std::array::from_fn(|i| weights[i].quants.as_ptr());
    let scales: [*const f32; W] = std::array::from_fn(|i| weights[i].scales.as_ptr());
    // SAFETY (all pointer offsets below): `Isa::dot_rows` checked that every weight row
    // holds `blocks` blocks and the activations `rows × cols` quants and scales.
    let act_quants = unsafe { activations.quants.as_ptr().add(row * activations.cols) };
    let act_scales = unsafe { activations.scales.as_ptr().add(row * blocks) };
    let mut acc = [_mm512_setzero_ps(); W];
    for pair in 0..blocks / 2 {
        let b = 2 * pair;
        super::prefetch_ahead(weights, format, b);
        let (operand, act_scale) = unsafe {
            (
                _mm512_loadu_si512(act_quants.add(b * BLOCK).cast()),
                halves(*act_scales.add(b), *act_scales.add(b + 1)),
            )
        };
        for i in 0..W {
            let (unsigned, operand) = match format {
                Format::Q4_1 => (unsafe { nibbles_pair(quants[i].add(b * packed)) }, operand),
                Format::Q5_1 => (unsafe { q5_pair(quants[i], blocks, b) }, operand),
                Format::Q8_0 | Format::Q6_K => {
                    let raw = unsafe { _mm512_loadu_si512(quants[i].add(b * packed).cast()) };
                    let negative = _mm512_movepi8_mask(raw);
                    (
                        _mm512_abs_epi8(raw),
                        _mm512_mask_sub_epi8(operand, negative, _mm512_setzero_si512(), operand),
                    )
                }
            };
            let lanes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), unsigned, operand);
            let weight_scale = unsafe { pair_scales(format, scales[i], b) };
            let scale = _mm512_mul_ps(weight_scale, act_scale);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), scale, acc[i]);
        }
    }
    for i in 0..W {
        // SAFETY: row `row` exists and every block of weight row `i`.
        out[i * rows + row] =
            unsafe { finish_pairs(format, &weights[i], activations, row, acc[i]) };
    }
}

/// # Safety
/// AVX-512 F/BW/VNNI; `Isa::dot_rows` checked every slice length.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn dot_rows<const W: usize>(
    format: Format,
    weights: [WeightRow<'_>; W],
    activations: &QuantizedRows,
    span: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let wide = if W <= 4 { 4 } else { 1 };
    super::walk_rows(span, wide, |r, tiled| {
        // SAFETY: `walk_rows` hands out rows inside the checked span.
        unsafe {
            match (tiled, format) {
                (true, Format::Q4_1) => tile::<0, W, 4>(&weights, activations, r, out),
                (true, Format::Q5_1) => tile::<1, W, 4>(&weights, activations, r, out),
                (true, Format::Q8_0) => tile::<2, W, 4>(&weights, activations, r, out),
                (true, Format::Q6_K) => tile::<3, W, 4>(&weights, activations, r, out),
                (false, Format::Q4_1) => single_row::<0, W>(&weights, activations, r, out),
                (false, Format::Q5_1) => single_row::<1, W>(&weights, activations, r, out),
                (false, Format::Q8_0) => single_row::<2, W>(&weights, activations, r, out),
                (false, Format::Q6_K) => single_row::<3, W>(&weights, activations, r, out),
            }
        }
    });
}
