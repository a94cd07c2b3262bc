#![allow(clippy::unwrap_used)]
//! llama.cpp's own tokenizer tests, run against this crate: each
//! `models/ggml-vocab-<name>.gguf` (a real model's vocabulary, no weights) with its
//! `.inp` (46 texts, each followed by `\n__ggml_vocab_test__\n`) and `.out` (the token
//! ids of each text, one line each, as the model's Hugging Face tokenizer gives them and
//! llama.cpp's `test-tokenizer-0` checks). They come from the llama-cpp-python 0.3.16
//! sdist, which `scripts/test` fetches once into the test cache (`llama-vocab/`).

use std::path::PathBuf;

use sharemesh_tokenizer::{read_header, GgufTokenizer};

const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn vocab_dir() -> PathBuf {
    let dir = std::env::var_os("SHAREMESH_TEST_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-model-cache")
        })
        .join("llama-vocab");
    assert!(
        dir.join("ggml-vocab-llama-bpe.gguf").exists(),
        "{} lacks llama.cpp's vocabularies: run scripts/test once (it fetches them into \
         the test cache), or set SHAREMESH_TEST_MODEL_CACHE to a folder that has them",
        dir.display()
    );
    dir
}

/// The cases of `name` this tokenizer gets wrong, as (text, expected, got); panics if
/// the vocabulary does not load or its pre-tokenizer is not `pre`.
fn disagreements(name: &str, pre: &str) -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let dir = vocab_dir();
    let path = dir.join(format!("ggml-vocab-{name}.gguf"));
    let header = read_header(std::fs::File::open(&path).unwrap()).unwrap();
    let named = header
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.to_string().ok())
        .cloned()
        .unwrap_or_default();
    assert_eq!(named, pre, "{name}'s pre-tokenizer");
    let tokenizer = GgufTokenizer::from_metadata(&header.metadata)
        .unwrap_or_else(|e| panic!("{name} does not load: {e}"));
    let inputs = std::fs::read_to_string(path.with_extension("gguf.inp")).unwrap();
    let outputs = std::fs::read_to_string(path.with_extension("gguf.out")).unwrap();
    let texts: Vec<&str> = inputs.split(SEPARATOR).collect();
    let expected: Vec<Vec<u32>> = outputs
        .split('\n')
        .map(|line| {
            line.split_whitespace()
                .map(|id| id.parse().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        expected.len(),
        "{name}: .inp and .out differ in length"
    );
    assert!(texts.len() > 40, "{name}: {} cases", texts.len());
    let mut wrong = Vec::new();
    // The last entry of each is the empty rest after the final separator.
    for (text, want) in texts.iter().zip(&expected).take(texts.len() - 1) {
        let got = tokenizer.encode(text).unwrap();
        if &got != want {
            wrong.push(((*text).to_owned(), want.clone(), got));
        }
    }
    println!(
        "{name} ({pre}): {} of {} cases agree",
        texts.len() - 1 - wrong.len(),
        texts.len() - 1
    );
    wrong
}

fn agrees(name: &str, pre: &str) {
    let wrong = disagreements(name, pre);
    assert!(
        wrong.is_empty(),
        "{name}: {} cases differ, first {:?}",
        wrong.len(),
        wrong.first()
    );
}

#[test]
fn llama3_vocabulary_agrees_with_llama_cpp() {
    agrees("llama-bpe", "llama-bpe");
}

#[test]
fn qwen2_vocabulary_agrees_with_llama_cpp() {
    agrees("qwen2", "qwen2");
}

#[test]
fn deepseek_vocabularies_agree_with_llama_cpp() {
    agrees("deepseek-llm", "deepseek-llm");
    agrees("deepseek-coder", "deepseek-coder");
}

#[test]
fn gpt2_family_vocabularies_agree_with_llama_cpp() {
    agrees("gpt-2", "gpt-2");
    agrees("mpt", "mpt");
    agrees("starcoder", "starcoder");
    agrees("refact", "refact");
    agrees("command-r", "command-r");
    agrees("falcon", "falcon");
}

#[test]
fn sentencepiece_vocabularies_agree_with_llama_cpp() {
    // Llama 2 / Mistral and Phi-3 (`tokenizer.ggml.model = llama`, no pre-tokenizer).
    agrees("llama-spm", "default");
    agrees("phi-3", "default");
}
