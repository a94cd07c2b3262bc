//! `sharemesh models`: fetch, add and list local model files (the engine's catalog;
//! a light client has none).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use sharemesh_engine::catalog::{Catalog, DEFAULT_MODEL};

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
            let entry = catalog.add(&path, name.as_deref(), None)?;
            println!("{} {} {}", entry.name, entry.id, entry.path.display());
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
