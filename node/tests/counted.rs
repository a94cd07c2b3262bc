#![allow(clippy::unwrap_used)]
//! The buyer counts what it pays for, on the real model with real processes: the
//! gateway fetches the model's header from a provider (checked against the model id),
//! counts the prompt with the model's own tokenizer and template, and checks that each
//! chunk's text is what its tokens spell. A provider that bills twice the prompt (well
//! within the old token bound) is refused at its Accept; one that injects text is cut
//! off at that chunk; the client gets exactly the honest model's answer and pays the
//! honest provider for the prompt as counted.

mod common;

use sharemesh_engine::{oneshot_generate, Device, LoadedModel};
use sharemesh_protocol::{ChatMessage, Prompt, Role, Sampling};

const QUESTION: &str = "What is the capital of France?";
const MAX_TOKENS: u32 = 12;

/// What the model answers on its own, and how many tokens the prompt is.
fn reference() -> (String, u32) {
    sharemesh_engine::set_threads(1);
    let mut model = LoadedModel::load(
        &common::default_model_path(),
        common::DEFAULT_MODEL_ID.parse().unwrap(),
        "smollm2-135m-instruct",
        Device::Cpu,
    )
    .unwrap();
    let prompt = Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: QUESTION.into(),
    }]);
    let sampling = Sampling {
        temperature: 0.0,
        max_tokens: MAX_TOKENS,
        ..Sampling::default()
    };
    let generation = oneshot_generate(&mut model, prompt, sampling).unwrap();
    (generation.text, generation.prompt_tokens)
}

#[test]
fn the_buyer_counts_the_prompt_and_checks_the_text_itself() {
    let (expected_text, prompt_tokens) = reference();
    // The chat template adds tokens of its own: the old bound (bytes + template
    // allowance) is far above the count, so 2x the count passed it.
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_liar, liar) = common::provider(
        dirs[0].path(),
        None,
        &["--price", "0.05", "--adversary", "lie-text:3"],
    );
    let bootstrap = liar["listen"][0].as_str().unwrap().to_owned();
    let (_overbiller, overbiller) = common::provider(
        dirs[1].path(),
        Some(&bootstrap),
        &["--price", "0.07", "--adversary", "overbill:2"],
    );
    let (_honest, honest) = common::provider(dirs[2].path(), Some(&bootstrap), &["--price", "0.1"]);
    let (_gateway, http) = common::gateway(&bootstrap, dirs[3].path(), 3, common::CHECKING_GATEWAY);
    let body = serde_json::json!({
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0, "max_tokens": MAX_TOKENS,
    });
    let answer = common::chat(&http, &body);
    assert_eq!(
        answer["choices"][0]["message"]["content"], expected_text,
        "{answer}"
    );
    assert_eq!(answer["usage"]["prompt_tokens"], prompt_tokens, "{answer}");
    let peer = |ready: &serde_json::Value| ready["peer_id"].as_str().unwrap().to_owned();
    let providers: Vec<String> = answer["sharemesh"]["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect();
    // The liar served the first tokens and was cut off at its first lie; the
    // overbiller never got past its Accept; the honest provider finished.
    assert_eq!(providers, vec![peer(&liar), peer(&honest)], "{answer}");
    assert!(!providers.contains(&peer(&overbiller)));
    let segments = answer["sharemesh"]["segments"].as_array().unwrap();
    assert_eq!(segments[0]["completion_tokens"], 3, "{answer}");
    assert_eq!(
        segments[0]["amount_nano_usd"], 0,
        "no receipt was due before the lie"
    );
    // The honest provider resumed the job: its re-prefill is its own cost, so it is
    // paid price x the tokens it delivered, as the buyer counted them.
    let honest_tokens = segments[1]["completion_tokens"].as_u64().unwrap();
    assert_eq!(
        segments[1]["amount_nano_usd"].as_u64().unwrap(),
        honest_tokens * 100,
        "price x tokens the buyer counted: {answer}"
    );
}
