//! The gateway's Prometheus metrics (prefix `sharemesh_gateway_`), registered in the
//! process's registry when it keeps one (`GET /metrics`, docs/api.md, *Metrics*).

use prometheus_client::encoding::EncodeLabelSet;
use std::collections::HashSet;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use sharemesh_mesh::metrics::SharedRegistry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The HTTP status the request ended with (200 for an answer, streamed or not).
    pub status: String,
    pub tier: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The provider (peer id) that served a segment.
    pub provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabels {
    /// `gateway's daily`, `API key alice's monthly`, … (as `GET /v1/account/budgets`).
    pub budget: String,
}

/// Providers named in `segments_total` (each its own series); later ones count under
/// `provider="other"`, so a stream of fresh keys cannot grow the scrape without bound.
pub const MAX_ROUTE_SERIES: usize = 256;

pub struct GatewayMetrics {
    pub requests: Family<RequestLabels, Counter>,
    segments: Family<RouteLabels, Counter>,
    /// The providers `segments` has a series for.
    routes: Mutex<HashSet<String>>,
    pub budget_limit: Family<BudgetLabels, Gauge>,
    pub budget_spent: Family<BudgetLabels, Gauge>,
    pub budget_in_flight: Family<BudgetLabels, Gauge>,
    pub failovers: Counter,
    pub hedges: Counter,
    /// Waits for a turn when every provider was at capacity.
    pub waits: Counter,
    pub tokens: Counter,
    pub spent_nano_usd: Counter,
    /// What verification windows bought from providers cost (not in `spent_nano_usd`).
    pub verification_spent_nano_usd: Counter,
    pub quote_round: Histogram,
    pub time_to_first_token: Histogram,
}

impl GatewayMetrics {
    pub fn register(registry: &SharedRegistry) -> Option<Self> {
        let mut registry = registry.lock().ok()?;
        let r = registry.sub_registry_with_prefix("sharemesh_gateway");
        let metrics = Self {
            requests: Family::default(),
            segments: Family::default(),
            routes: Mutex::new(HashSet::new()),
            budget_limit: Family::default(),
            budget_spent: Family::default(),
            budget_in_flight: Family::default(),
            failovers: Counter::default(),
            hedges: Counter::default(),
            waits: Counter::default(),
            tokens: Counter::default(),
            spent_nano_usd: Counter::default(),
            verification_spent_nano_usd: Counter::default(),
            // 1 ms .. ~16 s.
            quote_round: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            time_to_first_token: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        };
        r.register(
            "requests",
            "Completion requests, by final status and tier",
            metrics.requests.clone(),
        );
        r.register(
            "segments",
            "Segments served, by provider (the route of each response)",
            metrics.segments.clone(),
        );
        r.register(
            "budget_limit_nano_usd",
            "Each spend limit in force (the gateway's, each API key's), in nano-USD",
            metrics.budget_limit.clone(),
        );
        r.register(
            "budget_spent_nano_usd",
            "What each budget's period spent so far, in nano-USD",
            metrics.budget_spent.clone(),
        );
        r.register(
            "budget_in_flight_nano_usd",
            "Worst cases held against each budget by requests running now, in nano-USD",
            metrics.budget_in_flight.clone(),
        );
        r.register(
            "failovers",
            "Providers replaced mid-request (a failed open, a broken or stalled stream)",
            metrics.failovers.clone(),
        );
        r.register(
            "hedges",
            "Gold requests started on two providers",
            metrics.hedges.clone(),
        );
        r.register(
            "waits",
            "Waits for a turn in the waiting room (every provider at capacity)",
            metrics.waits.clone(),
        );
        r.register(
            "tokens",
            "Completion tokens delivered to clients",
            metrics.tokens.clone(),
        );
        r.register(
            "spent_nano_usd",
            "What this gateway's receipts acknowledged, in nano-USD",
            metrics.spent_nano_usd.clone(),
        );
        r.register(
            "verification_spent_nano_usd",
            "What this gateway paid providers to re-run windows of others' jobs (verification), in nano-USD; not in spent_nano_usd",
            metrics.verification_spent_nano_usd.clone(),
        );
        r.register(
            "quote_round_seconds",
            "Time to ask the shortlisted providers for quotes",
            metrics.quote_round.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "From opening a segment to its first token",
            metrics.time_to_first_token.clone(),
        );
        Some(metrics)
    }
}

impl GatewayMetrics {
    /// Counts a segment `provider` served (under `other` past [`MAX_ROUTE_SERIES`]).
    pub fn count_segment(&self, provider: &str) {
        let provider = match self.routes.lock() {
            Ok(mut routes) => {
                if routes.contains(provider) || routes.len() < MAX_ROUTE_SERIES {
                    routes.insert(provider.to_owned());
                    provider.to_owned()
                } else {
                    "other".to_owned()
                }
            }
            Err(_) => "other".to_owned(),
        };
        self.segments.get_or_create(&RouteLabels { provider }).inc();
    }

    /// Sets the budget gauges from the budgets' view now.
    pub fn show_budgets(&self, budgets: &[crate::budget::BudgetView]) {
        let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        for budget in budgets {
            let labels = BudgetLabels {
                budget: budget.name.clone(),
            };
            self.budget_limit
                .get_or_create(&labels)
                .set(gauge(budget.limit_nano_usd));
            self.budget_spent
                .get_or_create(&labels)
                .set(gauge(budget.spent_nano_usd));
            self.budget_in_flight
                .get_or_create(&labels)
                .set(gauge(budget.held_nano_usd));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_series_are_bounded_and_the_rest_count_as_other() {
        let registry = sharemesh_mesh::metrics::registry();
        let metrics = GatewayMetrics::register(&registry).unwrap_or_else(|| panic!("registered"));
        for n in 0..MAX_ROUTE_SERIES + 10 {
            metrics.count_segment(&format!("provider-{n}"));
        }
        metrics.count_segment("provider-0");
        let text = sharemesh_mesh::metrics::encode(&registry);
        let series = text
            .lines()
            .filter(|l| l.starts_with("sharemesh_gateway_segments_total{"))
            .count();
        assert_eq!(
            series,
            MAX_ROUTE_SERIES + 1,
            "{MAX_ROUTE_SERIES} providers and other"
        );
        assert!(
            text.contains("sharemesh_gateway_segments_total{provider=\"other\"} 10"),
            "{text}"
        );
        assert!(text.contains("sharemesh_gateway_segments_total{provider=\"provider-0\"} 2"));
    }
}
