//! Weight-group · activation-row dot products, and the one arithmetic every
//! instruction set follows so that all of them give the same bits.
//!
//! For weight row `w` and activation row `a`, block `b` (32 elements) and sub-block
//! `s` (the block itself, or Q6_K's halves of 16), the integer sum
//! `S = Σ q_w·q_a` over the sub-block is exact (at most 32·128·127 in magnitude, so
//! exact in f32 too). One chain per output accumulates, sub-block after sub-block in
//! order: `acc = fma(S as f32, d_w[b, s] · d_a[b], acc)` (`f32::mul_add`: exact in
//! software where the CPU lacks FMA). A format with minimums (Q4_1, Q5_1) keeps a
//! second chain, `off = fma(m_w[b], σ_a[b], off)` with `σ_a = d_a·Σ q_a`, and the
//! output is `acc + off`; other formats output `acc`.
//!
//! This is the arithmetic a tile of integer products can keep (issue "Kernels ahead
//! of llama.cpp"): the SIMD paths put 16 weight rows in the lanes of one register
//! ([`crate::quant::GROUP`]), `vpdpbusd` (AVX2: `pmaddubsw` + `pmaddwd`) sums four
//! products per lane, and the lanes' integer sums over a block need no float until
//! its one conversion. Stored offsets (Q8_0 and Q6_K keep `q + 128` / `q + 32` as
//! unsigned bytes) are removed exactly: `S = Σ stored·q_a − offset·Σ q_a`.

#![allow(unsafe_code)] // SIMD intrinsics only, in `avx2`/`avx512`, behind runtime detection.

use crate::quant::{quant_of, ActivationRow, Format, Group, QuantizedRows, BLOCK, GROUP};

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

    /// The fastest path this CPU supports (AVX2 at most after [`crate::hold_to_avx2`]).
    pub fn detect() -> Self {
        Self::avx512()
            .filter(|_| crate::avx512_allowed())
            .or_else(Self::avx2)
            .unwrap_or(Self::SCALAR)
    }

    /// The AVX2 path, where the CPU has AVX2, FMA and F16C (every AVX2 CPU made has).
    pub fn avx2() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
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

    /// `out[r * stride + i] = (row i of group) · activations.row(r)` for the activation
    /// rows `span` and the group's first `lanes` rows (16, or fewer where the matrix's
    /// last group is padding past them).
    pub fn dot_group(
        self,
        format: Format,
        group: Group<'_>,
        activations: &QuantizedRows,
        span: std::ops::Range<usize>,
        out: &mut [f32],
        (stride, lanes): (usize, usize),
    ) {
        let blocks = activations.cols / BLOCK;
        assert!(
            span.end <= activations.rows(),
            "row span beyond the activations"
        );
        assert!(lanes <= GROUP, "a group has 16 rows");
        if let Some(last) = span.end.checked_sub(1).filter(|_| !span.is_empty()) {
            assert!(out.len() >= last * stride + lanes, "output too small");
        }
        assert_eq!(group.quants.len(), blocks * format.group_block_bytes());
        assert_eq!(
            group.scales.len(),
            blocks * GROUP * format.scales_per_block()
        );
        let mins = if format.has_min() { blocks * GROUP } else { 0 };
        assert_eq!(group.mins.len(), mins);
        assert!(activations.quants.len() >= activations.rows() * activations.cols);
        assert!(activations.scales.len() >= activations.rows() * blocks);
        assert!(activations.sums.len() >= activations.rows() * blocks);
        assert!(activations.half_sums.len() >= activations.rows() * 2 * blocks);
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => {
                // SAFETY: `IsaKind::Avx2` exists only after the CPU reported AVX2; the
                // asserts above keep every load and store of the kernel inside its slice.
                unsafe { avx2::dot_group(format, &group, activations, span, out, stride, lanes) }
            }
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx512Vnni => {
                // SAFETY: as above, for AVX-512 F/BW/VNNI.
                unsafe { avx512::dot_group(format, &group, activations, span, out, stride, lanes) }
            }
            IsaKind::Scalar => {
                for r in span {
                    for lane in 0..lanes {
                        out[r * stride + lane] =
                            scalar_dot(format, group, lane, activations.row(r));
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
    while r + wide <= span.end {
        tile(r, true);
        r += wide;
    }
    while r < span.end {
        tile(r, false);
        r += 1;
    }
}

/// How many blocks ahead of the one computing a kernel asks for a group's weights.
/// Decoding streams every weight from memory once per token; a group's blocks (and
/// the next group's) are contiguous, so one distance covers the whole matrix.
const PREFETCH_BLOCKS: usize = 8;

/// Prefetches block `b + PREFETCH_BLOCKS` of a group's quants, scales and minimums
/// (running on into the next group's, which follow in memory). Only hints: an address
/// past the matrix fetches nothing useful and never faults.
#[cfg(target_arch = "x86_64")]
#[inline(always)] // in the inner loop
fn prefetch_ahead(format: Format, group: &Group<'_>, b: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let hint = |address: *const u8| {
        // SAFETY: prefetch only hints the cache; it reads nothing the program sees and
        // does not fault on any address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(address.cast()) }
    };
    let ahead = b + PREFETCH_BLOCKS;
    let bytes = format.group_block_bytes();
    let quants = group.quants.as_ptr().wrapping_add(ahead * bytes);
    for line in (0..bytes).step_by(64) {
        hint(quants.wrapping_add(line));
    }
    let subs = format.scales_per_block();
    let scales = group.scales.address(ahead * subs * GROUP);
    for line in 0..subs {
        hint(scales.wrapping_add(64 * line));
    }
    if format.has_min() {
        hint(group.mins.address(ahead * GROUP));
    }
}

/// The reference arithmetic (module docs), one element at a time: row `lane` of
/// `group` · `activations`.
pub fn scalar_dot(
    format: Format,
    group: Group<'_>,
    lane: usize,
    activations: ActivationRow<'_>,
) -> f32 {
    let bytes = format.group_block_bytes();
    let subs = format.scales_per_block();
    let per_sub = BLOCK / subs;
    let mut acc = 0f32;
    for (b, &activation_scale) in activations.scales.iter().enumerate() {
        let quants = &group.quants[b * bytes..][..bytes];
        let a = &activations.quants[b * BLOCK..][..BLOCK];
        for s in 0..subs {
            let sum: i32 = (s * per_sub..(s + 1) * per_sub)
                .map(|e| quant_of(format, quants, lane, e) * i32::from(a[e]))
                .sum();
            let scale = group.scales.get((b * subs + s) * GROUP + lane) * activation_scale;
            acc = (sum as f32).mul_add(scale, acc);
        }
    }
    if format.has_min() {
        let mut off = 0f32;
        for (b, &sum) in activations.sums.iter().enumerate() {
            off = group.mins.get(b * GROUP + lane).mul_add(sum, off);
        }
        acc + off
    } else {
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_rows;
    use crate::quant::tests_support::{
        random_f16_matrix, random_factored_matrix, random_matrix, random_values,
    };

    /// Every path computes every group's rows against every activation row with the
    /// reference's bits: tiles of four rows and single rows, split spans, a last group
    /// of padding past its 5 real rows; scales kept as f32 and as f16 (those give the
    /// bits the same values kept as f32 give).
    #[test]
    fn every_instruction_set_gives_the_reference_bits() {
        let paths = Isa::available();
        eprintln!(
            "paths on this CPU: {:?}",
            paths.iter().map(|p| p.name()).collect::<Vec<_>>()
        );
        let (rows, acts_rows) = (37, 7);
        for (cols, format) in [576, 1280, 1568]
            .into_iter()
            .flat_map(|c| Format::ALL.map(|f| (c, f)))
        {
            let compact = random_f16_matrix(format, rows, cols, 7);
            let widened = compact.clone().with_f32_scales();
            assert!(
                compact.memory_bytes() < widened.memory_bytes(),
                "{format:?}: f16 values are kept as f16"
            );
            let mut cases = vec![
                (random_matrix(format, rows, cols, 7), None),
                (compact, Some(widened)),
            ];
            // K-quants' scales, kept as units times factors (whole super-blocks only).
            if format != Format::Q8_0 && cols % 256 == 0 {
                let factored = random_factored_matrix(format, rows, cols, 9);
                let widened = factored.clone().with_f32_scales();
                assert!(
                    factored.memory_bytes() < widened.memory_bytes(),
                    "{format:?}: factored values are kept factored"
                );
                cases.push((factored, Some(widened)));
            }
            for (matrix, reference_matrix) in cases {
                let reference_matrix = reference_matrix.as_ref().unwrap_or(&matrix);
                let acts = quantize_rows(&random_values(acts_rows * cols, 8), cols);
                let reference: Vec<f32> = (0..acts_rows)
                    .flat_map(|r| (0..rows).map(move |c| (r, c)))
                    .map(|(r, c)| {
                        let group = reference_matrix.group(c / GROUP);
                        scalar_dot(format, group, c % GROUP, acts.row(r))
                    })
                    .collect();
                for &isa in &paths {
                    let mut got = vec![f32::NAN; acts_rows * rows];
                    for g in 0..matrix.groups() {
                        let lanes = GROUP.min(rows - g * GROUP);
                        let out = &mut got[g * GROUP..];
                        // Two spans, as the matmul walks rows: the split changes no value.
                        for span in [0..3, 3..acts_rows] {
                            let group = matrix.group(g);
                            isa.dot_group(format, group, &acts, span, out, (rows, lanes));
                        }
                    }
                    for (k, (g, want)) in got.iter().zip(&reference).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{} {format:?} cols {cols} element {k}: {g} vs {want}",
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
                let group = matrix.group(r / GROUP);
                let got = f64::from(scalar_dot(format, group, r % GROUP, acts.row(0)));
                // Activation rounding is at most half a step (1/254 of the block max).
                assert!(
                    (got - exact).abs() <= 0.01 * magnitude + 1e-4,
                    "{format:?} row {r}: {got} vs {exact} (magnitude {magnitude})"
                );
            }
        }
    }
}
