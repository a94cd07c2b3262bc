//! Building a [`Llama`] from a file's tensors: shapes checked against the config,
//! NEOX rows put in the interleaved order, Gemma 3's extra norms read where the config
//! asks for them.

use std::sync::Arc;

use super::{
    rope_thetas, GemmaNorms, HeadNorms, Layer, Llama, LlamaConfig, QkvBias, RawFormat, RawTensor,
};
use crate::dot::Isa;
use crate::quant::Matrix;
use crate::KernelError;

/// A tensor by name from the file: `Ok(None)` when the file lacks it.
pub type Fetched = Result<Option<RawTensor>, KernelError>;

fn vector(name: &str, raw: RawTensor, len: usize) -> Result<Vec<f32>, KernelError> {
    let values: Vec<f32> = match raw.format {
        RawFormat::F32 => raw
            .bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        RawFormat::F16 => raw
            .bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(KernelError::UnsupportedFormat {
                name: name.to_owned(),
                format: format!("{other:?}"),
            })
        }
    };
    if values.len() != len {
        return Err(KernelError::BadTensor {
            name: name.to_owned(),
            problem: format!("{} values, expected {len}", values.len()),
        });
    }
    Ok(values)
}

fn matrix(name: &str, raw: RawTensor, rows: usize, cols: usize) -> Result<Matrix, KernelError> {
    let RawFormat::Quantized(block_type) = raw.format else {
        return Err(KernelError::UnsupportedFormat {
            name: name.to_owned(),
            format: format!("{:?}", raw.format),
        });
    };
    if raw.dims != [rows, cols] {
        return Err(KernelError::BadTensor {
            name: name.to_owned(),
            problem: format!("shape {:?}, expected [{rows}, {cols}]", raw.dims),
        });
    }
    Matrix::from_bytes(name, block_type, rows, cols, &raw.bytes)
}

/// The file's tensors by name, for one model.
struct Tensors<F> {
    fetch: F,
}

impl<F: FnMut(&str) -> Fetched> Tensors<F> {
    fn optional(&mut self, name: &str) -> Fetched {
        (self.fetch)(name)
    }

    fn required(&mut self, name: &str) -> Result<RawTensor, KernelError> {
        (self.fetch)(name)?.ok_or_else(|| KernelError::BadTensor {
            name: name.to_owned(),
            problem: "missing from the file".into(),
        })
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix, KernelError> {
        matrix(name, self.required(name)?, rows, cols)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, KernelError> {
        vector(name, self.required(name)?, len)
    }

    fn optional_vector(&mut self, name: &str, len: usize) -> Result<Option<Vec<f32>>, KernelError> {
        self.optional(name)?
            .map(|raw| vector(name, raw, len))
            .transpose()
    }
}

impl Llama {
    /// Builds the model from `tensor(name)` (`Ok(None)` when the file lacks it).
    /// `threads` sizes the pool every forward pass runs on.
    pub fn load(
        config: LlamaConfig,
        threads: usize,
        tensor: impl FnMut(&str) -> Fetched,
    ) -> Result<Self, KernelError> {
        config.validate()?;
        let mut tensors = Tensors { fetch: tensor };
        let hidden = config.hidden;
        let raw_embeddings = tensors.required("token_embd.weight")?;
        let vocab = raw_embeddings.dims.first().copied().unwrap_or(0);
        let mut embeddings = matrix("token_embd.weight", raw_embeddings, vocab, hidden)?;
        let mut layers = (0..config.layers)
            .map(|i| load_layer(&config, &mut tensors, i))
            .collect::<Result<Vec<_>, _>>()?;
        let output_norm = tensors.vector("output_norm.weight", hidden)?;
        let rope_factors =
            tensors.optional_vector("rope_freqs.weight", config.rope_dimensions / 2)?;
        let mut rope_tables = vec![rope_thetas(
            config.rope_base,
            config.rope_dimensions,
            rope_factors.as_deref(),
            config.rope_scale,
        )];
        if let Some(gemma) = &config.gemma {
            rope_tables.push(rope_thetas(
                gemma.local_rope_base,
                config.rope_dimensions,
                None,
                1.0,
            ));
        }
        let mut output = match tensors.optional("output.weight")? {
            Some(raw) => Some(matrix("output.weight", raw, vocab, hidden)?),
            None => None,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("sharemesh-kernel-{i}"))
            .build()
            .map_err(|e| KernelError::ThreadPool(e.to_string()))?;
        into_huge_pages(&mut embeddings, &mut layers, output.as_mut());
        Ok(Self {
            cache: config.kv_pool(usize::MAX).new_sequence(),
            config,
            rope_tables,
            embeddings,
            layers,
            output_norm,
            output,
            isa: Isa::detect(),
            pool: Arc::new(pool),
        })
    }
}

/// Moves every matrix's quants, in the order decoding reads them, into one mapping
/// advised for huge pages ([`crate::arena`]); where that is refused they stay put.
fn into_huge_pages(embeddings: &mut Matrix, layers: &mut [Layer], output: Option<&mut Matrix>) {
    let mut buffers = Vec::new();
    for layer in layers.iter_mut() {
        let Layer {
            wq,
            wk,
            wv,
            wo,
            gate,
            up,
            down,
            ..
        } = layer;
        for matrix in [wq, wk, wv, wo, gate, up, down] {
            buffers.push(matrix.quant_bytes());
        }
    }
    if let Some(output) = output {
        buffers.push(output.quant_bytes());
    }
    buffers.push(embeddings.quant_bytes());
    crate::arena::pack(&mut buffers);
}

fn load_layer<F: FnMut(&str) -> Fetched>(
    config: &LlamaConfig,
    tensors: &mut Tensors<F>,
    i: usize,
) -> Result<Layer, KernelError> {
    let (hidden, ffn, head_dim) = (config.hidden, config.feed_forward, config.head_dim);
    let (q_width, kv_width) = (config.q_width(), config.kv_width());
    let weight = |part: &str| format!("blk.{i}.{part}.weight");
    let mut wq = tensors.matrix(&weight("attn_q"), q_width, hidden)?;
    let mut wk = tensors.matrix(&weight("attn_k"), kv_width, hidden)?;
    let wv = tensors.matrix(&weight("attn_v"), kv_width, hidden)?;
    let wo = tensors.matrix(&weight("attn_output"), hidden, q_width)?;
    let gate = tensors.matrix(&weight("ffn_gate"), ffn, hidden)?;
    let up = tensors.matrix(&weight("ffn_up"), ffn, hidden)?;
    let down = tensors.matrix(&weight("ffn_down"), hidden, ffn)?;
    let mut bias = load_bias(tensors, i, q_width, kv_width)?;
    let mut head_norms = match config.head_norms {
        true => Some(HeadNorms {
            q: tensors.vector(&weight("attn_q_norm"), head_dim)?,
            k: tensors.vector(&weight("attn_k_norm"), head_dim)?,
        }),
        false => None,
    };
    let gemma = match config.gemma {
        Some(_) => Some(GemmaNorms {
            post_attention: tensors.vector(&weight("post_attention_norm"), hidden)?,
            post_ffn: tensors.vector(&weight("post_ffw_norm"), hidden)?,
        }),
        None => None,
    };
    if config.neox_rope {
        let q_order = interleaved_order(config.heads, head_dim);
        let k_order = interleaved_order(config.kv_heads, head_dim);
        wq = wq.with_rows_from(&q_order);
        wk = wk.with_rows_from(&k_order);
        let reorder =
            |values: &[f32], order: &[usize]| order.iter().map(|&from| values[from]).collect();
        if let Some(bias) = bias.as_mut() {
            bias.q = reorder(&bias.q, &q_order);
            bias.k = reorder(&bias.k, &k_order);
        }
        if let Some(norms) = head_norms.as_mut() {
            // The per-head norms scale each element of a head: they move with the rows.
            let head_order = interleaved_order(1, head_dim);
            norms.q = reorder(&norms.q, &head_order);
            norms.k = reorder(&norms.k, &head_order);
        }
    }
    let global = config
        .gemma
        .is_none_or(|g| (i + 1).is_multiple_of(g.global_every));
    Ok(Layer {
        attention_norm: tensors.vector(&weight("attn_norm"), hidden)?,
        bias,
        wq,
        wk,
        wv,
        wo,
        ffn_norm: tensors.vector(&weight("ffn_norm"), hidden)?,
        gate,
        up,
        down,
        head_norms,
        gemma,
        window: config.gemma.filter(|_| !global).map(|g| g.sliding_window),
        rope_table: usize::from(!global),
    })
}

/// qwen2's q/k/v biases: none or all three (a file with some would otherwise run
/// without them).
fn load_bias<F: FnMut(&str) -> Fetched>(
    tensors: &mut Tensors<F>,
    i: usize,
    q_width: usize,
    kv_width: usize,
) -> Result<Option<QkvBias>, KernelError> {
    let mut b = |part: &str, len| tensors.optional_vector(&format!("blk.{i}.{part}.bias"), len);
    match (
        b("attn_q", q_width)?,
        b("attn_k", kv_width)?,
        b("attn_v", kv_width)?,
    ) {
        (None, None, None) => Ok(None),
        (Some(q), Some(k), Some(v)) => Ok(Some(QkvBias { q, k, v })),
        _ => Err(KernelError::BadTensor {
            name: format!("blk.{i}.attn_q/k/v.bias"),
            problem: "some of the q, k and v biases are missing".into(),
        }),
    }
}

/// For `heads` heads of `head_dim` rows in NEOX order (pair k: rows k and k + half),
/// the row each interleaved row (pair k: rows 2k and 2k + 1) comes from.
fn interleaved_order(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    (0..heads * head_dim)
        .map(|row| {
            let (head, within) = (row / head_dim, row % head_dim);
            head * head_dim + (within % 2) * half + within / 2
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::config;
    use super::*;
    use crate::blocks::BlockType;

    /// A tiny all-zero model's tensors (Q8_0 matrices, F32 vectors), with the q/k/v
    /// biases `biases` names.
    fn tiny_tensor(name: &str, biases: &[&str]) -> Fetched {
        let c = config();
        let kv = c.kv_width();
        let quantized = |rows: usize, cols: usize| RawTensor {
            format: RawFormat::Quantized(BlockType::Q8_0),
            dims: vec![rows, cols],
            bytes: vec![0; rows * cols / 32 * 34].into(),
        };
        let floats = |len: usize| RawTensor {
            format: RawFormat::F32,
            dims: vec![len],
            bytes: vec![0; len * 4].into(),
        };
        let part = name.split('.').nth(2).unwrap_or("");
        Ok(Some(match (name, part) {
            ("token_embd.weight", _) => quantized(32, c.hidden),
            ("output_norm.weight", _) | (_, "attn_norm" | "ffn_norm") => floats(c.hidden),
            (_, "attn_q" | "attn_output") if name.ends_with(".weight") => {
                quantized(c.hidden, c.hidden)
            }
            (_, "attn_k" | "attn_v") if name.ends_with(".weight") => quantized(kv, c.hidden),
            (_, "ffn_gate" | "ffn_up") => quantized(c.feed_forward, c.hidden),
            (_, "ffn_down") => quantized(c.hidden, c.feed_forward),
            (_, "attn_q") if biases.contains(&"q") => floats(c.hidden),
            (_, "attn_k") if biases.contains(&"k") => floats(kv),
            (_, "attn_v") if biases.contains(&"v") => floats(kv),
            _ => return Ok(None),
        }))
    }

    #[test]
    fn q_k_v_biases_come_all_three_or_not_at_all() {
        for (biases, loads) in [(&[][..], true), (&["q", "k", "v"][..], true)] {
            let model = Llama::load(config(), 1, |name| tiny_tensor(name, biases));
            assert_eq!(model.is_ok(), loads, "{biases:?}");
        }
        for biases in [&["q"][..], &["k", "v"][..], &["q", "v"][..]] {
            let Err(err) = Llama::load(config(), 1, |name| tiny_tensor(name, biases)) else {
                panic!("{biases:?} loaded");
            };
            assert!(err.to_string().contains("biases are missing"), "{err}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_model_run_in_background_lowers_every_pool_thread_and_still_runs() {
        use crate::priority::{this_thread_nice, BACKGROUND_NICE};
        let mut model = Llama::load(config(), 3, |name| tiny_tensor(name, &[])).unwrap();
        let before = model.forward(&[1, 2, 3], 0).unwrap();
        assert!(model
            .pool
            .broadcast(|_| this_thread_nice())
            .iter()
            .all(|&n| n < BACKGROUND_NICE));
        model.run_in_background().unwrap();
        let levels = model.pool.broadcast(|_| this_thread_nice());
        assert_eq!(levels, vec![BACKGROUND_NICE; 3]);
        // The caller's own thread is not lowered: only the model's pool is.
        assert!(this_thread_nice() < BACKGROUND_NICE);
        model.reset();
        assert_eq!(model.forward(&[1, 2, 3], 0).unwrap(), before);
    }

    #[test]
    fn qwen2_rows_go_back_to_interleaved_pairs() {
        // Head of 8: NEOX pairs (k, k + 4); interleaved pairs (2k, 2k + 1).
        let order = interleaved_order(2, 8);
        assert_eq!(order[..8], [0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(order[8..], [8, 12, 9, 13, 10, 14, 11, 15]);
    }
}
