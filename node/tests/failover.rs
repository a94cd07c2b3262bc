#![allow(clippy::unwrap_used)]
//! Failover mid-stream with real processes: `kill -9` of the serving provider while the
//! client streams; the client's stream completes and equals the uninterrupted greedy
//! output, with both providers named.

mod common;

use std::collections::HashMap;
use std::time::Instant;

use common::Process;
use futures::StreamExt;

const BODY: &str = r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Write a short poem about the sea."}], "temperature": 0, "max_tokens": 40, "stream": true}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_serving_provider_mid_stream_is_invisible_to_the_client() {
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut providers: HashMap<String, Process> = HashMap::new();
    let mut bootstrap = String::new();
    for (i, dir) in dirs[..3].iter().enumerate() {
        let join = (i > 0).then_some(bootstrap.as_str());
        let (process, ready) = common::provider(dir.path(), join, &[]);
        if i == 0 {
            bootstrap = ready["listen"][0].as_str().unwrap().to_owned();
        }
        providers.insert(ready["peer_id"].as_str().unwrap().to_owned(), process);
    }
    // The next provider in line is warmed every 4 tokens, so the resume after the kill
    // reuses its cache: the text must still equal the uninterrupted run.
    let (_gateway, http) = common::gateway(
        &bootstrap,
        dirs[3].path(),
        3,
        &["--warm-standby-every", "4"],
    );

    let client = reqwest::Client::new();
    let url = format!("http://{http}/v1/chat/completions");
    let stream_text = |response: reqwest::Response| async move {
        let mut events = Vec::new();
        let mut buffer = String::new();
        let mut body = response.bytes_stream();
        while let Some(bytes) = body.next().await {
            buffer.push_str(&String::from_utf8_lossy(&bytes.unwrap()));
            while let Some(end) = buffer.find("\n\n") {
                let event = buffer[..end].to_owned();
                buffer.drain(..end + 2);
                events.push((Instant::now(), event));
            }
        }
        events
    };
    let contents = |events: &[(Instant, String)]| -> Vec<String> {
        events
            .iter()
            .filter_map(|(_, e)| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    };

    // The uninterrupted reference.
    let response = client
        .post(&url)
        .body(BODY)
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    let reference = contents(&stream_text(response).await).concat();
    assert!(reference.len() > 40, "{reference:?}");

    // Now kill the serving provider after a few tokens.
    let response = client
        .post(&url)
        .body(BODY)
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    let serving = response.headers()["x-sharemesh-provider"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut events: Vec<(Instant, String)> = Vec::new();
    let mut killed_at = None;
    while let Some(bytes) = body.next().await {
        buffer.push_str(&String::from_utf8_lossy(&bytes.unwrap()));
        while let Some(end) = buffer.find("\n\n") {
            events.push((Instant::now(), buffer[..end].to_owned()));
            buffer.drain(..end + 2);
        }
        if killed_at.is_none() && contents(&events).len() >= 10 {
            drop(providers.remove(&serving).unwrap()); // SIGKILL, reaped
            killed_at = Some(events.len());
        }
    }
    let killed_at = killed_at.expect("the stream was long enough to kill mid-way");
    let text = contents(&events).concat();
    assert_eq!(
        text, reference,
        "the failed-over stream differs from the uninterrupted one"
    );
    let last = events
        .iter()
        .rev()
        .filter_map(|(_, e)| e.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find(|v| v.get("sharemesh").is_some())
        .unwrap();
    let served_by: Vec<&str> = last["sharemesh"]["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(served_by.len(), 2, "{served_by:?}");
    assert_eq!(served_by[0], serving);
    let gap = events[killed_at].0 - events[killed_at - 1].0;
    eprintln!(
        "failover gap seen by the client: {:.2} s after {} tokens",
        gap.as_secs_f64(),
        contents(&events[..killed_at]).len()
    );
}

/// A provider that goes silent mid-stream (adversary `stall-after:5`) is detected by
/// the gateway's stall timeout and replaced; the text equals local generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_provider_is_detected_and_replaced() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // The far cheaper provider stalls, so it is chosen first (the score also weighs
    // measured speed, which varies from run to run; a 20x price gap outweighs it).
    let (_staller, ready) = common::provider(
        dirs[0].path(),
        None,
        &["--price", "0.05", "--adversary", "stall-after:5"],
    );
    let staller_id = ready["peer_id"].as_str().unwrap().to_owned();
    let bootstrap = ready["listen"][0].as_str().unwrap().to_owned();
    let (_honest, ready) = common::provider(dirs[1].path(), Some(&bootstrap), &["--price", "1.0"]);
    let honest_id = ready["peer_id"].as_str().unwrap().to_owned();
    let (_gateway, http) = common::gateway(
        &bootstrap,
        dirs[2].path(),
        2,
        &["--stall-timeout-ms", "4000"],
    );
    let body = r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Write a short poem about the sea."}], "temperature": 0, "max_tokens": 16}"#;
    let response = reqwest::Client::new()
        .post(format!("http://{http}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    if response.status() != 200 {
        panic!(
            "status {}: {}",
            response.status(),
            response.text().await.unwrap_or_default()
        );
    }
    let providers = response.headers()["x-sharemesh-provider"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(providers, format!("{staller_id},{honest_id}"));
    let json: serde_json::Value = response.json().await.unwrap();
    let local = local_poem(dirs[2].path(), 16);
    assert_eq!(json["choices"][0]["message"]["content"], local["text"]);
    assert_eq!(json["usage"]["completion_tokens"], 16);
}

/// Bronze (interruptible) work is preempted when gold (reserved) work arrives, and the
/// bronze response finishes on another provider without a visible seam.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bronze_job_preempted_by_gold_work_finishes_elsewhere() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // The only gold provider, and by far the cheapest bronze one.
    let gold = [
        "--price",
        "0.05",
        "--tier",
        "interruptible",
        "--tier",
        "reserved",
    ];
    let (_gold, ready) = common::provider(dirs[0].path(), None, &gold);
    let gold_id = ready["peer_id"].as_str().unwrap().to_owned();
    let bootstrap = ready["listen"][0].as_str().unwrap().to_owned();
    let (_other, ready) = common::provider(
        dirs[1].path(),
        Some(&bootstrap),
        &["--price", "1.0", "--tier", "interruptible"],
    );
    let other_id = ready["peer_id"].as_str().unwrap().to_owned();
    let (_gateway, http) = common::gateway(&bootstrap, dirs[2].path(), 2, &[]);

    let client = reqwest::Client::new();
    let url = format!("http://{http}/v1/chat/completions");
    let bronze = r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Write a short poem about the sea."}], "temperature": 0, "max_tokens": 32, "stream": true, "sharemesh": {"tier": "bronze"}}"#;
    let response = client
        .post(&url)
        .header("content-type", "application/json")
        .body(bronze)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["x-sharemesh-provider"].to_str().unwrap(),
        gold_id,
        "the cheapest bronze provider serves first"
    );
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut text = String::new();
    let mut tokens = 0;
    let mut gold_answer = None;
    let mut providers = Vec::new();
    while let Some(bytes) = body.next().await {
        buffer.push_str(&String::from_utf8_lossy(&bytes.unwrap()));
        while let Some(end) = buffer.find("\n\n") {
            let event = buffer[..end].to_owned();
            buffer.drain(..end + 2);
            let Some(chunk) = event
                .strip_prefix("data: ")
                .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            else {
                continue;
            };
            if let Some(delta) = chunk["choices"][0]["delta"]["content"].as_str() {
                if !delta.is_empty() {
                    text.push_str(delta);
                    tokens += 1;
                }
            }
            if let Some(list) = chunk["sharemesh"]["providers"].as_array() {
                providers = list
                    .iter()
                    .map(|p| p.as_str().unwrap().to_owned())
                    .collect();
            }
        }
        if tokens >= 5 && gold_answer.is_none() {
            // Gold work arrives at the only reserved provider.
            let gold = r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "temperature": 0, "max_tokens": 16, "sharemesh": {"tier": "gold"}}"#;
            let (client, url) = (client.clone(), url.clone());
            gold_answer = Some(tokio::spawn(async move {
                let response = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(gold)
                    .send()
                    .await
                    .unwrap();
                response.json::<serde_json::Value>().await.unwrap()
            }));
        }
    }
    assert_eq!(
        providers,
        vec![gold_id.clone(), other_id],
        "the bronze job moved to the other provider"
    );
    let gold = gold_answer.unwrap().await.unwrap();
    assert_eq!(
        gold["choices"][0]["message"]["content"],
        "The answer to this classic math problem is 4."
    );
    assert_eq!(gold["sharemesh"]["providers"][0], gold_id.as_str());
    let local = local_poem(dirs[2].path(), 32);
    assert_eq!(
        text,
        local["text"].as_str().unwrap(),
        "the preempted response equals an uninterrupted run"
    );
}

/// The uninterrupted greedy answer to the poem prompt, from `sharemesh generate` (no
/// network), for comparison with what a client received through failovers.
fn local_poem(data_dir: &std::path::Path, max_tokens: u32) -> serde_json::Value {
    let out = std::process::Command::new(common::sharemesh_bin())
        .arg("--data-dir")
        .arg(data_dir)
        .args([
            "generate",
            "--chat",
            "--json",
            "--threads",
            "1",
            "--max-tokens",
        ])
        .arg(max_tokens.to_string())
        .args(["--prompt", "Write a short poem about the sea.", "--model"])
        .arg(common::default_model_path())
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}
