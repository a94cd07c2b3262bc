//! `sharemesh chat`: a terminal playground. It keeps the conversation, streams each
//! answer from a gateway's OpenAI API, and shows tokens/s and cost per answer.
//! Lines starting with `/` are commands: `/reset`, `/quit`.

use std::io::{BufRead, Write};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Gateway base address.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub gateway: String,
    #[arg(long, default_value = sharemesh_testnet::DEFAULT_MODEL)]
    pub model: String,
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// API key, if the gateway requires one.
    #[arg(long)]
    pub api_key: Option<String>,
}

struct Answer {
    text: String,
    tokens: u64,
    cost_nano_usd: u64,
    seconds: f64,
    providers: Vec<String>,
}

async fn ask(
    client: &reqwest::Client,
    args: &ChatArgs,
    messages: &[Value],
    out: &mut impl Write,
) -> Result<Answer> {
    let url = format!("{}/v1/chat/completions", args.gateway.trim_end_matches('/'));
    let mut request = client.post(&url).json(&json!({
        "model": args.model,
        "messages": messages,
        "temperature": args.temperature,
        "max_tokens": args.max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    }));
    if let Some(key) = &args.api_key {
        request = request.bearer_auth(key);
    }
    let started = Instant::now();
    let response = request.send().await.with_context(|| {
        format!("could not reach the gateway at {url}; is `sharemesh gateway` running?")
    })?;
    if !response.status().is_success() {
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        bail!(
            "{status}: {}",
            body["error"]["message"].as_str().unwrap_or("no details")
        );
    }
    let mut answer = Answer {
        text: String::new(),
        tokens: 0,
        cost_nano_usd: 0,
        seconds: 0.0,
        providers: Vec::new(),
    };
    let mut first_token = None;
    let mut chunks = sharemesh_testnet::sse::SseChunks::new(response);
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        if let Some(error) = chunk.get("error") {
            bail!(
                "{}",
                error["message"].as_str().unwrap_or("the request failed")
            );
        }
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            if !text.is_empty() {
                first_token.get_or_insert_with(Instant::now);
                answer.text.push_str(text);
                write!(out, "{text}")?;
                out.flush()?;
            }
        }
        if let Some(meta) = chunk.get("sharemesh") {
            answer.cost_nano_usd = meta["cost_nano_usd"].as_u64().unwrap_or(0);
            answer.providers = meta["providers"]
                .as_array()
                .map(|p| {
                    p.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
        }
        if let Some(tokens) = chunk["usage"]["completion_tokens"].as_u64() {
            answer.tokens = tokens;
        }
    }
    answer.seconds = first_token.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let _ = started;
    Ok(answer)
}

pub fn run(args: ChatArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = reqwest::Client::new();
    let mut messages: Vec<Value> = Vec::new();
    if let Some(system) = &args.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    eprintln!(
        "sharemesh chat — {} via {} (/reset, /quit)",
        args.model, args.gateway
    );
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                messages.retain(|m| m["role"] == "system");
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(json!({"role": "user", "content": line}));
        match runtime.block_on(ask(&client, &args, &messages, &mut stdout)) {
            Ok(answer) => {
                writeln!(stdout)?;
                let speed = if answer.seconds > 0.0 {
                    answer.tokens.saturating_sub(1) as f64 / answer.seconds
                } else {
                    0.0
                };
                eprintln!(
                    "[{} tokens, {:.1} tok/s, ${:.9}, served by {}]",
                    answer.tokens,
                    speed,
                    answer.cost_nano_usd as f64 / 1e9,
                    answer.providers.join(", ")
                );
                messages.push(json!({"role": "assistant", "content": answer.text}));
            }
            Err(err) => {
                messages.pop();
                eprintln!("error: {err:#}");
            }
        }
    }
    Ok(())
}
