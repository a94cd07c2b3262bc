//! Weight matrices in the kernels' layouts, and activation quantization.
//!
//! Activations are quantized per block of 32 to i8 with an f32 scale (and the scaled
//! sum a minimum multiplies), as llama.cpp does, but keeping the scale in f32.
//!
//! The dot products themselves, and the arithmetic they fix, are in [`crate::dot`].

pub use crate::blocks::{Format, BLOCK};

use crate::blocks::{self, BlockType, KernelBlock};
use crate::KernelError;

/// A quantized weight matrix, row-major: `rows` outputs of `cols` inputs each, held
/// as packed quants (16 bytes per Q4_1 block, 32 for the others) with the block
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
    /// A matrix from the file's bytes of `block_type` (see [`crate::blocks`]).
    pub fn new(
        name: &str,
        block_type: BlockType,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<Self, KernelError> {
        let bad = |problem: String| KernelError::BadTensor {
            name: name.to_owned(),
            problem,
        };
        let per_block = block_type.elements();
        if cols == 0 || !cols.is_multiple_of(per_block) {
            return Err(bad(format!(
                "row length {cols} is not a positive multiple of {per_block} ({} blocks)",
                block_type.name()
            )));
        }
        let expected = rows
            .checked_mul(cols / per_block)
            .and_then(|blocks| blocks.checked_mul(block_type.bytes()));
        if Some(data.len()) != expected {
            return Err(bad(format!(
                "{} bytes for a {rows}x{cols} {} matrix, expected {}",
                data.len(),
                block_type.name(),
                expected.map_or_else(|| "more than memory holds".into(), |e| e.to_string())
            )));
        }
        let format = block_type.kernel_format();
        let blocks = rows * (cols / BLOCK);
        let per_row = cols / BLOCK;
        let mut matrix = Self {
            format,
            rows,
            cols,
            quants: Vec::with_capacity(blocks * format.packed_bytes()),
            scales: Vec::with_capacity(blocks * format.scales_per_block()),
            mins: Vec::with_capacity(rows * format.mins_per_row(per_row)),
        };
        let mut row = RowBuilder::default();
        for raw in data.chunks_exact(block_type.bytes()) {
            blocks::decode(block_type, raw, &mut |block| {
                row.push(&mut matrix, block);
                if row.blocks == per_row {
                    row.finish(&mut matrix);
                }
            });
        }
        Ok(matrix)
    }

    /// One row's packed quants, scales and minimums (none for signed layouts).
    pub fn row(&self, row: usize) -> WeightRow<'_> {
        let blocks = self.cols / BLOCK;
        let packed = blocks * self.format.packed_bytes();
        let scales = blocks * self.format.scales_per_block();
        let mins = self.format.mins_per_row(blocks);
        WeightRow {
            quants: &self.quants[row * packed..][..packed],
            scales: &self.scales[row * scales..][..scales],
            mins: &self.mins[row * mins..][..mins],
        }
    }

    /// Writes row `row` as f32 into `out` (`cols` long).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let weights = self.row(row);
        let (blocks, per_block) = (self.cols / BLOCK, self.format.scales_per_block());
        for (b, chunk) in out.chunks_exact_mut(BLOCK).enumerate() {
            let min = weights.mins.get(b).copied();
            for (e, value) in chunk.iter_mut().enumerate() {
                let scale = weights.scales[b * per_block + e * per_block / BLOCK];
                let quant = quant_of(self.format, weights.quants, blocks, b, e) as f32;
                *value = match min {
                    Some(min) => scale * quant + min,
                    None => scale * quant,
                };
            }
        }
    }

    /// The matrix whose row `i` is this one's row `order[i]` (`order` a permutation of
    /// the rows: the loader reorders qwen2's q/k rows).
    pub fn with_rows_from(&self, order: &[usize]) -> Matrix {
        debug_assert_eq!(order.len(), self.rows);
        let blocks = self.cols / BLOCK;
        let mut out = Matrix {
            format: self.format,
            rows: self.rows,
            cols: self.cols,
            quants: Vec::with_capacity(self.quants.len()),
            scales: Vec::with_capacity(self.scales.len()),
            mins: Vec::with_capacity(self.mins.len()),
        };
        for &from in order {
            let row = self.row(from);
            out.quants.extend_from_slice(row.quants);
            out.scales.extend_from_slice(row.scales);
            out.mins.extend_from_slice(row.mins);
        }
        debug_assert_eq!(out.mins.len(), self.rows * self.format.mins_per_row(blocks));
        out
    }

    /// Bytes the matrix holds in memory.
    pub fn memory_bytes(&self) -> usize {
        self.quants.len() + 4 * (self.scales.len() + self.mins.len())
    }
}

/// Builds a matrix row by row from kernel blocks: a Q5_1 row keeps its fifth bits
/// after all its nibbles (see [`quant_of`]).
#[derive(Default)]
struct RowBuilder {
    blocks: usize,
    fifth_bits: Vec<u8>,
}

impl RowBuilder {
    fn push(&mut self, matrix: &mut Matrix, block: KernelBlock) {
        let q = block.quants;
        let nibbles = (0..16).map(|j| (q[j] & 0x0F) | (q[j + 16] << 4));
        match matrix.format {
            Format::Q4_1 => matrix.quants.extend(nibbles),
            Format::Q5_1 => {
                matrix.quants.extend(nibbles);
                let bits = (0..BLOCK).fold(0u32, |bits, e| {
                    bits | (u32::from(block.quants[e] >> 4) << e)
                });
                self.fifth_bits.extend_from_slice(&bits.to_le_bytes());
            }
            Format::Q8_0 | Format::Q6_K => matrix.quants.extend_from_slice(&block.quants),
        }
        let scales = &block.scales[..matrix.format.scales_per_block()];
        matrix.scales.extend_from_slice(scales);
        if matrix.format.has_min() {
            matrix.mins.push(block.min);
        }
        self.blocks += 1;
    }

    fn finish(&mut self, matrix: &mut Matrix) {
        matrix.quants.append(&mut self.fifth_bits);
        if matrix.format.has_min() {
            let mins = &mut matrix.mins;
            mins.resize(mins.len() + padded(self.blocks) - self.blocks, 0.0);
        }
        self.blocks = 0;
    }
}

/// Element `e` of block `b` of a row's quants (`blocks` blocks), as the integer it
/// stands for. Q4_1 and Q5_1 keep 16 bytes of nibbles per block, elements 0..16 in the
/// low nibbles and 16..32 in the high ones (GGML's order); Q5_1 rows then hold each
/// block's fifth bits as a little-endian u32 (bit `e` for element `e`), all after the
/// row's nibbles, so two blocks' bits are one u64 for AVX-512. Q8_0 and Q6_K: one
/// signed byte per element.
#[inline]
pub(crate) fn quant_of(format: Format, quants: &[u8], blocks: usize, b: usize, e: usize) -> i32 {
    match format {
        Format::Q4_1 => i32::from(nibble(&quants[b * 16..], e)),
        Format::Q5_1 => {
            let at = blocks * 16 + b * 4;
            let bits =
                u32::from_le_bytes([quants[at], quants[at + 1], quants[at + 2], quants[at + 3]]);
            i32::from(nibble(&quants[b * 16..], e)) | (((bits >> e) & 1) as i32) << 4
        }
        Format::Q8_0 | Format::Q6_K => i32::from(quants[b * BLOCK + e] as i8),
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

    /// A random matrix in the kernels' `format` with plausible scales, built block by
    /// block (so any block count, odd ones too, in every format).
    pub(crate) fn random_matrix(format: Format, rows: usize, cols: usize, seed: u64) -> Matrix {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let per_row = cols / BLOCK;
        let mut matrix = Matrix {
            format,
            rows,
            cols,
            quants: Vec::new(),
            scales: Vec::new(),
            mins: Vec::new(),
        };
        let mut builder = RowBuilder::default();
        for _ in 0..rows {
            for _ in 0..per_row {
                let range = format.quant_range();
                let d = rng.random_range(0.001f32..0.05);
                let block = KernelBlock {
                    quants: std::array::from_fn(|_| rng.random_range(range.clone()) as u8),
                    scales: [d, d * rng.random_range(0.5f32..2.0)],
                    min: if format.has_min() {
                        rng.random_range(-0.4f32..0.0)
                    } else {
                        0.0
                    },
                };
                builder.push(&mut matrix, block);
            }
            builder.finish(&mut matrix);
        }
        matrix
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
    use crate::blocks::tests::{llama_cpp_dequantize, random_block};
    use crate::blocks::SUPER_BLOCK;

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
    fn matrices_of_every_block_type_dequantize_to_llama_cpps_values() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let (rows, cols) = (3, 2 * SUPER_BLOCK);
        for block_type in BlockType::ALL {
            let raws: Vec<Vec<u8>> = (0..rows * cols / block_type.elements())
                .map(|_| random_block(block_type, &mut rng))
                .collect();
            let matrix =
                Matrix::new("test", block_type, rows, cols, raws.concat()).expect("well-formed");
            assert_eq!(matrix.format, block_type.kernel_format());
            let want: Vec<f32> = raws
                .iter()
                .flat_map(|raw| llama_cpp_dequantize(block_type, raw))
                .collect();
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                matrix.dequantize_row(r, &mut row);
                for (e, (got, want)) in row.iter().zip(&want[r * cols..]).enumerate() {
                    assert!(
                        got == want,
                        "{block_type:?} row {r} element {e}: {got} vs {want}"
                    );
                }
            }
        }
        let err = Matrix::new("blk.0.ffn_down.weight", BlockType::Q6_K, 2, 576, vec![])
            .expect_err("576 is not a multiple of 256");
        assert!(
            err.to_string().contains("multiple of 256 (Q6_K blocks)"),
            "{err}"
        );
    }

    #[test]
    fn malformed_matrices_are_rejected_with_the_reason() {
        let err = Matrix::new("blk.0.attn_q.weight", BlockType::Q4_1, 2, 33, vec![0; 40])
            .expect_err("33 is not a multiple of 32");
        assert!(err.to_string().contains("multiple of 32"), "{err}");
        let err = Matrix::new("blk.0.attn_q.weight", BlockType::Q4_1, 2, 32, vec![0; 39])
            .expect_err("short data");
        assert!(err.to_string().contains("expected 40"), "{err}");
    }
}
