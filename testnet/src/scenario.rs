//! `sharemesh testnet scenario load|churn|partition`: bounded traffic against a running testnet,
//! ending with a report (completed and failed requests, failovers, time to first token
//! p50/p95, tokens/s, what each provider was paid) printed as a table and written as
//! JSON to `DIR/scenario-<name>.json`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::{launcher, NodeRole};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use futures::StreamExt;
use serde::Serialize;

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScenarioKind {
    /// Concurrent requests against the gateway.
    Load,
    /// Load while a provider is killed (kill -9) half-way and restarted.
    Churn,
    /// Load while the network is cut in two (the gateway with the first half of the
    /// providers, the rest on their own) from a quarter to three quarters of the
    /// requests; then the cut heals.
    Partition,
}

#[derive(Args, Debug)]
pub struct ScenarioArgs {
    pub kind: ScenarioKind,
    #[arg(long, default_value_t = 8)]
    pub requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Upper bound on the whole scenario, seconds.
    #[arg(long, default_value_t = 300)]
    pub duration: u64,
    #[arg(long, default_value_t = 12)]
    pub max_tokens: u32,
}

#[derive(Debug, Default, Serialize)]
struct Outcome {
    ok: bool,
    ttft_ms: Option<f64>,
    tokens: u64,
    tokens_per_second: Option<f64>,
    providers: Vec<String>,
    /// Tokens each provider delivered (the response's segments).
    tokens_by_provider: BTreeMap<String, u64>,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ScenarioReport {
    pub scenario: ScenarioKind,
    pub requests: usize,
    pub completed: usize,
    pub failed: usize,
    pub failovers: usize,
    pub ttft_ms_p50: Option<f64>,
    pub ttft_ms_p95: Option<f64>,
    pub tokens_per_second_p50: Option<f64>,
    pub seconds: f64,
    /// nano-USD paid to each provider, from the gateway's ledger.
    pub paid_per_provider: BTreeMap<String, u64>,
    /// Each provider's delivered tokens over the run's wall time: its aggregate
    /// throughput (all its concurrent streams together).
    pub tokens_per_second_per_provider: BTreeMap<String, f64>,
    pub errors: Vec<String>,
    /// Partition only.
    pub partition: Option<PartitionReport>,
}

#[derive(Debug, Default, Serialize)]
pub struct PartitionReport {
    /// Peer ids on the gateway's side, and on the other.
    pub with_gateway: Vec<String>,
    pub cut_off: Vec<String>,
    /// Seconds into the scenario when the cut was made and lifted.
    pub cut_at: Option<f64>,
    pub healed_at: Option<f64>,
    /// Seconds from lifting the cut until the gateway had received an advert from every
    /// provider since; `None` if that did not happen before the scenario's time bound.
    pub seconds_to_heal: Option<f64>,
    /// Requests completed while the cut was in place.
    pub completed_during_cut: usize,
}

/// Every node on one side blocks every node on the other, through its loopback API.
async fn cut(sides: [&[crate::NodeRecord]; 2], block: bool) -> Result<()> {
    let client = reqwest::Client::new();
    let path = if block { "block" } else { "unblock" };
    for (mine, theirs) in [(sides[0], sides[1]), (sides[1], sides[0])] {
        let peers: Vec<&str> = theirs.iter().map(|n| n.peer_id.as_str()).collect();
        for node in mine {
            let http = node
                .http
                .as_deref()
                .with_context(|| format!("node {} has no HTTP API to cut it off", node.peer_id))?;
            let request = client
                .post(format!("http://{http}/v1/network/{path}"))
                .json(&serde_json::json!({ "peers": peers }));
            let response = crate::authorized(request, node.api_key.as_deref())
                .send()
                .await
                .with_context(|| format!("asking {http} to {path} peers"))?;
            anyhow::ensure!(
                response.status().is_success(),
                "{http} refused to {path} peers: HTTP {}",
                response.status()
            );
        }
    }
    Ok(())
}

/// Whether the gateway has received an advert from every provider since `since_ms`.
async fn all_fresh(gateway: &str, key: Option<&str>, providers: &[String], since_ms: u64) -> bool {
    let request = reqwest::Client::new().get(format!("http://{gateway}/v1/network/providers"));
    let Ok(response) = crate::authorized(request, key).send().await else {
        return false;
    };
    let listed: serde_json::Value = response.json().await.unwrap_or_default();
    providers.iter().all(|id| {
        listed.as_array().is_some_and(|entries| {
            entries.iter().any(|e| {
                e["peer_id"].as_str() == Some(id.as_str())
                    && e["last_seen"].as_u64().is_some_and(|t| t > since_ms)
            })
        })
    })
}

async fn one(http: &str, key: Option<&str>, i: usize, max_tokens: u32) -> Outcome {
    let body = serde_json::json!({
        "model": crate::DEFAULT_MODEL,
        "messages": [{"role": "user", "content": format!("Tell me one fact about the number {i}.")}],
        "temperature": 0, "max_tokens": max_tokens, "stream": true,
    });
    let started = Instant::now();
    let request = reqwest::Client::new()
        .post(format!("http://{http}/v1/chat/completions"))
        .json(&body);
    let request = crate::authorized(request, key);
    let response = match request.send().await {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            return Outcome {
                error: Some(format!("HTTP {}", r.status())),
                ..Outcome::default()
            }
        }
        Err(e) => {
            return Outcome {
                error: Some(e.to_string()),
                ..Outcome::default()
            }
        }
    };
    let mut outcome = Outcome::default();
    let mut first = None;
    let mut chunks = crate::sse::SseChunks::new(response);
    while let Some(chunk) = chunks.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(err) => {
                outcome.error = Some(err.to_string());
                return outcome;
            }
        };
        if chunk.get("error").is_some() {
            outcome.error = Some(chunk["error"]["message"].to_string());
            return outcome;
        }
        if chunk["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
        {
            first.get_or_insert_with(Instant::now);
            outcome.tokens += 1;
        }
        if let Some(providers) = chunk["sharemesh"]["providers"].as_array() {
            outcome.providers = providers
                .iter()
                .filter_map(|p| p.as_str().map(str::to_owned))
                .collect();
            outcome.ok = true;
        }
        // The last chunk's segments: how many tokens each provider delivered.
        for segment in chunk["sharemesh"]["segments"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let (Some(provider), Some(tokens)) = (
                segment["provider"].as_str(),
                segment["completion_tokens"].as_u64(),
            ) {
                *outcome
                    .tokens_by_provider
                    .entry(provider.to_owned())
                    .or_default() += tokens;
            }
        }
    }
    if let Some(first) = first {
        outcome.ttft_ms = Some((first - started).as_secs_f64() * 1000.0);
        if outcome.tokens > 1 {
            outcome.tokens_per_second =
                Some((outcome.tokens - 1) as f64 / first.elapsed().as_secs_f64().max(1e-9));
        }
    }
    outcome
}

fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    (!values.is_empty()).then(|| values[((values.len() - 1) as f64 * q).round() as usize])
}

pub fn run(
    dir: &Path,
    args: &ScenarioArgs,
    progress: &crate::progress::Reporter,
) -> Result<ScenarioReport> {
    let file = launcher::read(dir)?;
    let gateway_node = file
        .nodes
        .iter()
        .find(|n| n.role == NodeRole::Gateway && n.http.is_some())
        .context("the testnet has no gateway")?;
    let gateway = gateway_node.http.clone().unwrap_or_default();
    let api_key = gateway_node.api_key.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let deadline = Duration::from_secs(args.duration);
    // Churn: the last provider (never the bootstrap) dies half-way and comes back.
    let victim = file
        .nodes
        .iter()
        .rev()
        .find(|n| n.role == NodeRole::Provider && file.nodes.first().map(|f| f.pid) != Some(n.pid))
        .cloned();
    let providers: Vec<crate::NodeRecord> = file
        .nodes
        .iter()
        .filter(|n| n.role == NodeRole::Provider)
        .cloned()
        .collect();
    let gateways: Vec<crate::NodeRecord> = file
        .nodes
        .iter()
        .filter(|n| n.role == NodeRole::Gateway)
        .cloned()
        .collect();
    let half = providers.len().div_ceil(2);
    let with_gateway: Vec<crate::NodeRecord> =
        gateways.iter().chain(&providers[..half]).cloned().collect();
    let cut_off = &providers[half..];
    let partitioned = matches!(args.kind, ScenarioKind::Partition);
    if partitioned {
        anyhow::ensure!(
            providers.len() >= 2,
            "a partition needs at least 2 providers (one on each side)"
        );
    }
    let mut partition = partitioned.then(|| PartitionReport {
        with_gateway: with_gateway.iter().map(|n| n.peer_id.clone()).collect(),
        cut_off: cut_off.iter().map(|n| n.peer_id.clone()).collect(),
        ..PartitionReport::default()
    });
    let outcomes: Vec<Outcome> = runtime.block_on(async {
        let requests = futures::stream::iter(0..args.requests)
            .map(|i| {
                let gateway = gateway.clone();
                let api_key = api_key.clone();
                async move { one(&gateway, api_key.as_deref(), i, args.max_tokens).await }
            })
            .buffer_unordered(args.concurrency.max(1));
        let mut requests = Box::pin(requests);
        let mut outcomes = Vec::new();
        let mut churned = false;
        loop {
            let next =
                tokio::time::timeout(deadline.saturating_sub(started.elapsed()), requests.next())
                    .await;
            match next {
                Ok(Some(outcome)) => {
                    if let Some(p) = partition.as_mut() {
                        if p.cut_at.is_some() && p.healed_at.is_none() && outcome.ok {
                            p.completed_during_cut += 1;
                        }
                    }
                    outcomes.push(outcome);
                    progress.count("requests done", outcomes.len() as u64, args.requests as u64);
                }
                Ok(None) => break,
                Err(_) => break, // Bounded in time: stop waiting.
            }
            if let Some(p) = partition.as_mut() {
                let done = outcomes.len();
                if p.cut_at.is_none() && done * 4 >= args.requests {
                    if let Err(err) = cut([&with_gateway, cut_off], true).await {
                        tracing::error!(%err, "could not cut the network");
                    }
                    p.cut_at = Some(started.elapsed().as_secs_f64());
                    progress.step("cut the network in two");
                } else if p.cut_at.is_some()
                    && p.healed_at.is_none()
                    && done * 4 >= args.requests * 3
                {
                    if let Err(err) = cut([&with_gateway, cut_off], false).await {
                        tracing::error!(%err, "could not heal the network");
                    }
                    p.healed_at = Some(started.elapsed().as_secs_f64());
                    progress.step("healed the partition");
                }
            }
            if matches!(args.kind, ScenarioKind::Churn)
                && !churned
                && outcomes.len() * 2 >= args.requests
            {
                churned = true;
                if let Some(victim) = &victim {
                    progress.step(&format!(
                        "churn: killed provider {} (restarting it)",
                        victim.peer_id
                    ));
                    launcher::kill_node(victim.pid);
                    let _ = restart(victim);
                }
            }
        }
        if let Some(p) = partition.as_mut() {
            if p.healed_at.is_none() {
                // Few requests: heal now, whatever happened.
                let _ = cut([&with_gateway, cut_off], false).await;
                p.healed_at = Some(started.elapsed().as_secs_f64());
            }
            let healed_ms = sharemesh_mesh::clock::now_ms();
            let ids: Vec<String> = providers.iter().map(|n| n.peer_id.clone()).collect();
            let healed = Instant::now();
            while started.elapsed() < deadline {
                if all_fresh(&gateway, api_key.as_deref(), &ids, healed_ms).await {
                    p.seconds_to_heal = Some(healed.elapsed().as_secs_f64());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        progress.finish();
        outcomes
    });
    let spend: serde_json::Value = runtime
        .block_on(async {
            let request = reqwest::Client::new().get(format!("http://{gateway}/v1/account/spend"));
            crate::authorized(request, api_key.as_deref())
                .send()
                .await?
                .json()
                .await
        })
        .unwrap_or_default();
    let paid_per_provider = spend["per_counterparty"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v["amount_nano_usd"].as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    let mut ttft: Vec<f64> = outcomes.iter().filter_map(|o| o.ttft_ms).collect();
    let mut tps: Vec<f64> = outcomes
        .iter()
        .filter_map(|o| o.tokens_per_second)
        .collect();
    let completed = outcomes.iter().filter(|o| o.ok).count();
    let seconds = started.elapsed().as_secs_f64();
    let mut tokens_by_provider: BTreeMap<String, u64> = BTreeMap::new();
    for (provider, tokens) in outcomes.iter().flat_map(|o| &o.tokens_by_provider) {
        *tokens_by_provider.entry(provider.clone()).or_default() += tokens;
    }
    let tokens_per_second_per_provider = tokens_by_provider
        .into_iter()
        .map(|(provider, tokens)| (provider, tokens as f64 / seconds.max(1e-9)))
        .collect();
    let report = ScenarioReport {
        scenario: args.kind,
        requests: args.requests,
        completed,
        failed: args.requests - completed,
        failovers: outcomes.iter().filter(|o| o.providers.len() > 1).count(),
        ttft_ms_p50: quantile(&mut ttft, 0.5),
        ttft_ms_p95: quantile(&mut ttft, 0.95),
        tokens_per_second_p50: quantile(&mut tps, 0.5),
        seconds,
        paid_per_provider,
        tokens_per_second_per_provider,
        errors: outcomes.iter().filter_map(|o| o.error.clone()).collect(),
        partition,
    };
    let name = format!(
        "scenario-{}.json",
        serde_json::to_value(args.kind)?.as_str().unwrap_or("run")
    );
    std::fs::write(dir.join(&name), serde_json::to_vec_pretty(&report)?)?;
    Ok(report)
}

/// Restarts a killed provider as it was started (same data folder: same identity,
/// ledger and address book), in place in the testnet file.
fn restart(node: &crate::NodeRecord) -> Result<()> {
    launcher::restart_node(Path::new(&node.data_dir)).map(|_| ())
}

pub fn print(report: &ScenarioReport) {
    println!(
        "scenario {:?}: {} requests in {:.1} s",
        report.scenario, report.requests, report.seconds
    );
    println!(
        "  completed {:>5}   failed {:>5}   failovers {:>5}",
        report.completed, report.failed, report.failovers
    );
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} ms"));
    println!(
        "  time to first token  p50 {}  p95 {}",
        ms(report.ttft_ms_p50),
        ms(report.ttft_ms_p95)
    );
    println!(
        "  tokens/s p50 {}",
        report
            .tokens_per_second_p50
            .map_or("-".to_owned(), |v| format!("{v:.1}"))
    );
    if let Some(p) = &report.partition {
        let at = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} s"));
        println!(
            "  partition: {} nodes with the gateway, {} cut off; cut at {}, healed at {}",
            p.with_gateway.len(),
            p.cut_off.len(),
            at(p.cut_at),
            at(p.healed_at)
        );
        println!(
            "  completed during the cut {}   every advert fresh again after {}",
            p.completed_during_cut,
            at(p.seconds_to_heal)
        );
    }
    for (provider, paid) in &report.paid_per_provider {
        println!("  paid {provider}  ${:.9}", *paid as f64 / 1e9);
    }
    for (provider, rate) in &report.tokens_per_second_per_provider {
        println!("  served {provider}  {rate:.1} tokens/s (all its streams together)");
    }
    for error in report.errors.iter().take(5) {
        println!("  error: {error}");
    }
}
