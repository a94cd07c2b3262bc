//! Spend limits: a request is refused (402) unless its worst-case cost fits what is left
//! of the gateway's and its API key's daily and monthly budgets, counting what the
//! requests in flight hold.

use std::collections::HashMap;
use std::sync::Mutex;

use sharemesh_ledger::{Ledger, LedgerError, Period, SpendScope};
use sharemesh_protocol::{NanoUsd, NodeId};

use crate::keys::KeyRecord;
use crate::route::RouteError;

/// Spend limits of the gateway, in nano-USD.
#[derive(Clone, Debug, Default)]
pub struct Budget {
    pub daily: Option<NanoUsd>,
    pub monthly: Option<NanoUsd>,
}

/// Worst-case costs held by requests in flight.
#[derive(Default)]
struct Held {
    total: u64,
    per_key: HashMap<String, u64>,
}

/// The gateway's budgets and what requests in flight hold against them.
pub struct Budgets {
    budget: Budget,
    held: Mutex<Held>,
}

/// Releases a request's reservation however it ends.
pub struct Reservation<'a> {
    held: &'a Mutex<Held>,
    amount: u64,
    key: Option<String>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Ok(mut held) = self.held.lock() {
            held.total = held.total.saturating_sub(self.amount);
            if let Some(key) = &self.key {
                if let Some(by_key) = held.per_key.get_mut(key) {
                    *by_key = by_key.saturating_sub(self.amount);
                }
            }
        }
    }
}

/// One limit to check: (limit, spent so far, its name, held by requests in flight).
type Limit = (u64, u64, String, u64);

/// A budget as `GET /v1/account/budgets` shows it, in nano-USD.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BudgetView {
    /// `gateway's daily`, `API key NAME's monthly`, …
    pub name: String,
    pub limit_nano_usd: u64,
    pub spent_nano_usd: u64,
    /// Worst cases held by requests in flight.
    pub held_nano_usd: u64,
    pub left_nano_usd: u64,
}

impl Budgets {
    /// Every limit that applies to a request of `key` (the gateway's, then the key's),
    /// with what `buyer`'s ledger counts as spent this day or month.
    fn limits(
        &self,
        ledger: Option<&Ledger>,
        buyer: &NodeId,
        key: Option<&KeyRecord>,
        held: &Held,
        now_ms: u64,
    ) -> Result<Vec<Limit>, RouteError> {
        // Running totals: a few reads, however long the history.
        let spent = |scope: SpendScope<'_>, period: Period| -> Result<u64, RouteError> {
            match ledger {
                Some(ledger) => ledger.spent(scope, period).map_err(|e: LedgerError| {
                    RouteError::Internal(format!("reading spend from the ledger: {e}"))
                }),
                None => Ok(0),
            }
        };
        let (day, month) = (Period::Day(now_ms), Period::Month(now_ms));
        let mut limits: Vec<Limit> = Vec::new();
        for (limit, period, name) in [
            (self.budget.daily, day, "daily"),
            (self.budget.monthly, month, "monthly"),
        ] {
            let Some(limit) = limit else { continue };
            let spent = spent(SpendScope::Buyer(buyer), period)?;
            limits.push((limit.0, spent, format!("gateway's {name}"), held.total));
        }
        if let Some(key) = key {
            for (limit, period, name) in [
                (key.daily_budget_nano_usd, day, "daily"),
                (key.monthly_budget_nano_usd, month, "monthly"),
            ] {
                let Some(limit) = limit else { continue };
                let spent = spent(SpendScope::ApiKey(&key.id), period)?;
                let in_flight = held.per_key.get(&key.id).copied().unwrap_or(0);
                let name = format!("API key {}'s {name}", key.name);
                limits.push((limit, spent, name, in_flight));
            }
        }
        Ok(limits)
    }

    /// The budgets a request of `key` is held to, with what is spent and left.
    pub fn view(
        &self,
        ledger: Option<&Ledger>,
        buyer: &NodeId,
        key: Option<&KeyRecord>,
        now_ms: u64,
    ) -> Result<Vec<BudgetView>, RouteError> {
        let held = self
            .held
            .lock()
            .map_err(|_| RouteError::Internal("budget lock poisoned".into()))?;
        Ok(self
            .limits(ledger, buyer, key, &held, now_ms)?
            .into_iter()
            .map(|(limit, spent, name, held)| BudgetView {
                name,
                limit_nano_usd: limit,
                spent_nano_usd: spent,
                held_nano_usd: held,
                left_nano_usd: limit.saturating_sub(spent).saturating_sub(held),
            })
            .collect())
    }

    pub fn new(budget: Budget) -> Self {
        Self {
            budget,
            held: Mutex::new(Held::default()),
        }
    }

    /// Refuses the request (402) if `worst_case` does not fit what is left of each
    /// budget that applies, as `buyer`'s ledger counts spend; else holds it until the
    /// returned reservation is dropped.
    pub fn reserve(
        &self,
        ledger: Option<&Ledger>,
        buyer: &NodeId,
        worst_case: u64,
        key: Option<&KeyRecord>,
        now_ms: u64,
    ) -> Result<Reservation<'_>, RouteError> {
        let mut held = self
            .held
            .lock()
            .map_err(|_| RouteError::Internal("budget lock poisoned".into()))?;
        let limits = self.limits(ledger, buyer, key, &held, now_ms)?;
        for (limit, spent, name, in_flight) in limits {
            let left = limit.saturating_sub(spent).saturating_sub(in_flight);
            if worst_case > left {
                return Err(RouteError::OverBudget(format!(
                    "the worst-case cost of this request is {worst_case} nano-USD but only {left} of the {name} budget of {limit} nano-USD is left"
                )));
            }
        }
        held.total += worst_case;
        if let Some(key) = key {
            *held.per_key.entry(key.id.clone()).or_default() += worst_case;
        }
        Ok(Reservation {
            held: &self.held,
            amount: worst_case,
            key: key.map(|k| k.id.clone()),
        })
    }
}
