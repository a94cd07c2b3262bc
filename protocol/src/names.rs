//! The names the mesh speaks under: stream protocol ids and gossip topics. Each carries
//! [`PROTOCOL_VERSION`](crate::PROTOCOL_VERSION), so a version bump renames them all in
//! one place (a test checks every name against the constant).

/// A libp2p stream protocol of the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamName {
    /// Job streams: request, answer, token chunks, receipts (SPEC §6).
    Infer,
    /// Quote round: one request, one signed quote (SPEC §10).
    Quote,
    /// The mesh's own Kademlia DHT, separate from the public IPFS one.
    Kademlia,
    /// libp2p identify.
    Identify,
    /// A model's GGUF header, checked against its id (`model_header`).
    ModelHeader,
    /// Settlement offers: a buyer's binding and newest spending authorisation, answered
    /// with the provider's binding (SPEC §13).
    Settle,
}

impl StreamName {
    pub const ALL: [StreamName; 6] = [
        StreamName::Infer,
        StreamName::Quote,
        StreamName::Kademlia,
        StreamName::Identify,
        StreamName::ModelHeader,
        StreamName::Settle,
    ];

    /// The protocol id, `/sharemesh/<name>/<version>`.
    pub const fn id(self) -> &'static str {
        match self {
            StreamName::Infer => "/sharemesh/infer/2",
            StreamName::Quote => "/sharemesh/quote/2",
            StreamName::Kademlia => "/sharemesh/kad/2",
            StreamName::Identify => "/sharemesh/id/2",
            StreamName::ModelHeader => "/sharemesh/model-header/2",
            StreamName::Settle => "/sharemesh/settle/2",
        }
    }
}

/// A gossipsub topic of the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GossipTopic {
    Adverts,
    Attestations,
    Reputation,
    /// Signed fraud proofs (SPEC.md §12).
    FraudProofs,
}

impl GossipTopic {
    pub const ALL: [GossipTopic; 4] = [
        GossipTopic::Adverts,
        GossipTopic::Attestations,
        GossipTopic::Reputation,
        GossipTopic::FraudProofs,
    ];

    /// The topic name, `sharemesh/<version>/<name>` (gossipsub keeps its own protocol
    /// id; networks are told apart by topic).
    pub const fn name(self) -> &'static str {
        match self {
            GossipTopic::Adverts => "sharemesh/2/adverts",
            GossipTopic::Attestations => "sharemesh/2/attestations",
            GossipTopic::Reputation => "sharemesh/2/reputation",
            GossipTopic::FraudProofs => "sharemesh/2/fraud-proofs",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MessageKind, PROTOCOL_VERSION};

    #[test]
    fn every_name_carries_the_protocol_version() {
        let version = PROTOCOL_VERSION.to_string();
        for stream in StreamName::ALL {
            let id = stream.id();
            assert!(id.starts_with("/sharemesh/"), "{id}");
            assert_eq!(id.rsplit('/').next(), Some(version.as_str()), "{id}");
        }
        for topic in GossipTopic::ALL {
            let name = topic.name();
            assert_eq!(name.split('/').nth(1), Some(version.as_str()), "{name}");
        }
        for kind in [MessageKind::Advert, MessageKind::QuoteRequest] {
            assert_eq!(kind.domain().split('/').nth(1), Some(version.as_str()));
        }
    }
}
