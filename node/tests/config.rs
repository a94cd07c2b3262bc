#![allow(clippy::unwrap_used)]
//! config.toml < SHAREMESH_* environment < flags, on a real `sharemesh generate`.

mod common;

use std::process::Command;

fn completion_tokens(data_dir: &std::path::Path, env: &[(&str, &str)], extra: &[&str]) -> u64 {
    let model = common::default_model_path();
    let mut cmd = Command::new(common::sharemesh_bin());
    cmd.arg("--data-dir").arg(data_dir).args([
        "generate",
        "--json",
        "--threads",
        "1",
        "--prompt",
        "The capital of France is",
        "--model",
    ]);
    cmd.arg(&model).args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["completion_tokens"].as_u64().unwrap()
}

#[test]
fn file_then_environment_then_flags() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(
        data.path().join("config.toml"),
        "[generate]\nmax_tokens = 3\n[provide]\nmax_tokens = 9\n",
    )
    .unwrap();
    assert_eq!(
        completion_tokens(data.path(), &[], &[]),
        3,
        "the [generate] table applies"
    );
    assert_eq!(
        completion_tokens(data.path(), &[("SHAREMESH_MAX_TOKENS", "2")], &[]),
        2,
        "env beats the file"
    );
    assert_eq!(
        completion_tokens(
            data.path(),
            &[("SHAREMESH_MAX_TOKENS", "2")],
            &["--max-tokens", "1"]
        ),
        1,
        "flags beat env"
    );

    let show = Command::new(common::sharemesh_bin())
        .arg("--data-dir")
        .arg(data.path())
        .args(["config", "show", "generate"])
        .output()
        .unwrap();
    let text = String::from_utf8(show.stdout).unwrap();
    assert!(text.contains("max_tokens = \"3\"  # config file"), "{text}");

    std::fs::write(data.path().join("config.toml"), "[generate\nmax_tokens = 3").unwrap();
    let out = Command::new(common::sharemesh_bin())
        .arg("--data-dir")
        .arg(data.path())
        .args(["config", "show"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not valid TOML"));
}
