//! `sharemesh models`: fetch, add, check and list local model files (the engine's
//! catalog; a light client has none).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use sharemesh_engine::catalog::{Catalog, DEFAULT_MODEL};
use sharemesh_engine::check::{check_file, Backend, FileCheck};

#[derive(Subcommand, Debug)]
pub enum ModelsCommand {
    /// Fetch a catalog model (default smollm2-135m-instruct), or a file from a Hugging Face repo.
    Fetch {
        /// Catalog name.
        name: Option<String>,
        /// Hugging Face repository, e.g. `HuggingFaceTB/SmolLM2-135M-Instruct-GGUF`.
        #[arg(long, requires = "file")]
        hf: Option<String>,
        /// File inside the repository.
        #[arg(long)]
        file: Option<String>,
        /// Expected sha256 of the file.
        #[arg(long)]
        sha256: Option<String>,
        /// Hub address (a mirror, or a local server in tests).
        #[arg(long, env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
        hf_endpoint: String,
        /// Git revision.
        #[arg(long, default_value = "main")]
        revision: String,
    },
    /// Register a local GGUF file.
    Add {
        path: PathBuf,
        #[arg(long)]
        name: Option<String>,
    },
    /// Say whether a GGUF file will serve here and why not, from its header
    /// (architecture, tokenizer, chat template, tensor types, memory); exits 1 when it
    /// will not.
    Check {
        path: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// List registered models.
    List {
        #[arg(long)]
        json: bool,
    },
}

pub fn models(data_dir: &std::path::Path, command: ModelsCommand) -> Result<()> {
    let mut catalog = Catalog::open(data_dir)?;
    match command {
        ModelsCommand::Fetch {
            name,
            hf: Some(repo),
            file,
            sha256,
            hf_endpoint,
            revision,
        } => {
            let file = file.context("--hf needs --file")?;
            let url = format!(
                "{}/{repo}/resolve/{revision}/{file}",
                hf_endpoint.trim_end_matches('/')
            );
            std::fs::create_dir_all(catalog.dir())?;
            let file_name = std::path::Path::new(&file)
                .file_name()
                .context("--file names no file")?
                .to_owned();
            let target = catalog.dir().join(file_name);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            // The download checks the file's sha256 (if given); the model id is its
            // own commitment, computed when the file is registered.
            runtime.block_on(sharemesh_engine::catalog::download_resumable(
                &url,
                &target,
                sha256.as_deref(),
            ))?;
            let entry = catalog.add(&target, name.as_deref(), None)?;
            println!("{} {} {}", entry.name, entry.id, entry.path.display());
        }
        ModelsCommand::Fetch { name, .. } => {
            let entry = catalog.fetch_known(name.as_deref().unwrap_or(DEFAULT_MODEL))?;
            println!("{} {} {}", entry.name, entry.id, entry.path.display());
        }
        ModelsCommand::Add { path, name } => {
            // Registered either way (a newer build may serve it), but said at once.
            if let Ok(check) = check_file(&path) {
                for problem in &check.problems {
                    eprintln!("warning: {} will not serve here: {problem}", path.display());
                }
            }
            let entry = catalog.add(&path, name.as_deref(), None)?;
            println!("{} {} {}", entry.name, entry.id, entry.path.display());
        }
        ModelsCommand::Check { path, json } => {
            let check =
                check_file(&path).with_context(|| format!("checking {}", path.display()))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&check)?);
            } else {
                print_check(&path, &check);
            }
            if !check.will_serve() {
                anyhow::bail!(
                    "{} will not serve here ({} problem{})",
                    path.display(),
                    check.problems.len(),
                    if check.problems.len() == 1 { "" } else { "s" }
                );
            }
        }
        ModelsCommand::List { json } => {
            if json {
                println!("{}", serde_json::to_string_pretty(catalog.entries())?);
            } else {
                println!(
                    "{:<28} {:<14} {:>10} {:<8} {:<7} {:>7}  PATH",
                    "NAME", "ID", "SIZE", "ARCH", "QUANT", "CTX"
                );
                for e in catalog.entries() {
                    println!(
                        "{:<28} {:<14} {:>9.1}M {:<8} {:<7} {:>7}  {}",
                        e.name,
                        &e.id.to_string()[..12],
                        e.size_bytes as f64 / 1e6,
                        e.architecture,
                        e.quantization,
                        e.context_length,
                        e.path.display()
                    );
                }
            }
        }
    }
    Ok(())
}

/// One screen: the verdict first, then what it rests on.
fn print_check(path: &std::path::Path, check: &FileCheck) {
    let mb = |bytes: u64| format!("{:.1} MB", bytes as f64 / 1e6);
    match (check.runs_on, &check.kernels_refused) {
        (Some(Backend::Kernels), _) => println!(
            "{}: will serve, on the sharemesh kernels (batching, exact replay and resume)",
            path.display()
        ),
        (Some(Backend::Candle), refused) => println!(
            "{}: will serve, on candle (one job at a time, no exact replay; the kernels: {})",
            path.display(),
            refused.as_deref().unwrap_or("turned off")
        ),
        (None, _) => println!("{}: will not serve here", path.display()),
    }
    for problem in &check.problems {
        println!("  problem       {problem}");
    }
    println!(
        "  model         {} ({}), {}, context {}",
        check.architecture,
        check.name.as_deref().unwrap_or("unnamed"),
        check.quantization,
        check.context_length
    );
    if let Some(t) = &check.tokenizer {
        println!(
            "  tokenizer     {}{}, {} tokens; chat template {}",
            t.model,
            t.pre
                .as_deref()
                .map(|pre| format!(" (pre-tokenizer {pre})"))
                .unwrap_or_default(),
            t.tokens,
            if t.template_from_file {
                "from the file"
            } else {
                "generic (the file has none)"
            }
        );
        if !t.system_role {
            println!(
                "  note          the template shows no system message: system messages are \
                 merged into the next user turn (as llama.cpp does)"
            );
        }
    }
    let types: Vec<String> = check
        .tensor_types
        .iter()
        .map(|t| format!("{} ×{} ({})", t.dtype, t.tensors, mb(t.bytes)))
        .collect();
    println!("  tensors       {}", types.join(", "));
    if let Some(m) = &check.memory {
        println!(
            "  memory        weights {}; KV cache {:.1} KB per token, {} for one sequence at \
             the full context ({} tokens)",
            mb(m.weights_bytes),
            m.kv_bytes_per_token as f64 / 1e3,
            mb(m.kv_bytes_at_context),
            check.context_length
        );
    }
    println!("  file          {}", mb(check.file_bytes));
}
