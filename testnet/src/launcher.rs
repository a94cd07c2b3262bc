//! Starts, inspects and stops a local testnet of `sharemesh` processes on loopback.
//! The first provider doubles as the bootstrap node; every node gets its own data
//! folder under the testnet folder, and its logs go to `<node>/node.log`.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{NodeRecord, NodeRole, TestnetFile};

#[derive(Clone, Debug)]
pub struct UpOptions {
    /// The `sharemesh` binary to run.
    pub binary: PathBuf,
    pub dir: PathBuf,
    pub providers: usize,
    pub gateways: usize,
    /// First port; node i listens on base + i and gateway j serves HTTP on base + 100 + j.
    /// 0 picks free ports.
    pub base_port: u16,
    /// Catalog name or GGUF path given to every provider.
    pub model: String,
    /// Extra flags for every provider (split on whitespace).
    pub provider_args: Vec<String>,
    /// Extra flags for every gateway (split on whitespace).
    pub gateway_args: Vec<String>,
    /// Extra flags per provider index, for adversaries and scenarios.
    pub per_provider_args: Vec<(usize, Vec<String>)>,
    /// Emulated-link flags for every node, providers and gateways (`--link-latency-ms`
    /// …); when set, node `k` (providers first) also gets `--link-seed link_seed + k`.
    pub link_args: Vec<String>,
    pub link_seed: u64,
    /// Where progress goes (bars on a terminal).
    pub progress: std::sync::Arc<crate::progress::Reporter>,
    pub ready_timeout: Duration,
    /// Each node in its own network namespace (root only; see [`crate::netns`]).
    pub netns: bool,
    /// With `netns`: this many providers, the last ones, sit behind NAT routers.
    pub nat: usize,
    /// With `netns`: this many gateways (buyers), the last ones, sit behind NAT routers.
    pub nat_gateways: usize,
    /// The kind of the providers' NAT routers.
    pub nat_kind: crate::netns::NatKind,
    /// The kind of the gateways' NAT routers.
    pub nat_buyer_kind: crate::netns::NatKind,
}

pub const TESTNET_FILE: &str = "testnet.json";

/// Every node of a `--netns` testnet serves its HTTP API on this port of its own address.
const HTTP_PORT: u16 = crate::netns::FORWARDED_HTTP_PORT;

/// Node `index`'s emulated-link flags: the shared ones and its own seed.
fn link_args(options: &UpOptions, index: usize) -> Vec<String> {
    if options.link_args.is_empty() {
        return Vec::new();
    }
    let mut args = options.link_args.clone();
    let seed = options.link_seed.wrapping_add(index as u64);
    args.extend(["--link-seed".to_owned(), seed.to_string()]);
    args
}

/// The HTTP address a node's ready line says it bound.
fn bound_http(ready: &serde_json::Value) -> Option<String> {
    ready["http"].as_str().map(str::to_owned)
}

/// A loopback node started on port 0 restarts on the ports it bound (peers know it
/// there): its saved arguments get them in place of the zeros.
fn pin_bound_ports(data_dir: &Path, ready: &serde_json::Value) -> Result<()> {
    let path = data_dir.join("args.json");
    let (binary, mut args, netns): (PathBuf, Vec<String>, Option<String>) =
        serde_json::from_slice(&fs::read(&path)?)?;
    let tcp = listen_addresses(ready)
        .into_iter()
        .find(|a| a.starts_with("/ip4/127.0.0.1/tcp/") && !a.contains("p2p-circuit"));
    for (flag, bound) in [("--listen", tcp), ("--http", bound_http(ready))] {
        let Some(bound) = bound else { continue };
        if let Some(at) = args.iter().position(|a| a == flag) {
            if let Some(value) = args.get_mut(at + 1) {
                *value = bound;
            }
        }
    }
    fs::write(&path, serde_json::to_vec(&(binary, args, netns))?)?;
    Ok(())
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| !stat.contains(") Z "))
            .unwrap_or(false)
}

/// Starts one node and waits for its `ready` line (written to `<dir>/ready.json`).
fn start_node(
    binary: &Path,
    data_dir: &Path,
    args: &[String],
    timeout: Duration,
    netns: Option<&str>,
) -> Result<(u32, serde_json::Value)> {
    fs::create_dir_all(data_dir)?;
    // Kept so a scenario can restart the node exactly as it was started.
    fs::write(
        data_dir.join("args.json"),
        serde_json::to_vec(&(binary, args, netns))?,
    )?;
    let ready_path = data_dir.join("ready.json");
    let _ = fs::remove_file(&ready_path);
    let log = File::create(data_dir.join("node.log"))?;
    // `ip netns exec` enters the namespace and execs the node: the pid is the node's.
    let mut command = match netns {
        Some(ns) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", ns]).arg(binary);
            command
        }
        None => Command::new(binary),
    };
    let child = command
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--log-format")
        .arg("json")
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&ready_path)?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = child.id();
    // The node outlives this command: it is tracked by pid in testnet.json.
    drop(child);
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = fs::read_to_string(&ready_path) {
            if let Some(line) = text.lines().next() {
                if let Ok(ready) = serde_json::from_str::<serde_json::Value>(line) {
                    return Ok((pid, ready));
                }
            }
        }
        if !pid_alive(pid) {
            let log = fs::read_to_string(data_dir.join("node.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            bail!(
                "node in {} exited during start-up; last log lines:\n{}",
                data_dir.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if Instant::now() > deadline {
            bail!(
                "node in {} was not ready after {timeout:?}; see its node.log",
                data_dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `sharemesh keys create --admin` in a node's folder (a node whose API listens off
/// loopback requires keys on every route, and the partition scenario blocks peers);
/// returns the secret it prints once.
fn create_api_key(binary: &Path, data_dir: &Path) -> Result<String> {
    fs::create_dir_all(data_dir)?;
    let out = Command::new(binary)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["keys", "create", "--name", "testnet", "--admin"])
        .stdin(Stdio::null())
        .output()
        .context("creating the gateway's API key")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    text.split_whitespace()
        .find(|w| w.starts_with("sk-sm-"))
        .map(str::to_owned)
        .with_context(|| format!("`keys create` printed no key: {text}"))
}

/// The multiaddrs a node's ready line says it listens on.
fn listen_addresses(ready: &serde_json::Value) -> Vec<String> {
    ready["listen"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn providers_seen(http: &str, key: Option<&str>) -> usize {
    let url = format!("http://{http}/v1/network/providers");
    let fetch = || -> Option<usize> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        runtime.block_on(async {
            let request = crate::authorized(reqwest::Client::new().get(&url), key);
            let body: serde_json::Value = request.send().await.ok()?.json().await.ok()?;
            body.as_array().map(Vec::len)
        })
    };
    fetch().unwrap_or(0)
}

/// Starts the testnet and returns its description (also written to `DIR/testnet.json`).
pub fn up(options: &UpOptions) -> Result<TestnetFile> {
    let dir = &options.dir;
    if dir.join(TESTNET_FILE).exists()
        && status(dir)
            .map(|s| s.iter().any(|(_, alive)| *alive))
            .unwrap_or(false)
    {
        bail!(
            "a testnet is already running in {}; run `sharemesh testnet down --dir {}` first",
            dir.display(),
            dir.display()
        );
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut file = TestnetFile::default();
    if (options.nat > 0 || options.nat_gateways > 0) && !options.netns {
        bail!(
            "--nat and --nat-buyers put nodes behind NAT routers between network namespaces: they need --netns"
        );
    }
    if options.nat_gateways > options.gateways {
        bail!(
            "--nat-buyers {} is more than the {} gateways",
            options.nat_gateways,
            options.gateways
        );
    }
    if options.nat > 0 && options.nat >= options.providers {
        bail!(
            "--nat {} leaves no provider on the open network: the first provider is every node's bootstrap, so at most {} of {} can sit behind NAT",
            options.nat,
            options.providers.saturating_sub(1),
            options.providers
        );
    }
    if options.netns {
        options
            .progress
            .step("creating a network namespace per node");
        let first_natted = options.providers - options.nat;
        let first_natted_gateway = options.providers + options.gateways - options.nat_gateways;
        let natted = |i: usize| {
            if i >= first_natted_gateway {
                Some(options.nat_buyer_kind)
            } else {
                (i >= first_natted && i < options.providers).then_some(options.nat_kind)
            }
        };
        file.hosts = Some(crate::netns::Hosts::create(
            options.providers + options.gateways,
            natted,
        )?);
        // Recorded before any node starts, so `down` removes them whatever happens.
        write(dir, &file)?;
    }
    let hosts = file.hosts.clone();
    // In its own namespace every node has the whole port range to itself.
    // (listen address, address the tools reach, namespace, NAT router).
    let host = |i: usize| -> Option<(String, String, String, Option<String>)> {
        hosts.as_ref().map(|h| {
            (
                h.listen_address(i),
                h.address(i),
                h.namespaces[i].clone(),
                h.routers.get(i).cloned().flatten(),
            )
        })
    };
    // Port 0 unless a base port is given: each node binds a free port itself and its
    // ready line says which (a port picked here and passed on could be taken by
    // another process before the node bound it: CI saw "Address already in use").
    let port = |offset: u16| -> u16 {
        match options.base_port {
            0 => 0,
            base => base + offset,
        }
    };
    let mut bootstrap: Option<String> = None;
    for i in 0..options.providers {
        options.progress.count(
            "starting nodes",
            i as u64,
            (options.providers + options.gateways) as u64,
        );
        let data_dir = dir.join(format!("provider-{i}"));
        // Providers serve their network API too (loopback only: earnings, peers, and
        // the block list that the partition scenario uses).
        let (listen, http, bind_http, netns, nat_router) = match host(i) {
            Some((own, reachable, ns, router)) => (
                format!("/ip4/{own}/tcp/4001"),
                format!("{reachable}:{HTTP_PORT}"),
                format!("{own}:{HTTP_PORT}"),
                Some(ns),
                router,
            ),
            None => {
                let http = format!("127.0.0.1:{}", port(200 + i as u16));
                (
                    format!("/ip4/127.0.0.1/tcp/{}", port(i as u16)),
                    http.clone(),
                    http,
                    None,
                    None,
                )
            }
        };
        let mut args: Vec<String> = vec![
            "provide".into(),
            "--model".into(),
            options.model.clone(),
            "--listen".into(),
            listen,
            "--http".into(),
            bind_http,
        ];
        // The bootstrap needs no flag to learn it is reachable, even when every other
        // node is behind NAT and AutoNAT cannot ask any of them: peers on two hosts
        // dialling it where it listens confirm it (SPEC §8).
        if let Some(boot) = &bootstrap {
            args.extend(["--bootstrap".into(), boot.clone()]);
        }
        args.extend(options.provider_args.iter().cloned());
        let api_key = match netns {
            Some(_) => Some(create_api_key(&options.binary, &data_dir)?),
            None => None,
        };
        args.extend(link_args(options, i));
        let mut adversary = None;
        for (index, extra) in &options.per_provider_args {
            if *index == i {
                args.extend(extra.iter().cloned());
                if let Some(pos) = extra.iter().position(|a| a == "--adversary") {
                    adversary = extra.get(pos + 1).cloned();
                }
            }
        }
        let (pid, ready) = start_node(
            &options.binary,
            &data_dir,
            &args,
            options.ready_timeout,
            netns.as_deref(),
        )?;
        if netns.is_none() && options.base_port == 0 {
            pin_bound_ports(&data_dir, &ready)?;
        }
        let listen = listen_addresses(&ready);
        if bootstrap.is_none() {
            bootstrap = listen.first().cloned();
        }
        file.nodes.push(NodeRecord {
            role: NodeRole::Provider,
            pid,
            peer_id: ready["peer_id"].as_str().unwrap_or_default().to_owned(),
            listen,
            // On loopback the node bound it (port 0); in a namespace tools reach it at
            // the host's address, not the one it bound.
            http: Some(match &netns {
                None => bound_http(&ready).unwrap_or(http),
                Some(_) => http,
            }),
            data_dir: data_dir.display().to_string(),
            adversary,
            netns,
            nat_router,
            api_key,
        });
        write(dir, &file)?;
    }
    let bootstrap = bootstrap.context("a testnet needs at least one provider")?;
    for j in 0..options.gateways {
        options.progress.count(
            "starting nodes",
            (options.providers + j) as u64,
            (options.providers + options.gateways) as u64,
        );
        let data_dir = dir.join(format!("gateway-{j}"));
        // (listen, address the tools reach, address the API binds, namespace, router)
        let (listen, http, bind_http, netns, nat_router) = match host(options.providers + j) {
            Some((own, reachable, ns, router)) => (
                format!("/ip4/{own}/tcp/4001"),
                format!("{reachable}:{HTTP_PORT}"),
                format!("{own}:{HTTP_PORT}"),
                Some(ns),
                router,
            ),
            None => {
                let http = format!("127.0.0.1:{}", port(100 + j as u16));
                (
                    format!("/ip4/127.0.0.1/tcp/{}", port(50 + j as u16)),
                    http.clone(),
                    http,
                    None,
                    None,
                )
            }
        };
        let mut args: Vec<String> = vec![
            "gateway".into(),
            "--listen".into(),
            listen,
            "--bootstrap".into(),
            bootstrap.clone(),
            "--http".into(),
            bind_http,
        ];
        args.extend(options.gateway_args.iter().cloned());
        args.extend(link_args(options, options.providers + j));
        // Off loopback the API requires a key: make one for it.
        let api_key = match netns {
            Some(_) => Some(create_api_key(&options.binary, &data_dir)?),
            None => None,
        };
        let (pid, ready) = start_node(
            &options.binary,
            &data_dir,
            &args,
            options.ready_timeout,
            netns.as_deref(),
        )?;
        if netns.is_none() && options.base_port == 0 {
            pin_bound_ports(&data_dir, &ready)?;
        }
        file.nodes.push(NodeRecord {
            role: NodeRole::Gateway,
            pid,
            peer_id: ready["peer_id"].as_str().unwrap_or_default().to_owned(),
            listen: listen_addresses(&ready),
            // On loopback the node bound it (port 0); in a namespace tools reach it at
            // the host's address, not the one it bound.
            http: Some(match &netns {
                None => bound_http(&ready).unwrap_or(http),
                Some(_) => http,
            }),
            data_dir: data_dir.display().to_string(),
            adversary: None,
            netns,
            nat_router,
            api_key,
        });
        write(dir, &file)?;
    }
    let total = (options.providers + options.gateways) as u64;
    options.progress.count("starting nodes", total, total);
    wait_for_mesh(options, &file)?;
    options.progress.finish();
    Ok(file)
}

/// Waits until every gateway's order book lists every provider, counting the adverts
/// seen over all gateways as the mesh forms.
fn wait_for_mesh(options: &UpOptions, file: &TestnetFile) -> Result<()> {
    let deadline = Instant::now() + options.ready_timeout;
    let gateways: Vec<&NodeRecord> = file
        .nodes
        .iter()
        .filter(|n| n.role == NodeRole::Gateway)
        .collect();
    let expected = (gateways.len() * options.providers) as u64;
    loop {
        let seen: Vec<usize> = gateways
            .iter()
            .map(|g| providers_seen(g.http.as_deref().unwrap_or_default(), g.api_key.as_deref()))
            .collect();
        let total: u64 = seen.iter().map(|&n| n.min(options.providers) as u64).sum();
        options
            .progress
            .count("mesh forming (adverts at gateways)", total, expected);
        if total >= expected {
            return Ok(());
        }
        if Instant::now() > deadline {
            let (gateway, short) = gateways
                .iter()
                .zip(&seen)
                .find(|(_, &n)| n < options.providers)
                .map(|(g, &n)| (g.http.clone().unwrap_or_default(), n))
                .unwrap_or_default();
            bail!(
                "gateway {gateway} saw only {short} of {} providers",
                options.providers
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn write(dir: &Path, file: &TestnetFile) -> Result<()> {
    let path = dir.join(TESTNET_FILE);
    fs::write(&path, serde_json::to_vec_pretty(file)?)
        .with_context(|| format!("writing {}", path.display()))
}

pub fn read(dir: &Path) -> Result<TestnetFile> {
    let path = dir.join(TESTNET_FILE);
    let bytes = fs::read(&path)
        .with_context(|| format!("no testnet in {} (missing {TESTNET_FILE})", dir.display()))?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a valid testnet file", path.display()))
}

/// Each node and whether its process is alive.
pub fn status(dir: &Path) -> Result<Vec<(NodeRecord, bool)>> {
    Ok(read(dir)?
        .nodes
        .into_iter()
        .map(|n| {
            let alive = pid_alive(n.pid);
            (n, alive)
        })
        .collect())
}

fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// Restarts a node from its data folder with the arguments it was first started with
/// (same identity, ledger and address book), and records its new pid.
pub fn restart_node(data_dir: &Path) -> Result<u32> {
    let saved = fs::read(data_dir.join("args.json"))
        .with_context(|| format!("{} has no args.json", data_dir.display()))?;
    let (binary, args, netns): (PathBuf, Vec<String>, Option<String>) =
        serde_json::from_slice(&saved)?;
    let (pid, _) = start_node(
        &binary,
        data_dir,
        &args,
        Duration::from_secs(120),
        netns.as_deref(),
    )?;
    let testnet_dir = data_dir
        .parent()
        .context("a node folder sits inside its testnet folder")?;
    let mut file = read(testnet_dir)?;
    for node in &mut file.nodes {
        if Path::new(&node.data_dir) == data_dir {
            node.pid = pid;
        }
    }
    write(testnet_dir, &file)?;
    Ok(pid)
}

/// Kills one node with SIGKILL (scenarios, the demo).
pub fn kill_node(pid: u32) {
    signal(pid, "KILL");
}

/// Stops every process the testnet started (only those, by pid) and waits for them.
pub fn down(dir: &Path) -> Result<usize> {
    let file = read(dir)?;
    let nodes = file.nodes;
    let mut stopped = 0;
    for node in &nodes {
        if pid_alive(node.pid) {
            signal(node.pid, "TERM");
            stopped += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for node in &nodes {
        while pid_alive(node.pid) {
            if Instant::now() > deadline {
                signal(node.pid, "KILL");
                std::thread::sleep(Duration::from_millis(100));
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if let Some(hosts) = &file.hosts {
        hosts.destroy();
    }
    Ok(stopped)
}

/// The log file of a node, chosen by index, peer id or role-index (`provider-0`).
pub fn log_path(dir: &Path, node: &str) -> Result<PathBuf> {
    let file = read(dir)?;
    let found = file.nodes.iter().enumerate().find(|(i, n)| {
        i.to_string() == node
            || n.peer_id == node
            || Path::new(&n.data_dir)
                .file_name()
                .is_some_and(|f| f == node)
    });
    match found {
        Some((_, n)) => Ok(Path::new(&n.data_dir).join("node.log")),
        None => bail!(
            "no node `{node}` in this testnet (use an index, a peer id or a name like provider-0)"
        ),
    }
}
