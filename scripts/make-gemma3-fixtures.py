#!/usr/bin/env python3
"""Regenerates engine/tests/fixtures/gemma3_reference.json from llama.cpp: tokenizer ids
(SentencePiece vocabulary) and greedy continuations with llama.cpp's top-2 margins,
for Gemma 3 270M Q4_K_M (the catalog's `gemma3-270m`).

    python3 -m venv /tmp/lcpvenv && /tmp/lcpvenv/bin/pip install llama-cpp-python==0.3.16
    sharemesh models fetch gemma3-270m
    /tmp/lcpvenv/bin/python scripts/make-gemma3-fixtures.py PATH/TO/gemma-3-270m-q4_k_m.gguf
"""
import json
import sys

import llama_cpp

path = sys.argv[1]
# F32 KV cache (llama.cpp defaults to F16) so the reference rounds like our f32 cache.
llm = llama_cpp.Llama(model_path=path, n_ctx=2048, n_batch=1024, n_threads=2, verbose=False, logits_all=True,
                      type_k=0, type_v=0, flash_attn=False)

STRINGS = [
    "Hello, world!",
    "The capital of France is",
    "  leading spaces and   runs of   whitespace\n\n\ttabs",
    "Numbers 1234567 and 3.14159, dates 2026-11-30",
    "Unicode: naïve café, Ελληνικά, русский, 日本語テキスト",
    "Emoji: 🚀🔥 👩‍👩‍👧 ✓ and a rare one: 𓀀",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "code: fn main() { println!(\"{}\", x); } // ok\n\n\n    indented",
    "",
    " ",
    "<bos>text after bos<eos>",
]
tokenizer_cases = [{"text": s, "ids": llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)}
                   for s in STRINGS]


def greedy(prompt_ids, n):
    llm.reset()
    llm.eval(prompt_ids)
    out, margins = [], []
    for _ in range(n):
        row = llm.scores[llm.n_tokens - 1]
        order = sorted(range(llm.n_vocab()), key=lambda i: -row[i])[:2]
        out.append(int(order[0]))
        margins.append(round(float(row[order[0]] - row[order[1]]), 4))
        if order[0] == llm.token_eos():
            break
        llm.eval([order[0]])
    return out, margins


# Longer than the 512-position sliding window, so local layers mask old keys both in
# the prefill and while decoding.
LONG = ("The museum opened its doors in 1902 with a single room of fossils. " * 60
        + "Over the next century the collection grew, and today the museum is")

generation_cases = []
for raw, n in [("The capital of France is", 16), ("Once upon a time, there was a little", 16),
               (LONG, 8)]:
    ids = llm.tokenize(raw.encode(), add_bos=True, special=True)
    out, margins = greedy(ids, n)
    generation_cases.append({"raw": raw, "prompt_ids": ids, "greedy_ids": out, "margins": margins,
                             "greedy_text": llm.detokenize(out).decode("utf-8", "replace")})

json.dump({
    "generator": f"llama-cpp-python {llama_cpp.__version__}, scripts/make-gemma3-fixtures.py",
    "model_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    "tokenizer": tokenizer_cases,
    "generation": generation_cases,
}, open("engine/tests/fixtures/gemma3_reference.json", "w"), indent=1, ensure_ascii=False)
print("wrote engine/tests/fixtures/gemma3_reference.json")
