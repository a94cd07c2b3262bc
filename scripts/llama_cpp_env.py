"""llama.cpp for the benchmarks: llama-cpp-python 0.3.16 in .venv-bench (a source build
on first use: minutes), or the Python named by $LLAMA_CPP_PYTHON."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-bench")


def ensure_llama_cpp():
    # A Python that already has llama_cpp (e.g. from scripts/make-fixtures.py) can be reused.
    if os.environ.get("LLAMA_CPP_PYTHON"):
        return os.environ["LLAMA_CPP_PYTHON"]
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(python):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    if subprocess.call([python, "-c", "import llama_cpp"], stderr=subprocess.DEVNULL) != 0:
        print("installing llama-cpp-python into .venv-bench (builds llama.cpp; takes minutes)…", file=sys.stderr)
        subprocess.check_call([python, "-m", "pip", "install", "-q", "llama-cpp-python==0.3.16", "numpy"])
    return python


# Serves N sequences in parallel through llama.cpp's batch API, as llama-server's slots
# do: every prompt prefilled in one batch, then one decode batch per step holding each
# sequence's last token; greedy; a fixed number of tokens per sequence.
# argv: model path, JSON list of prompts (token ids), tokens per sequence, threads, repack (1/0).
LLAMA_BATCH_RUN = r"""
import json, sys, time
import numpy as np
import llama_cpp as L
path, prompts, tokens, threads, repack = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
n = len(prompts)
L.llama_backend_init()
mparams = L.llama_model_default_params()
mparams.use_extra_bufts = repack
model = L.llama_model_load_from_file(path.encode(), mparams)
cparams = L.llama_context_default_params()
# Each sequence its own KV stream (not one cache that every token attends over,
# masked), sized for its prompt and tokens: llama.cpp at its best for N slots.
cparams.kv_unified = False
per_sequence = -(-(max(len(p) for p in prompts) + tokens + 8) // 256) * 256
cparams.n_ctx = n * per_sequence
cparams.n_batch = cparams.n_ubatch = max(512, sum(len(p) for p in prompts))
cparams.n_seq_max = n
cparams.n_threads = cparams.n_threads_batch = threads
ctx = L.llama_init_from_model(model, cparams)
n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
batch = L.llama_batch_init(cparams.n_batch, 0, n)

def run(entries):
    # entries: (token, position, sequence, wants logits)
    batch.n_tokens = 0
    for token, pos, seq, logits in entries:
        i = batch.n_tokens
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, logits
        batch.n_tokens += 1
    if L.llama_decode(ctx, batch) != 0:
        raise SystemExit("llama_decode failed")

def argmax(i):
    return int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,))))

# Warm-up (page faults, repacking): a few tokens of one sequence, then cleared.
run([(t, p, 0, p == 7) for p, t in enumerate(prompts[0][:8])])
L.llama_memory_clear(L.llama_get_memory(ctx), True)
started = time.perf_counter()
entries = [(t, p, s, p == len(prompt) - 1) for s, prompt in enumerate(prompts) for p, t in enumerate(prompt)]
run(entries)
rows = [i for i, e in enumerate(entries) if e[3]]
last = [argmax(i) for i in rows]
first = time.perf_counter()
stamps = [first]
positions = [len(p) for p in prompts]
for step in range(tokens - 1):
    run([(last[s], positions[s], s, True) for s in range(n)])
    last = [argmax(s) for s in range(n)]
    positions = [p + 1 for p in positions]
    stamps.append(time.perf_counter())
ended = stamps[-1]
gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
pick = lambda xs, q: round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1) if xs else None
print(json.dumps({"aggregate_tok_s": round(n * tokens / (ended - started), 1),
                  "ttft_ms": round((first - started) * 1000, 1),
                  "gap_p50_ms": pick(gaps, 0.5), "gap_p99_ms": pick(gaps, 0.99)}))
"""
