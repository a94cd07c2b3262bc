//! Prometheus metrics (docs/api.md, *Metrics*): one registry per process, encoded in the OpenMetrics
//! text format at `GET /metrics`. The mesh registers libp2p's own (swarm, Kademlia,
//! gossipsub, identify, ping; prefix `libp2p_`) and its own (prefix `sharemesh_mesh_`);
//! the gateway and the provider add theirs to the same registry.

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The process's registry, shared by everything that registers metrics.
pub type SharedRegistry = Arc<Mutex<Registry>>;

/// An empty registry.
pub fn registry() -> SharedRegistry {
    Arc::new(Mutex::new(Registry::default()))
}

/// The registry in the OpenMetrics text format.
pub fn encode(registry: &SharedRegistry) -> String {
    let mut out = String::new();
    if let Ok(registry) = registry.lock() {
        if let Err(err) = prometheus_client::encoding::text::encode(&mut out, &registry) {
            tracing::warn!(%err, "could not encode the metrics");
        }
    }
    out
}

/// From 1 ms (a healthy loop) to 30 s (a starved one).
const LATENESS_BUCKETS: [f64; 9] = [0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0];

/// Gossip messages by topic and what validation made of them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GossipLabels {
    pub topic: String,
    /// `accepted`, `rejected` (the sender is penalised) or `ignored`.
    pub outcome: String,
}

/// What the mesh's event loop records.
pub(crate) struct MeshMetrics {
    pub libp2p: libp2p::metrics::Metrics,
    pub connected_peers: Gauge,
    pub book_entries: Gauge,
    pub gossip: Family<GossipLabels, Counter>,
    pub loop_lateness: Histogram,
}

impl MeshMetrics {
    pub fn register(registry: &SharedRegistry) -> Option<Self> {
        let mut registry = registry.lock().ok()?;
        // libp2p-metrics adds its own `libp2p_` prefix.
        let libp2p = libp2p::metrics::Metrics::new(&mut registry);
        let mesh = registry.sub_registry_with_prefix("sharemesh_mesh");
        let metrics = Self {
            libp2p,
            connected_peers: Gauge::default(),
            book_entries: Gauge::default(),
            gossip: Family::default(),
            loop_lateness: Histogram::new(LATENESS_BUCKETS),
        };
        mesh.register(
            "connected_peers",
            "Peers with at least one open connection",
            metrics.connected_peers.clone(),
        );
        mesh.register(
            "book_entries",
            "Live adverts in the order book",
            metrics.book_entries.clone(),
        );
        mesh.register(
            "gossip_messages",
            "Gossip messages received, by topic and validation outcome",
            metrics.gossip.clone(),
        );
        mesh.register(
            "event_loop_lateness_seconds",
            "How late the event loop ran its 5 s maintenance tick (the process starved it)",
            metrics.loop_lateness.clone(),
        );
        Some(metrics)
    }
}
