//! Whether others can reach this node, and the relays it keeps while they cannot
//! (SPEC §8). Pure bookkeeping: the event loop feeds it what AutoNAT, identify and the
//! relay client report and acts on what it answers; time is an argument.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use libp2p::core::transport::ListenerId;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};
use serde::Serialize;

use crate::behaviour::{RelayLimits, TraversalConfig};

/// How a node learns whether it is reachable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReachabilityMode {
    /// AutoNAT v2: peers dial our candidate addresses back.
    #[default]
    Auto,
    /// The operator says so (a port forward, a public address): relay for others.
    Public,
    /// The operator says so: reserve relays at once, serve none.
    Private,
}

/// What the node believes about itself now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NatStatus {
    /// No address tested yet.
    #[default]
    Unknown,
    /// A peer dialled one of our addresses back.
    Public,
    /// Dial-backs failed and none succeeded: behind NAT or a firewall.
    Private,
}

/// The node's NAT-traversal settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatConfig {
    /// AutoNAT, relays and hole punching at all (off in in-process simulations, where
    /// every node is reachable and the extra protocols only cost CPU).
    pub enabled: bool,
    pub mode: ReachabilityMode,
    /// Relays to hold reservations on while unreachable (0: none, so nobody can dial
    /// this node unless it dialled them first).
    pub relays: usize,
    /// Serve as a relay while reachable, within these limits (`None`: never).
    pub relay_server: Option<RelayLimits>,
}

impl NatConfig {
    /// Off: what in-process simulations and most tests run.
    pub const OFF: NatConfig = NatConfig {
        enabled: false,
        mode: ReachabilityMode::Auto,
        relays: 0,
        relay_server: None,
    };

    /// What a real node runs unless told otherwise: AutoNAT, two relays when
    /// unreachable, a relay server when reachable.
    pub fn on() -> Self {
        NatConfig {
            enabled: true,
            mode: ReachabilityMode::Auto,
            relays: DEFAULT_RELAYS,
            relay_server: Some(RelayLimits::default()),
        }
    }

    pub(crate) fn traversal(&self) -> Option<TraversalConfig> {
        self.enabled.then_some(TraversalConfig {
            relay_server: self.relay_server,
        })
    }
}

impl Default for NatConfig {
    fn default() -> Self {
        Self::OFF
    }
}

/// Reservations an unreachable node keeps: two, so that one relay dying leaves the
/// node reachable while the next is found.
pub const DEFAULT_RELAYS: usize = 2;

/// How long a relay that failed (reservation refused, connection lost) is first not
/// asked again; each further failure doubles it, up to [`RELAY_BACKOFF_MAX`], and an
/// accepted reservation forgets it. Short, because the spare a node needs when its relay
/// dies may be one that refused it while its own status was still settling.
pub const RELAY_BACKOFF: Duration = Duration::from_secs(5);
/// How long a relay that did not carry a dial-back to us is asked only last.
pub const RELAY_DISTRUST: Duration = Duration::from_secs(10 * 60);
/// The longest a failing relay is left alone.
pub const RELAY_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Whether `address` names a host and a TCP or UDP port and no relay: one a peer can
/// dial straight.
pub fn is_direct_dialable(address: &Multiaddr) -> bool {
    let mut host = false;
    let mut port = false;
    for protocol in address.iter() {
        match protocol {
            Protocol::Ip4(_)
            | Protocol::Ip6(_)
            | Protocol::Dns(_)
            | Protocol::Dns4(_)
            | Protocol::Dns6(_) => host = true,
            Protocol::Tcp(_) | Protocol::Udp(_) => port = true,
            Protocol::P2pCircuit => return false,
            _ => {}
        }
    }
    host && port
}

/// The relay `address` goes through: the peer id just before `/p2p-circuit`.
pub fn relay_of(address: &Multiaddr) -> Option<PeerId> {
    let mut last_peer = None;
    for protocol in address.iter() {
        match protocol {
            Protocol::P2p(peer) => last_peer = Some(peer),
            Protocol::P2pCircuit => return last_peer,
            _ => {}
        }
    }
    None
}

/// Most addresses the peer manager dials one peer at.
pub const MESH_DIAL_ADDRESSES: usize = 4;

/// The addresses the peer manager dials a peer at, from those it knows: direct ones only
/// (a relayed connection for the mesh's sake holds a relay's circuit), each once, at
/// most [`MESH_DIAL_ADDRESSES`], in the order known.
pub fn mesh_dial_addresses(known: Vec<Multiaddr>) -> Vec<Multiaddr> {
    let mut direct: Vec<Multiaddr> = Vec::new();
    for address in known {
        if !is_relayed(&address) && !direct.contains(&address) {
            direct.push(address);
        }
    }
    direct.truncate(MESH_DIAL_ADDRESSES);
    direct
}

/// Whether `address` goes through a relay.
pub fn is_relayed(address: &Multiaddr) -> bool {
    address.iter().any(|p| p == Protocol::P2pCircuit)
}

/// AutoNAT's verdicts folded into one status.
#[derive(Debug, Default)]
pub struct Reachability {
    mode: ReachabilityMode,
    /// Confirmed external addresses that are direct (a relayed one proves nothing).
    confirmed: BTreeSet<Multiaddr>,
    failed_probes: u32,
}

impl Reachability {
    pub fn new(mode: ReachabilityMode) -> Self {
        Reachability {
            mode,
            ..Self::default()
        }
    }

    pub fn status(&self) -> NatStatus {
        match self.mode {
            ReachabilityMode::Public => NatStatus::Public,
            ReachabilityMode::Private => NatStatus::Private,
            ReachabilityMode::Auto if !self.confirmed.is_empty() => NatStatus::Public,
            ReachabilityMode::Auto if self.failed_probes > 0 => NatStatus::Private,
            ReachabilityMode::Auto => NatStatus::Unknown,
        }
    }

    /// A peer dialled `address` back (libp2p confirmed it as external).
    pub fn confirmed(&mut self, address: &Multiaddr) {
        if !is_relayed(address) {
            self.confirmed.insert(address.clone());
        }
    }

    pub fn expired(&mut self, address: &Multiaddr) {
        self.confirmed.remove(address);
    }

    /// A peer could not dial `address`, a candidate address of ours, back. Only a
    /// direct address with a host and a port says anything about us: peers also report
    /// what they saw over relayed connections (`/p2p/<us>`, circuits), and a failed
    /// probe of that made a public node behind no NAT call itself private (and stop
    /// relaying) whenever it came before the first confirmation. Returns whether the
    /// failure counted.
    pub fn probe_failed(&mut self, address: &Multiaddr) -> bool {
        if !is_direct_dialable(address) {
            return false;
        }
        self.failed_probes = self.failed_probes.saturating_add(1);
        true
    }

    pub fn confirmed_addresses(&self) -> impl Iterator<Item = &Multiaddr> {
        self.confirmed.iter()
    }
}

/// A connected peer that offers to relay (its identify lists the hop protocol).
#[derive(Clone, Debug, PartialEq)]
pub struct RelayCandidate {
    pub peer: PeerId,
    /// Where we are connected to it directly.
    pub address: Multiaddr,
    pub rtt: Option<Duration>,
}

#[derive(Clone, Debug)]
struct HeldRelay {
    listener: ListenerId,
    /// The relay's own address (without `/p2p-circuit`).
    address: Multiaddr,
    reserved: bool,
}

/// The relays a node holds (or asked for) reservations on.
#[derive(Debug, Default)]
pub struct RelaySet {
    wanted: usize,
    held: BTreeMap<PeerId, HeldRelay>,
    /// Relays that failed: until when they wait, and the wait after their next failure.
    backoff: HashMap<PeerId, (Instant, Duration)>,
    /// Relays through which a peer could not dial us, until when they are asked only
    /// after every other candidate.
    distrusted: HashMap<PeerId, Instant>,
}

impl RelaySet {
    pub fn new(wanted: usize) -> Self {
        RelaySet {
            wanted,
            ..Self::default()
        }
    }

    /// From `candidates`, the relays to ask next: lowest round trip first, a relay on a
    /// host (IP address) we do not already use before one on the same host, none still
    /// backed off after failing, a distrusted one only when nothing else is left, no
    /// more than are missing.
    pub fn choose(&self, mut candidates: Vec<RelayCandidate>, now: Instant) -> Vec<RelayCandidate> {
        let missing = self.missing();
        candidates.retain(|c| {
            !self.held.contains_key(&c.peer)
                && self
                    .backoff
                    .get(&c.peer)
                    .is_none_or(|&(until, _)| now >= until)
                && !is_relayed(&c.address)
        });
        candidates.sort_by(|a, b| match (a.rtt, b.rtt) {
            (Some(x), Some(y)) => x.cmp(&y).then(a.peer.cmp(&b.peer)),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => a.peer.cmp(&b.peer),
        });
        let mut hosts: BTreeSet<String> = self
            .held
            .values()
            .filter_map(|h| host(&h.address))
            .collect();
        let mut chosen = Vec::new();
        // Trusted relays on new hosts, trusted ones anywhere, then the distrusted alike.
        for (trusted, new_hosts) in [(true, true), (true, false), (false, true), (false, false)] {
            for candidate in &candidates {
                if chosen.len() >= missing {
                    return chosen;
                }
                if self.is_distrusted(&candidate.peer, now) == trusted
                    || chosen
                        .iter()
                        .any(|c: &RelayCandidate| c.peer == candidate.peer)
                {
                    continue;
                }
                let host = host(&candidate.address);
                if new_hosts && host.as_ref().is_some_and(|h| hosts.contains(h)) {
                    continue;
                }
                hosts.extend(host);
                chosen.push(candidate.clone());
            }
        }
        chosen
    }

    /// A peer could not dial us through `peer`'s relay: asked only last for
    /// [`RELAY_DISTRUST`]. Returns the listener of the reservation to give up, if held.
    pub fn distrust(&mut self, peer: PeerId, now: Instant) -> Option<ListenerId> {
        self.distrusted.insert(peer, now + RELAY_DISTRUST);
        self.listener_of(&peer)
    }

    fn is_distrusted(&self, peer: &PeerId, now: Instant) -> bool {
        self.distrusted.get(peer).is_some_and(|&until| now < until)
    }

    /// Relays distrusted now.
    pub fn distrusted_relays(&self, now: Instant) -> Vec<PeerId> {
        let mut peers: Vec<PeerId> = self
            .distrusted
            .iter()
            .filter(|(_, &until)| now < until)
            .map(|(peer, _)| *peer)
            .collect();
        peers.sort();
        peers
    }

    /// Reservations wanted and neither held nor asked for.
    pub fn missing(&self) -> usize {
        self.wanted.saturating_sub(self.held.len())
    }

    /// We asked `peer` for a reservation through `listener`.
    pub fn requested(&mut self, peer: PeerId, address: Multiaddr, listener: ListenerId) {
        self.held.insert(
            peer,
            HeldRelay {
                listener,
                address,
                reserved: false,
            },
        );
    }

    /// The relay accepted (or renewed) our reservation.
    pub fn reserved(&mut self, peer: &PeerId) {
        if let Some(held) = self.held.get_mut(peer) {
            held.reserved = true;
            self.backoff.remove(peer);
        }
    }

    /// The relay behind `listener` is gone (refused, disconnected, closed): backed off.
    /// Returns the relay's peer id when the listener was one of ours.
    pub fn listener_closed(&mut self, listener: ListenerId, now: Instant) -> Option<PeerId> {
        let peer = *self
            .held
            .iter()
            .find(|(_, held)| held.listener == listener)?
            .0;
        self.held.remove(&peer);
        let wait = self
            .backoff
            .get(&peer)
            .map_or(RELAY_BACKOFF, |&(_, next)| next);
        self.backoff
            .insert(peer, (now + wait, (wait * 2).min(RELAY_BACKOFF_MAX)));
        Some(peer)
    }

    /// Forgets every relay (the node became reachable); returns their listeners to close.
    pub fn release_all(&mut self) -> Vec<ListenerId> {
        std::mem::take(&mut self.held)
            .into_values()
            .map(|held| held.listener)
            .collect()
    }

    /// The listener of `peer`'s reservation, if we hold or asked for one there.
    pub fn listener_of(&self, peer: &PeerId) -> Option<ListenerId> {
        self.held.get(peer).map(|held| held.listener)
    }

    pub fn holds(&self, peer: &PeerId) -> bool {
        self.held.contains_key(peer)
    }

    /// Relays whose reservation was accepted, as `/…/p2p/<relay>` addresses.
    pub fn reserved_relays(&self) -> Vec<Multiaddr> {
        self.held
            .iter()
            .filter(|(_, held)| held.reserved)
            .map(|(peer, held)| held.address.clone().with(Protocol::P2p(*peer)))
            .collect()
    }
}

/// The IP address of `address`, as text, if it has one.
fn host(address: &Multiaddr) -> Option<String> {
    address.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(ip.to_string()),
        Protocol::Ip6(ip) => Some(ip.to_string()),
        Protocol::Dns(name) | Protocol::Dns4(name) | Protocol::Dns6(name) => Some(name.to_string()),
        _ => None,
    })
}

/// The addresses to put in adverts, at most `limit`: relayed ones first while
/// unreachable (the private ones are no use to anyone else), then confirmed external
/// ones, then what we listen on.
pub fn advertised(
    status: NatStatus,
    listening: &[Multiaddr],
    confirmed: &[Multiaddr],
    limit: usize,
) -> Vec<Multiaddr> {
    let (relayed, direct): (Vec<&Multiaddr>, Vec<&Multiaddr>) =
        listening.iter().partition(|a| is_relayed(a));
    let mut ordered: Vec<&Multiaddr> = Vec::new();
    if status == NatStatus::Private {
        ordered.extend(&relayed);
    }
    ordered.extend(confirmed);
    ordered.extend(&direct);
    ordered.extend(&relayed);
    let mut seen = BTreeSet::new();
    ordered
        .into_iter()
        .filter(|a| seen.insert((*a).clone()))
        .take(limit)
        .cloned()
        .collect()
}

/// Relayed addresses of one advert dialled at most, one after another: an advert may
/// list 16 addresses, and a provider that lists 16 dead relays must not hold a gateway
/// for 16 dial waits before it fails over (a node keeps at most 8 relays, 2 by default).
pub const MAX_RELAYED_TRIES: usize = 3;

/// The dials `MeshHandle::dial_advertised` makes for an advert's `addresses`, in order:
/// each entry is dialled together, then waited on. Direct addresses form one entry;
/// each relayed one (at most [`MAX_RELAYED_TRIES`]) its own. The direct entry comes
/// first unless the advert lists a relayed address first (its node says it is
/// unreachable directly). Unparsable addresses are skipped.
pub fn dial_tries(addresses: &[String]) -> Vec<Vec<Multiaddr>> {
    let parsed: Vec<Multiaddr> = addresses.iter().filter_map(|a| a.parse().ok()).collect();
    let relayed_first = parsed.first().is_some_and(is_relayed);
    let (relayed, direct): (Vec<Multiaddr>, Vec<Multiaddr>) =
        parsed.into_iter().partition(is_relayed);
    let mut tries: Vec<Vec<Multiaddr>> = relayed
        .into_iter()
        .take(MAX_RELAYED_TRIES)
        .map(|a| vec![a])
        .collect();
    if !direct.is_empty() {
        let at = if relayed_first { tries.len() } else { 0 };
        tries.insert(at, direct);
    }
    tries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> Multiaddr {
        text.parse().unwrap()
    }

    fn candidate(ip: &str, rtt_ms: Option<u64>) -> RelayCandidate {
        RelayCandidate {
            peer: PeerId::random(),
            address: addr(&format!("/ip4/{ip}/tcp/4001")),
            rtt: rtt_ms.map(Duration::from_millis),
        }
    }

    #[test]
    fn status_follows_the_mode_and_the_probes() {
        let mut auto = Reachability::new(ReachabilityMode::Auto);
        assert_eq!(auto.status(), NatStatus::Unknown);
        // What a peer saw over a relayed connection is no address of ours to test.
        for seen in [
            "/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN",
            "/ip4/10.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit",
            "/ip4/10.0.0.1",
        ] {
            assert!(!auto.probe_failed(&addr(seen)), "{seen}");
        }
        assert_eq!(auto.status(), NatStatus::Unknown);
        assert!(auto.probe_failed(&addr("/ip4/10.0.0.1/tcp/4001")));
        assert_eq!(auto.status(), NatStatus::Private);
        // A relayed address proves nothing about ourselves.
        auto.confirmed(&addr("/ip4/10.0.0.1/tcp/4001/p2p-circuit"));
        assert_eq!(auto.status(), NatStatus::Private);
        let public = addr("/ip4/10.0.0.9/tcp/4001");
        auto.confirmed(&public);
        assert_eq!(auto.status(), NatStatus::Public);
        auto.expired(&public);
        assert_eq!(auto.status(), NatStatus::Private);
        let mut forced = Reachability::new(ReachabilityMode::Private);
        forced.confirmed(&public);
        assert_eq!(forced.status(), NatStatus::Private);
        assert_eq!(
            Reachability::new(ReachabilityMode::Public).status(),
            NatStatus::Public
        );
    }

    #[test]
    fn relays_are_chosen_by_round_trip_and_spread_over_hosts() {
        let now = Instant::now();
        let mut set = RelaySet::new(2);
        let near = candidate("10.0.0.2", Some(1));
        let near_same_host = candidate("10.0.0.2", Some(2));
        let far = candidate("10.0.0.3", Some(40));
        let unmeasured = candidate("10.0.0.4", None);
        let chosen = set.choose(
            vec![
                unmeasured.clone(),
                far.clone(),
                near_same_host.clone(),
                near.clone(),
            ],
            now,
        );
        assert_eq!(chosen, vec![near.clone(), far.clone()]);
        // With only one host on offer, both places still fill.
        let chosen = set.choose(vec![near_same_host.clone(), near.clone()], now);
        assert_eq!(chosen, vec![near.clone(), near_same_host.clone()]);
        // Held relays count, and are not chosen twice.
        set.requested(near.peer, near.address.clone(), ListenerId::next());
        let chosen = set.choose(vec![near.clone(), near_same_host.clone(), far.clone()], now);
        assert_eq!(chosen, vec![far.clone()]);
        // A relayed connection is no place for a reservation.
        let mut relayed = candidate("10.0.0.5", Some(0));
        relayed.address = addr("/ip4/10.0.0.5/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit");
        assert!(set.choose(vec![relayed], now).is_empty());
    }

    #[test]
    fn a_failed_relay_is_backed_off_and_replaced() {
        let now = Instant::now();
        let mut set = RelaySet::new(1);
        let first = candidate("10.0.0.2", Some(1));
        let second = candidate("10.0.0.3", Some(5));
        let listener = ListenerId::next();
        assert_eq!(set.missing(), 1);
        set.requested(first.peer, first.address.clone(), listener);
        assert_eq!(set.missing(), 0);
        assert!(
            set.choose(vec![second.clone()], now).is_empty(),
            "one is enough"
        );
        set.reserved(&first.peer);
        assert_eq!(
            set.reserved_relays(),
            vec![first.address.clone().with(Protocol::P2p(first.peer))]
        );
        assert_eq!(set.listener_closed(ListenerId::next(), now), None);
        assert_eq!(set.listener_closed(listener, now), Some(first.peer));
        assert!(set.reserved_relays().is_empty());
        let chosen = set.choose(vec![first.clone(), second.clone()], now);
        assert_eq!(chosen, vec![second.clone()], "the failed one waits");
        let later = now + RELAY_BACKOFF;
        assert_eq!(set.choose(vec![first.clone()], later), vec![first.clone()]);
        // Failing again doubles the wait, up to the cap; an accepted reservation
        // forgets the failures.
        let mut at = later;
        for wait in [2, 4, 8, 12, 12].map(|k| RELAY_BACKOFF * k) {
            let listener = ListenerId::next();
            set.requested(first.peer, first.address.clone(), listener);
            assert_eq!(set.listener_closed(listener, at), Some(first.peer));
            assert!(set
                .choose(vec![first.clone()], at + wait - Duration::from_millis(1))
                .is_empty());
            at += wait;
            assert_eq!(set.choose(vec![first.clone()], at), vec![first.clone()]);
        }
        let listener = ListenerId::next();
        set.requested(first.peer, first.address.clone(), listener);
        set.reserved(&first.peer);
        set.listener_closed(listener, at);
        assert_eq!(
            set.choose(vec![first.clone()], at + RELAY_BACKOFF),
            vec![first.clone()]
        );
        set.requested(second.peer, second.address.clone(), listener);
        assert_eq!(set.release_all(), vec![listener]);
        assert!(!set.holds(&second.peer));
    }

    #[test]
    fn a_relay_that_did_not_carry_a_dial_back_is_given_up_and_asked_last() {
        let now = Instant::now();
        let mut set = RelaySet::new(1);
        let liar = candidate("10.0.0.2", Some(1));
        let honest = candidate("10.0.0.3", Some(30));
        let listener = ListenerId::next();
        set.requested(liar.peer, liar.address.clone(), listener);
        set.reserved(&liar.peer);
        assert_eq!(set.distrust(liar.peer, now), Some(listener));
        assert_eq!(set.distrusted_relays(now), vec![liar.peer]);
        assert_eq!(set.listener_closed(listener, now), Some(liar.peer));
        // Past its backoff, the faster liar still comes after the honest relay...
        let later = now + RELAY_BACKOFF;
        assert_eq!(
            set.choose(vec![liar.clone(), honest.clone()], later),
            vec![honest.clone()]
        );
        // ...is taken when nothing else is left...
        assert_eq!(set.choose(vec![liar.clone()], later), vec![liar.clone()]);
        // ...and is trusted again after RELAY_DISTRUST.
        let forgiven = now + RELAY_DISTRUST;
        assert!(set.distrusted_relays(forgiven).is_empty());
        assert_eq!(
            set.choose(vec![liar.clone(), honest.clone()], forgiven),
            vec![liar.clone()]
        );
        // Distrusting a relay we do not hold gives up nothing.
        assert_eq!(set.distrust(honest.peer, now), None);
    }

    #[test]
    fn the_relay_of_a_relayed_address_is_the_peer_before_the_circuit() {
        let relay: PeerId = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
            .parse()
            .unwrap();
        let us = PeerId::random();
        let through = addr(&format!(
            "/ip4/10.0.0.2/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{us}"
        ));
        assert_eq!(relay_of(&through), Some(relay));
        assert_eq!(
            relay_of(&addr(&format!("/ip4/10.0.0.2/tcp/4001/p2p/{relay}"))),
            None
        );
        assert_eq!(relay_of(&addr("/ip4/10.0.0.2/tcp/4001/p2p-circuit")), None);
    }

    #[test]
    fn the_peer_manager_dials_direct_addresses_only() {
        let relayed = addr("/ip4/10.0.0.2/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit");
        let direct = addr("/ip4/10.0.0.3/tcp/4001");
        let memory = addr("/memory/77");
        assert_eq!(
            mesh_dial_addresses(vec![
                relayed.clone(),
                direct.clone(),
                direct.clone(),
                memory.clone()
            ]),
            vec![direct.clone(), memory]
        );
        assert!(mesh_dial_addresses(vec![relayed]).is_empty());
        let many: Vec<Multiaddr> = (0..9)
            .map(|i| addr(&format!("/ip4/10.1.0.{i}/tcp/4001")))
            .collect();
        assert_eq!(
            mesh_dial_addresses(many.clone()),
            many[..MESH_DIAL_ADDRESSES]
        );
    }

    #[test]
    fn adverts_put_relayed_addresses_first_only_while_unreachable() {
        let private = addr("/ip4/192.168.3.2/tcp/4001");
        let relayed = addr("/ip4/10.0.0.2/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit");
        let external = addr("/ip4/10.0.0.7/tcp/4001");
        let listening = [private.clone(), relayed.clone()];
        assert_eq!(
            advertised(NatStatus::Private, &listening, &[], 16),
            vec![relayed.clone(), private.clone()]
        );
        assert_eq!(
            advertised(
                NatStatus::Public,
                &listening,
                &[external.clone(), private.clone()],
                16
            ),
            vec![external.clone(), private.clone(), relayed.clone()]
        );
        let many: Vec<Multiaddr> = (0..40)
            .map(|i| addr(&format!("/ip4/10.1.0.{i}/tcp/4001")))
            .collect();
        let mut listening = many.clone();
        listening.push(relayed.clone());
        let capped = advertised(NatStatus::Private, &listening, &[], 16);
        assert_eq!(capped.len(), 16);
        assert_eq!(capped[0], relayed, "the relayed address survives the cap");
    }

    #[test]
    fn adverts_are_dialled_direct_together_and_a_bounded_number_of_relays_in_turn() {
        let relay = |i: usize| {
            format!("/ip4/10.0.0.{i}/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit")
        };
        let direct = [
            "/ip4/192.168.1.2/tcp/4001".to_owned(),
            "/ip4/10.1.0.1/tcp/4001".to_owned(),
        ];
        // A public node's advert: its direct addresses at once, then its relays.
        let mut public: Vec<String> = direct.to_vec();
        public.push(relay(1));
        let tries = dial_tries(&public);
        assert_eq!(tries.len(), 2);
        assert_eq!(tries[0].len(), 2);
        assert!(is_relayed(&tries[1][0]));
        // A private node's: relays first, one at a time, and no more than the bound,
        // however many it lists; garbage is skipped.
        let mut private: Vec<String> = (1..=14).map(relay).collect();
        private.extend(direct.iter().cloned());
        private.push("not an address".into());
        let tries = dial_tries(&private);
        assert_eq!(tries.len(), MAX_RELAYED_TRIES + 1);
        assert!(tries[..MAX_RELAYED_TRIES]
            .iter()
            .all(|t| t.len() == 1 && is_relayed(&t[0])));
        assert_eq!(tries[MAX_RELAYED_TRIES].len(), 2);
        assert!(dial_tries(&[]).is_empty());
    }
}
