//! The `sharemesh` binary: one process for providers, buyers' light clients and
//! researchers' testnets.

use clap::{CommandFactory, FromArgMatches};
use sharemesh_node::{cli::Cli, config};

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // config.toml values become SHAREMESH_* variables (unless set), which flags override.
    if let Err(err) = config::load_into_env(&args) {
        eprintln!("error: {err:#}");
        return std::process::ExitCode::FAILURE;
    }
    let matches = config::with_env(Cli::command()).get_matches_from(args);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    match sharemesh_node::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
