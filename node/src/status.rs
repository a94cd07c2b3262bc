//! `sharemesh status`: a running node at a glance, read from its HTTP API (health,
//! peers, the order book, its books, what it verified, its recent jobs).

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Value};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The node's HTTP API (`--http` of `provide` or `gateway`).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub node: String,
    /// An API key, where the node requires one.
    #[arg(long, env = "SHAREMESH_API_KEY")]
    pub api_key: Option<String>,
    /// Print everything gathered as JSON instead of the summary.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: StatusArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let status = runtime.block_on(gather(&args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", summary(&status));
    }
    Ok(())
}

/// Every view the node answers (`null` for one it does not serve, e.g. a provider
/// without a gateway has no jobs).
async fn gather(args: &StatusArgs) -> Result<Value> {
    let node = args.node.trim_end_matches('/');
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let get = |path: &'static str| {
        let mut request = client.get(format!("{node}{path}"));
        if let Some(key) = &args.api_key {
            request = request.bearer_auth(key);
        }
        async move {
            let response = request.send().await?;
            let status = response.status();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            Ok::<_, reqwest::Error>(if status.is_success() {
                body
            } else {
                Value::Null
            })
        }
    };
    let health = get("/health").await.with_context(|| {
        format!("no node answers at {node} (is it running, with --http on that address?)")
    })?;
    if health.is_null() {
        anyhow::bail!("{node} refused the status request (an API key? --api-key)");
    }
    let view = |v: Result<Value, reqwest::Error>| v.unwrap_or(Value::Null);
    Ok(json!({
        "node": node,
        "health": health,
        "peers": view(get("/v1/network/peers").await),
        "providers": view(get("/v1/network/providers").await),
        "earnings": view(get("/v1/account/earnings").await),
        "spend": view(get("/v1/account/spend").await),
        "trust": view(get("/v1/trust").await),
        "jobs": view(get("/v1/jobs?limit=5").await),
    }))
}

fn usd(nano: &Value) -> String {
    format!("${:.6}", nano.as_u64().unwrap_or(0) as f64 / 1e9)
}

fn count(value: &Value) -> usize {
    value.as_array().map_or(0, Vec::len)
}

/// The gathered views as a few lines.
fn summary(status: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "node      {} at {}",
        status["health"]["peer_id"].as_str().unwrap_or("?"),
        status["node"].as_str().unwrap_or("?")
    );
    let mut models: Vec<&str> = status["providers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["models"].as_array().into_iter().flatten())
        .filter_map(|m| m["name"].as_str())
        .collect();
    models.sort_unstable();
    models.dedup();
    let _ = writeln!(
        out,
        "mesh      {} peers, {} providers offering {}",
        count(&status["peers"]),
        count(&status["providers"]),
        if models.is_empty() {
            "nothing".to_owned()
        } else {
            models.join(", ")
        }
    );
    for (side, label) in [("earnings", "earned"), ("spend", "spent")] {
        let report = &status[side];
        if report["total"]["jobs"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        let settlement = &report["settlement"];
        let _ = writeln!(
            out,
            "{label:<9} {} over {} jobs, {} tokens (pending {}, final {}, voided {})",
            usd(&report["total"]["amount_nano_usd"]),
            report["total"]["jobs"],
            report["total"]["tokens"],
            usd(&settlement["pending_nano_usd"]),
            usd(&settlement["final_nano_usd"]),
            usd(&settlement["voided_nano_usd"]),
        );
    }
    let trust = &status["trust"];
    if !trust.is_null() {
        let verified: u64 = trust["verified_jobs"]
            .as_object()
            .map_or(0, |v| v.values().filter_map(Value::as_u64).sum());
        let _ = writeln!(
            out,
            "trust     {verified} jobs verified, {} providers dropped for fraud, {} suspected",
            count(&trust["dropped_for_fraud"]),
            count(&trust["suspected"]),
        );
    }
    let jobs = status["jobs"]["data"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !jobs.is_empty() {
        let _ = writeln!(out, "jobs      (newest first)");
    }
    for job in &jobs {
        let hops: Vec<String> = job["segments"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                let provider = s["provider"].as_str().unwrap_or("?");
                let short = provider
                    .get(provider.len().saturating_sub(6)..)
                    .unwrap_or(provider);
                format!("…{short} {}", s["ended"].as_str().unwrap_or("?"))
            })
            .collect();
        let _ = writeln!(
            out,
            "  {} {:<9} {:>5} tokens {}  {}",
            job["job_id"].as_str().unwrap_or("?"),
            job["status"].as_str().unwrap_or("?"),
            job["completion_tokens"],
            usd(&job["cost_nano_usd"]),
            hops.join(" → ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_names_the_node_its_mesh_its_money_and_its_jobs() {
        let status = json!({
            "node": "http://127.0.0.1:8080",
            "health": {"status": "ok", "peer_id": "12D3KooWabc"},
            "peers": [{}, {}],
            "providers": [{"models": [{"name": "smollm2-135m-instruct"}]}],
            "earnings": {"total": {"jobs": 0}},
            "spend": {"total": {"jobs": 3, "tokens": 30, "amount_nano_usd": 4600},
                      "settlement": {"pending_nano_usd": 4600, "final_nano_usd": 0, "voided_nano_usd": 0}},
            "trust": {"verified_jobs": {"a": 2, "b": 1}, "dropped_for_fraud": ["x"], "suspected": []},
            "jobs": {"data": [{"job_id": "j1", "status": "completed", "completion_tokens": 10,
                               "cost_nano_usd": 1500,
                               "segments": [{"provider": "12D3KooWstalls", "ended": "failover: stalled"},
                                            {"provider": "12D3KooWserves", "ended": "completed"}]}]},
        });
        let text = summary(&status);
        assert!(
            text.contains("12D3KooWabc at http://127.0.0.1:8080"),
            "{text}"
        );
        assert!(
            text.contains("2 peers, 1 providers offering smollm2-135m-instruct"),
            "{text}"
        );
        assert!(text.contains("spent     $0.000005 over 3 jobs"), "{text}");
        assert!(!text.contains("earned"), "{text}");
        assert!(
            text.contains("3 jobs verified, 1 providers dropped"),
            "{text}"
        );
        assert!(
            text.contains("…stalls failover: stalled → …serves completed"),
            "{text}"
        );
    }
}
