#![allow(clippy::unwrap_used)]
//! Structured output and tool calling end to end on the real model: providers and a
//! gateway on loopback. The official OpenAI SDK (`tools_client.py`): JSON schemas (also
//! the SDK's pydantic `parse`), JSON objects, tool calls required, named, streamed and
//! after a tool result, penalties, log-probabilities, and errors naming the field. The
//! provider enforces the format by constrained decoding; the gateway checks every token
//! against the format itself (a provider that ignores it is cut off unpaid) and reads the
//! answer back into calls; a constrained job failing over mid-answer continues exactly.

mod common;

use std::process::Command;

#[test]
fn the_openai_sdk_gets_schema_valid_json_and_tool_calls() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_provider, ready) = common::provider(dirs[0].path(), None, &[]);
    let bootstrap = ready["listen"][0].as_str().unwrap().to_owned();
    let (_gateway, http) = common::gateway(&bootstrap, dirs[1].path(), 1, &[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools_client.py");
    let out = Command::new("python3")
        .arg(script)
        .args([&format!("http://{http}/v1"), "smollm2-135m-instruct"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tools_client.py checks failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
}

/// A provider that ignores the format (the adversary kit's `garbage`: noise tokens under
/// the model's name) is caught by the buyer's own check at its first token: it is cut
/// off unpaid and the honest provider writes the JSON from the start.
#[test]
fn a_provider_that_ignores_the_format_is_cut_off_at_its_first_token() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_cheat, cheat) = common::provider(
        dirs[0].path(),
        None,
        &["--price", "0.05", "--adversary", "garbage"],
    );
    let bootstrap = cheat["listen"][0].as_str().unwrap().to_owned();
    let (_honest, honest) = common::provider(dirs[1].path(), Some(&bootstrap), &["--price", "0.1"]);
    let (_gateway, http) = common::gateway(&bootstrap, dirs[2].path(), 2, common::CHECKING_GATEWAY);
    let schema = serde_json::json!({"type": "object", "properties": {"colour": {"type": "string",
        "enum": ["red", "green", "blue"]}}, "required": ["colour"], "additionalProperties": false});
    let body = serde_json::json!({
        "model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 40,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    });
    let answer = common::chat(&http, &body);
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    let parsed: serde_json::Value =
        serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert!(parsed["colour"].is_string(), "{answer}");
    let peer = |ready: &serde_json::Value| ready["peer_id"].as_str().unwrap().to_owned();
    let providers = &answer["sharemesh"]["providers"];
    assert_eq!(
        providers,
        &serde_json::json!([peer(&cheat), peer(&honest)]),
        "{answer}"
    );
    let segments = answer["sharemesh"]["segments"].as_array().unwrap();
    assert_eq!(
        segments[0]["completion_tokens"], 0,
        "its token was not relayed: {answer}"
    );
    assert_eq!(segments[0]["amount_nano_usd"], 0, "nor paid: {answer}");
    // The job's route names why the cheat's segment ended.
    let job = answer["id"]
        .as_str()
        .unwrap()
        .trim_start_matches("chatcmpl-");
    let route = common::get_json(&http, &format!("/v1/jobs/{job}"));
    let ended = route["segments"][0]["ended"].as_str().unwrap_or_default();
    assert!(ended.contains("response format"), "{route}");
}

/// A constrained job that fails over mid-answer (its provider goes silent after 6
/// tokens) continues on another provider exactly: the format's masks replay over the
/// resumed tokens, so the client gets what one uninterrupted run writes.
#[test]
fn a_constrained_job_fails_over_mid_answer_exactly() {
    let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"},
        "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false});
    let question = "Tell me about a French woman named Alice who is 31.";
    let reference = {
        sharemesh_engine::set_threads(1);
        let mut model = sharemesh_engine::LoadedModel::load(
            &common::default_model_path(),
            common::DEFAULT_MODEL_ID.parse().unwrap(),
            "smollm2-135m-instruct",
            sharemesh_engine::Device::Cpu,
        )
        .unwrap();
        let prompt = sharemesh_protocol::Prompt::Chat(vec![sharemesh_protocol::ChatMessage {
            role: sharemesh_protocol::Role::User,
            content: question.into(),
        }]);
        let sampling = sharemesh_protocol::Sampling {
            max_tokens: 40,
            format: sharemesh_protocol::OutputFormat::JsonSchema(schema.to_string()),
            ..sharemesh_protocol::Sampling::default()
        };
        sharemesh_engine::oneshot_generate(&mut model, prompt, sampling)
            .unwrap()
            .text
    };
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_stalls, stalls) = common::provider(
        dirs[0].path(),
        None,
        &["--price", "0.05", "--adversary", "stall-after:6"],
    );
    let bootstrap = stalls["listen"][0].as_str().unwrap().to_owned();
    let (_honest, honest) = common::provider(dirs[1].path(), Some(&bootstrap), &["--price", "0.1"]);
    let mut flags = common::CHECKING_GATEWAY.to_vec();
    flags.extend(["--stall-timeout-ms", "1500"]);
    let (_gateway, http) = common::gateway(&bootstrap, dirs[2].path(), 2, &flags);
    let body = serde_json::json!({
        "model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 40,
        "messages": [{"role": "user", "content": question}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
    });
    let answer = common::chat(&http, &body);
    assert_eq!(
        answer["choices"][0]["message"]["content"], reference,
        "{answer}"
    );
    // Streamed, the failover is as exact: the deltas spell the same JSON.
    let mut streaming = body.clone();
    streaming["stream"] = serde_json::json!(true);
    let out = Command::new("curl")
        .args([
            "-sN",
            "-m",
            "120",
            "-H",
            "content-type: application/json",
            "-d",
        ])
        .arg(streaming.to_string())
        .arg(format!("http://{http}/v1/chat/completions"))
        .output()
        .unwrap();
    let chunks: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, reference);
    let route = chunks
        .iter()
        .find_map(|chunk| chunk.get("sharemesh"))
        .unwrap();
    assert_eq!(route["providers"].as_array().unwrap().len(), 2, "{route}");
    let peer = |ready: &serde_json::Value| ready["peer_id"].as_str().unwrap().to_owned();
    assert_eq!(
        answer["sharemesh"]["providers"],
        serde_json::json!([peer(&stalls), peer(&honest)]),
        "{answer}"
    );
    assert_eq!(
        answer["sharemesh"]["segments"][0]["completion_tokens"], 6,
        "{answer}"
    );
}

/// A provider that reports flattering log-probabilities (its runners-up 2 nats less
/// likely than its own committed logits say) is cut off at its first token: the buyer
/// checks each value against the fingerprint the provider committed to, and the honest
/// provider answers with log-probabilities that hold.
#[test]
fn made_up_log_probabilities_are_caught_at_the_first_token() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_liar, liar) = common::provider(
        dirs[0].path(),
        None,
        &["--price", "0.05", "--adversary", "lie-logprobs"],
    );
    let bootstrap = liar["listen"][0].as_str().unwrap().to_owned();
    let (_honest, honest) = common::provider(dirs[1].path(), Some(&bootstrap), &["--price", "0.1"]);
    let (_gateway, http) = common::gateway(&bootstrap, dirs[2].path(), 2, common::CHECKING_GATEWAY);
    let body = serde_json::json!({
        "model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 8,
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "logprobs": true, "top_logprobs": 3,
    });
    let answer = common::chat(&http, &body);
    let peer = |ready: &serde_json::Value| ready["peer_id"].as_str().unwrap().to_owned();
    assert_eq!(
        answer["sharemesh"]["providers"],
        serde_json::json!([peer(&liar), peer(&honest)]),
        "{answer}"
    );
    assert_eq!(
        answer["sharemesh"]["segments"][0]["completion_tokens"], 0,
        "{answer}"
    );
    let entries = answer["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    // One entry per token delivered (the answer stops before max_tokens).
    assert_eq!(
        serde_json::json!(entries.len()),
        answer["usage"]["completion_tokens"],
        "{answer}"
    );
    let job = answer["id"]
        .as_str()
        .unwrap()
        .trim_start_matches("chatcmpl-");
    let route = common::get_json(&http, &format!("/v1/jobs/{job}"));
    let ended = route["segments"][0]["ended"].as_str().unwrap_or_default();
    assert!(
        ended.contains("does not follow from its committed logit"),
        "{route}"
    );
}
