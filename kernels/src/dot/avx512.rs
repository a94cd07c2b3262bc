//! AVX-512 VNNI kernels: a group's 16 weight rows in the 16 lanes of a register, one
//! `vpdpbusd` per four consecutive weights (the 64-byte chunk the layout stores), the
//! activation's four bytes broadcast to every lane. Tiles of A activation rows share
//! each block's unpacked weights.

// Tiles index chunks (k) and activation rows (j) into several arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::quant::{Format, Group, QuantizedRows, Scales, BLOCK, GROUP};

/// The eight chunk operands (unsigned bytes, lanes = rows) of a group's block at
/// `quants`. The format (`Format::ALL[F]`) is fixed at compile time.
///
/// # Safety
/// `quants` points at a whole group block of the format.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn operands<const F: usize>(quants: *const u8) -> [__m512i; 8] {
    let format = Format::ALL[F];
    let mut w = [_mm512_setzero_si512(); 8];
    // SAFETY (all loads): the caller's promise; the block holds `group_block_bytes`.
    unsafe {
        match format {
            Format::Q4_1 | Format::Q5_1 => {
                let low = _mm512_set1_epi8(0x0F);
                for k in 0..4 {
                    let packed = _mm512_loadu_si512(quants.add(64 * k).cast());
                    w[k] = _mm512_and_si512(packed, low);
                    w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
                }
                if format == Format::Q5_1 {
                    let sixteen = _mm512_set1_epi8(16);
                    for k in 0..8 {
                        let bits = std::ptr::read_unaligned(quants.add(256 + 8 * k).cast::<u64>());
                        w[k] = _mm512_mask_add_epi8(w[k], u64::from_le(bits), w[k], sixteen);
                    }
                }
            }
            Format::Q8_0 | Format::Q6_K => {
                for k in 0..8 {
                    w[k] = _mm512_loadu_si512(quants.add(64 * k).cast());
                }
            }
        }
    }
    w
}

/// The exact integer sums of chunks `chunks` (a sub-block) against activation bytes
/// `a` (eight i32 words, one per chunk), starting from `start` (the stored offset's
/// correction), in two chains.
///
/// # Safety
/// `a` points at eight readable i32 words (a block's 32 activation quants).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn sub_sum(
    w: &[__m512i; 8],
    a: *const i32,
    chunks: std::ops::Range<usize>,
    start: __m512i,
) -> __m512i {
    let mut even = start;
    let mut odd = _mm512_setzero_si512();
    for k in chunks.step_by(2) {
        // SAFETY (both reads): k + 1 < 8, the caller's promise.
        even = _mm512_dpbusd_epi32(
            even,
            w[k],
            _mm512_set1_epi32(unsafe { a.add(k).read_unaligned() }),
        );
        odd = _mm512_dpbusd_epi32(
            odd,
            w[k + 1],
            _mm512_set1_epi32(unsafe { a.add(k + 1).read_unaligned() }),
        );
    }
    _mm512_add_epi32(even, odd)
}

/// Values `at..at + 16` of `scales` (`at` a multiple of 16), widened to f32 (exact).
///
/// # Safety
/// AVX-512 F; `at + 16 ≤ scales.len()`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load16(scales: Scales<'_>, at: usize) -> __m512 {
    // SAFETY (both): the caller's promise.
    match scales {
        Scales::F32(v) => unsafe { _mm512_loadu_ps(v.as_ptr().add(at)) },
        Scales::F16(v) => unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(at).cast())) },
        // Sixteen rows' factors times their units: `Scales::get`'s exact f32 product.
        Scales::Factored {
            units,
            factors,
            span,
        } => unsafe {
            let factors = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                factors.as_ptr().add(at).cast(),
            )));
            let units = _mm512_loadu_ps(units.as_ptr().add(Scales::unit_index(at, span)));
            _mm512_mul_ps(units, factors)
        },
    }
}

/// Group · activation rows `first..first + A`, stored at `out[r * stride + lane]` for
/// the first `lanes` lanes.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `Isa::dot_group` checked every slice length.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const F: usize, const A: usize>(
    group: &Group<'_>,
    activations: &QuantizedRows,
    first: usize,
    out: &mut [f32],
    stride: usize,
    lanes: usize,
) {
    let format = Format::ALL[F];
    let blocks = activations.cols / BLOCK;
    let bytes = format.group_block_bytes();
    let subs = format.scales_per_block();
    let offset = format.offset();
    let act_quants = activations.quants.as_ptr();
    let act_scales = activations.scales.as_ptr();
    let act_sums = activations.sums.as_ptr();
    let act_halves = activations.half_sums.as_ptr();
    let mut acc = [_mm512_setzero_ps(); A];
    let mut off = [_mm512_setzero_ps(); A];
    for b in 0..blocks {
        super::prefetch_ahead(format, group, b);
        // SAFETY: block b < blocks of the group, checked by the caller.
        let w = unsafe { operands::<F>(group.quants.as_ptr().add(b * bytes)) };
        // SAFETY: as above, for the block's scales and minimums.
        let (weight_scale, second_scale, mins) = unsafe {
            (
                load16(group.scales, b * subs * GROUP),
                // Q6_K's second half's scales (one-scale formats read none).
                if subs == 2 {
                    load16(group.scales, (b * subs + 1) * GROUP)
                } else {
                    _mm512_setzero_ps()
                },
                if format.has_min() {
                    load16(group.mins, b * GROUP)
                } else {
                    _mm512_setzero_ps()
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
            let activation_scale = _mm512_set1_ps(unsafe { *act_scales.add(at) });
            let halves = unsafe { [*act_halves.add(2 * at), *act_halves.add(2 * at + 1)] };
            if subs == 1 {
                let start = _mm512_set1_epi32(-offset * (halves[0] + halves[1]));
                let sum = unsafe { sub_sum(&w, a, 0..8, start) };
                let scale = _mm512_mul_ps(weight_scale, activation_scale);
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[j]);
            } else {
                let first_half =
                    unsafe { sub_sum(&w, a, 0..4, _mm512_set1_epi32(-offset * halves[0])) };
                let second_half =
                    unsafe { sub_sum(&w, a, 4..8, _mm512_set1_epi32(-offset * halves[1])) };
                let scale = _mm512_mul_ps(weight_scale, activation_scale);
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(first_half), scale, acc[j]);
                let scale = _mm512_mul_ps(second_scale, activation_scale);
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(second_half), scale, acc[j]);
            }
            if format.has_min() {
                let sum = _mm512_set1_ps(unsafe { *act_sums.add(at) });
                off[j] = _mm512_fmadd_ps(mins, sum, off[j]);
            }
        }
    }
    let mask = if lanes >= GROUP {
        u16::MAX
    } else {
        (1u16 << lanes) - 1
    };
    for j in 0..A {
        let result = if format.has_min() {
            _mm512_add_ps(acc[j], off[j])
        } else {
            acc[j]
        };
        // SAFETY: the caller checked `out` holds `row * stride + lanes` values.
        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add((first + j) * stride), mask, result) };
    }
}

/// # Safety
/// AVX-512 F/BW/VNNI; `Isa::dot_group` checked every slice length.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn dot_group(
    format: Format,
    group: &Group<'_>,
    activations: &QuantizedRows,
    span: std::ops::Range<usize>,
    out: &mut [f32],
    stride: usize,
    lanes: usize,
) {
    super::walk_rows(span, 4, |r, tiled| {
        // SAFETY: `walk_rows` hands out rows inside the checked span.
        unsafe {
            match (tiled, format) {
                (true, Format::Q4_1) => tile::<0, 4>(group, activations, r, out, stride, lanes),
                (true, Format::Q5_1) => tile::<1, 4>(group, activations, r, out, stride, lanes),
                (true, Format::Q8_0) => tile::<2, 4>(group, activations, r, out, stride, lanes),
                (true, Format::Q6_K) => tile::<3, 4>(group, activations, r, out, stride, lanes),
                (false, Format::Q4_1) => tile::<0, 1>(group, activations, r, out, stride, lanes),
                (false, Format::Q5_1) => tile::<1, 1>(group, activations, r, out, stride, lanes),
                (false, Format::Q8_0) => tile::<2, 1>(group, activations, r, out, stride, lanes),
                (false, Format::Q6_K) => tile::<3, 1>(group, activations, r, out, stride, lanes),
            }
        }
    });
}
