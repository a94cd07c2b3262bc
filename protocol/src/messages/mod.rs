//! Message bodies. Each is signed inside a [`crate::SignedEnvelope`]; the envelope
//! carries the sequence number, issue time and expiry, so bodies do not repeat them.

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;

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

mod job;
mod offers;
mod trust;

pub use job::*;
pub use offers::*;
pub use trust::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{JobId, NodeId};
    use crate::money::NanoUsd;

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
    fn a_load_claiming_more_free_kv_than_its_budget_or_a_huge_batch_is_rejected() {
        let advert = |load: Load| Advert {
            provider: NodeId::from_bytes([1; 32]),
            region: "eu".into(),
            hardware: HardwareSummary::Cpu {
                cores: 2,
                ram_bytes: 1 << 30,
            },
            models: vec![],
            tiers: vec![Tier::OnDemand],
            windows: vec![],
            load,
            addresses: vec![],
        };
        let honest = Load {
            max_batch: 8,
            batch_milli_tokens_per_second: 120_000,
            kv_blocks_total: 1456,
            kv_blocks_available: 1400,
            ..Load::default()
        };
        assert!(advert(honest).validate().is_ok());
        let more_free = Load {
            kv_blocks_available: 1457,
            ..honest
        };
        let err = advert(more_free).validate().unwrap_err().to_string();
        assert!(err.contains("kv_blocks_available"), "{err}");
        let huge = Load {
            max_batch: MAX_BATCH + 1,
            ..honest
        };
        let err = advert(huge).validate().unwrap_err().to_string();
        assert!(err.contains("max_batch"), "{err}");
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
        for (bad, field) in [
            (
                Sampling {
                    presence_penalty: 2.5,
                    ..Sampling::default()
                },
                "presence_penalty",
            ),
            (
                Sampling {
                    frequency_penalty: f32::INFINITY,
                    ..Sampling::default()
                },
                "frequency_penalty",
            ),
            (
                Sampling {
                    logit_bias: vec![(5, 1.0), (3, 1.0)],
                    ..Sampling::default()
                },
                "ascending",
            ),
            (
                Sampling {
                    logit_bias: vec![(5, 101.0)],
                    ..Sampling::default()
                },
                "token 5",
            ),
            (
                Sampling {
                    logit_bias: (0..=MAX_LOGIT_BIAS as u32).map(|t| (t, 1.0)).collect(),
                    ..Sampling::default()
                },
                "logit_bias",
            ),
            (
                Sampling {
                    format: OutputFormat::JsonSchema("x".repeat(MAX_FORMAT_BYTES + 1)),
                    ..Sampling::default()
                },
                "format",
            ),
        ] {
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn the_greedy_rule_holds_only_with_nothing_between_logits_and_choice() {
        assert!(Sampling::default().greedy_rule_applies());
        for changed in [
            Sampling {
                temperature: 0.5,
                ..Sampling::default()
            },
            Sampling {
                repetition_penalty: 1.1,
                ..Sampling::default()
            },
            Sampling {
                presence_penalty: 0.1,
                ..Sampling::default()
            },
            Sampling {
                frequency_penalty: -0.1,
                ..Sampling::default()
            },
            Sampling {
                logit_bias: vec![(1, 0.5)],
                ..Sampling::default()
            },
            Sampling {
                format: OutputFormat::JsonObject,
                ..Sampling::default()
            },
        ] {
            assert!(!changed.greedy_rule_applies(), "{changed:?}");
        }
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
            commitment: crate::Digest::from_bytes([3; 32]),
        };
        assert!(receipt.validate().is_ok());
        receipt.amount = NanoUsd(1499);
        assert!(receipt.validate().is_err());
        receipt.price_per_token = NanoUsd(u64::MAX);
        assert!(receipt.validate().is_err());
    }

    #[test]
    fn reports_name_each_subject_once_and_never_the_reporter() {
        let (me, other) = (NodeId::from_bytes([1; 32]), NodeId::from_bytes([2; 32]));
        let dealings = ReportedDealings::default();
        let ok = ReputationReport {
            reporter: me,
            epoch: 1,
            entries: vec![(other, dealings)],
        };
        assert!(ok.validate().is_ok());
        let selfish = ReputationReport {
            entries: vec![(me, dealings)],
            ..ok.clone()
        };
        assert!(selfish
            .validate()
            .unwrap_err()
            .to_string()
            .contains("itself"));
        let twice = ReputationReport {
            entries: vec![(other, dealings), (other, dealings)],
            ..ok.clone()
        };
        assert!(twice.validate().unwrap_err().to_string().contains("twice"));
        let many = ReputationReport {
            entries: (0..=MAX_REPORT_ENTRIES)
                .map(|i| (NodeId::from_bytes([(i % 250) as u8 + 3; 32]), dealings))
                .collect(),
            ..ok
        };
        assert!(many.validate().is_err());
    }
}
