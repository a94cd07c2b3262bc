#![allow(clippy::unwrap_used)]
//! The reverse auction on a real testnet: the gateway asks providers for quotes and a
//! busy cheap provider's quoted queue wait sends the next request to a free one, where
//! the advert alone (busy provider still under its concurrency limit, nothing queued)
//! would have chosen the cheap one.

mod common;

/// The gateway's `--quote-k` (with "0" this test fails: checked when it was written).
const QUOTE_K: &str = "4";

fn body(max_tokens: u32, stream: bool) -> String {
    format!(
        r#"{{"model": "smollm2-135m-instruct", "messages": [{{"role": "user", "content": "Write a long story about the sea."}}], "temperature": 0, "max_tokens": {max_tokens}, "stream": {stream}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quoted_queue_wait_moves_work_to_a_free_provider() {
    use futures::StreamExt;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // Cheap (0.10 USD/Mtok) and slightly dearer (0.13): 30 nano-USD a token apart, ~1,000
    // for the second request. The cheap provider's quote counts the ~250 tokens it has
    // promised to the long job: tens of seconds of queue, worth tens of thousands of
    // nano-USD at the default 1,000 a second.
    let terms = |price| ["--max-concurrent", "2", "--price", price];
    let (_cheap, cheap_ready) = common::provider(dirs[0].path(), None, &terms("0.10"));
    let bootstrap = cheap_ready["listen"][0].as_str().unwrap().to_owned();
    let cheap_id = cheap_ready["peer_id"].as_str().unwrap().to_owned();
    // A patient gateway: without quotes the second request would wait behind the long
    // job on the cheap provider (and be served there) rather than be failed over.
    let (_gateway, http) = common::gateway(
        &bootstrap,
        dirs[2].path(),
        1,
        &["--stall-timeout-ms", "120000", "--quote-k", QUOTE_K],
    );
    let client = reqwest::Client::new();
    let url = format!("http://{http}/v1/chat/completions");

    // Keep the cheap provider (alone in the market so far) busy with a long stream.
    let long = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body(250, true))
        .send()
        .await
        .unwrap();
    assert_eq!(long.headers()["x-sharemesh-provider"], cheap_id.as_str());
    let mut long = long.bytes_stream();
    let _ = long.next().await; // The job is running.

    let (_dear, dear_ready) = common::provider(dirs[1].path(), Some(&bootstrap), &terms("0.13"));
    let dear_id = dear_ready["peer_id"].as_str().unwrap().to_owned();
    common::wait_until(40, "both providers at the gateway", || {
        common::get_json(&http, "/v1/network/providers")
            .as_array()
            .map_or(0, Vec::len)
            == 2
    });
    // The cheap provider's advert says one job running, none queued, under its limit of
    // two: by adverts alone it stays the best. Its quote says how long the wait is.
    let asked = std::time::Instant::now();
    let second = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body(32, false))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 200);
    // Without quotes the gateway sends it to the cheap provider, waits out the 30 s
    // answer timeout there, and only then fails over to the same dear provider; the
    // header alone would not tell the difference.
    let took = asked.elapsed();
    assert!(
        took < std::time::Duration::from_secs(25),
        "took {took:?}: the request went to the busy provider first"
    );
    assert_eq!(
        second.headers()["x-sharemesh-provider"],
        dear_id.as_str(),
        "the busy cheap provider's quote should have lost"
    );
    drop(long);
}

/// Gold's hedged start: the same job starts on the two best providers and the first to
/// answer serves it. The cheaper one (ranked first) never sends a token (adversary
/// `stall-after:0`); the gateway's stall timeout is long, so without the hedge the
/// client would wait two minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_gold_request_is_served_by_the_first_to_answer() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let gold = ["--tier", "reserved", "--price"];
    let (_silent, ready) = common::provider(
        dirs[0].path(),
        None,
        &[&gold[..], &["0.05", "--adversary", "stall-after:0"]].concat(),
    );
    let bootstrap = ready["listen"][0].as_str().unwrap().to_owned();
    let (_honest, ready) = common::provider(
        dirs[1].path(),
        Some(&bootstrap),
        &[&gold[..], &["0.1"]].concat(),
    );
    let honest_id = ready["peer_id"].as_str().unwrap().to_owned();
    let (_gateway, http) = common::gateway(
        &bootstrap,
        dirs[2].path(),
        2,
        &["--stall-timeout-ms", "120000", "--hedge-gold"],
    );
    let asked = std::time::Instant::now();
    let response = reqwest::Client::new()
        .post(format!("http://{http}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "temperature": 0, "max_tokens": 16, "sharemesh": {"tier": "gold"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["x-sharemesh-provider"],
        honest_id.as_str()
    );
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        json["choices"][0]["message"]["content"],
        "The answer to this classic math problem is 4."
    );
    let took = asked.elapsed();
    assert!(
        took < std::time::Duration::from_secs(60),
        "took {took:?}: the silent provider was waited for"
    );
}
