//! Several hosts on one machine: each node of a `--netns` testnet runs in its own Linux
//! network namespace, joined to a bridge in the root namespace by a veth pair, with its
//! own address in a /24 picked for this testnet. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN).
//! The root namespace holds the bridge's `.1` address, so tools on the host (and tests)
//! reach every node directly; nothing is routed beyond the bridge.

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

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running `ip` (iproute2) for --netns")?;
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
    /// Creates the bridge and `count` namespaces; on failure undoes what it made.
    pub fn create(count: usize) -> Result<Hosts> {
        if !is_root() {
            bail!("--netns needs root (it creates network namespaces and veth pairs); run as root or leave --netns out");
        }
        if count > 250 {
            bail!("--netns supports up to 250 nodes (one /24)");
        }
        let pid = std::process::id();
        let tag = format!("{:x}", pid % 0xfffff);
        let mut hosts = Hosts {
            bridge: format!("smb{tag}"),
            prefix: format!("10.{}.{}", 200 + (pid / 250) % 50, pid % 250),
            tag,
            namespaces: Vec::new(),
        };
        if let Err(err) = hosts.build(count) {
            hosts.destroy();
            return Err(err);
        }
        Ok(hosts)
    }

    fn build(&mut self, count: usize) -> Result<()> {
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
            let host_side = format!("smv{}x{i}", self.tag);
            let node_side = format!("smn{}x{i}", self.tag);
            ip(&["netns", "add", &ns])?;
            self.namespaces.push(ns.clone());
            ip(&[
                "link", "add", &host_side, "type", "veth", "peer", "name", &node_side,
            ])?;
            ip(&["link", "set", &node_side, "netns", &ns])?;
            ip(&["link", "set", &host_side, "master", &bridge, "up"])?;
            let address = format!("{}/24", self.address(i));
            ip(&["-n", &ns, "addr", "add", &address, "dev", &node_side])?;
            ip(&["-n", &ns, "link", "set", &node_side, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// Node `i`'s address.
    pub fn address(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, i + 2)
    }

    /// Deletes the namespaces, their veth pairs and the bridge; errors
    /// are ignored so that a half-made set is cleaned as far as possible.
    pub fn destroy(&self) {
        for (i, ns) in self.namespaces.iter().enumerate() {
            let _ = ip(&["netns", "del", ns]);
            // Normally gone with its namespace; not if a process still held it.
            let _ = ip(&["link", "del", &format!("smv{}x{i}", self.tag)]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}
