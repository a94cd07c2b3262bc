#!/usr/bin/env python3
"""Writes a random-weight GGUF shaped exactly like a real model (its hidden size, layers,
heads, KV heads, FFN width, vocabulary, biases and tied or separate output), every matrix
Q4_K (random nibbles and sub-scales, d = 0.0008, dmin = 0.0004), with the vocabulary and
tokenizer copied from a GGUF of that family: a file for measuring load, memory and speed
at a real size (weights' values do not change them), not for its text. Needs the `gguf`
package.

    python3 scripts/make-kquant-bench-file.py --shape llama3.2-1b \
        --vocab target/test-model-cache/llama-vocab/ggml-vocab-llama-bpe.gguf llama1b.gguf
    python3 scripts/make-kquant-bench-file.py --shape qwen2.5-7b \
        --vocab target/test-model-cache/llama-vocab/ggml-vocab-qwen2.gguf qwen7b.gguf

`scripts/bench-engine --sizes` makes these (llama.cpp's own vocabulary files, fetched
into the test cache by `scripts/fetch-llama-vocab.py`) and measures them.

Two departures from the published Q4_K_M files, both stated with the figures: every
matrix is Q4_K unless `--mix q4_k_m` (then, as llama.cpp's Q4_K_M preset writes them,
the output and the V and FFN-down matrices of the first and last eighth of the layers
and every third one between are Q6_K, ~5% more bytes), and Llama 3's `rope_freqs` (a
64-float table) is left out. The
vocabulary is the vocab file's: 128,256 for Llama 3 (as published), 151,936 for Qwen
(Qwen2.5-7B pads its embeddings to 152,064).
"""
import argparse

import gguf
import numpy as np

# name: (architecture, hidden, layers, heads, KV heads, FFN, tied output, rope base, eps)
SHAPES = {
    "smollm2-135m": ("llama", 576, 30, 9, 3, 1536, True, 100000.0, 1e-5),
    "llama3.2-1b": ("llama", 2048, 16, 32, 8, 8192, True, 500000.0, 1e-5),
    "qwen2.5-1.5b": ("qwen2", 1536, 28, 12, 2, 8960, True, 1000000.0, 1e-6),
    "llama3.1-8b": ("llama", 4096, 32, 32, 8, 14336, False, 500000.0, 1e-5),
    "qwen2.5-7b": ("qwen2", 3584, 28, 28, 4, 18944, False, 1000000.0, 1e-6),
}
Q4_K = gguf.GGMLQuantizationType.Q4_K
Q4_1 = gguf.GGMLQuantizationType.Q4_1
Q4_1_BLOCK_BYTES, Q4_1_BLOCK_WEIGHTS = 20, 32
Q6_K = gguf.GGMLQuantizationType.Q6_K
BLOCK_BYTES, BLOCK_WEIGHTS = 144, 256
Q6K_BLOCK_BYTES = 210


def more_bits(layer, layers):
    """llama.cpp's `use_more_bits`: which layers' V and FFN-down Q4_K_M keeps in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def copy_tokenizer(src, out):
    for field in src.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            if field.types[1] == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            out.add_array(field.name, values)
        elif kind == gguf.GGUFValueType.STRING:
            out.add_string(field.name, bytes(field.parts[field.data[0]]).decode())
        elif kind == gguf.GGUFValueType.UINT32:
            out.add_uint32(field.name, int(field.parts[field.data[0]][0]))
        elif kind == gguf.GGUFValueType.BOOL:
            out.add_bool(field.name, bool(field.parts[field.data[0]][0]))
        elif kind == gguf.GGUFValueType.INT32:
            out.add_int32(field.name, int(field.parts[field.data[0]][0]))


class RandomQ4K:
    """Q4_K matrices cut from one pool of random blocks (as large as the largest matrix),
    so an 8B file is written without holding 4.5 GB of distinct random bytes."""

    def __init__(self, largest_blocks, seed=1):
        rng = np.random.default_rng(seed)
        pool = rng.integers(0, 256, size=(largest_blocks, BLOCK_BYTES), dtype=np.uint8)
        pool[:, 0:2] = np.full(1, 0.0008, dtype=np.float16).view(np.uint8)
        pool[:, 2:4] = np.full(1, 0.0004, dtype=np.float16).view(np.uint8)
        self.pool = pool

    def matrix(self, rows, cols):
        blocks = rows * cols // BLOCK_WEIGHTS
        return self.pool[:blocks].reshape(rows, cols // BLOCK_WEIGHTS * BLOCK_BYTES)


class RandomQ4_1:
    """Q4_1 matrices (blocks of 32: d, m, 16 bytes of nibbles; d = 0.001, m = -0.0075, so
    weights are centred) cut from one pool: for shapes whose rows do not split into
    Q4_K's 256 (SmolLM2's 576), as the catalog's SmolLM2 file is Q4_1."""

    def __init__(self, largest_blocks, seed=3):
        rng = np.random.default_rng(seed)
        pool = rng.integers(0, 256, size=(largest_blocks, Q4_1_BLOCK_BYTES), dtype=np.uint8)
        pool[:, 0:2] = np.full(1, 0.001, dtype=np.float16).view(np.uint8)
        pool[:, 2:4] = np.full(1, -0.0075, dtype=np.float16).view(np.uint8)
        self.pool = pool

    def matrix(self, rows, cols):
        blocks = rows * cols // Q4_1_BLOCK_WEIGHTS
        return self.pool[:blocks].reshape(rows, cols // Q4_1_BLOCK_WEIGHTS * Q4_1_BLOCK_BYTES)


class RandomQ6K:
    """Q6_K matrices cut from one pool of random blocks (ql, qh, int8 sub-scales in
    [-8, 8), d = 0.0004)."""

    def __init__(self, largest_blocks, seed=2):
        rng = np.random.default_rng(seed)
        pool = rng.integers(0, 256, size=(largest_blocks, Q6K_BLOCK_BYTES), dtype=np.uint8)
        pool[:, 192:208] = rng.integers(-8, 8, size=(largest_blocks, 16), dtype=np.int8).view(np.uint8)
        pool[:, 208:210] = np.full(1, 0.0004, dtype=np.float16).view(np.uint8)
        self.pool = pool

    def matrix(self, rows, cols):
        blocks = rows * cols // BLOCK_WEIGHTS
        return self.pool[:blocks].reshape(rows, cols // BLOCK_WEIGHTS * Q6K_BLOCK_BYTES)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--vocab", required=True, help="a GGUF whose tokenizer.* keys are copied")
    parser.add_argument("--mix", choices=["q4_k", "q4_k_m", "q4_1"], default="q4_k",
                        help="every matrix Q4_K, or Q4_K_M's Q6_K output, V and FFN-down where it "
                             "keeps them, or every matrix Q4_1")
    parser.add_argument("--vocab-only", action="store_true",
                        help="write only --vocab's architecture and tokenizer (a small file to "
                             "carry where the model itself is too large to)")
    parser.add_argument("out")
    args = parser.parse_args()
    if args.vocab_only:
        return write_vocab_only(args.vocab, args.out)
    arch, hidden, layers, heads, kv_heads, ffn, tied, rope_base, eps = SHAPES[args.shape]
    src = gguf.GGUFReader(args.vocab)
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    head_dim = hidden // heads
    out = gguf.GGUFWriter(args.out, arch)
    out.add_name(f"random-weight {args.shape} ({args.mix.upper()})")
    out.add_context_length(4096)
    out.add_embedding_length(hidden)
    out.add_block_count(layers)
    out.add_feed_forward_length(ffn)
    out.add_head_count(heads)
    out.add_head_count_kv(kv_heads)
    out.add_layer_norm_rms_eps(eps)
    out.add_rope_freq_base(rope_base)
    out.add_rope_dimension_count(head_dim)
    mixed = args.mix == "q4_k_m"
    out.add_file_type({
        "q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_S,
        "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M,
        "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    }[args.mix])
    copy_tokenizer(src, out)
    if "tokenizer.ggml.add_bos_token" not in src.fields:
        # Llama 3 begins every prompt with <|begin_of_text|>; Qwen with nothing.
        out.add_add_bos_token(arch == "llama")
    largest = max(vocab * hidden, ffn * hidden)
    if args.mix == "q4_1":
        weights, base = RandomQ4_1(largest // Q4_1_BLOCK_WEIGHTS), Q4_1
    else:
        weights, base = RandomQ4K(largest // BLOCK_WEIGHTS), Q4_K
    six = RandomQ6K(largest // BLOCK_WEIGHTS) if mixed else None

    def matrix(rows, cols, more=False):
        """A matrix of the base type, or Q6_K where the mix keeps more bits."""
        if six is not None and more:
            return six.matrix(rows, cols), Q6_K
        return weights.matrix(rows, cols), base

    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    # Tied, the embedding is the output: Q4_K_M keeps it in the output's type.
    data, kind = matrix(vocab, hidden, tied)
    out.add_tensor("token_embd.weight", data, raw_dtype=kind)
    out.add_tensor("output_norm.weight", ones(hidden))
    if not tied:
        data, kind = matrix(vocab, hidden, True)
        out.add_tensor("output.weight", data, raw_dtype=kind)
    for i in range(layers):
        p = f"blk.{i}."
        out.add_tensor(p + "attn_norm.weight", ones(hidden))
        for name, rows in (("attn_q", hidden), ("attn_k", head_dim * kv_heads)):
            data, kind = matrix(rows, hidden)
            out.add_tensor(p + name + ".weight", data, raw_dtype=kind)
        data, kind = matrix(head_dim * kv_heads, hidden, more_bits(i, layers))
        out.add_tensor(p + "attn_v.weight", data, raw_dtype=kind)
        if arch == "qwen2":
            out.add_tensor(p + "attn_q.bias", np.zeros(hidden, dtype=np.float32))
            out.add_tensor(p + "attn_k.bias", np.zeros(head_dim * kv_heads, dtype=np.float32))
            out.add_tensor(p + "attn_v.bias", np.zeros(head_dim * kv_heads, dtype=np.float32))
        data, kind = matrix(hidden, hidden)
        out.add_tensor(p + "attn_output.weight", data, raw_dtype=kind)
        out.add_tensor(p + "ffn_norm.weight", ones(hidden))
        for name in ("ffn_gate", "ffn_up"):
            data, kind = matrix(ffn, hidden)
            out.add_tensor(p + name + ".weight", data, raw_dtype=kind)
        data, kind = matrix(hidden, ffn, more_bits(i, layers))
        out.add_tensor(p + "ffn_down.weight", data, raw_dtype=kind)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()


def write_vocab_only(source, path):
    src = gguf.GGUFReader(source)
    arch = bytes(src.fields["general.architecture"].parts[-1]).decode()
    out = gguf.GGUFWriter(path, arch)
    copy_tokenizer(src, out)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()


if __name__ == "__main__":
    main()
