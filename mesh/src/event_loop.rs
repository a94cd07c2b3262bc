//! The task that owns the swarm.

mod gossip;
mod nat;
mod peers;
mod relays;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::core::ConnectedPoint;
use libp2p::gossipsub;
use libp2p::kad::{self, RecordKey};
use libp2p::multiaddr::Protocol;
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::swarm::{ConnectionId, SwarmEvent};
use libp2p::{identify, ping, Multiaddr, PeerId, Swarm};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::behaviour::{Behaviour, BehaviourEvent};
use super::orderbook::OrderBook;
use super::peer_targets::{ConnectionAge, PeerTargets, PendingDials};
use super::reachability::NatConfig;
use super::{AddressBook, Command, MeshEvent, PeerInfo};
use nat::NatState;
use sharemesh_protocol::ReplayGuard;

/// How many peers to keep, and how to stay reachable.
pub(super) struct PeerPolicy {
    pub target_peers: usize,
    pub nat: NatConfig,
    /// Whether this node answers Kademlia queries whatever its reachability (providers);
    /// a light client does while it relays (see `apply_reachability`).
    pub kad_server: bool,
}

/// State the event loop keeps current for the handle to read without a command.
pub(super) struct SharedViews {
    pub book: Arc<RwLock<OrderBook>>,
    pub listen_addrs: Arc<RwLock<Vec<Multiaddr>>>,
    pub nat: Arc<RwLock<super::NatView>>,
    pub punching: super::Punching,
    pub held: super::HeldPaths,
    pub live: super::LivePeers,
}

/// How often the peer manager runs (and the loop measures its own lateness).
const MAINTENANCE_EVERY: Duration = Duration::from_secs(5);

pub(super) struct EventLoop {
    swarm: Swarm<Behaviour>,
    inbox: mpsc::Receiver<Command>,
    events: broadcast::Sender<MeshEvent>,
    book: Arc<RwLock<OrderBook>>,
    listen_addrs: Arc<RwLock<Vec<Multiaddr>>>,
    /// Connected peers and their last ping round trip, readable without a command.
    live: super::LivePeers,
    address_book: AddressBook,
    peer_targets: PeerTargets,
    dialing: PendingDials,
    /// When (and in which peer-manager round) each connected peer's first current
    /// connection opened.
    connected_since: HashMap<PeerId, ConnectionAge>,
    /// Peer-manager rounds run so far.
    round: u64,
    /// When the last Kademlia random walk started.
    last_walk: Option<Instant>,
    last_bootstrap: Instant,
    rtt: HashMap<PeerId, Duration>,
    agents: HashMap<PeerId, String>,
    /// The remote address of every open connection, per peer.
    /// (whether we dialled it).
    connections: HashMap<PeerId, HashMap<ConnectionId, (Multiaddr, bool)>>,
    nat: NatState,
    pending_providers: HashMap<kad::QueryId, (Vec<PeerId>, oneshot::Sender<Vec<PeerId>>)>,
    /// Sequence numbers of reputation reports and attestations, per signer and kind.
    reports: ReplayGuard,
    metrics: Option<crate::metrics::MeshMetrics>,
}

impl EventLoop {
    pub(super) fn new(
        swarm: Swarm<Behaviour>,
        inbox: mpsc::Receiver<Command>,
        events: broadcast::Sender<MeshEvent>,
        views: SharedViews,
        address_book: AddressBook,
        peers: PeerPolicy,
        metrics: Option<crate::metrics::MeshMetrics>,
    ) -> Self {
        let PeerPolicy {
            target_peers,
            nat,
            kad_server,
        } = peers;
        let SharedViews {
            book,
            listen_addrs,
            nat: nat_view,
            punching,
            held,
            live,
        } = views;
        Self {
            swarm,
            inbox,
            events,
            book,
            listen_addrs,
            live,
            address_book,
            peer_targets: PeerTargets::new(target_peers),
            dialing: PendingDials::default(),
            connected_since: HashMap::new(),
            round: 0,
            last_walk: None,
            last_bootstrap: Instant::now(),
            rtt: HashMap::new(),
            agents: HashMap::new(),
            connections: HashMap::new(),
            nat: NatState::new(nat, nat_view, punching, held, kad_server),
            pending_providers: HashMap::new(),
            reports: ReplayGuard::new(4096),
            metrics,
        }
    }

    /// Runs until shut down, inside a span that names this node (every line the mesh
    /// logs carries its peer id: a simulation runs hundreds in one process).
    pub(super) async fn run(self) {
        use tracing::Instrument as _;
        let span = tracing::info_span!("mesh", node = %self.swarm.local_peer_id());
        self.run_loop().instrument(span).await
    }

    async fn run_loop(mut self) {
        // A mode the operator set applies at once (relay server, reservations).
        self.apply_reachability();
        self.propose_external();
        let mut maintenance = tokio::time::interval(MAINTENANCE_EVERY);
        // A starved loop runs one late round, not a burst of catch-up rounds.
        maintenance.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                command = self.inbox.recv() => match command {
                    Some(Command::Shutdown) => {
                        tracing::info!("mesh shut down on request");
                        return; // Dropping the swarm closes every connection at once.
                    }
                    Some(command) => self.on_command(command),
                    // Every handle dropped: the node is shutting down.
                    None => return,
                },
                scheduled = maintenance.tick() => {
                    let late = self.note_lateness(scheduled.into_std());
                    self.maintain(late);
                }
            }
        }
    }

    /// How late the maintenance tick ran: the loop's own lateness (a starved process),
    /// which says nothing about any peer.
    fn note_lateness(&self, scheduled: Instant) -> Duration {
        let late = Instant::now().saturating_duration_since(scheduled);
        if let Some(metrics) = &self.metrics {
            metrics.loop_lateness.observe(late.as_secs_f64());
        }
        if late >= Duration::from_secs(1) {
            tracing::debug!(
                late_ms = late.as_millis() as u64,
                "the mesh's event loop ran late"
            );
        }
        late
    }

    fn emit(&self, event: MeshEvent) {
        // Nobody listening is fine.
        let _ = self.events.send(event);
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Shutdown => {} // Handled by the loop itself.
            Command::PathReleased(peer) => self.path_released(peer),
            Command::Publish { topic, data, reply } => {
                let result = match self.swarm.behaviour_mut().gossipsub.publish(topic, data) {
                    Ok(_) => Ok(()),
                    // Alone on the network is not an error: the next publish reaches peers.
                    Err(gossipsub::PublishError::NoPeersSubscribedToTopic) => Ok(()),
                    Err(err) => Err(anyhow::anyhow!("publish failed: {err}")),
                };
                let _ = reply.send(result);
            }
            Command::ApplicationScores(scores) => {
                let gossipsub = &mut self.swarm.behaviour_mut().gossipsub;
                for (peer, score) in scores {
                    gossipsub.set_application_score(&peer, score);
                }
            }
            Command::Dial(address) => {
                if let Err(err) = self.swarm.dial(address.clone()) {
                    tracing::warn!(%address, %err, "dial failed");
                }
            }
            Command::Disconnect(peer) => {
                let _ = self.swarm.disconnect_peer_id(peer);
            }
            Command::Block(peers, block) => {
                let blocked = &mut self.swarm.behaviour_mut().blocked;
                for peer in peers {
                    tracing::info!(%peer, block, "peer block list changed");
                    if block {
                        blocked.block_peer(peer);
                    } else {
                        blocked.unblock_peer(peer);
                    }
                }
            }
            Command::Peers(reply) => {
                let behaviour = self.swarm.behaviour();
                let peers = self
                    .swarm
                    .connected_peers()
                    .map(|peer| PeerInfo {
                        peer_id: peer.to_string(),
                        addresses: self.addresses_in_stream_order(peer),
                        relayed: self.connections.get(peer).is_some_and(|c| {
                            c.values().all(|(a, _)| super::reachability::is_relayed(a))
                        }),
                        rtt_ms: self.rtt.get(peer).map(|d| d.as_secs_f64() * 1000.0),
                        agent: self.agents.get(peer).cloned(),
                        gossip_score: behaviour.gossipsub.peer_score(peer),
                    })
                    .collect();
                let _ = reply.send(peers);
            }
            Command::Provide(model) => {
                let key = RecordKey::new(model.as_bytes());
                if let Err(err) = self.swarm.behaviour_mut().kad.start_providing(key) {
                    tracing::warn!(%model, %err, "could not announce the provider record");
                }
            }
            Command::FindProviders { model, reply } => {
                let query = self
                    .swarm
                    .behaviour_mut()
                    .kad
                    .get_providers(RecordKey::new(model.as_bytes()));
                self.pending_providers.insert(query, (Vec::new(), reply));
            }
        }
    }

    // Nested conditions read better than match guards for these events.
    #[allow(clippy::collapsible_match)]
    fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        self.record(&event);
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::info!(%address, "listening");
                if let Ok(mut addrs) = self.listen_addrs.write() {
                    addrs.push(address.clone());
                }
                self.on_new_listen_addr(&address);
                self.emit(MeshEvent::Listening(address));
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => self.forget_listen_addr(&address),
            SwarmEvent::ListenerClosed {
                listener_id,
                addresses,
                reason,
            } => {
                tracing::debug!(?listener_id, ?addresses, ?reason, "listener closed");
                for address in &addresses {
                    self.forget_listen_addr(address);
                }
                self.on_listener_closed(listener_id);
            }
            SwarmEvent::ExternalAddrConfirmed { address } => self.on_external(&address, true),
            SwarmEvent::ExternalAddrExpired { address } => self.on_external(&address, false),
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                endpoint,
                num_established,
                ..
            } => {
                self.dialing.finish(&peer_id);
                // An inbound relayed connection names its remote `/p2p/<peer>` only: what
                // shows the path (and that it is relayed) is our relayed listen address.
                let address = match &endpoint {
                    ConnectedPoint::Listener { local_addr, .. }
                        if super::reachability::is_relayed(local_addr) =>
                    {
                        local_addr.clone()
                    }
                    _ => endpoint.get_remote_address().clone(),
                };
                if endpoint.is_dialer() {
                    self.address_book
                        .remember(&address.clone().with_p2p(peer_id).unwrap_or(address.clone()));
                    self.learn_address(peer_id, address.clone());
                }
                self.connections
                    .entry(peer_id)
                    .or_default()
                    .insert(connection_id, (address.clone(), endpoint.is_dialer()));
                if let ConnectedPoint::Listener { local_addr, .. } = &endpoint {
                    if !super::reachability::is_relayed(local_addr) {
                        self.nat.inbound.insert(connection_id, local_addr.clone());
                    }
                }
                self.prefer_direct(peer_id, &address);
                if num_established.get() == 1 {
                    let age = ConnectionAge {
                        opened: Instant::now(),
                        round: self.round,
                    };
                    self.connected_since.insert(peer_id, age);
                    if let Ok(mut live) = self.live.write() {
                        let rtt = None;
                        live.insert(
                            peer_id,
                            super::LivePeer {
                                rtt,
                                address: address.clone(),
                            },
                        );
                    }
                    tracing::debug!(peer = %peer_id, "connected");
                    self.emit(MeshEvent::PeerConnected(peer_id));
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                cause,
                endpoint,
                ..
            } => {
                tracing::debug!(peer = %peer_id, dialer = endpoint.is_dialer(), ?cause, "connection closed");
                if let Some(open) = self.connections.get_mut(&peer_id) {
                    open.remove(&connection_id);
                }
                self.nat.inbound.remove(&connection_id);
                if num_established == 0 {
                    self.connected_since.remove(&peer_id);
                    self.rtt.remove(&peer_id);
                    if let Ok(mut live) = self.live.write() {
                        live.remove(&peer_id);
                    }
                    self.connections.remove(&peer_id);
                    self.on_peer_gone(peer_id);
                    self.emit(MeshEvent::PeerDisconnected(peer_id));
                }
            }
            SwarmEvent::OutgoingConnectionError {
                peer_id: Some(peer),
                ..
            } => self.dialing.finish(&peer),
            SwarmEvent::Behaviour(event) => self.on_behaviour_event(event),
            _ => {}
        }
    }

    #[allow(clippy::collapsible_match)]
    fn on_behaviour_event(&mut self, event: BehaviourEvent) {
        match event {
            BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                connection_id,
                info,
            }) => {
                // Kademlia does not learn addresses by itself: feed it what identify saw.
                // Gateways (Kademlia clients) are included: lookups are how a provider
                // behind NAT finds the gateways it must dial itself.
                self.note_relay_offer(peer_id, connection_id, &info.protocols, &info.listen_addrs);
                self.on_observed(peer_id, connection_id, &info.observed_addr);
                for address in info.listen_addrs {
                    self.learn_address(peer_id, address);
                }
                self.agents.insert(peer_id, info.agent_version);
            }
            BehaviourEvent::AutonatClient(event) => self.on_autonat(event),
            BehaviourEvent::RelayClient(event) => self.on_relay_client(event),
            BehaviourEvent::RelayServer(event) => self.on_relay_server(event),
            BehaviourEvent::Dcutr(event) => self.on_hole_punch(event),
            BehaviourEvent::Ping(ping::Event {
                peer,
                result: Ok(rtt),
                ..
            }) => {
                self.rtt.insert(peer, rtt);
                if let Ok(mut live) = self.live.write() {
                    if let Some(entry) = live.get_mut(&peer) {
                        entry.rtt = Some(rtt);
                    }
                }
            }
            BehaviourEvent::Gossipsub(gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            }) => {
                self.on_gossip(propagation_source, message_id, message);
            }
            BehaviourEvent::Kad(kad::Event::RoutingUpdated {
                peer,
                is_new_peer: true,
                ..
            }) => {
                // Grow towards the target peer count from what discovery finds.
                if self.dial_budget() > 0 {
                    self.dial_new(peer, DialOpts::peer_id(peer).build());
                }
            }
            BehaviourEvent::Kad(kad::Event::OutboundQueryProgressed {
                id, result, step, ..
            }) => {
                if let kad::QueryResult::GetProviders(result) = result {
                    if let Ok(kad::GetProvidersOk::FoundProviders { providers, .. }) = result {
                        if let Some((found, _)) = self.pending_providers.get_mut(&id) {
                            found.extend(providers);
                        }
                    }
                    if step.last {
                        if let Some((found, reply)) = self.pending_providers.remove(&id) {
                            let _ = reply.send(found);
                        }
                    }
                }
            }
            // A Kademlia server we are connected to (its lookups and ours find them):
            // with manual inserts, the table grows only through `learn_address`.
            BehaviourEvent::Kad(kad::Event::RoutablePeer { peer, address }) => {
                self.learn_address(peer, address);
            }
            BehaviourEvent::Mdns(libp2p::mdns::Event::Discovered(peers)) => {
                for (peer, address) in peers {
                    self.learn_address(peer, address.clone());
                    let _ = self.swarm.dial(address.with(Protocol::P2p(peer)));
                }
            }
            _ => {}
        }
    }

    /// libp2p's metrics for the event, and the mesh's gauges after connection changes.
    fn record(&self, event: &SwarmEvent<BehaviourEvent>) {
        use libp2p::metrics::Recorder;
        let Some(metrics) = &self.metrics else {
            return;
        };
        metrics.libp2p.record(event);
        match event {
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(e)) => metrics.libp2p.record(e),
            SwarmEvent::Behaviour(BehaviourEvent::Kad(e)) => metrics.libp2p.record(e),
            SwarmEvent::Behaviour(BehaviourEvent::Identify(e)) => metrics.libp2p.record(e),
            SwarmEvent::Behaviour(BehaviourEvent::Ping(e)) => metrics.libp2p.record(e),
            SwarmEvent::Behaviour(BehaviourEvent::RelayServer(e)) => metrics.libp2p.record(e),
            SwarmEvent::Behaviour(BehaviourEvent::Dcutr(e)) => metrics.libp2p.record(e),
            SwarmEvent::ConnectionEstablished { .. } | SwarmEvent::ConnectionClosed { .. } => {
                let peers = self.swarm.connected_peers().count();
                metrics
                    .connected_peers
                    .set(i64::try_from(peers).unwrap_or(i64::MAX));
            }
            _ => {}
        }
    }
}
