//! The adversary kit: a provider running modified code, each mode one attack on
//! buyers, so the lab, the tests and the testnet can show what it gets. Built only with
//! the `adversary` feature (`honest.rs` stands in otherwise, with the same hooks doing
//! nothing).

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use sharemesh_engine::cheat::Cheat;
use sharemesh_engine::{EngineError, LoadedModel};
use sharemesh_mesh::clock::now_ms;
use sharemesh_protocol::catalog::CATALOG;
use sharemesh_protocol::{
    Advert, ExecutionProfile, Keypair, NanoUsd, SignedEnvelope, StepFingerprint, TokenLogprobs,
};
use sharemesh_tokenizer::ModelHeader;

use crate::hardware::GpuStatus;

/// This build has the kit (node's other kit flags, such as a blackhole relay, ask).
pub const KIT: bool = true;

/// A provider running modified code: each mode plays one attack on buyers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adversary {
    /// Goes silent (holding the stream open) after this many tokens.
    StallAfter(u64),
    /// Claims this many times the prompt's real size in its `Accept`.
    Overbill(u32),
    /// `overbill:K` while holding every header request (for an hour), so a buyer cannot
    /// count the prompt itself: what waiting for the header before judging an
    /// over-bound count costs a request.
    OverbillHoldingHeader(u32),
    /// After this many tokens, numbers its chunks one further than it sent (claims a
    /// token it never delivered).
    SkipIndex(u64),
    /// After this many tokens, sends text its tokens do not spell (an injected ad).
    LieText(u64),
    /// Sends a well-formed model header that is not its model's (a vocabulary that
    /// counts in its favour).
    ForgeHeader,
    /// Holds a buyer's header request this many seconds before answering.
    SlowHeader(u64),
    /// Offers its model under the first catalog name it does not hold (a name
    /// hijack: its advert claims another model's name for its own file).
    HijackName,
    /// Besides its own advert, publishes this many adverts per refresh, each under a
    /// fresh key, offering its models at the lowest price (a sybil flood of the order
    /// book that would also draw every buyer's first attempts).
    FloodAdverts(u32),
    /// Serves noise tokens without running its model, with fingerprints that look
    /// greedy, under the model's honest name and profile (the engine's `Cheat`).
    Garbage,
    /// Runs its model with this many of the last layers dropped: cheaper, worse, under
    /// the honest name and profile.
    TruncateLayers(u32),
    /// Honest for this many jobs, then garbage (earns trust, then cheats).
    Camouflage(u32),
    /// Runs another GGUF file (a cheaper quantization, a fine-tune) under the served
    /// model's id, header and profile.
    Substitute(std::path::PathBuf),
    /// Honest on fresh jobs, garbage on resumed ones: a lazy verifier (it is paid to
    /// re-run windows of others' jobs and skips the work).
    LazyVerifier,
    /// Advertises and attests a GPU with this many MiB of VRAM that it does not have
    /// (a hardware claim that cannot hold the model it offers).
    ClaimGpu(u64),
    /// Reports log-probabilities that flatter its answer: every alternative but the best
    /// made 2 nats less likely than the model says (a buyer comparing providers by
    /// confidence would pick it).
    LieLogprobs,
    /// Claims to be full: answers every quote and job `OverCapacity` while its adverts
    /// offer a low price (to make buyers' requests wait, or fail, for capacity).
    FalselyFull,
    /// Signs its jobs' `Accept` and chunks with a throwaway key instead of its own (so
    /// receipts, and any fraud proof, would name an identity it can drop).
    AliasKey,
    /// Runs its model but draws each sampled token from its own random stream instead
    /// of the request's seed (the engine's `Cheat::ChooseTokens`): honest fingerprints,
    /// chosen text.
    ChooseTokens,
    /// Runs its model but never ends before `max_tokens`: where the sampler draws an end
    /// token it takes the best other one (the engine's `Cheat::NeverStop`).
    NeverStop,
    /// Names an execution profile no verifier runs in its `Accept` (its device with a
    /// trailing space), so an exact replay would not apply.
    ForeignProfile,
    /// Commits NaN logits in every fingerprint (NaN compares false in any tolerance).
    NanLogits,
    /// Holds each token this many milliseconds before sending it (a drip just inside
    /// the buyer's stall timeout, billing for as long as `max_tokens` allows).
    Drip(u64),
    /// Advertises and attests a GPU with this UUID (another provider's, read from its
    /// public adverts) to get that provider flagged as one GPU under two identities.
    UuidCopy(String),
}

impl std::str::FromStr for Adversary {
    type Err = String;

    fn from_str(mode: &str) -> Result<Self, Self::Err> {
        let (name, value) = mode.split_once(':').unwrap_or((mode, ""));
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("adversary mode `{mode}` needs a whole number after `:`"))
        };
        match name {
            "stall-after" => Ok(Adversary::StallAfter(number()?)),
            "overbill" => {
                let factor = u32::try_from(number()?).map_err(|_| "overbill factor too large")?;
                Ok(Adversary::Overbill(factor))
            }
            "overbill-hold-header" => {
                let factor = u32::try_from(number()?).map_err(|_| "overbill factor too large")?;
                Ok(Adversary::OverbillHoldingHeader(factor))
            }
            "skip-index" => Ok(Adversary::SkipIndex(number()?)),
            "hijack-name" => Ok(Adversary::HijackName),
            "forge-header" => Ok(Adversary::ForgeHeader),
            "slow-header" => Ok(Adversary::SlowHeader(number()?)),
            "lie-text" => Ok(Adversary::LieText(number()?)),
            "garbage" => Ok(Adversary::Garbage),
            "lazy-verifier" => Ok(Adversary::LazyVerifier),
            "claim-gpu" => Ok(Adversary::ClaimGpu(number()?)),
            "lie-logprobs" => Ok(Adversary::LieLogprobs),
            "falsely-full" => Ok(Adversary::FalselyFull),
            "alias-key" => Ok(Adversary::AliasKey),
            "choose-tokens" => Ok(Adversary::ChooseTokens),
            "never-stop" => Ok(Adversary::NeverStop),
            "foreign-profile" => Ok(Adversary::ForeignProfile),
            "nan-logits" => Ok(Adversary::NanLogits),
            "drip" => Ok(Adversary::Drip(number()?)),
            "uuid-copy" if !value.is_empty() => Ok(Adversary::UuidCopy(value.into())),
            "truncate-layers" => {
                let count = u32::try_from(number()?).map_err(|_| "layer count too large")?;
                Ok(Adversary::TruncateLayers(count))
            }
            "substitute" if !value.is_empty() => Ok(Adversary::Substitute(value.into())),
            "camouflage" => {
                let jobs = u32::try_from(number()?).map_err(|_| "job count too large")?;
                Ok(Adversary::Camouflage(jobs))
            }
            "flood-adverts" => {
                let count = u32::try_from(number()?).map_err(|_| "flood count too large")?;
                Ok(Adversary::FloodAdverts(count))
            }
            _ => Err(format!(
                "unknown adversary mode `{mode}` (known: stall-after:N, overbill:K, overbill-hold-header:K, skip-index:N, lie-text:N, hijack-name, flood-adverts:N, forge-header, slow-header:SECS, garbage, truncate-layers:N, camouflage:N, substitute:PATH, lazy-verifier, claim-gpu:MIB, lie-logprobs, falsely-full, alias-key, choose-tokens, never-stop, foreign-profile, nan-logits, drip:MS, uuid-copy:UUID)"
            )),
        }
    }
}

/// A kit mode that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    #[error("adversary truncate-layers: {0}")]
    TruncateLayers(#[source] EngineError),
    #[error("adversary substitute: loading {path}: {source}")]
    Substitute {
        path: std::path::PathBuf,
        #[source]
        source: EngineError,
    },
}

/// `claim-gpu:MIB`, `uuid-copy:UUID`: the GPU this provider claims and does not have.
pub fn claimed_gpu(adversary: Option<&Adversary>) -> Option<GpuStatus> {
    let (mib, uuid) = match adversary? {
        Adversary::ClaimGpu(mib) => (*mib, "GPU-claimed-00000000"),
        Adversary::UuidCopy(uuid) => (24 << 10, uuid.as_str()),
        _ => return None,
    };
    Some(GpuStatus {
        name: "NVIDIA GeForce GT 710".into(),
        uuid: uuid.into(),
        vram_total_bytes: mib << 20,
        vram_free_bytes: mib << 20,
        driver_version: "470.256".into(),
        cuda_version: "11.4".into(),
        utilization_percent: None,
        temperature_celsius: None,
        power_watts: None,
    })
}

/// The modes that change what the engine computes, applied to `model`.
pub fn apply_to_model(
    adversary: Option<&Adversary>,
    model: &mut LoadedModel,
) -> Result<(), KitError> {
    match adversary {
        Some(Adversary::Garbage) => model.cheat = Cheat::Garbage,
        Some(Adversary::LazyVerifier) => model.cheat = Cheat::LazyResume,
        Some(Adversary::ChooseTokens) => model.cheat = Cheat::ChooseTokens,
        Some(Adversary::NeverStop) => model.cheat = Cheat::NeverStop,
        Some(Adversary::Camouflage(honest_jobs)) => {
            model.cheat = Cheat::Camouflage {
                honest_jobs: *honest_jobs,
            }
        }
        Some(Adversary::TruncateLayers(count)) => model
            .truncate_layers(*count as usize)
            .map_err(KitError::TruncateLayers)?,
        Some(Adversary::Substitute(path)) => {
            // Another file's weights; the served model's id, name, quantization and
            // file (for the header buyers fetch) kept, so it looks like the real one.
            let honest = model.descriptor.clone();
            let honest_file = model.path.clone();
            let device = sharemesh_engine::default_device();
            let mut substitute =
                LoadedModel::load(path, honest.id, &honest.name, device).map_err(|source| {
                    KitError::Substitute {
                        path: path.clone(),
                        source,
                    }
                })?;
            substitute.descriptor = honest;
            substitute.path = honest_file;
            *model = substitute;
        }
        _ => return Ok(()),
    }
    tracing::warn!(
        ?adversary,
        "adversary: serving dishonest work under the model's name"
    );
    Ok(())
}

/// `hijack-name` on the advert about to be sealed.
pub(crate) fn tamper_advert(adversary: Option<&Adversary>, advert: &mut Advert) {
    if adversary == Some(&Adversary::HijackName) {
        hijack_name(advert);
    }
}

/// `flood-adverts:N`: the fake adverts to publish beside `advert`.
pub(crate) fn flood_beside(
    adversary: Option<&Adversary>,
    advert: &Advert,
    lifetime: Duration,
) -> Vec<SignedEnvelope> {
    match adversary {
        Some(Adversary::FloodAdverts(count)) => flood(advert, *count, lifetime),
        _ => Vec::new(),
    }
}

/// `forge-header`, `slow-header:SECS`: the model header a buyer is sent.
pub(crate) async fn tamper_header(
    adversary: Option<&Adversary>,
    header: Option<Arc<ModelHeader>>,
) -> Option<Arc<ModelHeader>> {
    match adversary {
        // A convincing vocabulary that is not the model's.
        Some(Adversary::ForgeHeader) => Some(Arc::new(forged_header())),
        // Hold the asker as long as it waits.
        Some(Adversary::SlowHeader(seconds)) => {
            tokio::time::sleep(Duration::from_secs(*seconds)).await;
            header
        }
        Some(Adversary::OverbillHoldingHeader(_)) => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            header
        }
        _ => header,
    }
}

/// `alias-key`: whether jobs are signed with a throwaway key.
pub(crate) fn signs_with_alias(adversary: Option<&Adversary>) -> bool {
    adversary == Some(&Adversary::AliasKey)
}

/// `falsely-full`: whether every quote and job is refused for capacity.
pub(crate) fn claims_full(adversary: Option<&Adversary>) -> bool {
    adversary == Some(&Adversary::FalselyFull)
}

/// `overbill:K`: the prompt size the `Accept` claims.
pub(crate) fn claimed_prompt_tokens(adversary: Option<&Adversary>, counted: u32) -> u32 {
    match adversary {
        Some(Adversary::Overbill(factor) | Adversary::OverbillHoldingHeader(factor)) => {
            counted.saturating_mul(*factor)
        }
        _ => counted,
    }
}

/// `foreign-profile`: the profile the `Accept` names (one no verifier runs).
pub(crate) fn claimed_profile(
    adversary: Option<&Adversary>,
    profile: ExecutionProfile,
) -> ExecutionProfile {
    match adversary {
        Some(Adversary::ForeignProfile) => ExecutionProfile {
            device: format!("{} ", profile.device),
            ..profile
        },
        _ => profile,
    }
}

/// `stall-after:N`: whether the stream goes silent now, `sent` tokens in.
pub(crate) fn stalls(adversary: Option<&Adversary>, sent: u64) -> bool {
    matches!(adversary, Some(Adversary::StallAfter(n)) if sent >= *n)
}

/// `drip:MS`: holds the next token, just inside the buyer's stall timeout.
pub(crate) async fn drip(adversary: Option<&Adversary>) {
    if let Some(Adversary::Drip(ms)) = adversary {
        tokio::time::sleep(Duration::from_millis(*ms)).await;
    }
}

/// A token as the provider is about to send it, for the modes that lie about it.
pub(crate) struct Outgoing<'a> {
    pub index: &'a mut u32,
    pub text: &'a mut String,
    pub logprobs: Option<&'a mut TokenLogprobs>,
    pub fingerprint: &'a mut StepFingerprint,
}

/// `skip-index:N`, `lie-text:N`, `lie-logprobs`, `nan-logits`: the lies told about a
/// token, `sent` tokens in.
pub(crate) fn tamper_token(adversary: Option<&Adversary>, sent: u64, token: Outgoing<'_>) {
    match adversary {
        // A token it never sent.
        Some(Adversary::SkipIndex(n)) if sent >= *n => *token.index += 1,
        // Text that its tokens do not spell (an injected ad).
        Some(Adversary::LieText(n)) if sent >= *n => token.text.push_str(" (sponsored)"),
        // The runners-up look less likely than they are.
        Some(Adversary::LieLogprobs) => {
            for (_, value) in token
                .logprobs
                .into_iter()
                .flat_map(|lp| lp.top.iter_mut().skip(1))
            {
                *value = (f32::from_bits(*value) - 2.0).to_bits();
            }
        }
        // Logits no tolerance can compare.
        Some(Adversary::NanLogits) => {
            for (_, logit) in &mut token.fingerprint.top {
                *logit = f32::NAN.to_bits();
            }
        }
        _ => {}
    }
}

/// `hijack-name`: every model offered under the first catalog name that is not its own.
fn hijack_name(advert: &mut Advert) {
    for offer in &mut advert.models {
        if let Some(name) = CATALOG.iter().find(|m| m.name != offer.model.name) {
            offer.model.name = name.name.to_owned();
        }
    }
}

/// `flood-adverts:N`: `count` adverts under fresh keys, copying `advert`'s models at the
/// lowest price and naming no address (nothing behind them can serve). Public for the
/// lab's flood test, which starts the flood at a moment of its choosing.
pub fn flood(advert: &Advert, count: u32, lifetime: Duration) -> Vec<SignedEnvelope> {
    let mut rng = rand::rng();
    (0..count)
        .filter_map(|_| {
            let key = Keypair::from_secret(rng.random());
            let mut fake = advert.clone();
            fake.provider = key.node_id();
            fake.addresses.clear();
            for offer in &mut fake.models {
                for price in &mut offer.prices {
                    price.price_per_token = NanoUsd(1);
                }
            }
            key.seal(&fake, 1, now_ms(), lifetime.as_millis() as u64)
                .ok()
        })
        .collect()
}

/// `forge-header`: a well-formed GGUF header with a byte-level BPE vocabulary of its
/// own (every token a single letter, so it counts a prompt as one token per letter)
/// and a made-up tensor digest: it parses, but it does not make the model's id.
fn forged_header() -> ModelHeader {
    fn string(out: &mut Vec<u8>, text: &str) {
        out.extend((text.len() as u64).to_le_bytes());
        out.extend(text.as_bytes());
    }
    fn strings(out: &mut Vec<u8>, key: &str, items: &[&str]) {
        string(out, key);
        out.extend(9u32.to_le_bytes());
        out.extend(8u32.to_le_bytes());
        out.extend((items.len() as u64).to_le_bytes());
        for item in items {
            string(out, item);
        }
    }
    let letters: Vec<String> = ('a'..='z').chain(['Ġ']).map(String::from).collect();
    let letters: Vec<&str> = letters.iter().map(String::as_str).collect();
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(3u64.to_le_bytes());
    string(&mut bytes, "tokenizer.ggml.model");
    bytes.extend(8u32.to_le_bytes());
    string(&mut bytes, "gpt2");
    strings(&mut bytes, "tokenizer.ggml.tokens", &letters);
    strings(&mut bytes, "tokenizer.ggml.merges", &[]);
    ModelHeader {
        bytes,
        tensor_digest: [0x5a; 32],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharemesh_protocol::ModelId;

    #[test]
    fn adversary_modes_parse_and_name_the_problem() {
        assert_eq!("stall-after:5".parse(), Ok(Adversary::StallAfter(5)));
        assert_eq!("overbill:1000".parse(), Ok(Adversary::Overbill(1000)));
        assert_eq!(
            "overbill-hold-header:50".parse(),
            Ok(Adversary::OverbillHoldingHeader(50))
        );
        assert_eq!("skip-index:3".parse(), Ok(Adversary::SkipIndex(3)));
        assert_eq!("hijack-name".parse(), Ok(Adversary::HijackName));
        assert_eq!("lie-text:2".parse(), Ok(Adversary::LieText(2)));
        assert_eq!("flood-adverts:50".parse(), Ok(Adversary::FloodAdverts(50)));
        assert_eq!("garbage".parse(), Ok(Adversary::Garbage));
        assert_eq!("lazy-verifier".parse(), Ok(Adversary::LazyVerifier));
        assert_eq!("claim-gpu:64".parse(), Ok(Adversary::ClaimGpu(64)));
        assert_eq!("lie-logprobs".parse(), Ok(Adversary::LieLogprobs));
        assert_eq!("falsely-full".parse(), Ok(Adversary::FalselyFull));
        assert_eq!("alias-key".parse(), Ok(Adversary::AliasKey));
        assert_eq!("choose-tokens".parse(), Ok(Adversary::ChooseTokens));
        assert_eq!("never-stop".parse(), Ok(Adversary::NeverStop));
        assert_eq!("foreign-profile".parse(), Ok(Adversary::ForeignProfile));
        assert_eq!("nan-logits".parse(), Ok(Adversary::NanLogits));
        assert_eq!("drip:1500".parse(), Ok(Adversary::Drip(1500)));
        assert_eq!(
            "uuid-copy:GPU-1234".parse(),
            Ok(Adversary::UuidCopy("GPU-1234".into()))
        );
        assert!("uuid-copy".parse::<Adversary>().is_err());
        assert_eq!(
            "truncate-layers:2".parse(),
            Ok(Adversary::TruncateLayers(2))
        );
        assert_eq!("camouflage:5".parse(), Ok(Adversary::Camouflage(5)));
        assert_eq!(
            "substitute:/tmp/q8.gguf".parse(),
            Ok(Adversary::Substitute("/tmp/q8.gguf".into()))
        );
        assert!("substitute".parse::<Adversary>().is_err());
        let err = "overbill".parse::<Adversary>().unwrap_err();
        assert!(err.contains("whole number"), "{err}");
        let err = "steal:1".parse::<Adversary>().unwrap_err();
        assert!(err.contains("unknown adversary mode `steal:1`"), "{err}");
    }

    #[test]
    fn the_forged_header_parses_but_is_not_the_model() {
        let forged = forged_header();
        let vocabulary = sharemesh_tokenizer::Vocabulary::read(forged.bytes.as_slice())
            .unwrap_or_else(|e| panic!("{e}"));
        let ids = vocabulary
            .prompt_tokens(&sharemesh_protocol::Prompt::Text("abc".into()))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ids.len(), 3);
        assert!(!ModelId::from_bytes([1; 32]).is_header_of(&forged.bytes, &forged.tensor_digest));
    }
}
