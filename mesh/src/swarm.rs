//! Building the swarm: its transports (TCP and QUIC, or an emulated link over memory or
//! TCP; the relay client's beside them when NAT traversal runs) and its behaviour.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use libp2p::{identity, noise, tcp, yamux, PeerId, Swarm};

use crate::behaviour::{self, Behaviour, BehaviourConfig};
use crate::{link, MeshConfig, MeshTransport};

pub(crate) fn build_swarm(key: identity::Keypair, config: &MeshConfig) -> Result<Swarm<Behaviour>> {
    let behaviour_config = BehaviourConfig {
        max_connections: config.max_connections,
        heartbeat: config.heartbeat,
        mdns: config.mdns,
        traversal: config.nat.traversal(),
    };
    let relayed = behaviour_config.traversal.is_some();
    let behaviour = move |key: &identity::Keypair,
                          relay: Option<libp2p::relay::client::Behaviour>| {
        behaviour::build(key, &behaviour_config, relay).map_err(
            |e| -> Box<dyn std::error::Error + Send + Sync> {
                format!("building the behaviour: {e}").into()
            },
        )
    };
    // The relay client's transport joins the swarm's transports only where traversal
    // runs; the two arms differ in type, hence the macro.
    macro_rules! finish {
        ($builder:expr) => {
            if relayed {
                $builder
                    .with_relay_client(noise::Config::new, yamux::Config::default)?
                    .with_behaviour(|key, relay| behaviour(key, Some(relay)))?
                    .with_swarm_config(swarm_config)
                    .build()
            } else {
                $builder
                    .with_behaviour(|key| behaviour(key, None))?
                    .with_swarm_config(swarm_config)
                    .build()
            }
        };
    }
    let swarm = match &config.transport {
        MeshTransport::Memory { link, counters } => {
            let (link, counters) = (link.clone(), counters.clone());
            finish!(libp2p::SwarmBuilder::with_existing_identity(key)
                .with_tokio()
                .with_other_transport(move |key| {
                    let memory = libp2p::core::transport::MemoryTransport::default();
                    emulated_transport(key, memory, link, counters)
                })?)
        }
        MeshTransport::EmulatedTcp { link, counters } => {
            let (link, counters) = (link.clone(), counters.clone());
            finish!(libp2p::SwarmBuilder::with_existing_identity(key)
                .with_tokio()
                .with_other_transport(move |key| {
                    let tcp = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true));
                    emulated_transport(key, tcp, link, counters)
                })?)
        }
        MeshTransport::Network => finish!(libp2p::SwarmBuilder::with_existing_identity(key)
            .with_tokio()
            .with_quic()
            .with_other_transport(|key| {
                use libp2p::core::transport::Transport as _;
                let tcp = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true))
                    .upgrade(libp2p::core::upgrade::Version::V1)
                    .authenticate(noise::Config::new(key)?)
                    .multiplex(yamux::Config::default())
                    // A dial whose packets a NAT drops would wait out the kernel's SYN
                    // retries (~2 min), holding a pending-connection slot; an AutoNAT
                    // dial-back must fail within the asker's 10 s for it to learn it is
                    // unreachable (SPEC §8).
                    .timeout(TCP_DIAL_TIMEOUT);
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(tcp)
            })?),
    };
    Ok(swarm)
}

/// How long a TCP connection may take to open and upgrade (noise, yamux).
pub const TCP_DIAL_TIMEOUT: Duration = Duration::from_secs(8);

fn swarm_config(config: libp2p::swarm::Config) -> libp2p::swarm::Config {
    config.with_idle_connection_timeout(Duration::from_secs(120))
}

/// `base` (memory or TCP) with every dialled connection through `link`, secured and
/// multiplexed.
fn emulated_transport<T>(
    key: &identity::Keypair,
    base: T,
    link: link::LinkModel,
    counters: Arc<link::LinkCounters>,
) -> Result<
    libp2p::core::transport::Boxed<(PeerId, libp2p::core::muxing::StreamMuxerBox)>,
    Box<dyn std::error::Error + Send + Sync>,
>
where
    T: libp2p::core::Transport + Send + Unpin + 'static,
    T::Output: futures::AsyncRead + futures::AsyncWrite + Send + Unpin + 'static,
    T::Error: Send + Sync + 'static,
    T::Dial: Send + 'static,
    T::ListenerUpgrade: Send + 'static,
{
    use libp2p::core::muxing::StreamMuxerBox;
    use libp2p::core::transport::Transport as _;
    use libp2p::core::{upgrade, ConnectedPoint};
    let noise = noise::Config::new(key)?;
    Ok(base
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(move |connection, endpoint| {
            let profile = match &endpoint {
                ConnectedPoint::Dialer { address, .. } => link(address),
                ConnectedPoint::Listener { .. } => link::LinkProfile::default(),
            };
            let counters = counters.clone();
            async move { Ok::<_, std::io::Error>(link::link(connection, profile, counters)) }
        })
        .upgrade(upgrade::Version::V1)
        .authenticate(noise)
        .multiplex(yamux::Config::default())
        .map(|(peer, muxer), _| (peer, StreamMuxerBox::new(muxer)))
        .boxed())
}
