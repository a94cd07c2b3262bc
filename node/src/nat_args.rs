//! The NAT-traversal flags shared by `provide` and `gateway` (SPEC §8).

use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use sharemesh_mesh::behaviour::RelayLimits;
use sharemesh_mesh::reachability::{NatConfig, ReachabilityMode};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Reachability {
    /// Ask peers to dial our addresses back (AutoNAT v2).
    #[default]
    Auto,
    /// Reachable (a public address or a port forward): relay for others.
    Public,
    /// Behind NAT: reserve relays at once.
    Private,
}

#[derive(Args, Debug, Clone)]
pub struct NatArgs {
    /// How the node learns whether peers can dial it.
    #[arg(long, value_enum, default_value_t = Reachability::Auto)]
    pub reachability: Reachability,
    /// Relays to hold reservations on while unreachable (0: none; then only peers this
    /// node dialled can reach it).
    #[arg(long, default_value_t = sharemesh_mesh::reachability::DEFAULT_RELAYS)]
    pub relays: usize,
    /// Never relay for others (by default a reachable node relays within the limits below).
    #[arg(long)]
    pub no_relay_server: bool,
    /// Relay server: circuits open at once.
    #[arg(long, default_value_t = RelayLimits::default().max_circuits)]
    pub relay_max_circuits: usize,
    /// Relay server: reservations held at once.
    #[arg(long, default_value_t = RelayLimits::default().max_reservations)]
    pub relay_max_reservations: usize,
    /// Relay server: a circuit closes after this many KiB (both directions together).
    #[arg(long, default_value_t = RelayLimits::default().max_circuit_bytes / 1024)]
    pub relay_circuit_kib: u64,
    /// Relay server: a circuit closes after this many seconds.
    #[arg(long, default_value_t = RelayLimits::default().max_circuit_duration.as_secs())]
    pub relay_circuit_secs: u64,
    /// An address peers can reach this node at that it cannot see itself (a port
    /// forward, a cloud host's 1:1 NAT), e.g. `/ip4/203.0.113.7/tcp/4001`; repeatable.
    /// Confirmed once peers on two hosts dial the node and see it there (or AutoNAT
    /// dials it back) — a claim, not a verdict.
    #[arg(long = "external-address", value_name = "MULTIADDR")]
    pub external_address: Vec<String>,
    /// No AutoNAT, relays or hole punching at all.
    #[arg(long)]
    pub no_nat_traversal: bool,
    /// Testnet adversary kit: a relay that grants reservations and then refuses every
    /// circuit (the nodes it holds look reachable through it and are not). Refused by
    /// a build without the kit (the shipped binary).
    #[arg(long, hide = true)]
    pub adversary_blackhole_relay: bool,
}

/// Most relays worth holding: each is a connection kept open and a reservation renewed.
const MAX_RELAYS: usize = 8;
/// Most `--external-address`es.
const MAX_EXTERNAL: usize = 8;

/// Whether this binary carries the adversary kit (a testnet's build; never a shipped
/// one, nor the light client).
fn adversary_kit_built() -> bool {
    #[cfg(feature = "provider")]
    return sharemesh_provider::adversary::KIT;
    #[cfg(not(feature = "provider"))]
    return false;
}

impl NatArgs {
    pub fn config(&self) -> Result<NatConfig> {
        if self.adversary_blackhole_relay && !adversary_kit_built() {
            bail!(
                "--adversary-blackhole-relay: this build has no adversary kit (build the \
                 testnet's binary with `cargo build -p sharemesh-node --features adversary`)"
            );
        }
        if self.no_nat_traversal {
            return Ok(NatConfig::OFF);
        }
        if self.relays > MAX_RELAYS {
            bail!("--relays {} is more than {MAX_RELAYS}", self.relays);
        }
        if !(1..=4096).contains(&self.relay_max_circuits) {
            bail!("--relay-max-circuits must be within 1..=4096 (use --no-relay-server to serve none), got {}", self.relay_max_circuits);
        }
        if !(1..=65_536).contains(&self.relay_max_reservations) {
            bail!(
                "--relay-max-reservations must be within 1..=65536, got {}",
                self.relay_max_reservations
            );
        }
        if !(16..=1 << 20).contains(&self.relay_circuit_kib) {
            bail!(
                "--relay-circuit-kib must be within 16..=1048576, got {}",
                self.relay_circuit_kib
            );
        }
        if !(5..=86_400).contains(&self.relay_circuit_secs) {
            bail!(
                "--relay-circuit-secs must be within 5..=86400, got {}",
                self.relay_circuit_secs
            );
        }
        let mut external = Vec::new();
        for text in &self.external_address {
            let address: libp2p::Multiaddr = text
                .parse()
                .map_err(|e| anyhow::anyhow!("--external-address {text}: not a multiaddr ({e})"))?;
            if !sharemesh_mesh::reachability::is_direct_dialable(&address) {
                bail!("--external-address {text}: must name a host and a TCP or UDP port, and no relay (e.g. /ip4/203.0.113.7/tcp/4001)");
            }
            external.push(address);
        }
        if external.len() > MAX_EXTERNAL {
            bail!(
                "--external-address given {} times: at most {MAX_EXTERNAL}",
                external.len()
            );
        }
        let limits = RelayLimits {
            max_circuits: if self.adversary_blackhole_relay {
                0
            } else {
                self.relay_max_circuits
            },
            max_reservations: self.relay_max_reservations,
            max_circuit_bytes: self.relay_circuit_kib * 1024,
            max_circuit_duration: Duration::from_secs(self.relay_circuit_secs),
            ..RelayLimits::default()
        };
        Ok(NatConfig {
            enabled: true,
            mode: match self.reachability {
                Reachability::Auto => ReachabilityMode::Auto,
                Reachability::Public => ReachabilityMode::Public,
                Reachability::Private => ReachabilityMode::Private,
            },
            relays: self.relays,
            relay_server: (!self.no_relay_server || self.adversary_blackhole_relay)
                .then_some(limits),
            external,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        nat: NatArgs,
    }

    fn config(flags: &[&str]) -> Result<NatConfig> {
        let mut argv = vec!["node"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).unwrap().nat.config()
    }

    #[test]
    fn defaults_relay_within_bounds_and_reserve_two_relays() {
        let on = config(&[]).unwrap();
        assert!(on.enabled);
        assert_eq!(on.mode, ReachabilityMode::Auto);
        assert_eq!(on.relays, 2);
        assert_eq!(on.relay_server, Some(RelayLimits::default()));
        assert_eq!(config(&["--no-nat-traversal"]).unwrap(), NatConfig::OFF);
        let set = config(&[
            "--reachability",
            "private",
            "--relays",
            "1",
            "--relay-circuit-kib",
            "64",
            "--relay-circuit-secs",
            "30",
            "--relay-max-circuits",
            "3",
        ])
        .unwrap();
        assert_eq!(set.mode, ReachabilityMode::Private);
        let limits = set.relay_server.unwrap();
        assert_eq!(
            (
                limits.max_circuit_bytes,
                limits.max_circuit_duration.as_secs(),
                limits.max_circuits
            ),
            (64 * 1024, 30, 3)
        );
        assert_eq!(config(&["--no-relay-server"]).unwrap().relay_server, None);
        let claimed = config(&["--external-address", "/ip4/203.0.113.7/tcp/4001"]).unwrap();
        assert_eq!(
            claimed.external,
            vec!["/ip4/203.0.113.7/tcp/4001".parse().unwrap()]
        );
        // The adversary kit's relay takes reservations and no circuit.
        let blackhole = config(&["--adversary-blackhole-relay"]).unwrap();
        assert_eq!(blackhole.relay_server.unwrap().max_circuits, 0);
    }

    #[test]
    fn out_of_range_limits_are_refused_by_name() {
        for (flags, named) in [
            (&["--relays", "9"][..], "--relays"),
            (&["--relay-max-circuits", "0"][..], "--relay-max-circuits"),
            (&["--relay-circuit-kib", "1"][..], "--relay-circuit-kib"),
            (
                &["--relay-circuit-secs", "999999"][..],
                "--relay-circuit-secs",
            ),
            (
                &["--relay-max-reservations", "0"][..],
                "--relay-max-reservations",
            ),
            (
                &["--external-address", "example.com"][..],
                "--external-address",
            ),
            (
                &["--external-address", "/ip4/203.0.113.7"][..],
                "--external-address",
            ),
        ] {
            let err = config(flags).unwrap_err().to_string();
            assert!(err.contains(named), "{flags:?}: {err}");
        }
    }
}
