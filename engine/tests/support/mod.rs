#![allow(clippy::unwrap_used)]
//! Shared set-up of the engine's real-model tests: the catalog models from the test
//! cache that `scripts/test` fills once (`sharemesh models fetch` into
//! `target/test-model-cache`, or `$SHAREMESH_TEST_MODEL_CACHE`), and small helpers.
#![allow(dead_code)]

use std::path::PathBuf;

pub mod gemma2;
pub mod qwen2;

/// The catalog models' ids (header and tensor digests, `sharemesh_protocol::model_header`).
pub const DEFAULT_MODEL_ID: &str =
    "56e91e8d496e43a1f0d001a01e27c9f2b2aa26afc2ed61f68f5efa2cfca7aa11";
pub const GEMMA3_MODEL_ID: &str =
    "98979f1f78b909cd0d4f15855d16871ad890faeaec562e85ecd4b6a38b3048a0";

fn cached(file: &str) -> PathBuf {
    let dir = std::env::var_os("SHAREMESH_TEST_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-model-cache")
        });
    let path = dir.join("models").join(file);
    assert!(
        path.exists(),
        "{} is missing: run scripts/test once (it fetches the catalog models into the test \
         cache), or set SHAREMESH_TEST_MODEL_CACHE to a folder that has it",
        path.display()
    );
    path
}

/// SmolLM2-135M-Instruct Q4_1, the catalog's default model.
pub fn default_model_path() -> PathBuf {
    cached("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Gemma 3 270M Q4_K_M (four PyPI wheels joined).
pub fn gemma3_model_path() -> PathBuf {
    cached("gemma-3-270m-q4_k_m.gguf")
}

/// Loads a catalog model on the CPU at one thread (the fixtures' setting).
pub fn load(path: &std::path::Path, sha256: &str, name: &str) -> sharemesh_engine::LoadedModel {
    sharemesh_engine::set_threads(1);
    let id: sharemesh_protocol::ModelId = sha256.parse().unwrap();
    sharemesh_engine::LoadedModel::load(path, id, name, sharemesh_engine::Device::Cpu).unwrap()
}

/// Token ids from a JSON fixture array.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A greedy job of `max_tokens` on `model`, continuing after `resume`.
pub fn greedy_job(
    model: &mut sharemesh_engine::LoadedModel,
    prompt: &sharemesh_protocol::Prompt,
    max_tokens: u32,
    resume: Vec<u32>,
) -> sharemesh_engine::Generation {
    let request = sharemesh_engine::GenerateRequest {
        model: model.descriptor.id,
        prompt: prompt.clone(),
        sampling: sharemesh_protocol::Sampling {
            max_tokens,
            ..sharemesh_protocol::Sampling::default()
        },
        resume,
        ignore_eos: false,
        interruptible: false,
        prefix_salt: [0; 32],
    };
    model.generate(&request, |_| true).unwrap()
}

/// Serves a job to its end (past end-of-text) and returns its tokens with the
/// fingerprint committed with each new one.
pub fn serve_fingerprinted(
    model: &mut sharemesh_engine::LoadedModel,
    prompt: sharemesh_protocol::Prompt,
    sampling: sharemesh_protocol::Sampling,
    resume: Vec<u32>,
) -> (Vec<u32>, Vec<sharemesh_protocol::StepFingerprint>) {
    let request = sharemesh_engine::GenerateRequest {
        model: model.descriptor.id,
        prompt,
        sampling,
        resume,
        ignore_eos: true,
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
}

/// `steps` decoding steps of a candle model after `tokens` (`forward(input, position)`:
/// the logits after the fed tokens), each fed the token `path` has next (teacher
/// forcing) or, without a path, its own argmax (greedy): the whole sequence, and the
/// logits before each new token.
pub fn candle_steps(
    tokens: &[u32],
    steps: usize,
    path: Option<&[u32]>,
    mut forward: impl FnMut(&candle_core::Tensor, usize) -> candle_core::Result<candle_core::Tensor>,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut tokens = tokens.to_vec();
    let mut all = Vec::new();
    for step in 0..steps {
        let fed = if step == 0 { 0 } else { tokens.len() - 1 };
        let input = candle_core::Tensor::new(&tokens[fed..], &candle_core::Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits: Vec<f32> = forward(&input, fed)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        let next = path.map_or(argmax(&logits) as u32, |path| path[tokens.len()]);
        tokens.push(next);
        all.push(logits);
    }
    (tokens, all)
}

/// Teacher-forced logits along `tokens` before each of its last `steps` tokens, each
/// prefix run from an empty cache in one prefill (any backend).
pub fn logits_along(
    model: &mut sharemesh_engine::LoadedModel,
    tokens: &[u32],
    steps: usize,
) -> Vec<Vec<f32>> {
    let start = tokens.len() - steps;
    (start..tokens.len())
        .map(|end| model.logits_after(&tokens[..end], end).unwrap())
        .collect()
}

/// [`logits_along`] on the batch-invariant kernels, whose middle prefix is also run
/// token by token and must give the same bits.
pub fn kernel_logits_along(
    model: &mut sharemesh_engine::LoadedModel,
    tokens: &[u32],
    steps: usize,
) -> Vec<Vec<f32>> {
    let all = logits_along(model, tokens, steps);
    let middle = &tokens[..tokens.len() - steps + steps / 2];
    let one_by_one = model.logits_after(middle, 1).unwrap();
    assert!(
        same_bits(&all[steps / 2], &one_by_one),
        "prefill and one-token decode give different logits"
    );
    all
}

/// The kernels' logits (`ours`) against a float reference's along the same steps:
/// within `max_distance` mean relative L2 and the same argmax on all steps but one.
/// Prints both figures; returns the distance.
pub fn assert_near_float_reference(
    what: &str,
    ours: &[Vec<f32>],
    reference: &[Vec<f32>],
    max_distance: f64,
) -> f64 {
    let steps = reference.len();
    let (distance, agree) = compare_logits(ours, reference);
    eprintln!("{what}: {steps} steps of the float reference, within {distance:.4} on average, argmax {agree}/{steps}");
    assert!(
        distance < max_distance,
        "{what}: logits differ from the float reference by {distance:.4}"
    );
    assert!(
        agree + 1 >= steps,
        "{what}: argmax agreed on {agree} of {steps} steps"
    );
    distance
}

/// Whether two logit vectors are the same bits.
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, value) in logits.iter().enumerate() {
        if *value > logits[best] {
            best = i;
        }
    }
    best
}

/// ‖ours − reference‖ / ‖reference‖ averaged over steps, and on how many steps the
/// argmaxes agree.
pub fn compare_logits(ours: &[Vec<f32>], reference: &[Vec<f32>]) -> (f64, usize) {
    let mut total = 0f64;
    let mut agree = 0;
    for (ours, reference) in ours.iter().zip(reference) {
        let norm = reference
            .iter()
            .map(|v| f64::from(*v).powi(2))
            .sum::<f64>()
            .sqrt();
        let distance = ours
            .iter()
            .zip(reference)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum::<f64>()
            .sqrt();
        total += distance / norm;
        agree += usize::from(argmax(ours) == argmax(reference));
    }
    (total / ours.len().max(1) as f64, agree)
}

/// Writes `src` to `dst` with `extra` metadata entries added (or replacing ones of the
/// same key), tensors as they were: files that differ from a catalog model in one
/// setting (a rope scaling, say).
pub fn with_metadata(
    src: &std::path::Path,
    dst: &std::path::Path,
    extra: &[(&str, candle_core::quantized::gguf_file::Value)],
) {
    with_additions(src, dst, extra, Vec::new());
}

/// [`with_metadata`], and `tensors` added.
pub fn with_additions(
    src: &std::path::Path,
    dst: &std::path::Path,
    extra: &[(&str, candle_core::quantized::gguf_file::Value)],
    tensors: Vec<(String, candle_core::quantized::QTensor)>,
) {
    use candle_core::quantized::gguf_file;
    let added = tensors;
    let mut reader = std::io::BufReader::new(std::fs::File::open(src).unwrap());
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let mut metadata: Vec<(String, gguf_file::Value)> = content
        .metadata
        .iter()
        .filter(|(key, _)| !extra.iter().any(|(k, _)| k == key))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = names
        .into_iter()
        .map(|name| {
            let tensor = content
                .tensor(&mut reader, name, &candle_core::Device::Cpu)
                .unwrap();
            (name.clone(), tensor)
        })
        .chain(added)
        .collect();
    let metadata_refs: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = std::fs::File::create(dst).unwrap();
    gguf_file::write(&mut out, &metadata_refs, &tensor_refs).unwrap();
}

/// Greedy ids on raw text against llama.cpp's for `family`'s file written from SmolLM2
/// (`tests/fixtures/families_reference.json`, `scripts/make-family-fixtures.py`): the
/// prompt ids must be llama.cpp's, and wherever the continuations part, llama.cpp's own
/// top-2 margin must be under 0.25 logits (a near-tie its F32-cache run could take
/// either way). Returns, per prompt, how many tokens agreed of how many llama.cpp gave.
pub fn greedy_against_llama_cpp(
    model: &mut sharemesh_engine::LoadedModel,
    family: &str,
) -> Vec<(usize, usize)> {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/families_reference.json")).unwrap();
    let mut agreed = Vec::new();
    for case in fixture[family].as_array().unwrap() {
        let raw = case["raw"].as_str().unwrap();
        let prompt = sharemesh_protocol::Prompt::Text(raw.into());
        assert_eq!(
            model.prompt_tokens(&prompt).unwrap(),
            ids(&case["prompt_ids"]),
            "{raw:?}"
        );
        let reference = ids(&case["greedy_ids"]);
        let ours = greedy_job(model, &prompt, reference.len() as u32, vec![]);
        let agree = ours
            .token_ids
            .iter()
            .zip(&reference)
            .take_while(|(a, b)| a == b)
            .count();
        if agree < reference.len() {
            let margin = case["margins"][agree].as_f64().unwrap();
            assert!(
                margin < 0.25,
                "{family} {raw:?}: parted at {agree} where llama.cpp's margin is {margin}: \
                 ours {:?}, llama.cpp {reference:?}",
                ours.token_ids
            );
        }
        agreed.push((agree, reference.len()));
    }
    agreed
}
