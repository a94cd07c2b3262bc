#![allow(clippy::unwrap_used)]
//! The network carries the families GPU owners run (#42): real processes serve a
//! random-weight Llama 3.1-family file and a Qwen 2-family file side by side, each with
//! its real vocabulary and chat template. The gateway counts each prompt with the file's
//! own tokenizer and template (the provider's claim must match it), a request fails over
//! mid-answer between two providers of the Llama file (`kill -9`) with the exact
//! uninterrupted text, and the gateway — holding both files — replays every job bit for
//! bit.

mod common;
#[path = "families/random_file.rs"]
mod random_file;

use std::collections::HashMap;
use std::path::Path;

use common::Process;
use serde_json::{json, Value};

const QUESTION: &str = "Write a short poem about the sea.";
const MAX_TOKENS: u32 = 24;

/// The file's own answer and prompt size, generated here without the network.
struct Reference {
    model_id: String,
    text: String,
    prompt_tokens: u32,
}

fn reference(path: &Path, name: &str) -> Reference {
    let generation = common::greedy_answer(path, name, QUESTION, MAX_TOKENS);
    Reference {
        model_id: sharemesh_engine::catalog::model_id_of(path)
            .unwrap()
            .to_string(),
        text: generation.text,
        prompt_tokens: generation.prompt_tokens,
    }
}

fn body(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "stream": stream,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama3_and_qwen2_files_are_served_counted_failed_over_and_verified_side_by_side() {
    let files = tempfile::tempdir().unwrap();
    let llama = files.path().join("llama3-random.gguf");
    let qwen = files.path().join("qwen2-random.gguf");
    random_file::write(&random_file::LLAMA3, 3, &llama);
    random_file::write(&random_file::QWEN2, 2, &qwen);
    let llama_ref = reference(&llama, "llama3-random");
    let qwen_ref = reference(&qwen, "qwen2-random");
    eprintln!("llama: {:?}\nqwen: {:?}", llama_ref.text, qwen_ref.text);
    assert!(
        llama_ref.text.chars().count() > 20 && qwen_ref.text.chars().count() > 20,
        "{:?} / {:?}",
        llama_ref.text,
        qwen_ref.text
    );

    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut providers: HashMap<String, Process> = HashMap::new();
    let mut bootstrap = String::new();
    for (dir, file) in dirs[..3].iter().zip([&llama, &llama, &qwen]) {
        let join = (!bootstrap.is_empty()).then_some(bootstrap.as_str());
        let (process, ready) = common::provider_of(file, dir.path(), join, &[]);
        if bootstrap.is_empty() {
            bootstrap = ready["listen"][0].as_str().unwrap().to_owned();
        }
        providers.insert(ready["peer_id"].as_str().unwrap().to_owned(), process);
    }
    // The gateway holds both files (as after `sharemesh models add`), so it replays
    // every job it verifies; started with no verification flag.
    let gateway_dir = dirs[3].path();
    for file in [&llama, &qwen] {
        let added =
            common::testnet::sharemesh(gateway_dir, &["models", "add", file.to_str().unwrap()]);
        assert!(added.status.success(), "{added:?}");
    }
    let (_gateway, http) = common::gateway(&bootstrap, gateway_dir, 3, common::CHECKING_GATEWAY);
    common::wait_until(60, "the gateway holds both files", || {
        common::get_json(&http, "/v1/trust")["verification"] == "replay+outsourced"
    });

    // Each file's own tokenizer and template count its prompt: the same question is a
    // different number of tokens in each, and the gateway's count is the file's.
    assert_ne!(llama_ref.prompt_tokens, qwen_ref.prompt_tokens);
    let mut answered = 0;
    for expected in [&llama_ref, &qwen_ref] {
        // Addressed by id: a name outside the catalog names nothing network-wide.
        for model in [expected.model_id.as_str(); 2] {
            let answer = common::chat(&http, &body(model, false));
            assert_eq!(
                answer["choices"][0]["message"]["content"], expected.text,
                "{model}: {answer}"
            );
            assert_eq!(
                answer["usage"]["prompt_tokens"], expected.prompt_tokens,
                "{model}: {answer}"
            );
            answered += 1;
        }
    }

    // Mid-answer failover between the two providers of the Llama file.
    let streamed = common::stream_chat(
        &http,
        body(&llama_ref.model_id, true).to_string(),
        Some((&mut providers, 6)),
    )
    .await;
    assert!(
        streamed.killed_at.is_some(),
        "the answer ended before 6 pieces"
    );
    let (pieces, trailer) = streamed.pieces();
    assert_eq!(
        pieces.concat(),
        llama_ref.text,
        "the failed-over answer differs"
    );
    let trailer = trailer.expect("a sharemesh trailer");
    let served_by: Vec<&str> = trailer["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(served_by.len(), 2, "{trailer}");
    assert_eq!(served_by[0], streamed.serving, "{trailer}");

    // Every segment was replayed bit for bit here: newcomers' jobs are all verified.
    let segments = answered + 2;
    common::wait_until(60, "the gateway to replay every job", || {
        common::get_json(&http, "/v1/trust")["stats"]["verified_ok"]
            .as_u64()
            .unwrap_or(0)
            >= segments
    });
    let trust = common::get_json(&http, "/v1/trust");
    eprintln!("{}", trust["stats"]);
    // Every token delivered was replayed: four whole answers and the two segments.
    assert_eq!(
        trust["stats"]["replayed_tokens"],
        u64::from(MAX_TOKENS) * (answered + 1),
        "{trust}"
    );
    for finding in ["frauds_found", "suspicious", "disputed"] {
        assert_eq!(trust["stats"][finding], 0, "{finding}: {trust}");
    }
}

/// A random-weight Llama 3 file whose template is Devstral's: its default system prompt
/// (~5.7 KB) makes a one-message chat 1,197 tokens, far above the prompt's token bound
/// (113) that holds a count while the gateway lacks the model's vocabulary.
fn long_template_file(dir: &Path) -> (std::path::PathBuf, Reference) {
    let file = dir.join("devstral-template.gguf");
    let template = std::fs::read_to_string(
        common::model_cache_dir()
            .join("llama-vocab/templates/unsloth-mistral-Devstral-Small-2507.jinja"),
    )
    .unwrap();
    random_file::write_with_template(&random_file::LLAMA3, 5, &file, Some(&template));
    let expected = reference(&file, "devstral-template");
    let prompt = sharemesh_protocol::Prompt::Chat(vec![sharemesh_protocol::ChatMessage {
        role: sharemesh_protocol::Role::User,
        content: QUESTION.into(),
    }]);
    assert!(
        u64::from(expected.prompt_tokens) > prompt.token_bound(),
        "{} tokens, bound {}",
        expected.prompt_tokens,
        prompt.token_bound()
    );
    (file, expected)
}

/// The long template on a gateway that does not have the model's vocabulary yet (its
/// header comes 6 s late; the gateway waits 300 ms before counting without it): the
/// provider's honest count exceeds the bound, so the gateway waits for the header,
/// counts the prompt exactly and asks again (the provider is not marked down for it:
/// `dispatch::job`'s unit test). Before, the honest count was refused as
/// `TermsMismatch` (1,197 tokens against a bound of 113) and the request failed.
#[test]
fn a_template_longer_than_the_token_bound_is_counted_once_the_header_arrives() {
    let files = tempfile::tempdir().unwrap();
    let (file, expected) = long_template_file(files.path());
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_provider, ready) = common::provider_of(
        &file,
        dirs[0].path(),
        None,
        &["--adversary", "slow-header:6"],
    );
    let bootstrap = ready["listen"][0].as_str().unwrap().to_owned();
    let flags = [
        "--warm-standby-every",
        "0",
        "--quote-k",
        "0",
        "--count-wait-ms",
        "300",
    ];
    let (_gateway, http) = common::gateway(&bootstrap, dirs[1].path(), 1, &flags);
    let answer = common::chat(&http, &body(&expected.model_id, false));
    assert_eq!(
        answer["choices"][0]["message"]["content"], expected.text,
        "{answer}"
    );
    assert_eq!(
        answer["usage"]["prompt_tokens"], expected.prompt_tokens,
        "{answer}"
    );
}

/// The long template checked by a window bought from another provider (the gateway
/// holds no model, so it verifies only by buying windows): the window starts at the
/// first step, so its provider bills the whole prompt, and the gateway holds that count
/// to its own exact one. Before, windows were held to the token bound: the honest
/// verifier's count was refused and every such check failed unmade.
#[test]
fn a_bought_check_of_a_long_template_job_counts_its_prompt_exactly() {
    let files = tempfile::tempdir().unwrap();
    let (file, expected) = long_template_file(files.path());
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_first, ready) = common::provider_of(&file, dirs[0].path(), None, &[]);
    let bootstrap = ready["listen"][0].as_str().unwrap().to_owned();
    let (_second, _) = common::provider_of(&file, dirs[1].path(), Some(&bootstrap), &[]);
    let (_gateway, http) = common::gateway(&bootstrap, dirs[2].path(), 2, common::CHECKING_GATEWAY);
    let mut small = body(&expected.model_id, false);
    small["max_tokens"] = json!(8);
    let answer = common::chat(&http, &small);
    assert_eq!(
        answer["usage"]["prompt_tokens"], expected.prompt_tokens,
        "{answer}"
    );
    common::wait_until(60, "a bought check of the job", || {
        let trust = common::get_json(&http, "/v1/trust");
        trust["outsourced"]["windows_run"].as_u64().unwrap_or(0)
            + trust["outsourced"]["windows_failed"].as_u64().unwrap_or(0)
            >= 1
    });
    let trust = common::get_json(&http, "/v1/trust");
    assert_eq!(trust["outsourced"]["windows_failed"], 0, "{trust}");
    assert!(trust["stats"]["verified_ok"].as_u64() >= Some(1), "{trust}");
}
