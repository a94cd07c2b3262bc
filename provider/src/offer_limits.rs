//! How many settlement offers (`/sharemesh/settle/2`) a provider takes: each costs it a
//! read of the chain (the buyer's deposit) and a ledger write, and keys are free, so a
//! flood of fresh buyers could spend its RPC quota. At most
//! [`OFFERS_PER_ORIGIN_PER_MINUTE`] per network origin and [`OFFERS_PER_MINUTE`] in all;
//! an honest gateway sends one per provider per run and one per settlement round.
//! Pure: time is an argument.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::unpaid::Origin;

pub const OFFERS_PER_ORIGIN_PER_MINUTE: usize = 20;
pub const OFFERS_PER_MINUTE: usize = 600;
/// Origins remembered at most (those idle for a minute are forgotten first).
const MAX_ORIGINS: usize = 10_000;
const MINUTE_MS: u64 = 60_000;

#[derive(Debug, Default)]
struct Table {
    all: VecDeque<u64>,
    by_origin: HashMap<Origin, VecDeque<u64>>,
}

#[derive(Debug, Default)]
pub struct OfferLimits(Mutex<Table>);

fn forget_before(times: &mut VecDeque<u64>, cutoff: u64) {
    while times.front().is_some_and(|&t| t < cutoff) {
        times.pop_front();
    }
}

impl OfferLimits {
    /// Counts an offer from `origin` at `now_ms` if the limits allow it.
    pub fn take(&self, origin: &Origin, now_ms: u64) -> bool {
        let Ok(mut table) = self.0.lock() else {
            return false;
        };
        let cutoff = now_ms.saturating_sub(MINUTE_MS);
        forget_before(&mut table.all, cutoff);
        if table.all.len() >= OFFERS_PER_MINUTE {
            return false;
        }
        if !table.by_origin.contains_key(origin) && table.by_origin.len() >= MAX_ORIGINS {
            table.by_origin.retain(|_, times| {
                forget_before(times, cutoff);
                !times.is_empty()
            });
            if table.by_origin.len() >= MAX_ORIGINS {
                return false;
            }
        }
        let times = table.by_origin.entry(origin.clone()).or_default();
        forget_before(times, cutoff);
        if times.len() >= OFFERS_PER_ORIGIN_PER_MINUTE {
            return false;
        }
        times.push_back(now_ms);
        table.all.push_back(now_ms);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(ip: &str) -> Origin {
        Origin::of(
            &format!("/ip4/{ip}/tcp/1")
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        )
    }

    #[test]
    fn one_origin_gets_its_share_per_minute_and_the_next_minute_again() {
        let limits = OfferLimits::default();
        let flood = origin("10.0.0.1");
        let taken = (0..100).filter(|i| limits.take(&flood, 1_000 + i)).count();
        assert_eq!(taken, OFFERS_PER_ORIGIN_PER_MINUTE);
        // Another origin is not held back by the flood.
        assert!(limits.take(&origin("10.0.0.2"), 2_000));
        // A minute later the flood's origin has its share again.
        assert!(limits.take(&flood, 1_000 + MINUTE_MS + 100));
    }

    #[test]
    fn every_origin_together_is_bounded_too() {
        let limits = OfferLimits::default();
        let mut taken = 0;
        for host in 0..200u32 {
            let from = origin(&format!("10.1.{}.{}", host / 256, host % 256));
            taken += (0..10).filter(|_| limits.take(&from, 5_000)).count();
        }
        assert_eq!(taken, OFFERS_PER_MINUTE);
    }
}
