//! The task that owns the swarm.

mod nat;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::gossipsub::{self, MessageAcceptance};
use libp2p::kad::{self, RecordKey};
use libp2p::multiaddr::Protocol;
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::swarm::{ConnectionId, SwarmEvent};
use libp2p::{identify, ping, Multiaddr, PeerId, Swarm};
use rand::seq::SliceRandom;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::behaviour::{self, Behaviour, BehaviourEvent};
use super::orderbook::OrderBook;
use super::peer_targets::{ConnectionAge, PeerTargets, PendingDials, LATE_ROUND};
use super::reachability::NatConfig;
use super::{AddressBook, Command, MeshEvent, PeerInfo};
use crate::clock::now_ms;
use nat::NatState;
use sharemesh_protocol::{
    Attestation, FraudProof, OpenError, ReplayGuard, ReputationReport, SignedEnvelope, WireMessage,
};

/// Why a standing gossip message (attestation, report, fraud proof) was not taken.
#[derive(Debug, thiserror::Error)]
enum GossipRefusal {
    /// No honest node sends or forwards it: the sender is penalised.
    #[error("malformed: {0}")]
    Malformed(String),
    /// It arrived outside its validity window (a slow path or a slow receiver).
    #[error("untimely: {0}")]
    Untimely(OpenError),
}

impl GossipRefusal {
    fn verdict(&self) -> MessageAcceptance {
        match self {
            GossipRefusal::Malformed(_) => MessageAcceptance::Reject,
            GossipRefusal::Untimely(_) => MessageAcceptance::Ignore,
        }
    }
}

fn open_gossip<T: WireMessage>(
    data: &[u8],
    now: u64,
) -> Result<(SignedEnvelope, sharemesh_protocol::Opened<T>), GossipRefusal> {
    let envelope =
        SignedEnvelope::from_bytes(data).map_err(|e| GossipRefusal::Malformed(e.to_string()))?;
    let opened = envelope.open::<T>(now).map_err(|e| {
        if e.is_untimely() {
            GossipRefusal::Untimely(e)
        } else {
            GossipRefusal::Malformed(e.to_string())
        }
    })?;
    Ok((envelope, opened))
}

/// How many peers to keep, and how to stay reachable.
pub(super) struct PeerPolicy {
    pub target_peers: usize,
    pub nat: NatConfig,
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

/// How often the node refreshes its whole Kademlia routing table.
const BOOTSTRAP_EVERY: Duration = Duration::from_secs(30 * 60);

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
        let PeerPolicy { target_peers, nat } = peers;
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
            nat: NatState::new(nat, nat_view, punching, held),
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
                        addresses: self
                            .connections
                            .get(peer)
                            .map(|c| c.values().map(|(a, _)| a.to_string()).collect())
                            .unwrap_or_default(),
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
                let address = endpoint.get_remote_address().clone();
                if endpoint.is_dialer() {
                    self.address_book
                        .remember(&address.clone().with_p2p(peer_id).unwrap_or(address.clone()));
                    self.learn_address(peer_id, address.clone());
                }
                self.connections
                    .entry(peer_id)
                    .or_default()
                    .insert(connection_id, (address.clone(), endpoint.is_dialer()));
                self.prefer_direct(peer_id, &address);
                if num_established.get() == 1 {
                    let age = ConnectionAge {
                        opened: Instant::now(),
                        round: self.round,
                    };
                    self.connected_since.insert(peer_id, age);
                    if let Ok(mut live) = self.live.write() {
                        live.insert(peer_id, None);
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
            BehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. }) => {
                // Kademlia does not learn addresses by itself: feed it what identify saw.
                // Gateways (Kademlia clients) are included: lookups are how a provider
                // behind NAT finds the gateways it must dial itself.
                self.note_relay_offer(peer_id, &info.protocols, &info.listen_addrs);
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
                        *entry = Some(rtt);
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

    fn count_gossip(&self, topic: &gossipsub::TopicHash, verdict: &MessageAcceptance) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        let outcome = match verdict {
            MessageAcceptance::Accept => "accepted",
            MessageAcceptance::Reject => "rejected",
            MessageAcceptance::Ignore => "ignored",
        };
        metrics
            .gossip
            .get_or_create(&crate::metrics::GossipLabels {
                topic: topic.to_string(),
                outcome: outcome.into(),
            })
            .inc();
    }

    fn on_gossip(&mut self, source: PeerId, id: gossipsub::MessageId, message: gossipsub::Message) {
        let adverts = behaviour::adverts_topic().hash();
        let verdict = if message.topic == adverts {
            let offered = self
                .book
                .write()
                .map(|mut book| book.offer(&message.data, now_ms()));
            match offered {
                Err(_) => {
                    tracing::error!("order book lock poisoned");
                    MessageAcceptance::Ignore
                }
                Ok(Ok(accepted)) => {
                    self.emit(MeshEvent::AdvertAccepted {
                        provider: accepted.provider,
                        seq: accepted.seq,
                        from: source,
                    });
                    MessageAcceptance::Accept
                }
                Ok(Err(refusal)) => {
                    let violation = refusal.is_violation();
                    tracing::debug!(from = %source, %refusal, violation, "advert not taken");
                    self.emit(MeshEvent::AdvertRejected {
                        from: source,
                        reason: refusal.to_string(),
                        violation,
                        signed_fault: refusal.signed_fault(),
                    });
                    if violation {
                        MessageAcceptance::Reject
                    } else {
                        MessageAcceptance::Ignore
                    }
                }
            }
        } else if message.topic == behaviour::fraud_proofs_topic().hash() {
            self.check_fraud_proof(source, &message.data)
        } else if message.topic == behaviour::reputation_topic().hash() {
            self.check_report(source, &message.data)
        } else if message.topic == behaviour::attestations_topic().hash() {
            self.check_attestation(source, &message.data)
        } else {
            // Attestation and reputation gossip are validated by the trust layer (not
            // yet built): do not forward what nobody checked.
            MessageAcceptance::Ignore
        };
        self.count_gossip(&message.topic, &verdict);
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(&id, &source, verdict);
    }

    /// An attestation is forwarded when it opens and is the node's newest; it proves
    /// only what its key claims (the trust layer checks it for consistency).
    fn check_attestation(&mut self, source: PeerId, data: &[u8]) -> MessageAcceptance {
        self.admit_newest::<Attestation>(source, data, |attestation| MeshEvent::Attestation {
            attestation: Box::new(attestation),
            from: source,
        })
    }

    /// A reputation report is forwarded when it opens and is the reporter's newest;
    /// what it is worth is the trust layer's (the reporter's own trust in each view).
    fn check_report(&mut self, source: PeerId, data: &[u8]) -> MessageAcceptance {
        self.admit_newest::<ReputationReport>(source, data, |report| MeshEvent::ReputationReport {
            report: Box::new(report),
            from: source,
        })
    }

    /// Standing messages (one signer's newest wins): malformed → reject, stale or
    /// untimely → ignore, otherwise the event and forward.
    fn admit_newest<T: WireMessage>(
        &mut self,
        source: PeerId,
        data: &[u8],
        event: impl FnOnce(T) -> MeshEvent,
    ) -> MessageAcceptance {
        let now = now_ms();
        let opened = match open_gossip::<T>(data, now) {
            Ok((_, opened)) => opened,
            Err(refusal) => {
                tracing::debug!(from = %source, %refusal, kind = ?T::KIND, "gossip not taken");
                return refusal.verdict();
            }
        };
        if self.reports.admit(&opened, T::KIND, [0; 16], now).is_err() {
            return MessageAcceptance::Ignore;
        }
        self.emit(event(opened.body));
        MessageAcceptance::Accept
    }

    /// A fraud proof is forwarded when its signatures and chain check (anyone can
    /// check those); a malformed one is a violation, an expired one is dropped. Whether
    /// it is fraud takes a replay, which the trust layer does where it holds the model.
    fn check_fraud_proof(&mut self, source: PeerId, data: &[u8]) -> MessageAcceptance {
        let checked = open_gossip::<FraudProof>(data, now_ms()).and_then(|(envelope, opened)| {
            opened
                .body
                .evidence()
                .map_err(|e| GossipRefusal::Malformed(e.to_string()))?;
            Ok((envelope, opened.body.provider))
        });
        match checked {
            Ok((envelope, accused)) => {
                self.emit(MeshEvent::FraudProof {
                    envelope: Box::new(envelope),
                    accused,
                    from: source,
                });
                MessageAcceptance::Accept
            }
            Err(refusal) => {
                tracing::debug!(from = %source, %refusal, "fraud proof not taken");
                refusal.verdict()
            }
        }
    }

    /// Peer manager: keep the peer count within its band (`PeerTargets`) — prune the
    /// lowest-scored settled peers above it, dial known peers below the target — and
    /// drop peers whose gossip score fell below the graylist threshold. `late`: how late
    /// this round started; a late round runs on a stale view and only dials.
    fn maintain(&mut self, late: Duration) {
        self.round += 1;
        let on_time = late < LATE_ROUND;
        if on_time {
            self.dialing.expire(Instant::now());
        }
        self.bootstrap_when_due();
        // The book's size for the metrics: every maintenance tick, not every message.
        if let (Some(metrics), Ok(book)) = (&self.metrics, self.book.read()) {
            metrics
                .book_entries
                .set(i64::try_from(book.len()).unwrap_or(i64::MAX));
        }
        let connected: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        if on_time {
            self.prune(&connected);
        } else {
            tracing::debug!(
                late_ms = late.as_millis() as u64,
                "late peer-manager round: no pruning"
            );
        }
        self.dial_towards_target(&connected);
        self.reach_autonat_servers();
        self.keep_relays();
    }

    /// Disconnects the lowest-scored settled peers above the band and every graylisted
    /// one. A connection that has not settled ([`ConnectionAge::settled`]) is left alone
    /// unless graylisted.
    fn prune(&mut self, connected: &[PeerId]) {
        let gossipsub = &self.swarm.behaviour().gossipsub;
        let mut scored: Vec<(PeerId, f64)> = connected
            .iter()
            .map(|p| (*p, gossipsub.peer_score(p).unwrap_or(0.0)))
            .collect();
        scored.sort_by(|a, b| a.1.total_cmp(&b.1));
        let excess = self.peer_targets.prune_count(connected.len());
        let (now, round) = (Instant::now(), self.round);
        let settled = |peer: &PeerId| {
            self.connected_since
                .get(peer)
                .is_none_or(|age| age.settled(now, round))
        };
        // Our relays and the peers holding reservations on us stay: dropping them would
        // make a node behind NAT unreachable.
        let relay_bound =
            |peer: &PeerId| self.nat.relays.holds(peer) || self.nat.relay_clients.contains(peer);
        let mut to_drop: Vec<PeerId> = scored
            .iter()
            .filter(|(peer, _)| settled(peer) && !relay_bound(peer))
            .take(excess)
            .map(|(peer, _)| *peer)
            .collect();
        let graylisted: Vec<PeerId> = scored
            .iter()
            .filter(|(peer, score)| *score < -400.0 && !to_drop.contains(peer))
            .map(|(peer, _)| *peer)
            .collect();
        to_drop.extend(graylisted);
        for peer in to_drop {
            tracing::debug!(%peer, "pruning peer");
            let _ = self.swarm.disconnect_peer_id(peer);
        }
    }

    /// Dials known peers towards the target; a random walk when too few are known.
    fn dial_towards_target(&mut self, connected: &[PeerId]) {
        // Below target: dial peers we already know — reached before (a restarted peer
        // comes back) or in Kademlia's routing table — a random few, no more than the
        // target lacks. Only when too few are known, at most every 30 s, look for more
        // with a random walk: a walk connects to some twenty peers, most of which the
        // next round prunes.
        let budget = self.dial_budget();
        if budget == 0 {
            return;
        }
        let mut candidates = self.dial_candidates();
        candidates.shuffle(&mut rand::rng());
        let known = candidates.len();
        for (peer, address) in candidates {
            if self.dial_budget() == 0 {
                break;
            }
            let opts = match address {
                Some(address) => DialOpts::peer_id(peer).addresses(vec![address]).build(),
                None => DialOpts::peer_id(peer).build(),
            };
            self.dial_new(peer, opts);
        }
        let walked_recently = self
            .last_walk
            .is_some_and(|at| at.elapsed() < Duration::from_secs(30));
        if known < budget && !connected.is_empty() && !walked_recently {
            self.last_walk = Some(Instant::now());
            // One lookup of a random key finds peers across the key space; a full
            // bootstrap (a lookup per bucket) would cost nine times the connections.
            // It asks for as many peers as the node keeps, not Kademlia's 20: every
            // peer it queries is a connection, and when hundreds of nodes join at once
            // those walk connections (until pruned) set the mesh's peak memory.
            let wanted = NonZeroUsize::new(self.peer_targets.target.clamp(1, 20))
                .unwrap_or(NonZeroUsize::MIN);
            self.swarm
                .behaviour_mut()
                .kad
                .get_n_closest_peers(PeerId::random(), wanted);
        }
    }

    /// Known peers that are neither connected nor being dialled: the address book's
    /// (with the address we reached them at) and the Kademlia routing table's.
    fn dial_candidates(&mut self) -> Vec<(PeerId, Option<Multiaddr>)> {
        let mut candidates: HashMap<PeerId, Option<Multiaddr>> = HashMap::new();
        for address in self.address_book.addresses() {
            if let (Some(peer), _) = super::split_peer(&address) {
                candidates.insert(peer, Some(address));
            }
        }
        for bucket in self.swarm.behaviour_mut().kad.kbuckets() {
            for entry in bucket.iter() {
                candidates.entry(*entry.node.key.preimage()).or_insert(None);
            }
        }
        candidates
            .into_iter()
            .filter(|(peer, _)| {
                peer != self.swarm.local_peer_id()
                    && !self.swarm.is_connected(peer)
                    && !self.dialing.contains(peer)
            })
            .collect()
    }

    /// Gives Kademlia an address of `peer`, unless that would only start a liveness
    /// check: when the peer's bucket is full, Kademlia dials the bucket's oldest
    /// disconnected peer to decide which to keep. Peers the peer manager pruned stay in
    /// the table as disconnected, so every new connection dialled a pruned peer, which
    /// was pruned again — the churn that a 200-node simulation measured at ~190 new
    /// connections per node per minute. A full bucket already holds enough contacts for
    /// that distance, and the periodic random walk refreshes it.
    fn learn_address(&mut self, peer: PeerId, address: Multiaddr) {
        let kad = &mut self.swarm.behaviour_mut().kad;
        let full_without_peer = kad.kbucket(peer).is_some_and(|bucket| {
            bucket.num_entries() >= kad::K_VALUE.get()
                && !bucket
                    .iter()
                    .any(|entry| entry.node.key.preimage() == &peer)
        });
        if !full_without_peer {
            kad.add_address(&peer, address);
        }
    }

    /// A full Kademlia bootstrap every [`BOOTSTRAP_EVERY`] (a lookup per bucket keeps the
    /// routing table fresh across the key space, for provider lookups).
    fn bootstrap_when_due(&mut self) {
        if self.last_bootstrap.elapsed() < BOOTSTRAP_EVERY {
            return;
        }
        self.last_bootstrap = Instant::now();
        match self.swarm.behaviour_mut().kad.bootstrap() {
            Ok(_) => {}
            Err(err) => tracing::debug!(%err, "no Kademlia bootstrap: no known peers"),
        }
    }

    /// Dials still to start before the node reaches its peer target.
    fn dial_budget(&self) -> usize {
        self.peer_targets
            .dial_count(self.swarm.connected_peers().count(), self.dialing.len())
    }

    /// Dials `peer` unless it is connected or already being dialled.
    fn dial_new(&mut self, peer: PeerId, opts: DialOpts) {
        if peer == *self.swarm.local_peer_id()
            || self.swarm.is_connected(&peer)
            || self.dialing.contains(&peer)
        {
            return;
        }
        if self.swarm.dial(opts).is_ok() {
            self.dialing.start(peer, Instant::now());
        }
    }
}
