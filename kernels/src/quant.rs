//! GGUF block formats, activation quantization and the integer dot products.
//!
//! Activations are quantized per block of 32 to i8 with an f32 scale (and the scaled
//! sum a Q4_1 offset needs), as llama.cpp does, but keeping the scale in f32.
//!
//! The arithmetic of one dot product is fixed, so the SIMD and scalar paths agree bit
//! for bit: within a block the 32 integer products are summed exactly into eight lanes
//! of four consecutive elements; each lane accumulates `lane_sum as f32 * (d_w * d_a)`
//! across blocks (a multiply then an add, never fused); the eight lanes are reduced
//! by [`hsum8`]'s fixed tree; a Q4_1 row adds `Σ m_w * s_a`, accumulated in block order.

#![allow(unsafe_code)] // SIMD intrinsics only, in `avx2`, behind runtime detection.

use half::f16;

use crate::KernelError;

/// Weights per quantization block.
pub const BLOCK: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// 4-bit with per-block scale and minimum: w = d·q + m, q ∈ 0..16. 20 bytes per block.
    Q4_1,
    /// 8-bit with per-block scale: w = d·q, q ∈ -128..128. 34 bytes per block.
    Q8_0,
}

impl Format {
    pub fn block_bytes(self) -> usize {
        match self {
            Format::Q4_1 => 20,
            Format::Q8_0 => 34,
        }
    }

    /// Bytes of quants per block once scale and minimum are split off.
    pub fn packed_bytes(self) -> usize {
        match self {
            Format::Q4_1 => 16,
            Format::Q8_0 => 32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Q4_1 => "Q4_1",
            Format::Q8_0 => "Q8_0",
        }
    }
}

/// A quantized weight matrix, row-major: `rows` outputs of `cols` inputs each, held
/// as packed quants (16 bytes per Q4_1 block, 32 per Q8_0 block) with the block
/// scales and minimums widened to f32 once, at load.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    quants: Vec<u8>,
    scales: Vec<f32>,
    mins: Vec<f32>,
}

impl Matrix {
    pub fn new(
        name: &str,
        format: Format,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<Self, KernelError> {
        let bad = |problem: String| KernelError::BadTensor {
            name: name.to_owned(),
            problem,
        };
        if cols == 0 || cols % BLOCK != 0 {
            return Err(bad(format!(
                "row length {cols} is not a positive multiple of {BLOCK}"
            )));
        }
        let blocks = rows * (cols / BLOCK);
        let expected = blocks * format.block_bytes();
        if data.len() != expected {
            return Err(bad(format!(
                "{} bytes for a {rows}x{cols} {} matrix, expected {expected}",
                data.len(),
                format.name()
            )));
        }
        let mut quants = Vec::with_capacity(blocks * format.packed_bytes());
        let mut scales = Vec::with_capacity(blocks);
        let mut mins = Vec::with_capacity(blocks);
        for block in data.chunks_exact(format.block_bytes()) {
            scales.push(f16::from_le_bytes([block[0], block[1]]).to_f32());
            match format {
                Format::Q4_1 => {
                    mins.push(f16::from_le_bytes([block[2], block[3]]).to_f32());
                    quants.extend_from_slice(&block[4..20]);
                }
                Format::Q8_0 => {
                    mins.push(0.0);
                    quants.extend_from_slice(&block[2..34]);
                }
            }
        }
        Ok(Self {
            format,
            rows,
            cols,
            quants,
            scales,
            mins,
        })
    }

    /// One row's packed quants, scales and minimums.
    pub fn row(&self, row: usize) -> WeightRow<'_> {
        let blocks = self.cols / BLOCK;
        let packed = blocks * self.format.packed_bytes();
        WeightRow {
            quants: &self.quants[row * packed..][..packed],
            scales: &self.scales[row * blocks..][..blocks],
            mins: &self.mins[row * blocks..][..blocks],
        }
    }

    /// Writes row `row` as f32 into `out` (`cols` long).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let weights = self.row(row);
        let packed = self.format.packed_bytes();
        for (b, chunk) in out.chunks_exact_mut(BLOCK).enumerate() {
            let quants = &weights.quants[b * packed..][..packed];
            let (scale, min) = (weights.scales[b], weights.mins[b]);
            for (e, value) in chunk.iter_mut().enumerate() {
                *value = match self.format {
                    Format::Q4_1 => scale * f32::from(nibble(quants, e)) + min,
                    Format::Q8_0 => scale * f32::from(quants[e] as i8),
                };
            }
        }
    }
}

/// Element `e` of a packed Q4_1 block: GGML puts elements 0..16 in the low nibbles
/// and 16..32 in the high ones.
#[inline]
fn nibble(packed: &[u8], e: usize) -> u8 {
    if e < 16 {
        packed[e] & 0x0F
    } else {
        packed[e - 16] >> 4
    }
}

#[derive(Clone, Copy)]
pub struct WeightRow<'a> {
    pub quants: &'a [u8],
    pub scales: &'a [f32],
    pub mins: &'a [f32],
}

/// Rows of activations quantized per block of 32.
#[derive(Clone, Debug, Default)]
pub struct QuantizedRows {
    pub cols: usize,
    pub quants: Vec<i8>,
    pub scales: Vec<f32>,
    /// `scale · Σ quants` per block: what a Q4_1 minimum multiplies.
    pub sums: Vec<f32>,
}

impl QuantizedRows {
    pub fn rows(&self) -> usize {
        self.quants.len().checked_div(self.cols).unwrap_or(0)
    }

    pub fn row(&self, row: usize) -> ActivationRow<'_> {
        let blocks = self.cols / BLOCK;
        ActivationRow {
            quants: &self.quants[row * self.cols..][..self.cols],
            scales: &self.scales[row * blocks..][..blocks],
            sums: &self.sums[row * blocks..][..blocks],
        }
    }
}

#[derive(Clone, Copy)]
pub struct ActivationRow<'a> {
    pub quants: &'a [i8],
    pub scales: &'a [f32],
    pub sums: &'a [f32],
}

/// Quantizes `values` (rows of `cols`, a multiple of 32) block by block.
pub fn quantize_rows(values: &[f32], cols: usize) -> QuantizedRows {
    debug_assert!(cols % BLOCK == 0 && values.len() % cols == 0);
    let blocks = values.len() / BLOCK;
    let mut out = QuantizedRows {
        cols,
        quants: vec![0; values.len()],
        scales: vec![0.0; blocks],
        sums: vec![0.0; blocks],
    };
    for (b, block) in values.chunks_exact(BLOCK).enumerate() {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inverse = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in out.quants[b * BLOCK..][..BLOCK].iter_mut().zip(block) {
            *q = (v * inverse).round() as i8;
            sum += i32::from(*q);
        }
        out.scales[b] = scale;
        out.sums[b] = scale * sum as f32;
    }
    out
}

/// The fixed reduction tree of eight lanes: ((0+4)+(2+6)) + ((1+5)+(3+7)).
#[inline]
pub fn hsum8(lanes: [f32; 8]) -> f32 {
    let quad = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    (quad[0] + quad[2]) + (quad[1] + quad[3])
}

/// Which instruction set the dot products use; every choice gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
}

impl Isa {
    /// The fastest path this CPU supports.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Dot product of one unpacked weight row with one activation row.
    #[inline]
    pub fn dot(
        self,
        format: Format,
        weights: WeightRow<'_>,
        activations: ActivationRow<'_>,
    ) -> f32 {
        match (self, format) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Format::Q4_1) => {
                // SAFETY: `Isa::Avx2` is only produced by `detect` after the CPU reported
                // AVX2 (or by tests that check the same); the slices' lengths are checked
                // inside before any load.
                unsafe { avx2::dot_q4_1(weights, activations) }
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, Format::Q8_0) => {
                // SAFETY: as above.
                unsafe { avx2::dot_q8_0(weights, activations) }
            }
            (_, Format::Q4_1) => scalar_dot_q4_1(weights, activations),
            (_, Format::Q8_0) => scalar_dot_q8_0(weights, activations),
        }
    }
}

fn scalar_dot_q4_1(weights: WeightRow<'_>, activations: ActivationRow<'_>) -> f32 {
    let mut lanes = [0f32; 8];
    let mut offset = 0f32;
    let blocks = activations.scales.len();
    for b in 0..blocks {
        let packed = &weights.quants[b * 16..][..16];
        let a = &activations.quants[b * BLOCK..][..BLOCK];
        let scale = weights.scales[b] * activations.scales[b];
        for (lane, acc) in lanes.iter_mut().enumerate() {
            let mut sum = 0i32;
            for (e, &activation) in a.iter().enumerate().skip(lane * 4).take(4) {
                sum += i32::from(nibble(packed, e)) * i32::from(activation);
            }
            *acc += sum as f32 * scale;
        }
        offset += weights.mins[b] * activations.sums[b];
    }
    hsum8(lanes) + offset
}

fn scalar_dot_q8_0(weights: WeightRow<'_>, activations: ActivationRow<'_>) -> f32 {
    let mut lanes = [0f32; 8];
    let blocks = activations.scales.len();
    for b in 0..blocks {
        let w = &weights.quants[b * BLOCK..][..BLOCK];
        let a = &activations.quants[b * BLOCK..][..BLOCK];
        let scale = weights.scales[b] * activations.scales[b];
        for (lane, acc) in lanes.iter_mut().enumerate() {
            let mut sum = 0i32;
            for e in lane * 4..lane * 4 + 4 {
                sum += i32::from(w[e] as i8) * i32::from(a[e]);
            }
            *acc += sum as f32 * scale;
        }
    }
    hsum8(lanes)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{ActivationRow, WeightRow, BLOCK};

    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum8(v: __m256) -> f32 {
        // Same tree as `super::hsum8`: (lo + hi) pairs lanes i and i+4, then
        // movehl pairs (0+4) with (2+6) and (1+5) with (3+7), then lane 0 + lane 1.
        let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        let one = _mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1));
        _mm_cvtss_f32(one)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dot_q4_1(weights: WeightRow<'_>, activations: ActivationRow<'_>) -> f32 {
        let blocks = activations.scales.len();
        assert!(
            weights.quants.len() >= blocks * 16
                && activations.quants.len() >= blocks * BLOCK
                && weights.scales.len() >= blocks
                && weights.mins.len() >= blocks
                && activations.sums.len() >= blocks
        );
        let ones = _mm256_set1_epi16(1);
        let low_nibbles = _mm_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut offset = 0f32;
        for b in 0..blocks {
            // SAFETY: the assert above keeps the 16- and 32-byte loads inside the slices.
            let (packed, a) = unsafe {
                (
                    _mm_loadu_si128(weights.quants.as_ptr().add(b * 16).cast()),
                    _mm256_loadu_si256(activations.quants.as_ptr().add(b * BLOCK).cast()),
                )
            };
            let low = _mm_and_si128(packed, low_nibbles);
            let high = _mm_and_si128(_mm_srli_epi16(packed, 4), low_nibbles);
            let w = _mm256_set_m128i(high, low);
            let pairs = _mm256_maddubs_epi16(w, a);
            let lanes = _mm256_madd_epi16(pairs, ones);
            let scale = _mm256_set1_ps(weights.scales[b] * activations.scales[b]);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(lanes), scale));
            offset += weights.mins[b] * activations.sums[b];
        }
        hsum8(acc) + offset
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dot_q8_0(weights: WeightRow<'_>, activations: ActivationRow<'_>) -> f32 {
        let blocks = activations.scales.len();
        assert!(
            weights.quants.len() >= blocks * BLOCK
                && activations.quants.len() >= blocks * BLOCK
                && weights.scales.len() >= blocks
        );
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        for b in 0..blocks {
            // SAFETY: the assert above keeps both 32-byte loads inside the slices.
            let (w, a) = unsafe {
                (
                    _mm256_loadu_si256(weights.quants.as_ptr().add(b * BLOCK).cast()),
                    _mm256_loadu_si256(activations.quants.as_ptr().add(b * BLOCK).cast()),
                )
            };
            // maddubs multiplies unsigned by signed: move w's sign onto a.
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
            let lanes = _mm256_madd_epi16(pairs, ones);
            let scale = _mm256_set1_ps(weights.scales[b] * activations.scales[b]);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(lanes), scale));
        }
        hsum8(acc)
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A random matrix in `format` with plausible scales.
    pub(crate) fn random_matrix(format: Format, rows: usize, cols: usize, seed: u64) -> Matrix {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut data = Vec::new();
        for _ in 0..rows * cols / BLOCK {
            let d = f16::from_f32(rng.random_range(0.001f32..0.05));
            data.extend_from_slice(&d.to_le_bytes());
            match format {
                Format::Q4_1 => {
                    let m = f16::from_f32(rng.random_range(-0.4f32..0.0));
                    data.extend_from_slice(&m.to_le_bytes());
                    data.extend((0..16).map(|_| rng.random::<u8>()));
                }
                Format::Q8_0 => data.extend((0..32).map(|_| rng.random::<u8>())),
            }
        }
        Matrix::new("test", format, rows, cols, data).expect("well-formed")
    }

    pub(crate) fn random_values(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-3f32..3.0)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::{random_matrix, random_values};
    use super::*;

    #[test]
    fn simd_and_scalar_dots_agree_bit_for_bit() {
        if Isa::detect() == Isa::Scalar {
            eprintln!("no AVX2 on this CPU: only the scalar path exists here");
            return;
        }
        for format in [Format::Q4_1, Format::Q8_0] {
            let matrix = random_matrix(format, 16, 1536, 7);
            let acts = quantize_rows(&random_values(3 * 1536, 8), 1536);
            for r in 0..matrix.rows {
                for a in 0..acts.rows() {
                    let simd = Isa::Avx2.dot(format, matrix.row(r), acts.row(a));
                    let scalar = Isa::Scalar.dot(format, matrix.row(r), acts.row(a));
                    assert_eq!(
                        simd.to_bits(),
                        scalar.to_bits(),
                        "{format:?} row {r} act {a}"
                    );
                }
            }
        }
    }

    #[test]
    fn dots_approximate_the_float_product() {
        for format in [Format::Q4_1, Format::Q8_0] {
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
                let got = f64::from(Isa::detect().dot(format, matrix.row(r), acts.row(0)));
                // Activation rounding is at most half a step (1/254 of the block max).
                assert!(
                    (got - exact).abs() <= 0.01 * magnitude + 1e-4,
                    "{format:?} row {r}: {got} vs {exact} (magnitude {magnitude})"
                );
            }
        }
    }

    #[test]
    fn quantization_round_trips_within_half_a_step() {
        let values = random_values(64, 5);
        let q = quantize_rows(&values, 64);
        for (i, v) in values.iter().enumerate() {
            let step = q.scales[i / BLOCK];
            let back = step * f32::from(q.quants[i]);
            assert!((back - v).abs() <= step * 0.5 + 1e-6, "{v} -> {back}");
        }
        let zeros = quantize_rows(&[0.0; 32], 32);
        assert_eq!(zeros.scales, vec![0.0]);
        assert!(zeros.quants.iter().all(|&q| q == 0));
    }

    #[test]
    fn malformed_matrices_are_rejected_with_the_reason() {
        let err = Matrix::new("blk.0.attn_q.weight", Format::Q4_1, 2, 33, vec![0; 40])
            .expect_err("33 is not a multiple of 32");
        assert!(err.to_string().contains("multiple of 32"), "{err}");
        let err = Matrix::new("blk.0.attn_q.weight", Format::Q4_1, 2, 32, vec![0; 39])
            .expect_err("short data");
        assert!(err.to_string().contains("expected 40"), "{err}");
    }
}
