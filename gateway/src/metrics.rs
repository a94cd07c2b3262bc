//! The gateway's Prometheus metrics (prefix `sharemesh_gateway_`), registered in the
//! process's registry when it keeps one (`GET /metrics`, SPEC §11).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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

pub struct GatewayMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub segments: Family<RouteLabels, Counter>,
    pub failovers: Counter,
    pub hedges: Counter,
    pub tokens: Counter,
    pub spent_nano_usd: Counter,
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
            failovers: Counter::default(),
            hedges: Counter::default(),
            tokens: Counter::default(),
            spent_nano_usd: Counter::default(),
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
