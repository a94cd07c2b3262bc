//! Weight-row · activation-row dot products, and the one arithmetic every instruction
//! set follows so that all of them give the same bits.
//!
//! For block `b` (32 elements) the integer products are summed exactly into eight
//! lanes of four consecutive elements, `s_l`. Even and odd blocks accumulate into two
//! separate sets of eight lanes: `acc[l] = fma(s_l as f32, d_w[b, l] * d_a[b], acc[l])`,
//! one fused multiply-add (`f32::mul_add`: exact in software where the CPU lacks FMA),
//! where `d_w[b, l]` is the block's weight scale (Q6_K: lanes 0–3 take the first
//! half's, 4–7 the second's). A row with minimums (Q4_1, Q5_1) also needs
//! `Σ m_w[b]·s_a[b]`: its terms accumulate in eight lanes by block index modulo 8
//! (`off[l] += m·s`, over the zero-padded [`padded`] length). The lanes combine as
//! `(even[l] + odd[l]) + off[l]` (signed formats: `even[l] + odd[l]`) and reduce by
//! [`hsum8`]'s fixed tree. Two chains hide the add latency, and an AVX-512 register
//! holds an even and an odd block side by side.

#![allow(unsafe_code)] // SIMD intrinsics only, in `avx2`/`avx512`, behind runtime detection.

use crate::quant::{
    hsum8, padded, quant_of, ActivationRow, Format, QuantizedRows, WeightRow, BLOCK,
};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Which instruction set the dot products use; every choice gives the same bits.
/// Only [`Isa::detect`], [`Isa::avx2`] and [`Isa::avx512`] hand out a SIMD choice,
/// after asking the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa(IsaKind);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IsaKind {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl Isa {
    pub const SCALAR: Isa = Isa(IsaKind::Scalar);

    /// The fastest path this CPU supports.
    pub fn detect() -> Self {
        Self::avx512().or_else(Self::avx2).unwrap_or(Self::SCALAR)
    }

    /// The AVX2 path, where the CPU has AVX2 and FMA.
    pub fn avx2() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Some(Isa(IsaKind::Avx2));
            }
        }
        None
    }

    /// The AVX-512 VNNI path, where the CPU has AVX-512 F, BW and VNNI.
    pub fn avx512() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vnni")
            {
                return Some(Isa(IsaKind::Avx512Vnni));
            }
        }
        None
    }

    /// Every path this CPU can run, scalar first.
    pub fn available() -> Vec<Self> {
        let mut all = vec![Self::SCALAR];
        all.extend(Self::avx2());
        all.extend(Self::avx512());
        all
    }

    pub fn name(self) -> &'static str {
        match self.0 {
            IsaKind::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx512Vnni => "avx512-vnni",
        }
    }

    /// Whether 4 weight rows × 4 activation rows fit the registers (AVX-512 has 32).
    pub fn wide_tiles(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self.0 == IsaKind::Avx512Vnni
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// `out[i * rows + r] = weights[i] · activations.row(r)` for the activation rows in
    /// `span` (`rows` counts them all, so callers can walk the rows in cache-sized spans).
    pub fn dot_rows<const W: usize>(
        self,
        format: Format,
        weights: [WeightRow<'_>; W],
        activations: &QuantizedRows,
        span: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let rows = activations.rows();
        assert!(span.end <= rows, "row span beyond the activations");
        assert!(out.len() >= W * rows, "output too small");
        let blocks = activations.cols / BLOCK;
        for w in &weights {
            assert!(w.quants.len() >= blocks * format.packed_bytes());
            assert!(w.scales.len() >= blocks * format.scales_per_block());
            assert!(w.mins.len() == format.mins_per_row(blocks));
        }
        assert!(activations.quants.len() >= rows * activations.cols);
        assert!(activations.scales.len() >= rows * blocks);
        assert!(activations.sums.len() >= rows * padded(blocks));
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => {
                // SAFETY: `IsaKind::Avx2` exists only after the CPU reported AVX2; the
                // asserts above keep every load of the kernel inside its slice.
                unsafe { avx2::dot_rows(format, weights, activations, span, out) }
            }
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx512Vnni => {
                // SAFETY: as above, for AVX-512 F/BW/VNNI.
                unsafe { avx512::dot_rows(format, weights, activations, span, out) }
            }
            IsaKind::Scalar => {
                for (i, w) in weights.iter().enumerate() {
                    for r in span.clone() {
                        out[i * rows + r] = scalar_dot(format, *w, activations.row(r));
                    }
                }
            }
        }
    }
}

/// Walks `span` in tiles of `wide` rows while whole tiles fit (`tile(r, true)`), then
/// row by row (`tile(r, false)`): the loop every SIMD path shares.
#[cfg(target_arch = "x86_64")]
fn walk_rows(span: std::ops::Range<usize>, wide: usize, mut tile: impl FnMut(usize, bool)) {
    let mut r = span.start;
    if wide > 1 {
        while r + wide <= span.end {
            tile(r, true);
            r += wide;
        }
    }
    while r < span.end {
        tile(r, false);
        r += 1;
    }
}

/// How many `W`-row tiles ahead a one-row kernel asks for weights. Decoding streams
/// every weight from memory once per token; without the hint a core waited on each
/// row (4–5 GB/s of a 12 GB/s read here), with it the kernel runs at ~9–10 GB/s
/// (`examples/decode_stream`: 1, 2, 4, 8 tiles measured; 8 the steadiest).
const PREFETCH_TILES: usize = 8;

/// Prefetches, while blocks `b` and `b + 1` of `weights` compute, the same bytes of the
/// rows `PREFETCH_TILES` tiles further on (a matrix's rows are contiguous); at `b == 0`
/// also those rows' scales and (where the format has them) minimums. Only hints: an
/// address past the matrix fetches nothing useful and never faults.
#[cfg(target_arch = "x86_64")]
#[inline(always)] // in the inner loop: a call here cost 14% of decoding
fn prefetch_ahead<const W: usize>(weights: &[WeightRow<'_>; W], format: Format, b: usize) {
    // Q5_1: nibbles at 16 bytes per block, then the row's fifth bits (4 per block).
    let stride = if format == Format::Q5_1 {
        16
    } else {
        format.packed_bytes()
    };
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let hint = |address: *const u8| {
        // SAFETY: prefetch only hints the cache; it reads nothing the program sees and
        // does not fault on any address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(address.cast()) }
    };
    for w in weights {
        let ahead = |row: &[u8]| row.as_ptr().wrapping_add(PREFETCH_TILES * W * row.len());
        if (b * stride).is_multiple_of(64) {
            hint(ahead(w.quants).wrapping_add(b * stride));
        }
        if format == Format::Q5_1 && (b * 4).is_multiple_of(64) {
            let blocks = w.quants.len() / 20;
            hint(ahead(w.quants).wrapping_add(blocks * 16 + b * 4));
        }
        if b == 0 {
            let mins: &[f32] = if format.has_min() { w.mins } else { &[] };
            for side in [bytes_of(w.scales), bytes_of(mins)] {
                for line in (0..side.len()).step_by(64) {
                    hint(ahead(side).wrapping_add(line));
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn bytes_of(values: &[f32]) -> &[u8] {
    // SAFETY: any f32 is four initialised bytes; the slice keeps `values`' lifetime.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// The reference arithmetic (module docs), one element at a time.
pub fn scalar_dot(format: Format, weights: WeightRow<'_>, activations: ActivationRow<'_>) -> f32 {
    let mut chains = [[0f32; 8]; 2];
    let per_block = format.scales_per_block();
    let blocks = activations.scales.len();
    for b in 0..blocks {
        let a = &activations.quants[b * BLOCK..][..BLOCK];
        for (lane, acc) in chains[b % 2].iter_mut().enumerate() {
            let mut sum = 0i32;
            for (e, &activation) in a.iter().enumerate().skip(lane * 4).take(4) {
                sum += quant_of(format, weights.quants, blocks, b, e) * i32::from(activation);
            }
            let scale =
                weights.scales[b * per_block + lane * per_block / 8] * activations.scales[b];
            *acc = (sum as f32).mul_add(scale, *acc);
        }
    }
    let [even, odd] = chains;
    let mut total: [f32; 8] = std::array::from_fn(|l| even[l] + odd[l]);
    if format.has_min() {
        let mut off = [0f32; 8];
        for (m, s) in weights
            .mins
            .chunks_exact(8)
            .zip(activations.sums.chunks_exact(8))
        {
            for l in 0..8 {
                off[l] += m[l] * s[l];
            }
        }
        for l in 0..8 {
            total[l] += off[l];
        }
    }
    hsum8(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_rows;
    use crate::quant::tests_support::{random_matrix, random_values};

    #[test]
    fn every_instruction_set_gives_the_reference_bits() {
        let paths = Isa::available();
        eprintln!(
            "paths on this CPU: {:?}",
            paths.iter().map(|p| p.name()).collect::<Vec<_>>()
        );
        // 576 = 18 blocks (even count), 1568 = 49 blocks (odd): both chain endings.
        for cols in [576, 1568] {
            for format in Format::ALL {
                let matrix = random_matrix(format, 9, cols, 7);
                let acts = quantize_rows(&random_values(7 * cols, 8), cols);
                let reference: Vec<f32> = (0..9)
                    .flat_map(|i| (0..7).map(move |r| (i, r)))
                    .map(|(i, r)| scalar_dot(format, matrix.row(i), acts.row(r)))
                    .collect();
                for (&isa, tile) in paths.iter().flat_map(|isa| [(isa, 2), (isa, 4)]) {
                    let mut got = vec![0f32; 9 * 7];
                    for i in (0..8).step_by(tile) {
                        let out = &mut got[i * 7..];
                        if tile == 2 {
                            isa.dot_rows(
                                format,
                                [matrix.row(i), matrix.row(i + 1)],
                                &acts,
                                0..7,
                                out,
                            );
                        } else {
                            let rows = std::array::from_fn::<_, 4, _>(|k| matrix.row(i + k));
                            // Two spans, as the matmul walks rows: the split changes no value.
                            isa.dot_rows(format, rows, &acts, 0..3, &mut *out);
                            isa.dot_rows(format, rows, &acts, 3..7, out);
                        }
                    }
                    isa.dot_rows(format, [matrix.row(8)], &acts, 0..7, &mut got[8 * 7..]);
                    for (k, (g, want)) in got.iter().zip(&reference).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{} tile {tile} {format:?} cols {cols} element {k}: {g} vs {want}",
                            isa.name()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn dots_approximate_the_float_product() {
        for format in Format::ALL {
            let matrix = random_matrix(format, 8, 576, 3);
            let values = random_values(576, 4);
            let acts = quantize_rows(&values, 576);
            let mut dense = vec![0f32; 576];
            for r in 0..matrix.rows {
                matrix.dequantize_row(r, &mut dense);
                let exact: f64 = dense
                    .iter()
                    .zip(&values)
                    .map(|(w, x)| f64::from(*w) * f64::from(*x))
                    .sum();
                let magnitude: f64 = dense
                    .iter()
                    .zip(&values)
                    .map(|(w, x)| (f64::from(*w) * f64::from(*x)).abs())
                    .sum();
                let mut got = [0f32];
                Isa::detect().dot_rows(format, [matrix.row(r)], &acts, 0..1, &mut got);
                let got = f64::from(got[0]);
                // Activation rounding is at most half a step (1/254 of the block max).
                assert!(
                    (got - exact).abs() <= 0.01 * magnitude + 1e-4,
                    "{format:?} row {r}: {got} vs {exact} (magnitude {magnitude})"
                );
            }
        }
    }
}
