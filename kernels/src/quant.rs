//! Weight matrices in the kernels' layouts, and activation quantization.
//!
//! Activations are quantized per block of 32 to i8 with an f32 scale (and the scaled
//! sum a minimum multiplies), as llama.cpp does, but keeping the scale in f32.
//!
//! The dot products themselves, and the arithmetic they fix, are in [`crate::dot`].

#![allow(unsafe_code)] // the AVX2 quantization, called after detection.

pub use crate::blocks::{Format, BLOCK};

use half::f16;

use crate::arena::Bytes;
use crate::blocks::{self, BlockType, KernelBlock};
use crate::KernelError;

#[cfg(target_arch = "x86_64")]
mod avx2;
mod scales;

pub use scales::Scales;
use scales::{Factoring, Store};

/// Rows per group: a matrix keeps its rows in groups of 16, interleaved so that one
/// 64-byte load holds four consecutive weights of each of the 16 rows — the operand
/// of one `vpdpbusd`, which sums those four products into one lane per row. A
/// matrix whose row count is not a multiple of 16 is padded with zero rows.
pub const GROUP: usize = 16;

/// A quantized weight matrix in row groups ([`GROUP`]), group after group, each group
/// its blocks in order: per block [`Format::group_block_bytes`] of quants, the
/// scales (`scales_per_block × 16`, sub-block major) and, for formats with
/// minimums, 16 minimums — kept as f16 where every one of the matrix's is an f16 value
/// (Q4_1, Q5_1, Q8_0 files store them so: 17% fewer bytes for decoding to stream), as a
/// K-quant file makes them (an i8 factor each, times its row's super-block unit:
/// `blocks::Factors`) where every block says so, else as f32. Widening an f16 and
/// `unit × factor` are exact, so the kernels' bits do not depend on which.
///
/// Within a group's block, element `e = 4k + i` (chunk `k` of eight) of row `r` is
/// byte `64k + 4r + i` (Q8_0, Q6_K: the quant plus [`Format::offset`]), or for the
/// nibble formats the low nibble of byte `64k + 4r + i` (`k < 4`) or the high nibble
/// of byte `64(k − 4) + 4r + i`; Q5_1's fifth bits follow as eight little-endian u64,
/// chunk `k`'s bit `4r + i`.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    quants: Bytes,
    scales: Store,
    mins: Store,
}

/// One row group's quants, scales and minimums (none without minimums).
#[derive(Clone, Copy)]
pub struct Group<'a> {
    pub quants: &'a [u8],
    pub scales: Scales<'a>,
    pub mins: Scales<'a>,
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
        Self::from_bytes(name, block_type, rows, cols, &data)
    }

    /// [`Matrix::new`] from borrowed bytes (a range of a mapped file, say).
    pub fn from_bytes(
        name: &str,
        block_type: BlockType,
        rows: usize,
        cols: usize,
        data: &[u8],
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
        let row_bytes = cols / per_block * block_type.bytes();
        Ok(Self::from_rows(
            block_type.kernel_format(),
            rows,
            cols,
            |row, blocks| {
                for raw in data[row * row_bytes..][..row_bytes].chunks_exact(block_type.bytes()) {
                    blocks::decode(block_type, raw, &mut |block| blocks.push(block));
                }
            },
        ))
    }

    /// Builds a matrix from each row's kernel blocks (`row_blocks(row, &mut out)`
    /// appends row `row`'s `cols / 32` blocks), its row groups in parallel (on rayon's
    /// global pool: loading a model repacks every weight; each group writes its own
    /// slices, so the bytes do not depend on the order).
    pub(crate) fn from_rows(
        format: Format,
        rows: usize,
        cols: usize,
        row_blocks: impl Fn(usize, &mut Vec<KernelBlock>) + Sync,
    ) -> Self {
        use rayon::prelude::*;
        let blocks = cols / BLOCK;
        let groups = rows.div_ceil(GROUP);
        let (quant_bytes, scale_values) = (
            blocks * format.group_block_bytes(),
            blocks * GROUP * format.scales_per_block(),
        );
        let mut quants = vec![0; groups * quant_bytes];
        let mut scales = vec![0.0; groups * scale_values];
        // Every format gets minimums while building (zero where it has none): one shape
        // of parallel loop; those without are dropped below.
        let mut mins = vec![0.0; groups * blocks * GROUP];
        let factored: Vec<Option<(Store, Store)>> = quants
            .par_chunks_mut(quant_bytes.max(1))
            .zip(scales.par_chunks_mut(scale_values.max(1)))
            .zip(mins.par_chunks_mut((blocks * GROUP).max(1)))
            .enumerate()
            .map(|(g, ((quants, scales), mins))| {
                let mut factoring = Factoring::new(format, 1, blocks);
                let mut row = Vec::with_capacity(blocks);
                let real = GROUP.min(rows - g * GROUP);
                // Padding rows keep zero scales and minimums (0 × 0 where factored);
                // their quants stand for zero.
                let zero = KernelBlock {
                    factors: Some(blocks::Factors::default()),
                    ..KernelBlock::default()
                };
                for r in 0..GROUP {
                    row.clear();
                    if r < real {
                        row_blocks(g * GROUP + r, &mut row);
                        debug_assert_eq!(row.len(), blocks);
                    } else {
                        row.resize(blocks, zero);
                    }
                    for (b, block) in row.iter().enumerate() {
                        factoring.put(b, r, block);
                        put(format, b, r, block, quants, scales, mins);
                    }
                }
                factoring.finish()
            })
            .collect();
        if !format.has_min() {
            mins = Vec::new();
        }
        let (scales, mins) = match Factoring::join(factored, format) {
            Some(factored) => factored,
            None => match (Store::compact(&scales), Store::compact(&mins)) {
                (Some(scales), Some(mins)) => (Store::F16(scales), Store::F16(mins)),
                _ => (Store::F32(scales), Store::F32(mins)),
            },
        };
        Self {
            format,
            rows,
            cols,
            quants: Bytes::Owned(quants),
            scales,
            mins,
        }
    }

    /// The packed quants' storage, for moving a model's matrices into one mapping.
    pub(crate) fn quant_bytes(&mut self) -> &mut Bytes {
        &mut self.quants
    }

    /// Row groups: `rows / 16`, rounded up.
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    /// Row group `g`'s quants, scales and minimums, block after block.
    pub fn group(&self, g: usize) -> Group<'_> {
        let blocks = self.cols / BLOCK;
        let format = self.format;
        let per = |unit: usize, all: Scales<'_>| -> std::ops::Range<usize> {
            if all.is_empty() {
                0..0
            } else {
                g * blocks * unit..(g + 1) * blocks * unit
            }
        };
        Group {
            quants: &self.quants[g * blocks * format.group_block_bytes()..]
                [..blocks * format.group_block_bytes()],
            scales: self
                .scales
                .all()
                .slice(per(GROUP * format.scales_per_block(), self.scales.all())),
            mins: self.mins.all().slice(per(GROUP, self.mins.all())),
        }
    }

    /// Row `row`'s block `b` as the kernel block it was built from.
    fn block(&self, row: usize, b: usize) -> KernelBlock {
        let (g, r) = (row / GROUP, row % GROUP);
        let blocks = self.cols / BLOCK;
        let at = g * blocks + b;
        let format = self.format;
        let bytes = &self.quants[at * format.group_block_bytes()..][..format.group_block_bytes()];
        let subs = format.scales_per_block();
        let scale = |s: usize| {
            self.scales
                .all()
                .get((at * subs + s.min(subs - 1)) * GROUP + r)
        };
        let min_at = at * GROUP + r;
        let factors = match (&self.scales, &self.mins) {
            (
                Store::Factored {
                    units,
                    factors,
                    span,
                },
                Store::Factored {
                    units: min_units,
                    factors: min_factors,
                    span: min_span,
                },
            ) => {
                let slot = |s: usize| (at * subs + s.min(subs - 1)) * GROUP + r;
                let has_min = format.has_min();
                // Units are widened f16 values: narrowing gives the bits back.
                let bits = |unit: f32| f16::from_f32(unit).to_bits();
                Some(blocks::Factors {
                    scale_unit: bits(units[Scales::unit_index(slot(0), *span)]),
                    scale: [factors[slot(0)], factors[slot(1)]],
                    min_unit: if has_min {
                        bits(min_units[Scales::unit_index(min_at, *min_span)])
                    } else {
                        0
                    },
                    min: if has_min { min_factors[min_at] } else { 0 },
                })
            }
            _ => None,
        };
        KernelBlock {
            quants: std::array::from_fn(|e| quant_of(format, bytes, r, e) as u8),
            scales: [scale(0), scale(1)],
            min: if format.has_min() {
                self.mins.all().get(min_at)
            } else {
                0.0
            },
            factors,
        }
    }

    /// Writes row `row` as f32 into `out` (`cols` long).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        for (b, chunk) in out.chunks_exact_mut(BLOCK).enumerate() {
            let block = self.block(row, b);
            for (e, value) in chunk.iter_mut().enumerate() {
                let quant = self.format.quant_value(block.quants[e]);
                let scale = block.scales[e / 16];
                *value = if self.format.has_min() {
                    scale * quant + block.min
                } else {
                    scale * quant
                };
            }
        }
    }

    /// The matrix whose row `i` is this one's row `order[i]` (`order` a permutation of
    /// the rows: the loader reorders qwen2's q/k rows).
    pub fn with_rows_from(&self, order: &[usize]) -> Matrix {
        debug_assert_eq!(order.len(), self.rows);
        Matrix::from_rows(self.format, self.rows, self.cols, |row, out| {
            out.extend((0..self.cols / BLOCK).map(|b| self.block(order[row], b)));
        })
    }

    /// The same matrix keeping its scales and minimums as f32.
    #[cfg(test)]
    pub(crate) fn with_f32_scales(mut self) -> Matrix {
        let widen = |store: &Store| {
            let all = store.all();
            Store::F32((0..all.len()).map(|i| all.get(i)).collect())
        };
        (self.scales, self.mins) = (widen(&self.scales), widen(&self.mins));
        self
    }

    /// Bytes the matrix holds in memory.
    pub fn memory_bytes(&self) -> usize {
        self.quants.len() + self.scales.all().bytes() + self.mins.all().bytes()
    }
}

/// Stores `block` as row `r` of group block `at` (`group · blocks + block`) of a
/// matrix being built: its quants into `quants`, its scales and minimum as f32.
fn put(
    format: Format,
    at: usize,
    r: usize,
    block: &KernelBlock,
    quants: &mut [u8],
    scales: &mut [f32],
    mins: &mut [f32],
) {
    let bytes = &mut quants[at * format.group_block_bytes()..][..format.group_block_bytes()];
    match format {
        // Each nibble byte is this row's alone (element k·4+i low, (k+4)·4+i high), so it
        // is stored whole, never read first: a read of the fresh zeroed buffer maps the
        // shared zero page and the store after it copies the page and flushes every
        // core's TLB — two thirds of the kernel time loading an 8B file took.
        Format::Q4_1 | Format::Q5_1 => {
            for k in 0..4 {
                for i in 0..4 {
                    let (low, high) = (block.quants[4 * k + i], block.quants[4 * (k + 4) + i]);
                    bytes[64 * k + 4 * r + i] = (low & 0x0F) | (high << 4);
                }
            }
            if format == Format::Q5_1 {
                for (e, &q) in block.quants.iter().enumerate() {
                    let (k, lane) = (e / 4, 4 * r + e % 4);
                    if q & 0x10 != 0 {
                        bytes[256 + 8 * k + lane / 8] |= 1 << (lane % 8);
                    }
                }
            }
        }
        Format::Q8_0 | Format::Q6_K => {
            for (e, &q) in block.quants.iter().enumerate() {
                let (k, i) = (e / 4, e % 4);
                bytes[64 * k + 4 * r + i] = (i32::from(q as i8) + format.offset()) as u8;
            }
        }
    }
    let subs = format.scales_per_block();
    for s in 0..subs {
        scales[(at * subs + s) * GROUP + r] = block.scales[s];
    }
    if format.has_min() {
        mins[at * GROUP + r] = block.min;
    }
}

/// Element `e` of row `r` in a group's block (`bytes`: its
/// [`Format::group_block_bytes`]), as the quant it stands for (offset removed; for the
/// signed formats returned as the two's-complement byte's value).
#[inline]
pub(crate) fn quant_of(format: Format, bytes: &[u8], r: usize, e: usize) -> i32 {
    let (k, i) = (e / 4, e % 4);
    let lane = 4 * r + i;
    match format {
        Format::Q4_1 | Format::Q5_1 => {
            let byte = bytes[64 * (k % 4) + lane];
            let nibble = i32::from(if k < 4 { byte & 0x0F } else { byte >> 4 });
            if format == Format::Q5_1 {
                nibble | i32::from((bytes[256 + 8 * k + lane / 8] >> (lane % 8)) & 1) << 4
            } else {
                nibble
            }
        }
        Format::Q8_0 | Format::Q6_K => i32::from(bytes[64 * k + lane]) - format.offset(),
    }
}

/// Rows of activations quantized per block of 32.
#[derive(Clone, Debug, Default)]
pub struct QuantizedRows {
    pub cols: usize,
    pub quants: Vec<i8>,
    pub scales: Vec<f32>,
    /// `scale · Σ quants` per block: what a minimum multiplies.
    pub sums: Vec<f32>,
    /// `Σ quants` per 16 elements (two per block): what a stored offset multiplies.
    pub half_sums: Vec<i32>,
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

/// Quantizes `values` (rows of `cols`, a multiple of 32) block by block: per block the
/// scale `max|v| / 127`, quants `round(v / scale)` and their sums. Where the CPU has
/// AVX2 a block runs as eight-lane vectors ([`avx2`]: the same operations, so the same
/// bits; `round` and the saturating cast were a libm call and a scalar clamp per value).
/// Blocks are independent, so many rows (a prefill) are quantized in pieces across the
/// current thread pool: the same bits, without one thread quantizing while the others
/// wait for the next matmul.
pub fn quantize_rows(values: &[f32], cols: usize) -> QuantizedRows {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU reported AVX2.
        return quantize_rows_with(values, cols, |b, q| unsafe { avx2::quantize_block(b, q) });
    }
    quantize_rows_with(values, cols, quantize_block)
}

/// [`quantize_rows`] with `block` quantizing each block into its quants, returning
/// its scale and the sums of its two halves.
#[inline(always)]
fn quantize_rows_with(
    values: &[f32],
    cols: usize,
    block: impl Fn(&[f32; BLOCK], &mut [i8; BLOCK]) -> (f32, [i32; 2]) + Sync,
) -> QuantizedRows {
    use rayon::prelude::*;
    assert!(cols.is_multiple_of(BLOCK) && values.len().is_multiple_of(cols));
    let blocks = values.len() / BLOCK;
    let mut out = QuantizedRows {
        cols,
        quants: vec![0; values.len()],
        scales: vec![0.0; blocks],
        sums: vec![0.0; blocks],
        half_sums: vec![0; 2 * blocks],
    };
    let (values, _) = values.as_chunks::<BLOCK>();
    let (quants, _) = out.quants.as_chunks_mut::<BLOCK>();
    let (half_sums, _) = out.half_sums.as_chunks_mut::<2>();
    if blocks <= QUANTIZE_PIECE {
        quantize_piece(
            &block,
            values,
            quants,
            &mut out.scales,
            &mut out.sums,
            half_sums,
        );
    } else {
        (
            values.par_chunks(QUANTIZE_PIECE),
            quants.par_chunks_mut(QUANTIZE_PIECE),
            out.scales.par_chunks_mut(QUANTIZE_PIECE),
            out.sums.par_chunks_mut(QUANTIZE_PIECE),
            half_sums.par_chunks_mut(QUANTIZE_PIECE),
        )
            .into_par_iter()
            .for_each(|(values, quants, scales, sums, half_sums)| {
                quantize_piece(&block, values, quants, scales, sums, half_sums)
            });
    }
    out
}

/// Quantizes the blocks `values` (a piece of [`quantize_rows_with`]'s) into their
/// quants, scales, sums and half sums (each slice one entry per block).
#[inline(always)]
fn quantize_piece(
    block: &impl Fn(&[f32; BLOCK], &mut [i8; BLOCK]) -> (f32, [i32; 2]),
    values: &[[f32; BLOCK]],
    quants: &mut [[i8; BLOCK]],
    scales: &mut [f32],
    sums: &mut [f32],
    half_sums: &mut [[i32; 2]],
) {
    for (b, values) in values.iter().enumerate() {
        let (scale, halves) = block(values, &mut quants[b]);
        scales[b] = scale;
        sums[b] = scale * (halves[0] + halves[1]) as f32;
        half_sums[b] = halves;
    }
}

/// Blocks per piece when quantizing in parallel (4,096 values: a decoded row or two
/// stays on the calling thread).
const QUANTIZE_PIECE: usize = 128;

/// One block, the reference: the maximum magnitude in eight lanes, then across them
/// (`max` of magnitudes is exact in any order), quants rounded half away from zero and
/// cast saturating (NaN to 0).
fn quantize_block(block: &[f32; BLOCK], quants: &mut [i8; BLOCK]) -> (f32, [i32; 2]) {
    let mut lanes = [0f32; 8];
    for chunk in block.chunks_exact(8) {
        for (lane, v) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(v.abs());
        }
    }
    let amax = lanes.iter().fold(0f32, |m, &v| m.max(v));
    let scale = amax / 127.0;
    let inverse = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    for (q, &v) in quants.iter_mut().zip(block) {
        *q = (v * inverse).round() as i8;
    }
    let sum = |half: &[i8]| half.iter().map(|&q| i32::from(q)).sum::<i32>();
    (scale, [sum(&quants[..16]), sum(&quants[16..])])
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
pub(crate) mod tests_support;

#[cfg(test)]
mod tests {
    use super::tests_support::random_values;
    use super::*;
    use crate::blocks::tests::{llama_cpp_dequantize, random_block};
    use crate::blocks::SUPER_BLOCK;

    /// The AVX2 build of the quantization gives the portable build's bits, halves of
    /// a step included (where `round` goes away from zero), and the sums it keeps.
    #[test]
    fn many_rows_quantized_in_parallel_pieces_equal_each_row_alone() {
        // 67 rows of 96: 201 blocks, past one piece and not a multiple of it.
        let values = random_values(67 * 96, 3);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let together = pool.install(|| quantize_rows(&values, 96));
            for (r, row) in values.chunks_exact(96).enumerate() {
                let alone = quantize_rows(row, 96);
                let blocks = r * 3..(r + 1) * 3;
                assert_eq!(
                    &together.quants[r * 96..][..96],
                    &alone.quants[..],
                    "row {r}"
                );
                assert_eq!(bits(&together.scales[blocks.clone()]), bits(&alone.scales));
                assert_eq!(bits(&together.sums[blocks.clone()]), bits(&alone.sums));
                assert_eq!(&together.half_sums[2 * r * 3..][..6], &alone.half_sums[..]);
            }
        }
    }

    #[test]
    fn every_build_of_the_quantization_gives_the_same_bits() {
        let mut values = random_values(32 * 40, 9);
        // A block whose scale is 1 (maximum 127) and whose other values are halves.
        values[..32].copy_from_slice(&std::array::from_fn::<f32, 32, _>(|i| {
            if i == 0 {
                127.0
            } else {
                i as f32 - 15.5
            }
        }));
        values[32..64].copy_from_slice(&[0.0; 32]);
        // Scale 1 again, with the values either side of every rounding edge, and blocks
        // holding a NaN and an infinity (their quants are 0, as `round() as i8` gives).
        let edges = [
            0.5,
            0.499_999_97,
            0.500_000_06,
            1.5,
            2.5,
            126.5,
            126.499_99,
            0.0,
        ];
        values[64..96].copy_from_slice(&std::array::from_fn::<f32, 32, _>(|i| match i {
            0 => 127.0,
            _ => edges[i % 8] * if i % 2 == 0 { 1.0 } else { -1.0 },
        }));
        values[100] = f32::NAN;
        values[140] = f32::INFINITY;
        let portable = quantize_rows_with(&values, 64, quantize_block);
        let dispatched = quantize_rows(&values, 64);
        assert_eq!(portable.quants, dispatched.quants);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&portable.scales), bits(&dispatched.scales));
        assert_eq!(bits(&portable.sums), bits(&dispatched.sums));
        assert_eq!(portable.half_sums, dispatched.half_sums);
        for (b, block) in values.chunks_exact(BLOCK).enumerate() {
            let q = &portable.quants[b * BLOCK..][..BLOCK];
            let halves = [&q[..16], &q[16..]].map(|h| h.iter().map(|&q| i32::from(q)).sum::<i32>());
            assert_eq!(&portable.half_sums[2 * b..][..2], &halves);
            let inverse = if portable.scales[b] != 0.0 {
                1.0 / portable.scales[b]
            } else {
                0.0
            };
            for (e, &v) in block.iter().enumerate() {
                assert_eq!(q[e], (v * inverse).round() as i8, "block {b} element {e}");
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
