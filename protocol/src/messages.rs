//! Message bodies. Each is signed inside a [`crate::SignedEnvelope`]; the envelope
//! carries the sequence number, issue time and expiry, so bodies do not repeat them.

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::ids::{Digest, JobId, ModelId, NodeId};
use crate::money::NanoUsd;

/// Longest prompt, in tokens or (for text) in UTF-8 bytes per message part.
pub const MAX_PROMPT_TOKENS: usize = 131_072;
pub const MAX_TEXT_BYTES: usize = 512 * 1024;
pub const MAX_CHAT_MESSAGES: usize = 1024;
pub const MAX_STOP_SEQUENCES: usize = 8;
pub const MAX_STOP_BYTES: usize = 256;
pub const MAX_MODELS_PER_ADVERT: usize = 32;
pub const MAX_WINDOWS: usize = 32;
pub const MAX_SHORT_STRING: usize = 256;
pub const MAX_TOKENS_PER_CHUNK: usize = 4096;
pub const MAX_EVIDENCE_HASHES: usize = 64;
pub const MAX_GPUS: usize = 64;
pub const MAX_ADDRESSES: usize = 16;

fn short(field: &'static str, value: &str) -> Result<(), ValidationError> {
    if value.len() > MAX_SHORT_STRING {
        return Err(ValidationError::field(
            field,
            format!("{} bytes, limit {MAX_SHORT_STRING}", value.len()),
        ));
    }
    Ok(())
}

fn at_most(field: &'static str, len: usize, limit: usize) -> Result<(), ValidationError> {
    if len > limit {
        return Err(ValidationError::field(
            field,
            format!("{len} entries, limit {limit}"),
        ));
    }
    Ok(())
}

/// Service tiers, from most to least protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// gold: committed slots, never preempted.
    Reserved,
    /// silver: best-effort on demand.
    OnDemand,
    /// bronze: cheapest, may be preempted and resumed elsewhere.
    Interruptible,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Reserved, Tier::OnDemand, Tier::Interruptible];

    pub fn name(self) -> &'static str {
        match self {
            Tier::Reserved => "reserved",
            Tier::OnDemand => "on_demand",
            Tier::Interruptible => "interruptible",
        }
    }
}

impl std::str::FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reserved" | "gold" => Ok(Tier::Reserved),
            "on_demand" | "on-demand" | "silver" => Ok(Tier::OnDemand),
            "interruptible" | "bronze" => Ok(Tier::Interruptible),
            other => Err(format!(
                "unknown tier `{other}` (expected reserved|on_demand|interruptible, or gold|silver|bronze)"
            )),
        }
    }
}

/// What a model is, independent of who serves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDescriptor {
    pub id: ModelId,
    /// Catalog name, e.g. `smollm2-135m-instruct`.
    pub name: String,
    /// GGUF `general.architecture`, e.g. `llama`.
    pub architecture: String,
    /// e.g. `Q4_1`.
    pub quantization: String,
    pub context_length: u32,
}

impl ModelDescriptor {
    fn validate(&self) -> Result<(), ValidationError> {
        short("model.name", &self.name)?;
        short("model.architecture", &self.architecture)?;
        short("model.quantization", &self.quantization)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierPrice {
    pub tier: Tier,
    pub price_per_token: NanoUsd,
}

/// One model on offer in an advert.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelOffer {
    pub model: ModelDescriptor,
    /// Measured generation speed, in thousandths of a token per second.
    pub generation_milli_tokens_per_second: u32,
    /// Price for each tier offered for this model.
    pub prices: Vec<TierPrice>,
}

impl ModelOffer {
    pub fn price_for(&self, tier: Tier) -> Option<NanoUsd> {
        self.prices
            .iter()
            .find(|p| p.tier == tier)
            .map(|p| p.price_per_token)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HardwareSummary {
    Gpu {
        name: String,
        count: u32,
        vram_total_bytes: u64,
        vram_free_bytes: u64,
    },
    Cpu {
        cores: u32,
        ram_bytes: u64,
    },
}

impl HardwareSummary {
    pub fn vram_total_bytes(&self) -> u64 {
        match self {
            HardwareSummary::Gpu {
                vram_total_bytes, ..
            } => *vram_total_bytes,
            HardwareSummary::Cpu { .. } => 0,
        }
    }
}

/// A weekly availability window in the provider's stated UTC offset.
/// `weekdays` is a bit set, bit 0 = Monday … bit 6 = Sunday. Minutes count from
/// local midnight; `end_minute` may be ≤ `start_minute` for a window past midnight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AvailabilityWindow {
    pub weekdays: u8,
    pub start_minute: u16,
    pub end_minute: u16,
    pub utc_offset_minutes: i16,
}

impl AvailabilityWindow {
    pub const ALWAYS: Self = Self {
        weekdays: 0x7f,
        start_minute: 0,
        end_minute: 1440,
        utc_offset_minutes: 0,
    };

    fn validate(&self) -> Result<(), ValidationError> {
        if self.weekdays & 0x80 != 0 || self.weekdays == 0 {
            return Err(ValidationError::field(
                "windows.weekdays",
                "bit set must be 1..=0x7f",
            ));
        }
        if self.start_minute > 1440 || self.end_minute > 1440 {
            return Err(ValidationError::field(
                "windows.minute",
                "minutes must be ≤ 1440",
            ));
        }
        if !(-14 * 60..=14 * 60).contains(&self.utc_offset_minutes) {
            return Err(ValidationError::field(
                "windows.utc_offset_minutes",
                "must be within ±14 h",
            ));
        }
        Ok(())
    }

    /// Whether `unix_ms` falls inside this window.
    pub fn contains(&self, unix_ms: u64) -> bool {
        let local_minutes = (unix_ms / 60_000) as i64 + i64::from(self.utc_offset_minutes);
        let minute_of_day = local_minutes.rem_euclid(1440) as u16;
        // 1970-01-01 was a Thursday: weekday index 3 with Monday = 0.
        let day = local_minutes.div_euclid(1440);
        let weekday = (day + 3).rem_euclid(7) as u8;
        let in_day = |wd: u8| self.weekdays & (1 << wd) != 0;
        if self.start_minute < self.end_minute {
            in_day(weekday) && minute_of_day >= self.start_minute && minute_of_day < self.end_minute
        } else {
            // Wraps past midnight: the evening belongs to `weekday`, the morning to the day before.
            (in_day(weekday) && minute_of_day >= self.start_minute)
                || (in_day((weekday + 6) % 7) && minute_of_day < self.end_minute)
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Load {
    pub active_jobs: u32,
    pub queue_depth: u32,
    pub max_concurrent: u32,
}

/// A provider's standing offer: what it serves, how fast, at what price, when.
/// Its sequence number, issue time and expiry are the envelope's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advert {
    pub provider: NodeId,
    pub region: String,
    pub hardware: HardwareSummary,
    pub models: Vec<ModelOffer>,
    pub tiers: Vec<Tier>,
    /// Empty means always available.
    pub windows: Vec<AvailabilityWindow>,
    pub load: Load,
    /// Multiaddrs the provider listens on, as text, so buyers can dial it directly.
    pub addresses: Vec<String>,
}

impl Advert {
    pub fn validate(&self) -> Result<(), ValidationError> {
        short("region", &self.region)?;
        at_most("models", self.models.len(), MAX_MODELS_PER_ADVERT)?;
        at_most("windows", self.windows.len(), MAX_WINDOWS)?;
        at_most("tiers", self.tiers.len(), Tier::ALL.len())?;
        at_most("addresses", self.addresses.len(), MAX_ADDRESSES)?;
        if let HardwareSummary::Gpu { name, .. } = &self.hardware {
            short("hardware.name", name)?;
        }
        for offer in &self.models {
            offer.model.validate()?;
            at_most("models.prices", offer.prices.len(), Tier::ALL.len())?;
        }
        for window in &self.windows {
            window.validate()?;
        }
        for address in &self.addresses {
            short("addresses", address)?;
        }
        Ok(())
    }

    /// Whether the provider is inside one of its availability windows at `unix_ms`.
    pub fn available_at(&self, unix_ms: u64) -> bool {
        self.windows.is_empty() || self.windows.iter().any(|w| w.contains(unix_ms))
    }

    pub fn offer(&self, model: &ModelId) -> Option<&ModelOffer> {
        self.models.iter().find(|o| &o.model.id == model)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFingerprint {
    pub name: String,
    pub uuid: String,
    pub vram_bytes: u64,
    pub driver_version: String,
    pub cuda_version: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchmarkResult {
    pub model: ModelId,
    pub threads: u32,
    pub prefill_milli_tokens_per_second: u32,
    pub generation_milli_tokens_per_second: u32,
}

/// A node's own claim about its hardware and measured speed. It proves only what the
/// key claims: consistency evidence, never trust by itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attestation {
    pub node: NodeId,
    pub gpus: Vec<GpuFingerprint>,
    pub cpu_model: String,
    pub cpu_cores: u32,
    pub ram_bytes: u64,
    pub benchmarks: Vec<BenchmarkResult>,
}

impl Attestation {
    pub fn validate(&self) -> Result<(), ValidationError> {
        at_most("gpus", self.gpus.len(), MAX_GPUS)?;
        at_most("benchmarks", self.benchmarks.len(), MAX_MODELS_PER_ADVERT)?;
        short("cpu_model", &self.cpu_model)?;
        for gpu in &self.gpus {
            short("gpus.name", &gpu.name)?;
            short("gpus.uuid", &gpu.uuid)?;
            short("gpus.driver_version", &gpu.driver_version)?;
            short("gpus.cuda_version", &gpu.cuda_version)?;
        }
        Ok(())
    }
}

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

impl Prompt {
    fn validate(&self) -> Result<(), ValidationError> {
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
}

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
        }
    }
}

impl Sampling {
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
}

impl JobRequest {
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
}

impl TokenChunk {
    pub fn validate(&self) -> Result<(), ValidationError> {
        at_most("token_ids", self.token_ids.len(), MAX_TOKENS_PER_CHUNK)?;
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
}

impl Receipt {
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

/// The provider's commitment to what it produced: evidence for later verification.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputCommitment {
    pub job_id: JobId,
    pub provider: NodeId,
    /// sha256 of the canonical encoding of the `JobRequest` body.
    pub request_hash: Digest,
    /// sha256 over the output token ids (little-endian u32s).
    pub output_hash: Digest,
    pub output_tokens: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeCounts {
    pub completed: u32,
    pub failed: u32,
    pub stalled: u32,
    pub verified_ok: u32,
    pub verified_mismatch: u32,
}

/// One reporter's view of one subject over one epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReputationReport {
    pub reporter: NodeId,
    pub subject: NodeId,
    pub epoch: u64,
    pub outcomes: OutcomeCounts,
    /// Hashes of receipts or commitments backing the counts.
    pub evidence: Vec<Digest>,
}

impl ReputationReport {
    pub fn validate(&self) -> Result<(), ValidationError> {
        at_most("evidence", self.evidence.len(), MAX_EVIDENCE_HASHES)?;
        if self.reporter == self.subject {
            return Err(ValidationError::field(
                "subject",
                "a node cannot report on itself",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_respect_weekday_time_and_offset() {
        // 2026-11-30 is a Monday. 09:00 UTC.
        let monday_9_utc: u64 = 1_796_029_200_000;
        let weekday_office = AvailabilityWindow {
            weekdays: 0b0001_1111,
            start_minute: 8 * 60,
            end_minute: 18 * 60,
            utc_offset_minutes: 0,
        };
        assert!(weekday_office.contains(monday_9_utc));
        assert!(!weekday_office.contains(monday_9_utc - 2 * 86_400_000)); // Saturday
        let tokyo = AvailabilityWindow {
            utc_offset_minutes: 9 * 60,
            ..weekday_office
        }; // 18:00 in Tokyo: closed
        assert!(!tokyo.contains(monday_9_utc));
        let night = AvailabilityWindow {
            weekdays: 0b0000_0001,
            start_minute: 22 * 60,
            end_minute: 6 * 60,
            utc_offset_minutes: 0,
        };
        assert!(night.contains(monday_9_utc + 14 * 3_600_000)); // Monday 23:00
        assert!(night.contains(monday_9_utc + 19 * 3_600_000)); // Tuesday 04:00
        assert!(!night.contains(monday_9_utc)); // Monday 09:00
    }

    #[test]
    fn sampling_rejects_out_of_range_values_by_name() {
        let bad = Sampling {
            temperature: f32::NAN,
            ..Sampling::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("temperature"));
        let bad = Sampling {
            top_p: 0.0,
            ..Sampling::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("top_p"));
        let bad = Sampling {
            max_tokens: 0,
            ..Sampling::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max_tokens"));
        assert!(Sampling::default().validate().is_ok());
    }

    #[test]
    fn receipt_amount_must_match_tokens_times_price() {
        let node = NodeId::from_bytes([1; 32]);
        let mut receipt = Receipt {
            job_id: JobId::from_bytes([2; 16]),
            provider: node,
            buyer: node,
            prompt_tokens: 10,
            completion_tokens: 5,
            price_per_token: NanoUsd(100),
            amount: NanoUsd(1500),
        };
        assert!(receipt.validate().is_ok());
        receipt.amount = NanoUsd(1499);
        assert!(receipt.validate().is_err());
        receipt.price_per_token = NanoUsd(u64::MAX);
        assert!(receipt.validate().is_err());
    }
}
