#![allow(clippy::unwrap_used)]
//! Verification across execution profiles on the real model: jobs served on the
//! sharemesh kernels (`sharemesh-kernels`, the provider) replayed on candle's CPU path
//! (`candle`, another verifier) — the only profile pair this machine runs besides the
//! kernels' own ISAs (which give the same bits, `verify.rs`). Prints, per job, the
//! median over steps of the largest top-8 logit gap for honest jobs and for a network
//! with layers dropped, and checks that a threshold separates them (the calibration a
//! cross-profile verdict needs: `CROSS_PROFILE_TOLERANCE`, SPEC §12); and for sampled
//! jobs, how far each delivered token lies from the request's seeded draw on the
//! replayed logits, for honest jobs and for a provider choosing its own tokens (the
//! seeded-draw rule, `draws_disagree`).

mod support;

use sharemesh_engine::cheat::Cheat;
use sharemesh_engine::{LoadedModel, ReplayRequest};
use sharemesh_protocol::commitment::{
    draws_disagree, median_gap, CROSS_PROFILE_DRAW_SLACK, CROSS_PROFILE_TOLERANCE,
};
use sharemesh_protocol::{ChatMessage, Prompt, Role, Sampling};

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

/// Sampled (temperature 0.8, top-p 0.95, a seed per job): the gap rule does not depend
/// on how tokens are drawn, and the draw rule needs draws to judge.
fn sampling(seed: u64) -> Sampling {
    Sampling {
        max_tokens: 24,
        temperature: 0.8,
        top_p: 0.95,
        seed,
        ..Sampling::default()
    }
}

/// Serves the job on `model`, replays it on `candle`: the median top-8 logit gap and
/// each step's draw distance.
fn served_and_replayed(
    model: &mut LoadedModel,
    candle: &mut LoadedModel,
    question: &str,
    seed: u64,
) -> (f32, Vec<f32>) {
    let (tokens, committed) =
        support::serve_fingerprinted(model, prompt(question), sampling(seed), vec![]);
    let replayed = candle
        .replay(&ReplayRequest {
            model: candle.descriptor.id,
            prompt: prompt(question),
            outputs: tokens,
            from: 0,
            sampling: sampling(seed),
        })
        .unwrap();
    let gap = median_gap(&committed, &replayed.fingerprints).unwrap();
    (gap, replayed.draw_distances)
}

/// Jobs served on the kernels and replayed on candle (4 jobs × 24 sampled steps):
/// - the median logit gap of honest jobs stays below `CROSS_PROFILE_TOLERANCE` and that
///   of a network with two layers dropped above it;
/// - an honest job's delivered tokens lie within `CROSS_PROFILE_DRAW_SLACK` of candle's
///   seeded draws nearly everywhere, while a provider that runs the real model but draws
///   from its own random stream (`Cheat::ChooseTokens`: honest logits, so the gap rule
///   passes it) lies beyond it at many steps: the seeded-draw rule separates the two on
///   every job.
#[test]
fn kernels_jobs_replayed_on_candle_separate_honest_from_truncated_and_chosen() {
    let mut kernels = load();
    let mut truncated = load();
    truncated.truncate_layers(2).unwrap();
    let mut chooser = load();
    chooser.cheat = Cheat::ChooseTokens;
    std::env::set_var("SHAREMESH_KERNELS", "candle");
    let mut candle = load();
    assert_eq!(kernels.profile().engine, "sharemesh-kernels");
    assert_eq!(candle.profile().engine, "candle");
    assert!(!kernels.profile().replays_exactly(&candle.profile()));
    let (mut honest, mut cut, mut chosen) = (Vec::new(), Vec::new(), Vec::new());
    for (n, question) in QUESTIONS.into_iter().enumerate() {
        let seed = 1000 + n as u64;
        honest.push(served_and_replayed(
            &mut kernels,
            &mut candle,
            question,
            seed,
        ));
        cut.push(served_and_replayed(&mut truncated, &mut candle, question, seed).0);
        chosen.push(served_and_replayed(&mut chooser, &mut candle, question, seed).1);
    }
    let gaps: Vec<f32> = honest.iter().map(|(gap, _)| *gap).collect();
    println!("kernels → candle, median top-8 logit gap per job (4 jobs × 24 steps):");
    println!("  honest:            {gaps:.3?}");
    println!("  truncate-layers:2: {cut:.3?}");
    let honest_max = gaps.iter().copied().fold(0.0, f32::max);
    let cheat_min = cut.iter().copied().fold(f32::INFINITY, f32::min);
    assert!(honest_max < CROSS_PROFILE_TOLERANCE && CROSS_PROFILE_TOLERANCE < cheat_min);

    let beyond = |d: &[f32], slack: f32| d.iter().filter(|d| **d > slack).count();
    println!("steps of 24 whose draw lies beyond 0.05 / 0.1 / 0.2 of the delivered token:");
    for ((_, honest), chosen) in honest.iter().zip(&chosen) {
        println!(
            "  honest {:>2} {:>2} {:>2}   choose-tokens {:>2} {:>2} {:>2}",
            beyond(honest, 0.05),
            beyond(honest, 0.1),
            beyond(honest, 0.2),
            beyond(chosen, 0.05),
            beyond(chosen, 0.1),
            beyond(chosen, 0.2),
        );
    }
    for (_, job) in &honest {
        assert!(!draws_disagree(job), "an honest job judged chosen: {job:?}");
    }
    for job in &chosen {
        assert!(draws_disagree(job), "a chosen job passed: {job:?}");
        assert!(beyond(job, CROSS_PROFILE_DRAW_SLACK) >= 3, "{job:?}");
    }
}
