#![allow(clippy::unwrap_used)]
//! Two architectures on one mesh: a SmolLM2 (llama) provider and a Gemma 3 provider
//! behind one gateway. Each request goes to the provider of the model it names, and
//! each answers with its own model's greedy text.

mod common;

use std::process::Command;

use common::get_json;

/// A greedy completion through the gateway: the response and the provider that served it.
fn complete(http: &str, model: &str, prompt: &str, max_tokens: u32) -> (serde_json::Value, String) {
    let body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    let out = Command::new("curl")
        .args([
            "-s",
            "-D",
            "/dev/stderr",
            "-H",
            "content-type: application/json",
        ])
        .arg("--data-binary")
        .arg(body.to_string())
        .arg(format!("http://{http}/v1/completions"))
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&out.stderr).to_lowercase();
    let provider = headers
        .lines()
        .find_map(|l| l.strip_prefix("x-sharemesh-provider:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&out.stdout)));
    (json, provider)
}

#[test]
fn one_gateway_routes_each_model_to_its_own_provider() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_smollm, smollm_ready) = common::provider(dirs[0].path(), None, &[]);
    let bootstrap = smollm_ready["listen"][0].as_str().unwrap().to_owned();
    let (_gemma, gemma_ready) = common::provider_of(
        &common::gemma3_model_path(),
        dirs[1].path(),
        Some(&bootstrap),
        &[],
    );
    let (_gateway, http) = common::gateway(&bootstrap, dirs[2].path(), 2, &[]);

    let models = get_json(&http, "/v1/models");
    let mut names: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        vec!["gemma3-270m", "smollm2-135m-instruct"],
        "{models}"
    );

    let gemma_peer = gemma_ready["peer_id"].as_str().unwrap().to_lowercase();
    let smollm_peer = smollm_ready["peer_id"].as_str().unwrap().to_lowercase();
    let (story, served_by) = complete(
        &http,
        "gemma3-270m",
        "Once upon a time, there was a little",
        16,
    );
    assert_eq!(
        story["choices"][0]["text"],
        " girl named Lily. She was a very smart girl, and she loved to play",
        "{story}"
    );
    assert_eq!(story["model"], "gemma3-270m");
    assert_eq!(served_by, gemma_peer);
    let (capital, served_by) = complete(
        &http,
        "smollm2-135m-instruct",
        "The capital of France is",
        3,
    );
    assert!(
        capital["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(" Paris."),
        "{capital}"
    );
    assert_eq!(served_by, smollm_peer);
}
