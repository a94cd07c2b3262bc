//! Several hosts on one machine: each node of a `--netns` testnet runs in its own Linux
//! network namespace, joined to a bridge in the root namespace by a veth pair, with its
//! own address in a /24 picked for this testnet. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN).
//! The root namespace holds the bridge's `.1` address, so tools on the host (and tests)
//! reach every node directly; nothing is routed beyond the bridge.
//!
//! A node may sit behind a NAT router instead (`--nat`): a namespace of its own between
//! the bridge and the node, holding the host's bridge address and a private /24
//! (`192.168.<i>.0`) towards the node. The router masquerades what the node sends out
//! and drops connections that start outside (nftables, as a home router does); only
//! the node's HTTP API (port 8080) is forwarded, so the testnet's own tools still reach
//! it. Its p2p port is not: other peers reach such a node only over connections it
//! opened itself, through a relay, or after hole punching (SPEC §8).
//!
//! Three kinds of router ([`NatKind`]), as RFC 4787 names their behaviour:
//! - `restricted`: endpoint-independent mapping (the source port is kept), address-and-
//!   port-dependent filtering (only replies to what the node sent get in): most home
//!   routers. Hole punching works (both sides send, each NAT sees a reply).
//! - `cone`: the same mapping, endpoint-independent filtering: once the node sent from a
//!   port, anyone may send to it (a dynamic nftables set of the ports it used, 5 min).
//! - `symmetric`: endpoint-dependent mapping (a random port per connection), so the
//!   port a peer observed is not the one the next peer would see: hole punching fails
//!   and only a relay carries jobs.
//!
//! Unsolicited packets to the router itself are dropped, not answered with a reset, as
//! home routers do (a reset would tear down a hole punch whose packets crossed early).

use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The namespaces and bridge of one testnet (recorded in `testnet.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hosts {
    /// Short tag in every interface and namespace name, unique per testnet.
    pub tag: String,
    pub bridge: String,
    /// `10.<a>.<b>` of the testnet's /24.
    pub prefix: String,
    pub namespaces: Vec<String>,
    /// Per node: the namespace of its NAT router, or `None` when it sits on the bridge.
    #[serde(default)]
    pub routers: Vec<Option<String>>,
    /// Per node: its router's kind (`None` on the bridge).
    #[serde(default)]
    pub nat_kinds: Vec<Option<NatKind>>,
}

/// How a NAT router maps and filters (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NatKind {
    Cone,
    #[default]
    Restricted,
    Symmetric,
}

/// Whether this process can make namespaces (effective uid 0).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

/// The port a NAT router forwards to its node: the node's HTTP API.
pub const FORWARDED_HTTP_PORT: u16 = 8080;

fn ip(args: &[&str]) -> Result<()> {
    ip_with_input(args, None)
}

/// Runs `ip args` (iproute2), feeding it `input` on stdin when given.
fn ip_with_input(args: &[&str], input: Option<&str>) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running `ip` (iproute2) for --netns")?;
    if let (Some(mut stdin), Some(input)) = (child.stdin.take(), input) {
        stdin
            .write_all(input.as_bytes())
            .with_context(|| format!("feeding `ip {}`", args.join(" ")))?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Hosts {
    /// Creates the bridge and `count` namespaces, putting node `i` behind a NAT router
    /// where `natted(i)`; on failure undoes what it made.
    pub fn create(count: usize, natted: impl Fn(usize) -> Option<NatKind>) -> Result<Hosts> {
        if !is_root() {
            bail!("--netns needs root (it creates network namespaces and veth pairs); run as root or leave --netns out");
        }
        if count > 250 {
            bail!("--netns supports up to 250 nodes (one /24)");
        }
        if (0..count).any(|i| natted(i).is_some()) && !nft_available() {
            bail!("--nat needs nftables for its routers: install the `nftables` package (`apt-get install nftables`) or leave --nat out");
        }
        let pid = std::process::id();
        let tag = format!("{:x}", pid % 0xfffff);
        let mut hosts = Hosts {
            bridge: format!("smb{tag}"),
            prefix: format!("10.{}.{}", 200 + (pid / 250) % 50, pid % 250),
            tag,
            namespaces: Vec::new(),
            routers: Vec::new(),
            nat_kinds: Vec::new(),
        };
        if let Err(err) = hosts.build(count, natted) {
            hosts.destroy();
            return Err(err);
        }
        Ok(hosts)
    }

    fn build(&mut self, count: usize, natted: impl Fn(usize) -> Option<NatKind>) -> Result<()> {
        let bridge = self.bridge.clone();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", self.prefix),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..count {
            let ns = format!("sm{}-{i}", self.tag);
            ip(&["netns", "add", &ns])?;
            self.namespaces.push(ns.clone());
            // The namespace on the bridge: the node itself, or its router.
            let kind = natted(i);
            self.nat_kinds.push(kind);
            let on_bridge = if kind.is_some() {
                let router = format!("sm{}-r{i}", self.tag);
                ip(&["netns", "add", &router])?;
                self.routers.push(Some(router.clone()));
                router
            } else {
                self.routers.push(None);
                ns.clone()
            };
            let host_side = format!("smv{}x{i}", self.tag);
            let bridge_side = format!("smn{}x{i}", self.tag);
            ip(&[
                "link",
                "add",
                &host_side,
                "type",
                "veth",
                "peer",
                "name",
                &bridge_side,
            ])?;
            ip(&["link", "set", &bridge_side, "netns", &on_bridge])?;
            ip(&["link", "set", &host_side, "master", &bridge, "up"])?;
            let address = format!("{}/24", self.address(i));
            ip(&[
                "-n",
                &on_bridge,
                "addr",
                "add",
                &address,
                "dev",
                &bridge_side,
            ])?;
            ip(&["-n", &on_bridge, "link", "set", &bridge_side, "up"])?;
            ip(&["-n", &on_bridge, "link", "set", "lo", "up"])?;
            if let Some(kind) = kind {
                self.build_router(i, kind, &on_bridge, &bridge_side, &ns)?;
            }
        }
        Ok(())
    }

    /// The private link from router to node, the node's default route, and the router's
    /// forwarding and nftables rules.
    fn build_router(
        &self,
        i: usize,
        kind: NatKind,
        router: &str,
        wan: &str,
        node: &str,
    ) -> Result<()> {
        let lan = format!("sml{}x{i}", self.tag);
        let node_side = format!("smp{}x{i}", self.tag);
        ip(&[
            "link", "add", &lan, "type", "veth", "peer", "name", &node_side,
        ])?;
        ip(&["link", "set", &lan, "netns", router])?;
        ip(&["link", "set", &node_side, "netns", node])?;
        let private = private_prefix(i);
        ip(&[
            "-n",
            router,
            "addr",
            "add",
            &format!("{private}.1/24"),
            "dev",
            &lan,
        ])?;
        ip(&["-n", router, "link", "set", &lan, "up"])?;
        ip(&[
            "-n",
            node,
            "addr",
            "add",
            &format!("{private}.2/24"),
            "dev",
            &node_side,
        ])?;
        ip(&["-n", node, "link", "set", &node_side, "up"])?;
        ip(&["-n", node, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            node,
            "route",
            "add",
            "default",
            "via",
            &format!("{private}.1"),
        ])?;
        in_namespace(router, "sysctl", &["-qw", "net.ipv4.ip_forward=1"], None)?;
        let rules = router_rules(kind, wan, &lan, &private);
        in_namespace(router, "nft", &["-f", "-"], Some(&rules))
    }

    /// Node `i`'s address on the bridge (its router's, when it is behind one): where the
    /// testnet's tools reach it.
    pub fn address(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, i + 2)
    }

    /// The address node `i` listens on: its private one behind a router.
    pub fn listen_address(&self, i: usize) -> String {
        if self.behind_nat(i) {
            format!("{}.2", private_prefix(i))
        } else {
            self.address(i)
        }
    }

    pub fn behind_nat(&self, i: usize) -> bool {
        self.routers.get(i).is_some_and(Option::is_some)
    }

    /// Deletes the namespaces, their veth pairs and the bridge; errors
    /// are ignored so that a half-made set is cleaned as far as possible.
    pub fn destroy(&self) {
        for (i, ns) in self.namespaces.iter().enumerate() {
            let _ = ip(&["netns", "del", ns]);
            if let Some(Some(router)) = self.routers.get(i) {
                let _ = ip(&["netns", "del", router]);
            }
            // Normally gone with its namespace; not if a process still held it.
            let _ = ip(&["link", "del", &format!("smv{}x{i}", self.tag)]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// The nftables ruleset of a router of `kind` between `wan` (the bridge) and `lan`
/// (the node at `<private>.2`).
fn router_rules(kind: NatKind, wan: &str, lan: &str, private: &str) -> String {
    // Cone: forward to the node any port it has sent from (the set is filled below).
    let (cone_set, cone_forward, cone_learn) = match kind {
        NatKind::Cone => (
            "  set opened { type inet_service; flags dynamic,timeout; timeout 5m; }\n",
            format!("    iifname \"{wan}\" tcp dport @opened counter dnat to {private}.2\n"),
            format!("    iifname \"{lan}\" meta l4proto tcp update @opened {{ tcp sport }}\n"),
        ),
        _ => ("", String::new(), String::new()),
    };
    // Symmetric: a random port per connection instead of the node's own.
    let masquerade = match kind {
        NatKind::Symmetric => "masquerade random",
        _ => "masquerade",
    };
    format!(
        "table ip sharemesh_nat {{
{cone_set}  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname \"{wan}\" tcp dport {FORWARDED_HTTP_PORT} counter dnat to {private}.2
{cone_forward}  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname \"{wan}\" counter {masquerade}
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname \"{wan}\" ct state new counter drop comment \"silent on unsolicited\"
  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
{cone_learn}    ct state established,related accept
    iifname \"{lan}\" accept
    ct status dnat accept
    counter comment \"unsolicited inbound\"
  }}
}}
"
    )
}

/// Node `i`'s private /24 behind its router (each router has its own namespace, so these
/// repeat harmlessly across testnets).
fn private_prefix(i: usize) -> String {
    format!("192.168.{}", i % 250)
}

fn nft_available() -> bool {
    Command::new("nft")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `program args` inside namespace `ns`, feeding it `input` on stdin.
fn in_namespace(ns: &str, program: &str, args: &[&str], input: Option<&str>) -> Result<()> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    ip_with_input(&all, input)
}
