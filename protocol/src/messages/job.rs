//! One job's messages: request, quote, answer, tokens, receipts, commitment.

use serde::{Deserialize, Serialize};

use super::at_most;
use super::*;
use crate::commitment::{ExecutionProfile, StepFingerprint};
use crate::error::ValidationError;
use crate::ids::{Digest, JobId, ModelId, NodeId};
use crate::money::NanoUsd;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Prompt {
    /// Raw text completion.
    Text(String),
    /// Chat messages, rendered with the model's chat template by the provider.
    Chat(Vec<ChatMessage>),
    /// Pre-tokenised input.
    Tokens(Vec<u32>),
}

/// Tokens a tokenizer may add beyond one per byte of text: start/end markers.
pub const PROMPT_TOKEN_SLACK: u64 = 8;
/// Tokens a chat template may add per message (turn markers, role) and per prompt (a
/// default system message, the assistant's opening).
pub const CHAT_TOKENS_PER_MESSAGE: u64 = 16;
pub const CHAT_TOKENS_PER_PROMPT: u64 = 64;

impl Prompt {
    /// The most tokens any tokenizer of the network makes of this prompt: no token
    /// covers less than one byte of text (byte-level BPE, SentencePiece with byte
    /// fallback), plus what markers and chat templates add. A buyer holds a provider's
    /// claimed prompt size to this bound (it pays for prompt tokens) and reserves its
    /// budget with it.
    pub fn token_bound(&self) -> u64 {
        match self {
            Prompt::Text(text) => text.len() as u64 + PROMPT_TOKEN_SLACK,
            Prompt::Tokens(ids) => ids.len() as u64 + PROMPT_TOKEN_SLACK,
            Prompt::Chat(messages) => {
                messages
                    .iter()
                    .map(|m| m.content.len() as u64 + CHAT_TOKENS_PER_MESSAGE)
                    .sum::<u64>()
                    + CHAT_TOKENS_PER_PROMPT
            }
        }
    }

    /// Size limits a provider enforces; a gateway checks them before any provider work.
    pub fn validate(&self) -> Result<(), ValidationError> {
        match self {
            Prompt::Text(text) if text.len() > MAX_TEXT_BYTES => Err(ValidationError::field(
                "prompt",
                format!("{} bytes, limit {MAX_TEXT_BYTES}", text.len()),
            )),
            Prompt::Chat(messages) => {
                at_most("prompt.messages", messages.len(), MAX_CHAT_MESSAGES)?;
                let total: usize = messages.iter().map(|m| m.content.len()).sum();
                if total > MAX_TEXT_BYTES {
                    return Err(ValidationError::field(
                        "prompt.messages",
                        format!("{total} bytes of content, limit {MAX_TEXT_BYTES}"),
                    ));
                }
                Ok(())
            }
            Prompt::Tokens(tokens) => at_most("prompt.tokens", tokens.len(), MAX_PROMPT_TOKENS),
            Prompt::Text(_) => Ok(()),
        }
    }
}

/// What the completion must be, enforced by constrained decoding on the provider: at
/// each step only tokens that keep the text a valid prefix of the format may be drawn,
/// and end-of-text only where it is complete. The allowed set is a pure function of the
/// format and the tokens so far, so resume, failover and replay stay exact.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputFormat {
    /// Any text.
    #[default]
    Free,
    /// One JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this JSON Schema (its JSON text; `json_schema`, strict).
    JsonSchema(String),
}

/// The most bytes an output format's schema may take.
pub const MAX_FORMAT_BYTES: usize = 64 * 1024;

impl OutputFormat {
    pub fn is_free(&self) -> bool {
        matches!(self, OutputFormat::Free)
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        if let OutputFormat::JsonSchema(schema) = self {
            if schema.len() > MAX_FORMAT_BYTES {
                return Err(ValidationError::field(
                    "format",
                    format!(
                        "a JSON schema of {} bytes, limit {MAX_FORMAT_BYTES}",
                        schema.len()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Sampling settings. Temperature 0 means greedy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 disables top-k.
    pub top_k: u32,
    /// 1.0 disables the penalty.
    pub repetition_penalty: f32,
    pub seed: u64,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    /// What the text must be (free, JSON, JSON under a schema).
    pub format: OutputFormat,
    /// OpenAI's penalties (-2..=2; 0 = off), over the completion's tokens so far: each
    /// token's logit less `presence` if it appeared, less `frequency` × its count.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Added to a token's logit before sampling (-100..=100 each; ≤ 300 tokens, each
    /// once, in ascending id order).
    pub logit_bias: Vec<(u32, f32)>,
    /// Return each token's log-probability with this many best alternatives
    /// (0..=[`MAX_TOP_LOGPROBS`]); `None`: none. No effect on the tokens drawn.
    pub logprobs: Option<u8>,
}

/// The most alternatives a token's log-probabilities may list (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One completion token's log-probability under the model's raw distribution (the
/// log-softmax of the raw logits: before temperature, penalties, bias or a format's
/// mask), with the best alternatives, best first; f32 bits, as fingerprints carry them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenLogprobs {
    pub logprob: u32,
    pub top: Vec<(u32, u32)>,
}

impl TokenLogprobs {
    pub fn logprob(&self) -> f32 {
        f32::from_bits(self.logprob)
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        at_most("logprobs.top", self.top.len(), MAX_TOP_LOGPROBS)?;
        let values = std::iter::once(self.logprob).chain(self.top.iter().map(|(_, v)| *v));
        if values
            .map(f32::from_bits)
            .any(|v| !v.is_finite() || v > 1e-3)
        {
            return Err(ValidationError::field(
                "logprobs",
                "log-probabilities must be finite and at most 0",
            ));
        }
        Ok(())
    }
}

/// The most tokens `logit_bias` may name (OpenAI's limit).
pub const MAX_LOGIT_BIAS: usize = 300;

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            repetition_penalty: 1.0,
            seed: 0,
            max_tokens: 256,
            stop: Vec::new(),
            format: OutputFormat::Free,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
        }
    }
}

impl Sampling {
    /// Whether every token must be the best of its own raw logits: greedy decoding with
    /// nothing between the logits and the choice (no penalty, no format mask). A step
    /// that breaks it is fraud provable without the model (§12).
    pub fn greedy_rule_applies(&self) -> bool {
        self.temperature == 0.0
            && self.repetition_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && self.logit_bias.is_empty()
            && self.format.is_free()
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        if !self.temperature.is_finite() || !(0.0..=2.0).contains(&self.temperature) {
            return Err(ValidationError::field(
                "temperature",
                "must be within 0..=2",
            ));
        }
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ValidationError::field("top_p", "must be within (0, 1]"));
        }
        if !self.repetition_penalty.is_finite() || !(0.5..=2.0).contains(&self.repetition_penalty) {
            return Err(ValidationError::field(
                "repetition_penalty",
                "must be within 0.5..=2",
            ));
        }
        if self.max_tokens == 0 || self.max_tokens as usize > MAX_PROMPT_TOKENS {
            return Err(ValidationError::field(
                "max_tokens",
                format!("must be within 1..={MAX_PROMPT_TOKENS}"),
            ));
        }
        self.format.validate()?;
        for (field, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !value.is_finite() || !(-2.0..=2.0).contains(&value) {
                return Err(ValidationError::field(field, "must be within -2..=2"));
            }
        }
        at_most("logit_bias", self.logit_bias.len(), MAX_LOGIT_BIAS)?;
        if let Some(top) = self.logprobs {
            at_most("top_logprobs", usize::from(top), MAX_TOP_LOGPROBS)?;
        }
        if self.logit_bias.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(ValidationError::field(
                "logit_bias",
                "tokens must be listed once each, in ascending id order",
            ));
        }
        if let Some((token, _)) = self
            .logit_bias
            .iter()
            .find(|(_, bias)| !bias.is_finite() || !(-100.0..=100.0).contains(bias))
        {
            return Err(ValidationError::field(
                "logit_bias",
                format!("the bias of token {token} must be within -100..=100"),
            ));
        }
        at_most("stop", self.stop.len(), MAX_STOP_SEQUENCES)?;
        for stop in &self.stop {
            if stop.is_empty() || stop.len() > MAX_STOP_BYTES {
                return Err(ValidationError::field(
                    "stop",
                    format!("each stop sequence must be 1..={MAX_STOP_BYTES} bytes"),
                ));
            }
        }
        Ok(())
    }
}

/// A buyer's request for one completion, addressed to one provider.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRequest {
    pub job_id: JobId,
    pub buyer: NodeId,
    /// The provider this request is addressed to, so it cannot be replayed elsewhere.
    pub provider: NodeId,
    pub model: ModelId,
    pub prompt: Prompt,
    pub sampling: Sampling,
    pub max_price_per_token: NanoUsd,
    pub tier: Tier,
    /// Unix ms after which the buyer no longer wants the work.
    pub deadline_ms: u64,
    /// Completion tokens already delivered by an earlier provider: continue after them,
    /// exactly as an uninterrupted run would.
    pub resume: Vec<u32>,
    /// `audit_commitment(secret, job_id)`: the buyer's commitment to the secret that
    /// decides, after delivery, whether this job is verified (SPEC.md §12).
    pub audit_commitment: Digest,
}

impl JobRequest {
    /// The prompt tokens a receipt for this job bills, given the prompt's size: all of
    /// them for a fresh job, none for a resumed one (a failover's re-prefill of the
    /// prompt and the delivered tokens is the new provider's cost to bid, not a second
    /// charge the buyer's budget never reserved).
    pub fn billed_prompt_tokens(&self, prompt_tokens: u32) -> u64 {
        if self.resume.is_empty() {
            u64::from(prompt_tokens)
        } else {
            0
        }
    }

    /// The most positions a provider prefills for this job that may go unpaid: all of
    /// them (the prompt, at most [`Prompt::token_bound`], and any resumed tokens), since
    /// a fresh job's prompt is paid only with its first receipt and a resume's never.
    pub fn unpaid_prefill_bound(&self) -> u64 {
        self.prompt
            .token_bound()
            .saturating_add(self.resume.len() as u64)
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        self.prompt.validate()?;
        self.sampling.validate()?;
        at_most("resume", self.resume.len(), MAX_PROMPT_TOKENS)?;
        if self.resume.len() >= self.sampling.max_tokens as usize {
            return Err(ValidationError::field(
                "resume",
                "already holds max_tokens tokens: nothing left to generate",
            ));
        }
        Ok(())
    }
}

/// A buyer asks a provider what it would charge and how soon it could start (the reverse
/// auction's call for bids). Carries no prompt: quoting commits the provider to nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuoteRequest {
    pub job_id: JobId,
    pub buyer: NodeId,
    /// The addressee.
    pub provider: NodeId,
    pub model: ModelId,
    pub tier: Tier,
    pub max_price_per_token: NanoUsd,
    /// Completion tokens the job may need (sizes the provider's queue estimate).
    pub max_tokens: u32,
}

impl QuoteRequest {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.max_tokens == 0 || self.max_tokens as usize > MAX_PROMPT_TOKENS {
            return Err(ValidationError::field(
                "max_tokens",
                "must be in 1..=131072",
            ));
        }
        Ok(())
    }
}

/// A provider's offer for a specific request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quote {
    pub job_id: JobId,
    pub provider: NodeId,
    pub price_per_token: NanoUsd,
    pub queue_wait_ms: u32,
    pub expected_milli_tokens_per_second: u32,
}

/// The provider takes the job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accept {
    pub job_id: JobId,
    pub provider: NodeId,
    pub price_per_token: NanoUsd,
    pub prompt_tokens: u32,
    /// How many tokens the provider will send beyond the last receipt before pausing.
    pub credit_window_tokens: u32,
    /// What will produce the logits: the profile a verifier replays on.
    pub profile: ExecutionProfile,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    UnknownModel,
    OverCapacity,
    PriceBelowFloor,
    OutsideWindow,
    TierNotOffered,
    BadRequest,
    ContextTooLong,
    DeadlinePassed,
    Paused,
    Internal,
    /// The provider's policy does not serve this buyer (allow/deny list).
    NotAllowed,
    /// The buyer is over its per-buyer limit on this provider (concurrent jobs or jobs
    /// per minute); other providers, or this one later, may serve it.
    BuyerLimit,
    /// The provider settles on a chain and this buyer has not offered a settlement
    /// binding there, or its deposit (as the provider last read it) does not cover the
    /// job on top of what it already owes (SPEC §13).
    Unfunded,
}

impl RejectReason {
    /// A refusal for lack of capacity (the whole provider, or this buyer's share of
    /// it): the same request may be served when capacity frees.
    pub fn is_at_capacity(self) -> bool {
        matches!(self, RejectReason::OverCapacity | RejectReason::BuyerLimit)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reject {
    pub job_id: JobId,
    pub provider: NodeId,
    pub reason: RejectReason,
    pub detail: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
    Error,
}

/// A slice of the output stream. `first_index` counts completion tokens from 0,
/// including any `resume` prefix, so chunks from different providers line up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenChunk {
    pub job_id: JobId,
    pub provider: NodeId,
    pub first_index: u32,
    pub token_ids: Vec<u32>,
    pub text_delta: String,
    pub finish: Option<FinishReason>,
    /// One fingerprint of the raw logits per token, in order.
    pub fingerprints: Vec<StepFingerprint>,
    /// The chain head after this chunk: `commitment_step(previous head, first_index,
    /// token_ids, fingerprints, finish)`, from `commitment_root` for the first chunk.
    pub commitment: Digest,
    /// One per token when the request asked for log-probabilities, else none. Not
    /// committed: the buyer checks them against the committed fingerprints.
    pub logprobs: Vec<TokenLogprobs>,
}

impl TokenChunk {
    pub fn validate(&self) -> Result<(), ValidationError> {
        at_most("token_ids", self.token_ids.len(), MAX_TOKENS_PER_CHUNK)?;
        if self.fingerprints.len() != self.token_ids.len() {
            return Err(ValidationError::field(
                "fingerprints",
                format!(
                    "{} fingerprints for {} tokens",
                    self.fingerprints.len(),
                    self.token_ids.len()
                ),
            ));
        }
        for step in &self.fingerprints {
            step.validate()?;
        }
        if !self.logprobs.is_empty() && self.logprobs.len() != self.token_ids.len() {
            return Err(ValidationError::field(
                "logprobs",
                format!(
                    "{} log-probabilities for {} tokens",
                    self.logprobs.len(),
                    self.token_ids.len()
                ),
            ));
        }
        for token in &self.logprobs {
            token.validate()?;
        }
        if self.text_delta.len() > MAX_TEXT_BYTES {
            return Err(ValidationError::field("text_delta", "over the text limit"));
        }
        Ok(())
    }
}

/// The buyer's signed, cumulative acknowledgement. A later receipt (higher envelope
/// sequence) for the same job supersedes every earlier one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub job_id: JobId,
    pub provider: NodeId,
    pub buyer: NodeId,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub price_per_token: NanoUsd,
    /// `(prompt_tokens + completion_tokens) × price_per_token`.
    pub amount: NanoUsd,
    /// The provider's commitment-chain head after the last chunk this receipt pays
    /// for: what the buyer acknowledges having received (SPEC.md §12).
    pub commitment: Digest,
}

impl Receipt {
    /// A cumulative receipt for `prompt_tokens + completion_tokens` at `price`: the one
    /// place a bill is priced (`None` if the amount overflows).
    pub fn new(
        job_id: JobId,
        provider: NodeId,
        buyer: NodeId,
        prompt_tokens: u64,
        completion_tokens: u64,
        price_per_token: NanoUsd,
        commitment: Digest,
    ) -> Option<Self> {
        let mut receipt = Self {
            job_id,
            provider,
            buyer,
            prompt_tokens,
            completion_tokens,
            price_per_token,
            amount: NanoUsd::ZERO,
            commitment,
        };
        receipt.amount = receipt.expected_amount()?;
        Some(receipt)
    }

    pub fn expected_amount(&self) -> Option<NanoUsd> {
        self.prompt_tokens
            .checked_add(self.completion_tokens)
            .and_then(|tokens| self.price_per_token.times(tokens))
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        match self.expected_amount() {
            Some(amount) if amount == self.amount => Ok(()),
            Some(amount) => Err(ValidationError::field(
                "amount",
                format!("is {} but tokens × price is {}", self.amount.0, amount.0),
            )),
            None => Err(ValidationError::field("amount", "tokens × price overflows")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(prompt: Prompt, resume: Vec<u32>) -> JobRequest {
        JobRequest {
            job_id: JobId::from_bytes([7; 16]),
            buyer: NodeId::from_bytes([1; 32]),
            provider: NodeId::from_bytes([2; 32]),
            model: ModelId::from_bytes([9; 32]),
            prompt,
            sampling: Sampling::default(),
            max_price_per_token: NanoUsd(100),
            tier: Tier::OnDemand,
            deadline_ms: 0,
            resume,
            audit_commitment: Digest::from_bytes([1; 32]),
        }
    }

    #[test]
    fn a_job_s_unpaid_prefill_is_bounded_by_its_prompt_and_resumed_tokens() {
        let text = || Prompt::Text("x".repeat(100));
        let fresh = request(text(), vec![]);
        assert_eq!(fresh.unpaid_prefill_bound(), 100 + PROMPT_TOKEN_SLACK);
        assert_eq!(fresh.billed_prompt_tokens(90), 90);
        let resumed = request(text(), vec![5; 40]);
        assert_eq!(resumed.billed_prompt_tokens(90), 0);
        assert_eq!(
            resumed.unpaid_prefill_bound(),
            100 + PROMPT_TOKEN_SLACK + 40
        );
        // A prompt moved into `resume` is counted all the same.
        let moved = request(Prompt::Tokens(vec![]), vec![5; 4_000]);
        assert_eq!(moved.unpaid_prefill_bound(), PROMPT_TOKEN_SLACK + 4_000);
    }
}
