//! CPU inference kernels for sharemesh: integer dot products over GGUF-quantized
//! weights and a llama-family forward pass built on them.
//!
//! The one property everything here keeps: **batch invariance**. Every output element
//! is computed by the same sequence of floating-point operations whether its token is
//! processed alone (decode) or inside a batch of any size (prefill), on any number of
//! threads, with or without SIMD. Integer block sums are exact; the float combination
//! order is fixed per element (see [`quant`]). So a provider can resume a job by
//! prefilling the prompt and the delivered tokens in one batch and still continue
//! bit for bit as the uninterrupted run would (SPEC.md §7).
//!
//! [`dense`] is the exception: f32 matrix–vector products for graphs that keep
//! activations in float (the engine's Gemma 3 graph on candle tensors, its fallback
//! where these kernels do not run), deterministic but not part of the batch-invariant
//! path.
//!
//! No I/O: callers hand in tensor bytes already read from the file.

/// The kernels' arithmetic version: runs with the same version compute the same bits
/// on every instruction set. Bumped whenever any output bit may change, since
/// verifiers replay jobs of a profile bit for bit (SPEC.md §12).
pub const ARITHMETIC_VERSION: &str = "3";

mod arena;
pub mod attention;
pub mod blocks;
pub mod dense;
pub mod dot;
pub mod llama;
pub mod math;
pub mod matmul;
pub mod ops;
pub mod priority;
pub mod quant;

static HELD_TO_AVX2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Holds every kernel to its AVX2 build from now on where the CPU also has AVX-512: to
/// measure on one host what an AVX2-only CPU (most consumer ones) runs. The bits are the
/// same on every build; only the speed differs. Call it before loading a model (the
/// engine does for `SHAREMESH_MAX_ISA=avx2`).
pub fn hold_to_avx2() {
    HELD_TO_AVX2.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the kernels may pick their AVX-512 builds ([`hold_to_avx2`]).
pub(crate) fn avx512_allowed() -> bool {
    !HELD_TO_AVX2.load(std::sync::atomic::Ordering::Relaxed)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("tensor `{name}`: format {format} is not supported by the sharemesh kernels")]
    UnsupportedFormat { name: String, format: String },
    #[error("tensor `{name}`: {problem}")]
    BadTensor { name: String, problem: String },
    #[error("model configuration: {0}")]
    BadConfig(String),
    #[error("token id {token} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("position {position} + {tokens} tokens exceeds the context of {context}")]
    ContextExceeded {
        position: usize,
        tokens: usize,
        context: usize,
    },
    #[error("a forward pass needs at least one token")]
    NoTokens,
    #[error("forward at position {position}, but the KV cache holds {cached} positions")]
    PositionMismatch { position: usize, cached: usize },
    #[error("could not start the kernel thread pool: {0}")]
    ThreadPool(String),
    #[error(
        "the KV cache needs {needed} more blocks and {free} are free (budget {capacity} blocks)"
    )]
    KvMemoryFull {
        needed: usize,
        free: usize,
        capacity: usize,
    },
}
