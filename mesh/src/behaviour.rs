//! The composed libp2p behaviour: gating first (connection limits), then discovery
//! (identify, Kademlia, optional mDNS), liveness (ping), dissemination (gossipsub),
//! reachability (AutoNAT v2, circuit relay v2 server and client, DCUtR hole punching;
//! off in in-process simulations) and the token-stream protocol (libp2p-stream).

use std::time::Duration;

use libp2p::gossipsub::{self, IdentTopic, MessageAuthenticity, ValidationMode};
use libp2p::kad::{self, store::MemoryStore, store::MemoryStoreConfig};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{
    allow_block_list, autonat, connection_limits, dcutr, identify, identity, mdns, ping, relay,
    StreamProtocol,
};
use sha2::{Digest as _, Sha256};
use sharemesh_protocol::{GossipTopic, StreamName};

/// Token streams between buyer and provider.
pub const INFER_PROTOCOL: StreamProtocol = StreamProtocol::new(StreamName::Infer.id());
pub const QUOTE_PROTOCOL: StreamProtocol = StreamProtocol::new(StreamName::Quote.id());
pub const MODEL_HEADER_PROTOCOL: StreamProtocol = StreamProtocol::new(StreamName::ModelHeader.id());
pub const SETTLE_PROTOCOL: StreamProtocol = StreamProtocol::new(StreamName::Settle.id());
pub const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new(StreamName::Kademlia.id());
pub const IDENTIFY_PROTOCOL: &str = StreamName::Identify.id();

pub fn adverts_topic() -> IdentTopic {
    IdentTopic::new(GossipTopic::Adverts.name())
}
pub fn attestations_topic() -> IdentTopic {
    IdentTopic::new(GossipTopic::Attestations.name())
}
pub fn reputation_topic() -> IdentTopic {
    IdentTopic::new(GossipTopic::Reputation.name())
}
pub fn fraud_proofs_topic() -> IdentTopic {
    IdentTopic::new(GossipTopic::FraudProofs.name())
}

#[derive(NetworkBehaviour)]
pub struct Behaviour {
    pub limits: connection_limits::Behaviour,
    /// Peers the operator (or a partition scenario) cut off: no connection either way.
    pub blocked: allow_block_list::Behaviour<allow_block_list::BlockedPeers>,
    pub identify: identify::Behaviour,
    pub ping: ping::Behaviour,
    pub kad: kad::Behaviour<MemoryStore>,
    pub gossipsub: gossipsub::Behaviour,
    pub mdns: Toggle<mdns::tokio::Behaviour>,
    /// Asks peers to dial our candidate addresses back: a confirmed one means we are
    /// publicly reachable there.
    pub autonat_client: Toggle<autonat::v2::client::Behaviour>,
    /// Our relayed addresses, proposed as candidates so that AutoNAT tests them.
    pub candidates: crate::candidates::AddressCandidates,
    /// Dials back the candidate addresses peers ask us to test.
    pub autonat_server: Toggle<autonat::v2::server::Behaviour>,
    /// Relays circuits for unreachable peers, within [`RelayLimits`], while this node is
    /// reachable itself (the event loop sets its status).
    pub relay_server: Toggle<relay::Behaviour>,
    /// Reservations on relays and circuits through them, when we are unreachable.
    pub relay_client: Toggle<relay::client::Behaviour>,
    /// Upgrades a relayed connection to a direct one by hole punching.
    pub dcutr: Toggle<dcutr::Behaviour>,
    pub stream: libp2p_stream::Behaviour,
}

/// What a relay server grants. A relayed connection is meant to carry a job until hole
/// punching makes it direct, or a whole job where punching cannot work (symmetric NAT):
/// bounded so that a relay is not free transit beyond that (SPEC §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelayLimits {
    /// Reservations held at once, in all and per peer.
    pub max_reservations: usize,
    pub max_reservations_per_peer: usize,
    pub reservation_duration: Duration,
    /// Circuits open at once, in all and per peer.
    pub max_circuits: usize,
    pub max_circuits_per_peer: usize,
    /// A circuit is closed after this long or this many bytes (both directions).
    pub max_circuit_duration: Duration,
    pub max_circuit_bytes: u64,
}

impl Default for RelayLimits {
    fn default() -> Self {
        Self {
            max_reservations: 64,
            max_reservations_per_peer: 2,
            reservation_duration: Duration::from_secs(30 * 60),
            max_circuits: 32,
            max_circuits_per_peer: 4,
            // A job of a few thousand tokens with its signed segments and receipts is
            // some hundreds of KiB; libp2p's 128 KiB default cut jobs mid-stream.
            max_circuit_duration: Duration::from_secs(10 * 60),
            max_circuit_bytes: 4 << 20,
        }
    }
}

impl RelayLimits {
    fn relay_config(&self) -> relay::Config {
        relay::Config {
            max_reservations: self.max_reservations,
            max_reservations_per_peer: self.max_reservations_per_peer,
            reservation_duration: self.reservation_duration,
            max_circuits: self.max_circuits,
            max_circuits_per_peer: self.max_circuits_per_peer,
            max_circuit_duration: self.max_circuit_duration,
            max_circuit_bytes: self.max_circuit_bytes,
            // libp2p's rate limits per peer and per IP address stay.
            ..relay::Config::default()
        }
    }
}

/// Knobs that tests and testnets shorten (libp2p's timers ignore tokio's paused clock).
#[derive(Clone, Debug)]
pub struct BehaviourConfig {
    pub max_connections: u32,
    pub heartbeat: Duration,
    pub mdns: bool,
    /// AutoNAT, relaying and hole punching (`None`: off, as in simulations).
    pub traversal: Option<TraversalConfig>,
}

/// Which reachability pieces run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraversalConfig {
    /// Serve as a relay while reachable (`None`: never).
    pub relay_server: Option<RelayLimits>,
}

fn gossipsub_config(heartbeat: Duration) -> Result<gossipsub::Config, String> {
    gossipsub::ConfigBuilder::default()
        .heartbeat_interval(heartbeat)
        // Every payload is a signed envelope that our validation checks; a second
        // signature by the libp2p key doubled the ed25519 work per delivery (the
        // largest CPU cost of a many-node mesh), so gossip messages are anonymous.
        .validation_mode(ValidationMode::Anonymous)
        // Under load a relay may lag; an advert lives for minutes, so late beats lost
        // (the default drops forwards queued for more than 1 s).
        .forward_queue_duration(Duration::from_secs(30))
        .publish_queue_duration(Duration::from_secs(30))
        // Messages wait for our verdict (signature, expiry, sequence) before forwarding.
        .validate_messages()
        .max_transmit_size(128 * 1024)
        // Content-addressed ids: the same signed advert relayed twice is one message.
        .message_id_fn(|message: &gossipsub::Message| {
            gossipsub::MessageId::from(Sha256::digest(&message.data).to_vec())
        })
        // A message seen again after a minute is dropped by the book's (provider, seq)
        // and the replay guard's sequence checks anyway; every id kept is memory on
        // every node (libp2p's default, 60 s; was 120).
        .duplicate_cache_time(Duration::from_secs(60))
        // Each mesh peer is one more copy of every advert to receive, decrypt and
        // decode; libp2p's upper bound (12) let meshes grow to twice the degree (6).
        // At 200 simulated nodes and one advert per provider per 5 s (single runs on
        // the same 2-core host): 78% delivered; with the lighter publishing and gossip
        // below 84%; with bounds [4, 8] 96%. With the churn fixed the host's CPU was
        // the limit again (every copy costs a noise frame, a yamux frame, a protobuf
        // decode and a timer): degree 5 within [4, 6] took seed 2 from 0.975 to 0.9996.
        .mesh_n(5)
        .mesh_n_low(4)
        .mesh_n_high(6)
        // The publisher's mesh suffices; flooding sent every advert to every peer.
        .flood_publish(false)
        // IHAVE to 3 peers about the last 2 heartbeats (defaults 6 and 3): the mesh
        // delivers over reliable streams, gossip only repairs.
        .gossip_lazy(3)
        .history_gossip(2)
        // Full messages kept for IWANT answers: 3 heartbeats (default 5), one more
        // than the IHAVE window; each node holds every message it saw in that window.
        .history_length(3)
        .build()
        .map_err(|e| e.to_string())
}

/// Peer scoring (gossipsub v1.1), tuned for adverts: a provider publishes a few per
/// minute, so delivery-rate penalties (P3) are off; invalid messages (P4) — forged,
/// expired, replayed or oversized adverts — cost heavily and decay slowly, so a peer
/// that relays garbage is graylisted after a handful.
fn peer_score() -> (gossipsub::PeerScoreParams, gossipsub::PeerScoreThresholds) {
    let mut params = gossipsub::PeerScoreParams::default();
    for topic in [
        adverts_topic(),
        attestations_topic(),
        reputation_topic(),
        fraud_proofs_topic(),
    ] {
        let topic_params = gossipsub::TopicScoreParams {
            topic_weight: 1.0,
            time_in_mesh_weight: 0.01,
            time_in_mesh_quantum: Duration::from_secs(1),
            time_in_mesh_cap: 100.0,
            first_message_deliveries_weight: 1.0,
            first_message_deliveries_decay: 0.9,
            first_message_deliveries_cap: 50.0,
            mesh_message_deliveries_weight: 0.0,
            mesh_failure_penalty_weight: 0.0,
            invalid_message_deliveries_weight: -100.0,
            invalid_message_deliveries_decay: 0.99,
            ..gossipsub::TopicScoreParams::default()
        };
        params.topics.insert(topic.hash(), topic_params);
    }
    params.app_specific_weight = 1.0;
    // A "slow peer" is one whose queued messages expired before they were sent; but a
    // queue also backs up when the local process is starved and its connection tasks
    // run late, and a node must never penalise a peer for its own lateness. A peer
    // that is really slow only loses the messages it could not take (IHAVE/IWANT
    // repairs them).
    params.slow_peer_weight = 0.0;
    let thresholds = gossipsub::PeerScoreThresholds {
        gossip_threshold: -100.0,
        publish_threshold: -200.0,
        graylist_threshold: -400.0,
        accept_px_threshold: 10.0,
        opportunistic_graft_threshold: 5.0,
    };
    (params, thresholds)
}

/// The behaviour; `relay_client` comes from the swarm builder, which pairs it with the
/// relay transport (present exactly when `config.traversal` is).
pub fn build(
    key: &identity::Keypair,
    config: &BehaviourConfig,
    relay_client: Option<relay::client::Behaviour>,
) -> Result<Behaviour, String> {
    let peer_id = key.public().to_peer_id();
    let traversal = config.traversal;
    let limits = connection_limits::ConnectionLimits::default()
        .with_max_established(Some(config.max_connections))
        // A direct connection, a relayed one until hole punching closes it, an AutoNAT
        // dial-back, and a second dial to reach an AutoNAT server: with 2, a dial-back
        // to a peer already connected twice was refused, and the peer believed itself
        // unreachable (seen on loopback under load).
        .with_max_established_per_peer(Some(4))
        .with_max_pending_incoming(Some(config.max_connections))
        .with_max_pending_outgoing(Some(config.max_connections));
    let mut gossipsub = gossipsub::Behaviour::new(
        MessageAuthenticity::Anonymous,
        gossipsub_config(config.heartbeat)?,
    )?;
    let (params, thresholds) = peer_score();
    gossipsub.with_peer_score(params, thresholds)?;
    // Kademlia's default store keeps 20 providers per key: far too few for a market.
    let store = MemoryStore::with_config(
        peer_id,
        MemoryStoreConfig {
            max_providers_per_key: 10_000,
            max_provided_keys: 1024,
            ..MemoryStoreConfig::default()
        },
    );
    let mut kad_config = kad::Config::new(KAD_PROTOCOL);
    kad_config.set_query_timeout(Duration::from_secs(30));
    // The event loop adds peers itself (`learn_address`): an automatic insert into a
    // full bucket would dial a disconnected peer to test it, and with the peer
    // manager's pruning that kept connections churning.
    kad_config.set_kbucket_inserts(kad::BucketInserts::Manual);
    // A bootstrap is a lookup per bucket, some nine lookups and ~180 new connections at
    // 200 nodes; libp2p's default, every 5 minutes on every node, was most of the steady
    // connection churn of a 200-node mesh. The event loop runs its own every half hour.
    kad_config.set_periodic_bootstrap_interval(None);
    // Nor one whenever a peer joins a table of fewer than 20: when 200 simulated nodes
    // joined together on a starved host those lookups, slowed by the CPU they took and
    // cut by pruning, ran for minutes — about 1,100 lookups and most of the ~100 new
    // connections per node per minute. A node short of peers takes one random walk
    // instead (the peer manager). (The setter is public in the patched copy only.)
    kad_config.set_automatic_bootstrap_throttle(None);
    let kad = kad::Behaviour::with_config(peer_id, store, kad_config);
    let mdns = if config.mdns {
        Some(
            mdns::tokio::Behaviour::new(mdns::Config::default(), peer_id)
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    Ok(Behaviour {
        limits: connection_limits::Behaviour::new(limits),
        blocked: allow_block_list::Behaviour::default(),
        identify: identify::Behaviour::new(
            identify::Config::new(IDENTIFY_PROTOCOL.into(), key.public())
                .with_agent_version(format!("sharemesh/{}", env!("CARGO_PKG_VERSION"))),
        ),
        ping: ping::Behaviour::new(ping::Config::new().with_interval(Duration::from_secs(5))),
        kad,
        gossipsub,
        mdns: mdns.into(),
        autonat_client: traversal
            .map(|_| autonat::v2::client::Behaviour::default())
            .into(),
        candidates: crate::candidates::AddressCandidates::default(),
        autonat_server: traversal
            .map(|_| autonat::v2::server::Behaviour::default().with_local_peer_id(peer_id))
            .into(),
        relay_server: traversal
            .and_then(|t| t.relay_server)
            .map(|limits| {
                let mut server = relay::Behaviour::new(peer_id, limits.relay_config());
                // libp2p would serve as soon as any external address is confirmed, a
                // relayed one included; the event loop serves only while reachable.
                server.set_status(Some(relay::Status::Disable));
                server
            })
            .into(),
        relay_client: relay_client.into(),
        dcutr: traversal.map(|_| dcutr::Behaviour::new(peer_id)).into(),
        stream: libp2p_stream::Behaviour::new(),
    })
}
