//! The event loop's reachability work (SPEC §8): AutoNAT's verdicts, the relay server's
//! status, reservations on relays while unreachable, and direct connections preferred
//! over relayed ones once hole punching made them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use libp2p::core::transport::ListenerId;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{autonat, dcutr, relay, Multiaddr, PeerId, StreamProtocol};

use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use rand::seq::SliceRandom;

use super::EventLoop;
use crate::reachability::{
    is_relayed, relay_of, NatConfig, NatStatus, Reachability, ReachabilityMode, RelayCandidate,
    RelaySet,
};
use crate::{MeshEvent, NatView};

/// How often a node that dialled nobody dials peers to reach an AutoNAT server.
const SERVER_DIAL_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// How often a node short of relays dials known peers to find more.
const RELAY_SEARCH_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// How many known peers one search dials.
const RELAY_SEARCH_DIALS: usize = 3;

/// What the event loop keeps about reachability.
pub(super) struct NatState {
    pub config: NatConfig,
    pub reachability: Reachability,
    pub relays: RelaySet,
    /// Connected peers whose identify lists the relay hop protocol, with the first
    /// direct address they listen on (their own).
    pub hop_capable: HashMap<PeerId, Option<Multiaddr>>,
    /// Peers connected only through relays, with the direct address they listen on.
    pub direct_addrs: HashMap<PeerId, Multiaddr>,
    /// Peers holding a reservation on our relay server.
    pub relay_clients: HashSet<PeerId>,
    pub view: Arc<RwLock<NatView>>,
    pub hole_punches: u64,
    pub hole_punch_failures: u64,
    /// Whether our relay server advertises the hop protocol now.
    pub serving: bool,
    pub last_status: NatStatus,
    /// When we last dialled peers only to reach an AutoNAT server.
    pub last_server_dial: Option<Instant>,
    /// When we last dialled known peers to find a relay.
    pub last_relay_search: Option<Instant>,
    /// Peers reached only through a relay whose hole punch has not ended.
    pub punching: crate::Punching,
    /// Job streams open per peer, and the peers whose redundant relayed connections
    /// wait for theirs to end.
    pub held: crate::HeldPaths,
    pub deferred_close: HashSet<PeerId>,
    /// Kademlia server mode unless behind NAT (providers).
    pub kad_server: bool,
    /// The Kademlia mode set last (`None`: the configured one).
    pub kad_serving: Option<bool>,
}

impl NatState {
    pub fn new(
        config: NatConfig,
        view: Arc<RwLock<NatView>>,
        punching: crate::Punching,
        held: crate::HeldPaths,
        kad_server: bool,
    ) -> Self {
        NatState {
            config,
            reachability: Reachability::new(config.mode),
            relays: RelaySet::new(if config.enabled { config.relays } else { 0 }),
            hop_capable: HashMap::new(),
            direct_addrs: HashMap::new(),
            relay_clients: HashSet::new(),
            view,
            hole_punches: 0,
            hole_punch_failures: 0,
            serving: false,
            last_status: NatStatus::Unknown,
            last_server_dial: None,
            last_relay_search: None,
            punching,
            held,
            deferred_close: HashSet::new(),
            kad_server,
            kad_serving: None,
        }
    }
}

impl EventLoop {
    pub(super) fn forget_listen_addr(&mut self, address: &Multiaddr) {
        if let Ok(mut addrs) = self.listen_addrs.write() {
            addrs.retain(|a| a != address);
        }
        if is_relayed(address) {
            self.emit(MeshEvent::AddressesChanged);
        }
    }

    /// An operator who declared the node public vouches for what it listens on: those
    /// are its external addresses (a relay's reservations carry them; without any it
    /// cannot serve).
    pub(super) fn on_new_listen_addr(&mut self, address: &Multiaddr) {
        if is_relayed(address) {
            self.emit(MeshEvent::AddressesChanged);
            if self.nat.config.enabled {
                // Have AutoNAT dial us through the relay: the reservation alone proves
                // nothing (see `candidates`). Without our own id at the end, as peers
                // report what they observe.
                let mut candidate = address.clone();
                if matches!(candidate.iter().last(), Some(Protocol::P2p(_))) {
                    candidate.pop();
                }
                self.swarm.behaviour_mut().candidates.propose(candidate);
            }
        }
        if self.nat.config.enabled
            && self.nat.config.mode == ReachabilityMode::Public
            && !is_relayed(address)
        {
            self.swarm.add_external_address(address.clone());
        }
    }

    /// A listener closed: when it was a reservation, that relay is backed off and
    /// another one asked.
    pub(super) fn on_listener_closed(&mut self, listener: ListenerId) {
        if let Some(relay) = self.nat.relays.listener_closed(listener, Instant::now()) {
            tracing::warn!(%relay, "relay reservation ended; looking for another relay");
            self.keep_relays();
            self.publish_nat_view();
        }
    }

    /// libp2p confirmed (a peer dialled back) or expired an external address of ours.
    pub(super) fn on_external(&mut self, address: &Multiaddr, confirmed: bool) {
        if confirmed {
            tracing::debug!(%address, "external address confirmed");
            self.nat.reachability.confirmed(address);
        } else {
            self.nat.reachability.expired(address);
        }
        self.apply_reachability();
    }

    pub(super) fn on_autonat(&mut self, event: autonat::v2::client::Event) {
        if is_relayed(&event.tested_addr) {
            self.on_relayed_probe(&event);
            return;
        }
        match event.result {
            Ok(()) => {
                tracing::debug!(address = %event.tested_addr, server = %event.server, "AutoNAT: reachable");
            }
            Err(err) => {
                let counted = self.nat.reachability.probe_failed(&event.tested_addr);
                tracing::debug!(address = %event.tested_addr, server = %event.server, %err, counted, "AutoNAT: not reachable");
                self.apply_reachability();
            }
        }
    }

    /// AutoNAT tested one of our relayed addresses: a peer that could not dial us through
    /// a relay we hold a reservation on makes us give that relay up and ask another. The
    /// relay itself counts as a tester too: an honest one refuses to test a circuit
    /// through itself (the vendored AutoNAT server), so its failure is its own claim.
    fn on_relayed_probe(&mut self, event: &autonat::v2::client::Event) {
        let address = &event.tested_addr;
        let Some(relay) = relay_of(address) else {
            return;
        };
        match &event.result {
            Ok(()) => {
                tracing::debug!(%relay, server = %event.server, "a peer dialled us through our relay");
            }
            Err(err) if self.nat.relays.holds(&relay) => {
                tracing::warn!(%relay, server = %event.server, %err, "a peer could not dial us through our relay: giving it up");
                if let Some(listener) = self.nat.relays.distrust(relay, Instant::now()) {
                    // Its ListenerClosed event backs it off and asks another.
                    self.swarm.remove_listener(listener);
                }
                self.publish_nat_view();
            }
            Err(err) => {
                tracing::debug!(%relay, server = %event.server, %err, "a relayed probe failed through a relay we no longer hold");
            }
        }
    }

    /// AutoNAT v2 asks only peers it dialled (a connection's dialer learns whether the
    /// other side serves). A node everyone dialled (a bootstrap) would never learn its
    /// reachability: while it is unknown and no connection is ours, dial a few
    /// connected peers a second time, every [`SERVER_DIAL_EVERY`] at most.
    pub(super) fn reach_autonat_servers(&mut self) {
        if !self.nat.config.enabled || self.nat.reachability.status() != NatStatus::Unknown {
            return;
        }
        let dialled_any = self
            .connections
            .values()
            .flat_map(|open| open.values())
            .any(|(address, dialer)| *dialer && !is_relayed(address));
        let recently = self
            .nat
            .last_server_dial
            .is_some_and(|at| at.elapsed() < SERVER_DIAL_EVERY);
        if dialled_any || recently || self.connections.is_empty() {
            return;
        }
        self.nat.last_server_dial = Some(Instant::now());
        let mut peers: Vec<PeerId> = self.connections.keys().copied().collect();
        peers.shuffle(&mut rand::rng());
        for peer in peers.into_iter().take(3) {
            tracing::debug!(%peer, "dialling a peer to reach an AutoNAT server");
            let opts = DialOpts::peer_id(peer)
                .condition(PeerCondition::Always)
                .build();
            let _ = self.swarm.dial(opts);
        }
    }

    /// Serve as a relay exactly while reachable; hold reservations exactly while not.
    pub(super) fn apply_reachability(&mut self) {
        let status = self.nat.reachability.status();
        if status != self.nat.last_status {
            tracing::info!(?status, previous = ?self.nat.last_status, "reachability changed");
            self.nat.last_status = status;
            self.emit(MeshEvent::AddressesChanged);
        }
        let serve = status == NatStatus::Public;
        if let Some(server) = self.swarm.behaviour_mut().relay_server.as_mut() {
            if serve != self.nat.serving {
                server.set_status(Some(if serve {
                    relay::Status::Enable
                } else {
                    relay::Status::Disable
                }));
                self.nat.serving = serve;
            }
        }
        self.set_kad_mode(status);
        if status == NatStatus::Public {
            for listener in self.nat.relays.release_all() {
                self.swarm.remove_listener(listener);
            }
        }
        self.keep_relays();
        self.publish_nat_view();
    }

    /// Kademlia server mode follows reachability where the node is not a plain light
    /// client: a node behind NAT answers no queries (reaching it costs a relay circuit
    /// per query, and walks would open relayed connections to it for nothing), and a
    /// light client (gateway) answers while it relays, so that NATed nodes' walks find
    /// it. Providers answer otherwise (on loopback no address is ever confirmed).
    fn set_kad_mode(&mut self, status: NatStatus) {
        if !self.nat.config.enabled {
            return;
        }
        let server = match status {
            NatStatus::Public => true,
            NatStatus::Private => false,
            NatStatus::Unknown => self.nat.kad_server,
        };
        if self.nat.kad_serving != Some(server) {
            tracing::debug!(server, ?status, "Kademlia mode");
            self.nat.kad_serving = Some(server);
            self.swarm.behaviour_mut().kad.set_mode(Some(if server {
                libp2p::kad::Mode::Server
            } else {
                libp2p::kad::Mode::Client
            }));
        }
    }

    /// Identify told us (over `connection`) which protocols `peer` speaks and where it
    /// listens: is it a relay we could use? Only a direct connection can tell: a relay
    /// serves no hop over a relayed connection, so identify there never lists it — and
    /// once a relay reached us through another relay, that answer struck it from the
    /// candidates (the spare relay a node needed when its relay died).
    pub(super) fn note_relay_offer(
        &mut self,
        peer: PeerId,
        connection: ConnectionId,
        protocols: &[StreamProtocol],
        listening: &[Multiaddr],
    ) {
        let relayed = self
            .connections
            .get(&peer)
            .and_then(|open| open.get(&connection))
            .is_none_or(|(address, _)| is_relayed(address));
        if relayed {
            // Where to dial it directly when looking for a relay.
            if let Some(own) = listening.iter().find(|a| !is_relayed(a)) {
                self.nat.direct_addrs.insert(peer, own.clone());
            }
            return;
        }
        if protocols.contains(&relay::HOP_PROTOCOL_NAME) {
            let own = listening.iter().find(|a| !is_relayed(a)).cloned();
            if self.nat.hop_capable.insert(peer, own).is_none() {
                self.keep_relays();
            }
        } else {
            self.nat.hop_capable.remove(&peer);
        }
    }

    /// While unreachable, asks relays for reservations until the wanted number are held
    /// or asked: connected peers that relay, chosen by [`RelaySet::choose`].
    pub(super) fn keep_relays(&mut self) {
        if !self.nat.config.enabled || self.nat.reachability.status() != NatStatus::Private {
            return;
        }
        let candidates: Vec<RelayCandidate> = self
            .nat
            .hop_capable
            .iter()
            .filter_map(|(peer, listening)| {
                // An address we dialled is the relay's own (a connection it opened
                // shows its ephemeral port); else where it says it listens (it may
                // have reached us only through a relay: the reservation dials it).
                let dialled = self.connections.get(peer).and_then(|open| {
                    open.values()
                        .find(|(address, dialer)| *dialer && !is_relayed(address))
                        .map(|(address, _)| address.clone())
                });
                let address = dialled.or_else(|| listening.clone())?;
                let (_, address) = crate::split_peer(&address);
                Some(RelayCandidate {
                    peer: *peer,
                    address,
                    rtt: self.rtt.get(peer).copied(),
                })
            })
            .collect();
        let chosen = self.nat.relays.choose(candidates, Instant::now());
        if chosen.is_empty() && self.nat.relays.missing() > 0 {
            self.look_for_relays();
        }
        for chosen in chosen {
            let circuit = chosen
                .address
                .clone()
                .with(Protocol::P2p(chosen.peer))
                .with(Protocol::P2pCircuit);
            match self.swarm.listen_on(circuit.clone()) {
                Ok(listener) => {
                    tracing::info!(relay = %chosen.peer, %circuit, "asking for a relay reservation");
                    self.nat
                        .relays
                        .requested(chosen.peer, chosen.address, listener);
                }
                Err(err) => {
                    tracing::warn!(relay = %chosen.peer, ?err, "cannot listen through relay")
                }
            }
        }
    }

    /// Short of relays with none to ask among connected peers: dial a few peers reached
    /// only through relays, or known and not connected (identify over the new direct
    /// connection says whether they relay), at most every [`RELAY_SEARCH_EVERY`]. The peer manager alone dials only below its target, and a
    /// node at its target whose relay died would otherwise wait for churn.
    fn look_for_relays(&mut self) {
        let recently = self
            .nat
            .last_relay_search
            .is_some_and(|at| at.elapsed() < RELAY_SEARCH_EVERY);
        if recently {
            return;
        }
        self.nat.last_relay_search = Some(Instant::now());
        // Peers we reach only through a relay first, at the direct address their
        // identify gave: identify over a relayed connection cannot say whether they
        // relay, over a direct one it can.
        let mut relayed_only: Vec<(PeerId, Vec<Multiaddr>)> = self
            .connections
            .iter()
            .filter(|(peer, open)| {
                open.values().all(|(address, _)| is_relayed(address))
                    && !self.dialing.contains(peer)
            })
            .filter_map(|(peer, _)| Some((*peer, vec![self.nat.direct_addrs.get(peer)?.clone()])))
            .collect();
        relayed_only.shuffle(&mut rand::rng());
        let mut known = self.dial_candidates();
        known.shuffle(&mut rand::rng());
        // And a Kademlia walk: it finds peers we never heard of (public ones relay, and
        // answer Kademlia while they do).
        self.swarm
            .behaviour_mut()
            .kad
            .get_closest_peers(PeerId::random());
        for (peer, addresses) in relayed_only
            .into_iter()
            .chain(known)
            .take(RELAY_SEARCH_DIALS)
        {
            tracing::debug!(%peer, ?addresses, "dialling a peer directly to look for a relay");
            let opts = DialOpts::peer_id(peer)
                .addresses(addresses)
                .condition(PeerCondition::Always)
                .build();
            if self.swarm.dial(opts).is_ok() {
                self.dialing.start(peer, Instant::now());
            }
        }
    }

    pub(super) fn on_relay_client(&mut self, event: relay::client::Event) {
        match event {
            relay::client::Event::ReservationReqAccepted {
                relay_peer_id,
                renewal,
                ..
            } => {
                if !renewal {
                    tracing::info!(relay = %relay_peer_id, "relay reservation accepted");
                }
                self.nat.relays.reserved(&relay_peer_id);
                self.publish_nat_view();
            }
            relay::client::Event::OutboundCircuitEstablished { relay_peer_id, .. } => {
                tracing::debug!(relay = %relay_peer_id, "relayed connection out");
            }
            relay::client::Event::InboundCircuitEstablished { src_peer_id, .. } => {
                tracing::debug!(peer = %src_peer_id, "relayed connection in");
            }
        }
    }

    pub(super) fn on_relay_server(&mut self, event: relay::Event) {
        match event {
            relay::Event::ReservationReqAccepted { src_peer_id, .. } => {
                self.nat.relay_clients.insert(src_peer_id);
            }
            relay::Event::ReservationClosed { src_peer_id }
            | relay::Event::ReservationTimedOut { src_peer_id } => {
                self.nat.relay_clients.remove(&src_peer_id);
            }
            relay::Event::CircuitReqAccepted {
                src_peer_id,
                dst_peer_id,
            } => tracing::debug!(src = %src_peer_id, dst = %dst_peer_id, "relaying a circuit"),
            relay::Event::CircuitClosed {
                src_peer_id,
                dst_peer_id,
                error: Some(error),
            } => {
                // Mostly a limit (bytes, duration) cutting a circuit: worth seeing.
                tracing::info!(src = %src_peer_id, dst = %dst_peer_id, %error, "relayed circuit cut");
            }
            relay::Event::CircuitClosed {
                src_peer_id,
                dst_peer_id,
                error: None,
            } => tracing::debug!(src = %src_peer_id, dst = %dst_peer_id, "circuit closed"),
            _ => {}
        }
        self.publish_nat_view();
    }

    /// `peer`'s hole punch began (`true`: a first relayed connection) or ended.
    fn set_punching(&self, peer: PeerId, pending: bool) {
        if let Ok(mut punching) = self.nat.punching.write() {
            if pending {
                punching.entry(peer).or_insert_with(Instant::now);
            } else {
                punching.remove(&peer);
            }
        }
    }

    pub(super) fn on_hole_punch(&mut self, event: dcutr::Event) {
        self.set_punching(event.remote_peer_id, false);
        match event.result {
            Ok(connection) => {
                self.nat.hole_punches += 1;
                tracing::info!(peer = %event.remote_peer_id, ?connection, "hole punched: direct connection");
            }
            Err(err) => {
                self.nat.hole_punch_failures += 1;
                tracing::info!(peer = %event.remote_peer_id, %err, "hole punching failed; staying relayed");
            }
        }
        self.publish_nat_view();
    }

    /// A direct connection to `peer` opened (at `address`): its relayed connections
    /// close, so that token streams run direct (libp2p-stream picks any connection) —
    /// once no job stream to the peer is open, since one may run on them.
    pub(super) fn prefer_direct(&mut self, peer: PeerId, address: &Multiaddr) {
        if is_relayed(address) {
            let direct = self
                .connections
                .get(&peer)
                .is_some_and(|open| open.values().any(|(address, _)| !is_relayed(address)));
            if self.nat.config.enabled && !direct {
                self.set_punching(peer, true);
            }
            return;
        }
        self.set_punching(peer, false);
        let streams = self
            .nat
            .held
            .lock()
            .map_or(0, |held| held.get(&peer).copied().unwrap_or(0));
        if streams > 0 {
            tracing::debug!(%peer, streams, "direct connection open; relayed ones close when the streams end");
            self.nat.deferred_close.insert(peer);
            return;
        }
        self.close_relayed(peer);
    }

    /// The last job stream to `peer` ended: relayed connections left open for it close.
    pub(super) fn path_released(&mut self, peer: PeerId) {
        if self.nat.deferred_close.remove(&peer) {
            self.close_relayed(peer);
        }
    }

    /// Closes `peer`'s relayed connections, when a direct one is open.
    fn close_relayed(&mut self, peer: PeerId) {
        let Some(open) = self.connections.get(&peer) else {
            return;
        };
        if !open.values().any(|(address, _)| !is_relayed(address)) {
            return;
        }
        let relayed: Vec<_> = self
            .connections
            .get(&peer)
            .map(|open| {
                open.iter()
                    .filter(|(_, (address, _))| is_relayed(address))
                    .map(|(id, _)| *id)
                    .collect()
            })
            .unwrap_or_default();
        for connection in relayed {
            tracing::debug!(%peer, ?connection, "closing the relayed connection: a direct one is open");
            self.swarm.close_connection(connection);
        }
    }

    /// Every connection to `peer` closed.
    pub(super) fn on_peer_gone(&mut self, peer: PeerId) {
        self.set_punching(peer, false);
        self.nat.deferred_close.remove(&peer);
        self.nat.hop_capable.remove(&peer);
        self.nat.direct_addrs.remove(&peer);
        self.nat.relay_clients.remove(&peer);
        if let Some(listener) = self.nat.relays.listener_of(&peer) {
            // Its ListenerClosed event backs the relay off and finds another.
            self.swarm.remove_listener(listener);
        }
    }

    pub(super) fn publish_nat_view(&self) {
        let view = NatView {
            status: self.nat.reachability.status(),
            external_addresses: self
                .nat
                .reachability
                .confirmed_addresses()
                .map(ToString::to_string)
                .collect(),
            relays: self
                .nat
                .relays
                .reserved_relays()
                .iter()
                .map(ToString::to_string)
                .collect(),
            distrusted_relays: self
                .nat
                .relays
                .distrusted_relays(Instant::now())
                .iter()
                .map(ToString::to_string)
                .collect(),
            relay_server: self.nat.serving,
            relayed_clients: self.nat.relay_clients.len(),
            hole_punches: self.nat.hole_punches,
            hole_punch_failures: self.nat.hole_punch_failures,
        };
        if let Ok(mut shared) = self.nat.view.write() {
            *shared = view;
        }
    }
}
