#![allow(clippy::unwrap_used)]
//! Verification across execution profiles on the real model: jobs served on the
//! sharemesh kernels (`sharemesh-kernels`, the provider) replayed on candle's CPU path
//! (`candle`, another verifier) — the only profile pair this machine runs besides the
//! kernels' own ISAs (which give the same bits, `verify.rs`). Prints, per job, the
//! median over steps of the largest top-8 logit gap for honest jobs and for a network
//! with layers dropped, and checks that a threshold separates them (the calibration a
//! cross-profile verdict needs: `CROSS_PROFILE_TOLERANCE`, SPEC §12).

mod support;

use sharemesh_engine::{LoadedModel, ReplayRequest};
use sharemesh_protocol::commitment::{median_gap, CROSS_PROFILE_TOLERANCE};
use sharemesh_protocol::{ChatMessage, Prompt, Role, Sampling, StepFingerprint};

const QUESTIONS: [&str; 4] = [
    "What is the capital of France?",
    "Write a haiku about rain.",
    "Explain what a CPU cache is.",
    "Why is the sky blue?",
];

fn load() -> LoadedModel {
    let path = support::default_model_path();
    support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-135m-instruct")
}

fn prompt(question: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: question.into(),
    }])
}

fn serve(model: &mut LoadedModel, question: &str) -> (Vec<u32>, Vec<StepFingerprint>) {
    let sampling = Sampling {
        max_tokens: 16,
        ..Sampling::default()
    };
    support::serve_fingerprinted(model, prompt(question), sampling, vec![])
}

#[test]
fn kernels_jobs_replayed_on_candle_separate_honest_from_truncated() {
    let mut kernels = load();
    let mut truncated = load();
    truncated.truncate_layers(2).unwrap();
    std::env::set_var("SHAREMESH_KERNELS", "candle");
    let mut candle = load();
    assert_eq!(kernels.profile().engine, "sharemesh-kernels");
    assert_eq!(candle.profile().engine, "candle");
    assert!(!kernels.profile().replays_exactly(&candle.profile()));
    let replay = |model: &mut LoadedModel, question: &str, tokens: &[u32]| {
        model
            .replay(&ReplayRequest {
                model: model.descriptor.id,
                prompt: prompt(question),
                outputs: tokens.to_vec(),
                from: 0,
                sampling: Default::default(),
            })
            .unwrap()
            .fingerprints
    };
    let (mut honest, mut cheat) = (Vec::new(), Vec::new());
    for question in QUESTIONS {
        let (tokens, committed) = serve(&mut kernels, question);
        honest.push(median_gap(&committed, &replay(&mut candle, question, &tokens)).unwrap());
        let (tokens, committed) = serve(&mut truncated, question);
        cheat.push(median_gap(&committed, &replay(&mut candle, question, &tokens)).unwrap());
    }
    println!("kernels → candle, median top-8 logit gap per job (4 jobs × 16 steps):");
    println!("  honest:            {honest:.3?}");
    println!("  truncate-layers:2: {cheat:.3?}");
    let honest_max = honest.iter().copied().fold(0.0, f32::max);
    let cheat_min = cheat.iter().copied().fold(f32::INFINITY, f32::min);
    println!("  honest max {honest_max:.3}, cheat min {cheat_min:.3}");
    assert!(honest_max < cheat_min, "a threshold separates them");
    // The tolerance a gateway applies across profiles sits between them.
    assert!(honest_max < CROSS_PROFILE_TOLERANCE && CROSS_PROFILE_TOLERANCE < cheat_min);
}
