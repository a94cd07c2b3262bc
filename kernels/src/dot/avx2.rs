//! AVX2 kernels: half a group (8 weight rows) in the 8 lanes of a register,
//! `pmaddubsw` + `pmaddwd` for the exact sum of four products per lane. Each half of a
//! group is its own pass; tiles of A activation rows share each block's weights.

// Tiles index chunks (k) and activation rows (j) into several arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::quant::{Format, Group, QuantizedRows, Scales, BLOCK, GROUP};

/// The eight chunk operands of rows `8·half..8·half + 8` of a group's block at
/// `quants`: unsigned bytes, except Q8_0's, which come back as signed quants (the
/// stored `q + 128` as unsigned would overflow `pmaddubsw`'s i16 pair sums).
///
/// # Safety
/// `quants` points at a whole group block of the format.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn operands<const F: usize>(quants: *const u8, half: usize) -> [__m256i; 8] {
    let format = Format::ALL[F];
    let mut w = [_mm256_setzero_si256(); 8];
    let at = |k: usize| quants.wrapping_add(64 * k + 32 * half);
    // SAFETY (all loads): the caller's promise; the block holds `group_block_bytes`.
    unsafe {
        match format {
            Format::Q4_1 | Format::Q5_1 => {
                let low = _mm256_set1_epi8(0x0F);
                for k in 0..4 {
                    let packed = _mm256_loadu_si256(at(k).cast());
                    w[k] = _mm256_and_si256(packed, low);
                    w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
                }
                if format == Format::Q5_1 {
                    // Bits 32·half.. of chunk k's u64: one per byte of the operand.
                    let spread = _mm256_setr_epi8(
                        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                        3, 3, 3, 3, 3, 3, 3,
                    );
                    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                    for k in 0..8 {
                        let bits = std::ptr::read_unaligned(
                            quants.add(256 + 8 * k + 4 * half).cast::<i32>(),
                        );
                        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), spread);
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, select), select);
                        w[k] = _mm256_add_epi8(w[k], _mm256_and_si256(set, _mm256_set1_epi8(16)));
                    }
                }
            }
            Format::Q8_0 => {
                let flip = _mm256_set1_epi8(-128);
                for k in 0..8 {
                    w[k] = _mm256_xor_si256(_mm256_loadu_si256(at(k).cast()), flip);
                }
            }
            Format::Q6_K => {
                for k in 0..8 {
                    w[k] = _mm256_loadu_si256(at(k).cast());
                }
            }
        }
    }
    w
}

/// The exact integer sums of chunks `chunks` against activation words `a`, from
/// `start`. Q8_0's operands are signed: the sign moves onto the activation.
///
/// # Safety
/// `a` points at eight readable i32 words (a block's 32 activation quants).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sub_sum<const F: usize>(
    w: &[__m256i; 8],
    a: *const i32,
    chunks: std::ops::Range<usize>,
    start: __m256i,
) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let mut sum = start;
    for k in chunks {
        // SAFETY: k < 8, the caller's promise.
        let activation = _mm256_set1_epi32(unsafe { a.add(k).read_unaligned() });
        let pairs = if Format::ALL[F] == Format::Q8_0 {
            _mm256_maddubs_epi16(
                _mm256_sign_epi8(w[k], w[k]),
                _mm256_sign_epi8(activation, w[k]),
            )
        } else {
            _mm256_maddubs_epi16(w[k], activation)
        };
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, ones));
    }
    sum
}

/// Values `at..at + 8` of `scales` (`at` a multiple of 8), widened to f32 (exact).
///
/// # Safety
/// AVX2 and F16C; `at + 8 ≤ scales.len()`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load8(scales: Scales<'_>, at: usize) -> __m256 {
    // SAFETY (both): the caller's promise.
    match scales {
        Scales::F32(v) => unsafe { _mm256_loadu_ps(v.as_ptr().add(at)) },
        Scales::F16(v) => unsafe { _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(at).cast())) },
        // Eight rows' factors times their units: the same f32 product `Scales::get`
        // makes (exact), so the bits do not depend on the store.
        Scales::Factored {
            units,
            factors,
            span,
        } => unsafe {
            let factors = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                factors.as_ptr().add(at).cast(),
            )));
            let units = _mm256_loadu_ps(units.as_ptr().add(Scales::unit_index(at, span)));
            _mm256_mul_ps(units, factors)
        },
    }
}

/// Rows `8·half..` of a group · activation rows `first..first + A`, stored at
/// `out[r * stride + 8·half + lane]` for lanes below `lanes − 8·half`.
///
/// # Safety
/// AVX2, FMA and F16C; `Isa::dot_group` checked every slice length.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const F: usize, const A: usize>(
    group: &Group<'_>,
    activations: &QuantizedRows,
    first: usize,
    out: &mut [f32],
    (stride, lanes, half): (usize, usize, usize),
) {
    let format = Format::ALL[F];
    let blocks = activations.cols / BLOCK;
    let bytes = format.group_block_bytes();
    let subs = format.scales_per_block();
    // Q8_0's operands are signed quants already (see `operands`).
    let offset = if format == Format::Q8_0 {
        0
    } else {
        format.offset()
    };
    let act_quants = activations.quants.as_ptr();
    let act_scales = activations.scales.as_ptr();
    let act_sums = activations.sums.as_ptr();
    let act_halves = activations.half_sums.as_ptr();
    let mut acc = [_mm256_setzero_ps(); A];
    let mut off = [_mm256_setzero_ps(); A];
    for b in 0..blocks {
        super::prefetch_ahead(format, group, b);
        // SAFETY: block b < blocks of the group, checked by the caller.
        let w = unsafe { operands::<F>(group.quants.as_ptr().add(b * bytes), half) };
        // SAFETY: as above, for the block's scales and minimums.
        let (weight_scale, second_scale, mins) = unsafe {
            (
                load8(group.scales, b * subs * GROUP + 8 * half),
                // Q6_K's second half's scales (one-scale formats read none).
                if subs == 2 {
                    load8(group.scales, (b * subs + 1) * GROUP + 8 * half)
                } else {
                    _mm256_setzero_ps()
                },
                if format.has_min() {
                    load8(group.mins, b * GROUP + 8 * half)
                } else {
                    _mm256_setzero_ps()
                },
            )
        };
        for j in 0..A {
            let row = first + j;
            // SAFETY: row < rows and block b exist, checked by the caller: the block's 32
            // quants are eight (unaligned) i32 words.
            let a = unsafe {
                act_quants
                    .add(row * activations.cols + b * BLOCK)
                    .cast::<i32>()
            };
            let at = row * blocks + b;
            // SAFETY: `at` < rows · blocks, checked by the caller (as for the sums).
            let activation_scale = _mm256_set1_ps(unsafe { *act_scales.add(at) });
            let halves = unsafe { [*act_halves.add(2 * at), *act_halves.add(2 * at + 1)] };
            if subs == 1 {
                let start = _mm256_set1_epi32(-offset * (halves[0] + halves[1]));
                let sum = unsafe { sub_sum::<F>(&w, a, 0..8, start) };
                let scale = _mm256_mul_ps(weight_scale, activation_scale);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[j]);
            } else {
                let first_half =
                    unsafe { sub_sum::<F>(&w, a, 0..4, _mm256_set1_epi32(-offset * halves[0])) };
                let second_half =
                    unsafe { sub_sum::<F>(&w, a, 4..8, _mm256_set1_epi32(-offset * halves[1])) };
                let scale = _mm256_mul_ps(weight_scale, activation_scale);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(first_half), scale, acc[j]);
                let scale = _mm256_mul_ps(second_scale, activation_scale);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(second_half), scale, acc[j]);
            }
            if format.has_min() {
                let sum = _mm256_set1_ps(unsafe { *act_sums.add(at) });
                off[j] = _mm256_fmadd_ps(mins, sum, off[j]);
            }
        }
    }
    let keep = lanes.saturating_sub(8 * half).min(8);
    for j in 0..A {
        let result = if format.has_min() {
            _mm256_add_ps(acc[j], off[j])
        } else {
            acc[j]
        };
        let mut values = [0f32; 8];
        // SAFETY: `values` holds eight floats.
        unsafe { _mm256_storeu_ps(values.as_mut_ptr(), result) };
        let at = (first + j) * stride + 8 * half;
        out[at..at + keep].copy_from_slice(&values[..keep]);
    }
}

/// # Safety
/// AVX2, FMA and F16C; `Isa::dot_group` checked every slice length.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_group(
    format: Format,
    group: &Group<'_>,
    activations: &QuantizedRows,
    span: std::ops::Range<usize>,
    out: &mut [f32],
    stride: usize,
    lanes: usize,
) {
    for half in 0..lanes.div_ceil(8) {
        let at = (stride, lanes, half);
        super::walk_rows(span.clone(), 4, |r, tiled| {
            // SAFETY: `walk_rows` hands out rows inside the checked span.
            unsafe {
                match (tiled, format) {
                    (true, Format::Q4_1) => tile::<0, 4>(group, activations, r, out, at),
                    (true, Format::Q5_1) => tile::<1, 4>(group, activations, r, out, at),
                    (true, Format::Q8_0) => tile::<2, 4>(group, activations, r, out, at),
                    (true, Format::Q6_K) => tile::<3, 4>(group, activations, r, out, at),
                    (false, Format::Q4_1) => tile::<0, 1>(group, activations, r, out, at),
                    (false, Format::Q5_1) => tile::<1, 1>(group, activations, r, out, at),
                    (false, Format::Q8_0) => tile::<2, 1>(group, activations, r, out, at),
                    (false, Format::Q6_K) => tile::<3, 1>(group, activations, r, out, at),
                }
            }
        });
    }
}
