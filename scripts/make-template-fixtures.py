#!/usr/bin/env python3
"""Regenerates tokenizer/tests/fixtures/chat_templates.json: each family's own chat
template rendered by llama-cpp-python 0.3.16 (`llama_chat_format.Jinja2ChatFormatter`,
the renderer it applies to a GGUF's `tokenizer.chat_template`: a sandboxed jinja2 with
trim_blocks and lstrip_blocks, as transformers renders them) on a fixed set of
conversations, with and without the generation prompt — and, for a template that shows
no system message (llama.cpp's probe), on the conversation as llama.cpp's server passes
it there: system messages merged into the next user turn (minja's polyfill). The Rust side
(tokenizer/tests/chat_templates.rs) renders the same templates with minijinja and must
give the same text, or fail where jinja2 fails.

The templates are llama.cpp's own collection (`models/templates/*.jinja` in the sdist,
fetched into the test cache by scripts/fetch-llama-vocab.py) and the ones GGUF files
carry (the vocab files' and SmolLM2's). The clock is fixed (`strftime_now` renders
2026-12-06, a Sunday) so the fixture does not change with the day.

    python3 scripts/make-template-fixtures.py target/test-model-cache

Runs llama-cpp-python from .venv-bench (scripts/llama_cpp_env.py builds it on first use).
"""
import hashlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from llama_cpp_env import ensure_llama_cpp  # noqa: E402

# The conversations every template renders (roles and contents as the API passes them).
CONVERSATIONS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Answer in French."},
     {"role": "user", "content": "Hello!"},
     {"role": "assistant", "content": "Bonjour !"},
     {"role": "user", "content": "  How are you?\n"}],
    [{"role": "user", "content": "First question"},
     {"role": "assistant", "content": " A first answer. "},
     {"role": "user", "content": "Ünïcode — and {braces} {{ not a template }}"}],
]

# (begin, end) token text per family, by the template's name prefix; the default is
# Llama 2's.
TOKENS = [
    ("meta-llama-Llama-3", "<|begin_of_text|>", "<|eot_id|>"),
    ("NousResearch-Hermes-2-Pro-Llama-3", "<|begin_of_text|>", "<|im_end|>"),
    ("NousResearch-Hermes-3-Llama-3.1", "<|begin_of_text|>", "<|im_end|>"),
    ("deepseek-ai-DeepSeek-R1-Distill", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("Qwen", "", "<|im_end|>"),
    ("vocab:qwen2", "", "<|im_end|>"),
    ("gguf:SmolLM2", "<|im_start|>", "<|im_end|>"),
    ("google-gemma", "<bos>", "<eos>"),
    ("microsoft-Phi", "<s>", "<|endoftext|>"),
    ("vocab:phi-3", "<s>", "<|endoftext|>"),
    ("ibm-granite", "", "<|end_of_text|>"),
    ("vocab:command-r", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    ("CohereForAI", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
]

RENDER = r"""
import datetime, json, sys
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

class FixedClock(Jinja2ChatFormatter):
    @staticmethod
    def strftime_now(f):
        return datetime.datetime(2026, 12, 6, 9, 30, 0).strftime(f)

# llama.cpp's probe (minja's supports_system_role).
def shows_system(job):
    try:
        formatter = FixedClock(job["template"], job["eos"], job["bos"], add_generation_prompt=False)
        probe = [{"role": "system", "content": "<System Needle>"},
                 {"role": "user", "content": "<User Needle>"}]
        return "<System Needle>" in formatter(messages=probe).prompt
    except Exception:
        return False


# llama.cpp's system-role polyfill (minja's polyfill_system_role).
def merge_system_turns(conversation):
    merged, pending = [], ""
    for message in conversation:
        role, content = message["role"], message["content"]
        if role == "system":
            pending = pending + "\n" + content if pending else content
        elif role == "user" and pending:
            merged.append({"role": "user", "content": pending + ("\n" + content if content else "")})
            pending = ""
        else:
            if pending:
                merged.append({"role": "user", "content": pending})
                pending = ""
            merged.append(message)
    if pending:
        merged.append({"role": "user", "content": pending})
    return merged


jobs = json.load(sys.stdin)
out = []
for job in jobs:
    cases = []
    system_role = shows_system(job)
    for conversation in job["conversations"]:
        if not system_role:
            conversation = merge_system_turns(conversation)
        for add in (True, False):
            try:
                formatter = FixedClock(job["template"], job["eos"], job["bos"],
                                       add_generation_prompt=add)
                rendered = formatter(messages=conversation).prompt
                cases.append({"add_generation_prompt": add, "rendered": rendered})
            except Exception as err:  # the template refused (raise_exception) or failed
                cases.append({"add_generation_prompt": add, "rendered": None,
                              "error": f"{type(err).__name__}: {err}"})
    out.append({"system_role": system_role, "cases": cases})
print(json.dumps(out))
"""


def gguf_template(path):
    import gguf
    field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def main():
    cache = os.path.abspath(sys.argv[1])
    templates = os.path.join(cache, "llama-vocab", "templates")
    sources = []
    for name in sorted(os.listdir(templates)):
        if name.endswith(".jinja"):
            with open(os.path.join(templates, name), encoding="utf-8", newline="") as f:
                sources.append((name[: -len(".jinja")], f.read()))
    for vocab in ["qwen2", "phi-3", "command-r"]:
        path = os.path.join(cache, "llama-vocab", f"ggml-vocab-{vocab}.gguf")
        sources.append((f"vocab:{vocab}", gguf_template(path)))
    smollm2 = os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    sources.append(("gguf:SmolLM2-135M-Instruct", gguf_template(smollm2)))

    jobs = []
    for name, template in sources:
        bos, eos = next(((b, e) for p, b, e in TOKENS if name.startswith(p)), ("<s>", "</s>"))
        jobs.append({"template": template, "bos": bos, "eos": eos,
                     "conversations": CONVERSATIONS})
    python = ensure_llama_cpp()
    result = subprocess.run([python, "-c", RENDER], input=json.dumps(jobs), text=True,
                            capture_output=True)
    if result.returncode != 0:
        sys.exit(result.stderr)
    rendered = json.loads(result.stdout)
    fixture = {
        "renderer": "llama-cpp-python 0.3.16 Jinja2ChatFormatter (jinja2 sandbox, "
                    "trim_blocks, lstrip_blocks), strftime_now at 2026-12-06 09:30; without a "
                    "system role, system messages merged into the next user turn as minja does",
        "conversations": CONVERSATIONS,
        "templates": [
            {"name": name, "sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
             "bos": job["bos"], "eos": job["eos"], "system_role": result["system_role"],
             "cases": result["cases"]}
            for (name, template), job, result in zip(sources, jobs, rendered)
        ],
    }
    out = os.path.join(ROOT, "tokenizer", "tests", "fixtures", "chat_templates.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, indent=1, ensure_ascii=False)
        f.write("\n")
    failed = sum(c["rendered"] is None for t in fixture["templates"] for c in t["cases"])
    print(f"{out}: {len(sources)} templates, {failed} refusals", file=sys.stderr)


if __name__ == "__main__":
    main()
