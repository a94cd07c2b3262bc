#![allow(clippy::unwrap_used)]
//! Structured output and tool calling end to end on the real model: a provider and a
//! gateway on loopback, driven by the official OpenAI SDK (`tools_client.py`): JSON
//! schemas (also the SDK's pydantic `parse`), JSON objects, tool calls required, named,
//! streamed and after a tool result, and errors naming the field. The provider enforces
//! the format by constrained decoding; the gateway reads the answer back into calls.

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
