//! What providers publish: adverts (standing offers) and hardware attestations.

use serde::{Deserialize, Serialize};

use super::*;
use super::{at_most, short};
use crate::error::ValidationError;
use crate::ids::{ModelId, NodeId};
use crate::money::NanoUsd;

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
        // A catalog name names one file: offering another under it is a hijack.
        if let Some(bound) = crate::catalog::catalog_id(&self.name) {
            if bound != self.id {
                return Err(ValidationError::field(
                    "model.name",
                    format!(
                        "`{}` is the catalog name of model {bound}, not of {}",
                        self.name, self.id
                    ),
                ));
            }
        }
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
        /// Each GPU's NVML fingerprint (name, UUID, VRAM, driver), signed with the
        /// advert; ≤ `MAX_GPUS`, one per GPU counted.
        fingerprints: Vec<GpuFingerprint>,
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
    /// Jobs the provider decodes together (continuous batching; 0: not said).
    pub max_batch: u32,
    /// Measured aggregate generation speed with `max_batch` jobs decoding together,
    /// in thousandths of a token per second (0: not measured).
    pub batch_milli_tokens_per_second: u32,
    /// The KV-cache budget, in blocks of 16 positions (0: not paged).
    pub kv_blocks_total: u32,
    /// Blocks free now (or held only for prefix reuse).
    pub kv_blocks_available: u32,
}

/// Most jobs an advert may say it decodes together.
pub const MAX_BATCH: u32 = 4096;

impl Load {
    fn validate(&self) -> Result<(), ValidationError> {
        if self.max_batch > MAX_BATCH {
            return Err(ValidationError::field(
                "load.max_batch",
                format!("must be at most {MAX_BATCH}"),
            ));
        }
        if self.kv_blocks_available > self.kv_blocks_total {
            return Err(ValidationError::field(
                "load.kv_blocks_available",
                "must not exceed load.kv_blocks_total",
            ));
        }
        Ok(())
    }

    /// Whether running plus queued work has reached the provider's bound (0: no bound).
    pub fn is_full(&self) -> bool {
        self.max_concurrent != 0
            && self.active_jobs.saturating_add(self.queue_depth) >= self.max_concurrent
    }
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
        if let HardwareSummary::Gpu {
            name,
            count,
            fingerprints,
            ..
        } = &self.hardware
        {
            short("hardware.name", name)?;
            at_most("hardware.fingerprints", fingerprints.len(), MAX_GPUS)?;
            if !fingerprints.is_empty() && fingerprints.len() != *count as usize {
                return Err(ValidationError::field(
                    "hardware.fingerprints",
                    "must list every GPU counted, or none",
                ));
            }
            for gpu in fingerprints {
                gpu.validate()?;
            }
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
        self.load.validate()
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

impl GpuFingerprint {
    pub fn validate(&self) -> Result<(), ValidationError> {
        short("gpus.name", &self.name)?;
        short("gpus.uuid", &self.uuid)?;
        short("gpus.driver_version", &self.driver_version)?;
        short("gpus.cuda_version", &self.cuda_version)
    }
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
            gpu.validate()?;
        }
        Ok(())
    }
}
