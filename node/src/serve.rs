//! What `sharemesh provide` and `sharemesh gateway` share: the mesh flags and their
//! configuration, the ledger, API keys, the ready line and the shutdown signal.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use libp2p::Multiaddr;
use sharemesh_mesh::{self as mesh, MeshConfig};
use sharemesh_protocol::NanoUsd;
use sharemesh_testnet::LinkArgs;

#[derive(Args, Debug, Clone)]
pub struct MeshArgs {
    /// Multiaddr to listen on (repeatable).
    #[arg(long = "listen")]
    pub listen: Vec<Multiaddr>,
    /// Multiaddr of a node to join through, with or without /p2p/<PeerId> (repeatable).
    #[arg(long = "bootstrap")]
    pub bootstrap: Vec<Multiaddr>,
    /// Discover peers on the LAN with mDNS (multicasts beyond loopback: off by default).
    #[arg(long)]
    pub mdns: bool,
    /// Connected peers to aim for.
    #[arg(long, default_value_t = 25)]
    pub target_peers: usize,
    /// Local HTTP API address.
    #[arg(long)]
    pub http: Option<SocketAddr>,
    #[command(flatten)]
    pub link: LinkArgs,
    #[command(flatten)]
    pub nat: crate::nat_args::NatArgs,
}

pub fn usd(value: Option<f64>, flag: &str) -> Result<Option<NanoUsd>> {
    value
        .map(|v| {
            if v.is_finite() && v >= 0.0 {
                Ok(NanoUsd((v * 1e9).round() as u64))
            } else {
                anyhow::bail!("{flag} must be a non-negative number of USD")
            }
        })
        .transpose()
}

/// API keys are required off loopback (and on it when asked); refuses to start without any.
pub fn key_check(
    data_dir: &Path,
    address: SocketAddr,
    require: bool,
) -> Result<sharemesh_gateway::keys::KeyCheck> {
    if !require && address.ip().is_loopback() {
        return Ok(sharemesh_gateway::keys::KeyCheck::default());
    }
    let keys = sharemesh_gateway::keys::KeyCheck::open(data_dir)?;
    if keys.active().is_empty() {
        anyhow::bail!("the API on {address} needs API keys, but none exist: create one with `sharemesh keys create`");
    }
    Ok(keys)
}

/// Opens the node's ledger (`<data-dir>/ledger`).
pub fn open_ledger(data_dir: &Path) -> Result<std::sync::Arc<sharemesh_ledger::Ledger>> {
    Ok(std::sync::Arc::new(sharemesh_ledger::Ledger::open(
        &data_dir.join("ledger"),
    )?))
}

pub fn default_listen() -> Vec<Multiaddr> {
    ["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"]
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect()
}

pub fn mesh_config(data_dir: &Path, args: &MeshArgs, kad_server: bool) -> Result<MeshConfig> {
    let link = mesh::link::LinkProfile {
        latency: Duration::from_millis(args.link.link_latency_ms),
        jitter: Duration::from_millis(args.link.link_jitter_ms),
        loss: args.link.link_loss,
        retransmit_after: Duration::from_millis(200),
        seed: args.link.link_seed,
    };
    if !(0.0..1.0).contains(&args.link.link_loss) {
        bail!("--link-loss must be in [0, 1), got {}", args.link.link_loss);
    }
    if args.link.link_jitter_ms > args.link.link_latency_ms {
        bail!(
            "--link-jitter-ms ({}) cannot exceed --link-latency-ms ({})",
            args.link.link_jitter_ms,
            args.link.link_latency_ms
        );
    }
    let emulated = !link.is_ideal();
    let mut listen = if args.listen.is_empty() {
        default_listen()
    } else {
        args.listen.clone()
    };
    let transport = if emulated {
        let quic = |a: &Multiaddr| {
            a.iter()
                .any(|p| matches!(p, libp2p::multiaddr::Protocol::QuicV1))
        };
        if !args.listen.is_empty() && args.listen.iter().any(quic) {
            bail!("--link-* emulation wraps TCP streams only; drop the QUIC --listen address");
        }
        listen.retain(|a| !quic(a));
        mesh::MeshTransport::EmulatedTcp {
            link: Arc::new(move |_: &Multiaddr| link),
            counters: Arc::default(),
        }
    } else {
        mesh::MeshTransport::Network
    };
    Ok(MeshConfig {
        listen,
        bootstrap: args.bootstrap.clone(),
        kad_server,
        mdns: args.mdns,
        target_peers: args.target_peers,
        address_book: Some(data_dir.join("address_book.json")),
        transport,
        metrics: Some(mesh::metrics::registry()),
        // A real node's mesh must not wait behind inference or HTTP work (SPEC §8).
        runtime: mesh::MeshRuntime::Dedicated,
        nat: args.nat.config()?,
        ..MeshConfig::default()
    })
}

/// Prints one JSON line on stdout once the node is up (the testnet reads it).
pub async fn announce(mesh: &mesh::MeshHandle, role: &str, http: Option<SocketAddr>) {
    for _ in 0..50 {
        if !mesh.listen_addrs().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready = serde_json::json!({
        "event": "ready",
        "role": role,
        "peer_id": mesh.peer_id.to_string(),
        "listen": mesh.listen_addrs().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "http": http.map(|a| a.to_string()),
    });
    println!("{ready}");
}

pub async fn wait_for_shutdown() {
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!("shutting down");
}
