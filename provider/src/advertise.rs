//! What a provider tells the mesh: its signed advert, refreshed every interval, and
//! (in the adversary kit) the lies a modified provider would tell instead.

use std::sync::Arc;

use sharemesh_mesh::clock::now_ms;
use sharemesh_protocol::{Advert, Attestation, BenchmarkResult, Load, ModelOffer, TierPrice};

use crate::{adversary, Provider};

impl Provider {
    pub fn advert(&self) -> Advert {
        Advert {
            provider: self.key.node_id(),
            region: self.policy.region.clone(),
            hardware: self.hardware.summary(),
            models: self
                .engine
                .models()
                .iter()
                .map(|model| ModelOffer {
                    model: model.clone(),
                    generation_milli_tokens_per_second: self.policy.measured_milli_tps,
                    prices: self
                        .policy
                        .tiers
                        .iter()
                        .map(|&tier| TierPrice {
                            tier,
                            price_per_token: self.policy.price(tier),
                        })
                        .collect(),
                })
                .collect(),
            tiers: self.policy.tiers.clone(),
            windows: self.policy.windows.clone(),
            load: self.load(),
            addresses: self
                .mesh
                .advertised_addrs()
                .iter()
                .map(ToString::to_string)
                .collect(),
        }
    }

    /// Jobs running and queued now, against the provider's bound; the batch's size,
    /// measured aggregate speed and KV memory.
    pub(crate) fn load(&self) -> Load {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let batch = self.engine.batch_capacity();
        Load {
            active_jobs: count(self.engine.active_jobs()),
            queue_depth: count(self.engine.queue_depth()),
            max_concurrent: self.policy.max_concurrent,
            max_batch: batch.map_or(0, |b| count(b.max_batch).min(sharemesh_protocol::MAX_BATCH)),
            batch_milli_tokens_per_second: self.policy.batch_milli_tps,
            kv_blocks_total: batch.map_or(0, |b| count(b.total_blocks)),
            kv_blocks_available: batch.map_or(0, |b| count(b.available_blocks.min(b.total_blocks))),
        }
    }

    /// This node's hardware claim: its NVML fingerprints (GPU name, UUID, VRAM,
    /// driver), CPU and what it measured, signed and gossiped beside its adverts. It
    /// proves only what the key claims; buyers check it for consistency (SPEC §12).
    pub fn attestation(&self) -> Attestation {
        Attestation {
            node: self.key.node_id(),
            gpus: self.hardware.fingerprints(),
            cpu_model: self.hardware.cpu_model.chars().take(200).collect(),
            cpu_cores: self.hardware.cpu_cores,
            ram_bytes: self.hardware.ram_bytes,
            benchmarks: self
                .engine
                .models()
                .iter()
                .take(sharemesh_protocol::MAX_MODELS_PER_ADVERT)
                .map(|model| BenchmarkResult {
                    model: model.id,
                    threads: self.hardware.cpu_cores,
                    prefill_milli_tokens_per_second: self.policy.measured_prefill_milli_tps,
                    generation_milli_tokens_per_second: self.policy.measured_milli_tps,
                })
                .collect(),
        }
    }

    async fn publish_attestation(&self) {
        let attestation = self.attestation();
        match self.key.seal(
            &attestation,
            self.seq.next(),
            now_ms(),
            ATTESTATION_LIFETIME_MS,
        ) {
            Ok(envelope) => {
                if let Err(err) = self.mesh.publish_attestation(&envelope).await {
                    tracing::debug!(%err, "publishing the attestation failed");
                }
            }
            Err(err) => tracing::error!(%err, "sealing the attestation failed"),
        }
    }

    /// Publishes the advert now and then every interval (well before it expires), and
    /// announces a Kademlia provider record per model; every tenth advert comes with
    /// the node's attestation.
    /// Load and GPU telemetry for `GET /metrics`, refreshed with every advert.
    fn update_gauges(&self) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        metrics.active_jobs.set(gauge(self.engine.active_jobs()));
        metrics.queue_depth.set(gauge(self.engine.queue_depth()));
        if let Some(batch) = self.engine.batch_capacity() {
            metrics
                .kv_blocks_available
                .set(gauge(batch.available_blocks));
            metrics.kv_blocks_total.set(gauge(batch.total_blocks));
            let preemptions = i64::try_from(batch.preemptions).unwrap_or(i64::MAX);
            metrics.kv_preemptions.set(preemptions);
        }
        if self.hardware.gpus.is_empty() {
            return;
        }
        for gpu in crate::hardware::detect().gpus {
            let labels = crate::metrics::GpuLabels { gpu: gpu.uuid };
            if let Some(t) = gpu.temperature_celsius {
                metrics
                    .gpu_temperature_celsius
                    .get_or_create(&labels)
                    .set(i64::from(t));
            }
            if let Some(w) = gpu.power_watts {
                metrics.gpu_power_watts.get_or_create(&labels).set(w as i64);
            }
            if let Some(u) = gpu.utilization_percent {
                metrics
                    .gpu_utilization_percent
                    .get_or_create(&labels)
                    .set(i64::from(u));
            }
        }
    }

    /// Advertises (and attests) every interval until the mesh stops.
    pub async fn advertise(self: Arc<Self>) {
        for model in self.engine.models() {
            let _ = self.mesh.provide(model.id).await;
        }
        let mut tick = tokio::time::interval(self.policy.advert_interval);
        // A provider whose runtime was starved (its engine on every core) sends its
        // next advert late, not a burst of the ones it missed: receivers rate-limit
        // each signer, and a burst would lose the newest (the current load).
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut adverts = 0u64;
        let mut mesh_events = self.mesh.subscribe();
        loop {
            tokio::select! {
                () = self.mesh.closed() => return,
                _ = tick.tick() => {}
                () = addresses_changed(&mut mesh_events) => {
                    // A new relay reservation makes this node reachable: say so now,
                    // not at the next tick (after a moment, as reservations come in pairs).
                    tokio::time::sleep(ADDRESS_SETTLE).await;
                    tick.reset();
                }
            }
            self.update_gauges();
            if adverts.is_multiple_of(ATTESTATION_EVERY) {
                self.publish_attestation().await;
            }
            adverts += 1;
            if !self.policy.windows.is_empty()
                && !self.policy.windows.iter().any(|w| w.contains(now_ms()))
            {
                continue; // Outside every window: advertise nothing.
            }
            let mut advert = self.advert();
            adversary::tamper_advert(self.policy.adversary(), &mut advert);
            match self.key.seal(
                &advert,
                self.seq.next(),
                now_ms(),
                self.policy.advert_lifetime.as_millis() as u64,
            ) {
                Ok(envelope) => {
                    // Our own book lists us too (gossip never echoes our own messages),
                    // so a gateway in this process can route to us.
                    if let (Ok(bytes), Ok(mut book)) = (envelope.to_bytes(), self.mesh.book.write())
                    {
                        let _ = book.offer(&bytes, now_ms());
                    }
                    if let Err(err) = self.mesh.publish_advert(&envelope).await {
                        tracing::warn!(%err, "publishing the advert failed");
                    }
                }
                Err(err) => tracing::error!(%err, "sealing the advert failed"),
            }
            let lifetime = self.policy.advert_lifetime;
            for envelope in adversary::flood_beside(self.policy.adversary(), &advert, lifetime) {
                let _ = self.mesh.publish_advert(&envelope).await;
            }
        }
    }
}

/// An attestation goes out with every this many adverts (the first included).
const ATTESTATION_EVERY: u64 = 10;
/// How long an attestation is valid.
const ATTESTATION_LIFETIME_MS: u64 = 3_600_000;

/// How long an advert waits after the node's addresses changed, for the rest of a
/// change (a second reservation) to arrive.
const ADDRESS_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Resolves when the mesh reports that the node's advertised addresses changed; never
/// once the mesh stopped. (Missed events are let go: the next tick carries any change.)
async fn addresses_changed(
    events: &mut tokio::sync::broadcast::Receiver<sharemesh_mesh::MeshEvent>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(sharemesh_mesh::MeshEvent::AddressesChanged) => return,
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}
