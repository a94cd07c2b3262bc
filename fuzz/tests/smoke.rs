//! Every fuzz target runs for `SHAREMESH_FUZZ_SECONDS` (default 2; CI sets 20) from a
//! fixed seed, so none can rot and any crash a run finds fails the suite with the
//! input. The tokenizer and GGUF targets read the test cache's SmolLM2 file (fetched by
//! `scripts/test`).

use std::path::PathBuf;
use std::time::Duration;

fn seconds() -> u64 {
    std::env::var("SHAREMESH_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2)
}

fn model() -> PathBuf {
    let cache = std::env::var("SHAREMESH_TEST_MODEL_CACHE").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-model-cache"),
        PathBuf::from,
    );
    cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn fuzz(name: &str) {
    let model = model();
    let mut target = sharemesh_fuzz::targets::all(Some(&model))
        .into_iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no target {name}"));
    let report = sharemesh_fuzz::run(&mut target, Duration::from_secs(seconds()), 1);
    assert!(report.executions > 0);
    eprintln!("{name}: {} executions", report.executions);
    if let Some(failure) = report.failures.first() {
        panic!(
            "{name} failed {} time(s); first: {}\ninput ({} bytes): {:02x?}",
            report.failures.len(),
            failure.message,
            failure.input.len(),
            &failure.input[..failure.input.len().min(256)]
        );
    }
}

#[test]
fn frames() {
    fuzz("frames");
}

#[test]
fn bodies() {
    fuzz("bodies");
}

#[test]
fn orderbook() {
    fuzz("orderbook");
}

#[test]
fn ledger() {
    fuzz("ledger");
}

#[test]
fn openai() {
    fuzz("openai");
}

#[test]
fn tokenizer() {
    fuzz("tokenizer");
}

#[test]
fn gguf() {
    fuzz("gguf");
}

#[test]
fn a_planted_crash_is_found() {
    let mut target = sharemesh_fuzz::Target {
        name: "planted",
        seeds: || vec![b"abcd".to_vec()],
        run: Box::new(|input: &[u8]| assert!(!input.contains(&0xff), "planted")),
    };
    let report = sharemesh_fuzz::run(&mut target, Duration::from_secs(2), 1);
    assert!(
        !report.failures.is_empty(),
        "the fuzzer misses a one-byte crash"
    );
    assert!(report.failures[0].message.contains("planted"));
}
