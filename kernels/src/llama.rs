//! The llama-family forward pass on the quantized kernels, with a half-precision KV
//! cache ([`kv`]):
//! GGUF `llama` models (SmolLM2 and others), `qwen2` (llama with q/k/v biases and the
//! NEOX rotary layout) and `gemma3` (llama.cpp's graph: see [`Gemma`]).
//!
//! Batch invariant: every step is per row (norms, activation quantization, each matmul
//! element, rotary embedding, residuals) or per (row, head) with the attended positions
//! set by the row's absolute position, so prefilling tokens together gives the same
//! bits, logits and cache as feeding them one at a time.

use std::sync::Arc;

use crate::blocks::BlockType;
use crate::dot::Isa;
use crate::math;
use crate::ops::rms_norm;
use crate::quant::Matrix;
use crate::KernelError;

/// Hyper-parameters, from the GGUF's `llama.*` (or `qwen2.*`, `gemma3.*`) metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Rotary pairs are (i, i + half) within a head (qwen2's and Gemma's NEOX layout)
    /// rather than (2i, 2i + 1) (GGUF llama, whose converter interleaved the q/k rows).
    /// The loader puts NEOX q/k rows (and biases, and q/k norms) in the interleaved
    /// order, which rotates the same pairs and leaves every q·k product's terms as they
    /// were, only summed in another order.
    pub neox_rope: bool,
    pub hidden: usize,
    pub feed_forward: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// Width of one attention head: `hidden / heads` for llama and qwen2; Gemma 3's
    /// `attention.key_length` (256 for the 640-wide 270M).
    pub head_dim: usize,
    pub rope_dimensions: usize,
    /// The rotary base (Gemma 3: of its global layers).
    pub rope_base: f32,
    /// Linear rope scaling: every angle of the table `rope_base` makes is multiplied by
    /// this (`1 / rope.scaling.factor`, llama.cpp's `freq_scale`; Gemma 3's local layers
    /// are not scaled, as in llama.cpp); 1 without scaling.
    pub rope_scale: f32,
    pub norm_eps: f32,
    pub context: usize,
    /// Each query and key head is RMS-normed (`attn_q_norm`/`attn_k_norm`, head
    /// dimension long) before the rotation: Gemma 3 and Qwen 3.
    pub head_norms: bool,
    /// Gemma 3's graph instead of llama's (head norms included).
    pub gemma: Option<Gemma>,
}

/// What Gemma 3 does differently from llama (llama.cpp's `gemma3` graph): embeddings
/// scaled by √hidden; RMS norms of each head's query and key before the rotation; GELU
/// (tanh) where llama has SiLU; RMS norms of the attention's and the feed-forward's
/// output before each residual add; and all but every `global_every`-th layer see only
/// the last `sliding_window` positions, rotated with base `local_rope_base`. Its stored
/// norm weights already include Gemma's `+1`, so every norm is a plain RMS norm. Gemma 2
/// ([`Gemma::gemma2`]) has no head norms, one rotary base, and soft caps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemma {
    pub sliding_window: usize,
    pub global_every: usize,
    pub local_rope_base: f32,
    /// Gemma 2: attention scores soft-capped at this (`cap · tanh(score / cap)`)
    /// before the softmax.
    pub attn_softcap: Option<f32>,
    /// Gemma 2: the output logits soft-capped at this.
    pub final_softcap: Option<f32>,
}

impl Gemma {
    /// Gemma 3's layer pattern and local rotary base, which its GGUF leaves out
    /// (llama.cpp fixes them for the architecture too): every sixth layer is global,
    /// the others rotate with base 10 000. The engine's candle graph uses them too.
    pub const GEMMA3_GLOBAL_EVERY: usize = 6;
    pub const GEMMA3_LOCAL_ROPE_BASE: f32 = 10_000.0;

    /// Gemma 3 with the file's `attention.sliding_window`.
    pub fn gemma3(sliding_window: usize) -> Self {
        Gemma {
            sliding_window,
            global_every: Self::GEMMA3_GLOBAL_EVERY,
            local_rope_base: Self::GEMMA3_LOCAL_ROPE_BASE,
            attn_softcap: None,
            final_softcap: None,
        }
    }

    /// Gemma 2 (llama.cpp's `gemma2` graph): every other layer global (the odd ones),
    /// one rotary base for all, no head norms, and attention scores and output logits
    /// soft-capped at the file's `attn_logit_softcapping` and `final_logit_softcapping`.
    pub fn gemma2(
        sliding_window: usize,
        rope_base: f32,
        attn_softcap: Option<f32>,
        final_softcap: Option<f32>,
    ) -> Self {
        Gemma {
            sliding_window,
            global_every: 2,
            local_rope_base: rope_base,
            attn_softcap,
            final_softcap,
        }
    }
}

impl LlamaConfig {
    /// Width of all query heads together.
    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of one position's keys (or values): KV heads × head dimension.
    /// A pool of at most `blocks` KV blocks shaped for this model.
    pub fn kv_pool(&self, blocks: usize) -> KvPool {
        KvPool::new(self.layers, self.kv_heads, self.head_dim, blocks)
    }

    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Refuses a configuration the kernels cannot run (or whose sizes overflow);
    /// [`Llama::load`] asks first.
    pub fn validate(&self) -> Result<(), KernelError> {
        let bad = |m: &str| Err(KernelError::BadConfig(m.to_owned()));
        if self.heads == 0 || self.kv_heads == 0 || self.hidden == 0 {
            return bad("head counts and the embedding length must be positive");
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad("attention heads must be a multiple of the KV heads");
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("the head dimension must be positive and even");
        }
        if self.rope_dimensions != self.head_dim {
            return bad("rotary dimensions must equal the head dimension");
        }
        if self.context == 0 || self.layers == 0 {
            return bad("context length and block count must be positive");
        }
        if !(self.rope_scale.is_finite() && self.rope_scale > 0.0) {
            return bad("the rope scale must be a positive number");
        }
        if self
            .gemma
            .is_some_and(|g| g.sliding_window == 0 || g.global_every == 0)
        {
            return bad("the sliding window and the global layer period must be positive");
        }
        let cap_ok = |cap: Option<f32>| cap.is_none_or(|c| c.is_finite() && c > 0.0);
        if self
            .gemma
            .is_some_and(|g| !cap_ok(g.attn_softcap) || !cap_ok(g.final_softcap))
        {
            return bad("soft-capping values must be positive numbers");
        }
        // A file's numbers are claims: widths whose products overflow (a KV block holds
        // layers × 2 × 16 positions × the KV width) are refused, not wrapped.
        let block_floats = self
            .kv_heads
            .checked_mul(self.head_dim)
            .and_then(|kv| kv.checked_mul(self.layers))
            .and_then(|kv| kv.checked_mul(2 * kv::BLOCK_POSITIONS));
        if self.heads.checked_mul(self.head_dim).is_none() || block_floats.is_none() {
            return bad("head counts, head width and block count overflow when multiplied");
        }
        Ok(())
    }
}

/// Element type of a tensor as stored in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawFormat {
    F32,
    F16,
    Quantized(BlockType),
    Other(String),
}

/// A tensor's bytes as read from the file; `dims` outermost first (rows, then columns).
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub format: RawFormat,
    pub dims: Vec<usize>,
    pub bytes: TensorBytes,
}

/// A tensor's bytes as its file stores them: a buffer of its own, or a range of the
/// mapped file (loading repacks them, so they need not be copied out first).
#[derive(Clone)]
pub struct TensorBytes(Arc<dyn std::ops::Deref<Target = [u8]> + Send + Sync>);

impl TensorBytes {
    pub fn new(bytes: impl std::ops::Deref<Target = [u8]> + Send + Sync + 'static) -> Self {
        Self(Arc::new(bytes))
    }
}

impl std::fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.len())
    }
}

impl From<Vec<u8>> for TensorBytes {
    fn from(bytes: Vec<u8>) -> Self {
        Self::new(bytes)
    }
}

impl std::ops::Deref for TensorBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// qwen2's biases of the q, k and v projections.
struct QkvBias {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The RMS norms of each query and key head (head dimension long) before the rotation:
/// Gemma 3 and Qwen 3.
struct HeadNorms {
    q: Vec<f32>,
    k: Vec<f32>,
}

/// Gemma 3's norms of one layer's attention and feed-forward outputs.
struct GemmaNorms {
    post_attention: Vec<f32>,
    post_ffn: Vec<f32>,
}

struct Layer {
    attention_norm: Vec<f32>,
    bias: Option<QkvBias>,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    wo: Matrix,
    ffn_norm: Vec<f32>,
    gate: Matrix,
    up: Matrix,
    down: Matrix,
    head_norms: Option<HeadNorms>,
    gemma: Option<GemmaNorms>,
    /// `Some(w)`: each query sees only the last `w` positions (its own included).
    window: Option<usize>,
    /// Which of the model's rotary tables this layer uses (Gemma's local layers: 1).
    rope_table: usize,
}

mod batch;
mod kv;
mod load;

pub use batch::BatchEntry;
pub use kv::{BlockCopy, KvBlock, KvPool, SequenceCache, BLOCK_POSITIONS};
pub use load::Fetched;

pub struct Llama {
    config: LlamaConfig,
    /// Each rotary pair's angle per position ([`rope_thetas`]), per table: the global
    /// one first, then Gemma's local one.
    rope_tables: Vec<Vec<f32>>,
    embeddings: Matrix,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    /// `None`: the output projection is tied to the embeddings.
    output: Option<Matrix>,
    /// The sequence [`Self::forward`] continues (batched decoding brings its own).
    cache: SequenceCache,
    isa: Isa,
    pool: Arc<rayon::ThreadPool>,
}

impl Llama {
    /// Runs this model's forward passes at background priority from now on (every
    /// thread of its pool lowered, [`crate::priority`]): for work that must not slow a
    /// serving engine beside it, as a gateway's replays. The arithmetic is unchanged.
    pub fn run_in_background(&self) -> std::io::Result<()> {
        self.pool
            .broadcast(|_| crate::priority::lower_this_thread())
            .into_iter()
            .collect()
    }

    /// Adversary kit only (cargo feature `adversary`): drops the last `count` layers, so the model runs
    /// cheaper and answers worse under its honest name (a verifier must catch it).
    #[cfg(feature = "adversary")]
    pub fn drop_last_layers(&mut self, count: usize) -> Result<(), KernelError> {
        if count >= self.layers.len() {
            return Err(KernelError::BadConfig(format!(
                "cannot drop {count} of {} layers",
                self.layers.len()
            )));
        }
        self.reset();
        let keep = self.layers.len() - count;
        self.layers.truncate(keep);
        self.cache = self.new_sequence();
        Ok(())
    }

    /// Bytes of weights one decoded token streams from memory: every layer's matrices
    /// and the output head (one embedding row besides, which is noise). With the
    /// tokens per second this is the decode's weight bandwidth, to hold against what
    /// the machine's memory gives.
    pub fn decode_weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down])
            .map(Matrix::memory_bytes)
            .sum();
        layers
            + self
                .output
                .as_ref()
                .unwrap_or(&self.embeddings)
                .memory_bytes()
    }

    /// Bytes of KV cache a token decoded at `position` reads: every layer's keys and
    /// values (f16) at the positions it attends to (all up to its own, or a sliding
    /// window's last). Between two decoded tokens the weights push the cache out to
    /// memory, so decoding streams these as well as [`Self::decode_weight_bytes`].
    pub fn decode_kv_bytes(&self, position: usize) -> usize {
        kv_bytes_read(
            self.layers.iter().map(|layer| layer.window),
            self.config.kv_width(),
            position,
        )
    }

    pub fn vocab_size(&self) -> usize {
        self.embeddings.rows
    }

    /// Empties the KV cache.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Keeps the first `positions` cached positions and drops the rest, so a job that
    /// shares a prefix with the previous one continues from there (exact: the cache of a
    /// prefix does not depend on what followed it).
    pub fn truncate(&mut self, positions: usize) {
        self.cache.truncate(positions);
    }

    /// Runs `tokens` at `position` (which must equal the cached length), extends the
    /// cache, and returns the logits of the last token.
    pub fn forward(&mut self, tokens: &[u32], position: usize) -> Result<Vec<f32>, KernelError> {
        self.forward_rows(tokens, position, 1)
    }

    /// [`Self::forward`], returning the logits of the last `rows` tokens (row after
    /// row, `rows × vocab`): a verifier's teacher-forced replay scores every step of
    /// a job in one pass, and batch invariance makes each row the bits decoding gave.
    pub fn forward_rows(
        &mut self,
        tokens: &[u32],
        position: usize,
        rows: usize,
    ) -> Result<Vec<f32>, KernelError> {
        let empty = self.cache.pool().new_sequence();
        let mut cache = std::mem::replace(&mut self.cache, empty);
        let result = self
            .forward_batch_rows(
                &mut [BatchEntry {
                    cache: &mut cache,
                    tokens,
                    position,
                }],
                rows,
            )
            .map(|mut logits| logits.pop().unwrap_or_default());
        self.cache = cache;
        result
    }
}

/// [`Llama::decode_kv_bytes`] for layers with these windows and KV rows `kv_width` wide.
fn kv_bytes_read(
    windows: impl Iterator<Item = Option<usize>>,
    kv_width: usize,
    position: usize,
) -> usize {
    let attended: usize = windows
        .map(|window| window.map_or(position + 1, |w| w.min(position + 1)))
        .sum();
    attended * kv_width * 2 * kv::VALUE_BYTES
}

/// Each rotary pair's angle per position: `base^(−2i/d)`, divided by the file's
/// `rope_freqs.weight` factor for pair `i` where it has one (Llama 3.1+ files scale
/// long wavelengths so, as llama.cpp's `freq_factors`), times `scale` (linear rope
/// scaling; 1 changes no bit).
fn rope_thetas(base: f32, dims: usize, factors: Option<&[f32]>, scale: f32) -> Vec<f32> {
    (0..dims)
        .step_by(2)
        .enumerate()
        .map(|(pair, i)| {
            let theta = 1f32 / math::pow(base, i as f32 / dims as f32);
            factors.map_or(theta, |f| theta / f[pair]) * scale
        })
        .collect()
}

/// cos and sin of every rotary pair's angle at each of `positions` (the kernels' own
/// `cos`/`sin`, like [`rope_thetas`]' `pow`: a library's last bit would differ between
/// a provider and its verifier on another libm).
fn rope_angles(thetas: &[f32], positions: &[usize]) -> Vec<(Vec<f32>, Vec<f32>)> {
    positions
        .iter()
        .map(|&p| {
            let angles: Vec<f32> = thetas.iter().map(|t| p as f32 * t).collect();
            (
                angles.iter().map(|&a| math::cos(a)).collect(),
                angles.iter().map(|&a| math::sin(a)).collect(),
            )
        })
        .collect()
}

fn norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    for (row, out_row) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        rms_norm(row, weight, eps, out_row);
    }
}

/// Adds `bias` to every row of `x` (rows of `bias.len()`).
fn add_to_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add(row, bias);
    }
}

fn add(x: &mut [f32], delta: &[f32]) {
    for (a, b) in x.iter_mut().zip(delta) {
        *a += b;
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A global layer reads every position up to the token's own, a sliding one at most
    /// its window: keys and values, two bytes each.
    #[test]
    fn decode_reads_the_kv_rows_each_layer_attends_to() {
        let windows = [None, Some(4), Some(64)];
        assert_eq!(
            kv_bytes_read(windows.into_iter(), 8, 9),
            (10 + 4 + 10) * 8 * 2 * 2
        );
        assert_eq!(kv_bytes_read(windows.into_iter(), 8, 0), 3 * 8 * 2 * 2);
        assert_eq!(kv_bytes_read(std::iter::empty(), 8, 9), 0);
    }

    pub(super) fn config() -> LlamaConfig {
        LlamaConfig {
            neox_rope: false,
            hidden: 64,
            feed_forward: 128,
            layers: 1,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            rope_dimensions: 16,
            rope_base: 500_000.0,
            rope_scale: 1.0,
            norm_eps: 1e-5,
            context: 128,
            head_norms: false,
            gemma: None,
        }
    }

    #[test]
    fn configurations_that_cannot_run_are_refused_with_the_reason() {
        let refused = |change: &dyn Fn(&mut LlamaConfig), reason: &str| {
            let mut c = config();
            change(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(reason), "{err}");
        };
        refused(&|c| c.heads = 0, "must be positive");
        refused(&|c| c.kv_heads = 3, "multiple of the KV heads");
        refused(&|c| c.head_dim = 15, "positive and even");
        refused(&|c| c.rope_dimensions = 8, "rotary dimensions");
        refused(&|c| c.rope_scale = f32::NAN, "rope scale");
        refused(&|c| c.rope_scale = 0.0, "rope scale");
        refused(&|c| c.heads = 1 << 62, "overflow");
        refused(&|c| c.layers = usize::MAX / 4, "overflow");
        refused(&|c| c.gemma = Some(Gemma::gemma3(0)), "sliding window");
        refused(
            &|c| c.gemma = Some(Gemma::gemma2(4096, 1e4, Some(0.0), None)),
            "soft-capping",
        );
        refused(
            &|c| c.gemma = Some(Gemma::gemma2(4096, 1e4, None, Some(f32::NAN))),
            "soft-capping",
        );
        assert!(config().validate().is_ok());
    }

    #[test]
    fn rope_frequency_factors_divide_each_pairs_angle() {
        let plain = rope_thetas(500_000.0, 16, None, 1.0);
        assert_eq!(plain.len(), 8);
        for (i, theta) in plain.iter().enumerate() {
            let want = 1f32 / 500_000f32.powf((2 * i) as f32 / 16.0);
            assert_eq!(theta.to_bits(), want.to_bits(), "pair {i}");
        }
        let factors: Vec<f32> = (0..8).map(|i| if i < 4 { 1.0 } else { 8.0 }).collect();
        let scaled = rope_thetas(500_000.0, 16, Some(&factors), 1.0);
        for i in 0..8 {
            assert_eq!(scaled[i], plain[i] / factors[i], "pair {i}");
        }
        // A factor of one changes no bit: files without long-context scaling are as before.
        assert_eq!(rope_thetas(500_000.0, 16, Some(&[1.0; 8]), 1.0), plain);
    }

    #[test]
    fn linear_rope_scaling_by_two_turns_position_2q_as_far_as_position_q() {
        // Positions divided by the factor, as the scaling means: exact for a power of two.
        let plain = rope_thetas(10_000.0, 16, None, 1.0);
        let scaled = rope_thetas(10_000.0, 16, None, 0.5);
        for q in [1usize, 7, 100, 4000] {
            assert_eq!(
                rope_angles(&scaled, &[2 * q]),
                rope_angles(&plain, &[q]),
                "{q}"
            );
        }
        assert_ne!(rope_angles(&scaled, &[7]), rope_angles(&plain, &[7]));
    }
}
