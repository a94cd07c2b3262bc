//! `sharemesh testnet simulate`: hundreds of mesh nodes in one process on libp2p's
//! memory transport, to measure how adverts spread.
//!
//! Every node is the real mesh (the same behaviours, validation and order book as a
//! deployed node) with a deterministic identity from its index; links are emulated
//! (`mesh::link`: latency, jitter, loss). There is no inference: providers publish
//! adverts for a synthetic model ("synthetic-0", labelled as such) on a schedule.
//! libp2p's timers ignore tokio's paused clock, so `--time-scale X` runs the schedule X
//! times faster than network time instead — advert interval, gossip heartbeat, link
//! delays and the run's length are all divided by X — and latencies are reported in
//! network time (multiplied back by X). Rates per second are per wall second.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use libp2p::Multiaddr;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use sharemesh_protocol::{
    Advert, HardwareSummary, Keypair, Load, ModelDescriptor, ModelId, ModelOffer, NanoUsd, NodeId,
    Tier, TierPrice,
};

use sharemesh_mesh::link::{LinkCounters, LinkModel, LinkProfile};
use sharemesh_mesh::{self as mesh, MeshConfig, MeshEvent, MeshHandle, MeshTransport};

#[derive(Args, Debug, Clone)]
pub struct SimulateArgs {
    /// Nodes in the mesh.
    #[arg(long, default_value_t = 50)]
    pub nodes: usize,
    /// Of which gateways (the rest are providers that publish adverts).
    #[arg(long, default_value_t = 5)]
    pub gateways: usize,
    /// Length of the measured run, in network seconds.
    #[arg(long, default_value_t = 120.0)]
    pub duration: f64,
    /// Seconds between one provider's adverts, in network time.
    #[arg(long, default_value_t = 30.0)]
    pub advert_interval: f64,
    /// Run the network this many times faster than real time.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// One-way link latency (ms, network time).
    #[arg(long, default_value_t = 20.0)]
    pub latency_ms: f64,
    #[arg(long, default_value_t = 5.0)]
    pub jitter_ms: f64,
    /// Extra one-way latency between nodes of different regions (two regions: even and
    /// odd node indices).
    #[arg(long, default_value_t = 40.0)]
    pub cross_region_ms: f64,
    /// Probability a chunk is lost (and retransmitted 200 ms of network time later).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Peers each node keeps (the peer manager's target).
    #[arg(long, default_value_t = 12)]
    pub peers: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Longest wait (wall seconds) for the mesh to form before measuring.
    #[arg(long, default_value_t = 180.0)]
    pub settle_max: f64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct SimReport {
    pub nodes: usize,
    /// Wall seconds spent letting the mesh form before the measured run.
    pub settle_seconds: f64,
    /// Network seconds after the last publish spent waiting for adverts on their way
    /// (included in `wall_seconds`).
    pub drain_seconds: f64,
    pub providers: usize,
    pub network_seconds: f64,
    pub wall_seconds: f64,
    pub adverts_published: usize,
    /// Deliveries over adverts × (nodes − 1).
    pub delivery_ratio: f64,
    /// Publish → accepted at one node, network ms.
    pub delivery_p50_ms: f64,
    pub delivery_p99_ms: f64,
    /// Publish → accepted at every other node, over adverts that reached all, network ms.
    pub all_nodes_p50_ms: f64,
    pub all_nodes_p99_ms: f64,
    pub adverts_reaching_all: usize,
    pub connections_per_node: f64,
    /// New peer connections per node per minute of the measured run (wall time):
    /// churn, each one a noise handshake on both sides.
    pub peer_connections_opened_per_node_per_minute: f64,
    /// Adverts accepted per node per wall second.
    pub messages_per_node_per_second: f64,
    /// Bytes sent per node per wall second (every protocol).
    pub bytes_per_node_per_second: f64,
    /// Cores busy on average (process CPU time over wall time).
    pub cpu_cores: f64,
    pub peak_rss_mb: f64,
    /// Mesh events the measuring tasks missed (they lagged behind a node's event
    /// channel); non-zero means the delivery ratio is a lower bound.
    pub observer_events_lost: u64,
}

/// Node `index`'s secret: the same index is the same identity in every run.
pub fn secret_for(index: usize) -> [u8; 32] {
    let digest = Sha256::digest(format!("sharemesh-sim-node-{index}").as_bytes());
    let mut secret = [0u8; 32];
    secret.copy_from_slice(&digest);
    secret
}

fn address(index: usize) -> Multiaddr {
    format!("/memory/{}", 1_000_000 + index as u64)
        .parse()
        .unwrap_or_else(|_| Multiaddr::empty())
}

fn memory_index(address: &Multiaddr) -> Option<usize> {
    address.iter().find_map(|p| match p {
        libp2p::multiaddr::Protocol::Memory(port) => {
            port.checked_sub(1_000_000).map(|i| i as usize)
        }
        _ => None,
    })
}

fn scaled(seconds: f64, scale: f64) -> Duration {
    Duration::from_secs_f64((seconds / scale).max(0.0))
}

fn synthetic_advert(node: NodeId, index: usize) -> Advert {
    Advert {
        provider: node,
        region: format!("sim-{}", index % 2),
        hardware: HardwareSummary::Cpu {
            cores: 1,
            ram_bytes: 1 << 30,
        },
        models: vec![ModelOffer {
            model: ModelDescriptor {
                id: ModelId::from_bytes([7; 32]),
                name: "synthetic-0".into(),
                architecture: "synthetic".into(),
                quantization: "none".into(),
                context_length: 2048,
            },
            generation_milli_tokens_per_second: 10_000,
            prices: vec![TierPrice {
                tier: Tier::OnDemand,
                price_per_token: NanoUsd(100 + index as u64 % 50),
            }],
        }],
        tiers: vec![Tier::OnDemand],
        windows: vec![],
        load: Load::default(),
        addresses: vec![],
    }
}

fn check(args: &SimulateArgs) -> Result<()> {
    anyhow::ensure!(args.nodes >= 2, "--nodes must be at least 2");
    anyhow::ensure!(
        args.gateways < args.nodes,
        "--gateways must leave at least one provider"
    );
    for (name, value) in [
        ("--duration", args.duration),
        ("--advert-interval", args.advert_interval),
        ("--time-scale", args.time_scale),
        ("--settle-max", args.settle_max),
    ] {
        anyhow::ensure!(
            value.is_finite() && value > 0.0,
            "{name} must be a positive number"
        );
    }
    for (name, value) in [
        ("--latency-ms", args.latency_ms),
        ("--jitter-ms", args.jitter_ms),
        ("--cross-region-ms", args.cross_region_ms),
    ] {
        anyhow::ensure!(value.is_finite() && value >= 0.0, "{name} must be ≥ 0");
    }
    anyhow::ensure!((0.0..1.0).contains(&args.loss), "--loss must be in [0, 1)");
    Ok(())
}

/// (provider index, advert seq) → when it was published.
type Published = Arc<Mutex<HashMap<(usize, u64), Instant>>>;
/// Per receiving node: (provider, seq) → when it was accepted there.
type Received = Arc<Mutex<Vec<HashMap<(usize, u64), Instant>>>>;

pub async fn run(args: &SimulateArgs, progress: impl Fn(&str)) -> Result<SimReport> {
    check(args)?;
    let scale = args.time_scale;
    let providers = args.nodes - args.gateways;
    let counters: Vec<Arc<LinkCounters>> = (0..args.nodes)
        .map(|_| Arc::new(LinkCounters::default()))
        .collect();
    let node_ids: Vec<NodeId> = (0..args.nodes)
        .map(|i| Keypair::from_secret(secret_for(i)).node_id())
        .collect();
    let index_of: Arc<HashMap<NodeId, usize>> = Arc::new(
        node_ids
            .iter()
            .enumerate()
            .map(|(i, id)| (*id, i))
            .collect(),
    );
    let mut rng = StdRng::seed_from_u64(args.seed);
    progress(&format!(
        "starting {} nodes on the memory transport",
        args.nodes
    ));
    let mut handles: Vec<MeshHandle> = Vec::with_capacity(args.nodes);
    for (i, node_counters) in counters.iter().enumerate() {
        // A few random earlier nodes to join through; Kademlia and gossip do the rest.
        let bootstrap: Vec<Multiaddr> = if i == 0 {
            Vec::new()
        } else {
            (0..3.min(i))
                .map(|_| {
                    let j = rng.random_range(0..i);
                    address(j).with(libp2p::multiaddr::Protocol::P2p(
                        libp2p::identity::Keypair::ed25519_from_bytes(secret_for(j))
                            .map(|k| k.public().to_peer_id())
                            .unwrap_or_else(|_| libp2p::PeerId::random()),
                    ))
                })
                .collect()
        };
        let link = link_model(args, i);
        let config = MeshConfig {
            listen: vec![address(i)],
            bootstrap,
            kad_server: i >= args.gateways,
            target_peers: args.peers,
            // Room for the band above the target and a walk's connections; with every
            // node joining at once, connections past it are only formation's, and at
            // three times the target they set the run's peak memory (500 nodes:
            // 2.06 GB, 1.82 GB at twice).
            max_connections: (args.peers * 2) as u32,
            heartbeat: scaled(1.0, scale),
            transport: MeshTransport::Memory {
                link,
                counters: node_counters.clone(),
            },
            ..MeshConfig::default()
        };
        handles.push(
            mesh::spawn(secret_for(i), config)
                .await
                .with_context(|| format!("starting simulated node {i}"))?,
        );
    }
    let published: Published = Arc::new(Mutex::new(HashMap::new()));
    let received: Received = Arc::new(Mutex::new(vec![HashMap::new(); args.nodes]));
    let peer_connections_opened = Arc::new(AtomicU64::new(0));
    let peer_connections_closed = Arc::new(AtomicU64::new(0));
    let observer_events_lost = Arc::new(AtomicU64::new(0));
    for (i, handle) in handles.iter().enumerate() {
        let mut events = handle.subscribe();
        let opened = peer_connections_opened.clone();
        let closed = peer_connections_closed.clone();
        let lost = observer_events_lost.clone();
        let received = received.clone();
        let index_of = index_of.clone();
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(MeshEvent::PeerConnected(_)) => {
                        opened.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(MeshEvent::PeerDisconnected(_)) => {
                        closed.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(MeshEvent::AdvertAccepted { provider, seq, .. }) => {
                        if let Some(&from) = index_of.get(&provider) {
                            if let Ok(mut received) = received.lock() {
                                received[i].entry((from, seq)).or_insert_with(Instant::now);
                            }
                        }
                    }
                    Ok(_) => {}
                    // A lagging observer loses events: reported, since lost
                    // acceptances would read as undelivered adverts.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        lost.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }
    let settle_seconds = settle(
        args,
        [&peer_connections_opened, &peer_connections_closed],
        &progress,
    )
    .await;
    progress(&format!(
        "{providers} providers publish an advert every {} s (network time) for {} s",
        args.advert_interval, args.duration
    ));
    let started = Instant::now();
    let cpu_before = cpu_seconds();
    let opened_before = peer_connections_opened.load(Ordering::Relaxed);
    let run_for = scaled(args.duration, scale);
    let interval = scaled(args.advert_interval, scale);
    let mut publishers = Vec::new();
    for (i, handle) in handles.iter().enumerate().skip(args.gateways) {
        let handle = handle.clone();
        let published = published.clone();
        let phase = interval.mul_f64(rng.random::<f64>());
        let lifetime = Duration::from_secs_f64(args.advert_interval * 4.0).as_millis() as u64;
        publishers.push(tokio::spawn(async move {
            let key = Keypair::from_secret(secret_for(i));
            tokio::time::sleep(phase.min(run_for)).await;
            let mut seq = 1u64;
            while started.elapsed() < run_for {
                let advert = synthetic_advert(key.node_id(), i);
                if let Ok(envelope) =
                    key.seal(&advert, seq, sharemesh_mesh::clock::now_ms(), lifetime)
                {
                    if let Ok(mut published) = published.lock() {
                        published.insert((i, seq), Instant::now());
                    }
                    let _ = handle.publish_advert(&envelope).await;
                }
                seq += 1;
                tokio::time::sleep(interval.min(run_for.saturating_sub(started.elapsed()))).await;
            }
        }));
    }
    for publisher in publishers {
        let _ = publisher.await;
    }
    let drain_seconds = drain(args, &received).await;
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    let opened = peer_connections_opened.load(Ordering::Relaxed) - opened_before;
    let connections: usize = futures::future::join_all(handles.iter().map(|h| h.peers()))
        .await
        .into_iter()
        .map(|peers| peers.map_or(0, |p| p.len()))
        .sum();
    let report = summarise(
        args,
        providers,
        &published,
        &received,
        wall,
        Activity {
            connections,
            opened,
            cpu,
            settle_seconds,
            drain_seconds,
            observer_events_lost: observer_events_lost.load(Ordering::Relaxed),
        },
        &counters,
    );
    Ok(report)
}

/// Waits until the mesh has formed: at least 10 s of network time, then until
/// connections opened and closed slow to a trickle or `--settle-max` wall seconds pass.
/// Every node's first Kademlia walk connects to dozens of peers that the peer manager
/// prunes once their 10 s grace is over; started together, 200 nodes keep a 2-core
/// host busy with that for a minute or more, and a measurement taken during it
/// measures start-up, not the steady state. Closures count too: waiting only for new
/// connections to slow ended while nodes still held their walk's connections, and the
/// prunes and redials that followed were ~95% of the first measured churn figures.
/// Returns the wall seconds it waited.
async fn settle(args: &SimulateArgs, changes: [&AtomicU64; 2], progress: impl Fn(&str)) -> f64 {
    let started = Instant::now();
    tokio::time::sleep(scaled(10.0, args.time_scale).max(Duration::from_secs(3))).await;
    // Quiet for 15 s of network time in a row: longer than the pruning grace (10 s)
    // plus one peer-manager round (5 s), so every connection opened before the quiet
    // spell has been judged; one quiet 2 s window could fall between two rounds.
    let window = scaled(5.0, args.time_scale).max(Duration::from_secs(1));
    const QUIET_WINDOWS: u32 = 3;
    let quiet = quiet_connection_rate(args.nodes);
    let total = || {
        changes
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let mut before = total();
    let mut quiet_windows = 0;
    while started.elapsed().as_secs_f64() < args.settle_max {
        tokio::time::sleep(window).await;
        let now = total();
        let rate = (now - before) as f64 / window.as_secs_f64();
        before = now;
        quiet_windows = if rate <= quiet { quiet_windows + 1 } else { 0 };
        if quiet_windows >= QUIET_WINDOWS {
            break;
        }
        progress(&format!(
            "mesh forming: {rate:.0} connections opened or closed/s (waiting for ≤ {quiet:.0})"
        ));
    }
    started.elapsed().as_secs_f64()
}

/// After the last advert is published, waits for the ones still on their way: until
/// acceptances stop growing for a second (network time), at least 5 s and at most one
/// advert lifetime (4 advert intervals: an advert cannot be accepted after it expires,
/// so waiting longer could not change the count). Returns the network seconds waited.
/// On a saturated host adverts queue for seconds; ending the count when the last one
/// is published would score every advert of the last seconds as lost.
async fn drain(args: &SimulateArgs, received: &Received) -> f64 {
    let scale = args.time_scale;
    let started = Instant::now();
    let accepted = || {
        received
            .lock()
            .map(|r| r.iter().map(HashMap::len).sum::<usize>())
            .unwrap_or(0)
    };
    tokio::time::sleep(scaled(5.0, scale).max(Duration::from_millis(500))).await;
    let limit = scaled(args.advert_interval * 4.0, scale);
    let mut before = accepted();
    while started.elapsed() < limit {
        tokio::time::sleep(scaled(1.0, scale).max(Duration::from_millis(200))).await;
        let now = accepted();
        if now == before {
            break;
        }
        before = now;
    }
    started.elapsed().as_secs_f64() * scale
}

/// Connections opened or closed per second (summed over nodes) that count as a settled
/// mesh: one per 40 nodes, i.e. each node changing one every 40 s or so.
fn quiet_connection_rate(nodes: usize) -> f64 {
    (nodes as f64 / 40.0).max(1.0)
}

/// Delay model: base latency and jitter everywhere, more between the two regions.
fn link_model(args: &SimulateArgs, from: usize) -> LinkModel {
    let scale = args.time_scale;
    let base = args.latency_ms;
    let cross = args.cross_region_ms;
    let jitter = scaled(args.jitter_ms / 1000.0, scale);
    let loss = args.loss;
    let seed = args.seed;
    Arc::new(move |to: &Multiaddr| {
        let to = memory_index(to).unwrap_or(from);
        let one_way = base + if to % 2 != from % 2 { cross } else { 0.0 };
        LinkProfile {
            latency: scaled(one_way / 1000.0, scale),
            jitter,
            loss,
            retransmit_after: scaled(0.2, scale),
            seed: seed ^ ((from as u64) << 32) ^ to as u64,
        }
    })
}

/// What the whole process did over the measured run.
struct Activity {
    /// Connected peers summed over nodes, at the end.
    connections: usize,
    /// Peer connections opened during the run, summed over nodes.
    opened: u64,
    /// CPU seconds.
    cpu: f64,
    settle_seconds: f64,
    /// Network seconds spent waiting for adverts still on their way.
    drain_seconds: f64,
    observer_events_lost: u64,
}

fn summarise(
    args: &SimulateArgs,
    providers: usize,
    published: &Published,
    received: &Received,
    wall: f64,
    activity: Activity,
    counters: &[Arc<LinkCounters>],
) -> SimReport {
    let Activity {
        connections,
        opened,
        cpu,
        settle_seconds,
        drain_seconds,
        observer_events_lost,
    } = activity;
    let published = published.lock().map(|p| p.clone()).unwrap_or_default();
    let received = received.lock().map(|r| r.clone()).unwrap_or_default();
    let n = args.nodes;
    let to_network_ms = |d: Duration| d.as_secs_f64() * 1000.0 * args.time_scale;
    let mut deliveries = Vec::new();
    let mut all_nodes = Vec::new();
    for (&(from, seq), &at) in &published {
        let mut slowest = Duration::ZERO;
        let mut reached = 0;
        for (node, got) in received.iter().enumerate() {
            if node == from {
                continue;
            }
            if let Some(&when) = got.get(&(from, seq)) {
                let latency = when.saturating_duration_since(at);
                deliveries.push(to_network_ms(latency));
                slowest = slowest.max(latency);
                reached += 1;
            }
        }
        if reached == n - 1 {
            all_nodes.push(to_network_ms(slowest));
        }
    }
    let expected = published.len() * (n - 1);
    let accepted: usize = received.iter().map(HashMap::len).sum();
    let bytes: u64 = counters.iter().map(|c| c.sent()).sum();
    SimReport {
        nodes: n,
        settle_seconds,
        drain_seconds,
        providers,
        network_seconds: args.duration,
        wall_seconds: wall,
        adverts_published: published.len(),
        delivery_ratio: if expected == 0 {
            0.0
        } else {
            deliveries.len() as f64 / expected as f64
        },
        delivery_p50_ms: percentile(&mut deliveries, 0.50),
        delivery_p99_ms: percentile(&mut deliveries, 0.99),
        all_nodes_p50_ms: percentile(&mut all_nodes, 0.50),
        all_nodes_p99_ms: percentile(&mut all_nodes, 0.99),
        adverts_reaching_all: all_nodes.len(),
        connections_per_node: connections as f64 / n as f64,
        peer_connections_opened_per_node_per_minute: opened as f64
            / n as f64
            / (wall.max(1e-9) / 60.0),
        messages_per_node_per_second: accepted as f64 / n as f64 / wall.max(1e-9),
        bytes_per_node_per_second: bytes as f64 / n as f64 / wall.max(1e-9),
        cpu_cores: cpu / wall.max(1e-9),
        peak_rss_mb: peak_rss_mb(),
        observer_events_lost,
    }
}

fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64 - 1.0) * q).round() as usize;
    values[rank.min(values.len() - 1)]
}

/// User + system CPU seconds of this process (Linux; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of /proc/PID/stat (11 and 12 after the name).
    (ticks(11) + ticks(12)) / 100.0
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

pub fn print(report: &SimReport) {
    println!(
        "nodes {} (providers {}), {} s of network time in {:.1} s wall, after {:.0} s forming",
        report.nodes,
        report.providers,
        report.network_seconds,
        report.wall_seconds,
        report.settle_seconds
    );
    println!(
        "drained                  {:.1} s (network) for adverts on their way",
        report.drain_seconds
    );
    println!("adverts published        {}", report.adverts_published);
    println!("delivery ratio           {:.4}", report.delivery_ratio);
    println!(
        "to one node   p50/p99    {:.0} / {:.0} ms",
        report.delivery_p50_ms, report.delivery_p99_ms
    );
    println!(
        "to all nodes  p50/p99    {:.0} / {:.0} ms  ({} adverts reached all)",
        report.all_nodes_p50_ms, report.all_nodes_p99_ms, report.adverts_reaching_all
    );
    println!(
        "connections per node     {:.1}",
        report.connections_per_node
    );
    println!(
        "peer connections opened  {:.2} per node per minute",
        report.peer_connections_opened_per_node_per_minute
    );
    println!(
        "per node per second      {:.1} adverts, {:.0} bytes",
        report.messages_per_node_per_second, report.bytes_per_node_per_second
    );
    println!(
        "process                  {:.2} cores, {:.0} MB peak RSS",
        report.cpu_cores, report.peak_rss_mb
    );
    if report.observer_events_lost > 0 {
        println!(
            "observer missed          {} events: delivery is a lower bound",
            report.observer_events_lost
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_deterministic_and_distinct() {
        assert_eq!(secret_for(3), secret_for(3));
        assert_ne!(secret_for(3), secret_for(4));
    }

    #[test]
    fn memory_addresses_map_back_to_indices() {
        assert_eq!(memory_index(&address(42)), Some(42));
        assert_eq!(
            memory_index(&"/memory/5".parse().unwrap_or_else(|_| Multiaddr::empty())),
            None
        );
    }

    #[test]
    fn percentiles_and_bad_arguments() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&mut v, 0.5), 3.0);
        assert_eq!(percentile(&mut v, 0.99), 5.0);
        assert!(percentile(&mut [], 0.5).is_nan());
        let args = SimulateArgs {
            nodes: 10,
            gateways: 10,
            duration: 1.0,
            advert_interval: 1.0,
            time_scale: 1.0,
            latency_ms: 0.0,
            jitter_ms: 0.0,
            cross_region_ms: 0.0,
            loss: 0.0,
            peers: 4,
            seed: 1,
            settle_max: 10.0,
            json: false,
        };
        assert!(check(&args).unwrap_err().to_string().contains("--gateways"));
        let args = SimulateArgs {
            gateways: 1,
            loss: 1.5,
            ..args
        };
        assert!(check(&args).unwrap_err().to_string().contains("--loss"));
    }
}
