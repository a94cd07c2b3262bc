//! Where a buyer connects from: the unit the unpaid-work rules share allowances over.

use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;

/// Where a buyer's connection comes from, as coarse as one host: an IPv4 address, an
/// IPv6 /64, a DNS name, or "memory" (every in-process peer is one host). A relayed
/// connection's origin is its relay's: everyone behind one relay shares it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Origin(pub(super) String);

impl Origin {
    pub fn of(address: &Multiaddr) -> Self {
        for part in address.iter() {
            match part {
                Protocol::Ip4(ip) => return Self(ip.to_string()),
                Protocol::Ip6(ip) => {
                    let [a, b, c, d, ..] = ip.segments();
                    return Self(format!("{a:x}:{b:x}:{c:x}:{d:x}::/64"));
                }
                Protocol::Dns(name) | Protocol::Dns4(name) | Protocol::Dns6(name) => {
                    return Self(name.to_string())
                }
                Protocol::Memory(_) => return Self("memory".into()),
                _ => {}
            }
        }
        Self(address.to_string())
    }

    /// A peer whose address is not known (it disconnected already): all such share one.
    pub fn unknown() -> Self {
        Self("unknown".into())
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
