//! Fuzz targets for every decoder a peer or an HTTP caller can reach, and a small
//! mutational fuzzer that runs them on stable Rust (no nightly, no sanitizer runtime):
//! start from valid seed inputs, mutate them byte-wise (flips, inserts, deletes,
//! splices, length fields set to extremes), run the target, and catch panics. Each
//! target also checks invariants of its own (the order book stays within its bounds,
//! the ledger's running totals equal a scan of its receipts, …).
//!
//! `cargo run -p sharemesh-fuzz --release -- [TARGET…] --seconds N` runs targets and
//! writes each failing input to `fuzz/failures/`; `fuzz/tests/smoke.rs` runs every
//! target for `SHAREMESH_FUZZ_SECONDS` (CI: 20) so none of them can rot.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub mod mutate;
pub mod targets;

/// The function under test: panics on a violated invariant.
pub type Harness = Box<dyn FnMut(&[u8])>;

/// One fuzz target: valid inputs to start from and the harness.
pub struct Target {
    pub name: &'static str,
    pub seeds: fn() -> Vec<Vec<u8>>,
    pub run: Harness,
}

/// An input that made the target panic, with the panic's message.
#[derive(Debug)]
pub struct Failure {
    pub input: Vec<u8>,
    pub message: String,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Report {
    pub executions: u64,
    pub failures: Vec<Failure>,
}

/// The last panic message (the hook records it instead of printing it).
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// Runs `target` for `duration` from `seed`: each seed input once, then mutants.
/// Stops after 16 failures.
pub fn run(target: &mut Target, duration: Duration, seed: u64) -> Report {
    let seeds = (target.seeds)();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut report = Report::default();
    let previous_hook = panic::take_hook();
    panic::set_hook(Box::new(|info| {
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = info.to_string();
        }
    }));
    let started = Instant::now();
    let mut queue = seeds.clone().into_iter();
    while started.elapsed() < duration && report.failures.len() < 16 {
        let input = match queue.next() {
            Some(seed_input) => seed_input,
            None => mutate::mutant(&mut rng, &seeds),
        };
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| (target.run)(&input)));
        report.executions += 1;
        if outcome.is_err() {
            let message = LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default();
            report.failures.push(Failure { input, message });
        }
        if rng.random_ratio(1, 4096) {
            // Now and then a fresh random input, unrelated to any seed.
            let len = rng.random_range(0..512);
            let random: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            queue = vec![random].into_iter();
        }
    }
    panic::set_hook(previous_hook);
    report
}
