//! The event loop's peer manager: keeps the peer count within its band, dials known
//! peers (a random walk when too few are known), and keeps Kademlia's routing table
//! fresh without the liveness checks that churned connections.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use libp2p::kad;
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::{Multiaddr, PeerId};
use rand::seq::SliceRandom;

use super::EventLoop;
use crate::peer_targets::LATE_ROUND;

/// How often the node refreshes its whole Kademlia routing table.
const BOOTSTRAP_EVERY: Duration = Duration::from_secs(30 * 60);

impl EventLoop {
    /// Peer manager: keep the peer count within its band (`PeerTargets`) — prune the
    /// lowest-scored settled peers above it, dial known peers below the target — and
    /// drop peers whose gossip score fell below the graylist threshold. `late`: how late
    /// this round started; a late round runs on a stale view and only dials.
    pub(super) fn maintain(&mut self, late: Duration) {
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
        for (peer, addresses) in candidates {
            if self.dial_budget() == 0 {
                break;
            }
            self.dial_new(peer, DialOpts::peer_id(peer).addresses(addresses).build());
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

    /// Known peers that are neither connected nor being dialled, with their direct
    /// addresses: the address book's (where we reached them) and the Kademlia routing
    /// table's. A peer known only at relayed addresses is left out: a connection kept
    /// for the mesh's sake would hold one of its relay's few circuits (SPEC §8), and a
    /// NATed peer dials out to the mesh itself; job streams still reach it through its
    /// relays (`dial_advertised`).
    pub(super) fn dial_candidates(&mut self) -> Vec<(PeerId, Vec<Multiaddr>)> {
        let mut candidates: HashMap<PeerId, Vec<Multiaddr>> = HashMap::new();
        for address in self.address_book.addresses() {
            if let (Some(peer), _) = crate::split_peer(&address) {
                candidates.entry(peer).or_default().push(address);
            }
        }
        for bucket in self.swarm.behaviour_mut().kad.kbuckets() {
            for entry in bucket.iter() {
                let known = candidates.entry(*entry.node.key.preimage()).or_default();
                known.extend(entry.node.value.iter().cloned());
            }
        }
        candidates
            .into_iter()
            .filter(|(peer, _)| {
                peer != self.swarm.local_peer_id()
                    && !self.swarm.is_connected(peer)
                    && !self.dialing.contains(peer)
            })
            .filter_map(|(peer, known)| {
                let direct = crate::reachability::mesh_dial_addresses(known);
                (!direct.is_empty()).then_some((peer, direct))
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
    pub(super) fn learn_address(&mut self, peer: PeerId, address: Multiaddr) {
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
    pub(super) fn dial_budget(&self) -> usize {
        self.peer_targets
            .dial_count(self.swarm.connected_peers().count(), self.dialing.len())
    }

    /// Dials `peer` unless it is connected or already being dialled.
    pub(super) fn dial_new(&mut self, peer: PeerId, opts: DialOpts) {
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
