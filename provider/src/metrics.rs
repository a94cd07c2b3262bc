//! The provider's Prometheus metrics (prefix `sharemesh_provider_`), registered in the
//! process's registry when it keeps one (`GET /metrics`, docs/api.md, *Metrics*).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use sharemesh_mesh::metrics::SharedRegistry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `ended` (finished, failed or preempted: the final chunk went out), `buyer_left`,
    /// `unpaid` (receipts stopped), `stalled`, `write_failed`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub gpu: String,
}

pub struct ProviderMetrics {
    pub jobs: Family<OutcomeLabels, Counter>,
    pub tokens_served: Counter,
    pub earned_nano_usd: Counter,
    pub active_jobs: Gauge,
    pub queue_depth: Gauge,
    /// The batching engine's KV blocks: free (or held only for prefix reuse), and all.
    pub kv_blocks_available: Gauge,
    pub kv_blocks_total: Gauge,
    /// Jobs preempted (and recomputed) because decoding ran out of KV blocks; a gauge
    /// set from the engine's own count.
    pub kv_preemptions: Gauge,
    /// Decode speed of the last job that finished (tokens/s, the engine's own timing).
    pub engine_tokens_per_second: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub time_to_first_token: Histogram,
    pub inter_token: Histogram,
    pub gpu_temperature_celsius: Family<GpuLabels, Gauge>,
    pub gpu_power_watts: Family<GpuLabels, Gauge>,
    pub gpu_utilization_percent: Family<GpuLabels, Gauge>,
    /// On-chain settlement, in the token's smallest units (all buyers): authorised by
    /// buyers, paid out on chain, and authorised but not yet redeemed.
    pub settlement_authorised_units: Gauge,
    pub settlement_redeemed_units: Gauge,
    pub settlement_redeemable_units: Gauge,
}

impl ProviderMetrics {
    pub fn register(registry: &SharedRegistry) -> Option<Self> {
        let mut registry = registry.lock().ok()?;
        let r = registry.sub_registry_with_prefix("sharemesh_provider");
        let metrics = Self {
            jobs: Family::default(),
            tokens_served: Counter::default(),
            earned_nano_usd: Counter::default(),
            active_jobs: Gauge::default(),
            queue_depth: Gauge::default(),
            kv_blocks_available: Gauge::default(),
            kv_blocks_total: Gauge::default(),
            kv_preemptions: Gauge::default(),
            engine_tokens_per_second: Gauge::default(),
            // 1 ms .. ~33 s.
            time_to_first_token: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            // 0.5 ms .. ~4 s.
            inter_token: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            gpu_temperature_celsius: Family::default(),
            gpu_power_watts: Family::default(),
            gpu_utilization_percent: Family::default(),
            settlement_authorised_units: Gauge::default(),
            settlement_redeemed_units: Gauge::default(),
            settlement_redeemable_units: Gauge::default(),
        };
        r.register(
            "settlement_authorised_units",
            "Cumulative amount buyers authorised on chain, in the settlement token's units",
            metrics.settlement_authorised_units.clone(),
        );
        r.register(
            "settlement_redeemed_units",
            "Paid out to this provider by the escrow, in the settlement token's units",
            metrics.settlement_redeemed_units.clone(),
        );
        r.register(
            "settlement_redeemable_units",
            "Authorised by buyers and not yet redeemed, in the settlement token's units",
            metrics.settlement_redeemable_units.clone(),
        );
        r.register(
            "jobs",
            "Jobs served, by how they ended",
            metrics.jobs.clone(),
        );
        r.register(
            "tokens_served",
            "Completion tokens streamed to buyers",
            metrics.tokens_served.clone(),
        );
        r.register(
            "earned_nano_usd",
            "What buyers' receipts acknowledged, in nano-USD",
            metrics.earned_nano_usd.clone(),
        );
        r.register(
            "active_jobs",
            "Jobs generating now",
            metrics.active_jobs.clone(),
        );
        r.register(
            "queue_depth",
            "Jobs waiting for the engine",
            metrics.queue_depth.clone(),
        );
        r.register(
            "kv_blocks_available",
            "KV-cache blocks (16 positions) free or held only for prefix reuse",
            metrics.kv_blocks_available.clone(),
        );
        r.register(
            "kv_blocks_total",
            "KV-cache blocks of the batch's budget",
            metrics.kv_blocks_total.clone(),
        );
        r.register(
            "kv_preemptions",
            "Jobs preempted and recomputed because decoding ran out of KV blocks",
            metrics.kv_preemptions.clone(),
        );
        r.register(
            "engine_tokens_per_second",
            "Decode speed of the last finished job",
            metrics.engine_tokens_per_second.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "From accepting a job to its first token",
            metrics.time_to_first_token.clone(),
        );
        r.register(
            "inter_token_seconds",
            "Between consecutive tokens of a job",
            metrics.inter_token.clone(),
        );
        r.register(
            "gpu_temperature_celsius",
            "GPU temperature (NVML)",
            metrics.gpu_temperature_celsius.clone(),
        );
        r.register(
            "gpu_power_watts",
            "GPU power draw (NVML)",
            metrics.gpu_power_watts.clone(),
        );
        r.register(
            "gpu_utilization_percent",
            "GPU utilisation (NVML)",
            metrics.gpu_utilization_percent.clone(),
        );
        Some(metrics)
    }

    pub fn job_ended(&self, outcome: &str) {
        self.jobs
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }
}

impl ProviderMetrics {
    /// Shows the settlement totals of the last round.
    pub fn show_settlement(&self, totals: &sharemesh_settlement::payee::PayeeTotals) {
        let gauge = |value: u128| i64::try_from(value).unwrap_or(i64::MAX);
        self.settlement_authorised_units
            .set(gauge(totals.authorised_units));
        self.settlement_redeemed_units
            .set(gauge(totals.redeemed_units));
        self.settlement_redeemable_units
            .set(gauge(totals.redeemable_units));
    }
}
