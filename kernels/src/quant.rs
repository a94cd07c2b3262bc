//! GGUF block formats, activation quantization and the integer dot products.
//!
//! Activations are quantized per block of 32 to i8 with an f32 scale (and the scaled
//! sum a Q4_1 offset needs), as llama.cpp does, but keeping the scale in f32.
//!
//! The dot products themselves, and the arithmetic they fix, are in [`crate::dot`].

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
        if cols == 0 || !cols.is_multiple_of(BLOCK) {
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
        let per_row = cols / BLOCK;
        let mut mins = Vec::with_capacity(rows * padded(per_row));
        for (index, block) in data.chunks_exact(format.block_bytes()).enumerate() {
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
            if index % per_row == per_row - 1 {
                mins.resize(mins.len() + padded(per_row) - per_row, 0.0);
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
            mins: &self.mins[row * padded(blocks)..][..padded(blocks)],
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
pub(crate) fn nibble(packed: &[u8], e: usize) -> u8 {
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
    /// `scale · Σ quants` per block: what a Q4_1 minimum multiplies. Each row's run is
    /// zero-padded to a multiple of eight blocks (see [`padded`]).
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
            sums: &self.sums[row * padded(blocks)..][..padded(blocks)],
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
    debug_assert!(cols.is_multiple_of(BLOCK) && values.len().is_multiple_of(cols));
    let blocks = values.len() / BLOCK;
    let per_row = cols / BLOCK;
    let mut out = QuantizedRows {
        cols,
        quants: vec![0; values.len()],
        scales: vec![0.0; blocks],
        sums: vec![0.0; (blocks / per_row.max(1)) * padded(per_row)],
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
        out.sums[(b / per_row) * padded(per_row) + b % per_row] = scale * sum as f32;
    }
    out
}

/// Blocks rounded up to a multiple of eight: the per-row length of Q4_1 minimums and
/// activation sums, zero-padded, so their dot runs in whole 8-lane chunks.
pub fn padded(blocks: usize) -> usize {
    blocks.div_ceil(8) * 8
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
    use super::tests_support::random_values;
    use super::*;

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
