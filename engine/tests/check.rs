#![allow(clippy::unwrap_used)]
//! `sharemesh models check`: whether a file serves, from its header, agreeing with what
//! loading it does — the catalog model serves on the kernels with its KV cache sized as
//! they size it; a file with one setting changed is refused with the same words its load
//! is refused with.

mod support;

use candle_core::quantized::gguf_file::Value;
use sharemesh_engine::check::{check_file, Backend};
use sharemesh_engine::{Device, LoadedModel};

fn load_error(path: &std::path::Path) -> String {
    sharemesh_engine::set_threads(1);
    let id = support::DEFAULT_MODEL_ID.parse().unwrap();
    match LoadedModel::load(path, id, "changed", Device::Cpu) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(err) => err.to_string(),
    }
}

#[test]
fn the_catalog_model_serves_on_the_kernels_with_its_cache_sized() {
    let check = check_file(&support::default_model_path()).unwrap();
    assert!(check.will_serve(), "{:?}", check.problems);
    assert_eq!(check.runs_on, Some(Backend::Kernels));
    assert_eq!(check.architecture, "llama");
    assert_eq!(check.quantization, "Q4_1");
    let tokenizer = check.tokenizer.as_ref().unwrap();
    assert_eq!(tokenizer.pre.as_deref(), Some("smollm"));
    assert_eq!(tokenizer.tokens, 49_152);
    assert!(tokenizer.template_from_file);
    // 30 layers × (K and V) × 3 KV heads × 64 wide × 2 bytes (f16).
    let memory = check.memory.unwrap();
    assert_eq!(memory.kv_bytes_per_token, 30 * 2 * 3 * 64 * 2);
    assert_eq!(memory.kv_bytes_at_context, 23_040 * 8192);
    let model = support::load(
        &support::default_model_path(),
        support::DEFAULT_MODEL_ID,
        "smollm2",
    );
    let kernels = model.kernel_llama().unwrap();
    assert_eq!(
        memory.kv_bytes_per_token as usize * 16,
        kernels.kv_pool(1).block_bytes()
    );
    // The tensor table's bytes are the file's, less its header.
    assert_eq!(
        check.tensor_types.iter().map(|t| t.tensors).sum::<usize>(),
        30 * 9 + 2
    );
    assert!(memory.weights_bytes < check.file_bytes);
    assert!(memory.weights_bytes > check.file_bytes * 9 / 10);
    assert_eq!(check.tensor_types[0].dtype, "Q4_1");
}

#[test]
fn a_refusal_the_header_decides_reads_as_loading_says_it() {
    let dir = tempfile::tempdir().unwrap();
    // (file, metadata changed, what both must name)
    type Case<'a> = (&'a str, &'a [(&'a str, Value)], &'a str);
    let cases: [Case; 3] = [
        (
            "yarn",
            &[
                ("llama.rope.scaling.type", Value::String("yarn".into())),
                ("llama.rope.scaling.factor", Value::F32(4.0)),
            ],
            "rope scaling `yarn`",
        ),
        (
            "pre",
            &[("tokenizer.ggml.pre", Value::String("no-such-pre".into()))],
            "no-such-pre",
        ),
        (
            "arch",
            &[("general.architecture", Value::String("mamba".into()))],
            "architecture `mamba`",
        ),
    ];
    for (name, changes, named) in cases {
        let path = dir.path().join(format!("{name}.gguf"));
        support::with_metadata(&support::default_model_path(), &path, changes);
        let check = check_file(&path).unwrap();
        assert!(!check.will_serve(), "{name}");
        assert_eq!(check.problems.len(), 1, "{name}: {:?}", check.problems);
        let problem = &check.problems[0];
        assert!(problem.contains(named), "{name}: {problem}");
        let loading = load_error(&path);
        assert!(
            loading.contains(named),
            "{name}: loading said {loading}, the check {problem}"
        );
    }
}

#[test]
fn a_file_that_is_not_gguf_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.gguf");
    std::fs::write(&path, b"not a model").unwrap();
    let err = check_file(&path).unwrap_err().to_string();
    assert!(err.contains("notes.gguf"), "{err}");
}

/// A template that has no system role (Gemma 2's refuses one by name) serves: system
/// messages are merged into the next user turn, as llama.cpp does, and the check says
/// so; a template that renders nothing at all is a problem.
#[test]
fn a_template_without_a_system_role_serves_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let no_system = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for m in messages %}<turn>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<turn>model\n{% endif %}";
    let path = dir.path().join("no-system.gguf");
    let template = Value::String(no_system.into());
    support::with_metadata(
        &support::default_model_path(),
        &path,
        &[("tokenizer.chat_template", template)],
    );
    let check = check_file(&path).unwrap();
    assert!(check.will_serve(), "{:?}", check.problems);
    assert!(check.tokenizer.as_ref().is_some_and(|t| !t.system_role));
    let catalog = check_file(&support::default_model_path()).unwrap();
    assert!(catalog.tokenizer.is_some_and(|t| t.system_role));

    let broken = dir.path().join("broken.gguf");
    let template = Value::String("{{ raise_exception('no chats here') }}".into());
    support::with_metadata(
        &support::default_model_path(),
        &broken,
        &[("tokenizer.chat_template", template)],
    );
    let check = check_file(&broken).unwrap();
    assert!(!check.will_serve());
    assert!(
        check.problems[0].contains("no chats here"),
        "{:?}",
        check.problems
    );
}
