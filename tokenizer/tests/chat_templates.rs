#![allow(clippy::unwrap_used)]
//! Real chat templates rendered as llama-cpp-python renders them: llama.cpp's own
//! collection (`models/templates/*.jinja` of the llama-cpp-python 0.3.16 sdist, which
//! `scripts/test` fetches into the test cache) and the templates GGUF files carry (the
//! Qwen 2, Phi-3 and Command-R vocab files', SmolLM2's), each on four conversations
//! (one turn; a system prompt; system and multi-turn with stray whitespace; multi-turn
//! with braces and non-ASCII text), with and without the generation prompt. The
//! expected text is `tests/fixtures/chat_templates.json`, written by
//! `scripts/make-template-fixtures.py` with llama-cpp-python's `Jinja2ChatFormatter`
//! (jinja2, trim_blocks, lstrip_blocks; its clock fixed at 2026-12-06 09:30 UTC) on the
//! conversation as llama.cpp's server passes it: for a template that shows no system
//! message (Gemma 2 refuses one, Phi-3's drops it), system messages merged into the next
//! user turn (minja's polyfill).
//! Where it refuses a conversation (FireFunction adds none to a string), this renderer
//! must refuse it too, never render something else — with
//! one stated exception: minijinja iterates `none` as an empty list where jinja2 raises
//! `TypeError`, so the three templates written only for tool use (Command R+, Hermes 2
//! Pro and 3) render with an empty tool list instead of failing without tools.

use std::path::PathBuf;

use sha2::{Digest, Sha256};
use sharemesh_protocol::{ChatMessage, Role};
use sharemesh_tokenizer::{read_header, ChatTemplate, Fallback};

/// The fixture's clock: 2026-12-06 09:30:00 UTC.
const FIXTURE_CLOCK: i64 = 1_796_549_400;

fn vocab_dir() -> PathBuf {
    let dir = std::env::var_os("SHAREMESH_TEST_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-model-cache")
        });
    assert!(
        dir.join("llama-vocab/templates").is_dir(),
        "{} lacks llama.cpp's templates: run scripts/test once (it fetches them into \
         the test cache), or set SHAREMESH_TEST_MODEL_CACHE to a folder that has them",
        dir.display()
    );
    dir
}

/// A fixture template's source: a file of llama.cpp's collection, or the
/// `tokenizer.chat_template` of a vocab file (`vocab:NAME`) or catalog model (`gguf:`).
fn source(name: &str) -> String {
    let cache = vocab_dir();
    let gguf = if let Some(vocab) = name.strip_prefix("vocab:") {
        cache.join(format!("llama-vocab/ggml-vocab-{vocab}.gguf"))
    } else if name == "gguf:SmolLM2-135M-Instruct" {
        cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    } else {
        let path = cache.join(format!("llama-vocab/templates/{name}.jinja"));
        return std::fs::read_to_string(path).unwrap();
    };
    let header = read_header(std::fs::File::open(&gguf).unwrap()).unwrap();
    header.metadata["tokenizer.chat_template"]
        .to_string()
        .unwrap()
        .clone()
}

fn conversation(messages: &serde_json::Value) -> Vec<ChatMessage> {
    messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage {
            role: match m["role"].as_str().unwrap() {
                "system" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => panic!("role {other}"),
            },
            content: m["content"].as_str().unwrap().to_owned(),
        })
        .collect()
}

#[test]
fn real_templates_render_as_llama_cpp_python_renders_them() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/chat_templates.json")).unwrap();
    let conversations: Vec<Vec<ChatMessage>> = fixture["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(conversation)
        .collect();
    let (mut rendered, mut refused, mut unparsed) = (0, 0, Vec::new());
    let mut none_iterated = std::collections::BTreeSet::new();
    let mut wrong = Vec::new();
    for template in fixture["templates"].as_array().unwrap() {
        let name = template["name"].as_str().unwrap();
        let text = source(name);
        assert_eq!(
            Sha256::digest(text.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            template["sha256"].as_str().unwrap(),
            "{name}: not the template the fixture was rendered from"
        );
        let cases = template["cases"].as_array().unwrap();
        let reference_parses = !cases.iter().all(|c| {
            c["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("TemplateSyntaxError"))
        });
        if !reference_parses {
            // jinja2 without the loopcontrols extension (as llama-cpp-python builds
            // it) cannot parse `{% break %}`; transformers and minijinja can.
            unparsed.push(name);
            continue;
        }
        let chat = ChatTemplate::new(
            Some(text),
            Fallback::ChatMl,
            template["bos"].as_str().unwrap().to_owned(),
            template["eos"].as_str().unwrap().to_owned(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        // The same probe as llama.cpp's (a system message's text shown or not), where
        // the reference renders the template at all.
        if cases.iter().any(|c| c["rendered"].is_string()) {
            assert_eq!(
                chat.has_system_role(),
                template["system_role"].as_bool().unwrap(),
                "{name}: system role"
            );
        }
        for (case, messages) in cases.chunks(2).zip(&conversations) {
            for case in case {
                let add = case["add_generation_prompt"].as_bool().unwrap();
                let ours = chat.render_at(messages, add, FIXTURE_CLOCK);
                match (case["rendered"].as_str(), ours) {
                    (Some(expected), Ok(got)) if got == expected => rendered += 1,
                    (None, Err(_)) => refused += 1,
                    (None, Ok(_))
                        if case["error"] == "TypeError: 'NoneType' object is not iterable" =>
                    {
                        none_iterated.insert(name);
                    }
                    (expected, got) => wrong.push(format!(
                        "{name} (add_generation_prompt {add}, {} messages):\n  \
                         llama-cpp-python: {expected:?} {}\n  ours: {got:?}",
                        messages.len(),
                        case["error"].as_str().unwrap_or_default(),
                    )),
                }
            }
        }
    }
    eprintln!(
        "{rendered} renderings equal, {refused} refused by both; not parsed by the \
         reference (skipped): {unparsed:?}; none iterated as empty: {none_iterated:?}"
    );
    assert!(none_iterated.len() <= 3, "{none_iterated:?}");
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(rendered >= 180, "only {rendered} renderings compared");
}
