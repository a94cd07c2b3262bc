#!/usr/bin/env python3
"""Writes a random-weight GGUF shaped like Llama-3.2-1B (hidden 2048, 16 layers, 32 heads,
8 KV heads, FFN 8192) with every matrix Q4_K (random nibbles and sub-scales, d = 0.0008,
dmin = 0.0004) and SmolLM2's vocabulary and tokenizer copied from its file: a file for
measuring decode at a real size, not for its text. Needs the `gguf` package.

    python3 scripts/make-kquant-bench-file.py SmolLM2-135M-Instruct.Q4_1.gguf llama1b-q4k.gguf
    sharemesh bench --model llama1b-q4k.gguf --threads 1 --tokens 32
"""
import sys, numpy as np, gguf
src = gguf.GGUFReader(sys.argv[1])
out = gguf.GGUFWriter(sys.argv[2], "llama")
H, L, HEADS, KV, FF = 2048, 16, 32, 8, 8192
out.add_context_length(2048); out.add_embedding_length(H); out.add_block_count(L)
out.add_feed_forward_length(FF); out.add_head_count(HEADS); out.add_head_count_kv(KV)
out.add_layer_norm_rms_eps(1e-5); out.add_rope_freq_base(500000.0)
out.add_rope_dimension_count(H // HEADS)
for field in src.fields.values():
    if not field.name.startswith("tokenizer."):
        continue
    t = field.types
    if t[0] == gguf.GGUFValueType.ARRAY:
        sub = t[1]
        if sub == gguf.GGUFValueType.STRING:
            vals = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        else:
            vals = [field.parts[i].tolist()[0] for i in field.data]
        out.add_array(field.name, vals)
    elif t[0] == gguf.GGUFValueType.STRING:
        out.add_string(field.name, bytes(field.parts[field.data[0]]).decode())
    elif t[0] == gguf.GGUFValueType.UINT32:
        out.add_uint32(field.name, int(field.parts[field.data[0]][0]))
    elif t[0] == gguf.GGUFValueType.BOOL:
        out.add_bool(field.name, bool(field.parts[field.data[0]][0]))
    elif t[0] == gguf.GGUFValueType.INT32:
        out.add_int32(field.name, int(field.parts[field.data[0]][0]))
vocab = len(src.fields["tokenizer.ggml.tokens"].data)
rng = np.random.default_rng(1)
def q4k(rows, cols):
    nb = rows * cols // 256
    raw = rng.integers(0, 256, size=(nb, 144), dtype=np.uint8)
    d = np.full(nb, 0.0008, dtype=np.float16).view(np.uint8).reshape(nb, 2)
    dm = np.full(nb, 0.0004, dtype=np.float16).view(np.uint8).reshape(nb, 2)
    raw[:, 0:2] = d; raw[:, 2:4] = dm
    return raw.reshape(rows, cols // 256 * 144)
def f32(n):
    return np.ones(n, dtype=np.float32)
Q = gguf.GGMLQuantizationType.Q4_K
out.add_tensor("token_embd.weight", q4k(vocab, H), raw_dtype=Q)
out.add_tensor("output_norm.weight", f32(H))
for i in range(L):
    p = f"blk.{i}."
    out.add_tensor(p + "attn_norm.weight", f32(H))
    out.add_tensor(p + "attn_q.weight", q4k(H, H), raw_dtype=Q)
    out.add_tensor(p + "attn_k.weight", q4k(H // HEADS * KV, H), raw_dtype=Q)
    out.add_tensor(p + "attn_v.weight", q4k(H // HEADS * KV, H), raw_dtype=Q)
    out.add_tensor(p + "attn_output.weight", q4k(H, H), raw_dtype=Q)
    out.add_tensor(p + "ffn_norm.weight", f32(H))
    out.add_tensor(p + "ffn_gate.weight", q4k(FF, H), raw_dtype=Q)
    out.add_tensor(p + "ffn_up.weight", q4k(FF, H), raw_dtype=Q)
    out.add_tensor(p + "ffn_down.weight", q4k(H, FF), raw_dtype=Q)
out.write_header_to_file(); out.write_kv_data_to_file(); out.write_tensors_to_file(); out.close()
