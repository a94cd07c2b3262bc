#!/usr/bin/env python3
"""llama.cpp's tokenizer tests for the tokenizer crate (tokenizer/tests/llama_vocab.rs):
the `models/ggml-vocab-*.gguf` vocabularies (no weights) with their `.inp`/`.out` cases,
and llama.cpp's collection of real chat templates (`models/templates/*.jinja`, into
`templates/`, for tokenizer/tests/chat_templates.rs), taken from the llama-cpp-python
0.3.16 sdist on PyPI (pinned by sha256).

    python3 scripts/fetch-llama-vocab.py DEST_DIR
"""
import hashlib
import io
import os
import sys
import tarfile
import urllib.request

URL = (
    "https://files.pythonhosted.org/packages/e4/b4/"
    "c8cd17629ced0b9644a71d399a91145aedef109c0333443bef015e45b704/"
    "llama_cpp_python-0.3.16.tar.gz"
)
SHA256 = "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6"
NAMES = [
    "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "gpt-2", "mpt",
    "starcoder", "refact", "command-r", "falcon", "llama-spm", "phi-3",
]
PREFIX = "llama_cpp_python-0.3.16/vendor/llama.cpp/models/ggml-vocab-"
TEMPLATES = "llama_cpp_python-0.3.16/vendor/llama.cpp/models/templates/"
# What scripts/test looks for (bumped when the set of files grows).
MARKER = "COMPLETE-2"


def main() -> None:
    dest = sys.argv[1]
    print(f"fetching llama.cpp's tokenizer tests into {dest} (a 50 MB sdist, once)…", file=sys.stderr)
    with urllib.request.urlopen(URL, timeout=300) as response:
        data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        sys.exit(f"{URL}: sha256 {digest}, expected {SHA256}")
    wanted = {PREFIX + name + ".gguf" + ext for name in NAMES for ext in ("", ".inp", ".out")}
    os.makedirs(os.path.join(dest, "templates"), exist_ok=True)
    found = templates = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as sdist:
        for member in sdist.getmembers():
            if not member.isfile():
                continue
            if member.name.startswith(TEMPLATES) and member.name.endswith(".jinja"):
                target = os.path.join(dest, "templates", os.path.basename(member.name))
                templates += 1
            elif member.name in wanted:
                target = os.path.join(dest, os.path.basename(member.name))
                found += 1
            else:
                continue
            with sdist.extractfile(member) as src, open(target + ".part", "wb") as out:
                out.write(src.read())
            os.replace(target + ".part", target)
    if found != len(wanted) or templates == 0:
        sys.exit(f"the sdist held {found} of the {len(wanted)} files wanted and {templates} templates")
    # Written last, so an interrupted fetch is redone.
    open(os.path.join(dest, MARKER), "w").close()


if __name__ == "__main__":
    main()
