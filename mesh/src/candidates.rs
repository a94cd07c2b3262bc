//! A behaviour that hands the swarm external-address candidates of our own choosing, so
//! that AutoNAT v2 tests them: the relayed addresses our reservations gave us. libp2p's
//! relay client confirms those as external the moment a relay accepts, without a single
//! dial through it; a relay that grants reservations and refuses circuits would keep us
//! unreachable while we advertise it (SPEC §8).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::task::{Context, Poll};

use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::swarm::{
    dummy, ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm,
};
use libp2p::{Multiaddr, PeerId};

/// Candidates queued for the swarm (each announced once).
#[derive(Default)]
pub struct AddressCandidates {
    queued: VecDeque<Multiaddr>,
}

impl AddressCandidates {
    /// Asks the swarm's behaviours (AutoNAT's client) to consider `address` ours.
    pub fn propose(&mut self, address: Multiaddr) {
        self.queued.push_back(address);
    }
}

impl NetworkBehaviour for AddressCandidates {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_established_inbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn handle_established_outbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: Endpoint,
        _: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, _: FromSwarm) {}

    fn on_connection_handler_event(
        &mut self,
        _: PeerId,
        _: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {}
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        match self.queued.pop_front() {
            Some(address) => Poll::Ready(ToSwarm::NewExternalAddrCandidate(address)),
            None => Poll::Pending,
        }
    }
}
