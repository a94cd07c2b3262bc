//! Running the engine in this process, without the mesh: `sharemesh generate` and
//! `sharemesh bench`, and the model loading and speed measurement `provide` shares.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use clap::Args;
use sharemesh_engine::catalog::{Catalog, DEFAULT_MODEL};
use sharemesh_engine::{self as engine, GenerateRequest, LoadedModel};
use sharemesh_protocol::{ChatMessage, Prompt, Role, Sampling};

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Catalog name, model id, or path to a GGUF file.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// CPU threads for inference (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where the model runs: `auto` (the first CUDA GPU in a CUDA build that finds one,
    /// else the CPU), `cpu`, or `cuda` (an error without one).
    #[arg(long, value_enum, default_value_t = Device::Auto, env = "SHAREMESH_DEVICE")]
    pub device: Device,
}

/// `--device`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl From<Device> for engine::DeviceChoice {
    fn from(device: Device) -> Self {
        match device {
            Device::Auto => engine::DeviceChoice::Auto,
            Device::Cpu => engine::DeviceChoice::Cpu,
            Device::Cuda => engine::DeviceChoice::Cuda,
        }
    }
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long)]
    pub prompt: String,
    /// Treat the prompt as a user chat message and apply the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop sequence (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Completion token ids already delivered, comma-separated: continue after them.
    #[arg(long, value_delimiter = ',')]
    pub resume: Vec<u32>,
    /// Answer one JSON object (constrained decoding).
    #[arg(long, conflicts_with = "json_schema")]
    pub json_object: bool,
    /// Answer JSON valid against the JSON Schema in this file (constrained decoding).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Keep generating past end-of-text (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Run the generation this many times in one process and report the last (warm)
    /// run; benchmarks use it to leave start-up effects out.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value_t = 128)]
    pub tokens: u32,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Also measure the aggregate decode speed of this many streams decoding together,
    /// each count in turn (`1,8,32`; models that batch: the kernels', candle's llama
    /// family)
    #[arg(long, value_delimiter = ',')]
    pub streams: Vec<usize>,
    #[arg(long)]
    pub json: bool,
}

/// The model path for a testnet's providers: a catalog name is resolved (and a known
/// model fetched); the testnet CLI and the demo take it as their model resolver.
pub fn model_for_testnet(data_dir: &Path, model: &str) -> Result<String> {
    let mut catalog = sharemesh_engine::catalog::Catalog::open(data_dir)?;
    let entry = match catalog.resolve(model) {
        Ok(entry) => entry,
        Err(_)
            if sharemesh_engine::catalog::KNOWN_MODELS
                .iter()
                .any(|m| m.name == model) =>
        {
            catalog.fetch_known(model)?
        }
        Err(err) => return Err(err),
    };
    Ok(entry.path.display().to_string())
}

/// Resolves and loads a model on the CPU/GPU with the requested thread count.
pub fn load_model(data_dir: &Path, args: &ModelArgs) -> Result<LoadedModel> {
    if let Some(threads) = args.threads {
        engine::set_threads(threads);
    }
    let entry = Catalog::open(data_dir)?.resolve(&args.model)?;
    let device = engine::device(args.device.into()).context("--device")?;
    let bar = engine::progress::bytes(0, &format!("loading {}", entry.name));
    let model = LoadedModel::load_showing(&entry.path, entry.id, &entry.name, device, bar)
        .with_context(|| format!("loading {}", entry.path.display()))?;
    tracing::info!(model = %entry.name, seconds = model.load_seconds, backend = %model.backend(), "model loaded");
    Ok(model)
}

/// `--json-object` or `--json-schema FILE` as the job's output format.
fn output_format(args: &GenerateArgs) -> Result<sharemesh_protocol::OutputFormat> {
    use sharemesh_protocol::OutputFormat;
    if let Some(path) = &args.json_schema {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the JSON schema {}", path.display()))?;
        serde_json::from_str::<serde_json::Value>(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        return Ok(OutputFormat::JsonSchema(text));
    }
    Ok(if args.json_object {
        OutputFormat::JsonObject
    } else {
        OutputFormat::Free
    })
}

pub fn generate(data_dir: &Path, args: GenerateArgs) -> Result<()> {
    let mut model = load_model(data_dir, &args.model)?;
    let prompt = if args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage {
                role: Role::System,
                content: system.clone(),
            });
        }
        messages.push(ChatMessage {
            role: Role::User,
            content: args.prompt.clone(),
        });
        Prompt::Chat(messages)
    } else {
        Prompt::Text(args.prompt.clone())
    };
    let sampling = Sampling {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
        max_tokens: args.max_tokens,
        stop: args.stop.clone(),
        format: output_format(&args)?,
        ..Sampling::default()
    };
    sampling.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let request = GenerateRequest {
        model: model.descriptor.id,
        prompt,
        sampling,
        resume: args.resume.clone(),
        ignore_eos: args.ignore_eos,
        interruptible: false,
        prefix_salt: [0; 32],
    };
    let stream = !args.json;
    let mut stdout = std::io::stdout();
    for _ in 1..args.repeat.max(1) {
        model.generate(&request, |_| true)?;
    }
    let generation = model.generate(&request, |event| {
        if stream {
            let _ = write!(stdout, "{}", event.text_delta);
            let _ = stdout.flush();
        }
        true
    })?;
    if args.json {
        let out = serde_json::json!({
            "model": model.descriptor.name,
            "model_id": model.descriptor.id,
            "backend": model.backend(),
            "text": generation.text,
            "token_ids": generation.token_ids,
            "prompt_tokens": generation.prompt_tokens,
            "completion_tokens": generation.token_ids.len(),
            "finish_reason": generation.finish,
            "load_seconds": model.load_seconds,
            "prefill_tokens_per_second": generation.prefill_tokens_per_second(),
            "generation_tokens_per_second": generation.generation_tokens_per_second(),
            // Weights a decoded token streams (the kernels' models only), and the KV cache
            // it reads, averaged over this generation's decoded positions.
            "decode_weight_bytes": model.kernel_llama().map(|m| m.decode_weight_bytes()),
            "decode_kv_bytes": model.kernel_llama().map(|m| {
                let prompt = generation.prompt_tokens as usize;
                let positions = prompt..prompt + generation.token_ids.len().saturating_sub(1);
                let count = positions.len().max(1);
                positions.map(|p| m.decode_kv_bytes(p)).sum::<usize>() / count
            }),
        });
        println!("{out}");
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, prefill {:.1} tok/s, generation {:.1} tok/s, finish {:?}]",
            generation.prompt_tokens,
            generation.generated_tokens,
            generation.prefill_tokens_per_second(),
            generation.generation_tokens_per_second(),
            generation.finish
        );
    }
    Ok(())
}

/// The prompt every benchmark uses, so numbers compare across nodes and with llama.cpp.
pub const BENCH_PROMPT: &str = "Write a detailed essay about the history of the printing press and its effect on science, religion and politics in Europe.";

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Measured speed of a model on this machine.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    pub model: String,
    /// Device and engine (`LoadedModel::backend`).
    pub backend: String,
    pub threads: usize,
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    pub prefill_tokens_per_second: f64,
    pub generation_tokens_per_second: f64,
    /// `--streams`: aggregate decode speed per stream count.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub batched: Vec<BatchedSpeed>,
}

/// Tokens per second of `streams` sequences decoding together, all of them counted.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BatchedSpeed {
    pub streams: usize,
    pub tokens_per_second: f64,
}

/// Runs the benchmark prompt `runs` times with `tokens` greedy tokens (min_tokens:
/// end-of-text is ignored by generating a fixed count).
pub fn measure(model: &mut LoadedModel, tokens: u32, runs: usize) -> Result<BenchResult> {
    measure_with(model, BENCH_PROMPT, tokens, runs)
}

/// Like [`measure`] with another user prompt (providers use a short one at start-up).
pub fn measure_with(
    model: &mut LoadedModel,
    prompt: &str,
    tokens: u32,
    runs: usize,
) -> Result<BenchResult> {
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let mut last = None;
    let bar = engine::progress::count(
        u64::from(tokens) * runs.max(1) as u64,
        &format!("measuring {} (tokens)", model.descriptor.name),
    );
    for _ in 0..runs.max(1) {
        let generation = model.generate(
            &GenerateRequest {
                model: model.descriptor.id,
                prompt: Prompt::Chat(vec![ChatMessage {
                    role: Role::User,
                    content: prompt.into(),
                }]),
                sampling: Sampling {
                    max_tokens: tokens,
                    ..Sampling::default()
                },
                resume: Vec::new(),
                ignore_eos: true,
                interruptible: false,
                prefix_salt: [0; 32],
            },
            |_| {
                bar.inc(1);
                true
            },
        )?;
        prefill.push(generation.prefill_tokens_per_second());
        decode.push(generation.generation_tokens_per_second());
        last = Some(generation);
    }
    bar.finish_and_clear();
    let last = last.context("no benchmark run")?;
    Ok(BenchResult {
        model: model.descriptor.name.clone(),
        backend: model.backend(),
        threads: std::env::var("CANDLE_NUM_THREADS")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        prompt_tokens: last.prompt_tokens,
        generated_tokens: last.generated_tokens,
        prefill_tokens_per_second: median(&mut prefill),
        generation_tokens_per_second: median(&mut decode),
        batched: Vec::new(),
    })
}

pub fn bench(data_dir: &Path, args: BenchArgs) -> Result<()> {
    let mut model = load_model(data_dir, &args.model)?;
    let mut result = measure(&mut model, args.tokens, args.runs)?;
    if !args.streams.is_empty() {
        let prompt = model.prompt_tokens(&Prompt::Text(BENCH_PROMPT.into()))?;
        for &streams in &args.streams {
            let Some(tokens_per_second) =
                model.measure_batch(&prompt, streams, args.tokens as usize)?
            else {
                anyhow::bail!("{} does not batch on {}", result.model, result.backend);
            };
            result.batched.push(BatchedSpeed {
                streams,
                tokens_per_second,
            });
        }
    }
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!(
            "{}: {} threads, prefill {:.1} tok/s ({} tokens), generation {:.1} tok/s ({} tokens), median of {} runs",
            result.model,
            result.threads,
            result.prefill_tokens_per_second,
            result.prompt_tokens,
            result.generation_tokens_per_second,
            result.generated_tokens,
            args.runs
        );
        for figure in &result.batched {
            println!(
                "  {} streams together: {:.1} tok/s in all",
                figure.streams, figure.tokens_per_second
            );
        }
    }
    Ok(())
}
