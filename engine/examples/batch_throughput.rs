//! Continuous batching without the network: `cargo run -p sharemesh-engine --example
//! batch_throughput -- MODEL.gguf [THREADS] [STREAMS,...] [MAX_TOKENS] [SYSTEM]`.
//! SYSTEM (default 0) gives every prompt the same system message of SYSTEM sentences
//! (about 15 tokens each), as an agent's burst of requests shares its instructions.
//!
//! For each stream count N it prints one JSON line: (1) the kernels alone — aggregate
//! tokens per second of decode steps feeding N sequences one token each — and (2) the
//! whole engine: N greedy chat jobs (`PROMPTS`, the same as `scripts/bench-batching`'s)
//! of MAX_TOKENS tokens each, submitted together to `Engine::spawn_with` with a batch
//! of N: aggregate tokens per second from submission to the last token, and per job
//! the time to first token and the gaps between tokens. Each line also carries the
//! prompts' token ids, so a peer engine can be run on exactly the same input
//! (`scripts/bench-batching --llama-cpp`). A benchmark, not a test.

use std::time::Instant;

use sharemesh_engine::{
    BatchSettings, Device, Engine, EngineEvent, GenerateRequest, LoadedModel, TokenEngine,
};
use sharemesh_protocol::{ChatMessage, ModelId, Prompt, Role};

const PROMPTS: [&str; 8] = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works to a child.",
    "Describe a walk through a forest in autumn.",
    "Tell me about the history of bread.",
    "Write a letter to a friend about a trip to the sea.",
    "Describe how rain forms in clouds.",
    "Tell a story about a cat who learns to swim.",
    "Explain why the sky changes colour at sunset.",
];

fn prompt(index: usize, system: usize) -> Prompt {
    let mut messages = Vec::new();
    if system > 0 {
        let sentence = "Answer the visitor's question in plain words and keep to the facts. ";
        messages.push(ChatMessage {
            role: Role::System,
            content: sentence.repeat(system),
        });
    }
    messages.push(ChatMessage {
        role: Role::User,
        content: PROMPTS[index % PROMPTS.len()].into(),
    });
    Prompt::Chat(messages)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = std::path::PathBuf::from(args.next().ok_or_else(|| {
        anyhow::anyhow!(
            "usage: batch_throughput MODEL.gguf [THREADS] [STREAMS,...] [MAX_TOKENS] [SYSTEM]"
        )
    })?);
    let threads: usize = args.next().map_or(Ok(1), |t| t.parse())?;
    let streams: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "1,2,4,8".into())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let max_tokens: u32 = args.next().map_or(Ok(48), |t| t.parse())?;
    let system: usize = args.next().map_or(Ok(0), |t| t.parse())?;
    sharemesh_engine::set_threads(threads);
    let id = ModelId::from_bytes([0; 32]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for &n in &streams {
        let model = LoadedModel::load(&path, id, "bench", Device::Cpu)?;
        let prompts: Vec<Vec<u32>> = (0..n)
            .map(|i| model.prompt_tokens(&prompt(i, system)))
            .collect::<Result<_, _>>()?;
        let kernels = model
            .measure_batch(&prompts[0], n, 32)?
            .ok_or_else(|| anyhow::anyhow!("the model does not run on the kernels"))?;
        let settings = BatchSettings {
            max_batch: n,
            ..BatchSettings::default()
        };
        let engine = Engine::spawn_with(vec![model], n, settings);
        let served = runtime.block_on(jobs(&engine, id, n, max_tokens, system))?;
        let line = serde_json::json!({
            "threads": threads,
            "streams": n,
            "max_tokens": max_tokens,
            "kernels_tok_s": round(kernels),
            "engine_tok_s": round(served.tokens as f64 / served.seconds),
            "ttft_p50_ms": percentile(&served.ttfts, 0.5),
            "ttft_p99_ms": percentile(&served.ttfts, 0.99),
            "gap_p50_ms": percentile(&served.gaps, 0.5),
            "gap_p99_ms": percentile(&served.gaps, 0.99),
            "prompts": prompts,
        });
        println!("{line}");
    }
    Ok(())
}

struct Served {
    tokens: usize,
    seconds: f64,
    ttfts: Vec<f64>,
    gaps: Vec<f64>,
}

fn round(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = ((q * sorted.len() as f64) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(at).map_or(0.0, |s| round(s * 1000.0))
}

async fn jobs(
    engine: &Engine,
    model: ModelId,
    n: usize,
    max_tokens: u32,
    system: usize,
) -> anyhow::Result<Served> {
    let started = Instant::now();
    let mut receivers = Vec::new();
    for i in 0..n {
        receivers.push(engine.submit(GenerateRequest {
            ignore_eos: true,
            ..GenerateRequest::greedy(model, prompt(i, system), max_tokens)
        })?);
    }
    let runs = futures::future::join_all(receivers.into_iter().map(|mut events| async move {
        let (mut times, mut last) = (Vec::new(), started);
        while let Some(event) = events.recv().await {
            match event {
                EngineEvent::Token(_) => {
                    let now = Instant::now();
                    times.push((now - last).as_secs_f64());
                    last = now;
                }
                EngineEvent::Finished(_) | EngineEvent::Failed(_) => break,
                EngineEvent::Started { .. } => {}
            }
        }
        times
    }))
    .await;
    let seconds = started.elapsed().as_secs_f64();
    let mut served = Served {
        tokens: 0,
        seconds,
        ttfts: Vec::new(),
        gaps: Vec::new(),
    };
    for times in runs {
        served.tokens += times.len();
        if let Some((first, rest)) = times.split_first() {
            served.ttfts.push(*first);
            served.gaps.extend_from_slice(rest);
        }
    }
    Ok(served)
}
