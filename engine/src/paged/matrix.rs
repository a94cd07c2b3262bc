//! The paged graph's weight matrices: candle's quantized matmul (the llama family, as
//! llama.cpp multiplies: activations rounded to 8 bits per block), or weights
//! dequantized to f32 (a Gemma up to 4 GB in f32: Gemma 3 270M's logits moved by ~0.4
//! under 8-bit activations and flipped greedy choices; dequantized they equal a
//! float64 pass to ~1e-4).

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Module, Result, Tensor};
use sharemesh_kernels::dense;

use crate::embedding::EmbeddingRows;

pub(super) enum Matrix {
    Quantized(QMatMul),
    Dense(Tensor),
}

impl Matrix {
    /// `dense`: dequantized to f32 on `device`; otherwise quantized as stored.
    pub(super) fn new(tensor: QTensor, dense: bool, device: &Device) -> Result<Self> {
        match dense {
            true => Ok(Matrix::Dense(tensor.dequantize(device)?)),
            false => QMatMul::from_arc(std::sync::Arc::new(tensor)).map(Matrix::Quantized),
        }
    }

    /// `x`: (1, rows, in) → (1, rows, out).
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let weights = match self {
            Matrix::Quantized(matmul) => return matmul.forward(x),
            Matrix::Dense(weights) => weights,
        };
        let (batch, rows, inner) = x.dims3()?;
        if batch * rows == 1 {
            if let Some(y) = matrix_vector_on_cpu(weights, x)? {
                return Ok(y);
            }
        }
        let x = x.reshape((batch * rows, inner))?;
        x.matmul(&weights.t()?)?.reshape((batch, rows, ()))
    }
}

/// One row (decoding) on the CPU: each output is a dot product of a weight row with
/// `x`, streaming every weight once. candle's matmul repacked the whole transposed
/// matrix for each token instead (three quarters of Gemma's decoding time).
fn matrix_vector_on_cpu(weights: &Tensor, x: &Tensor) -> Result<Option<Tensor>> {
    if !weights.device().is_cpu() || !weights.is_contiguous() {
        return Ok(None);
    }
    let (features, inner) = weights.dims2()?;
    let input = x.flatten_all()?.to_vec1::<f32>()?;
    let (storage, layout) = weights.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Ok(None);
    };
    let values = &cpu.as_slice::<f32>()?[layout.start_offset()..][..features * inner];
    let mut out = vec![0f32; features];
    dense::matrix_vector_f32(values, &input, &mut out);
    Tensor::from_vec(out, (1, 1, features), &Device::Cpu).map(Some)
}

/// The output head: a matrix, or (dense models on the CPU) the tied Q8_0 embedding read
/// in place with f32 activations — a quarter of the bytes of f32 weights, no second copy.
pub(super) enum Head {
    Matrix(Matrix),
    TiedQ8_0,
}

impl Head {
    /// `x`: (rows, hidden) → logits (rows × vocab, row after row).
    pub(super) fn logits(&self, x: &Tensor, embedding: &EmbeddingRows) -> Result<Vec<f32>> {
        match self {
            Head::Matrix(matrix) => matrix
                .forward(&x.unsqueeze(0)?)?
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>(),
            Head::TiedQ8_0 => {
                let data = embedding.table().data()?;
                let vocab = embedding.vocab();
                let rows = x.to_vec2::<f32>()?;
                let mut logits = vec![0f32; rows.len() * vocab];
                for (row, out) in rows.iter().zip(logits.chunks_exact_mut(vocab)) {
                    dense::q8_0_matrix_vector(&data, row, out);
                }
                Ok(logits)
            }
        }
    }
}
