#![allow(clippy::unwrap_used)]
//! Constrained decoding on the real models (SmolLM2-135M-Instruct, and Gemma 3 270M): a JSON schema or
//! "a JSON object" holds where the model left to itself answers prose, and the masks
//! depend only on the format and the tokens so far, so a resumed job (a failover, a
//! verifier's replay) reproduces the uninterrupted one token for token, and a
//! teacher-forced replay reproduces every committed fingerprint.

mod support;

use serde_json::Value;
use sharemesh_engine::{GenerateRequest, Generation, LoadedModel, ReplayRequest};
use sharemesh_protocol::{ChatMessage, OutputFormat, Prompt, Role, Sampling};

const PERSON: &str = r#"{"type": "object", "properties": {"name": {"type": "string"},
    "age": {"type": "integer"}, "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]}},
    "required": ["name", "age", "city"], "additionalProperties": false}"#;

fn load() -> LoadedModel {
    let path = support::default_model_path();
    support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-135m-instruct")
}

fn ask(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: text.into(),
    }])
}

fn run(
    model: &mut LoadedModel,
    prompt: &Prompt,
    sampling: &Sampling,
    resume: Vec<u32>,
) -> Result<Generation, sharemesh_engine::EngineError> {
    let request = GenerateRequest {
        model: model.descriptor.id,
        prompt: prompt.clone(),
        sampling: sampling.clone(),
        resume,
        ignore_eos: false,
        interruptible: false,
        prefix_salt: [0; 32],
    };
    model.generate(&request, |_| true)
}

fn in_format(format: OutputFormat, temperature: f32) -> Sampling {
    Sampling {
        temperature,
        seed: 11,
        max_tokens: 80,
        format,
        ..Sampling::default()
    }
}

/// The person object the schema asks for, or why the text is not one.
fn person(text: &str) -> Result<(String, i64, String), String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let object = value.as_object().ok_or("not an object")?;
    if object.len() != 3 {
        return Err(format!("{} keys", object.len()));
    }
    let name = object["name"].as_str().ok_or("name is not a string")?;
    let age = object["age"].as_i64().ok_or("age is not an integer")?;
    let city = object["city"].as_str().ok_or("city is not a string")?;
    if !["Paris", "Lyon", "Nice"].contains(&city) {
        return Err(format!("city {city} is not in the enum"));
    }
    Ok((name.to_owned(), age, city.to_owned()))
}

#[test]
fn a_schema_holds_where_the_model_alone_answers_prose_and_resumes_exactly() {
    let mut model = load();
    let prompt = ask("Tell me about a French woman named Alice who is 31.");
    let free = run(
        &mut model,
        &prompt,
        &in_format(OutputFormat::Free, 0.0),
        vec![],
    )
    .unwrap();
    assert!(
        person(&free.text).is_err(),
        "left to itself the model answers prose: {}",
        free.text
    );
    for temperature in [0.0, 0.8] {
        let sampling = in_format(OutputFormat::JsonSchema(PERSON.into()), temperature);
        let constrained = run(&mut model, &prompt, &sampling, vec![]).unwrap();
        let parsed = person(&constrained.text);
        assert!(
            parsed.is_ok(),
            "at temperature {temperature}: {parsed:?} in {}",
            constrained.text
        );
        assert_eq!(constrained.finish, sharemesh_protocol::FinishReason::Stop);
        // A failover at any point continues exactly (the masks replay).
        let tokens = &constrained.token_ids;
        for cut in [1, tokens.len() / 3, tokens.len() / 2, tokens.len() - 1] {
            let resumed = run(&mut model, &prompt, &sampling, tokens[..cut].to_vec()).unwrap();
            assert_eq!(
                &resumed.token_ids, tokens,
                "resume at {cut}, temperature {temperature}"
            );
        }
    }
}

#[test]
fn a_verifier_replays_a_constrained_job_bit_for_bit() {
    // The fingerprints are of the raw logits, before the format's mask: a teacher-forced
    // replay (which knows nothing of the format) reproduces every one, fresh or resumed.
    let mut model = load();
    let prompt = ask("Tell me about a French woman named Alice who is 31.");
    let sampling = in_format(OutputFormat::JsonSchema(PERSON.into()), 0.8);
    let serve = |model: &mut LoadedModel, resume: Vec<u32>| {
        let request = GenerateRequest {
            model: model.descriptor.id,
            prompt: prompt.clone(),
            sampling: sampling.clone(),
            resume,
            ignore_eos: true, // even so, a finished format ends the text
            interruptible: false,
            prefix_salt: [0; 32],
        };
        let mut fingerprints = Vec::new();
        let generation = model
            .generate(&request, |event| {
                fingerprints.push(event.fingerprint.clone());
                true
            })
            .unwrap();
        (generation.token_ids, fingerprints)
    };
    let (tokens, committed) = serve(&mut model, vec![]);
    assert!(person(&model.vocabulary.tokenizer.decode(&tokens)).is_ok());
    // The redraw does know it: each delivered token is the seeded draw under the
    // format's mask (fresh, or after a resumed prefix the mask has followed).
    let replay = |model: &mut LoadedModel, from: usize| {
        let request = ReplayRequest {
            model: model.descriptor.id,
            prompt: prompt.clone(),
            outputs: tokens.clone(),
            from,
            sampling: sampling.clone(),
        };
        let replayed = model.replay(&request).unwrap();
        assert_eq!(replayed.drawn, tokens[from..], "draws from {from}");
        replayed.fingerprints
    };
    assert_eq!(replay(&mut model, 0), committed);
    let cut = tokens.len() / 2;
    let (resumed, resumed_committed) = serve(&mut model, tokens[..cut].to_vec());
    assert_eq!(resumed, tokens);
    assert_eq!(replay(&mut model, cut), resumed_committed);
}

#[test]
fn gemma_holds_to_a_schema_too() {
    // The other catalog model (Gemma 3 270M, its own graph and SentencePiece vocabulary).
    let path = support::gemma3_model_path();
    let mut model = support::load(&path, support::GEMMA3_MODEL_ID, "gemma3-270m");
    let prompt = ask("Tell me about a French woman named Alice who is 31.");
    let free = run(
        &mut model,
        &prompt,
        &in_format(OutputFormat::Free, 0.0),
        vec![],
    )
    .unwrap();
    assert!(person(&free.text).is_err(), "unconstrained: {}", free.text);
    let sampling = in_format(OutputFormat::JsonSchema(PERSON.into()), 0.0);
    let constrained = run(&mut model, &prompt, &sampling, vec![]).unwrap();
    assert!(
        person(&constrained.text).is_ok(),
        "{:?} in {}",
        person(&constrained.text),
        constrained.text
    );
    let cut = constrained.token_ids.len() / 2;
    let resumed = run(
        &mut model,
        &prompt,
        &sampling,
        constrained.token_ids[..cut].to_vec(),
    )
    .unwrap();
    assert_eq!(resumed.token_ids, constrained.token_ids, "resume at {cut}");
}

#[test]
fn a_json_object_is_always_one_whole_object() {
    let mut model = load();
    let prompt = ask("List three colours.");
    let generation = run(
        &mut model,
        &prompt,
        &in_format(OutputFormat::JsonObject, 0.0),
        vec![],
    )
    .unwrap();
    let value: Value = serde_json::from_str(&generation.text)
        .unwrap_or_else(|e| panic!("{e}: {}", generation.text));
    assert!(value.is_object(), "{value}");
}

#[test]
fn bad_formats_and_resumes_outside_the_format_are_clear_errors() {
    let mut model = load();
    let prompt = ask("Hi");
    let not_json = run(
        &mut model,
        &prompt,
        &in_format(OutputFormat::JsonSchema("{not json".into()), 0.0),
        vec![],
    )
    .unwrap_err()
    .to_string();
    assert!(not_json.contains("not valid JSON"), "{not_json}");
    let unknown = run(
        &mut model,
        &prompt,
        &in_format(
            OutputFormat::JsonSchema(r#"{"type": "frobnicate"}"#.into()),
            0.0,
        ),
        vec![],
    )
    .unwrap_err()
    .to_string();
    assert!(unknown.contains("response format"), "{unknown}");
    // A resumed prefix the format forbids (prose where JSON must begin): refused, not
    // continued.
    let prose = model.vocabulary.tokenizer.encode("Hello").unwrap();
    let refused = run(
        &mut model,
        &prompt,
        &in_format(OutputFormat::JsonObject, 0.0),
        prose,
    )
    .unwrap_err()
    .to_string();
    assert!(refused.contains("resumed token at index 0"), "{refused}");
}
