//! Money is integers: nano-USD (1e-9 USD). Never floats on the wire.

use serde::{Deserialize, Serialize};

/// An amount in nano-USD. Per-token prices use the same unit:
/// 1 USD per million tokens = 1000 nano-USD per token.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct NanoUsd(pub u64);

impl NanoUsd {
    pub const ZERO: Self = Self(0);

    /// Price per token from a price in USD per million tokens, as operators write it.
    /// Rounds to the nearest nano-USD; `None` for negative, non-finite or absurd values.
    pub fn per_token_from_usd_per_mtok(usd_per_mtok: f64) -> Option<Self> {
        if !usd_per_mtok.is_finite() || !(0.0..=1.0e9).contains(&usd_per_mtok) {
            return None;
        }
        Some(Self((usd_per_mtok * 1000.0).round() as u64))
    }

    /// The inverse of [`Self::per_token_from_usd_per_mtok`], for display.
    pub fn as_usd_per_mtok(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    pub fn as_usd(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// `price × tokens`, or `None` on overflow.
    pub fn times(self, tokens: u64) -> Option<Self> {
        self.0.checked_mul(tokens).map(Self)
    }

    pub fn checked_add(self, other: Self) -> Option<Self> {
        self.0.checked_add(other.0).map(Self)
    }

    pub fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }
}

impl std::fmt::Display for NanoUsd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "${:.9}", self.as_usd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_usd_per_million_tokens() {
        assert_eq!(
            NanoUsd::per_token_from_usd_per_mtok(1.0),
            Some(NanoUsd(1000))
        );
        assert_eq!(
            NanoUsd::per_token_from_usd_per_mtok(0.25),
            Some(NanoUsd(250))
        );
        assert_eq!(NanoUsd::per_token_from_usd_per_mtok(-1.0), None);
        assert_eq!(NanoUsd::per_token_from_usd_per_mtok(f64::NAN), None);
        assert_eq!(NanoUsd(250).as_usd_per_mtok(), 0.25);
    }

    #[test]
    fn multiplication_reports_overflow() {
        assert_eq!(NanoUsd(3).times(4), Some(NanoUsd(12)));
        assert_eq!(NanoUsd(u64::MAX).times(2), None);
    }
}
