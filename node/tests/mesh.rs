#![allow(clippy::unwrap_used)]
//! The mesh with real libp2p swarms on loopback TCP: discovery, advert gossip and its
//! validation, token streams with the real engine, and restarts of real processes.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use libp2p::Multiaddr;
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::{self as mesh, MeshConfig, MeshEvent, MeshHandle};
use sharemesh_protocol::{Advert, HardwareSummary, Keypair, Load, NodeId};

fn config(bootstrap: Vec<Multiaddr>) -> MeshConfig {
    MeshConfig {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
        bootstrap,
        kad_server: true,
        heartbeat: Duration::from_millis(300),
        ..MeshConfig::default()
    }
}

async fn node(seed: u8, bootstrap: Vec<Multiaddr>) -> (Keypair, MeshHandle) {
    let key = Keypair::from_secret([seed; 32]);
    let handle = mesh::spawn(key.secret(), config(bootstrap)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while handle.listen_addrs().is_empty() {
        assert!(Instant::now() < deadline, "node {seed} never listened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (key, handle)
}

fn advert(key: &Keypair) -> Advert {
    Advert {
        provider: key.node_id(),
        region: "test".into(),
        hardware: HardwareSummary::Cpu {
            cores: 2,
            ram_bytes: 1 << 30,
        },
        models: vec![],
        tiers: vec![],
        windows: vec![],
        load: Load::default(),
        addresses: vec![],
    }
}

fn known(handle: &MeshHandle) -> HashSet<NodeId> {
    handle
        .book
        .read()
        .unwrap()
        .live(now_ms())
        .into_iter()
        .map(|e| e.advert.provider)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_discover_each_other_and_every_advert_reaches_every_node() {
    let (boot_key, boot) = node(1, vec![]).await;
    let bootstrap = boot.listen_addrs();
    let mut nodes = vec![(boot_key, boot)];
    for seed in 2..=5 {
        nodes.push(node(seed, bootstrap.clone()).await);
    }
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut seq = 1;
    loop {
        // Providers republish periodically; late joiners catch the next one.
        for (key, handle) in &nodes {
            let envelope = key.seal(&advert(key), seq, now_ms(), 60_000).unwrap();
            handle.publish_advert(&envelope).await.unwrap();
        }
        seq += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut complete = true;
        for (key, handle) in &nodes {
            let peers = handle.peers().await.unwrap();
            let others: HashSet<NodeId> = nodes
                .iter()
                .map(|(k, _)| k.node_id())
                .filter(|id| *id != key.node_id())
                .collect();
            complete &= peers.len() >= 4 && others.is_subset(&known(handle));
        }
        if complete {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the mesh did not converge in 40 s"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_expired_and_replayed_adverts_are_rejected_and_not_forwarded() {
    let (_, relay) = node(11, vec![]).await;
    let (a_key, a) = node(12, relay.listen_addrs()).await;
    let (_, c) = node(13, relay.listen_addrs()).await;
    let mut relay_events = relay.subscribe();
    let mut c_events = c.subscribe();
    // A valid advert must reach C before the bad ones are tried.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seq = 100;
    while !known(&c).contains(&a_key.node_id()) {
        assert!(Instant::now() < deadline, "valid advert never reached C");
        seq += 1;
        a.publish_advert(&a_key.seal(&advert(&a_key), seq, now_ms(), 60_000).unwrap())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let accepted_seq = c
        .book
        .read()
        .unwrap()
        .get(&a_key.node_id(), now_ms())
        .unwrap()
        .seq;

    let mut forged = a_key
        .seal(&advert(&a_key), seq + 10, now_ms(), 60_000)
        .unwrap();
    forged.payload[40] ^= 0x01;
    let expired = a_key
        .seal(&advert(&a_key), seq + 11, now_ms() - 600_000, 60_000)
        .unwrap();
    let replayed = a_key.seal(&advert(&a_key), 1, now_ms(), 60_000).unwrap();
    for bad in [&forged, &expired, &replayed] {
        a.publish_advert(bad).await.unwrap();
    }
    // The relay sees and rejects all three.
    let mut rejected = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rejected < 3 {
        match tokio::time::timeout_at(deadline, relay_events.recv()).await {
            Ok(Ok(MeshEvent::AdvertRejected { .. })) => rejected += 1,
            Ok(Ok(_)) | Ok(Err(_)) => {}
            Err(_) => panic!("the relay rejected only {rejected} of 3 bad adverts"),
        }
    }
    // Give any (wrong) forwarding time to happen, then check C never got them via the relay.
    tokio::time::sleep(Duration::from_secs(2)).await;
    while let Ok(event) = c_events.try_recv() {
        if let MeshEvent::AdvertRejected { from, .. } = event {
            assert_ne!(from, relay.peer_id, "the relay forwarded a rejected advert");
        }
    }
    assert_eq!(
        c.book
            .read()
            .unwrap()
            .get(&a_key.node_id(), now_ms())
            .unwrap()
            .seq,
        accepted_seq
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_also_talk_over_quic() {
    let quic = |bootstrap: Vec<Multiaddr>| MeshConfig {
        listen: vec!["/ip4/127.0.0.1/udp/0/quic-v1".parse().unwrap()],
        ..config(bootstrap)
    };
    let a_key = Keypair::from_secret([31; 32]);
    let a = mesh::spawn(a_key.secret(), quic(vec![])).await.unwrap();
    while a.listen_addrs().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(a.listen_addrs()[0].to_string().contains("/quic-v1/"));
    let b = mesh::spawn(
        Keypair::from_secret([32; 32]).secret(),
        quic(a.listen_addrs()),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seq = 1;
    while !known(&b).contains(&a_key.node_id()) {
        assert!(Instant::now() < deadline, "no advert over QUIC");
        a.publish_advert(&a_key.seal(&advert(&a_key), seq, now_ms(), 60_000).unwrap())
            .await
            .unwrap();
        seq += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let peers = b.peers().await.unwrap();
    assert!(
        peers
            .iter()
            .any(|p| p.addresses.iter().any(|a| a.contains("quic-v1"))),
        "{peers:?}"
    );
}

/// The emulated link over TCP (`--link-latency-ms` in processes): a node dialling
/// through a 150 ms one-way link measures a ping round trip of about twice that, both
/// ends see it, adverts still flow, and the link's bytes are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emulated_tcp_link_adds_its_latency_to_the_round_trip() {
    let (a_key, a) = node(41, vec![]).await;
    let counters = std::sync::Arc::new(mesh::link::LinkCounters::default());
    let profile = mesh::link::LinkProfile {
        latency: Duration::from_millis(150),
        seed: 7,
        ..Default::default()
    };
    let b_key = Keypair::from_secret([42; 32]);
    let b = mesh::spawn(
        b_key.secret(),
        MeshConfig {
            transport: mesh::MeshTransport::EmulatedTcp {
                link: std::sync::Arc::new(move |_: &Multiaddr| profile),
                counters: counters.clone(),
            },
            ..config(a.listen_addrs())
        },
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let rtt = |handle: MeshHandle| async move {
        handle
            .peers()
            .await
            .unwrap()
            .into_iter()
            .find_map(|p| p.rtt_ms)
    };
    let (mut rtt_b, mut rtt_a) = (None, None);
    while rtt_b.is_none() || rtt_a.is_none() {
        assert!(
            Instant::now() < deadline,
            "no ping measured: {rtt_a:?} {rtt_b:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        rtt_b = rtt(b.clone()).await;
        rtt_a = rtt(a.clone()).await;
    }
    for (side, value) in [("dialler", rtt_b), ("listener", rtt_a)] {
        let value = value.unwrap();
        assert!(
            (280.0..2_000.0).contains(&value),
            "{side} measured {value} ms"
        );
    }
    let mut seq = 1;
    while !known(&b).contains(&a_key.node_id()) {
        assert!(
            Instant::now() < deadline,
            "no advert across the emulated link"
        );
        a.publish_advert(&a_key.seal(&advert(&a_key), seq, now_ms(), 60_000).unwrap())
            .await
            .unwrap();
        seq += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(counters.sent() > 0 && counters.received() > 0);
    // The lock-free views the gateway routes by agree with the event loop's answer.
    assert!(b.is_connected(&a.peer_id) && a.is_connected(&b.peer_id));
    let view = b.round_trips_ms()[&a.peer_id];
    assert!((280.0..2_000.0).contains(&view), "view {view}");
    let _ = b_key;
}

#[test]
fn bad_link_flags_are_refused_with_the_reason() {
    let data = tempfile::tempdir().unwrap();
    for (flags, expected) in [
        (vec!["--link-loss", "1.5"], "--link-loss must be in [0, 1)"),
        (
            vec!["--link-latency-ms", "10", "--link-jitter-ms", "20"],
            "cannot exceed --link-latency-ms",
        ),
        (
            vec![
                "--link-latency-ms",
                "10",
                "--listen",
                "/ip4/127.0.0.1/udp/0/quic-v1",
            ],
            "wraps TCP streams only",
        ),
    ] {
        let out = std::process::Command::new(common::sharemesh_bin())
            .arg("--data-dir")
            .arg(data.path())
            .args(["gateway", "--http", "127.0.0.1:0"])
            .args(&flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}
