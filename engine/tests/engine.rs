#![allow(clippy::unwrap_used)]
//! The engine on the real model (SmolLM2-135M-Instruct Q4_1), compared with llama.cpp
//! reference ids stored in tests/fixtures (see scripts/make-fixtures.py).

mod support;

use support::ids;

use serde_json::Value;
use sharemesh_engine::{GenerateRequest, LoadedModel};
use sharemesh_protocol::{ChatMessage, FinishReason, ModelId, Prompt, Role, Sampling};

fn load() -> LoadedModel {
    let path = support::default_model_path();
    support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-135m-instruct")
}

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/llama_cpp_reference.json")).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Greedy generation of `n` tokens from a fixture case's prompt ids.
fn greedy_on_tokens(
    model: &mut LoadedModel,
    case: &Value,
    n: usize,
) -> sharemesh_engine::Generation {
    run(
        model,
        Prompt::Tokens(ids(&case["prompt_ids"])),
        greedy(n as u32),
        vec![],
    )
}

fn user(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: text.into(),
    }])
}

fn greedy(max_tokens: u32) -> Sampling {
    Sampling {
        max_tokens,
        ..Sampling::default()
    }
}

fn run(
    model: &mut LoadedModel,
    prompt: Prompt,
    sampling: Sampling,
    resume: Vec<u32>,
) -> sharemesh_engine::Generation {
    let request = GenerateRequest {
        model: model.descriptor.id,
        prompt,
        sampling,
        resume,
        ignore_eos: false,
        interruptible: false,
        prefix_salt: [0; 32],
    };
    model.generate(&request, |_| true).unwrap()
}

#[test]
fn tokenizer_matches_llama_cpp() {
    let model = load();
    let fixture = fixture();
    for case in fixture["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            model.vocabulary.tokenizer.encode(text).unwrap(),
            ids(&case["ids"]),
            "tokenizing {text:?}"
        );
        // Decoding gives the text back (control tokens are not rendered).
        if !text.contains("<|") {
            assert_eq!(model.vocabulary.tokenizer.decode(&ids(&case["ids"])), text);
        }
    }
}

#[test]
fn chat_prompts_render_and_tokenize_like_llama_cpp() {
    let model = load();
    for case in fixture()["generation"].as_array().unwrap() {
        let Some(messages) = case.get("messages") else {
            continue;
        };
        let messages: Vec<ChatMessage> = messages
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage {
                role: serde_json::from_value(m["role"].clone()).unwrap(),
                content: m["content"].as_str().unwrap().into(),
            })
            .collect();
        assert_eq!(
            model.prompt_tokens(&Prompt::Chat(messages)).unwrap(),
            ids(&case["prompt_ids"])
        );
    }
}

/// Greedy ids on a raw-text prompt equal llama.cpp's until a genuine near-tie (llama.cpp's
/// own top-2 margin under 0.25 logits; here position 14, margin 0.087).
///
/// On chat prompts llama.cpp (llama-cpp-python 0.3.16, F32 KV cache) departs from the
/// exact forward pass early, so they are compared with that pass instead (below).
#[test]
fn greedy_ids_match_llama_cpp_on_raw_text() {
    let mut model = load();
    let fixture = fixture();
    let case = fixture["generation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c.get("raw").is_some())
        .unwrap();
    let reference = ids(&case["greedy_ids"]);
    let margins = floats(&case["margins"]);
    let ours = greedy_on_tokens(&mut model, case, reference.len());
    let agree = ours
        .token_ids
        .iter()
        .zip(&reference)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(
        agree >= 14,
        "agreed for {agree} tokens: ours {:?} llama.cpp {reference:?}",
        ours.token_ids
    );
    if agree < reference.len() {
        assert!(
            margins[agree] < 0.25,
            "diverged at {agree} where llama.cpp's margin is {}",
            margins[agree]
        );
    }
}

/// Greedy ids equal an exact forward pass of the same weights (float64, no activation
/// quantization; scripts/make-exact-reference.py) up to the reference's first near-tie
/// (top-2 margin under 0.25 logits, where the Q8_1 activation rounding that candle and
/// llama.cpp both use may legitimately flip the choice), and for at least 16 tokens on
/// one chat prompt. llama.cpp itself departs from this reference within the first three
/// tokens on three of the five chat prompts (see the README), which is why chat
/// prompts are judged against the exact pass rather than against llama.cpp.
///
/// Re-judged for the kernels' arithmetic version 3 (version 2's whole-block integer
/// sums, and a half-precision KV cache): the prompts agree for 8/8, 2/12, 0/24, 18/18,
/// 21/21 and 5/24 tokens, each parting where the exact pass's margin is 0.064, 0.012
/// and 0.220 logits; version 2 agreed 17/18 and 11/21 on the fourth and fifth (parting
/// at margins 0.196 and 0.105), version 1 12/12 and 21/21 on the second and fifth. Which side of
/// a near-tie a quantized pass lands on is the activation rounding's draw, not accuracy:
/// both versions stay as close to the float logits (`qwen2_kernels`, `gemma3_candle`).
#[test]
fn greedy_ids_match_the_exact_reference_on_chat_prompts() {
    let mut model = load();
    let fixture: Value =
        serde_json::from_str(include_str!("fixtures/exact_reference.json")).unwrap();
    let mut long_agreements = 0;
    for case in fixture["generation"].as_array().unwrap() {
        let reference = ids(&case["greedy_ids"]);
        let margins = floats(&case["margins"]);
        let ours = greedy_on_tokens(&mut model, case, reference.len());
        let mut produced = ours.token_ids.clone();
        // The reference lists the end-of-turn token it chose; the engine reports it as
        // finish = stop instead of emitting it.
        if ours.finish == FinishReason::Stop {
            produced.push(reference.get(produced.len()).copied().unwrap_or(u32::MAX));
        }
        let agree = produced
            .iter()
            .zip(&reference)
            .take_while(|(a, b)| a == b)
            .count();
        eprintln!(
            "{}: agree for {agree} of {} tokens{}",
            case.get("raw").unwrap_or(&case["messages"][0]["content"]),
            reference.len(),
            margins
                .get(agree)
                .filter(|_| agree < reference.len())
                .map(|m| format!(" (exact margin there {m})"))
                .unwrap_or_default()
        );
        if agree < reference.len() {
            assert!(
                margins[agree] < 0.25,
                "diverged at {agree} where the exact margin is {}: ours {produced:?} exact {reference:?}",
                margins[agree]
            );
        }
        if case.get("messages").is_some() && agree >= 16 {
            long_agreements += 1;
        }
    }
    assert!(
        long_agreements >= 1,
        "only {long_agreements} chat prompts agreed for 16 tokens"
    );
}

#[test]
fn known_answers() {
    let mut model = load();
    let capital = run(
        &mut model,
        user("What is the capital of France? Answer in one word."),
        greedy(32),
        vec![],
    );
    assert_eq!(capital.text, "The capital of France is Paris.");
    assert_eq!(capital.finish, FinishReason::Stop);
    // The exact float64 pass (fixture exact_reference.json) answers "The answer to this
    // classic math problem is 4."; its margin at "to" is only 0.06 logits, where the
    // kernels' arithmetic version 2 (and candle) take "is".
    let sum = run(&mut model, user("What is 2 + 2?"), greedy(32), vec![]);
    assert_eq!(sum.text, "The answer is 4.");
    let raw = run(
        &mut model,
        Prompt::Text("The capital of France is".into()),
        greedy(8),
        vec![],
    );
    assert!(raw.text.starts_with(" Paris."), "{:?}", raw.text);
    assert_eq!(raw.finish, FinishReason::Length);
    // Same request, same tokens.
    let again = run(
        &mut model,
        user("What is the capital of France? Answer in one word."),
        greedy(32),
        vec![],
    );
    assert_eq!(again.token_ids, capital.token_ids);
}

#[test]
fn prefill_gives_the_same_logit_bits_as_one_token_decoding() {
    let mut model = load();
    assert!(
        model.batch_invariant(),
        "the default model should run on sharemesh's kernels"
    );
    let mut tokens = model
        .prompt_tokens(&user("Write a short poem about the sea."))
        .unwrap();
    tokens.extend([
        504, 6147, 282, 260, 5065, 28, 253, 14886, 17942, 351, 1029, 28, 198,
    ]);
    let decoded = model.logits_after(&tokens, 1).unwrap();
    for chunk in [tokens.len(), 7, 2] {
        let prefilled = model.logits_after(&tokens, chunk).unwrap();
        let differing = decoded
            .iter()
            .zip(&prefilled)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differing, 0, "chunks of {chunk}: {differing} logits differ");
    }
}

#[test]
fn a_following_job_reuses_the_shared_prefix_and_stays_exact() {
    let mut model = load();
    let prompt = user("Write a short poem about the sea.");
    let prompt_len = model.prompt_tokens(&prompt).unwrap().len() as u32;
    let full = run(&mut model, prompt.clone(), greedy(16), vec![]);
    assert_eq!(full.reused_tokens, 0);
    assert_eq!(full.prefilled_tokens, prompt_len);
    // The cache now holds the prompt and 15 completion tokens (the 16th was never fed).
    let resumed = run(
        &mut model,
        prompt.clone(),
        greedy(16),
        full.token_ids[..10].to_vec(),
    );
    assert_eq!(resumed.token_ids, full.token_ids);
    assert_eq!(
        resumed.reused_tokens,
        prompt_len + 9,
        "one token must run for logits"
    );
    assert_eq!(resumed.prefilled_tokens, 1);
    // Another prompt shares only the chat template's opening.
    let other = run(&mut model, user("Name a colour."), greedy(4), vec![]);
    assert!(
        other.reused_tokens < prompt_len - 4,
        "{}",
        other.reused_tokens
    );
    // Back to the first prompt: same tokens as the first, cold run.
    let again = run(&mut model, prompt, greedy(16), vec![]);
    assert_eq!(again.token_ids, full.token_ids);
}

#[test]
fn resume_from_every_cut_point_equals_the_uninterrupted_run() {
    let mut model = load();
    let prompt = user("Write a short poem about the sea.");
    let full = run(&mut model, prompt.clone(), greedy(16), vec![]);
    assert_eq!(full.token_ids.len(), 16);
    for cut in 1..full.token_ids.len() {
        let resumed = run(
            &mut model,
            prompt.clone(),
            greedy(16),
            full.token_ids[..cut].to_vec(),
        );
        assert_eq!(resumed.token_ids, full.token_ids, "resume at {cut}");
    }
    // Sampled (seeded) generation resumes exactly too.
    let sampled = Sampling {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 40,
        seed: 7,
        max_tokens: 12,
        ..Sampling::default()
    };
    let full = run(&mut model, prompt.clone(), sampled.clone(), vec![]);
    for cut in [1, 5, 11] {
        let resumed = run(
            &mut model,
            prompt.clone(),
            sampled.clone(),
            full.token_ids[..cut].to_vec(),
        );
        assert_eq!(resumed.token_ids, full.token_ids, "sampled resume at {cut}");
    }
}

#[test]
fn penalties_and_biases_change_the_answer_and_resume_exactly() {
    let mut model = load();
    let prompt = user("Write a short poem about the sea.");
    let plain = run(&mut model, prompt.clone(), greedy(24), vec![]);
    // A frequency penalty steers away from repeated tokens: another answer.
    let penalised = Sampling {
        frequency_penalty: 1.5,
        presence_penalty: 0.5,
        ..greedy(24)
    };
    let full = run(&mut model, prompt.clone(), penalised.clone(), vec![]);
    assert_ne!(full.token_ids, plain.token_ids);
    // The penalties count the completion so far, resumed tokens included: exact resume.
    for cut in [1, 7, 16, 23] {
        let resumed = run(
            &mut model,
            prompt.clone(),
            penalised.clone(),
            full.token_ids[..cut].to_vec(),
        );
        assert_eq!(resumed.token_ids, full.token_ids, "resume at {cut}");
    }
    // A bias of -100 bans the greedy first token; +100 forces another one.
    let first = plain.token_ids[0];
    let banned = Sampling {
        logit_bias: vec![(first, -100.0)],
        ..greedy(4)
    };
    assert_ne!(
        run(&mut model, prompt.clone(), banned, vec![]).token_ids[0],
        first
    );
    let forced = Sampling {
        logit_bias: vec![(300, 100.0)],
        ..greedy(1)
    };
    assert_eq!(
        run(&mut model, prompt.clone(), forced, vec![]).token_ids,
        [300]
    );
    // A biased token outside the vocabulary is a clear error.
    let outside = GenerateRequest {
        model: model.descriptor.id,
        prompt,
        sampling: Sampling {
            logit_bias: vec![(10_000_000, 1.0)],
            ..greedy(1)
        },
        resume: vec![],
        ignore_eos: false,
        interruptible: false,
        prefix_salt: [0; 32],
    };
    let err = model.generate(&outside, |_| true).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
}

#[test]
fn streamed_deltas_concatenate_to_the_final_text() {
    let mut model = load();
    let request = GenerateRequest {
        model: model.descriptor.id,
        prompt: user("Write a short poem about the sea, with emoji 🌊."),
        sampling: greedy(40),
        resume: vec![],
        ignore_eos: false,
        interruptible: false,
        prefix_salt: [0; 32],
    };
    let mut streamed = String::new();
    let mut indices = Vec::new();
    let generation = model
        .generate(&request, |event| {
            streamed.push_str(&event.text_delta);
            indices.push(event.index);
            true
        })
        .unwrap();
    assert_eq!(streamed, generation.text);
    assert_eq!(
        indices,
        (0..generation.token_ids.len() as u32).collect::<Vec<_>>()
    );
}

#[test]
fn stop_sequences_cut_the_text() {
    let mut model = load();
    let sampling = Sampling {
        stop: vec!["\n\n".into()],
        ..greedy(16)
    };
    let g = run(
        &mut model,
        Prompt::Text("The capital of France is".into()),
        sampling,
        vec![],
    );
    assert_eq!(g.text, " Paris.");
    assert_eq!(g.finish, FinishReason::Stop);
}

#[test]
fn cancelling_stops_within_one_token() {
    let mut model = load();
    let request = GenerateRequest {
        model: model.descriptor.id,
        prompt: user("Count to fifty."),
        sampling: greedy(64),
        resume: vec![],
        ignore_eos: false,
        interruptible: false,
        prefix_salt: [0; 32],
    };
    let mut seen = 0;
    let g = model
        .generate(&request, |_| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!(g.finish, FinishReason::Cancelled);
    assert_eq!(g.token_ids.len(), 3);
}

#[test]
fn bad_requests_are_clear_errors() {
    let mut model = load();
    let id = model.descriptor.id;
    let long = Prompt::Tokens(vec![42; 9000]);
    let err = model
        .generate(
            &GenerateRequest {
                model: id,
                prompt: long,
                sampling: greedy(4),
                resume: vec![],
                ignore_eos: false,
                interruptible: false,
                prefix_salt: [0; 32],
            },
            |_| true,
        )
        .unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
    let err = model
        .generate(
            &GenerateRequest {
                model: id,
                prompt: Prompt::Tokens(vec![1_000_000]),
                sampling: greedy(4),
                resume: vec![],
                ignore_eos: false,
                interruptible: false,
                prefix_salt: [0; 32],
            },
            |_| true,
        )
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    let bad = Sampling {
        temperature: -1.0,
        ..greedy(4)
    };
    let err = model
        .generate(
            &GenerateRequest {
                model: id,
                prompt: user("hi"),
                sampling: bad,
                resume: vec![],
                ignore_eos: false,
                interruptible: false,
                prefix_salt: [0; 32],
            },
            |_| true,
        )
        .unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
    let err = model
        .generate(
            &GenerateRequest {
                model: id,
                prompt: Prompt::Chat(vec![]),
                sampling: greedy(4),
                resume: vec![],
                ignore_eos: false,
                interruptible: false,
                prefix_salt: [0; 32],
            },
            |_| true,
        )
        .unwrap_err();
    assert!(err.to_string().contains("messages"), "{err}");
}

#[test]
fn corrupt_and_truncated_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let id = ModelId::from_bytes([0; 32]);
    let missing = LoadedModel::load(
        &dir.path().join("nope.gguf"),
        id,
        "x",
        candle_core::Device::Cpu,
    )
    .err()
    .unwrap();
    assert!(missing.to_string().contains("nope.gguf"), "{missing}");
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a gguf file at all").unwrap();
    let err = LoadedModel::load(&garbage, id, "x", candle_core::Device::Cpu)
        .err()
        .unwrap();
    assert!(err.to_string().contains("not a readable GGUF"), "{err}");
    let real = std::fs::read(support::default_model_path()).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &real[..real.len() / 2]).unwrap();
    let err = LoadedModel::load(&truncated, id, "x", candle_core::Device::Cpu)
        .err()
        .unwrap();
    assert!(err.to_string().contains("truncated or corrupt"), "{err}");
    let header_only = dir.path().join("header.gguf");
    std::fs::write(&header_only, &real[..4096]).unwrap();
    assert!(LoadedModel::load(&header_only, id, "x", candle_core::Device::Cpu).is_err());
}

/// What a model needs in memory, from its header alone (what a gateway holds): the
/// tensor table sizes the weights to within the file's alignment padding, for both
/// catalog models (Q4_1, and Q4_K_M with Q6_K and F32 tensors), and the KV cache per
/// token follows the attention shape.
#[test]
fn a_header_bounds_the_memory_a_model_needs() {
    for (path, kv_per_token) in [
        // SmolLM2-135M: 30 layers × 3 KV heads × 64 (K and V, a byte each).
        (support::default_model_path(), 2 * 30 * 3 * 64),
        // Gemma 3 270M: 18 layers × 1 KV head × 256.
        (support::gemma3_model_path(), 2 * 18 * 256),
    ] {
        let file = std::fs::File::open(&path).unwrap();
        let header =
            sharemesh_tokenizer::gguf::read_header(std::io::BufReader::new(&file)).unwrap();
        let data = file.metadata().unwrap().len() - header.tensor_data_offset;
        let memory = sharemesh_tokenizer::ModelMemory::of(&header);
        assert!(
            memory.weights_bytes <= data && data - memory.weights_bytes < 64,
            "{}: {} of {data}",
            path.display(),
            memory.weights_bytes
        );
        assert_eq!(
            memory.kv_bytes_per_token,
            kv_per_token,
            "{}",
            path.display()
        );
        assert_eq!(
            memory.needed_for(2048),
            memory.weights_bytes + 2048 * kv_per_token
        );
    }
}

/// On the single-job path (phi3 on candle: `SHAREMESH_KERNELS=candle`; every other
/// architecture batches there too), a job whose consumer stops reading never holds the
/// engine thread: its events queue beside the channel, the job runs to its end, and
/// the job queued behind it runs and finishes while the first one's consumer has
/// still read nothing. The first one's events all arrive, in order, once it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_stops_reading_cannot_hold_the_single_job_engine() {
    use sharemesh_engine::{Engine, EngineEvent, TokenEngine, EVENT_BUFFER};
    std::env::set_var("SHAREMESH_KERNELS", "candle");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2-as-phi3.gguf");
    support::qwen2::write_phi3_from_llama(&support::default_model_path(), &path);
    let model = support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-as-phi3");
    assert_eq!(model.backend(), "cpu/candle");
    assert!(!model.batches(), "the single-job path");
    let id = model.descriptor.id;
    let engine = Engine::spawn(vec![model], 8);
    let request = |max_tokens| GenerateRequest {
        model: id,
        prompt: Prompt::Text("Once upon a time".into()),
        sampling: Sampling {
            max_tokens,
            ..Sampling::default()
        },
        resume: vec![],
        ignore_eos: true,
        interruptible: false,
        prefix_salt: [0; 32],
    };
    // Not read until the job behind it finished: its channel fills after EVENT_BUFFER
    // events.
    let stuck_tokens = 2 * EVENT_BUFFER as u32;
    let mut stuck = engine.submit(request(stuck_tokens)).unwrap();
    let mut behind = engine.submit(request(4)).unwrap();
    let finished = loop {
        match behind.recv().await {
            Some(EngineEvent::Finished(generation)) => break generation,
            Some(EngineEvent::Failed(err)) => panic!("{err}"),
            Some(_) => {}
            None => panic!("the job behind ended without finishing"),
        }
    };
    assert_eq!(finished.token_ids.len(), 4);
    assert_eq!(
        stuck.len(),
        EVENT_BUFFER,
        "nothing of the first job was read yet"
    );
    let (mut tokens, mut ended) = (Vec::new(), None);
    while let Some(event) = stuck.recv().await {
        match event {
            EngineEvent::Token(token) => tokens.push(token.index),
            EngineEvent::Finished(generation) => ended = Some(generation),
            EngineEvent::Failed(err) => panic!("{err}"),
            EngineEvent::Started { .. } => {}
        }
    }
    assert_eq!(tokens, (0..stuck_tokens).collect::<Vec<_>>());
    assert_eq!(
        ended.expect("finished").token_ids.len(),
        stuck_tokens as usize
    );
}
