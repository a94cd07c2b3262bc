//! Writes the GGUF files of other families that the tests write from SmolLM2's weights
//! (`tests/support/qwen2.rs`), for `scripts/make-family-fixtures.py` to run llama.cpp on:
//!
//!     cargo run -p sharemesh-engine --example family_files -- SMOLLM2.gguf OUT_DIR
//!
//! writes OUT_DIR/qwen3.gguf and OUT_DIR/phi3.gguf, the same bytes as the tests'.

#[path = "../tests/support/qwen2.rs"]
#[allow(dead_code)] // The qwen2 writer is for the tests only.
mod qwen2;

use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [smollm2, out] = &args[..] else {
        eprintln!("usage: family_files SMOLLM2.gguf OUT_DIR");
        std::process::exit(2);
    };
    let (smollm2, out) = (PathBuf::from(smollm2), PathBuf::from(out));
    if let Err(err) = std::fs::create_dir_all(&out) {
        eprintln!("cannot create {}: {err}", out.display());
        std::process::exit(1);
    }
    qwen2::write_qwen3_from_llama(&smollm2, &out.join("qwen3.gguf"), qwen2::qwen3_norm);
    qwen2::write_phi3_from_llama(&smollm2, &out.join("phi3.gguf"));
    println!("{}", out.display());
}
