//! A node whose process is starved — its runtime blocked for seconds at a time, as when
//! inference takes every core — keeps its connections, and neither it nor its peers
//! hold its lateness against anyone (issue: the mesh under load).
//!
//! Real swarms on libp2p's memory transport. Three nodes share the test's runtime; the
//! starved node runs on a runtime of its own on its own thread, which a task blocks
//! outright for [`STALL`]: its event loop, connection tasks and timers all stop, as in a
//! process that gets no CPU.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;
use sharemesh_mesh::link::LinkProfile;
use sharemesh_mesh::{self as mesh, MeshConfig, MeshEvent, MeshHandle, MeshTransport};
use sharemesh_protocol::{Keypair, ReputationReport, SignedEnvelope};

/// Longer than Kademlia's request timeout and gossipsub's stream negotiation timeout
/// (10 s each), than the peer manager's grace for new connections, and than the
/// lifetime of the report sent during it.
const STALL: Duration = Duration::from_secs(12);

fn secret(index: u8) -> [u8; 32] {
    let mut secret = [index; 32];
    secret[0] = 0x5a;
    secret
}

fn address(index: u8) -> Multiaddr {
    format!("/memory/{}", 7_300_000 + u64::from(index))
        .parse()
        .expect("memory address")
}

fn config(index: u8, bootstrap: Vec<Multiaddr>) -> MeshConfig {
    MeshConfig {
        listen: vec![address(index)],
        bootstrap,
        kad_server: true,
        target_peers: 3,
        heartbeat: Duration::from_millis(200),
        transport: MeshTransport::Memory {
            link: Arc::new(|_: &Multiaddr| LinkProfile::default()),
            counters: Arc::default(),
        },
        metrics: Some(mesh::metrics::registry()),
        ..MeshConfig::default()
    }
}

/// `key`'s minimal advert, sealed now, good for two minutes.
fn sealed_advert(key: &Keypair) -> SignedEnvelope {
    key.seal(
        &mesh::orderbook::tests_support::advert(key),
        1,
        sharemesh_mesh::clock::now_ms(),
        120_000,
    )
    .expect("seal")
}

fn dial_address(handle: &MeshHandle, index: u8) -> Multiaddr {
    address(index).with(Protocol::P2p(handle.peer_id))
}

/// Counts disconnections seen by `handle` from now on.
fn count_disconnections(handle: &MeshHandle, count: Arc<AtomicUsize>) {
    let mut events = handle.subscribe();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            if let MeshEvent::PeerDisconnected(peer) = event {
                eprintln!("disconnected from {peer}");
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Every peer's gossip score as `handle` sees it.
async fn scores(handle: &MeshHandle) -> Vec<(String, f64)> {
    handle
        .peers()
        .await
        .expect("peers")
        .into_iter()
        .map(|peer| (peer.peer_id, peer.gossip_score.unwrap_or(0.0)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starved_node_keeps_its_peers_and_nobody_is_penalised_for_its_lateness() {
    // The honest, well-fed nodes.
    let a = mesh::spawn(secret(1), config(1, vec![])).await.expect("a");
    let b = mesh::spawn(secret(2), config(2, vec![dial_address(&a, 1)]))
        .await
        .expect("b");
    let c = mesh::spawn(
        secret(3),
        config(3, vec![dial_address(&a, 1), dial_address(&b, 2)]),
    )
    .await
    .expect("c");
    // The starved node, on a runtime of its own.
    let bootstrap = vec![
        dial_address(&a, 1),
        dial_address(&b, 2),
        dial_address(&c, 3),
    ];
    let (started, starved) = tokio::sync::oneshot::channel();
    let (stall_now, stall) = std::sync::mpsc::channel::<()>();
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let starved_thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let handle = mesh::spawn(secret(4), config(4, bootstrap))
                .await
                .expect("starved node");
            let _ = started.send(handle.clone());
            // Blocks this runtime (and with it everything of the node) when told to.
            tokio::task::spawn_blocking(move || stall.recv())
                .await
                .expect("join")
                .expect("stall signal");
            tokio::spawn(async { std::thread::sleep(STALL) });
            let _ = finished.await;
            drop(handle);
        });
    });
    let s = starved.await.expect("the starved node started");

    // The mesh forms: everyone connected to everyone.
    let all = [&a, &b, &c, &s];
    for node in all {
        let others: Vec<_> = all
            .iter()
            .filter(|o| o.peer_id != node.peer_id)
            .map(|o| o.peer_id)
            .collect();
        wait_for("the mesh to form", || {
            others.iter().all(|peer| node.is_connected(peer))
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // Gossip meshes graft.
    let disconnections = Arc::new(AtomicUsize::new(0));
    for node in all {
        count_disconnections(node, disconnections.clone());
    }
    let mut accepted_at_s = s.subscribe();

    stall_now.send(()).expect("stall");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // While the starved node sleeps: a report that expires before it wakes (an honest
    // message that reaches it late), then an advert that is still good when it wakes.
    let reporter = Keypair::from_secret(secret(1));
    let now = sharemesh_mesh::clock::now_ms();
    let report = ReputationReport {
        reporter: reporter.node_id(),
        epoch: 1,
        entries: vec![],
    };
    let short_lived = reporter.seal(&report, 1, now, 3_000).expect("seal");
    a.publish_reputation(&short_lived).await.expect("publish");
    let advertiser = Keypair::from_secret(secret(2));
    let advert = sealed_advert(&advertiser);
    b.publish_advert(&advert).await.expect("publish");

    // The starved node wakes and catches up.
    let advert_arrived = tokio::time::timeout(STALL + Duration::from_secs(10), async {
        loop {
            match accepted_at_s.recv().await {
                Ok(MeshEvent::AdvertAccepted { provider, .. })
                    if provider == advertiser.node_id() =>
                {
                    return;
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(err) => panic!("events: {err}"),
            }
        }
    })
    .await;
    assert!(
        advert_arrived.is_ok(),
        "the advert published during the stall never reached the starved node"
    );
    // A few heartbeats after waking (scores and prunes would show by now).
    tokio::time::sleep(Duration::from_secs(3)).await;

    assert_eq!(
        disconnections.load(Ordering::SeqCst),
        0,
        "a connection was dropped because one node was starved"
    );
    for node in all {
        for (peer, score) in scores(node).await {
            assert!(
                score >= 0.0,
                "{} holds a gossip score of {score} against {peer} after the stall",
                node.peer_id
            );
        }
    }
    // The starved node knows it was starved: its loop measured its own lateness.
    let registry = s.metrics.clone().expect("metrics");
    let text = mesh::metrics::encode(&registry);
    let late_ticks = lateness_at_least_5s(&text);
    assert!(
        late_ticks >= 1,
        "no maintenance tick measured ≥ 5 s late:\n{text}"
    );
    drop(s);
    let _ = finish.send(());
    starved_thread.join().expect("starved thread");
}

/// Observations of the loop-lateness histogram above 5 s (count minus the ≤ 5 s bucket).
fn lateness_at_least_5s(metrics: &str) -> u64 {
    let read = |prefix: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let name = "sharemesh_mesh_event_loop_lateness_seconds";
    read(&format!("{name}_count")) - read(&format!("{name}_bucket{{le=\"5.0\"}}"))
}

/// A node's mesh on its own thread ([`MeshRuntime::Dedicated`], what the `sharemesh`
/// binary uses) keeps taking gossip while the runtime that started it — where a
/// provider's request handling runs — is blocked outright.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedicated_mesh_runs_while_the_main_runtime_is_blocked() {
    let a = mesh::spawn(secret(11), config(11, vec![]))
        .await
        .expect("a");
    let bootstrap = vec![dial_address(&a, 11)];
    let (started, node) = tokio::sync::oneshot::channel();
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let busy_thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let config = MeshConfig {
                runtime: mesh::MeshRuntime::Dedicated,
                ..config(12, bootstrap)
            };
            let handle = mesh::spawn(secret(12), config).await.expect("node");
            let _ = started.send(handle.clone());
            // The main runtime is now taken for longer than the test waits.
            tokio::spawn(async { std::thread::sleep(STALL) });
            let _ = finished.await;
            drop(handle);
        });
    });
    let d = node.await.expect("the node started");
    wait_for("the node to connect", || d.is_connected(&a.peer_id)).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // Gossip meshes graft.

    let advertiser = Keypair::from_secret(secret(11));
    let advert = sealed_advert(&advertiser);
    a.publish_advert(&advert).await.expect("publish");
    let book_len = || d.book.read().map(|book| book.len()).unwrap_or(0);
    wait_for("the advert to reach the node's book", || book_len() == 1).await;
    assert!(
        d.is_connected(&a.peer_id),
        "the node dropped its peer while its main runtime was blocked"
    );
    let _ = finish.send(());
    busy_thread.join().expect("busy thread");
    // Its own loop never ran late.
    let text = mesh::metrics::encode(&d.metrics.clone().expect("metrics"));
    assert_eq!(lateness_at_least_5s(&text), 0, "{text}");
}
