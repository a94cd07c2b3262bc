//! The mesh: one task owns the libp2p swarm; everyone else holds a cloneable
//! [`MeshHandle`] that sends typed commands (with oneshot replies) and reads the shared
//! order book. Token streams run outside the loop through libp2p-stream's `Control`.

pub mod behaviour;
mod book;
mod candidates;
pub mod clock;
mod event_loop;
pub mod framing;
pub mod link;
pub mod metrics;
pub mod orderbook;
mod paths;
mod peer_targets;
pub mod reachability;
mod relay_set;
mod swarm;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, Result};
use libp2p::gossipsub;
use libp2p::kad;
use libp2p::multiaddr::Protocol;
use libp2p::{identity, Multiaddr, PeerId};
use serde::Serialize;
use sharemesh_protocol::{ModelId, NodeId, SignedEnvelope};
use tokio::sync::{broadcast, mpsc, oneshot};

pub use behaviour::{INFER_PROTOCOL, MODEL_HEADER_PROTOCOL, QUOTE_PROTOCOL, SETTLE_PROTOCOL};
pub use book::AddressBook;
/// Why a stream did not open (the peer may not speak the protocol).
pub use libp2p_stream::OpenStreamError;
use orderbook::OrderBook;
pub(crate) use paths::{HeldPaths, Punching};
pub use paths::{PathHold, PUNCH_GRACE};
use swarm::build_swarm;
pub use swarm::TCP_DIAL_TIMEOUT;

/// How long [`MeshHandle::dial_advertised`] waits for a new connection.
pub const DIAL_WAIT: Duration = Duration::from_secs(1);

/// How a node joins the mesh.
#[derive(Clone, Debug)]
pub struct MeshConfig {
    pub listen: Vec<Multiaddr>,
    pub bootstrap: Vec<Multiaddr>,
    /// Answer Kademlia queries (providers); light clients only ask.
    pub kad_server: bool,
    pub mdns: bool,
    /// Connected peers the peer manager aims for; excess is pruned.
    pub target_peers: usize,
    pub max_connections: u32,
    pub heartbeat: Duration,
    /// Where the address book is persisted (`None`: not persisted).
    pub address_book: Option<PathBuf>,
    pub transport: MeshTransport,
    /// The order book's bounds and per-signer advert rate.
    pub book: orderbook::BookLimits,
    /// Where the mesh registers its metrics (`None`: none kept).
    pub metrics: Option<metrics::SharedRegistry>,
    /// Where the event loop and the swarm's connection tasks run.
    pub runtime: MeshRuntime,
    /// AutoNAT, relays and hole punching (off by default: simulations).
    pub nat: reachability::NatConfig,
}

/// Where a node's mesh runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MeshRuntime {
    /// On the caller's tokio runtime: in-process labs and simulations of many nodes,
    /// where every node shares the same few threads anyway.
    #[default]
    Shared,
    /// On a thread of its own with a single-threaded runtime: a provider's inference and
    /// a gateway's request handling can take every worker of the main runtime, and a
    /// mesh queued behind them answers pings, handshakes and gossip late. On its own
    /// thread the OS scheduler gives it its turn (it sleeps almost always, so it is
    /// woken ahead of busy threads).
    Dedicated,
}

/// What carries the mesh's connections.
#[derive(Clone, Default)]
pub enum MeshTransport {
    /// TCP and QUIC.
    #[default]
    Network,
    /// libp2p's in-process memory transport (`/memory/N` addresses), every dialled
    /// connection through an emulated link; for simulations of many nodes in one process.
    Memory {
        link: link::LinkModel,
        counters: Arc<link::LinkCounters>,
    },
    /// TCP only (no QUIC: its datagrams cannot go through the stream wrapper), every
    /// dialled connection through an emulated link: latency, jitter and loss between
    /// processes of a testnet, where the kernel has no `tc netem`.
    EmulatedTcp {
        link: link::LinkModel,
        counters: Arc<link::LinkCounters>,
    },
}

impl std::fmt::Debug for MeshTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MeshTransport::Network => f.write_str("Network"),
            MeshTransport::Memory { .. } => f.write_str("Memory"),
            MeshTransport::EmulatedTcp { .. } => f.write_str("EmulatedTcp"),
        }
    }
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            listen: Vec::new(),
            bootstrap: Vec::new(),
            kad_server: false,
            mdns: false,
            target_peers: 25,
            max_connections: 64,
            heartbeat: Duration::from_secs(1),
            address_book: None,
            transport: MeshTransport::Network,
            book: orderbook::BookLimits::default(),
            metrics: None,
            runtime: MeshRuntime::Shared,
            nat: reachability::NatConfig::OFF,
        }
    }
}

/// Something the mesh observed, for tests, metrics and the testnet.
#[derive(Clone, Debug)]
pub enum MeshEvent {
    Listening(Multiaddr),
    /// What adverts should carry changed: a relay reservation came or went, or
    /// reachability changed (`MeshHandle::advertised_addrs`).
    AddressesChanged,
    PeerConnected(PeerId),
    PeerDisconnected(PeerId),
    AdvertAccepted {
        provider: NodeId,
        seq: u64,
        from: PeerId,
    },
    /// An advert the book did not take. `violation`: forwarded to gossipsub as
    /// `Reject` (no honest node sends it), otherwise `Ignore`. `signed_fault`: the
    /// signer whose own signature covers an invalid body, for the trust layer.
    AdvertRejected {
        from: PeerId,
        reason: String,
        violation: bool,
        signed_fault: Option<NodeId>,
    },
    /// A fraud proof whose signatures and commitment chain check (the mesh cannot
    /// replay it: that is the trust layer's, with a model). Forwarded on.
    FraudProof {
        envelope: Box<SignedEnvelope>,
        accused: NodeId,
        from: PeerId,
    },
    /// A hardware attestation that opened and is newer than the node's last.
    Attestation {
        attestation: Box<sharemesh_protocol::Attestation>,
        from: PeerId,
    },
    /// A reputation report that opened and is newer than the reporter's last.
    ReputationReport {
        report: Box<sharemesh_protocol::ReputationReport>,
        from: PeerId,
    },
}

#[derive(Clone, Debug, Serialize)]
pub struct PeerInfo {
    pub peer_id: String,
    /// The remote address of every open connection to the peer, in the order a new job
    /// stream picks them: direct first, then the oldest (the first carries the next).
    pub addresses: Vec<String>,
    /// Every open connection goes through a relay (none is direct yet).
    pub relayed: bool,
    pub rtt_ms: Option<f64>,
    pub agent: Option<String>,
    pub gossip_score: Option<f64>,
}

pub(crate) enum Command {
    Publish {
        topic: gossipsub::IdentTopic,
        data: Vec<u8>,
        reply: oneshot::Sender<Result<()>>,
    },
    Dial(Multiaddr),
    Peers(oneshot::Sender<Vec<PeerInfo>>),
    Provide(ModelId),
    FindProviders {
        model: ModelId,
        reply: oneshot::Sender<Vec<PeerId>>,
    },
    Disconnect(PeerId),
    /// Block (`true`) or unblock peers.
    Block(Vec<PeerId>, bool),
    /// The trust layer's standing of peers: gossipsub's application-specific score.
    ApplicationScores(Vec<(PeerId, f64)>),
    /// Stop the event loop now: every connection drops at once, as when the process
    /// dies (in-process labs use it to play `kill -9`).
    Shutdown,
    /// The last held stream to a peer ended: relayed connections a hole punch made
    /// redundant may close now.
    PathReleased(PeerId),
}

/// Whether others can reach this node, and how (`GET /v1/network/reachability`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct NatView {
    pub status: reachability::NatStatus,
    /// Direct addresses peers dialled back (AutoNAT).
    pub external_addresses: Vec<String>,
    /// Relays holding a reservation for us, `/…/p2p/<relay>`.
    pub relays: Vec<String>,
    /// Relays through which a peer could not dial us (AutoNAT), peer ids: asked last.
    pub distrusted_relays: Vec<String>,
    /// Whether we relay for others now.
    pub relay_server: bool,
    /// Reservations others hold on us.
    pub relayed_clients: usize,
    /// Relayed connections upgraded to direct ones by hole punching, and attempts that
    /// failed, since start.
    pub hole_punches: u64,
    pub hole_punch_failures: u64,
}

/// What the mesh knows of a connected peer without a round trip to its event loop.
#[derive(Clone, Debug)]
pub(crate) struct LivePeer {
    /// Last measured ping round trip (`None` until one is).
    pub rtt: Option<Duration>,
    /// The address of its first connection (a relayed one names our relayed listen
    /// address, which holds the relay's): where its traffic comes from.
    pub address: Multiaddr,
}

/// Connected peers.
pub(crate) type LivePeers = Arc<RwLock<HashMap<PeerId, LivePeer>>>;

/// Cloneable access to the mesh.
#[derive(Clone)]
pub struct MeshHandle {
    commands: mpsc::Sender<Command>,
    pub book: Arc<RwLock<OrderBook>>,
    pub peer_id: PeerId,
    pub node_id: NodeId,
    listen_addrs: Arc<RwLock<Vec<Multiaddr>>>,
    nat: Arc<RwLock<NatView>>,
    punching: Punching,
    held: HeldPaths,
    live: LivePeers,
    events: broadcast::Sender<MeshEvent>,
    pub control: libp2p_stream::Control,
    /// The process's metrics registry, if it keeps metrics (the gateway and the
    /// provider register theirs here too).
    pub metrics: Option<metrics::SharedRegistry>,
}

impl MeshHandle {
    async fn send(&self, command: Command) -> Result<()> {
        self.commands
            .send(command)
            .await
            .map_err(|_| anyhow::anyhow!("the mesh has stopped"))
    }

    async fn publish(
        &self,
        topic: libp2p::gossipsub::IdentTopic,
        envelope: &SignedEnvelope,
    ) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        let data = envelope.to_bytes()?;
        self.send(Command::Publish { topic, data, reply }).await?;
        answer.await.context("the mesh has stopped")?
    }

    pub async fn publish_advert(&self, envelope: &SignedEnvelope) -> Result<()> {
        self.publish(behaviour::adverts_topic(), envelope).await
    }

    /// Gossips this node's signed hardware attestation.
    pub async fn publish_attestation(&self, envelope: &SignedEnvelope) -> Result<()> {
        self.publish(behaviour::attestations_topic(), envelope)
            .await
    }

    /// Gossips this node's signed reputation report.
    pub async fn publish_reputation(&self, envelope: &SignedEnvelope) -> Result<()> {
        self.publish(behaviour::reputation_topic(), envelope).await
    }

    /// Sets gossipsub's application-specific score of peers (the trust layer's view:
    /// a convicted provider far below the graylist threshold).
    pub async fn set_application_scores(&self, scores: Vec<(PeerId, f64)>) -> Result<()> {
        self.send(Command::ApplicationScores(scores)).await
    }

    /// Gossips a signed fraud proof to the whole mesh.
    pub async fn publish_fraud_proof(&self, envelope: &SignedEnvelope) -> Result<()> {
        self.publish(behaviour::fraud_proofs_topic(), envelope)
            .await
    }

    pub async fn dial(&self, address: Multiaddr) -> Result<()> {
        self.send(Command::Dial(address)).await
    }

    pub async fn disconnect(&self, peer: PeerId) -> Result<()> {
        self.send(Command::Disconnect(peer)).await
    }

    /// Resolves once this node's mesh has stopped (shut down, or its event loop ended):
    /// streams already accepted say nothing of it, so a task serving a protocol waits
    /// on this beside its incoming streams to end with the mesh.
    pub async fn closed(&self) {
        self.commands.closed().await;
    }

    /// Stops this node's mesh at once, every connection with it (see `Command::Shutdown`).
    pub async fn shutdown(&self) -> Result<()> {
        self.send(Command::Shutdown).await
    }

    /// Refuses every connection with `peers` (closing open ones) until unblocked.
    pub async fn block(&self, peers: Vec<PeerId>) -> Result<()> {
        self.send(Command::Block(peers, true)).await
    }

    pub async fn unblock(&self, peers: Vec<PeerId>) -> Result<()> {
        self.send(Command::Block(peers, false)).await
    }

    /// Dials `peer` at the addresses it advertised, unless already connected (a
    /// provider's advert may reach us before any connection to it), and waits up to
    /// [`DIAL_WAIT`] per try for the connection, so a stream opened next does not race
    /// the dial (it would fail, and the provider would lose its turn for nothing).
    /// Direct addresses are dialled together; relayed ones one at a time, each only if
    /// nothing connected yet (every relayed dial takes a circuit on a relay, which
    /// relays bound), at most [`reachability::MAX_RELAYED_TRIES`] of them. An advert that
    /// lists a relayed address first says its node is unreachable directly: its relays
    /// are tried first.
    pub async fn dial_advertised(&self, peer: &PeerId, addresses: &[String]) {
        if self.is_connected(peer) {
            return;
        }
        let tries = reachability::dial_tries(addresses);
        for addresses in tries {
            for address in addresses {
                let _ = self.dial(address).await;
            }
            let deadline = tokio::time::Instant::now() + DIAL_WAIT;
            while !self.is_connected(peer) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if self.is_connected(peer) {
                return;
            }
        }
    }

    /// Waits, up to [`PUNCH_GRACE`] from when the relayed connection to `peer` opened,
    /// for its hole punch to end (direct or failed): a long stream opened now then runs
    /// on the connection that stays. Returns at once when nothing is being punched.
    pub async fn settle_path(&self, peer: &PeerId) {
        loop {
            let since = self.punching.read().ok().and_then(|p| p.get(peer).copied());
            match since {
                Some(since) if since.elapsed() < PUNCH_GRACE => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                _ => return,
            }
        }
    }

    /// Marks a long stream to `peer` (a job) as running: until the hold drops, a direct
    /// connection from hole punching leaves the relayed one open, so a stream that
    /// started on it runs to its end (new streams open on the direct one: the vendored
    /// libp2p-stream prefers direct connections).
    pub fn hold_path(&self, peer: PeerId) -> PathHold {
        if let Ok(mut held) = self.held.lock() {
            *held.entry(peer).or_insert(0) += 1;
        }
        PathHold {
            peer,
            held: self.held.clone(),
            commands: self.commands.clone(),
        }
    }

    /// Whether `peer` is connected now (no round trip to the event loop).
    pub fn is_connected(&self, peer: &PeerId) -> bool {
        self.live
            .read()
            .map(|live| live.contains_key(peer))
            .unwrap_or(false)
    }

    /// The address `peer` is connected from, if it is connected (no round trip to the
    /// event loop): a provider counts unpaid work per network origin with it.
    pub fn remote_address(&self, peer: &PeerId) -> Option<Multiaddr> {
        self.live
            .read()
            .ok()
            .and_then(|live| Some(live.get(peer)?.address.clone()))
    }

    /// Last ping round trip of every connected peer that has one, in ms.
    pub fn round_trips_ms(&self) -> HashMap<PeerId, f64> {
        self.live
            .read()
            .map(|live| {
                live.iter()
                    .filter_map(|(peer, live)| Some((*peer, live.rtt?.as_secs_f64() * 1000.0)))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub async fn peers(&self) -> Result<Vec<PeerInfo>> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Peers(reply)).await?;
        answer.await.context("the mesh has stopped")
    }

    pub async fn provide(&self, model: ModelId) -> Result<()> {
        self.send(Command::Provide(model)).await
    }

    /// Providers of `model` found through Kademlia provider records.
    pub async fn find_providers(&self, model: ModelId) -> Result<Vec<PeerId>> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::FindProviders { model, reply }).await?;
        answer.await.context("the mesh has stopped")
    }

    /// Addresses we listen on, with our `/p2p/` suffix.
    pub fn listen_addrs(&self) -> Vec<Multiaddr> {
        self.listen_addrs
            .read()
            .map(|addrs| {
                addrs
                    .iter()
                    .map(|a| with_peer(a.clone(), self.peer_id))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The addresses an advert should carry, with our `/p2p/` suffix: relayed ones first
    /// while we are unreachable, at most [`sharemesh_protocol::MAX_ADDRESSES`].
    pub fn advertised_addrs(&self) -> Vec<Multiaddr> {
        let nat = self.nat_view();
        let listening = self
            .listen_addrs
            .read()
            .map(|addrs| addrs.clone())
            .unwrap_or_default();
        let confirmed: Vec<Multiaddr> = nat
            .external_addresses
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect();
        reachability::advertised(
            nat.status,
            &listening,
            &confirmed,
            sharemesh_protocol::MAX_ADDRESSES,
        )
        .into_iter()
        .map(|a| with_peer(a, self.peer_id))
        .collect()
    }

    /// Reachability as the event loop last saw it.
    pub fn nat_view(&self) -> NatView {
        self.nat.read().map(|v| v.clone()).unwrap_or_default()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<MeshEvent> {
        self.events.subscribe()
    }
}

/// `address` ending in `/p2p/<peer>` (a relayed listen address already does).
fn with_peer(address: Multiaddr, peer: PeerId) -> Multiaddr {
    match address.iter().last() {
        Some(Protocol::P2p(_)) => address,
        _ => address.with(Protocol::P2p(peer)),
    }
}

/// Splits `/…/p2p/<id>` into the peer id and the address without it.
pub fn split_peer(address: &Multiaddr) -> (Option<PeerId>, Multiaddr) {
    let mut base = address.clone();
    match base.pop() {
        Some(Protocol::P2p(peer)) => (Some(peer), base),
        Some(other) => {
            base.push(other);
            (None, base)
        }
        None => (None, base),
    }
}

/// Starts the mesh where `config.runtime` says. `secret` is the node's ed25519 secret.
pub async fn spawn(secret: [u8; 32], config: MeshConfig) -> Result<MeshHandle> {
    match config.runtime {
        MeshRuntime::Shared => {
            let (handle, event_loop) = start(secret, &config)?;
            tokio::spawn(event_loop.run());
            Ok(handle)
        }
        MeshRuntime::Dedicated => spawn_dedicated(secret, config).await,
    }
}

/// Builds the swarm and its event loop on a thread of its own (see
/// [`MeshRuntime::Dedicated`]): the swarm spawns its connection tasks on the runtime it
/// is built in, so everything of the mesh runs there. The thread ends when the event
/// loop does (every handle dropped, or [`MeshHandle::shutdown`]).
async fn spawn_dedicated(secret: [u8; 32], config: MeshConfig) -> Result<MeshHandle> {
    let (ready, started) = oneshot::channel();
    std::thread::Builder::new()
        .name("sharemesh-mesh".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = ready.send(Err(anyhow::Error::new(err).context("the mesh's runtime")));
                    return;
                }
            };
            runtime.block_on(async move {
                match start(secret, &config) {
                    Ok((handle, event_loop)) => {
                        if ready.send(Ok(handle)).is_ok() {
                            event_loop.run().await;
                        }
                    }
                    Err(err) => {
                        let _ = ready.send(Err(err));
                    }
                }
            });
        })
        .context("starting the mesh's thread")?;
    started
        .await
        .context("the mesh's thread stopped while starting")?
}

/// The swarm, subscribed and listening, with the handle to it and the loop that will
/// own it. Must run inside the tokio runtime the mesh is to live on.
fn start(secret: [u8; 32], config: &MeshConfig) -> Result<(MeshHandle, event_loop::EventLoop)> {
    let key = identity::Keypair::ed25519_from_bytes(secret).context("identity key")?;
    let peer_id = key.public().to_peer_id();
    let node_id = sharemesh_protocol::Keypair::from_secret(secret).node_id();
    let mut swarm = build_swarm(key, config)?;
    let behaviour = swarm.behaviour_mut();
    for topic in [
        behaviour::adverts_topic(),
        behaviour::attestations_topic(),
        behaviour::reputation_topic(),
        behaviour::fraud_proofs_topic(),
    ] {
        behaviour
            .gossipsub
            .subscribe(&topic)
            .map_err(|e| anyhow::anyhow!("subscribing to {topic}: {e}"))?;
    }
    // On loopback no external address is ever confirmed; providers answer anyway.
    behaviour.kad.set_mode(Some(if config.kad_server {
        kad::Mode::Server
    } else {
        kad::Mode::Client
    }));
    let control = behaviour.stream.new_control();
    for address in &config.listen {
        swarm
            .listen_on(address.clone())
            .with_context(|| format!("listening on {address}"))?;
    }
    let address_book = match &config.address_book {
        Some(path) => AddressBook::load(path.clone()),
        None => AddressBook::in_memory(),
    };
    let mut dial_first: Vec<Multiaddr> = config.bootstrap.clone();
    dial_first.extend(address_book.addresses());
    for address in &dial_first {
        let (peer, base) = split_peer(address);
        if peer == Some(peer_id) {
            continue;
        }
        if let Some(peer) = peer {
            swarm.behaviour_mut().kad.add_address(&peer, base);
        }
        if let Err(err) = swarm.dial(address.clone()) {
            tracing::warn!(%address, %err, "could not dial bootstrap address");
        }
    }
    let (commands, inbox) = mpsc::channel(256);
    let (events, _) = broadcast::channel(1024);
    let handle = MeshHandle {
        commands,
        book: Arc::new(RwLock::new(OrderBook::new(config.book))),
        peer_id,
        node_id,
        listen_addrs: Arc::new(RwLock::new(Vec::new())),
        nat: Arc::default(),
        punching: Punching::default(),
        held: HeldPaths::default(),
        live: LivePeers::default(),
        events: events.clone(),
        control,
        metrics: config.metrics.clone(),
    };
    let event_loop = event_loop::EventLoop::new(
        swarm,
        inbox,
        events,
        event_loop::SharedViews {
            book: handle.book.clone(),
            listen_addrs: handle.listen_addrs.clone(),
            nat: handle.nat.clone(),
            punching: handle.punching.clone(),
            held: handle.held.clone(),
            live: handle.live.clone(),
        },
        address_book,
        event_loop::PeerPolicy {
            target_peers: config.target_peers,
            nat: config.nat.clone(),
            kad_server: config.kad_server,
        },
        config
            .metrics
            .as_ref()
            .and_then(metrics::MeshMetrics::register),
    );
    Ok((handle, event_loop))
}
