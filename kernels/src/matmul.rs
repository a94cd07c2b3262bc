//! Quantized weights × quantized activations, parallel over output features.
//!
//! Each output element is one dot of a weight row with an activation row in the
//! reference arithmetic ([`crate::dot`]), so the result does not depend on how many
//! activation rows come together, on how the row groups are split among threads, or
//! on the thread count.

use rayon::prelude::*;

use crate::dot::Isa;
use crate::quant::{Matrix, QuantizedRows, GROUP};

/// `out[r * weights.rows + c] = weights[c] · activations[r]`.
pub fn matmul(isa: Isa, weights: &Matrix, activations: &QuantizedRows, out: &mut [f32]) {
    let batch = activations.rows();
    let features = weights.rows;
    assert_eq!(activations.cols, weights.cols, "inner dimensions differ");
    assert_eq!(out.len(), batch * features, "output has the wrong size");
    let threads = rayon::current_num_threads();
    if threads <= 1 {
        // One thread: one piece, every row written in place (no buffers to fill and copy).
        groups(isa, weights, activations, 0, out, features);
        return;
    }
    // Enough pieces to balance the pool, each big enough to amortise scheduling.
    let pieces = threads * 4;
    let groups_per_piece = weights.groups().div_ceil(pieces).max(1);
    let per_piece = groups_per_piece * GROUP;
    if batch == 1 {
        // One row (decoding): each piece's outputs are a slice of `out` already, so the
        // pieces write in place.
        out.par_chunks_mut(per_piece)
            .enumerate()
            .for_each(|(piece, values)| {
                let stride = values.len();
                groups(
                    isa,
                    weights,
                    activations,
                    piece * groups_per_piece,
                    values,
                    stride,
                );
            });
        return;
    }
    let computed: Vec<(usize, Vec<f32>)> = (0..features.div_ceil(per_piece))
        .into_par_iter()
        .map(|piece| {
            let first = piece * per_piece;
            let width = per_piece.min(features - first);
            let mut values = vec![0f32; width * batch];
            groups(
                isa,
                weights,
                activations,
                piece * groups_per_piece,
                &mut values,
                width,
            );
            (first, values)
        })
        .collect();
    // Into rows, one output row per task: each piece's run of a row is contiguous.
    out.par_chunks_mut(features)
        .enumerate()
        .for_each(|(r, row)| {
            for (first, values) in &computed {
                let width = values.len() / batch;
                row[*first..*first + width].copy_from_slice(&values[r * width..][..width]);
            }
        });
}

/// Fills `values` (`values[r * stride + c - 16·first_group]`, `stride` wide) for the
/// groups from `first_group` whose rows it covers.
fn groups(
    isa: Isa,
    weights: &Matrix,
    activations: &QuantizedRows,
    first_group: usize,
    values: &mut [f32],
    stride: usize,
) {
    let batch = activations.rows();
    // Activation rows in spans that stay in L1/L2 while the piece's groups pass.
    for start in (0..batch).step_by(ROW_SPAN) {
        let span = start..(start + ROW_SPAN).min(batch);
        for local in 0..stride.div_ceil(GROUP) {
            let column = local * GROUP;
            let lanes = GROUP.min(stride - column);
            isa.dot_group(
                weights.format,
                weights.group(first_group + local),
                activations,
                span.clone(),
                &mut values[column..],
                (stride, lanes),
            );
        }
    }
}

/// Activation rows per span: 64 rows of 576 i8 quants are 36 KiB, inside a 48 KiB L1.
const ROW_SPAN: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{quantize_rows, Format};

    fn random_matrix(format: Format, rows: usize, cols: usize, seed: u64) -> Matrix {
        crate::quant::tests_support::random_matrix(format, rows, cols, seed)
    }

    #[test]
    fn a_batch_gives_the_same_bits_as_rows_one_at_a_time_on_any_pool() {
        for format in Format::ALL {
            batch_equals_singles(format);
        }
    }

    /// Decoding's one-row matmuls (each piece writing its outputs in place, four rows
    /// a tile and leftovers one by one) give every ISA the scalar reference's bits, and
    /// the batch path's too.
    #[test]
    fn one_row_matmuls_give_the_reference_bits_on_every_isa() {
        let values = crate::quant::tests_support::random_values(576, 4);
        let row = quantize_rows(&values, 576);
        let two = quantize_rows(&[values.clone(), values].concat(), 576);
        for format in Format::ALL {
            // 203 rows: several pieces, with leftovers past the last four.
            let weights = random_matrix(format, 203, 576, 3);
            let mut reference = vec![0f32; 203];
            matmul(Isa::SCALAR, &weights, &row, &mut reference);
            for isa in Isa::available() {
                let mut out = vec![0f32; 203];
                matmul(isa, &weights, &row, &mut out);
                let mut batch = vec![0f32; 2 * 203];
                matmul(isa, &weights, &two, &mut batch);
                for (what, got) in [("one row", &out[..]), ("batch", &batch[203..])] {
                    let same = got
                        .iter()
                        .zip(&reference)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{format:?}, {what}, on {}", isa.name());
                }
            }
        }
    }

    fn batch_equals_singles(format: Format) {
        let weights = random_matrix(format, 203, 576, 1);
        let values = crate::quant::tests_support::random_values(7 * 576, 2);
        let batch = quantize_rows(&values, 576);
        // One thread writes every row in place; several fill pieces and copy them.
        for threads in [1, 3] {
            let mut together = vec![0f32; 7 * 203];
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            pool.install(|| matmul(Isa::detect(), &weights, &batch, &mut together));
            same_as_singles(&weights, &values, &together, threads);
        }
    }

    fn same_as_singles(weights: &Matrix, values: &[f32], together: &[f32], threads: usize) {
        for r in 0..7 {
            let single = quantize_rows(&values[r * 576..(r + 1) * 576], 576);
            let mut alone = vec![0f32; 203];
            matmul(Isa::SCALAR, weights, &single, &mut alone);
            let row = &together[r * 203..(r + 1) * 203];
            let same = row
                .iter()
                .zip(&alone)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "row {r} differs between batch ({threads} threads) and single"
            );
        }
    }
}
