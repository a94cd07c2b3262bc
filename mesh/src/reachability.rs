//! Whether others can reach this node, and the relays it keeps while they cannot
//! (SPEC §8). Pure bookkeeping: the event loop feeds it what AutoNAT, identify and the
//! relay client report and acts on what it answers; time is an argument.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

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
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// Addresses the operator says the node is reachable at (`--external-address`, a
    /// port forward or a 1:1 NAT): candidates for AutoNAT, and confirmed once peers on
    /// [`REACHED_BY_HOSTS`] hosts dialled us and observed us there.
    pub external: Vec<Multiaddr>,
}

impl NatConfig {
    /// Off: what in-process simulations and most tests run.
    pub const OFF: NatConfig = NatConfig {
        enabled: false,
        mode: ReachabilityMode::Auto,
        relays: 0,
        relay_server: None,
        external: Vec::new(),
    };

    /// What a real node runs unless told otherwise: AutoNAT, two relays when
    /// unreachable, a relay server when reachable.
    pub fn on() -> Self {
        NatConfig {
            enabled: true,
            mode: ReachabilityMode::Auto,
            relays: DEFAULT_RELAYS,
            relay_server: Some(RelayLimits::default()),
            external: Vec::new(),
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

/// The IP address `address` starts with, if any.
pub fn host_of(address: &Multiaddr) -> Option<IpAddr> {
    match address.iter().next()? {
        Protocol::Ip4(ip) => Some(ip.into()),
        Protocol::Ip6(ip) => Some(ip.into()),
        _ => None,
    }
}

/// An address no host on the public internet reaches straight: private (RFC 1918),
/// shared (RFC 6598, carrier-grade NAT), loopback, link-local, IPv6 unique-local.
pub fn is_private_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| is_private_ip(v4.into()))
        }
    }
}
/// Whether `address` goes through a relay.
pub fn is_relayed(address: &Multiaddr) -> bool {
    address.iter().any(|p| p == Protocol::P2pCircuit)
}

/// Distinct hosts (IP addresses) that must have dialled an address of ours straight
/// and seen us there before it counts as reachable without AutoNAT.
pub const REACHED_BY_HOSTS: usize = 2;
/// Addresses of ours whose reaching hosts are remembered (the rest are not counted).
const MAX_REACHED_ADDRESSES: usize = 16;

/// AutoNAT's verdicts, and what peers that dialled us showed, folded into one status.
#[derive(Debug, Default)]
pub struct Reachability {
    mode: ReachabilityMode,
    /// Confirmed external addresses that are direct (a relayed one proves nothing).
    confirmed: BTreeSet<Multiaddr>,
    failed_probes: u32,
    /// Our direct addresses that peers dialled straight, with the hosts they came from
    /// (at most [`REACHED_BY_HOSTS`] each).
    reached: BTreeMap<Multiaddr, BTreeSet<IpAddr>>,
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

    /// An external address of ours expired: confirming it again takes new evidence
    /// (the hosts that reached it before are forgotten).
    pub fn expired(&mut self, address: &Multiaddr) {
        self.confirmed.remove(address);
        self.reached.remove(address);
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

    /// A peer on host `from` opened a direct connection to us, arriving at `at` (the
    /// connection's local address, or an address the operator says is ours), and
    /// observed us there too (identify). AutoNAT v2 asks only peers a node dialled, so a
    /// node that everyone dials and that can dial none of them back (the one public
    /// node of a network whose others sit behind NAT) would never learn it is
    /// reachable; peers on [`REACHED_BY_HOSTS`] hosts reaching it prove it. Behind a
    /// NAT, peers observe the router's address, never the node's own, so a NATed node
    /// that a hole punch reached is not fooled. Returns whether `at` is newly
    /// confirmed by this (the caller confirms it as an external address).
    ///
    /// Observations are a peer's claim: a peer that reached a NATed node straight (a
    /// hole punch lands on its listening port) could echo the node's own private
    /// address back. So a host on the public internet never confirms a private
    /// address (honestly, it can reach one only through a NAT, and then it observes
    /// the router); hosts on the node's own private network still do, for that network.
    pub fn reached(&mut self, at: &Multiaddr, from: IpAddr) -> bool {
        if !is_direct_dialable(at) || self.confirmed.contains(at) {
            return false;
        }
        if host_of(at).is_some_and(is_private_ip) && !is_private_ip(from) {
            return false;
        }
        if !self.reached.contains_key(at) && self.reached.len() >= MAX_REACHED_ADDRESSES {
            return false;
        }
        let hosts = self.reached.entry(at.clone()).or_default();
        if hosts.len() < REACHED_BY_HOSTS {
            hosts.insert(from);
        }
        hosts.len() >= REACHED_BY_HOSTS
    }

    pub fn confirmed_addresses(&self) -> impl Iterator<Item = &Multiaddr> {
        self.confirmed.iter()
    }
}

/// The addresses to put in adverts, at most `limit`: while unreachable only relayed
/// ones (what it listens on directly is a private address nobody else can dial: an
/// advert of none says "not reachable yet", and buyers wait for the next), else
/// confirmed external ones, then what we listen on.
pub fn advertised(
    status: NatStatus,
    listening: &[Multiaddr],
    confirmed: &[Multiaddr],
    limit: usize,
) -> Vec<Multiaddr> {
    let (relayed, direct): (Vec<&Multiaddr>, Vec<&Multiaddr>) =
        listening.iter().partition(|a| is_relayed(a));
    if status == NatStatus::Private {
        return relayed.into_iter().take(limit).cloned().collect();
    }
    let mut ordered: Vec<&Multiaddr> = Vec::new();
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
            vec![relayed.clone()]
        );
        // Unreachable and no relay yet: nothing a buyer could dial.
        assert!(advertised(NatStatus::Private, std::slice::from_ref(&private), &[], 16).is_empty());
        assert_eq!(
            advertised(NatStatus::Unknown, &listening, &[], 16),
            vec![private.clone(), relayed.clone()]
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
        let capped = advertised(NatStatus::Unknown, &listening, &[], 16);
        assert_eq!(capped.len(), 16);
        assert_eq!(
            advertised(NatStatus::Private, &listening, &[], 16),
            [relayed]
        );
    }

    #[test]
    fn peers_on_two_hosts_reaching_an_address_straight_confirm_it() {
        let mut auto = Reachability::new(ReachabilityMode::Auto);
        let listen = addr("/ip4/10.0.0.2/tcp/4001");
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.3".parse().unwrap(), "10.0.0.4".parse().unwrap());
        assert!(!auto.reached(&listen, a));
        assert!(!auto.reached(&listen, a), "the same host twice is one host");
        assert_eq!(auto.status(), NatStatus::Unknown);
        assert!(auto.reached(&listen, b));
        auto.confirmed(&listen);
        assert_eq!(auto.status(), NatStatus::Public);
        assert!(
            !auto.reached(&listen, "10.0.0.5".parse().unwrap()),
            "already confirmed"
        );
        // Only a direct address with a host and a port counts.
        let circuit = addr("/ip4/10.0.0.2/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit");
        assert!(!auto.reached(&circuit, a) && !auto.reached(&circuit, b));
        // Bounded: addresses past the limit are not counted.
        let mut flooded = Reachability::new(ReachabilityMode::Auto);
        for i in 0..MAX_REACHED_ADDRESSES {
            flooded.reached(&addr(&format!("/ip4/10.2.0.{i}/tcp/1")), a);
        }
        let late = addr("/ip4/10.3.0.1/tcp/1");
        assert!(!flooded.reached(&late, a) && !flooded.reached(&late, b));
        // An expired address needs new evidence.
        let mut again = Reachability::new(ReachabilityMode::Auto);
        assert!(!again.reached(&listen, a) && again.reached(&listen, b));
        again.confirmed(&listen);
        again.expired(&listen);
        assert_eq!(again.status(), NatStatus::Unknown);
        assert!(!again.reached(&listen, b), "the hosts before are forgotten");
        assert!(again.reached(&listen, a));
    }

    /// Attack: two internet hosts that reached a NATed node straight (a hole punch on
    /// its listening port) echo its private address back as what they observed, to
    /// make it call itself public and give up its relays. They are not counted; hosts
    /// of its own private network, and any host for a public address, are.
    #[test]
    fn internet_hosts_cannot_confirm_a_private_address() {
        let mut behind_nat = Reachability::new(ReachabilityMode::Auto);
        let private = addr("/ip4/192.168.1.20/tcp/4001");
        let (x, y): (IpAddr, IpAddr) = (
            "203.0.113.7".parse().unwrap(),
            "198.51.100.9".parse().unwrap(),
        );
        assert!(!behind_nat.reached(&private, x) && !behind_nat.reached(&private, y));
        assert_eq!(behind_nat.status(), NatStatus::Unknown);
        let cgnat = addr("/ip4/100.64.3.4/tcp/4001");
        assert!(!behind_nat.reached(&cgnat, x) && !behind_nat.reached(&cgnat, y));
        let ula = addr("/ip6/fd00::5/tcp/4001");
        let (v6x, v6y): (IpAddr, IpAddr) = (
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
        );
        assert!(!behind_nat.reached(&ula, v6x) && !behind_nat.reached(&ula, v6y));
        let lan: [IpAddr; 2] = [
            "192.168.1.5".parse().unwrap(),
            "192.168.1.6".parse().unwrap(),
        ];
        assert!(!behind_nat.reached(&private, lan[0]) && behind_nat.reached(&private, lan[1]));
        let public = addr("/ip4/198.51.100.20/tcp/4001");
        assert!(!behind_nat.reached(&public, x) && behind_nat.reached(&public, lan[0]));
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
