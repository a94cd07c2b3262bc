#![allow(clippy::unwrap_used)]
//! A gateway built with no verification settings verifies: it buys checks from
//! providers priced at most its routing ceiling; turning verification off takes a call
//! by name; a replayer adds replay beside the bought checks. A built gateway stops
//! (says so) when its mesh does.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use libp2p::Multiaddr;
use sharemesh_gateway::builder::GatewayBuilder;
use sharemesh_gateway::verify::audit::{ReplayJob, ReplayResult, Replayer};
use sharemesh_gateway::verify::trust::Verification;
use sharemesh_mesh::link::LinkProfile;
use sharemesh_mesh::{MeshConfig, MeshHandle, MeshTransport};
use sharemesh_protocol::{ExecutionProfile, Keypair, ModelId};

async fn mesh(seed: u8) -> MeshHandle {
    let key = Keypair::from_secret([seed; 32]);
    let config = MeshConfig {
        listen: vec![format!("/memory/{}", 7_000_000 + u64::from(seed))
            .parse::<Multiaddr>()
            .unwrap()],
        transport: MeshTransport::Memory {
            link: Arc::new(|_: &Multiaddr| LinkProfile::default()),
            counters: Arc::default(),
        },
        ..MeshConfig::default()
    };
    sharemesh_mesh::spawn(key.secret(), config).await.unwrap()
}

/// Replays nothing (the builder only has to hold it).
struct Nothing;

impl Replayer for Nothing {
    fn profile(&self, _: &ModelId) -> Option<ExecutionProfile> {
        None
    }
    fn replay(&self, _: ReplayJob) -> BoxFuture<'static, Result<ReplayResult, String>> {
        async { Err("nothing to replay with".into()) }.boxed()
    }
}

#[tokio::test]
async fn a_gateway_verifies_unless_told_not_to_by_name() {
    let key = || Keypair::from_secret([1; 32]);
    let default = GatewayBuilder::new(mesh(1).await, key()).build();
    assert_eq!(default.trust().verification(), Verification::Outsourced);

    let off = GatewayBuilder::new(mesh(2).await, key())
        .without_verification()
        .replay_with(Arc::new(Nothing))
        .build();
    assert_eq!(off.trust().verification(), Verification::Off);

    let both = GatewayBuilder::new(mesh(3).await, key())
        .replay_with(Arc::new(Nothing))
        .build();
    assert_eq!(
        both.trust().verification(),
        Verification::ReplayAndOutsourced
    );

    let replay_only = GatewayBuilder::new(mesh(4).await, key())
        .no_bought_checks()
        .replay_with(Arc::new(Nothing))
        .build();
    assert_eq!(replay_only.trust().verification(), Verification::Replay);
}

#[tokio::test]
async fn a_gateway_stops_when_its_mesh_does() {
    let mesh = mesh(5).await;
    let gateway = GatewayBuilder::new(mesh.clone(), Keypair::from_secret([5; 32])).build();
    let serving = tokio::time::timeout(std::time::Duration::from_millis(200), gateway.stopped());
    assert!(serving.await.is_err(), "a serving gateway reported an end");
    mesh.shutdown().await.unwrap();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), gateway.stopped())
        .await
        .expect("the gateway went on as if serving");
    assert_eq!(ended.to_string(), "the gateway's mesh stopped");
}
