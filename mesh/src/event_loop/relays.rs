//! The event loop's relay client work (SPEC §8): which connected peers can relay for
//! us, reservations on the best of them while unreachable, looking for more when short,
//! and the relay server's and client's events.

use std::time::Instant;

use libp2p::multiaddr::Protocol;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::ConnectionId;
use libp2p::{relay, Multiaddr, PeerId, StreamProtocol};
use rand::seq::SliceRandom;

use super::EventLoop;
use crate::reachability::{is_relayed, NatStatus};
use crate::relay_set::RelayCandidate;

/// How often a node short of relays dials known peers to find more.
const RELAY_SEARCH_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// How many known peers one search dials.
const RELAY_SEARCH_DIALS: usize = 3;

impl EventLoop {
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
}
