//! The task that owns the swarm.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use libp2p::gossipsub::{self, MessageAcceptance};
use libp2p::kad::{self, RecordKey};
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::{identify, ping, Multiaddr, PeerId, Swarm};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::behaviour::{self, Behaviour, BehaviourEvent};
use super::orderbook::OrderBook;
use super::{AddressBook, Command, MeshEvent, PeerInfo};
use crate::clock::now_ms;

/// State the event loop keeps current for the handle to read without a command.
pub(super) struct SharedViews {
    pub book: Arc<RwLock<OrderBook>>,
    pub listen_addrs: Arc<RwLock<Vec<Multiaddr>>>,
    pub live: super::LivePeers,
}

pub(super) struct EventLoop {
    swarm: Swarm<Behaviour>,
    inbox: mpsc::Receiver<Command>,
    events: broadcast::Sender<MeshEvent>,
    book: Arc<RwLock<OrderBook>>,
    listen_addrs: Arc<RwLock<Vec<Multiaddr>>>,
    /// Connected peers and their last ping round trip, readable without a command.
    live: super::LivePeers,
    address_book: AddressBook,
    target_peers: usize,
    rtt: HashMap<PeerId, Duration>,
    agents: HashMap<PeerId, String>,
    addresses: HashMap<PeerId, Multiaddr>,
    pending_providers: HashMap<kad::QueryId, (Vec<PeerId>, oneshot::Sender<Vec<PeerId>>)>,
}

impl EventLoop {
    pub(super) fn new(
        swarm: Swarm<Behaviour>,
        inbox: mpsc::Receiver<Command>,
        events: broadcast::Sender<MeshEvent>,
        views: SharedViews,
        address_book: AddressBook,
        target_peers: usize,
    ) -> Self {
        let SharedViews {
            book,
            listen_addrs,
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
            target_peers,
            rtt: HashMap::new(),
            agents: HashMap::new(),
            addresses: HashMap::new(),
            pending_providers: HashMap::new(),
        }
    }

    pub(super) async fn run(mut self) {
        let mut maintenance = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                command = self.inbox.recv() => match command {
                    Some(command) => self.on_command(command),
                    // Every handle dropped: the node is shutting down.
                    None => return,
                },
                _ = maintenance.tick() => self.maintain(),
            }
        }
    }

    fn emit(&self, event: MeshEvent) {
        // Nobody listening is fine.
        let _ = self.events.send(event);
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Publish { topic, data, reply } => {
                let result = match self.swarm.behaviour_mut().gossipsub.publish(topic, data) {
                    Ok(_) => Ok(()),
                    // Alone on the network is not an error: the next publish reaches peers.
                    Err(gossipsub::PublishError::NoPeersSubscribedToTopic) => Ok(()),
                    Err(err) => Err(anyhow::anyhow!("publish failed: {err}")),
                };
                let _ = reply.send(result);
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
                            .addresses
                            .get(peer)
                            .map(|a| vec![a.to_string()])
                            .unwrap_or_default(),
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
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::info!(%address, "listening");
                if let Ok(mut addrs) = self.listen_addrs.write() {
                    addrs.push(address.clone());
                }
                self.emit(MeshEvent::Listening(address));
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                endpoint,
                num_established,
                ..
            } => {
                let address = endpoint.get_remote_address().clone();
                if endpoint.is_dialer() {
                    self.address_book
                        .remember(&address.clone().with_p2p(peer_id).unwrap_or(address.clone()));
                    self.swarm
                        .behaviour_mut()
                        .kad
                        .add_address(&peer_id, address.clone());
                }
                self.addresses.insert(peer_id, address);
                if num_established.get() == 1 {
                    if let Ok(mut live) = self.live.write() {
                        live.insert(peer_id, None);
                    }
                    tracing::debug!(peer = %peer_id, "connected");
                    self.emit(MeshEvent::PeerConnected(peer_id));
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established,
                ..
            } => {
                if num_established == 0 {
                    self.rtt.remove(&peer_id);
                    if let Ok(mut live) = self.live.write() {
                        live.remove(&peer_id);
                    }
                    self.addresses.remove(&peer_id);
                    self.emit(MeshEvent::PeerDisconnected(peer_id));
                }
            }
            SwarmEvent::Behaviour(event) => self.on_behaviour_event(event),
            _ => {}
        }
    }

    #[allow(clippy::collapsible_match)]
    fn on_behaviour_event(&mut self, event: BehaviourEvent) {
        match event {
            BehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. }) => {
                // Kademlia does not learn addresses by itself: feed it what identify saw.
                for address in info.listen_addrs {
                    self.swarm
                        .behaviour_mut()
                        .kad
                        .add_address(&peer_id, address);
                }
                self.agents.insert(peer_id, info.agent_version);
            }
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
                if self.swarm.connected_peers().count() < self.target_peers
                    && !self.swarm.is_connected(&peer)
                {
                    let _ = self.swarm.dial(peer);
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
            BehaviourEvent::Mdns(libp2p::mdns::Event::Discovered(peers)) => {
                for (peer, address) in peers {
                    self.swarm
                        .behaviour_mut()
                        .kad
                        .add_address(&peer, address.clone());
                    let _ = self.swarm.dial(address.with(Protocol::P2p(peer)));
                }
            }
            _ => {}
        }
    }

    fn on_gossip(&mut self, source: PeerId, id: gossipsub::MessageId, message: gossipsub::Message) {
        let adverts = behaviour::adverts_topic().hash();
        let verdict = if message.topic == adverts {
            let offered = match self.book.write() {
                Ok(mut book) => book
                    .offer(&message.data, now_ms())
                    .map_err(|e| e.to_string()),
                Err(_) => Err("order book lock poisoned".to_owned()),
            };
            match offered {
                Ok(provider) => {
                    self.emit(MeshEvent::AdvertAccepted {
                        provider,
                        from: source,
                    });
                    MessageAcceptance::Accept
                }
                Err(reason) => {
                    tracing::debug!(from = %source, %reason, "rejected advert");
                    self.emit(MeshEvent::AdvertRejected {
                        from: source,
                        reason,
                    });
                    MessageAcceptance::Reject
                }
            }
        } else {
            // Attestation and reputation gossip are validated by the trust layer (not
            // yet built): do not forward what nobody checked.
            MessageAcceptance::Ignore
        };
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(&id, &source, verdict);
    }

    /// Peer manager: keep the peer count near its target by pruning the lowest-scored
    /// peers, and drop peers whose gossip score fell below the graylist threshold.
    fn maintain(&mut self) {
        let connected: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        let gossipsub = &self.swarm.behaviour().gossipsub;
        let mut scored: Vec<(PeerId, f64)> = connected
            .iter()
            .map(|p| (*p, gossipsub.peer_score(p).unwrap_or(0.0)))
            .collect();
        scored.sort_by(|a, b| a.1.total_cmp(&b.1));
        let excess = connected.len().saturating_sub(self.target_peers);
        let to_drop: Vec<PeerId> = scored
            .iter()
            .enumerate()
            .filter(|(i, (_, score))| *i < excess || *score < -400.0)
            .map(|(_, (peer, _))| *peer)
            .collect();
        for peer in to_drop {
            tracing::debug!(%peer, "pruning peer");
            let _ = self.swarm.disconnect_peer_id(peer);
        }
        // Below target: look for more peers (a Kademlia random walk; above target it
        // would only dial peers to prune them — with every node of a 50-node mesh doing
        // so every 5 s that churn took both cores), and redial peers we reached before
        // (a restarted peer comes back).
        if connected.len() < self.target_peers {
            if !connected.is_empty() {
                let _ = self.swarm.behaviour_mut().kad.bootstrap();
            }
            for address in self.address_book.addresses() {
                let (peer, _) = super::split_peer(&address);
                if peer.is_some_and(|p| !self.swarm.is_connected(&p)) {
                    let _ = self.swarm.dial(address);
                }
            }
        }
    }
}
