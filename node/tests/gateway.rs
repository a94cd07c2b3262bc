#![allow(clippy::unwrap_used)]
//! The gateway against a real provider on loopback, driven by the official `openai`
//! and `anthropic` Python SDKs and by curl.

mod common;

use std::process::Command;

use common::{get_json, start, wait_until};

const MODEL: &str = "smollm2-135m-instruct";

/// Runs one of the SDK scripts in `tests/` with `args`; fails with what it printed.
fn sdk_checks(script: &str, args: &[&str]) {
    let path = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&path)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script} checks failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
}

#[test]
fn openai_sdk_and_curl_against_a_real_gateway() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_provider, ready) = common::provider(
        dirs[0].path(),
        None,
        // Four at a time: the SDK's burst of 32 must wait for turns at the gateway.
        &["--max-concurrent", "4", "--http", "127.0.0.1:0"],
    );
    let provider_http = ready["http"].as_str().unwrap().to_owned();
    let bootstrap = ready["listen"][0].as_str().unwrap().to_owned();
    let (_gateway, http_ready) = start(
        &[
            "gateway",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--bootstrap",
            &bootstrap,
            "--http",
            "127.0.0.1:0",
            // Generous for a loaded CI host: 28 requests queue behind four slots.
            "--busy-wait-secs",
            "180",
        ],
        dirs[1].path(),
    );
    let http = http_ready["http"].as_str().unwrap().to_owned();
    // A second gateway that requires API keys.
    let key_out = Command::new(common::sharemesh_bin())
        .arg("--data-dir")
        .arg(dirs[2].path())
        .args(["keys", "create", "--name", "ci"])
        .output()
        .unwrap();
    assert!(key_out.status.success());
    let key = String::from_utf8(key_out.stdout).unwrap().trim().to_owned();
    assert!(key.starts_with("sk-sm-"));
    // A second key with its own (tiny) daily budget.
    let poor_out = Command::new(common::sharemesh_bin())
        .arg("--data-dir")
        .arg(dirs[2].path())
        .args([
            "keys",
            "create",
            "--name",
            "intern",
            "--daily-budget",
            "0.000001",
        ])
        .output()
        .unwrap();
    assert!(poor_out.status.success());
    let poor_key = String::from_utf8(poor_out.stdout)
        .unwrap()
        .trim()
        .to_owned();
    let (_keyed_gateway, keyed_ready) = start(
        &[
            "gateway",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--bootstrap",
            &bootstrap,
            "--http",
            "127.0.0.1:0",
            "--require-api-key",
        ],
        dirs[2].path(),
    );
    let keyed = keyed_ready["http"].as_str().unwrap().to_owned();
    wait_until(30, "the model on /v1/models", || {
        get_json(&http, "/v1/models")["data"][0]["id"] == MODEL
    });

    // Raw SSE framing with curl: `data: {json}` events separated by blank lines, then [DONE].
    let body = r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "temperature": 0, "stream": true}"#;
    let out = Command::new("curl")
        .args([
            "-sN",
            "-H",
            "content-type: application/json",
            "-d",
            body,
            &format!("http://{http}/v1/chat/completions"),
        ])
        .output()
        .unwrap();
    let sse = String::from_utf8(out.stdout).unwrap();
    let events: Vec<&str> = sse.split("\n\n").filter(|e| !e.trim().is_empty()).collect();
    assert_eq!(events.last().copied(), Some("data: [DONE]"), "{sse}");
    for event in &events[..events.len() - 1] {
        let json = event
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("not a data event: {event:?}"));
        let chunk: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(chunk["object"], "chat.completion.chunk");
    }
    let last: serde_json::Value =
        serde_json::from_str(events[events.len() - 2].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(last["sharemesh"]["providers"][0]
        .as_str()
        .unwrap()
        .starts_with("12D3KooW"));

    // Oversized bodies: 413 in OpenAI's error shape.
    let big = dirs[1].path().join("big.json");
    std::fs::write(
        &big,
        format!(r#"{{"model": "x", "prompt": "{}"}}"#, "a".repeat(5 << 20)),
    )
    .unwrap();
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "-H",
            "content-type: application/json",
            "--data-binary",
        ])
        .arg(format!("@{}", big.display()))
        .arg(format!("http://{http}/v1/completions"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (json, code) = text.rsplit_once('\n').unwrap();
    assert_eq!(code, "413", "{text}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(json).unwrap()["error"]["code"],
        "request_too_large"
    );

    // Malformed JSON: 400 naming the problem.
    let out = Command::new("curl")
        .args([
            "-s",
            "-d",
            "{not json",
            &format!("http://{http}/v1/chat/completions"),
        ])
        .output()
        .unwrap();
    let error: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));

    // The official SDK: chat, streaming, completions, models, errors, a burst of 32
    // concurrent requests, a disconnect mid-stream, and API keys.
    sdk_checks(
        "openai_client.py",
        &[
            &format!("http://{http}/v1"),
            MODEL,
            &format!("http://{keyed}/v1"),
            &key,
        ],
    );

    // The official Anthropic SDK on the Messages API: messages, count_tokens, stop
    // reasons, system prompts, streaming events, errors, and x-api-key.
    sdk_checks(
        "anthropic_client.py",
        &[
            &format!("http://{http}"),
            MODEL,
            &format!("http://{keyed}"),
            &key,
        ],
    );

    // Prometheus metrics on both nodes: libp2p's, the mesh's, the gateway's requests,
    // route, tokens and spend, the provider's jobs, tokens, earnings and latencies.
    let scrape = |http: &str| {
        let out = Command::new("curl")
            .args(["-s", &format!("http://{http}/metrics")])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let value = |text: &str, series: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `{series}` in the metrics:\n{text}"))
    };
    let gateway_metrics = scrape(&http);
    assert!(
        value(
            &gateway_metrics,
            r#"sharemesh_gateway_requests_total{status="200",tier="ondemand"}"#
        ) >= 10.0
    );
    assert!(
        value(
            &gateway_metrics,
            r#"sharemesh_gateway_requests_total{status="503",tier="ondemand"}"#
        ) >= 1.0
    );
    assert!(value(&gateway_metrics, "sharemesh_gateway_tokens_total") > 50.0);
    // The burst waited for capacity instead of failing.
    assert!(value(&gateway_metrics, "sharemesh_gateway_waits_total") >= 1.0);
    assert!(value(&gateway_metrics, "sharemesh_gateway_spent_nano_usd_total") > 0.0);
    assert!(value(&gateway_metrics, "sharemesh_mesh_connected_peers") >= 1.0);
    assert!(gateway_metrics.contains("sharemesh_gateway_time_to_first_token_seconds_bucket"));
    assert!(gateway_metrics.contains("libp2p_swarm_connections_established_total"));
    assert!(
        gateway_metrics.ends_with("# EOF\n"),
        "OpenMetrics ends with # EOF"
    );
    let provider_metrics = scrape(&provider_http);
    assert!(
        value(
            &provider_metrics,
            r#"sharemesh_provider_jobs_total{outcome="ended"}"#
        ) >= 10.0
    );
    assert!(value(&provider_metrics, "sharemesh_provider_tokens_served_total") > 50.0);
    assert!(
        value(
            &provider_metrics,
            "sharemesh_provider_earned_nano_usd_total"
        ) > 0.0
    );
    assert!(
        value(
            &provider_metrics,
            "sharemesh_provider_inter_token_seconds_count"
        ) > 10.0
    );
    assert!(
        value(
            &provider_metrics,
            "sharemesh_provider_engine_tokens_per_second"
        ) > 0.0
    );
    assert!(provider_metrics.contains("libp2p_gossipsub"));

    // Each job's route and price per hop.
    let jobs = get_json(&http, "/v1/jobs?limit=3");
    assert_eq!(jobs["data"].as_array().unwrap().len(), 3, "{jobs}");
    let newest = &jobs["data"][0];
    let id = newest["job_id"].as_str().unwrap();
    let job = get_json(&http, &format!("/v1/jobs/{id}"));
    assert_eq!(job["status"], "completed", "{job}");
    assert!(
        job["candidates"][0]["score"].as_f64().unwrap() > 0.0,
        "{job}"
    );
    let hop = &job["segments"][0];
    assert_eq!(hop["ended"], "completed", "{job}");
    assert!(hop["provider"].as_str().unwrap().starts_with("12D3KooW"));
    assert_eq!(
        hop["amount_nano_usd"], job["cost_nano_usd"],
        "one hop pays for all: {job}"
    );
    assert_eq!(
        get_json(&http, "/v1/jobs/00000000000000000000000000000000")["error"]["code"],
        "job_not_found"
    );
    // A key sees the jobs made with it, and only those.
    let mine = common::get_json_with_key(&keyed, "/v1/jobs", Some(&key));
    let mine = mine["data"].as_array().unwrap();
    assert!(!mine.is_empty());
    assert!(mine
        .iter()
        .all(|j| j["key"] == mine[0]["key"] && !j["key"].is_null()));

    // `sharemesh status`: the node at a glance, from its API.
    let status = Command::new(common::sharemesh_bin())
        .args(["status", "--node", &format!("http://{http}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{text}");
    assert!(
        text.contains("1 providers offering smollm2-135m-instruct"),
        "{text}"
    );
    assert!(
        text.contains("spent") && text.contains("completed"),
        "{text}"
    );
    let gone = Command::new(common::sharemesh_bin())
        .args(["status", "--node", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no node answers at"));

    // The key with its own budget is refused before any work starts.
    let out = Command::new("curl")
        .args(["-s", "-H", &format!("Authorization: Bearer {poor_key}"), "-H", "content-type: application/json", "-d"])
        .arg(r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}"#)
        .arg(format!("http://{keyed}/v1/chat/completions"))
        .output()
        .unwrap();
    let refused: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        refused["error"]["code"], "insufficient_balance",
        "{refused}"
    );
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("API key intern"));

    // The terminal playground keeps a conversation and reports speed and cost.
    let mut chat = Command::new(common::sharemesh_bin())
        .args([
            "chat",
            "--gateway",
            &format!("http://{http}"),
            "--max-tokens",
            "16",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let stdin = chat.stdin.as_mut().unwrap();
        stdin.write_all(b"What is 2 + 2?\n/quit\n").unwrap();
    }
    let out = chat.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("The answer is 4."),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = String::from_utf8_lossy(&out.stderr);
    assert!(
        status.contains("tok/s") && status.contains("served by 12D3KooW"),
        "{status}"
    );

    // The disconnected stream (400 tokens asked, ~10 tokens/s) must stop the provider's
    // work: its advertised load falls back to zero within seconds, not tens of seconds.
    wait_until(8, "the provider to drop the abandoned job", || {
        let providers = get_json(&http, "/v1/network/providers");
        providers[0]["load"]["active_jobs"] == 0 && providers[0]["load"]["queue_depth"] == 0
    });
}

/// One process can both serve and buy: `provide --openai` answers the OpenAI API from
/// its own engine when it is the best (or only) provider.
#[test]
fn a_provider_can_also_be_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, http_ready) =
        common::provider(dir.path(), None, &["--http", "127.0.0.1:0", "--openai"]);
    let http = http_ready["http"].as_str().unwrap().to_owned();
    wait_until(30, "its own model on /v1/models", || {
        get_json(&http, "/v1/models")["data"][0]["id"] == MODEL
    });
    let body = r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "temperature": 0}"#;
    let out = Command::new("curl")
        .args([
            "-s",
            "-d",
            body,
            &format!("http://{http}/v1/chat/completions"),
        ])
        .output()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"], "The answer is 4.",
        "{answer}"
    );
}
