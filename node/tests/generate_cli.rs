#![allow(clippy::unwrap_used)]
//! `sharemesh generate` in real processes: the same tokens at one and two threads, and
//! exact resume from every cut at two threads (the engine's own tests are in
//! `engine/tests`).

mod common;

use std::process::Command;

use serde_json::Value;

/// Real processes: identical greedy output at 1 and 2 threads, and the JSON shape.
#[test]
fn cli_generate_is_identical_across_thread_counts() {
    let path = common::default_model_path();
    let data = tempfile::tempdir().unwrap();
    let run = |threads: &str| -> Value {
        let out = Command::new(common::sharemesh_bin())
            .arg("--data-dir")
            .arg(data.path())
            .args([
                "generate",
                "--chat",
                "--max-tokens",
                "24",
                "--json",
                "--threads",
                threads,
                "--prompt",
                "What is 2 + 2?",
                "--model",
            ])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let one = run("1");
    let two = run("2");
    assert_eq!(one["text"], "The answer is 4.");
    assert_eq!(one["token_ids"], two["token_ids"]);
    for key in [
        "text",
        "token_ids",
        "prompt_tokens",
        "load_seconds",
        "prefill_tokens_per_second",
        "generation_tokens_per_second",
    ] {
        assert!(one.get(key).is_some(), "missing {key}");
    }
    // A CPU build serves llama on sharemesh's own kernels.
    assert_eq!(one["backend"], "cpu/sharemesh-kernels");
}

/// Resume at 2 threads, in real processes: every cut of a 12-token answer continues
/// exactly as the uninterrupted run.
#[test]
fn cli_resume_at_two_threads_is_exact() {
    let path = common::default_model_path();
    let data = tempfile::tempdir().unwrap();
    let run = |resume: &[u64]| -> Vec<u64> {
        let mut cmd = Command::new(common::sharemesh_bin());
        cmd.arg("--data-dir").arg(data.path()).args([
            "generate",
            "--chat",
            "--max-tokens",
            "12",
            "--json",
            "--threads",
            "2",
            "--prompt",
            "Explain what a CPU does in two sentences.",
            "--model",
        ]);
        cmd.arg(&path);
        if !resume.is_empty() {
            let list: Vec<String> = resume.iter().map(u64::to_string).collect();
            cmd.arg("--resume").arg(list.join(","));
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: Value = serde_json::from_slice(&out.stdout).unwrap();
        json["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    let full = run(&[]);
    assert_eq!(full.len(), 12);
    for cut in [1, 4, 7, 11] {
        assert_eq!(run(&full[..cut]), full, "resume at {cut}");
    }
}

/// `bench --streams` measures the aggregate decode speed of several streams decoding
/// together (what `scripts/check-cuda` reports per GPU), one figure per count, on the
/// kernels and on candle's paged graph; a count of zero is a clear error.
#[test]
fn bench_measures_streams_decoding_together() {
    let path = common::default_model_path();
    let data = tempfile::tempdir().unwrap();
    let run = |backend: &str, streams: &str| {
        Command::new(common::sharemesh_bin())
            .env("SHAREMESH_KERNELS", backend)
            .arg("--data-dir")
            .arg(data.path())
            .args([
                "bench",
                "--tokens",
                "4",
                "--runs",
                "1",
                "--json",
                "--threads",
                "2",
            ])
            .args(["--streams", streams, "--model"])
            .arg(&path)
            .output()
            .unwrap()
    };
    for (backend, shown) in [
        ("kernels", "cpu/sharemesh-kernels"),
        ("candle", "cpu/candle"),
    ] {
        let out = run(backend, "1,3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(result["backend"], shown);
        let batched = result["batched"].as_array().unwrap();
        let counts: Vec<u64> = batched
            .iter()
            .map(|b| b["streams"].as_u64().unwrap())
            .collect();
        assert_eq!(counts, [1, 3]);
        assert!(batched
            .iter()
            .all(|b| b["tokens_per_second"].as_f64().unwrap() > 0.0));
    }
    let out = run("kernels", "0");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing to measure"), "{err}");
}

/// `--device cpu` runs on the CPU whatever the build; `--device cuda` in a build without
/// CUDA is an error saying so, not a silent CPU run; an unknown device is refused.
#[test]
fn the_device_is_chosen_or_refused_by_name() {
    let path = common::default_model_path();
    let data = tempfile::tempdir().unwrap();
    let run = |device: &str| {
        Command::new(common::sharemesh_bin())
            .arg("--data-dir")
            .arg(data.path())
            .args(["generate", "--max-tokens", "2", "--json", "--prompt", "Hi"])
            .args(["--device", device, "--model"])
            .arg(&path)
            .output()
            .unwrap()
    };
    let cpu = run("cpu");
    assert!(
        cpu.status.success(),
        "{}",
        String::from_utf8_lossy(&cpu.stderr)
    );
    let result: Value = serde_json::from_slice(&cpu.stdout).unwrap();
    assert_eq!(result["backend"], "cpu/sharemesh-kernels");
    let cuda = run("cuda");
    assert!(!cuda.status.success());
    let err = String::from_utf8_lossy(&cuda.stderr);
    assert!(err.contains("--device") && err.contains("no CUDA"), "{err}");
    let unknown = run("tpu");
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("tpu"));
}
