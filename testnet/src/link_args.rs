//! Flags for an emulated link on every connection a node dials.

use clap::Args;

/// An emulated link for every connection a node dials (testnets on one machine, where
/// the kernel lacks `tc netem`). Any of these switches the mesh to TCP only.
#[derive(Args, Debug, Clone, Default)]
pub struct LinkArgs {
    /// Emulated one-way latency, ms.
    #[arg(long, default_value_t = 0)]
    pub link_latency_ms: u64,
    /// Emulated uniform jitter around the latency, ± ms.
    #[arg(long, default_value_t = 0)]
    pub link_jitter_ms: u64,
    /// Emulated loss: probability in [0, 1) that a chunk arrives one retransmission
    /// timeout (200 ms) late.
    #[arg(long, default_value_t = 0.0)]
    pub link_loss: f64,
    /// Seed of the link's draws (same seed, same delays; a testnet gives node k seed + k).
    #[arg(long, default_value_t = 0)]
    pub link_seed: u64,
}

impl LinkArgs {
    pub fn is_set(&self) -> bool {
        self.link_latency_ms > 0 || self.link_jitter_ms > 0 || self.link_loss > 0.0
    }

    /// The flags that give another node the same link (its seed is its own).
    pub fn flags(&self) -> Vec<String> {
        if !self.is_set() {
            return Vec::new();
        }
        [
            ("--link-latency-ms", self.link_latency_ms.to_string()),
            ("--link-jitter-ms", self.link_jitter_ms.to_string()),
            ("--link-loss", self.link_loss.to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .collect()
    }
}
