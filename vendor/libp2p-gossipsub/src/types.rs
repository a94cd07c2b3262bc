// Copyright 2020 Sigma Prime Pty Ltd.
//
// Permission is hereby granted, free of charge, to any person obtaining a
// copy of this software and associated documentation files (the "Software"),
// to deal in the Software without restriction, including without limitation
// the rights to use, copy, modify, merge, publish, distribute, sublicense,
// and/or sell copies of the Software, and to permit persons to whom the
// Software is furnished to do so, subject to the following conditions:
//
// The above copyright notice and this permission notice shall be included in
// all copies or substantial portions of the Software.
//
// THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS
// OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
// FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
// AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
// LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING
// FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
// DEALINGS IN THE SOFTWARE.

//! A collection of types using the Gossipsub system.
use std::{
    collections::BTreeSet,
    fmt::{self, Debug},
};

use futures_timer::Delay;
use hashlink::LinkedHashMap;
use libp2p_identity::PeerId;
use libp2p_swarm::ConnectionId;
use prost::Message as _;
#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};
use web_time::Instant;

use crate::{TopicHash, queue::Queue, rpc_proto::proto};

/// Messages that have expired while attempting to be sent to a peer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FailedMessages {
    /// The number of messages that were failed to be sent to the priority queue as it was
    /// full.
    pub priority: usize,
    /// The number of messages that were failed to be sent to the non priority queue as it was
    /// full.
    pub non_priority: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
/// Validation kinds from the application for received messages.
pub enum MessageAcceptance {
    /// The message is considered valid, and it should be delivered and forwarded to the network.
    Accept,
    /// The message is considered invalid, and it should be rejected and trigger the P₄ penalty.
    Reject,
    /// The message is neither delivered nor forwarded to the network, but the router does not
    /// trigger the P₄ penalty.
    Ignore,
}

#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub Vec<u8>);

impl MessageId {
    pub fn new(value: &[u8]) -> Self {
        Self(value.to_vec())
    }
}

impl<T: Into<Vec<u8>>> From<T> for MessageId {
    fn from(value: T) -> Self {
        Self(value.into())
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", hex_fmt::HexFmt(&self.0))
    }
}

impl std::fmt::Debug for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MessageId({})", hex_fmt::HexFmt(&self.0))
    }
}

#[derive(Debug)]
/// Connected peer details.
pub(crate) struct PeerDetails {
    /// The kind of protocol the peer supports.
    pub(crate) kind: PeerKind,
    /// The Extensions supported by the peer if any.
    pub(crate) extensions: Option<Extensions>,
    /// If the peer is an outbound connection.
    pub(crate) outbound: bool,
    /// Its current connections.
    pub(crate) connections: Vec<ConnectionId>,
    /// Subscribed topics.
    pub(crate) topics: BTreeSet<TopicHash>,
    /// Don't send messages.
    pub(crate) dont_send: LinkedHashMap<MessageId, Instant>,
    /// Message queue consumed by the connection handler.
    pub(crate) messages: Queue,
}

/// Describes the types of peers that can exist in the gossipsub context.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Hash, Eq)]
#[cfg_attr(
    feature = "metrics",
    derive(prometheus_client::encoding::EncodeLabelValue)
)]
pub enum PeerKind {
    /// The peer doesn't support any of the protocols.
    NotSupported,
    /// A floodsub peer.
    Floodsub,
    /// A gossipsub 1.0 peer.
    Gossipsub,
    /// A gossipsub 1.1 peer.
    Gossipsubv1_1,
    /// A gossipsub 1.2 peer.
    Gossipsubv1_2,
    /// A gossipsub 1.3 peer.
    Gossipsubv1_3,
}

/// A message received by the gossipsub system and stored locally in caches..
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RawMessage {
    /// Id of the peer that published this message.
    pub source: Option<PeerId>,

    /// Content of the message. Its meaning is out of scope of this library.
    pub data: Vec<u8>,

    /// A random sequence number.
    pub sequence_number: Option<u64>,

    /// The topic this message belongs to
    pub topic: TopicHash,

    /// The signature of the message if it's signed.
    pub signature: Option<Vec<u8>>,

    /// The public key of the message if it is signed and the source [`PeerId`] cannot be inlined.
    pub key: Option<Vec<u8>>,

    /// Flag indicating if this message has been validated by the application or not.
    pub validated: bool,
}

impl fmt::Debug for RawMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawMessage")
            .field("source", &self.source)
            .field("data length", &self.data.len())
            .field("sequence_number", &self.sequence_number)
            .field("topic", &self.topic)
            .field("signature", &self.signature)
            .field("key", &self.key)
            .field("validated", &self.validated)
            .finish()
    }
}

impl PeerKind {
    /// Returns true if peer speaks any gossipsub version.
    pub(crate) fn is_gossipsub(&self) -> bool {
        matches!(
            self,
            Self::Gossipsubv1_3 | Self::Gossipsubv1_2 | Self::Gossipsubv1_1 | Self::Gossipsub
        )
    }
}

impl RawMessage {
    /// Calculates the encoded length of this message (used for calculating metrics).
    pub fn raw_protobuf_len(&self) -> usize {
        let message = proto::Message {
            from: self.source.map(|m| m.to_bytes()),
            data: Some(self.data.clone()),
            seqno: self.sequence_number.map(|s| s.to_be_bytes().to_vec()),
            topic: TopicHash::into_string(self.topic.clone()),
            signature: self.signature.clone(),
            key: self.key.clone(),
        };
        message.encoded_len()
    }
}

impl From<RawMessage> for proto::Message {
    fn from(raw: RawMessage) -> Self {
        proto::Message {
            from: raw.source.map(|m| m.to_bytes()),
            data: Some(raw.data),
            seqno: raw.sequence_number.map(|s| s.to_be_bytes().to_vec()),
            topic: TopicHash::into_string(raw.topic),
            signature: raw.signature,
            key: raw.key,
        }
    }
}

/// The message sent to the user after a [`RawMessage`] has been transformed by a
/// [`crate::DataTransform`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Message {
    /// Id of the peer that published this message.
    pub source: Option<PeerId>,

    /// Content of the message.
    pub data: Vec<u8>,

    /// A random sequence number.
    pub sequence_number: Option<u64>,

    /// The topic this message belongs to
    pub topic: TopicHash,
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("data", &format_args!("{:<20}", hex_fmt::HexFmt(&self.data)))
            .field("source", &self.source)
            .field("sequence_number", &self.sequence_number)
            .field("topic", &self.topic)
            .finish()
    }
}

/// A subscription received by the gossipsub system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subscription {
    /// Action to perform.
    pub action: SubscriptionAction,
    /// The topic from which to subscribe or unsubscribe.
    pub topic_hash: TopicHash,
    /// Partial options.
    pub options: SubscriptionOpts,
}

/// Action that a subscription wants to perform.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SubscriptionAction {
    /// The remote wants to subscribe to the given topic.
    Subscribe,
    /// The remote wants to unsubscribe from the given topic.
    Unsubscribe,
}

/// Partial options when subscribing a topic.
#[derive(Debug, Default, Copy, Clone, PartialEq, Eq, Hash)]
pub struct SubscriptionOpts {
    pub(crate) requests_partial: bool,
    pub(crate) supports_partial: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PeerInfo {
    pub(crate) peer_id: Option<PeerId>,
    // TODO add this when RFC: Signed Address Records got added to the spec (see pull request
    // https://github.com/libp2p/specs/pull/217)
    // pub signed_peer_record: ?,
}

/// A Control message received by the gossipsub system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ControlAction {
    /// Node broadcasts known messages per topic - IHave control message.
    IHave(IHave),
    /// The node requests specific message ids (peer_id + sequence _number) - IWant control
    /// message.
    IWant(IWant),
    /// The node has been added to the mesh - Graft control message.
    Graft(Graft),
    /// The node has been removed from the mesh - Prune control message.
    Prune(Prune),
    /// The node requests us to not forward message ids (peer_id + sequence _number) - IDontWant
    /// control message.
    IDontWant(IDontWant),
    /// The Node has sent us its supported extensions.
    Extensions(Option<Extensions>),
}

/// Node broadcasts known messages per topic - IHave control message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IHave {
    /// The topic of the messages.
    pub(crate) topic_hash: TopicHash,
    /// A list of known message ids (peer_id + sequence _number) as a string.
    pub(crate) message_ids: Vec<MessageId>,
}

/// The node requests specific message ids (peer_id + sequence _number) - IWant control message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IWant {
    /// A list of known message ids (peer_id + sequence _number) as a string.
    pub(crate) message_ids: Vec<MessageId>,
}

/// The node has been added to the mesh - Graft control message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Graft {
    /// The mesh topic the peer should be added to.
    pub(crate) topic_hash: TopicHash,
}

/// The node has been removed from the mesh - Prune control message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Prune {
    /// The mesh topic the peer should be removed from.
    pub(crate) topic_hash: TopicHash,
    /// A list of peers to be proposed to the removed peer as peer exchange
    pub(crate) peers: Vec<PeerInfo>,
    /// The backoff time in seconds before we allow to reconnect
    pub(crate) backoff: Option<u64>,
}

/// The node requests us to not forward message ids - IDontWant control message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IDontWant {
    /// A list of known message ids.
    pub(crate) message_ids: Vec<MessageId>,
}

/// The node has sent us the supported Gossipsub Extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extensions {
    pub(crate) partial_messages: Option<bool>,
}

/// A Gossipsub RPC message sent.
#[derive(Debug)]
pub enum RpcOut {
    /// Publish a Gossipsub message on network.`timeout` limits the duration the message
    /// can wait to be sent before it is abandoned. This can be both a message originating
    /// from this node, or a forwarded message.
    Publish {
        message_id: MessageId,
        message: RawMessage,
        timeout: Delay,
    },
    /// Subscribe a topic.
    Subscribe {
        topic: TopicHash,
        requests_partial: bool,
        supports_partial: bool,
    },
    /// Subscribe to multiple topics in a single RPC (hello packet on new connection).
    SubscribeMany(Vec<(TopicHash, bool, bool)>),
    /// Unsubscribe a topic.
    Unsubscribe(TopicHash),
    /// Send a GRAFT control message.
    Graft(Graft),
    /// Send a PRUNE control message.
    Prune(Prune),
    /// Send a IHave control message.
    IHave(IHave),
    /// Send a IWant control message.
    IWant(IWant),
    /// The node requests us to not forward message ids (peer_id + sequence _number) - IDontWant
    /// control message.
    IDontWant(IDontWant),
    /// Send a Extensions control message.
    Extensions(Extensions),
    /// Send a test extension message.
    TestExtension,
    /// Send a partial messages extension.
    #[cfg(feature = "partial-messages")]
    PartialMessage(crate::partial_messages::PartialMessage),
}

impl RpcOut {
    /// Converts the GossipsubRPC into its protobuf format.
    // A convenience function to avoid explicitly specifying types.
    pub fn into_protobuf(self) -> proto::Rpc {
        self.into()
    }

    /// Returns true if the `RpcOut` is priority.
    pub(crate) fn priority(&self) -> bool {
        matches!(
            self,
            RpcOut::Subscribe { .. }
                | RpcOut::SubscribeMany(_)
                | RpcOut::Unsubscribe(_)
                | RpcOut::Graft(_)
                | RpcOut::Prune(_)
                | RpcOut::IDontWant(_)
        )
    }
}

impl From<RpcOut> for proto::Rpc {
    /// Converts the RPC into protobuf format.
    fn from(rpc: RpcOut) -> Self {
        match rpc {
            RpcOut::Publish { message, .. } => proto::Rpc {
                subscriptions: Vec::new(),
                publish: vec![message.into()],
                control: None,
                partial: None,
            },
            RpcOut::Subscribe {
                topic,
                requests_partial,
                supports_partial,
            } => proto::Rpc {
                publish: Vec::new(),
                subscriptions: vec![proto::SubOpts {
                    subscribe: Some(true),
                    topic_id: Some(topic.into_string()),
                    requests_partial: Some(requests_partial),
                    supports_partial: Some(supports_partial),
                }],
                control: None,
                partial: None,
            },
            RpcOut::SubscribeMany(topics) => proto::Rpc {
                publish: Vec::new(),
                subscriptions: topics
                    .into_iter()
                    .map(
                        |(topic, requests_partial, supports_partial)| proto::SubOpts {
                            subscribe: Some(true),
                            topic_id: Some(topic.into_string()),
                            requests_partial: Some(requests_partial),
                            supports_partial: Some(supports_partial),
                        },
                    )
                    .collect(),
                control: None,
                partial: None,
            },
            RpcOut::Unsubscribe(topic) => proto::Rpc {
                publish: Vec::new(),
                subscriptions: vec![proto::SubOpts {
                    subscribe: Some(false),
                    topic_id: Some(topic.into_string()),
                    requests_partial: None,
                    supports_partial: None,
                }],
                control: None,
                partial: None,
            },
            RpcOut::IHave(IHave {
                topic_hash,
                message_ids,
            }) => proto::Rpc {
                publish: Vec::new(),
                subscriptions: Vec::new(),
                control: Some(proto::ControlMessage {
                    ihave: vec![proto::ControlIHave {
                        topic_id: Some(topic_hash.into_string()),
                        message_ids: message_ids.into_iter().map(|msg_id| msg_id.0).collect(),
                    }],
                    iwant: vec![],
                    graft: vec![],
                    prune: vec![],
                    idontwant: vec![],
                    extensions: None,
                }),
                partial: None,
            },
            RpcOut::IWant(IWant { message_ids }) => proto::Rpc {
                publish: Vec::new(),
                subscriptions: Vec::new(),
                control: Some(proto::ControlMessage {
                    ihave: vec![],
                    iwant: vec![proto::ControlIWant {
                        message_ids: message_ids.into_iter().map(|msg_id| msg_id.0).collect(),
                    }],
                    graft: vec![],
                    prune: vec![],
                    idontwant: vec![],
                    extensions: None,
                }),
                partial: None,
            },
            RpcOut::Graft(Graft { topic_hash }) => proto::Rpc {
                publish: Vec::new(),
                subscriptions: vec![],
                control: Some(proto::ControlMessage {
                    ihave: vec![],
                    iwant: vec![],
                    graft: vec![proto::ControlGraft {
                        topic_id: Some(topic_hash.into_string()),
                    }],
                    prune: vec![],
                    idontwant: vec![],
                    extensions: None,
                }),
                partial: None,
            },
            RpcOut::Prune(Prune {
                topic_hash,
                peers,
                backoff,
            }) => {
                proto::Rpc {
                    publish: Vec::new(),
                    subscriptions: vec![],
                    control: Some(proto::ControlMessage {
                        ihave: vec![],
                        iwant: vec![],
                        graft: vec![],
                        prune: vec![proto::ControlPrune {
                            topic_id: Some(topic_hash.into_string()),
                            peers: peers
                                .into_iter()
                                .map(|info| proto::PeerInfo {
                                    peer_id: info.peer_id.map(|id| id.to_bytes()),
                                    // TODO, see https://github.com/libp2p/specs/pull/217
                                    signed_peer_record: None,
                                })
                                .collect(),
                            backoff,
                        }],
                        idontwant: vec![],
                        extensions: None,
                    }),
                    partial: None,
                }
            }
            RpcOut::IDontWant(IDontWant { message_ids }) => proto::Rpc {
                publish: Vec::new(),
                subscriptions: Vec::new(),
                control: Some(proto::ControlMessage {
                    ihave: vec![],
                    iwant: vec![],
                    graft: vec![],
                    prune: vec![],
                    idontwant: vec![proto::ControlIDontWant {
                        message_ids: message_ids.into_iter().map(|msg_id| msg_id.0).collect(),
                    }],
                    extensions: None,
                }),
                partial: None,
            },
            RpcOut::Extensions(Extensions { partial_messages }) => proto::Rpc {
                publish: Vec::new(),
                subscriptions: Vec::new(),
                control: Some(proto::ControlMessage {
                    ihave: vec![],
                    iwant: vec![],
                    graft: vec![],
                    prune: vec![],
                    idontwant: vec![],
                    extensions: Some(proto::ControlExtensions { partial_messages }),
                }),
                partial: None,
            },
            RpcOut::TestExtension => proto::Rpc {
                subscriptions: vec![],
                publish: vec![],
                control: None,
                partial: None,
            },
            #[cfg(feature = "partial-messages")]
            RpcOut::PartialMessage(crate::partial_messages::PartialMessage {
                topic_hash,
                group_id,
                metadata,
                body,
            }) => proto::Rpc {
                subscriptions: vec![],
                publish: vec![],
                control: None,
                partial: Some(proto::PartialMessagesExtension {
                    topic_id: Some(topic_hash.as_str().as_bytes().to_vec()),
                    group_id: Some(group_id),
                    partial_message: body,
                    parts_metadata: metadata,
                }),
            },
        }
    }
}

/// A Gossipsub RPC message received.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RpcIn {
    /// List of messages that were part of this RPC query.
    pub messages: Vec<RawMessage>,
    /// List of subscriptions.
    pub subscriptions: Vec<Subscription>,
    /// List of Gossipsub control messages.
    pub control_msgs: Vec<ControlAction>,
    /// Partial messages extension.
    #[cfg(feature = "partial-messages")]
    pub partial_message: Option<crate::extensions::partial_messages::PartialMessage>,
}

impl fmt::Debug for RpcIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut b = f.debug_struct("GossipsubRpc");
        if !self.messages.is_empty() {
            b.field("messages", &self.messages);
        }
        if !self.subscriptions.is_empty() {
            b.field("subscriptions", &self.subscriptions);
        }
        if !self.control_msgs.is_empty() {
            b.field("control_msgs", &self.control_msgs);
        }
        #[cfg(feature = "partial-messages")]
        b.field("partial_messages", &self.partial_message);

        b.finish()
    }
}

impl PeerKind {
    pub fn as_static_ref(&self) -> &'static str {
        match self {
            Self::NotSupported => "Not Supported",
            Self::Floodsub => "Floodsub",
            Self::Gossipsub => "Gossipsub v1.0",
            Self::Gossipsubv1_1 => "Gossipsub v1.1",
            Self::Gossipsubv1_2 => "Gossipsub v1.2",
            Self::Gossipsubv1_3 => "Gossipsub v1.3",
        }
    }
}

impl AsRef<str> for PeerKind {
    fn as_ref(&self) -> &str {
        self.as_static_ref()
    }
}

impl fmt::Display for PeerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::PeerKind;
    #[test]
    fn peerkind_gossipsub_version_ord() {
        assert!(
            PeerKind::Gossipsubv1_3 > PeerKind::Gossipsubv1_2
                && PeerKind::Gossipsubv1_2 > PeerKind::Gossipsubv1_1
                && PeerKind::Gossipsubv1_1 > PeerKind::Gossipsub
                && PeerKind::Gossipsub > PeerKind::Floodsub
                && PeerKind::Gossipsub > PeerKind::NotSupported
        );
    }
}
