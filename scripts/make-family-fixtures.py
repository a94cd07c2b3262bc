#!/usr/bin/env python3
"""Regenerates engine/tests/fixtures/families_reference.json from llama.cpp: for each file
the tests write from SmolLM2's weights in another family's layout or with another
setting (qwen2 with biases, qwen3, phi3, llama with linear rope scaling ×2:
`cargo run -p sharemesh-engine --example family_files`), the prompt ids and greedy
continuations with llama.cpp's top-2 margins; and gemma2 from Gemma 3 270M's weights.

    python3 scripts/make-family-fixtures.py SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf

Runs llama-cpp-python 0.3.16 from .venv-bench (scripts/llama_cpp_env.py builds it on
first use: minutes), F32 KV cache so it rounds like the kernels' f32 cache.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from llama_cpp_env import ensure_llama_cpp  # noqa: E402

PROMPTS = ["Once upon a time, there was a little", "The capital of France is"]
TOKENS = 16

RUN = r"""
import json, sys
import llama_cpp
path, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=2, verbose=False,
                      logits_all=True, type_k=0, type_v=0, flash_attn=False)
cases = []
for raw in prompts:
    ids = llm.tokenize(raw.encode("utf-8"), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    out, margins = [], []
    for _ in range(n):
        row = llm.scores[llm.n_tokens - 1]
        order = sorted(range(llm.n_vocab()), key=lambda i: -row[i])[:2]
        out.append(int(order[0]))
        margins.append(round(float(row[order[0]] - row[order[1]]), 4))
        if order[0] == llm.token_eos():
            break
        llm.eval([order[0]])
    cases.append({"raw": raw, "prompt_ids": ids, "greedy_ids": out, "margins": margins})
print(json.dumps(cases))
"""


def main():
    smollm2, gemma3 = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    python = ensure_llama_cpp()
    with tempfile.TemporaryDirectory() as out:
        subprocess.check_call(["cargo", "run", "-q", "-p", "sharemesh-engine", "--example",
                               "family_files", "--", smollm2, gemma3, out], cwd=ROOT)
        fixture = {}
        for family in ["qwen2", "qwen3", "phi3", "llama-linear-2", "gemma2"]:
            result = subprocess.run([python, "-c", RUN, os.path.join(out, f"{family}.gguf"),
                                     json.dumps(PROMPTS), str(TOKENS)],
                                    check=True, capture_output=True, text=True)
            fixture[family] = json.loads(result.stdout)
    target = os.path.join(ROOT, "engine", "tests", "fixtures", "families_reference.json")
    with open(target, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(target)


if __name__ == "__main__":
    main()
