//! The `sharemesh` binary: one process for providers, buyers' light clients and
//! researchers' testnets.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = sharemesh_node::cli::Cli::parse();
    match sharemesh_node::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
