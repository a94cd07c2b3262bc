//! Writes the GGUF files of other families and settings that the tests write from
//! SmolLM2's weights (`tests/support/`), for `scripts/make-family-fixtures.py` to run
//! llama.cpp on:
//!
//!     cargo run -p sharemesh-engine --example family_files -- SMOLLM2.gguf GEMMA3.gguf OUT_DIR
//!
//! writes OUT_DIR/{qwen2,qwen3,phi3,llama-linear-2,gemma2}.gguf, the same bytes as the
//! tests' (gemma2 from Gemma 3 270M's weights).

#[path = "../tests/support/mod.rs"]
mod support;

use candle_core::quantized::gguf_file::Value;

use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [smollm2, gemma3, out] = &args[..] else {
        eprintln!("usage: family_files SMOLLM2.gguf GEMMA3.gguf OUT_DIR");
        std::process::exit(2);
    };
    let (smollm2, gemma3, out) = (
        PathBuf::from(smollm2),
        PathBuf::from(gemma3),
        PathBuf::from(out),
    );
    if let Err(err) = std::fs::create_dir_all(&out) {
        eprintln!("cannot create {}: {err}", out.display());
        std::process::exit(1);
    }
    let qwen2 = out.join("qwen2.gguf");
    support::qwen2::write_qwen2_from_llama(&smollm2, &qwen2, support::qwen2::qwen2_bias);
    let qwen3 = out.join("qwen3.gguf");
    support::qwen2::write_qwen3_from_llama(&smollm2, &qwen3, support::qwen2::qwen3_norm);
    support::qwen2::write_phi3_from_llama(&smollm2, &out.join("phi3.gguf"));
    // As `tests/rope_scaling.rs` writes it.
    let scaling = [
        ("llama.rope.scaling.type", Value::String("linear".into())),
        ("llama.rope.scaling.factor", Value::F32(2.0)),
    ];
    support::with_metadata(&smollm2, &out.join("llama-linear-2.gguf"), &scaling);
    support::gemma2::write_gemma2_from_gemma3(&gemma3, &out.join("gemma2.gguf"));
    println!("{}", out.display());
}
