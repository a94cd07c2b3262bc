//! The event loop's reachability work (SPEC §8): AutoNAT's verdicts, the relay server's
//! status, reservations on relays while unreachable, and direct connections preferred
//! over relayed ones once hole punching made them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use libp2p::core::transport::ListenerId;
use libp2p::multiaddr::Protocol;
use libp2p::{autonat, dcutr, relay, Multiaddr, PeerId};

use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use rand::seq::SliceRandom;

use super::EventLoop;
use crate::reachability::{
    host_of, is_relayed, relay_of, NatConfig, NatStatus, Reachability, ReachabilityMode,
};
use crate::relay_set::RelaySet;
use crate::{MeshEvent, NatView};

/// How often a node that dialled nobody dials peers to reach an AutoNAT server.
const SERVER_DIAL_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

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
    /// The local address each direct connection a peer dialled arrived at.
    pub inbound: HashMap<libp2p::swarm::ConnectionId, Multiaddr>,
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
            inbound: HashMap::new(),
            kad_server,
            kad_serving: None,
            config,
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

    /// The operator's `--external-address`es: AutoNAT tests them like any candidate
    /// (peers that observe us there confirm them too: `on_observed`).
    pub(super) fn propose_external(&mut self) {
        if !self.nat.config.enabled {
            return;
        }
        for address in self.nat.config.external.clone() {
            self.swarm.behaviour_mut().candidates.propose(address);
        }
    }

    /// Identify told us where `peer` sees us on `connection`. When the peer dialled us
    /// straight and sees us at the address it arrived at (or at one the operator says
    /// is ours), its host reached us there: enough hosts confirm the address
    /// ([`Reachability::reached`]).
    pub(super) fn on_observed(
        &mut self,
        peer: PeerId,
        connection: libp2p::swarm::ConnectionId,
        observed: &Multiaddr,
    ) {
        if !self.nat.config.enabled || self.nat.config.mode != ReachabilityMode::Auto {
            return;
        }
        let Some(local) = self.nat.inbound.get(&connection) else {
            return;
        };
        let (_, observed) = crate::split_peer(observed);
        if observed != *local && !self.nat.config.external.contains(&observed) {
            return;
        }
        let from = self
            .connections
            .get(&peer)
            .and_then(|open| open.get(&connection))
            .and_then(|(address, _)| host_of(address));
        let Some(from) = from else {
            return;
        };
        if self.nat.reachability.reached(&observed, from) {
            tracing::info!(address = %observed, "peers on several hosts dialled us here: reachable");
            self.swarm.add_external_address(observed.clone());
            self.on_external(&observed, true);
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

    /// The remote address of each connection to `peer`, in the order a new job stream
    /// picks them (the vendored libp2p-stream's `Shared::sender`): direct before
    /// relayed, then the oldest first. The first one carries the peer's next stream.
    pub(super) fn addresses_in_stream_order(&self, peer: &PeerId) -> Vec<String> {
        let mut open: Vec<_> = self
            .connections
            .get(peer)
            .map(|c| c.iter().collect())
            .unwrap_or_default();
        open.sort_by_key(|(id, (address, _))| (is_relayed(address), **id));
        open.into_iter().map(|(_, (a, _))| a.to_string()).collect()
    }

    /// A direct connection to `peer` opened (at `address`): its relayed connections
    /// close, so that no relay carries traffic a direct path can (new streams already
    /// open on the direct one) —
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
