//! `sharemesh-fuzz [TARGET…] [--seconds N] [--seed S] [--model GGUF]`: runs the fuzz
//! targets (all by default) and writes each failing input to `fuzz/failures/`.

use std::path::PathBuf;
use std::time::Duration;

fn main() -> std::process::ExitCode {
    let mut names = Vec::new();
    let mut seconds = 30u64;
    let mut seed = 1u64;
    let mut model: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{flag} needs a value"))
        };
        match arg.as_str() {
            "--seconds" => seconds = value("--seconds").parse().unwrap_or(seconds),
            "--seed" => seed = value("--seed").parse().unwrap_or(seed),
            "--model" => model = Some(PathBuf::from(value("--model"))),
            name => names.push(name.to_owned()),
        }
    }
    let failures_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("failures");
    let mut failed = false;
    for mut target in sharemesh_fuzz::targets::all(model.as_deref()) {
        if !names.is_empty() && !names.iter().any(|n| n == target.name) {
            continue;
        }
        let report = sharemesh_fuzz::run(&mut target, Duration::from_secs(seconds), seed);
        println!(
            "{:<10} {:>9} executions, {} failures",
            target.name,
            report.executions,
            report.failures.len()
        );
        for (i, failure) in report.failures.iter().enumerate() {
            failed = true;
            let _ = std::fs::create_dir_all(&failures_dir);
            let path = failures_dir.join(format!("{}-{seed}-{i}", target.name));
            let _ = std::fs::write(&path, &failure.input);
            println!("  {}: {}", path.display(), failure.message);
        }
    }
    if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
