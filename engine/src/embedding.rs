//! Token embeddings read row by row from the file's (quantized) table on the CPU: a
//! prompt's rows are dequantized, not the whole table (Llama 3's 128k × 4096 would be
//! 2 GB of f32 on the device for a few hundred rows a step).

use std::sync::Arc;

use candle_core::quantized::{ggml_file, GgmlDType, QTensor};
use candle_core::{Device, Result};

pub(crate) struct EmbeddingRows {
    table: Arc<QTensor>,
    row_bytes: usize,
    width: usize,
}

impl EmbeddingRows {
    /// `table` (vocabulary × `width`, on the CPU).
    pub(crate) fn new(table: QTensor, width: usize) -> Result<Self> {
        let dtype: GgmlDType = table.dtype();
        if width == 0 || !width.is_multiple_of(dtype.block_size()) {
            candle_core::bail!(
                "token_embd.weight: rows of {width} do not split into {dtype:?} blocks"
            );
        }
        Ok(Self {
            row_bytes: width / dtype.block_size() * dtype.type_size(),
            table: Arc::new(table),
            width,
        })
    }

    /// The table itself (a tied output head reads it).
    pub(crate) fn table(&self) -> &Arc<QTensor> {
        &self.table
    }

    /// Rows in the table.
    pub(crate) fn vocab(&self) -> usize {
        self.table.shape().dims().first().copied().unwrap_or(0)
    }

    /// The embeddings of `tokens`, row after row (`tokens.len() × width` floats).
    pub(crate) fn rows(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let data = self.table.data()?;
        let dtype = self.table.dtype();
        let mut rows = Vec::with_capacity(tokens.len() * self.width);
        for &token in tokens {
            let start = token as usize * self.row_bytes;
            let bytes = data.get(start..start + self.row_bytes).ok_or_else(|| {
                candle_core::Error::Msg(format!("token id {token} has no embedding row"))
            })?;
            let row = ggml_file::qtensor_from_ggml(dtype, bytes, vec![self.width], &Device::Cpu)?
                .dequantize(&Device::Cpu)?
                .to_vec1::<f32>()?;
            rows.extend(row);
        }
        Ok(rows)
    }
}
