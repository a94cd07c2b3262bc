//! The kit's hooks in a build without it: no mode can be chosen ([`Adversary`] has no
//! values), so every hook leaves what it is given as it is.

use std::sync::Arc;
use std::time::Duration;

use sharemesh_engine::LoadedModel;
use sharemesh_protocol::{
    Advert, ExecutionProfile, SignedEnvelope, StepFingerprint, TokenLogprobs,
};
use sharemesh_tokenizer::ModelHeader;

use crate::hardware::GpuStatus;

/// This build has no kit (node's other kit flags, such as a blackhole relay, ask).
pub const KIT: bool = false;

/// No adversary mode exists in this build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adversary {}

impl std::str::FromStr for Adversary {
    type Err = String;

    fn from_str(mode: &str) -> Result<Self, Self::Err> {
        Err(format!(
            "adversary mode `{mode}`: this build has no adversary kit (build the testnet's \
             binary with `cargo build -p sharemesh-node --features adversary`)"
        ))
    }
}

/// No kit mode is set up in this build, so none fails.
#[derive(Debug)]
pub enum KitError {}

impl std::fmt::Display for KitError {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}

impl std::error::Error for KitError {}

pub fn claimed_gpu(_: Option<&Adversary>) -> Option<GpuStatus> {
    None
}

pub fn apply_to_model(_: Option<&Adversary>, _: &mut LoadedModel) -> Result<(), KitError> {
    Ok(())
}

pub(crate) fn tamper_advert(_: Option<&Adversary>, _: &mut Advert) {}

pub(crate) fn flood_beside(_: Option<&Adversary>, _: &Advert, _: Duration) -> Vec<SignedEnvelope> {
    Vec::new()
}

pub(crate) async fn tamper_header(
    _: Option<&Adversary>,
    header: Option<Arc<ModelHeader>>,
) -> Option<Arc<ModelHeader>> {
    header
}

pub(crate) fn signs_with_alias(_: Option<&Adversary>) -> bool {
    false
}

pub(crate) fn claims_full(_: Option<&Adversary>) -> bool {
    false
}

pub(crate) fn claimed_prompt_tokens(_: Option<&Adversary>, counted: u32) -> u32 {
    counted
}

pub(crate) fn claimed_profile(
    _: Option<&Adversary>,
    profile: ExecutionProfile,
) -> ExecutionProfile {
    profile
}

pub(crate) fn stalls(_: Option<&Adversary>, _: u64) -> bool {
    false
}

pub(crate) async fn drip(_: Option<&Adversary>) {}

/// A token as the provider is about to send it (the kit's hooks write through it; this
/// build's never do).
#[allow(dead_code)]
pub(crate) struct Outgoing<'a> {
    pub index: &'a mut u32,
    pub text: &'a mut String,
    pub logprobs: Option<&'a mut TokenLogprobs>,
    pub fingerprint: &'a mut StepFingerprint,
}

pub(crate) fn tamper_token(_: Option<&Adversary>, _: u64, _: Outgoing<'_>) {}
