//! How many peers to dial and to prune: the peer manager's arithmetic, kept apart from
//! the swarm so it can be tested on its own.
//!
//! A node dials until it has `target` peers (counting dials still in flight) and
//! accepts inbound connections beyond that up to `prune_above`; only past that band does
//! it prune, and then back down to `target`. Without the band every node sat exactly at
//! its target: each inbound connection was pruned at once, the pruned peer fell below
//! its own target and dialled someone else, who pruned in turn — in a 200-node
//! simulation ~190 new connections per node per minute, each a noise handshake, which
//! took most of the CPU that adverts needed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libp2p::PeerId;

/// A dial that has not connected or failed after this long no longer counts as pending.
const DIAL_PENDING_FOR: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerTargets {
    pub target: usize,
}

impl PeerTargets {
    pub fn new(target: usize) -> Self {
        Self { target }
    }

    /// The most peers kept without pruning: a quarter above target, at least two more.
    pub fn prune_above(&self) -> usize {
        self.target + (self.target / 4).max(2)
    }

    /// Peers to disconnect now (the lowest scored), given how many are connected.
    pub fn prune_count(&self, connected: usize) -> usize {
        if connected > self.prune_above() {
            connected - self.target
        } else {
            0
        }
    }

    /// New dials to start, given connected peers and dials already in flight.
    pub fn dial_count(&self, connected: usize, dialing: usize) -> usize {
        self.target.saturating_sub(connected + dialing)
    }
}

/// How long a new connection is safe from pruning, in wall time *and* in rounds the
/// peer manager ran: a node whose process was starved runs its rounds late, and a
/// connection that opened just before a 12 s stall has had no time to be answered
/// however much wall time passed (Kademlia lookups dial a peer for one request; pruned
/// before it is answered the lookup failed and dialled yet another peer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionAge {
    pub opened: Instant,
    /// The peer manager's round count when it opened.
    pub round: u64,
}

/// Wall time a connection is safe from pruning.
pub const PRUNE_GRACE: Duration = Duration::from_secs(10);
/// Peer-manager rounds a connection is safe from pruning (rounds start ≥ 5 s apart).
pub const PRUNE_GRACE_ROUNDS: u64 = 2;

impl ConnectionAge {
    pub fn settled(&self, now: Instant, round: u64) -> bool {
        now.saturating_duration_since(self.opened) >= PRUNE_GRACE
            && round.saturating_sub(self.round) >= PRUNE_GRACE_ROUNDS
    }
}

/// A peer-manager round that starts this late runs on a stale view (events still
/// queued: dial outcomes, answers, scores): it dials but neither prunes nor forgets
/// pending dials.
pub const LATE_ROUND: Duration = Duration::from_secs(1);

/// Dials in flight, so that a burst of discoveries does not dial past the target.
#[derive(Debug, Default)]
pub struct PendingDials {
    since: HashMap<PeerId, Instant>,
}

impl PendingDials {
    pub fn start(&mut self, peer: PeerId, now: Instant) {
        self.since.insert(peer, now);
    }

    /// The dial connected or failed.
    pub fn finish(&mut self, peer: &PeerId) {
        self.since.remove(peer);
    }

    pub fn contains(&self, peer: &PeerId) -> bool {
        self.since.contains_key(peer)
    }

    /// Forgets dials older than [`DIAL_PENDING_FOR`] (their outcome event never came).
    pub fn expire(&mut self, now: Instant) {
        self.since
            .retain(|_, started| now.saturating_duration_since(*started) < DIAL_PENDING_FOR);
    }

    pub fn len(&self) -> usize {
        self.since.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inbound_peers_within_the_band_are_kept() {
        let targets = PeerTargets::new(12);
        assert_eq!(targets.prune_above(), 15);
        for connected in 0..=15 {
            assert_eq!(targets.prune_count(connected), 0, "{connected} connected");
        }
    }

    #[test]
    fn past_the_band_prunes_back_to_the_target() {
        let targets = PeerTargets::new(12);
        assert_eq!(targets.prune_count(16), 4);
        assert_eq!(targets.prune_count(30), 18);
    }

    #[test]
    fn small_targets_still_have_a_band_of_two() {
        let targets = PeerTargets::new(3);
        assert_eq!(targets.prune_above(), 5);
        assert_eq!(targets.prune_count(5), 0);
        assert_eq!(targets.prune_count(6), 3);
        assert_eq!(PeerTargets::new(0).prune_above(), 2);
    }

    #[test]
    fn dials_in_flight_count_towards_the_target() {
        let targets = PeerTargets::new(12);
        assert_eq!(targets.dial_count(0, 0), 12);
        assert_eq!(targets.dial_count(8, 0), 4);
        assert_eq!(targets.dial_count(8, 3), 1);
        assert_eq!(targets.dial_count(8, 4), 0);
        assert_eq!(targets.dial_count(14, 0), 0);
        assert_eq!(targets.dial_count(3, 20), 0);
    }

    #[test]
    fn a_connection_settles_after_grace_time_and_two_rounds() {
        let opened = Instant::now();
        let age = ConnectionAge { opened, round: 7 };
        let later = opened + PRUNE_GRACE;
        assert!(!age.settled(opened, 9), "no wall time yet");
        assert!(age.settled(later, 9));
        // A 12 s stall: plenty of wall time, but the loop ran only once since.
        let after_stall = opened + Duration::from_secs(12);
        assert!(!age.settled(after_stall, 8));
        assert!(!age.settled(after_stall, 7));
        assert!(age.settled(after_stall + Duration::from_secs(5), 9));
        // A round count from before the connection (never happens) is not a panic.
        assert!(!age.settled(later, 3));
    }

    #[test]
    fn pending_dials_finish_or_expire() {
        let start = Instant::now();
        let (a, b) = (PeerId::random(), PeerId::random());
        let mut pending = PendingDials::default();
        pending.start(a, start);
        pending.start(b, start + Duration::from_secs(10));
        pending.start(a, start);
        assert_eq!(pending.len(), 2);
        pending.finish(&b);
        assert!(!pending.contains(&b));
        pending.expire(start + Duration::from_secs(19));
        assert!(pending.contains(&a));
        pending.expire(start + DIAL_PENDING_FOR);
        assert_eq!(pending.len(), 0);
    }
}
