//! The relays a node behind NAT holds reservations on (SPEC §8): which candidates to
//! ask (round trip, host diversity, backoff after failures, distrust after a failed
//! dial-back through them) and what is held. Pure bookkeeping; time is an argument.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use libp2p::core::transport::ListenerId;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};

use crate::reachability::is_relayed;

/// How long a relay that failed (reservation refused, connection lost) is first not
/// asked again; each further failure doubles it, up to [`RELAY_BACKOFF_MAX`], and an
/// accepted reservation forgets it. Short, because the spare a node needs when its relay
/// dies may be one that refused it while its own status was still settling.
pub const RELAY_BACKOFF: Duration = Duration::from_secs(5);
/// How long a relay that did not carry a dial-back to us is asked only last.
pub const RELAY_DISTRUST: Duration = Duration::from_secs(10 * 60);
/// The longest a failing relay is left alone.
pub const RELAY_BACKOFF_MAX: Duration = Duration::from_secs(60);

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
}
