//! Provider selection for a request: the reverse auction's score.
//!
//! Pure: callers pass what they know about each eligible offer (price, expected latency,
//! throughput, reliability); nothing here reads a clock or the network. The gateway and
//! the market simulation in `sharemesh-testnet` rank with the same function, so what the
//! simulation measures is what the gateway does. SPEC.md §10 gives the formula.

use serde::{Deserialize, Serialize};

/// What the buyer knows about one eligible provider for one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OfferView {
    /// Price per completion token, in nano-USD.
    pub price_per_token: u64,
    /// Expected time to the first token: round trip plus the provider's queue wait.
    pub latency_ms: f64,
    /// Expected generation speed.
    pub tokens_per_second: f64,
    /// Probability the job completes on this provider (observed success rate until the
    /// trust layer supplies reputation), in [0, 1].
    pub reliability: f64,
}

/// Weights of the score; configurable per gateway (`sharemesh gateway --score-price
/// --score-nano-usd-per-second --score-unreliability`, or the same keys in config.toml).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScoreWeights {
    /// Multiplier on the money the request is expected to cost.
    pub price: f64,
    /// What one second of the buyer's waiting is worth, in nano-USD. It converts latency
    /// and generation time into the same unit as price.
    pub nano_usd_per_second: f64,
    /// How strongly a failure is feared: the score is multiplied by
    /// `1 + unreliability × (1 − reliability)`; a failure costs a failover.
    pub unreliability: f64,
}

impl Default for ScoreWeights {
    /// A second of waiting is worth what 10 tokens cost at 100 nano-USD/token; a provider
    /// that fails one job in ten scores 20% worse than a perfect one.
    fn default() -> Self {
        Self {
            price: 1.0,
            nano_usd_per_second: 1_000.0,
            unreliability: 2.0,
        }
    }
}

/// A configuration that cannot rank anything sensibly.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WeightsError {
    #[error("score weight `{0}` must be a finite number ≥ 0, got {1}")]
    Invalid(&'static str, f64),
}

impl ScoreWeights {
    pub fn validate(&self) -> Result<(), WeightsError> {
        for (name, value) in [
            ("price", self.price),
            ("nano_usd_per_second", self.nano_usd_per_second),
            ("unreliability", self.unreliability),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(WeightsError::Invalid(name, value));
            }
        }
        Ok(())
    }
}

/// The expected cost of serving `tokens` on `offer`, in nano-USD (lower is better):
///
/// `(price·p·tokens + s·(latency + tokens/speed)) · (1 + u·(1 − reliability))`
///
/// A speed of zero or less (unknown) counts as one token per second, so an offer that
/// advertises nothing is not preferred over one that does.
pub fn score(offer: &OfferView, tokens: u32, weights: &ScoreWeights) -> f64 {
    let tokens = f64::from(tokens.max(1));
    let speed = if offer.tokens_per_second > 0.0 {
        offer.tokens_per_second
    } else {
        1.0
    };
    let money = weights.price * offer.price_per_token as f64 * tokens;
    let seconds = offer.latency_ms.max(0.0) / 1000.0 + tokens / speed;
    let reliability = offer.reliability.clamp(0.0, 1.0);
    (money + weights.nano_usd_per_second * seconds)
        * (1.0 + weights.unreliability * (1.0 - reliability))
}

/// Indices of `offers` best first by [`score`]; ties go to the cheaper offer, then to the
/// earlier index, so a ranking is deterministic.
pub fn rank(offers: &[OfferView], tokens: u32, weights: &ScoreWeights) -> Vec<usize> {
    let scores: Vec<f64> = offers.iter().map(|o| score(o, tokens, weights)).collect();
    let mut order: Vec<usize> = (0..offers.len()).collect();
    order.sort_by(|&a, &b| {
        scores[a]
            .total_cmp(&scores[b])
            .then(offers[a].price_per_token.cmp(&offers[b].price_per_token))
            .then(a.cmp(&b))
    });
    order
}

/// The `k` cheapest offers' indices (cheapest first; ties by index): who is asked for a
/// quote before the score decides.
pub fn shortlist(prices: &[u64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..prices.len()).collect();
    order.sort_by(|&a, &b| prices[a].cmp(&prices[b]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn offer(price: u64, latency_ms: f64, speed: f64, reliability: f64) -> OfferView {
        OfferView {
            price_per_token: price,
            latency_ms,
            tokens_per_second: speed,
            reliability,
        }
    }

    #[test]
    fn cheaper_wins_when_all_else_is_equal() {
        let offers = [offer(300, 50.0, 40.0, 1.0), offer(100, 50.0, 40.0, 1.0)];
        assert_eq!(rank(&offers, 100, &ScoreWeights::default()), vec![1, 0]);
    }

    #[test]
    fn a_much_faster_provider_beats_a_slightly_cheaper_one() {
        // 100 tokens: 10 nano cheaper per token saves 1,000 nano; 9 s faster saves 9,000.
        let offers = [offer(100, 50.0, 10.0, 1.0), offer(110, 50.0, 100.0, 1.0)];
        assert_eq!(rank(&offers, 100, &ScoreWeights::default())[0], 1);
    }

    #[test]
    fn unreliable_providers_are_penalised() {
        let offers = [offer(100, 50.0, 40.0, 0.5), offer(120, 50.0, 40.0, 0.99)];
        assert_eq!(rank(&offers, 100, &ScoreWeights::default())[0], 1);
        let price_only = ScoreWeights {
            nano_usd_per_second: 0.0,
            unreliability: 0.0,
            ..ScoreWeights::default()
        };
        assert_eq!(rank(&offers, 100, &price_only)[0], 0);
    }

    #[test]
    fn unknown_speed_is_not_an_advantage() {
        let known = score(&offer(100, 0.0, 20.0, 1.0), 100, &ScoreWeights::default());
        let unknown = score(&offer(100, 0.0, 0.0, 1.0), 100, &ScoreWeights::default());
        assert!(unknown > known);
    }

    #[test]
    fn shortlist_takes_the_cheapest_k() {
        assert_eq!(shortlist(&[5, 1, 3, 1, 9], 3), vec![1, 3, 2]);
        assert_eq!(shortlist(&[5], 3), vec![0]);
        assert!(shortlist(&[], 3).is_empty());
    }

    #[test]
    fn invalid_weights_are_named() {
        let bad = ScoreWeights {
            unreliability: f64::NAN,
            ..ScoreWeights::default()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("unreliability"), "{err}");
        assert!(ScoreWeights::default().validate().is_ok());
    }

    proptest! {
        #[test]
        fn score_is_monotone(price in 0u64..1_000_000, latency in 0.0f64..10_000.0,
                             speed in 0.1f64..1_000.0, reliability in 0.0f64..=1.0,
                             tokens in 1u32..4096) {
            let w = ScoreWeights::default();
            let base = score(&offer(price, latency, speed, reliability), tokens, &w);
            prop_assert!(base.is_finite() && base >= 0.0);
            prop_assert!(score(&offer(price + 1, latency, speed, reliability), tokens, &w) >= base);
            prop_assert!(score(&offer(price, latency + 1.0, speed, reliability), tokens, &w) >= base);
            prop_assert!(score(&offer(price, latency, speed * 2.0, reliability), tokens, &w) <= base);
            prop_assert!(score(&offer(price, latency, speed, (reliability + 0.1).min(1.0)), tokens, &w) <= base);
        }

        #[test]
        fn rank_is_a_permutation(prices in proptest::collection::vec(0u64..1000, 0..20)) {
            let offers: Vec<OfferView> = prices.iter().map(|&p| offer(p, 10.0, 30.0, 0.9)).collect();
            let mut order = rank(&offers, 64, &ScoreWeights::default());
            order.sort_unstable();
            prop_assert_eq!(order, (0..offers.len()).collect::<Vec<_>>());
        }
    }
}
