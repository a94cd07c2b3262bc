//! Amounts of the settlement token, and their relation to the ledger's nano-USD.

use alloy_primitives::U256;
use serde::{Deserialize, Serialize};

/// An amount of the settlement token in its smallest unit (USDC: 10^-6 USD).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct TokenUnits(pub u128);

/// The ledger counts in 10^-9 USD; a token with more decimals than that is refused (no
/// stablecoin in use has them, and it would make one nano-USD a fraction).
pub const MAX_DECIMALS: u8 = 9;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a settlement token with {0} decimals is not supported (at most {MAX_DECIMALS})")]
pub struct UnsupportedDecimals(pub u8);

/// How a token's units relate to USD, for a USD stablecoin with `decimals` decimals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scale {
    nano_usd_per_unit: u64,
}

impl Scale {
    pub fn for_decimals(decimals: u8) -> Result<Self, UnsupportedDecimals> {
        if decimals > MAX_DECIMALS {
            return Err(UnsupportedDecimals(decimals));
        }
        Ok(Scale {
            nano_usd_per_unit: 10u64.pow(u32::from(MAX_DECIMALS - decimals)),
        })
    }

    /// USDC's: six decimals, one unit is 1000 nano-USD.
    pub fn usdc() -> Self {
        Scale {
            nano_usd_per_unit: 1_000,
        }
    }

    /// Whole units in `nano_usd`, rounded down: a buyer never authorises a fraction it
    /// does not owe. Cumulative amounts lose at most one unit in all, not per job.
    pub fn units_of(self, nano_usd: u128) -> TokenUnits {
        TokenUnits(nano_usd / u128::from(self.nano_usd_per_unit))
    }

    pub fn nano_usd_of(self, units: TokenUnits) -> u128 {
        units.0.saturating_mul(u128::from(self.nano_usd_per_unit))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseUsdError {
    #[error("{0:?} is not an amount of USD (digits, at most one '.')")]
    NotANumber(String),
    #[error("{text:?} has more decimals than the token's {decimals}")]
    TooPrecise { text: String, decimals: u8 },
    #[error("{0:?} is too large")]
    TooLarge(String),
}

impl Scale {
    /// The token's decimals.
    pub fn decimals(self) -> u8 {
        MAX_DECIMALS - self.nano_usd_per_unit.ilog10() as u8
    }

    /// `"12.5"` USD in token units; refuses what the token cannot represent instead of
    /// rounding a user's deposit.
    pub fn parse_usd(self, text: &str) -> Result<TokenUnits, ParseUsdError> {
        let decimals = self.decimals();
        let bad = || ParseUsdError::NotANumber(text.to_owned());
        let (whole, fraction) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
        let digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && fraction.is_empty()) || !digits(whole) || !digits(fraction) {
            return Err(bad());
        }
        if fraction.len() > usize::from(decimals) {
            return Err(ParseUsdError::TooPrecise {
                text: text.to_owned(),
                decimals,
            });
        }
        let padded = format!("{whole}{fraction:0<width$}", width = usize::from(decimals));
        let units = padded
            .trim_start_matches('0')
            .parse::<u128>()
            .or_else(|_| {
                if padded.bytes().all(|b| b == b'0') {
                    Ok(0)
                } else {
                    Err(())
                }
            })
            .map_err(|()| ParseUsdError::TooLarge(text.to_owned()))?;
        Ok(TokenUnits(units))
    }

    /// Units as USD text with the token's decimals.
    pub fn usd_text(self, units: TokenUnits) -> String {
        let decimals = u32::from(self.decimals());
        if decimals == 0 {
            return units.0.to_string();
        }
        let one = 10u128.pow(decimals);
        format!(
            "{}.{:0width$}",
            units.0 / one,
            units.0 % one,
            width = decimals as usize
        )
    }
}

impl TokenUnits {
    pub fn to_u256(self) -> U256 {
        U256::from(self.0)
    }

    /// `None` when the chain reports more than a u128 holds (no real token has that much).
    pub fn from_u256(value: U256) -> Option<Self> {
        u128::try_from(value).ok().map(TokenUnits)
    }

    pub fn saturating_sub(self, other: TokenUnits) -> TokenUnits {
        TokenUnits(self.0.saturating_sub(other.0))
    }
}

impl std::fmt::Display for TokenUnits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} units", self.0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn usdc_units_are_thousands_of_nano_usd_rounded_down() {
        let usdc = Scale::for_decimals(6).unwrap();
        assert_eq!(usdc, Scale::usdc());
        assert_eq!(usdc.units_of(999), TokenUnits(0));
        assert_eq!(usdc.units_of(1_000), TokenUnits(1));
        assert_eq!(usdc.units_of(2_999), TokenUnits(2));
        assert_eq!(usdc.nano_usd_of(TokenUnits(3)), 3_000);
        assert_eq!(Scale::for_decimals(9).unwrap().units_of(7), TokenUnits(7));
        assert_eq!(
            Scale::for_decimals(0).unwrap().units_of(2_500_000_000),
            TokenUnits(2)
        );
        for decimals in 0..=MAX_DECIMALS {
            assert_eq!(Scale::for_decimals(decimals).unwrap().decimals(), decimals);
        }
    }

    #[test]
    fn usd_amounts_parse_exactly_or_not_at_all() {
        let usdc = Scale::usdc();
        assert_eq!(usdc.parse_usd("12.5"), Ok(TokenUnits(12_500_000)));
        assert_eq!(usdc.parse_usd("0.000001"), Ok(TokenUnits(1)));
        assert_eq!(usdc.parse_usd("3"), Ok(TokenUnits(3_000_000)));
        assert_eq!(usdc.parse_usd(".5"), Ok(TokenUnits(500_000)));
        assert_eq!(usdc.parse_usd("0"), Ok(TokenUnits(0)));
        assert!(matches!(
            usdc.parse_usd("0.0000001"),
            Err(ParseUsdError::TooPrecise { .. })
        ));
        for bad in ["", ".", "-1", "1e3", "1.2.3", "12,5", " ", "0x10"] {
            assert!(
                matches!(usdc.parse_usd(bad), Err(ParseUsdError::NotANumber(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            usdc.parse_usd(&"9".repeat(60)),
            Err(ParseUsdError::TooLarge(_))
        ));
        assert_eq!(usdc.usd_text(TokenUnits(12_500_001)), "12.500001");
        assert_eq!(Scale::for_decimals(0).unwrap().usd_text(TokenUnits(7)), "7");
    }

    #[test]
    fn tokens_finer_than_a_nano_usd_are_refused_by_name() {
        let err = Scale::for_decimals(18).unwrap_err();
        assert_eq!(err, UnsupportedDecimals(18));
        assert!(err.to_string().contains("18 decimals"));
    }

    #[test]
    fn chain_amounts_beyond_u128_are_not_truncated() {
        assert_eq!(TokenUnits::from_u256(U256::from(5u8)), Some(TokenUnits(5)));
        assert_eq!(TokenUnits::from_u256(U256::MAX), None);
        assert_eq!(TokenUnits(5).to_u256(), U256::from(5u8));
    }
}
