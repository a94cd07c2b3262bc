#![allow(clippy::unwrap_used)]
//! Failover mid-stream with real processes and the real model: `kill -9` of the serving
//! provider while the client streams; the client's stream completes and equals the
//! uninterrupted greedy output (exact resume of real text on another provider), with
//! both providers named. Stalls, preemption, hedging and quotes are tested on the fast
//! in-process seam (`lab.rs`).

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
            let now = Instant::now();
            events.extend(
                common::drain_events(&mut buffer)
                    .into_iter()
                    .map(|e| (now, e)),
            );
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
        let now = Instant::now();
        events.extend(
            common::drain_events(&mut buffer)
                .into_iter()
                .map(|e| (now, e)),
        );
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
