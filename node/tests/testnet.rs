#![allow(clippy::unwrap_used)]
//! The process testnet and the one-command demo, end to end.

mod common;

use common::testnet::{
    alive, data_dir_with_model, host_names, netns_usable, sharemesh, Guard, NetnsCleanup,
};
use common::wait_until;

use std::path::Path;
use std::process::Command;

/// `testnet up` with 2 providers and a gateway (plus `extra` flags); returns its output,
/// the testnet file as written (even after a failure) and the pids in it.
fn testnet_up(
    data: &Path,
    dir: &Path,
    extra: &[&str],
) -> (std::process::Output, serde_json::Value, Vec<u64>) {
    let mut args = vec![
        "testnet",
        "up",
        "--providers",
        "2",
        "--gateways",
        "1",
        "--dir",
    ];
    args.push(dir.to_str().unwrap());
    args.extend_from_slice(extra);
    let out = sharemesh(data, &args);
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("testnet.json")).unwrap_or_default())
            .unwrap_or_default();
    let pids: Vec<u64> = file["nodes"]
        .as_array()
        .map(|n| n.iter().filter_map(|n| n["pid"].as_u64()).collect())
        .unwrap_or_default();
    (out, file, pids)
}

#[test]
fn testnet_up_status_logs_down_leaves_no_process_behind() {
    let data = data_dir_with_model();
    let dir = data.path().join("net");
    let dir_arg = dir.to_str().unwrap();
    let (out, file, pids) = testnet_up(data.path(), &dir, &[]);
    let _first_guard = Guard(pids.clone());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("gateway: http://127.0.0.1:"), "{stdout}");
    assert_eq!(pids.len(), 3);
    let nodes = file["nodes"].as_array().unwrap();
    assert_eq!(nodes.iter().filter(|n| n["role"] == "provider").count(), 2);
    for node in nodes {
        assert!(node["peer_id"].as_str().unwrap().starts_with("12D3KooW"));
        assert!(node["listen"][0]
            .as_str()
            .unwrap()
            .starts_with("/ip4/127.0.0.1/tcp/"));
        assert!(node.get("adversary").is_some());
    }
    assert!(pids.iter().all(|&p| alive(p)));
    let gateway_http = nodes
        .iter()
        .filter(|n| n["role"] == "gateway")
        .find_map(|n| n["http"].as_str())
        .unwrap();
    assert_eq!(
        common::get_json(gateway_http, "/v1/network/providers")
            .as_array()
            .unwrap()
            .len(),
        2
    );

    let status =
        String::from_utf8(sharemesh(data.path(), &["testnet", "status", "--dir", dir_arg]).stdout)
            .unwrap();
    assert_eq!(status.matches("running").count(), 3, "{status}");
    let logs = sharemesh(
        data.path(),
        &["testnet", "logs", "--dir", dir_arg, "provider-0"],
    );
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains("\"level\""),
        "logs are JSON lines"
    );

    // Scenarios, small: load, churn (a provider is killed half-way and restarted), and
    // partition (the second provider is cut off from the gateway's side and healed).
    for kind in ["load", "churn", "partition"] {
        let out = sharemesh(
            data.path(),
            &[
                "testnet",
                "scenario",
                kind,
                "--dir",
                dir_arg,
                "--requests",
                "4",
                "--concurrency",
                "2",
                "--max-tokens",
                "6",
                "--duration",
                "150",
            ],
        );
        assert!(
            out.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join(format!("scenario-{kind}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(report["completed"], 4, "{kind}: {report}");
        assert!(report["ttft_ms_p50"].as_f64().unwrap() > 0.0);
        assert!(!report["paid_per_provider"].as_object().unwrap().is_empty());
        // Every delivered token is some provider's, and each provider's rate is its
        // tokens over the run.
        let served = report["tokens_per_second_per_provider"]
            .as_object()
            .unwrap();
        let seconds = report["seconds"].as_f64().unwrap();
        let tokens: f64 = served.values().map(|r| r.as_f64().unwrap() * seconds).sum();
        assert!(
            (3.5..=24.5).contains(&tokens),
            "{kind}: {tokens} tokens: {report}"
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("served"));
        assert!(String::from_utf8_lossy(&out.stdout).contains("completed"));
        if kind == "partition" {
            let p = &report["partition"];
            assert_eq!(p["with_gateway"].as_array().unwrap().len(), 2, "{p}");
            assert_eq!(p["cut_off"].as_array().unwrap().len(), 1, "{p}");
            assert!(p["completed_during_cut"].as_u64().unwrap() >= 1, "{p}");
            assert!(p["seconds_to_heal"].as_f64().is_some(), "never healed: {p}");
        }
    }
    // The churned provider was restarted under a new pid, which testnet.json records.
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("testnet.json")).unwrap()).unwrap();
    let pids: Vec<u64> = file["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["pid"].as_u64())
        .collect();
    let guard = Guard(pids.clone());
    let down = sharemesh(data.path(), &["testnet", "down", "--dir", dir_arg]);
    assert!(down.status.success());
    assert!(
        pids.iter().all(|&p| !alive(p)),
        "a process survived `testnet down`"
    );
    drop(guard);
}

#[test]
fn the_demo_runs_end_to_end() {
    let data = data_dir_with_model();
    let out = sharemesh(data.path(), &["demo"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let file: serde_json::Value = serde_json::from_slice(
        &std::fs::read(data.path().join("demo-testnet/testnet.json")).unwrap_or_default(),
    )
    .unwrap_or_default();
    let pids: Vec<u64> = file["nodes"]
        .as_array()
        .map(|n| n.iter().filter_map(|n| n["pid"].as_u64()).collect())
        .unwrap_or_default();
    let _guard = Guard(pids.clone());
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("failover"), "no failover shown:\n{stdout}");
    assert!(stderr.contains("[5/5]"), "{stderr}");
    assert!(
        stderr.contains("the answer continued on another provider"),
        "{stderr}"
    );
    assert_eq!(pids.len(), 4);
    assert!(
        pids.iter().all(|&p| !alive(p)),
        "the demo left processes behind"
    );
}

/// The in-process simulation (memory transport, emulated links, synthetic adverts, no
/// inference) delivers every advert to every node of a small mesh and reports it.
#[test]
fn an_in_process_simulation_spreads_every_advert() {
    let dir = tempfile::tempdir().unwrap();
    let out = sharemesh(
        dir.path(),
        &[
            "testnet",
            "simulate",
            "--nodes",
            "20",
            "--gateways",
            "2",
            "--duration",
            "20",
            "--advert-interval",
            "5",
            "--time-scale",
            "2",
            "--latency-ms",
            "30",
            "--loss",
            "0.01",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["nodes"], 20);
    assert!(
        report["adverts_published"].as_u64().unwrap() >= 18 * 3,
        "{report}"
    );
    assert_eq!(report["delivery_ratio"], 1.0, "{report}");
    assert_eq!(report["observer_events_lost"], 0, "{report}");
    // Two one-way hops of ≥ 30 ms of link latency at the least.
    assert!(
        report["delivery_p50_ms"].as_f64().unwrap() >= 30.0,
        "{report}"
    );
    assert!(
        report["connections_per_node"].as_f64().unwrap() >= 3.0,
        "{report}"
    );
    assert!(report["bytes_per_node_per_second"].as_f64().unwrap() > 0.0);
    let bad = sharemesh(dir.path(), &["testnet", "simulate", "--nodes", "1"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--nodes must be at least 2"));
}

/// The market simulation prints its table, writes the same rows as CSV, takes the
/// hedging switch, and refuses a bad flag with its name.
#[test]
fn the_market_simulation_prints_a_table_and_writes_csv() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("market.csv");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "testnet",
            "market-sim",
            "--providers",
            "20",
            "--requests",
            "800",
            "--csv",
            csv.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = sharemesh(dir.path(), &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            std::fs::read_to_string(&csv).unwrap(),
        )
    };
    let (table, rows) = run(&[]);
    for policy in ["auction", "random", "round_robin"] {
        assert!(table.contains(policy), "{table}");
    }
    let lines: Vec<&str> = rows.lines().collect();
    assert_eq!(lines.len(), 4, "{rows}");
    assert!(lines[0].starts_with("policy,gold_sla"), "{rows}");
    let (_, single) = run(&["--no-hedge-gold"]);
    assert_ne!(rows, single, "hedging changed nothing");
    let bad = sharemesh(dir.path(), &["testnet", "market-sim", "--load", "0"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--load must be in (0, 10]"));
}

#[test]
fn the_trust_simulation_prints_verified_and_control_rows() {
    let dir = tempfile::tempdir().unwrap();
    let out = sharemesh(
        dir.path(),
        &[
            "testnet",
            "trust-sim",
            "--providers",
            "30",
            "--jobs",
            "2000",
            "--buyers",
            "4",
            "--seeds",
            "1",
            "--ring",
            "5",
            "--control",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = reports.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    let (control, verified) = (&rows[0], &rows[1]);
    assert_eq!(control["verify"], false);
    assert!(
        control["garbage_paid_share"].as_f64().unwrap() > 0.1,
        "{control}"
    );
    assert!(
        verified["garbage_paid_share"].as_f64().unwrap() < 0.02,
        "{verified}"
    );
    assert_eq!(verified["honest_false_positives"], 0);
    let bad = sharemesh(dir.path(), &["testnet", "trust-sim", "--malicious", "2"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--malicious must be within 0..=1"));
}

/// `--netns`: every node in its own network namespace (a host of its own) joined by veth
/// pairs to a bridge; a chat completion crosses them, and `down` removes every
/// namespace and interface it made. Needs root; skipped with a message otherwise.
#[test]
fn a_netns_testnet_answers_across_namespaces_and_cleans_up() {
    if let Err(why) = netns_usable() {
        eprintln!("skipped: {why}");
        return;
    }
    // The second provider sits behind a NAT router where nftables is installed
    // (.ci/run installs it).
    let nat = common::testnet::nft_available();
    if !nat {
        eprintln!("NAT part skipped: `nft` (package nftables) is not installed");
    }
    let data = data_dir_with_model();
    let dir = data.path().join("net");
    let dir_arg = dir.to_str().unwrap();
    let flags: &[&str] = if nat {
        &["--netns", "--nat", "1"]
    } else {
        &["--netns"]
    };
    let (up, file, pids) = testnet_up(data.path(), &dir, flags);
    let guard = Guard(pids.clone());
    let namespaces = host_names(&file, "namespaces");
    let routers = host_names(&file, "routers");
    let cleanup = NetnsCleanup(namespaces.iter().chain(&routers).cloned().collect());
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert_eq!(namespaces.len(), 3);
    assert_eq!(routers.len(), usize::from(nat), "{file}");
    let gateway = file["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["role"] == "gateway")
        .unwrap();
    let http = gateway["http"].as_str().unwrap();
    assert!(!http.starts_with("127."), "{http}");
    assert!(gateway["netns"].as_str().is_some());
    let answer = Command::new("curl")
        .args(["-s", "-m", "120", &format!("http://{http}/v1/chat/completions")])
        .args(["-H", &format!("authorization: Bearer {}", gateway["api_key"].as_str().unwrap())])
        .args(["-H", "content-type: application/json"])
        .args(["-d", r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "temperature": 0}"#])
        .output()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&answer.stdout).unwrap_or_default();
    assert_eq!(
        answer["choices"][0]["message"]["content"], "The answer is 4.",
        "{answer}"
    );
    if nat {
        behind_nat_serves_over_its_own_connections(&file, gateway);
    }

    let down = sharemesh(data.path(), &["testnet", "down", "--dir", dir_arg]);
    assert!(down.status.success());
    assert!(pids.iter().all(|&p| !alive(p)));
    let listed = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        namespaces
            .iter()
            .chain(&routers)
            .all(|ns| !listed.contains(ns.as_str())),
        "{listed}"
    );
    let links = Command::new("ip")
        .args(["-brief", "link"])
        .output()
        .unwrap();
    let bridge = file["hosts"]["bridge"].as_str().unwrap();
    assert!(!String::from_utf8_lossy(&links.stdout).contains(bridge));
    drop(guard);
    drop(cleanup);
}

/// The provider behind the NAT router listens on a private address nobody can reach;
/// with the bootstrap provider killed it still serves the gateway, over the connection
/// it opened itself; a connection started from outside is dropped by its router.
fn behind_nat_serves_over_its_own_connections(
    file: &serde_json::Value,
    gateway: &serde_json::Value,
) {
    let nodes = file["nodes"].as_array().unwrap();
    let natted = nodes.iter().find(|n| n["nat_router"].is_string()).unwrap();
    let router = natted["nat_router"].as_str().unwrap();
    let private = natted["listen"][0].as_str().unwrap();
    assert!(private.starts_with("/ip4/192.168."), "{natted}");
    let bootstrap = &nodes[0];
    assert!(bootstrap["nat_router"].is_null());
    // It finds the gateway through the bootstrap (Kademlia) and dials it itself; only
    // then can the bootstrap go. Its API is reachable through the router's forward.
    let gateway_id = gateway["peer_id"].as_str().unwrap();
    wait_until(
        60,
        "the provider behind NAT to connect to the gateway",
        || {
            common::get_json_with_key(
                natted["http"].as_str().unwrap(),
                "/v1/network/peers",
                natted["api_key"].as_str(),
            )
            .as_array()
            .is_some_and(|peers| peers.iter().any(|p| p["peer_id"] == gateway_id))
        },
    );
    std::process::Command::new("kill")
        .args(["-9", &bootstrap["pid"].to_string()])
        .status()
        .unwrap();
    let http = gateway["http"].as_str().unwrap();
    let headers = Command::new("curl")
        .args(["-s", "-m", "120", "-o", "/dev/null", "-D", "-"])
        .arg(format!("http://{http}/v1/chat/completions"))
        .args(["-H", &format!("authorization: Bearer {}", gateway["api_key"].as_str().unwrap())])
        .args(["-H", "content-type: application/json"])
        .args(["-d", r#"{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Name a colour."}], "temperature": 0, "max_tokens": 8}"#])
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&headers.stdout).to_lowercase();
    let served_by = headers
        .lines()
        .find_map(|l| l.strip_prefix("x-sharemesh-provider:"))
        .unwrap_or_default()
        .trim()
        .to_owned();
    assert!(
        served_by.contains(&natted["peer_id"].as_str().unwrap().to_lowercase()),
        "{headers}"
    );
    // From the gateway's host, with a route to the private network through the router:
    // the router forwards nothing that starts outside.
    let gateway_ns = gateway["netns"].as_str().unwrap();
    let public = natted["http"].as_str().unwrap().split(':').next().unwrap();
    let subnet = private
        .split('/')
        .nth(2)
        .unwrap()
        .rsplit_once('.')
        .unwrap()
        .0;
    let status = Command::new("ip")
        .args([
            "-n",
            gateway_ns,
            "route",
            "add",
            &format!("{subnet}.0/24"),
            "via",
            public,
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let target = private.split('/').nth(2).unwrap();
    let connect = Command::new("ip")
        .args(["netns", "exec", gateway_ns, "timeout", "3", "bash", "-c"])
        .arg(format!("echo > /dev/tcp/{target}/4001"))
        .output()
        .unwrap();
    assert!(
        !connect.status.success(),
        "an inbound connection got through"
    );
    let rules = Command::new("ip")
        .args(["netns", "exec", router, "nft", "list", "ruleset"])
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout);
    let dropped = rules
        .lines()
        .find(|l| l.contains("unsolicited inbound"))
        .and_then(|l| l.split_whitespace().skip_while(|w| *w != "packets").nth(1))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(dropped > 0, "{rules}");
}

/// `demo --settle --json`: real processes on a real devnet (anvil). Each provider's
/// on-chain gain equals its final receipts in whole token units, the killed provider
/// (restarted) included, and nothing is left running — anvil included, stopped by pid.
#[test]
fn the_settling_demo_pays_each_provider_its_final_receipts_on_chain() {
    let data = data_dir_with_model();
    let out = sharemesh(data.path(), &["demo", "--settle", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let file: serde_json::Value = serde_json::from_slice(
        &std::fs::read(data.path().join("demo-testnet/testnet.json")).unwrap_or_default(),
    )
    .unwrap_or_default();
    let mut pids: Vec<u64> = file["nodes"]
        .as_array()
        .map(|n| n.iter().filter_map(|n| n["pid"].as_u64()).collect())
        .unwrap_or_default();
    let anvil: Option<u64> = stderr
        .split("anvil pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok());
    pids.extend(anvil);
    let _guard = Guard(pids.clone());
    assert!(out.status.success(), "demo --settle failed:\n{stderr}");
    assert!(stderr.contains("failover"), "no failover shown:\n{stderr}");
    assert!(stderr.contains("[7/7]"), "{stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(summary["decimals"], 6, "{summary}");
    let providers = summary["providers"].as_array().unwrap();
    assert_eq!(providers.len(), 3, "{summary}");
    let mut paid = 0;
    for provider in providers {
        let final_nano = provider["final_nano_usd"].as_u64().unwrap();
        let gain = provider["onchain_gain_units"].as_u64().unwrap();
        // Six decimals: a unit is 1,000 nano-USD, each channel rounded down once.
        assert_eq!(gain, final_nano / 1_000, "{provider}");
        paid += usize::from(gain > 0);
    }
    assert!(
        paid >= 2,
        "the provider killed mid-answer and the one that finished are both paid: {summary}"
    );
    assert!(anvil.is_some(), "the devnet's pid is shown: {stderr}");
    assert_eq!(pids.len(), 5);
    assert!(
        pids.iter().all(|&p| !alive(p)),
        "the demo left processes behind"
    );
}

/// A provider settling on chain (real processes, a real devnet) serves a buyer only once
/// its deposit covers the job: with nothing deposited the request is refused `Unfunded`
/// by the provider itself; after the deposit (read again in the provider's next round)
/// the same request is served, and the gateway's settlement view shows the deposit.
#[test]
fn a_provider_settling_on_chain_serves_a_buyer_only_while_its_deposit_covers_it() {
    use sharemesh_settlement::evm::{devnet, Escrow};
    use sharemesh_settlement::TokenUnits;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let anvil = devnet::Anvil::start().unwrap();
    let (token, escrow) = runtime.block_on(async {
        let token = devnet::deploy_test_token(anvil.url.clone(), devnet::anvil_dev_key())
            .await
            .unwrap();
        let escrow = Escrow::deploy(anvil.url.clone(), devnet::anvil_dev_key(), token, 3600)
            .await
            .unwrap();
        (token, escrow)
    });
    let chain = format!(
        "--chain-rpc {} --escrow {} --settle-every-secs 1",
        anvil.url,
        escrow.address()
    );
    let data = data_dir_with_model();
    let dir = data.path().join("net");
    let provider_args = format!("{chain} --min-redeem-usd 0.000001");
    let gateway_args = format!("{chain} --quote-k 0 --no-verify");
    let (out, file, pids) = testnet_up(
        data.path(),
        &dir,
        &[
            "--provider-args",
            &provider_args,
            "--gateway-args",
            &gateway_args,
        ],
    );
    let _guard = Guard(pids.clone());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nodes = file["nodes"].as_array().unwrap();
    let gateway = nodes.iter().find(|n| n["role"] == "gateway").unwrap();
    let gateway_http = gateway["http"].as_str().unwrap();
    let body = serde_json::json!({
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 8,
        "temperature": 0,
    });

    let refused = common::chat(gateway_http, &body);
    let why = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        why.contains("Unfunded") && why.contains("deposit"),
        "served without a deposit: {refused}"
    );

    // The buyer (the gateway's account) deposits; the providers read it next round.
    let view = common::get_json(gateway_http, "/v1/account/settlement");
    assert_eq!(view["on_chain"], true, "{view}");
    let account: sharemesh_settlement::Address =
        view["buyer"]["account"].as_str().unwrap().parse().unwrap();
    runtime.block_on(async {
        devnet::fund_gas(anvil.url.clone(), account).await.unwrap();
        devnet::mint(&escrow, token, account, TokenUnits(2_000_000))
            .await
            .unwrap();
        let buyer_dir = std::path::PathBuf::from(gateway["data_dir"].as_str().unwrap());
        let secret = sharemesh_node::identity::load_or_create(&buyer_dir)
            .unwrap()
            .secret();
        let buyer = escrow
            .as_account(sharemesh_settlement::AccountKey::derive(&secret).unwrap())
            .unwrap();
        assert_eq!(
            buyer.account(),
            account,
            "the gateway settles from its derived account"
        );
        buyer.deposit(token, TokenUnits(1_000_000)).await.unwrap();
    });
    let mut answer = serde_json::Value::Null;
    wait_until(20, "a request served once the deposit is read", || {
        answer = common::chat(gateway_http, &body);
        answer["choices"][0]["message"]["content"].is_string()
    });
    let view = common::get_json(gateway_http, "/v1/account/settlement");
    assert_eq!(view["buyer"]["deposit_units"], "1000000", "{view}");
    assert_eq!(view["decimals"], 6, "{view}");
}
