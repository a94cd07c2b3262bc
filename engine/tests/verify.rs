#![allow(clippy::unwrap_used)]
//! Verification by re-execution on the real models (SmolLM2-135M-Instruct Q4_1, and
//! Gemma 3 270M on the kernels): a
//! teacher-forced replay on the same execution profile reproduces every fingerprint
//! an honest job committed to, bit for bit, sampled or greedy, resumed or not; a
//! truncated network or garbage under the same name differs at every step.

mod support;

use sharemesh_engine::cheat::Cheat;
use sharemesh_engine::{LoadedModel, ReplayRequest};
use sharemesh_protocol::{ChatMessage, Prompt, Role, Sampling, StepFingerprint};

fn load() -> LoadedModel {
    let path = support::default_model_path();
    support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-135m-instruct")
}

fn prompt() -> Prompt {
    Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: "Name three rivers of Europe and say one thing about each.".into(),
    }])
}

/// Generates and returns (tokens, the fingerprint committed with each new token).
fn serve(
    model: &mut LoadedModel,
    sampling: Sampling,
    resume: Vec<u32>,
) -> (Vec<u32>, Vec<StepFingerprint>) {
    support::serve_fingerprinted(model, prompt(), sampling, resume)
}

fn replay(model: &mut LoadedModel, outputs: &[u32], from: usize) -> Vec<StepFingerprint> {
    replay_drawing(model, outputs, from, &Sampling::default()).fingerprints
}

/// The replay of `outputs` from step `from`, redrawn with `sampling`.
fn replay_drawing(
    model: &mut LoadedModel,
    outputs: &[u32],
    from: usize,
    sampling: &Sampling,
) -> sharemesh_engine::Replayed {
    let request = ReplayRequest {
        model: model.descriptor.id,
        prompt: prompt(),
        outputs: outputs.to_vec(),
        from,
        sampling: sampling.clone(),
    };
    let replayed = model.replay(&request).unwrap();
    assert_eq!(replayed.profile, model.profile());
    assert_eq!(replayed.drawn.len(), replayed.fingerprints.len());
    replayed
}

/// Largest |logit difference| over the tokens both fingerprints list (∞ if none).
fn gap(a: &StepFingerprint, b: &StepFingerprint) -> f32 {
    a.gap(b).unwrap_or(f32::INFINITY)
}

/// An honest sampled job replays bit for bit, and so does its resumption after
/// `resume_at` delivered tokens (which reproduces the same tokens). Returns the job's
/// tokens and committed fingerprints.
fn honest_job_and_resume_replay(
    model: &mut LoadedModel,
    sampled: &Sampling,
    resume_at: usize,
) -> (Vec<u32>, Vec<StepFingerprint>) {
    let (tokens, committed) = serve(model, sampled.clone(), vec![]);
    assert_eq!(committed.len(), tokens.len());
    let replayed = replay_drawing(model, &tokens, 0, sampled);
    assert_eq!(replayed.fingerprints, committed);
    assert_eq!(
        replayed.drawn, tokens,
        "every delivered token is the seeded draw"
    );
    let (resumed, resumed_committed) = serve(model, sampled.clone(), tokens[..resume_at].to_vec());
    assert_eq!(resumed, tokens, "exact resume");
    let replayed = replay_drawing(model, &resumed, resume_at, sampled);
    assert_eq!(replayed.fingerprints, resumed_committed);
    assert_eq!(replayed.drawn, tokens[resume_at..]);
    assert_eq!(resumed_committed, committed[resume_at..]);
    (tokens, committed)
}

/// What a two-layers-short copy of the model serves under its name, beside the honest
/// model's replay of the same tokens: (committed, replayed) per step.
fn truncated_job_and_honest_view(
    model: &mut LoadedModel,
    mut truncated: LoadedModel,
    sampled: &Sampling,
) -> (Vec<StepFingerprint>, Vec<StepFingerprint>) {
    truncated.truncate_layers(2).unwrap();
    let (cheap_tokens, cheap_committed) = serve(&mut truncated, sampled.clone(), vec![]);
    let honest_view = replay(model, &cheap_tokens, 0);
    (cheap_committed, honest_view)
}

#[test]
fn an_honest_job_replays_bit_for_bit_and_cheats_do_not() {
    let mut model = load();
    assert_eq!(model.profile().engine, "sharemesh-kernels");
    let sampled = Sampling {
        temperature: 0.9,
        top_p: 0.95,
        seed: 42,
        max_tokens: 70,
        ..Sampling::default()
    };
    // Honest, sampled: every step's fingerprint equals the replay's, in one batch pass;
    // resumed after 30 delivered tokens, its steps replay too.
    let (_, committed) = honest_job_and_resume_replay(&mut model, &sampled, 30);

    // A truncated network (two layers dropped) under the same name and profile.
    let (cheap_committed, honest_view) =
        truncated_job_and_honest_view(&mut model, load(), &sampled);
    let differing = honest_view
        .iter()
        .zip(&cheap_committed)
        .filter(|(a, b)| a != b)
        .count();
    let mut gaps: Vec<f32> = honest_view
        .iter()
        .zip(&cheap_committed)
        .map(|(a, b)| gap(a, b))
        .collect();
    gaps.sort_by(f32::total_cmp);
    println!(
        "truncate-layers:2 — {differing}/{} steps differ; top-k logit gap min {:.3} median {:.3}",
        cheap_committed.len(),
        gaps[0],
        gaps[gaps.len() / 2]
    );
    assert_eq!(differing, cheap_committed.len());

    // Garbage: noise tokens with fingerprints that name them the best.
    let mut garbage = load();
    garbage.cheat = Cheat::Garbage;
    let (noise, noise_committed) = serve(&mut garbage, sampled, vec![]);
    let honest_view = replay(&mut model, &noise, 0);
    assert!(honest_view
        .iter()
        .zip(&noise_committed)
        .all(|(a, b)| a != b));
    println!(
        "honest same-profile replays: 0 differing steps of {}",
        committed.len() + 40
    );
}

/// A provider that runs the real model but chooses its tokens: its fingerprints are
/// honest (the real model's logits over the tokens it delivered), so only the redraw
/// catches it. Three ways: sampling from its own random stream instead of the request's
/// seed; the "prefill forgery" (a cheaper network's tokens, fingerprinted afterwards by
/// a teacher-forced pass of the real model); and a greedy job where one token is
/// swapped for the runner-up (an injected word, or refusing to end).
#[test]
fn tokens_the_seeded_sampler_does_not_draw_are_caught_by_the_redraw() {
    let mut model = load();
    let request = Sampling {
        temperature: 0.8,
        seed: 42,
        max_tokens: 40,
        ..Sampling::default()
    };
    // Its own stream: the real model, seed 4242, under a request that said 42.
    let own_stream = Sampling {
        seed: 4242,
        ..request.clone()
    };
    let (chosen, committed) = serve(&mut model, own_stream, vec![]);
    let replayed = replay_drawing(&mut model, &chosen, 0, &request);
    assert_eq!(
        replayed.fingerprints, committed,
        "its logits are the model's"
    );
    let (step, drawn) = replayed
        .first_other_draw(&chosen)
        .expect("a token off the request's seed");
    assert_ne!(drawn, chosen[step]);
    println!(
        "own random stream: first chosen token at step {step} of {}",
        chosen.len()
    );

    // Prefill forgery: a two-layers-short network's tokens, honest fingerprints.
    let mut cheap = load();
    cheap.truncate_layers(2).unwrap();
    let (forged, _) = serve(&mut cheap, request.clone(), vec![]);
    let replayed = replay_drawing(&mut model, &forged, 0, &request);
    let (step, _) = replayed
        .first_other_draw(&forged)
        .expect("a cheaper network's tokens are not the seeded draws");
    println!(
        "prefill forgery: first other draw at step {step} of {}",
        forged.len()
    );

    // Greedy, one token swapped for the runner-up at step 5: caught exactly there.
    let greedy = Sampling {
        max_tokens: 12,
        ..Sampling::default()
    };
    let (mut tokens, committed) = serve(&mut model, greedy.clone(), vec![]);
    let runner_up = committed[5].top[1].0;
    tokens[5] = runner_up;
    let replayed = replay_drawing(&mut model, &tokens, 0, &greedy);
    assert_eq!(replayed.first_other_draw(&tokens).map(|(s, _)| s), Some(5));
}

/// Gemma 3 on the kernels is verifiable the same way: an honest sampled job and its
/// resumption replay bit for bit; a truncated network under its name differs at every
/// step.
#[test]
fn a_gemma_job_replays_bit_for_bit_and_a_truncated_gemma_does_not() {
    let load_gemma = || {
        support::load(
            &support::gemma3_model_path(),
            support::GEMMA3_MODEL_ID,
            "gemma3-270m",
        )
    };
    let mut model = load_gemma();
    assert_eq!(model.profile().engine, "sharemesh-kernels");
    let sampled = Sampling {
        temperature: 0.9,
        top_p: 0.95,
        seed: 7,
        max_tokens: 24,
        ..Sampling::default()
    };
    honest_job_and_resume_replay(&mut model, &sampled, 10);
    let (cheap_committed, honest_view) =
        truncated_job_and_honest_view(&mut model, load_gemma(), &sampled);
    assert!(
        honest_view
            .iter()
            .zip(&cheap_committed)
            .all(|(a, b)| a != b),
        "a truncated Gemma passed some steps"
    );
}

/// Substitution: the same network requantized to another format (Q8_0: if anything
/// *better* than the Q4_1 it replaces), served under the model's id and profile. Every
/// step's logits differ from the replay of the real file, so a verifier catches any
/// file swap, not only cheaper ones.
#[test]
fn a_substituted_file_differs_at_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let substitute_path = dir.path().join("substitute-q8_0.gguf");
    sharemesh_engine::weights::requantize_to_q8_0(&support::default_model_path(), &substitute_path)
        .unwrap();

    let mut honest = load();
    let mut substitute = support::load(
        &substitute_path,
        support::DEFAULT_MODEL_ID,
        "smollm2-135m-instruct",
    );
    assert_eq!(substitute.profile().engine, "sharemesh-kernels");
    let sampling = Sampling {
        max_tokens: 32,
        ..Sampling::default()
    };
    let (tokens, committed) = serve(&mut substitute, sampling, vec![]);
    let replayed = replay(&mut honest, &tokens, 0);
    let differing = replayed
        .iter()
        .zip(&committed)
        .filter(|(a, b)| a != b)
        .count();
    let mut gaps: Vec<f32> = replayed
        .iter()
        .zip(&committed)
        .map(|(a, b)| gap(a, b))
        .collect();
    gaps.sort_by(f32::total_cmp);
    println!(
        "Q8_0 substitute: {differing}/{} steps differ; top-k logit gap median {:.3}",
        committed.len(),
        gaps[gaps.len() / 2]
    );
    assert_eq!(differing, committed.len());
}
