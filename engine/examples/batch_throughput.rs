//! Where a batch's time goes, without the network: `cargo run --release -p
//! sharemesh-engine --example batch_throughput -- MODEL.gguf [THREADS] [STREAMS,...]`.
//!
//! For each stream count B it prints (1) the kernels alone: tokens per second of decode
//! steps that feed B sequences one token each (after a 48-token prompt each), and
//! (2) the whole engine: B greedy jobs of 128 tokens submitted together to
//! `Engine::spawn_batched`, counted from submission to the last token. The gap between
//! the two is the engine's per-token work (sampling, fingerprints, events).
//! A benchmark, not a test.

use std::time::Instant;

use sharemesh_engine::{Device, Engine, EngineEvent, GenerateRequest, LoadedModel, TokenEngine};
use sharemesh_protocol::{ChatMessage, ModelId, Prompt, Role, Sampling};

const PROMPT: &str = "Write a short story about a lighthouse keeper who finds a message \
                      in a bottle, and tell it in the first person with plenty of detail.";
const GENERATED: u32 = 128;

fn prompt() -> Prompt {
    Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: PROMPT.into(),
    }])
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = std::path::PathBuf::from(args.next().ok_or_else(|| {
        anyhow::anyhow!("usage: batch_throughput MODEL.gguf [THREADS] [STREAMS,...]")
    })?);
    let threads: usize = args.next().map_or(Ok(1), |t| t.parse())?;
    let streams: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "1,2,4,8,16".into())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    sharemesh_engine::set_threads(threads);
    let id = ModelId::from_bytes([0; 32]);
    let model = LoadedModel::load(&path, id, "bench", Device::Cpu)?;
    println!("threads {threads}");
    kernel_steps(&model, &streams)?;
    let engine = Engine::spawn_batched(vec![model], 64, *streams.iter().max().unwrap_or(&1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for &b in &streams {
        let started = Instant::now();
        let tokens = runtime.block_on(jobs(&engine, id, b))?;
        let rate = tokens as f64 / started.elapsed().as_secs_f64();
        println!("engine  B={b:2}  {rate:7.1} tok/s aggregate");
    }
    Ok(())
}

/// Decode steps of `b` sequences through `Llama::forward_batch`.
fn kernel_steps(model: &LoadedModel, streams: &[usize]) -> anyhow::Result<()> {
    let llama = model
        .kernel_llama()
        .ok_or_else(|| anyhow::anyhow!("the model does not run on the kernels"))?;
    let prompt = model.prompt_tokens(&prompt())?;
    for &b in streams {
        let mut caches: Vec<_> = (0..b).map(|_| llama.new_sequence()).collect();
        for cache in &mut caches {
            let position = cache.positions();
            llama.forward_batch(&mut [sharemesh_engine::BatchEntry {
                cache,
                tokens: &prompt,
                position,
            }])?;
        }
        let steps = 64;
        let started = Instant::now();
        for step in 0..steps {
            let token = [prompt[step % prompt.len()]];
            let mut entries: Vec<_> = caches
                .iter_mut()
                .map(|cache| sharemesh_engine::BatchEntry {
                    position: cache.positions(),
                    cache,
                    tokens: &token,
                })
                .collect();
            llama.forward_batch(&mut entries)?;
        }
        let rate = (steps * b) as f64 / started.elapsed().as_secs_f64();
        println!("kernels B={b:2}  {rate:7.1} tok/s aggregate");
    }
    Ok(())
}

async fn jobs(engine: &Engine, model: ModelId, b: usize) -> anyhow::Result<usize> {
    let mut receivers = Vec::new();
    for _ in 0..b {
        receivers.push(engine.submit(GenerateRequest {
            model,
            prompt: prompt(),
            sampling: Sampling {
                max_tokens: GENERATED,
                ..Sampling::default()
            },
            resume: Vec::new(),
            ignore_eos: true,
        })?);
    }
    let counts = futures::future::join_all(receivers.into_iter().map(|mut events| async move {
        let mut tokens = 0;
        while let Some(event) = events.recv().await {
            match event {
                EngineEvent::Token(_) => tokens += 1,
                EngineEvent::Finished(_) | EngineEvent::Failed(_) => break,
                EngineEvent::Started { .. } => {}
            }
        }
        tokens
    }))
    .await;
    Ok(counts.into_iter().sum())
}
