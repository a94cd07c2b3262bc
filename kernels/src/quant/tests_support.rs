//! Random matrices and values for the kernels' tests.

use super::scales::BLOCKS_PER_SUPER;
use super::*;
use rand::{Rng, SeedableRng};

/// A random matrix in the kernels' `format` with plausible scales, built block by
/// block (so any block count, odd ones too, in every format).
pub(crate) fn random_matrix(format: Format, rows: usize, cols: usize, seed: u64) -> Matrix {
    random_matrix_with(format, rows, cols, seed, |v| v)
}

/// [`random_matrix`] with every scale and minimum an f16 value, as a Q4_1, Q5_1 or
/// Q8_0 file's are: the matrix keeps them as f16.
pub(crate) fn random_f16_matrix(format: Format, rows: usize, cols: usize, seed: u64) -> Matrix {
    random_matrix_with(format, rows, cols, seed, |v| f16::from_f32(v).to_f32())
}

fn random_matrix_with(
    format: Format,
    rows: usize,
    cols: usize,
    seed: u64,
    round: impl Fn(f32) -> f32,
) -> Matrix {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut row_blocks = |out: &mut Vec<KernelBlock>| {
        for _ in 0..cols / BLOCK {
            let range = format.quant_range();
            let d = round(rng.random_range(0.001f32..0.05));
            out.push(KernelBlock {
                quants: std::array::from_fn(|_| rng.random_range(range.clone()) as u8),
                scales: [d, round(d * rng.random_range(0.5f32..2.0))],
                min: if format.has_min() {
                    round(rng.random_range(-0.4f32..0.0))
                } else {
                    0.0
                },
                factors: None,
            });
        }
    };
    let all = random_rows(rows, &mut row_blocks);
    Matrix::from_rows(format, rows, cols, |row, out| {
        out.extend_from_slice(&all[row])
    })
}

/// Each row's blocks, drawn in row order (the builder takes rows in parallel).
fn random_rows(
    rows: usize,
    row_blocks: &mut impl FnMut(&mut Vec<KernelBlock>),
) -> Vec<Vec<KernelBlock>> {
    (0..rows)
        .map(|_| {
            let mut row = Vec::new();
            row_blocks(&mut row);
            row
        })
        .collect()
}

/// A matrix as a K-quant file makes one: every scale and minimum an f16 unit per
/// row per super-block times a small integer, so the matrix keeps them factored.
pub(crate) fn random_factored_matrix(
    format: Format,
    rows: usize,
    cols: usize,
    seed: u64,
) -> Matrix {
    use crate::blocks::Factors;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let has_min = format.has_min();
    let mut row_blocks = |out: &mut Vec<KernelBlock>| {
        let mut units = (0u16, 0u16);
        for b in 0..cols / BLOCK {
            if b % BLOCKS_PER_SUPER == 0 {
                let half = |v: f32| f16::from_f32(v).to_bits();
                units = (
                    half(rng.random_range(0.0005f32..0.002)),
                    half(-rng.random_range(0.0005f32..0.002)),
                );
            }
            let range = format.quant_range();
            let first: i8 = rng.random_range(0..64);
            let scale = if format == Format::Q6_K {
                [rng.random_range(-128..=127), rng.random_range(-128..=127)]
            } else {
                [first, first]
            };
            let m: i8 = if has_min { rng.random_range(0..64) } else { 0 };
            let min_unit = if has_min { units.1 } else { 0 };
            out.push(KernelBlock {
                quants: std::array::from_fn(|_| rng.random_range(range.clone()) as u8),
                scales: scale.map(|f| Factors::value(units.0, f)),
                min: if has_min {
                    Factors::value(min_unit, m)
                } else {
                    0.0
                },
                factors: Some(Factors {
                    scale_unit: units.0,
                    scale,
                    min_unit,
                    min: m,
                }),
            });
        }
    };
    let all = random_rows(rows, &mut row_blocks);
    Matrix::from_rows(format, rows, cols, |row, out| {
        out.extend_from_slice(&all[row])
    })
}

pub(crate) fn random_values(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-3f32..3.0)).collect()
}
