#![allow(clippy::unwrap_used)]
//! Batched decoding on the real models (SmolLM2-135M-Instruct Q4_1; Gemma 3 270M for
//! the batch-invariance promise on its q/k norms, GELU and sliding-window layers): several sequences
//! share every step — joining mid-way, prefilling in chunks beside others' decoding,
//! leaving when done, in a different order each step — and every sequence's logits are,
//! bit for bit, the ones it gets served alone.

mod support;

use sharemesh_engine::{
    BatchEntry, BatchSettings, Engine, EngineError, EngineEvent, GenerateRequest, KvPool,
    LoadedModel, SequenceCache, TokenEngine,
};
use sharemesh_protocol::{ChatMessage, FinishReason, Prompt, Role, Sampling};

fn user(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage {
        role: Role::User,
        content: text.into(),
    }])
}

/// One sequence of the batch: its prompt, what has been fed, its greedy tokens so far,
/// and the logits it got after each fed position that ends a step.
struct Sequence {
    cache: SequenceCache,
    history: Vec<u32>,
    prompt_len: usize,
    fed: usize,
    /// (history length the logits follow, the logits)
    seen: Vec<(usize, Vec<f32>)>,
    joins_at_step: usize,
}

const GENERATE: usize = 6;

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

const PROMPTS: [(&str, usize); 3] = [
    ("Write a short poem about the sea.", 0),
    ("What is 2 + 2?", 0),
    (
        "Name three colours of the rainbow and say why the sky is blue.",
        2,
    ),
];

#[test]
fn batched_sequences_get_their_solo_logits_bit_for_bit() {
    let path = support::default_model_path();
    let mut model: LoadedModel =
        support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-135m-instruct");
    let sequences = run_batched(&model);
    assert_solo(&mut model, &sequences);
}

/// Gemma 3 on the kernels makes the same promise: each batched sequence's logits are
/// its solo bits.
#[test]
fn gemma_batched_sequences_get_their_solo_logits_bit_for_bit() {
    let path = support::gemma3_model_path();
    let mut model = support::load(&path, support::GEMMA3_MODEL_ID, "gemma3-270m");
    let sequences = run_batched(&model);
    assert_solo(&mut model, &sequences);
}

/// The same batch on two kernel threads, each sequence checked against its solo run on
/// one: the thread count changes no bit either.
#[test]
fn batched_on_two_threads_equals_solo_on_one() {
    let path = support::default_model_path();
    let id: sharemesh_protocol::ModelId = support::DEFAULT_MODEL_ID.parse().unwrap();
    // The kernels size their pool from this at load; each model keeps its own.
    sharemesh_engine::set_threads(2);
    let two = LoadedModel::load(
        &path,
        id,
        "smollm2-135m-instruct",
        sharemesh_engine::Device::Cpu,
    )
    .unwrap();
    let mut one = support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-135m-instruct");
    let sequences = run_batched(&two);
    assert_solo(&mut one, &sequences);
}

/// Runs [`PROMPTS`] as one batch — joining mid-way, prompts in chunks of 7 beside
/// others' decoding, leaving when done, in a different order each step — for
/// [`GENERATE`] greedy tokens each.
fn run_batched(model: &LoadedModel) -> Vec<Sequence> {
    let mut sequences: Vec<Sequence> = PROMPTS
        .iter()
        .map(|(text, joins_at_step)| {
            let history = model.prompt_tokens(&user(text)).unwrap();
            Sequence {
                cache: model.kernel_llama().unwrap().new_sequence(),
                prompt_len: history.len(),
                history,
                fed: 0,
                seen: Vec::new(),
                joins_at_step: *joins_at_step,
            }
        })
        .collect();
    let llama = model
        .kernel_llama()
        .expect("the default model runs on the kernels");
    let mut step = 0;
    loop {
        // Who takes part this step: joined and not done; prompts go in chunks of 7.
        let mut members: Vec<usize> = (0..sequences.len())
            .filter(|&i| {
                let s = &sequences[i];
                step >= s.joins_at_step && s.history.len() - s.prompt_len < GENERATE
            })
            .collect();
        if members.is_empty() {
            break;
        }
        let turn = step % members.len();
        members.rotate_left(turn);
        let mut feeds: Vec<(usize, Vec<u32>)> = Vec::new();
        for &i in &members {
            let s = &sequences[i];
            let end = if s.fed < s.prompt_len {
                (s.fed + 7).min(s.prompt_len)
            } else {
                s.fed + 1
            };
            feeds.push((i, s.history[s.fed..end].to_vec()));
        }
        // In `members` order (rotated), each with its own cache.
        let mut by_index: Vec<Option<&mut Sequence>> = sequences.iter_mut().map(Some).collect();
        let mut batch: Vec<BatchEntry<'_>> = Vec::new();
        for (i, tokens) in &feeds {
            let s = by_index[*i].take().unwrap();
            let position = s.fed;
            batch.push(BatchEntry {
                cache: &mut s.cache,
                tokens,
                position,
            });
        }
        let logits = llama.forward_batch(&mut batch).unwrap();
        drop(batch);
        drop(by_index);
        for ((i, tokens), logits) in feeds.iter().zip(logits) {
            let s = &mut sequences[*i];
            s.fed += tokens.len();
            if s.fed < s.prompt_len {
                continue; // Mid-prompt: no token yet.
            }
            let next = argmax(&logits);
            s.seen.push((s.fed, logits));
            s.history.push(next);
        }
        step += 1;
        assert!(step < 200, "the batch never finished");
    }
    sequences
}

/// Each sequence alone on `model`: its whole history so far prefilled on the model's
/// own single-sequence path (which equals one-token decoding, another test's claim),
/// and the greedy text the engine serves for each prompt alone.
fn assert_solo(model: &mut LoadedModel, sequences: &[Sequence]) {
    for (index, s) in sequences.iter().enumerate() {
        assert_eq!(s.seen.len(), GENERATE, "sequence {index}");
        for (len, batched) in &s.seen {
            let alone = model.logits_after(&s.history[..*len], *len).unwrap();
            let differing = alone
                .iter()
                .zip(batched)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differing, 0,
                "sequence {index} after {len} tokens: {differing} logits differ from its solo run"
            );
        }
    }
    for (s, (text, _)) in sequences.iter().zip(PROMPTS) {
        let alone = support::greedy_job(model, &user(text), GENERATE as u32, vec![]);
        let batched = &s.history[s.prompt_len..];
        assert_eq!(
            &batched[..alone.token_ids.len()],
            alone.token_ids.as_slice(),
            "{text}"
        );
    }
}

/// The engine runs jobs submitted together in one batch (greedy, sampled with a seed,
/// with a stop sequence, resumed mid-way, with logprobs): each gets exactly the tokens,
/// text, end and logprobs it gets served alone.
#[test]
fn jobs_served_together_by_the_engine_match_their_solo_runs() {
    served_together_match_solo(Backend::Kernels);
}

/// The same jobs on the paged candle graph (the CUDA backend's, here on candle's CPU
/// device): batched steps give each job its solo run's tokens, text, end and logprobs.
#[test]
fn candle_jobs_served_together_match_their_solo_runs() {
    served_together_match_solo(Backend::Candle);
}

fn served_together_match_solo(backend: Backend) {
    let mut model = smollm2(backend);
    let id = model.descriptor.id;
    let job = |text: &str, sampling: Sampling, resume: Vec<u32>| GenerateRequest {
        model: id,
        prompt: user(text),
        sampling,
        resume,
        ignore_eos: false,
        interruptible: false,
        prefix_salt: [0; 32],
    };
    let greedy = |max_tokens| Sampling {
        max_tokens,
        ..Sampling::default()
    };
    let poem = model
        .generate(
            &job("Write a short poem about the sea.", greedy(24), vec![]),
            |_| true,
        )
        .unwrap();
    let mut jobs = vec![
        job("Write a short poem about the sea.", greedy(24), vec![]),
        job(
            "Tell me a story about a dragon.",
            Sampling {
                max_tokens: 20,
                temperature: 0.8,
                top_p: 0.9,
                seed: 7,
                ..Sampling::default()
            },
            vec![],
        ),
        job(
            "Count from one to ten in words.",
            Sampling {
                stop: vec!["five".into()],
                ..greedy(40)
            },
            vec![],
        ),
        // A failover's resume: the poem continued after its first 9 tokens.
        job(
            "Write a short poem about the sea.",
            greedy(24),
            poem.token_ids[..9].to_vec(),
        ),
        job(
            "What is 2 + 2?",
            Sampling {
                logprobs: Some(3),
                ..greedy(12)
            },
            vec![],
        ),
    ];
    jobs.extend((0..4).map(|i| job(&format!("Say the number {i} twice."), greedy(8), vec![])));
    let solo = solo_runs(&mut model, &jobs);
    assert_eq!(solo[3].0, solo[0].0, "the resumed poem is the poem");

    let engine = Engine::spawn(vec![model], 32);
    let (together, most_active) = serve_together(&engine, &jobs);
    assert!(most_active > 1, "the jobs never ran together");
    for (i, (alone, batched)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(alone, batched, "job {i}");
    }
}

/// What a job gave: tokens, text, end, and each token's logprobs (as text).
type Served = (Vec<u32>, String, FinishReason, Vec<String>);

/// Each job served alone by the model's single-job path.
fn solo_runs(model: &mut LoadedModel, jobs: &[GenerateRequest]) -> Vec<Served> {
    jobs.iter()
        .map(|request| {
            let mut logprobs = Vec::new();
            let generation = model
                .generate(request, |event| {
                    logprobs.push(format!("{:?}", event.logprobs));
                    true
                })
                .unwrap();
            (
                generation.token_ids,
                generation.text,
                generation.finish,
                logprobs,
            )
        })
        .collect()
}

/// The jobs submitted together to `engine`; also the most jobs seen active at once.
fn serve_together(engine: &Engine, jobs: &[GenerateRequest]) -> (Vec<Served>, usize) {
    let runtime = runtime();
    runtime.block_on(async {
        let receivers: Vec<_> = jobs
            .iter()
            .map(|request| engine.submit(request.clone()).unwrap())
            .collect();
        let mut most_active = 0;
        let mut served = Vec::new();
        for mut events in receivers {
            let mut logprobs = Vec::new();
            loop {
                most_active = most_active.max(engine.active_jobs());
                match events.recv().await.unwrap() {
                    EngineEvent::Started { .. } => {}
                    EngineEvent::Token(event) => logprobs.push(format!("{:?}", event.logprobs)),
                    EngineEvent::Finished(g) => {
                        served.push((g.token_ids, g.text, g.finish, logprobs));
                        break;
                    }
                    EngineEvent::Failed(err) => panic!("{err}"),
                }
            }
        }
        (served, most_active)
    })
}

/// A single-threaded runtime for a test's async calls into the engine.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A chat of a system prompt and one question.
fn system_chat(system: &str, question: &str) -> Prompt {
    Prompt::Chat(vec![
        ChatMessage {
            role: Role::System,
            content: system.into(),
        },
        ChatMessage {
            role: Role::User,
            content: question.into(),
        },
    ])
}

/// How many prompt tokens `a` and `b` share from the start.
fn common_prefix(model: &LoadedModel, a: &Prompt, b: &Prompt) -> usize {
    let (a, b) = (
        model.prompt_tokens(a).unwrap(),
        model.prompt_tokens(b).unwrap(),
    );
    a.iter().zip(&b).take_while(|(x, y)| x == y).count()
}

fn greedy_request(model: &LoadedModel, prompt: Prompt, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        ignore_eos: true,
        ..GenerateRequest::greedy(model.descriptor.id, prompt, max_tokens)
    }
}

/// Gemma 3 on the paged candle graph (q/k norms, GELU, post-norms, sliding-window
/// layers with their own rotary base, dense f32 weights; the graph a GPU provider
/// serves the catalog's Gemma with): jobs served together — prefilling beside others'
/// decoding, one of them resumed — equal their solo runs.
#[test]
fn candle_gemma_jobs_served_together_match_their_solo_runs() {
    std::env::set_var("SHAREMESH_KERNELS", "candle");
    let path = support::gemma3_model_path();
    let mut model = support::load(&path, support::GEMMA3_MODEL_ID, "gemma3-270m");
    assert_eq!(model.backend(), "cpu/candle");
    let id = model.descriptor.id;
    let job = |text: &str, max_tokens: u32, resume: Vec<u32>| GenerateRequest {
        resume,
        ..GenerateRequest::greedy(id, user(text), max_tokens)
    };
    let story = model
        .generate(&job("Tell me a story about a dragon.", 10, vec![]), |_| {
            true
        })
        .unwrap();
    let jobs = vec![
        job("Tell me a story about a dragon.", 10, vec![]),
        job("What is 2 + 2?", 6, vec![]),
        job(
            "Tell me a story about a dragon.",
            10,
            story.token_ids[..4].to_vec(),
        ),
        job("Name three colours.", 8, vec![]),
    ];
    let solo = solo_runs(&mut model, &jobs);
    assert_eq!(solo[2].0, solo[0].0, "the resumed story is the story");
    let engine = Engine::spawn(vec![model], 8);
    let (together, most_active) = serve_together(&engine, &jobs);
    assert!(most_active > 1, "the jobs never ran together");
    for (i, (alone, batched)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(alone, batched, "job {i}");
    }
}

/// Bytes of KV cache for `blocks` blocks of the default model (30 layers, 3 KV heads of
/// 64: keys and values of 16 positions) on the kernels.
fn kv_blocks(blocks: usize) -> usize {
    Backend::Kernels.kv_blocks(blocks)
}

/// Which graph serves: the kernels (the CPU default) or the paged candle graph
/// (`SHAREMESH_KERNELS=candle`; nextest runs each test in its own process).
#[derive(Clone, Copy)]
enum Backend {
    Kernels,
    Candle,
}

impl Backend {
    /// Bytes of `blocks` KV blocks of the default model (the kernels keep f16 values,
    /// candle's arena f32).
    fn kv_blocks(self, blocks: usize) -> usize {
        let pool = match self {
            Backend::Kernels => KvPool::new(30, 3, 64, 0),
            Backend::Candle => KvPool::elsewhere(30, 3, 64, 4, 0),
        };
        blocks * pool.block_bytes()
    }
}

/// SmolLM2 on `backend`.
fn smollm2(backend: Backend) -> LoadedModel {
    if let Backend::Candle = backend {
        std::env::set_var("SHAREMESH_KERNELS", "candle");
    }
    let path = support::default_model_path();
    let model = support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-135m-instruct");
    let expected = match backend {
        Backend::Kernels => "cpu/sharemesh-kernels",
        Backend::Candle => "cpu/candle",
    };
    assert_eq!(model.backend(), expected);
    model
}

/// A KV budget too small for every job at once: decoding runs out of blocks, the
/// jobs that joined last are preempted and recomputed, and every job still gets
/// exactly its solo tokens.
#[test]
fn jobs_preempted_for_kv_memory_resume_with_their_solo_tokens() {
    preempted_jobs_keep_their_solo_tokens(Backend::Kernels);
}

/// Preemption on the paged candle graph: its blocks' values live in the graph's arena,
/// the pool keeps the books, and a recomputed job continues with its solo tokens.
#[test]
fn candle_jobs_preempted_for_kv_memory_resume_with_their_solo_tokens() {
    preempted_jobs_keep_their_solo_tokens(Backend::Candle);
}

fn preempted_jobs_keep_their_solo_tokens(backend: Backend) {
    let mut model = smollm2(backend);
    let jobs: Vec<GenerateRequest> = [
        "Write a short poem about the sea.",
        "Tell me a story about a dragon.",
        "Explain how a bicycle works.",
        "Describe rain in three sentences.",
    ]
    .iter()
    .map(|text| greedy_request(&model, user(text), 48))
    .collect();
    let solo = solo_runs(&mut model, &jobs);
    // Each job reaches ~80 positions (6 blocks); 4 × 6 do not fit in 12.
    let settings = BatchSettings {
        max_batch: 4,
        kv_memory_bytes: backend.kv_blocks(12),
    };
    let engine = Engine::spawn_with(vec![model], 8, settings);
    let (together, most_active) = serve_together(&engine, &jobs);
    assert!(most_active > 1, "the jobs never ran together");
    // The engine publishes its figures at the end of the step that sent the last
    // token: wait for that step.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let kv = loop {
        let kv = engine
            .batch_capacity()
            .expect("the kernels' model is paged");
        if kv.available_blocks == kv.total_blocks || std::time::Instant::now() > deadline {
            break kv;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(kv.total_blocks, 12);
    assert!(kv.preemptions > 0, "the budget never ran out: {kv:?}");
    assert_eq!(
        kv.available_blocks, 12,
        "every block is free or only indexed"
    );
    for (i, (alone, batched)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(alone, batched, "job {i}");
    }
}

/// Jobs that share a system prompt start from the blocks an earlier job filled (its
/// full 16-position blocks found by prefix hash, and the block where the prompts part
/// up to their last common token), and still get their solo tokens; a job salted for
/// another buyer does not.
#[test]
fn a_shared_prefix_is_reused_from_indexed_blocks() {
    shared_prefix_is_reused(Backend::Kernels);
}

/// The paged candle graph reuses no prefix across jobs: its bits depend on how positions
/// are split into steps, so a prefix another job computed would not be this job's solo
/// (and a verifier's replay) bits. Each job computes its own and gets its solo tokens.
#[test]
fn candle_reuses_no_prefix_and_keeps_its_solo_tokens() {
    shared_prefix_is_reused(Backend::Candle);
}

fn shared_prefix_is_reused(backend: Backend) {
    let mut model = smollm2(backend);
    let system = "You are a careful assistant for a lighthouse museum. Answer in one short \
                  sentence, use plain words, and never invent dates, names or numbers.";
    let chat = |question: &str| system_chat(system, question);
    let (first, second) = (chat("What is a lighthouse?"), chat("Who kept the light?"));
    let shared = common_prefix(&model, &first, &second);
    assert!(
        !shared.is_multiple_of(16),
        "the prompts part mid-block ({shared})"
    );
    let first = greedy_request(&model, first, 8);
    let second = greedy_request(&model, second, 8);
    let solo = solo_runs(&mut model, &[first.clone(), second.clone()]);
    let engine = Engine::spawn(vec![model], 8);
    let runtime = runtime();
    let run =
        |request: &GenerateRequest| runtime.block_on(engine.complete(request.clone())).unwrap();
    let (a, b) = (run(&first), run(&second));
    assert_eq!(a.reused_tokens, 0);
    let reusable = match backend {
        Backend::Kernels => shared,
        Backend::Candle => 0,
    };
    assert_eq!(
        b.reused_tokens as usize, reusable,
        "every common token is reused (on the kernels)"
    );
    assert_eq!((&a.token_ids, &b.token_ids), (&solo[0].0, &solo[1].0));
    // Another buyer (another salt) shares nothing, however alike the prompts.
    let stranger = GenerateRequest {
        prefix_salt: [9; 32],
        ..second
    };
    let c = run(&stranger);
    assert_eq!(c.reused_tokens, 0);
    assert_eq!(c.token_ids, solo[1].0);
}

/// A burst of one buyer's jobs sharing a long system prompt, submitted together: the
/// first job computes the prompt's blocks, the others wait for them (a step) and start
/// from them instead of computing them again, and every job still gets its solo tokens.
#[test]
fn jobs_waiting_to_prefill_pick_up_the_prefix_an_earlier_job_filled() {
    let path = support::default_model_path();
    let mut model = support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-135m-instruct");
    let system = "You are a careful assistant for a lighthouse museum on a rocky northern \
                  coast. Visitors ask about the keepers, the lamps, the lenses, the fog \
                  signals and the ships that passed. Answer in one short sentence, use \
                  plain words, never invent dates, names or numbers, and say so when the \
                  museum's records do not tell.";
    let chat = |question: &str| system_chat(system, question);
    let questions = [
        "What is a lens?",
        "Who kept the light?",
        "Why fog?",
        "What ships?",
    ];
    // What each job shares with the first, the one that computes the prefix.
    let shared: Vec<usize> = questions
        .iter()
        .map(|q| common_prefix(&model, &chat(questions[0]), &chat(q)))
        .collect();
    assert!(
        shared[1] > 64 && !shared[1].is_multiple_of(16),
        "the first job alone takes half the step's budget; the prompts part mid-block \
         ({shared:?})"
    );
    let jobs: Vec<GenerateRequest> = questions
        .iter()
        .map(|q| greedy_request(&model, chat(q), 4))
        .collect();
    let solo = solo_runs(&mut model, &jobs);
    let settings = BatchSettings {
        max_batch: 4,
        ..BatchSettings::default()
    };
    let engine = Engine::spawn_with(vec![model], 8, settings);
    let receivers: Vec<_> = jobs
        .iter()
        .map(|r| engine.submit(r.clone()).unwrap())
        .collect();
    let runtime = runtime();
    let finished = runtime.block_on(futures::future::join_all(receivers.into_iter().map(
        |mut events| async move {
            while let Some(event) = events.recv().await {
                match event {
                    EngineEvent::Finished(generation) => return generation,
                    EngineEvent::Failed(err) => panic!("{err}"),
                    _ => {}
                }
            }
            panic!("no end");
        },
    )));
    let reused: Vec<usize> = finished.iter().map(|g| g.reused_tokens as usize).collect();
    assert_eq!(reused[0], 0, "the first job computes the prefix");
    assert_eq!(
        reused[1..],
        shared[1..],
        "each later job reuses all it shares"
    );
    for (i, (g, alone)) in finished.iter().zip(&solo).enumerate() {
        assert_eq!(g.token_ids, alone.0, "job {i}");
    }
}

/// A job whose context could outgrow the whole KV budget is refused at once, with the
/// numbers (the provider turns it into a Reject `OverCapacity`).
#[test]
fn a_job_larger_than_the_kv_budget_is_refused_with_the_reason() {
    let path = support::default_model_path();
    let model = support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-135m-instruct");
    let request = greedy_request(&model, user("Write a long story."), 200);
    let settings = BatchSettings {
        max_batch: 4,
        kv_memory_bytes: kv_blocks(4),
    };
    let engine = Engine::spawn_with(vec![model], 8, settings);
    // The budget is known (to quotes and adverts) before any job ran.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while engine.batch_capacity().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let capacity = engine.batch_capacity().expect("published at start");
    assert_eq!((capacity.max_batch, capacity.total_blocks), (4, 4));
    let runtime = runtime();
    let err = runtime.block_on(engine.complete(request)).unwrap_err();
    assert!(matches!(err, EngineError::OverCapacity(_)), "{err:?}");
    assert!(err.to_string().contains("KV budget"), "{err}");
}

/// Admission is fair across buyers (a job's prefix salt is its buyer): a buyer's burst
/// of six jobs holds another buyer's single job back by at most one of them, not by
/// the whole burst. One job at a time, so the order of first tokens is the order of
/// admission; every job still gets its solo tokens.
#[test]
fn a_second_buyer_waits_for_a_turn_not_for_the_first_buyers_burst() {
    let path = support::default_model_path();
    let mut model = support::load(&path, support::DEFAULT_MODEL_ID, "smollm2-135m-instruct");
    let request = |buyer: u8, text: &str| GenerateRequest {
        prefix_salt: [buyer; 32],
        ..greedy_request(&model, user(text), 4)
    };
    let mut jobs: Vec<(&str, GenerateRequest)> = (0..6)
        .map(|i| ("burst", request(1, &format!("Count to {}.", i + 3))))
        .collect();
    jobs.push(("single", request(2, "Name a colour.")));
    let requests: Vec<GenerateRequest> = jobs.iter().map(|(_, r)| r.clone()).collect();
    let solo = solo_runs(&mut model, &requests);
    let settings = BatchSettings {
        max_batch: 1,
        ..BatchSettings::default()
    };
    let engine = Engine::spawn_with(vec![model], 16, settings);
    let receivers: Vec<_> = jobs
        .iter()
        .map(|(_, r)| engine.submit(r.clone()).unwrap())
        .collect();
    let runtime = runtime();
    let served = runtime.block_on(futures::future::join_all(receivers.into_iter().map(
        |mut events| async move {
            let (mut first, mut tokens) = (None, Vec::new());
            while let Some(event) = events.recv().await {
                match event {
                    EngineEvent::Token(token) => {
                        first.get_or_insert_with(std::time::Instant::now);
                        tokens.push(token.token_id);
                    }
                    EngineEvent::Failed(err) => panic!("{err}"),
                    _ => {}
                }
            }
            (first.expect("no token"), tokens)
        },
    )));
    for (i, ((_, tokens), (alone, ..))) in served.iter().zip(&solo).enumerate() {
        assert_eq!(tokens, alone, "job {i}");
    }
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| served[i].0);
    let single_at = order.iter().position(|&i| jobs[i].0 == "single").unwrap();
    // The burst's first job started alone; its second was waiting before the single
    // job came, so it goes first; then it is the single job's turn (FIFO: last).
    assert!(single_at <= 2, "admitted in the order {order:?}");
}
