#!/usr/bin/env python3
"""Regenerates engine/tests/fixtures/llama_cpp_reference.json from llama.cpp.

Reference token ids come from llama-cpp-python (llama.cpp) on the same GGUF file the
tests use, so the engine's tokenizer and greedy decoding can be compared with the
reference implementation without llama.cpp being present at test time.

    python3 -m venv /tmp/lcpvenv && /tmp/lcpvenv/bin/pip install llama-cpp-python==0.3.16
    /tmp/lcpvenv/bin/python scripts/make-fixtures.py PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import json
import sys

import jinja2
import llama_cpp

path = sys.argv[1]
# F32 KV cache (llama.cpp defaults to F16) so the reference rounds like candle.
llm = llama_cpp.Llama(model_path=path, n_ctx=2048, n_threads=2, verbose=False, logits_all=True,
                      type_k=0, type_v=0, flash_attn=False)

STRINGS = [
    "Hello, world!",
    "The capital of France is",
    "  leading spaces and   runs of   whitespace\n\n\ttabs",
    "Numbers 1234567 and 3.14159, dates 2026-11-30",
    "Unicode: naïve café, Ελληνικά, русский, 日本語テキスト",
    "Emoji: 🚀🔥 👩‍👩‍👧 ✓",
    "<|im_start|>user\nHi<|im_end|>\n",
    "code: fn main() { println!(\"{}\", x); } // ok",
    "",
    "'s 're 've MIXED case WORDS's",
]

tokenizer_cases = []
for s in STRINGS:
    ids = llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)
    tokenizer_cases.append({"text": s, "ids": ids})

meta = llm.metadata
template = meta.get("tokenizer.chat_template")


def render(messages):
    env = jinja2.Environment()
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token="", eos_token="")


def greedy(prompt_ids, n):
    """Greedy ids, and at each step the gap between the best and second-best logit:
    where llama.cpp's own margin is tiny, another correct kernel may pick differently."""
    llm.reset()
    llm.eval(prompt_ids)
    out, margins = [], []
    for _ in range(n):
        scores = sorted(llm.scores[llm.n_tokens - 1], reverse=True)
        tok = int(max(range(llm.n_vocab()), key=lambda i: llm.scores[llm.n_tokens - 1][i]))
        out.append(tok)
        margins.append(round(float(scores[0] - scores[1]), 4))
        if tok in (llm.token_eos(), 2):
            break
        llm.eval([tok])
    return out, margins


generation_cases = []
for messages in [
    [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "List three primary colors."}],
    [{"role": "user", "content": "Explain what a CPU does in two sentences."}],
]:
    text = render(messages)
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    out, margins = greedy(ids, 32)
    generation_cases.append({"messages": messages, "prompt_text": text, "prompt_ids": ids,
                             "greedy_ids": out, "margins": margins,
                             "greedy_text": llm.detokenize(out).decode("utf-8", "replace")})

raw = "The capital of France is"
ids = llm.tokenize(raw.encode(), add_bos=False, special=True)
out, margins = greedy(ids, 32)
generation_cases.append({"raw": raw, "prompt_ids": ids, "greedy_ids": out, "margins": margins,
                         "greedy_text": llm.detokenize(out).decode("utf-8", "replace")})

json.dump({
    "generator": f"llama-cpp-python {llama_cpp.__version__}, scripts/make-fixtures.py",
    "model_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "tokenizer": tokenizer_cases,
    "generation": generation_cases,
}, open("engine/tests/fixtures/llama_cpp_reference.json", "w"), indent=1, ensure_ascii=False)
print("wrote engine/tests/fixtures/llama_cpp_reference.json")
