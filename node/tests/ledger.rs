#![allow(clippy::unwrap_used)]
//! Metering across real processes: every provider's earnings equal what the buyer's
//! ledger says it paid that provider and the sum of final receipts; budgets refuse
//! work with 402; `kill -9` of providers and the gateway mid-stream leaves consistent
//! books.

mod common;

use std::path::Path;
use std::process::Command;

use common::{get_json, start, wait_until, Process};

fn report(data_dir: &Path, what: &str) -> serde_json::Value {
    let out = Command::new(common::sharemesh_bin())
        .arg("--data-dir")
        .arg(data_dir)
        .args([what, "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn post(http: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let out = Command::new("curl")
        .args([
            "-s",
            "-w",
            "\n%{http_code}",
            "-H",
            "content-type: application/json",
            "-d",
            &body.to_string(),
        ])
        .arg(format!("http://{http}/v1/chat/completions"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (json, code) = text.rsplit_once('\n').unwrap();
    (
        code.parse().unwrap(),
        serde_json::from_str(json).unwrap_or(serde_json::Value::Null),
    )
}

/// Starts a provider; returns it, its peer id, its listen address and its HTTP address.
fn provider(
    dir: &Path,
    region: &str,
    price: &str,
    bootstrap: Option<&str>,
) -> (Process, String, String, String) {
    // Port 0: the provider binds a free port itself and reports it, so no other test
    // can take the port between choosing and binding it.
    let (process, ready) = common::provider(
        dir,
        bootstrap,
        &[
            "--region",
            region,
            "--price",
            price,
            "--http",
            "127.0.0.1:0",
        ],
    );
    (
        process,
        ready["peer_id"].as_str().unwrap().to_owned(),
        ready["listen"][0].as_str().unwrap().to_owned(),
        ready["http"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn books_agree_across_providers_budgets_hold_and_crashes_keep_them_consistent() {
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let (eu, eu_id, bootstrap, eu_http) = provider(dirs[0].path(), "eu", "0.1", None);
    let (us, us_id, _, us_http) = provider(dirs[1].path(), "us", "0.2", Some(&bootstrap));
    // The books of answers alone: checks bought from providers are spend (and
    // earnings) too, on a line of their own (`tests/verify_process.rs`).
    let (gateway, http_ready) = start(
        &[
            "gateway",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--bootstrap",
            &bootstrap,
            "--http",
            "127.0.0.1:0",
            "--no-verify",
        ],
        dirs[2].path(),
    );
    let http = http_ready["http"].as_str().unwrap().to_owned();
    wait_until(40, "both providers at the gateway", || {
        get_json(&http, "/v1/network/providers")
            .as_array()
            .map_or(0, Vec::len)
            == 2
    });

    // Four jobs, two per region (so two providers at two prices).
    let mut paid = 0u64;
    for (i, region) in ["eu", "us", "eu", "us"].iter().enumerate() {
        let (code, body) = post(
            &http,
            serde_json::json!({"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": format!("Say hello {i}")}],
                               "temperature": 0, "max_tokens": 6, "sharemesh": {"region": region}}),
        );
        assert_eq!(code, 200, "{body}");
        paid += body["sharemesh"]["cost_nano_usd"].as_u64().unwrap();
    }
    // Providers book the final receipt as it arrives; wait for both to have all of it.
    let spend_live = || get_json(&http, "/v1/account/spend");
    wait_until(10, "providers to book every final receipt", || {
        let spend = spend_live();
        [(&eu_http, &eu_id), (&us_http, &us_id)]
            .iter()
            .all(|(provider_http, id)| {
                let earned = get_json(provider_http, "/v1/account/earnings")["total"]
                    ["amount_nano_usd"]
                    .as_u64();
                earned.is_some()
                    && earned == spend["per_counterparty"][id.as_str()]["amount_nano_usd"].as_u64()
            })
    });
    assert_eq!(
        spend_live()["total"]["amount_nano_usd"].as_u64().unwrap(),
        paid,
        "the buyer's books equal the receipts it paid"
    );
    // Stop everything the hard way, then read the books offline.
    drop((eu, us, gateway));
    let spend = report(dirs[2].path(), "spend");
    let mut earned_total = 0;
    for (dir, id) in [(dirs[0].path(), &eu_id), (dirs[1].path(), &us_id)] {
        let earnings = report(dir, "earnings");
        let earned = earnings["total"]["amount_nano_usd"].as_u64().unwrap();
        assert!(earned > 0);
        assert_eq!(
            earned,
            spend["per_counterparty"][id.as_str()]["amount_nano_usd"]
                .as_u64()
                .unwrap(),
            "provider {id} vs the buyer's ledger"
        );
        assert_eq!(earnings["total"]["jobs"], 2);
        earned_total += earned;
    }
    assert_eq!(
        earned_total, paid,
        "earnings = spend = sum of final receipts"
    );
    assert!(
        spend["per_model"]["smollm2-135m-instruct"].is_object(),
        "{spend}"
    );
    assert!(spend["ttft_ms"]["p50"].as_f64().unwrap() > 0.0);

    // Crashes mid-stream: kill -9 the serving provider, then the gateway, while streaming.
    let (eu, _, bootstrap, _) = provider(dirs[0].path(), "eu", "0.1", None);
    let (us, _, _, _) = provider(dirs[1].path(), "eu", "0.1", Some(&bootstrap));
    let (gateway, _) = start(
        &[
            "gateway",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--bootstrap",
            &bootstrap,
            "--http",
            &http,
        ],
        dirs[2].path(),
    );
    wait_until(40, "providers after restart", || {
        get_json(&http, "/v1/network/providers")
            .as_array()
            .map_or(0, Vec::len)
            == 2
    });
    let body = r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Write a long story."}], "temperature": 0, "max_tokens": 60, "stream": true}"#;
    let mut curl = Command::new("curl")
        .args([
            "-sN",
            "-H",
            "content-type: application/json",
            "-d",
            body,
            &format!("http://{http}/v1/chat/completions"),
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(6));
    drop(eu); // kill -9 one of the two providers (the serving one, or the failover target)
    std::thread::sleep(std::time::Duration::from_secs(5));
    drop(gateway);
    let _ = curl.kill();
    let _ = curl.wait();
    drop(us);
    // Books reopen, every receipt re-verifies, and no provider holds more than the buyer.
    let spend = report(dirs[2].path(), "spend");
    for (dir, id) in [(dirs[0].path(), &eu_id), (dirs[1].path(), &us_id)] {
        let earned = report(dir, "earnings")["total"]["amount_nano_usd"]
            .as_u64()
            .unwrap();
        let owed = spend["per_counterparty"][id.as_str()]["amount_nano_usd"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            earned <= owed,
            "provider {id} booked {earned} but the buyer only {owed}"
        );
    }
    assert!(spend["total"]["amount_nano_usd"].as_u64().unwrap() >= paid);

    // Budgets: a gateway with a tiny daily budget refuses before any work starts.
    let (eu, _, bootstrap, _) = provider(dirs[0].path(), "eu", "0.1", None);
    let (_poor_gateway, poor_ready) = start(
        &[
            "gateway",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--bootstrap",
            &bootstrap,
            "--http",
            "127.0.0.1:0",
            "--daily-budget",
            "0.000001",
        ],
        dirs[3].path(),
    );
    let poor = poor_ready["http"].as_str().unwrap().to_owned();
    wait_until(40, "the provider at the budgeted gateway", || {
        get_json(&poor, "/v1/network/providers")
            .as_array()
            .map_or(0, Vec::len)
            == 1
    });
    let (code, body) = post(
        &poor,
        serde_json::json!({"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}),
    );
    assert_eq!(code, 402, "{body}");
    assert_eq!(body["error"]["code"], "insufficient_balance");
    drop(eu);
}
