#![allow(clippy::unwrap_used)]
//! Failover mid-stream with real processes and the real model: `kill -9` of the serving
//! provider while the client streams; the client's stream completes and equals the
//! uninterrupted greedy output (exact resume of real text on another provider), with
//! both providers named. Stalls, preemption, hedging and quotes are tested on the fast
//! in-process seam (`lab.rs`).

mod common;

use std::collections::HashMap;

use common::Process;

/// Text pieces streamed before the serving provider is killed.
const KILL_AFTER: usize = 10;

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

    // The uninterrupted reference.
    let reference = common::stream_chat(&http, BODY.into(), None)
        .await
        .pieces()
        .0
        .concat();
    assert!(reference.len() > 40, "{reference:?}");

    // Now kill the serving provider after a few tokens.
    let streamed =
        common::stream_chat(&http, BODY.into(), Some((&mut providers, KILL_AFTER))).await;
    let killed_at = streamed
        .killed_at
        .expect("the stream was long enough to kill mid-way");
    let (pieces, trailer) = streamed.pieces();
    assert_eq!(
        pieces.concat(),
        reference,
        "the failed-over stream differs from the uninterrupted one"
    );
    let trailer = trailer.unwrap();
    let served_by: Vec<&str> = trailer["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(served_by.len(), 2, "{served_by:?}");
    assert_eq!(served_by[0], streamed.serving);
    let events = &streamed.events;
    let gap = events[killed_at].0 - events[killed_at - 1].0;
    eprintln!(
        "failover gap seen by the client: {:.2} s after {KILL_AFTER} pieces of text",
        gap.as_secs_f64()
    );
}
