#![allow(clippy::unwrap_used)]
//! NAT traversal in the netns lab (SPEC §8): buyers' gateways and providers behind NAT
//! routers of each kind reach each other through relays the mesh's reachable nodes
//! run; hole punching makes the connection direct where the NATs allow it (checked from
//! the nodes' connection info); a relay killed mid-stream costs no token. Needs root and
//! nftables; skipped with a message otherwise.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::testnet::{
    data_dir_with_model, host_names, netns_usable, nft_available, sharemesh, Guard, NetnsCleanup,
};
use common::wait_until;
use serde_json::{json, Value};

const MODEL: &str = "smollm2-135m-instruct";

/// The lab's nodes log the mesh's connections, relays and reservations.
const LAB_LOG: &str = "info,sharemesh_mesh=debug,libp2p_gossipsub=warn,libp2p_kad=warn";

/// A running `--netns` testnet and what cleans it up.
struct Lab {
    file: Value,
    data: tempfile::TempDir,
    dir: PathBuf,
    _guard: Guard,
    _cleanup: NetnsCleanup,
}

impl Lab {
    /// `testnet up --netns` with `providers` providers (the last `nat` behind NAT) and
    /// `gateways` gateways (the last one behind NAT), every router of `kind`; `None`
    /// when this machine cannot run it.
    fn up(
        kind: &str,
        providers: usize,
        nat: usize,
        gateways: usize,
        extra: &[&str],
    ) -> Option<Lab> {
        if let Err(why) = netns_usable() {
            eprintln!("skipped: {why}");
            return None;
        }
        if !nft_available() {
            eprintln!("skipped: `nft` (package nftables) is not installed");
            return None;
        }
        let data = data_dir_with_model();
        let dir = data.path().join("net");
        let (providers, nat, gateways) =
            (providers.to_string(), nat.to_string(), gateways.to_string());
        let args = [
            "testnet",
            "up",
            "--netns",
            "--providers",
            &providers,
            "--nat",
            &nat,
            "--gateways",
            &gateways,
            "--nat-buyers",
            "1",
            "--nat-kind",
            kind,
            "--dir",
        ];
        let mut args = args.to_vec();
        args.push(dir.to_str().unwrap());
        args.extend_from_slice(extra);
        // The mesh's connection and relay events, for the dump on failure.
        let out = Command::new(common::sharemesh_bin())
            .arg("--data-dir")
            .arg(data.path())
            .args(&args)
            .env("RUST_LOG", LAB_LOG)
            .output()
            .unwrap();
        let file: Value =
            serde_json::from_slice(&std::fs::read(dir.join("testnet.json")).unwrap_or_default())
                .unwrap_or_default();
        let pids = file["nodes"]
            .as_array()
            .map(|n| n.iter().filter_map(|n| n["pid"].as_u64()).collect())
            .unwrap_or_default();
        let namespaces = host_names(&file, "namespaces")
            .into_iter()
            .chain(host_names(&file, "routers"));
        let lab = Lab {
            _guard: Guard(pids),
            _cleanup: NetnsCleanup(namespaces.collect()),
            file,
            data,
            dir,
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(lab)
    }

    fn nodes(&self) -> Vec<Value> {
        self.file["nodes"].as_array().unwrap().clone()
    }

    fn natted(&self, role: &str) -> Vec<Value> {
        self.nodes()
            .into_iter()
            .filter(|n| n["role"] == role && n["nat_router"].is_string())
            .collect()
    }

    fn public(&self, role: &str) -> Vec<Value> {
        self.nodes()
            .into_iter()
            .filter(|n| n["role"] == role && n["nat_router"].is_null())
            .collect()
    }

    /// A failed test prints what each node's log says about connections, relays and
    /// reachability (CI keeps only the output).
    fn dump_logs(&self) {
        const KEEP: [&str; 9] = [
            "relay",
            "reservation",
            "reachab",
            "connected",
            "connection closed",
            "pruning",
            "hole punch",
            "AutoNAT",
            "listener closed",
        ];
        for node in self.nodes() {
            let dir = std::path::Path::new(node["data_dir"].as_str().unwrap_or_default());
            let log = std::fs::read_to_string(dir.join("node.log")).unwrap_or_default();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| KEEP.iter().any(|k| l.contains(k)))
                .collect();
            eprintln!(
                "---- {} {} {} (nat: {}): {} of {} log lines",
                node["role"],
                node["peer_id"],
                node["listen"],
                node["nat_router"],
                lines.len().min(150),
                lines.len()
            );
            for line in &lines[lines.len().saturating_sub(150)..] {
                eprintln!("{}", compact(line));
            }
        }
    }

    fn kill(&self, node: &Value) {
        Command::new("kill")
            .args(["-9", &node["pid"].to_string()])
            .status()
            .unwrap();
    }
}

/// A JSON log line as `time level message key=value…` (without the span).
fn compact(line: &str) -> String {
    let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(line) else {
        return line.to_owned();
    };
    let text = |key: &str| fields.get(key).and_then(Value::as_str).unwrap_or_default();
    let mut out = format!(
        "{} {} {}",
        text("timestamp").get(11..23).unwrap_or_default(),
        text("level"),
        text("message")
    );
    for (key, value) in &fields {
        if !["timestamp", "level", "message", "target", "span", "spans"].contains(&key.as_str()) {
            out.push_str(&format!(
                " {key}={}",
                value.as_str().map_or(value.to_string(), str::to_owned)
            ));
        }
    }
    out
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        let dir = self.dir.to_str().unwrap().to_owned();
        let _ = sharemesh(self.data.path(), &["testnet", "down", "--dir", &dir]);
    }
}

fn get(node: &Value, path: &str) -> Value {
    common::get_json_with_key(
        node["http"].as_str().unwrap(),
        path,
        node["api_key"].as_str(),
    )
}

fn reachability(node: &Value) -> Value {
    get(node, "/v1/network/reachability")
}

/// The gateway's connection info about `peer`, if connected.
fn connection(gateway: &Value, peer: &str) -> Option<Value> {
    get(gateway, "/v1/network/peers")
        .as_array()?
        .iter()
        .find(|p| p["peer_id"] == peer)
        .cloned()
}

/// Waits until every NATed node holds `relays` reservations and `gateway`'s order book
/// lists every NATed provider with a relayed address.
fn wait_for_relays(lab: &Lab, gateway: &Value, relays: usize) {
    for node in lab.natted("provider").iter().chain(&lab.natted("gateway")) {
        wait_until(60, "a NATed node to hold its relay reservations", || {
            let view = reachability(node);
            view["status"] == "private"
                && view["relays"].as_array().is_some_and(|r| r.len() >= relays)
        });
    }
    for provider in lab.natted("provider") {
        let id = provider["peer_id"].as_str().unwrap().to_owned();
        wait_until(
            30,
            "the gateway to learn a NATed provider's relayed address",
            || {
                get(gateway, "/v1/network/providers")
                    .as_array()
                    .unwrap_or(&vec![])
                    .iter()
                    .any(|p| {
                        p["peer_id"] == id.as_str()
                            && p["addresses"][0]
                                .as_str()
                                .is_some_and(|a| a.contains("/p2p-circuit"))
                    })
            },
        );
    }
}

fn request(max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

/// curl against `gateway`'s chat completions, headers written to `headers`.
fn curl(gateway: &Value, body: &Value, headers: &std::path::Path) -> Command {
    let mut curl = Command::new("curl");
    curl.args(["-s", "-N", "-m", "180", "-D"])
        .arg(headers)
        .arg(format!(
            "http://{}/v1/chat/completions",
            gateway["http"].as_str().unwrap()
        ))
        .args([
            "-H",
            &format!(
                "authorization: Bearer {}",
                gateway["api_key"].as_str().unwrap()
            ),
        ])
        .args([
            "-H",
            "content-type: application/json",
            "-d",
            &body.to_string(),
        ]);
    curl
}

fn served_by(headers: &std::path::Path) -> String {
    std::fs::read_to_string(headers)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("x-sharemesh-provider")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default()
}

/// A non-streaming answer through `gateway`: (text, the provider that served it).
fn chat(lab: &Lab, gateway: &Value, max_tokens: u32) -> (String, String) {
    let headers = lab.data.path().join("headers");
    let out = curl(gateway, &request(max_tokens, false), &headers)
        .output()
        .unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let text = answer["choices"][0]["message"]["content"].as_str();
    let text = text
        .unwrap_or_else(|| panic!("no answer: {answer}"))
        .to_owned();
    (text, served_by(&headers))
}

/// The NATed gateway reaches the NATed provider (the public provider, which could also
/// serve, is killed first), and the two end up on a direct connection.
fn nated_buyer_reaches_nated_provider(
    kind: &str,
    expect_status: &str,
) -> Option<(Lab, Value, Value)> {
    let lab = Lab::up(kind, 2, 1, 2, &[])?;
    let gateway = lab.natted("gateway").remove(0);
    let provider = lab.natted("provider").remove(0);
    let id = provider["peer_id"].as_str().unwrap().to_owned();
    wait_until(60, "the NATed nodes to learn their reachability", || {
        reachability(&provider)["status"] == expect_status
            && reachability(&gateway)["status"] == expect_status
    });
    if expect_status == "private" {
        wait_for_relays(&lab, &gateway, 1);
    }
    lab.kill(&lab.public("provider")[0]);
    let (text, served) = chat(&lab, &gateway, 12);
    assert_eq!(served, id, "served by another provider");
    assert!(text.starts_with("Once upon a time"), "{text}");
    Some((lab, gateway, provider))
}

/// A network whose only public node is one host — the bootstrap, started with no
/// reachability flag and refusing every buyer (it relays, it does not serve) — and a
/// provider and a buyer's gateway each behind a NAT router of `kind`. AutoNAT cannot
/// tell the bootstrap it is reachable (it asks only peers it dialled, and it can dial
/// none of them back); the two NATed peers dialling it where it listens do, so it
/// relays. The buyer asks as soon as the testnet is up, before the provider may hold a
/// reservation (its advert then lists no address: it is private, and its private
/// address is no use to anyone): the request waits for the relay rather than failing,
/// and the NATed provider serves it within 30 s.
fn lone_public_node_relays_for_nated_peers(kind: &str) {
    let nobody = sharemesh_protocol::Keypair::from_secret([7; 32]).node_id();
    let refuse_buyers = format!("--allow-buyer {nobody}");
    let started = std::time::Instant::now();
    let Some(lab) = Lab::up(kind, 2, 1, 1, &["--bootstrap-args", &refuse_buyers]) else {
        return;
    };
    let up = started.elapsed();
    let bootstrap = lab.public("provider").remove(0);
    let gateway = lab.natted("gateway").remove(0);
    let provider = lab.natted("provider").remove(0);
    let relays_before = reachability(&provider)["relays"].clone();
    let asked = std::time::Instant::now();
    let (text, served) = chat(&lab, &gateway, 12);
    println!(
        "testnet up in {up:?}; the provider held {relays_before} when asked; served after {:?}",
        asked.elapsed()
    );
    assert_eq!(served, provider["peer_id"].as_str().unwrap());
    assert!(text.starts_with("Once upon a time"), "{text}");
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(30),
        "served only after {:?}",
        asked.elapsed()
    );
    let view = reachability(&bootstrap);
    assert_eq!(view["status"], "public", "{view}");
    assert_eq!(view["relay_server"], true, "{view}");
    assert_eq!(reachability(&provider)["status"], "private");
}

#[test]
fn a_lone_public_node_relays_for_peers_behind_restricted_nats() {
    lone_public_node_relays_for_nated_peers("restricted");
}

#[test]
fn a_lone_public_node_relays_for_peers_behind_symmetric_nats() {
    lone_public_node_relays_for_nated_peers("symmetric");
}

#[test]
fn behind_restricted_nats_a_relayed_connection_is_punched_direct() {
    let Some((_lab, gateway, provider)) =
        nated_buyer_reaches_nated_provider("restricted", "private")
    else {
        return;
    };
    let id = provider["peer_id"].as_str().unwrap();
    // DCUtR: both sides dial the other's router at once; the relayed connection closes.
    wait_until(
        30,
        "the relayed connection to be upgraded to a direct one",
        || {
            connection(&gateway, id).is_some_and(|c| {
                c["relayed"] == false
                    && c["addresses"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .all(|a| !a.as_str().unwrap().contains("p2p-circuit"))
            })
        },
    );
    let punched = |node: &Value| reachability(node)["hole_punches"].as_u64().unwrap_or(0);
    assert!(punched(&gateway) + punched(&provider) >= 1);
}

#[test]
fn behind_cone_nats_nodes_find_themselves_reachable() {
    // A full-cone NAT forwards whatever reaches a port the node sent from: AutoNAT's
    // dial-back gets through, so the nodes are public and connect directly.
    let Some((_lab, gateway, provider)) = nated_buyer_reaches_nated_provider("cone", "public")
    else {
        return;
    };
    let id = provider["peer_id"].as_str().unwrap();
    let direct = connection(&gateway, id).unwrap();
    assert_eq!(direct["relayed"], false, "{direct}");
    assert_eq!(reachability(&provider)["relay_server"], true);
}

/// Behind symmetric NATs punching cannot work: jobs stay on relays. Killing the relay
/// that carries a stream fails it over to the other NATed provider (through another
/// relay), resumed exactly; the NATed providers replace the dead relay and remain
/// reachable.
#[test]
fn behind_symmetric_nats_relays_carry_jobs_and_a_relay_killed_mid_stream_costs_no_token() {
    let Some(lab) = Lab::up("symmetric", 3, 2, 4, &[]) else {
        return;
    };
    let gateway = lab.natted("gateway").remove(0);
    // The public provider could serve everything directly: it goes, leaving the three
    // public gateways as the only relays (each NATed node holds two of them).
    wait_for_relays(&lab, &gateway, 2);
    lab.kill(&lab.public("provider")[0]);
    let (reference, served) = chat(&lab, &gateway, 120);
    let carrying =
        connection(&gateway, &served).unwrap_or_else(|| panic!("no connection to {served}"));
    assert_eq!(
        carrying["relayed"], true,
        "symmetric NATs punched through: {carrying}"
    );

    let headers = lab.data.path().join("stream-headers");
    let mut child = curl(&gateway, &request(120, true), &headers)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut text, mut killed, mut tokens, mut providers) = (String::new(), None, 0, Value::Null);
    for line in lines {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        assert!(chunk["error"].is_null(), "{chunk}");
        if let Some(delta) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(delta);
            tokens += 1;
        }
        if !chunk["sharemesh"]["providers"].is_null() {
            providers = chunk["sharemesh"]["providers"].clone();
        }
        if tokens == 10 && killed.is_none() {
            // The relay this stream runs through: the one in the connection's address.
            let serving = served_by(&headers);
            let connection = connection(&gateway, &serving).unwrap();
            let address = connection["addresses"][0].as_str().unwrap().to_owned();
            assert!(address.contains("/p2p-circuit"), "{address}");
            let relay_id = address
                .split("/p2p/")
                .nth(1)
                .unwrap()
                .split('/')
                .next()
                .unwrap();
            let relay = lab
                .nodes()
                .into_iter()
                .find(|n| n["peer_id"] == relay_id)
                .unwrap();
            lab.kill(&relay);
            killed = Some(relay);
        }
    }
    child.wait().unwrap();
    let killed = killed.expect("the stream ended before the relay could be killed");
    assert_eq!(
        text, reference,
        "tokens lost or changed across the failover"
    );
    assert_eq!(
        providers.as_array().map_or(0, Vec::len),
        2,
        "no failover: {providers}"
    );

    // Both NATed providers replace the dead relay with the spare one and stay
    // reachable.
    let dead = killed["peer_id"].as_str().unwrap().to_owned();
    for provider in lab.natted("provider") {
        wait_until(60, "a NATed provider to replace its dead relay", || {
            let relays = reachability(&provider)["relays"].clone();
            let relays = relays.as_array().cloned().unwrap_or_default();
            relays.len() == 2 && relays.iter().all(|r| !r.as_str().unwrap().contains(&dead))
        });
    }
    let (again, _) = chat(&lab, &gateway, 120);
    assert_eq!(again, reference);
}

/// A relay that grants reservations and refuses every circuit (the adversary kit's
/// `--adversary-blackhole-relay`, here the public provider) would leave a NATed provider
/// advertising an address nobody can reach it at. AutoNAT tests the provider's relayed
/// addresses; the one through the liar fails, so the provider gives that relay up,
/// distrusts it, advertises only the honest relays, and a NATed buyer reaches it.
#[test]
fn a_relay_that_carries_no_circuit_is_found_out_and_given_up() {
    let Some(lab) = Lab::up(
        "symmetric",
        2,
        1,
        3,
        &["--provider-args", "--adversary-blackhole-relay --relays 3"],
    ) else {
        return;
    };
    let liar = lab.public("provider").remove(0);
    let liar_id = liar["peer_id"].as_str().unwrap().to_owned();
    let provider = lab.natted("provider").remove(0);
    let id = provider["peer_id"].as_str().unwrap().to_owned();
    let gateway = lab.natted("gateway").remove(0);
    // It asked all three relays (--relays 3), and keeps the two that carry circuits.
    wait_until(
        90,
        "the NATed provider to give up the blackhole relay",
        || {
            let view = reachability(&provider);
            let relays = view["relays"].as_array().cloned().unwrap_or_default();
            view["distrusted_relays"]
                .as_array()
                .is_some_and(|d| d.iter().any(|r| r == liar_id.as_str()))
                && relays.len() == 2
                && relays
                    .iter()
                    .all(|r| !r.as_str().unwrap().contains(&liar_id))
        },
    );
    wait_until(
        30,
        "the provider's advert to drop the liar's circuit",
        || {
            get(&gateway, "/v1/network/providers")
                .as_array()
                .unwrap_or(&vec![])
                .iter()
                .any(|p| {
                    let addresses = p["addresses"].as_array().cloned().unwrap_or_default();
                    p["peer_id"] == id.as_str()
                        && addresses
                            .iter()
                            .any(|a| a.as_str().unwrap().contains("/p2p-circuit"))
                        && addresses
                            .iter()
                            .all(|a| !a.as_str().unwrap().contains(&liar_id))
                })
        },
    );
    // The liar also served jobs directly: it goes, leaving the NATed provider.
    lab.kill(&liar);
    let (text, served) = chat(&lab, &gateway, 12);
    assert_eq!(served, id, "served by another provider");
    assert!(text.starts_with("Once upon a time"), "{text}");
}

/// A relay bounds what it carries: with circuits capped at 16 KiB (both directions), a
/// long relayed job is cut mid-stream by the relay, which says why, and the gateway
/// reports the broken stream instead of waiting on it. (The default, 4 MiB, carried the
/// whole jobs above.)
#[test]
fn a_relay_cuts_a_circuit_at_its_byte_limit() {
    let Some(lab) = Lab::up(
        "symmetric",
        2,
        1,
        2,
        &["--gateway-args", "--relay-circuit-kib 16"],
    ) else {
        return;
    };
    let gateway = lab.natted("gateway").remove(0);
    wait_for_relays(&lab, &gateway, 1);
    lab.kill(&lab.public("provider")[0]);
    let headers = lab.data.path().join("headers");
    let out = curl(&gateway, &request(300, true), &headers)
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    let tokens = body.matches("\"content\"").count();
    assert!(body.contains("\"error\""), "the stream was not cut: {body}");
    assert!(tokens < 300, "{tokens} tokens through a 16 KiB circuit");
    let relay = lab.public("gateway").remove(0);
    let log = std::path::Path::new(relay["data_dir"].as_str().unwrap()).join("node.log");
    let log = std::fs::read_to_string(log).unwrap();
    assert!(
        log.contains("Max circuit bytes reached"),
        "the relay did not say why"
    );
}
