#![allow(clippy::unwrap_used)]
//! The reverse auction on a real testnet: the gateway asks providers for quotes and a
//! busy cheap provider's quoted queue wait sends the next request to a free one, where
//! the advert alone (busy provider still under its concurrency limit, nothing queued)
//! would have chosen the cheap one.

mod common;

use std::time::Duration;

const QUOTE_K: &str = "4";

fn body(max_tokens: u32, stream: bool) -> String {
    format!(
        r#"{{"model": "smollm2-135m-instruct", "messages": [{{"role": "user", "content": "Write a long story about the sea."}}], "temperature": 0, "max_tokens": {max_tokens}, "stream": {stream}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quoted_queue_wait_moves_work_to_a_free_provider() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // Cheap (0.10 USD/Mtok) and slightly dearer (0.12): 20 nano-USD a token apart.
    let terms = |price| ["--max-concurrent", "2", "--price", price];
    let (_cheap, cheap_ready) = common::provider(dirs[0].path(), None, &terms("0.10"));
    let bootstrap = cheap_ready["listen"][0].as_str().unwrap().to_owned();
    let (_dear, dear_ready) = common::provider(dirs[1].path(), Some(&bootstrap), &terms("0.12"));
    let cheap_id = cheap_ready["peer_id"].as_str().unwrap().to_owned();
    let dear_id = dear_ready["peer_id"].as_str().unwrap().to_owned();
    // A patient gateway: without quotes the second request would wait behind the long
    // job on the cheap provider (and be served there) rather than be failed over.
    let (_gateway, http) = common::gateway(
        &bootstrap,
        dirs[2].path(),
        2,
        &["--stall-timeout-ms", "120000", "--quote-k", QUOTE_K],
    );
    let client = reqwest::Client::new();
    let url = format!("http://{http}/v1/chat/completions");

    // Idle market: the cheap provider wins.
    let first = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body(4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["x-sharemesh-provider"], cheap_id.as_str());
    let _ = first.bytes().await;

    // Keep the cheap provider busy with a long stream.
    let long = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body(400, true))
        .send()
        .await
        .unwrap();
    assert_eq!(long.headers()["x-sharemesh-provider"], cheap_id.as_str());
    let mut long = long.bytes_stream();
    use futures::StreamExt;
    let _ = long.next().await; // The job is running.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // 64 tokens behind a ~64-token-long job at ~10 tok/s is seconds of queue, worth more
    // (at 1,000 nano-USD a second) than the 1,280 nano-USD the cheap provider saves.
    let second = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body(64, false))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(
        second.headers()["x-sharemesh-provider"],
        dear_id.as_str(),
        "the busy cheap provider's quote should have lost"
    );
    drop(long);
}
