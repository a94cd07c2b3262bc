#![allow(clippy::unwrap_used)]
//! `sharemesh models fetch --hf`: a real download from a local HTTP server that the
//! test starts (no hub is reachable here), resumed from a partial file, sha256-checked.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

#[derive(Clone)]
struct Hub {
    file: Arc<Vec<u8>>,
    ranged: Arc<AtomicUsize>,
}

async fn resolve(
    State(hub): State<Hub>,
    Path((_org, _repo, _rev, _file)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let start = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.trim_end_matches('-').parse::<usize>().ok());
    match start {
        Some(start) if start < hub.file.len() => {
            hub.ranged.fetch_add(1, Ordering::SeqCst);
            let range = format!("bytes {start}-{}/{}", hub.file.len() - 1, hub.file.len());
            (
                StatusCode::PARTIAL_CONTENT,
                [(header::CONTENT_RANGE, range)],
                hub.file[start..].to_vec(),
            )
                .into_response()
        }
        _ => (StatusCode::OK, hub.file.to_vec()).into_response(),
    }
}

fn fetch(data_dir: &std::path::Path, endpoint: &str, sha256: &str) -> std::process::Output {
    Command::new(common::sharemesh_bin())
        .arg("--data-dir")
        .arg(data_dir)
        .args([
            "models",
            "fetch",
            "--hf",
            "org/model-GGUF",
            "--file",
            "model.gguf",
            "--sha256",
            sha256,
            "--hf-endpoint",
            endpoint,
            "smol-from-hub",
        ])
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_download_resumes_and_verifies() {
    let bytes = std::fs::read(common::default_model_path()).unwrap();
    let hub = Hub {
        file: Arc::new(bytes.clone()),
        ranged: Arc::new(AtomicUsize::new(0)),
    };
    let app = Router::new()
        .route("/{org}/{repo}/resolve/{rev}/{file}", get(resolve))
        .with_state(hub.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let data = tempfile::tempdir().unwrap();
    let models = data.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    // An earlier attempt left the first third behind.
    std::fs::write(models.join("model.gguf.part"), &bytes[..bytes.len() / 3]).unwrap();
    let out = tokio::task::spawn_blocking({
        let (dir, endpoint) = (data.path().to_owned(), endpoint.clone());
        move || fetch(&dir, &endpoint, common::DEFAULT_MODEL_SHA256)
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        hub.ranged.load(Ordering::SeqCst),
        1,
        "the download resumed with a Range request"
    );
    assert_eq!(std::fs::read(models.join("model.gguf")).unwrap(), bytes);
    let list = Command::new(common::sharemesh_bin())
        .arg("--data-dir")
        .arg(data.path())
        .args(["models", "list", "--json"])
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(list[0]["name"], "smol-from-hub");
    assert_eq!(list[0]["id"], common::DEFAULT_MODEL_ID);
    assert_eq!(list[0]["architecture"], "llama");
    assert_eq!(list[0]["quantization"], "Q4_1");
    assert_eq!(list[0]["context_length"], 8192);
    for key in ["path", "size_bytes"] {
        assert!(list[0].get(key).is_some(), "models list --json lacks {key}");
    }

    // A wrong checksum is refused and the bad file is not kept.
    let other = tempfile::tempdir().unwrap();
    let wrong = "00".repeat(32);
    let out = tokio::task::spawn_blocking({
        let (dir, endpoint) = (other.path().to_owned(), endpoint.clone());
        move || fetch(&dir, &endpoint, &wrong)
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected 0000"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!other.path().join("models/model.gguf").exists());
    server.abort();
}

/// `models check` says on one screen whether a file serves and why not, and exits 1 when
/// it does not (the header's reasons themselves: `engine/tests/check.rs`).
#[test]
fn models_check_gives_a_verdict_and_an_exit_status() {
    let data = tempfile::tempdir().unwrap();
    let check = |path: &std::path::Path, json: bool| {
        let mut command = Command::new(common::sharemesh_bin());
        command
            .arg("--data-dir")
            .arg(data.path())
            .args(["models", "check"])
            .arg(path);
        if json {
            command.arg("--json");
        }
        command.output().unwrap()
    };
    let out = check(&common::default_model_path(), false);
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{screen}");
    assert!(
        screen.contains("will serve, on the sharemesh kernels"),
        "{screen}"
    );
    for line in [
        "tokenizer     gpt2 (pre-tokenizer smollm), 49152 tokens",
        "Q4_1 ×",
    ] {
        assert!(screen.contains(line), "no {line:?} in {screen}");
    }
    let out = check(&common::default_model_path(), true);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["runs_on"], "kernels");
    assert_eq!(json["memory"]["kv_bytes_per_token"], 23_040);

    let bad = data.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF but not really").unwrap();
    let out = check(&bad, false);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.gguf"), "{stderr}");
}
