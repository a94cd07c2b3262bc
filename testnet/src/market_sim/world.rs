//! The simulated world: synthetic providers and a bursty request trace, both drawn
//! deterministically from a seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Service tiers (gold = reserved, silver = on demand, bronze = interruptible).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SimTier {
    Gold,
    Silver,
    Bronze,
}

impl SimTier {
    pub const ALL: [SimTier; 3] = [SimTier::Gold, SimTier::Silver, SimTier::Bronze];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            SimTier::Gold => "gold",
            SimTier::Silver => "silver",
            SimTier::Bronze => "bronze",
        }
    }

    /// The SLA: the first token must arrive within this many seconds of the request, and
    /// the response must complete (failovers included).
    pub fn first_token_deadline_s(self) -> f64 {
        match self {
            SimTier::Gold => 1.0,
            SimTier::Silver => 5.0,
            SimTier::Bronze => 60.0,
        }
    }
}

/// Knobs of a simulation run (`sharemesh testnet market-sim` flags).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SimConfig {
    pub providers: usize,
    pub requests: usize,
    pub seed: u64,
    /// Mean demand as a share of the fleet's token capacity (bursts go above it).
    pub load: f64,
    /// Providers asked for a quote per request (the auction's K).
    pub quote_k: usize,
    /// Every n-th provider commits reserved (gold) slots: half its slots.
    pub reserved_every: usize,
    /// Gold's hedged start (the gateway's `--hedge-gold`): the first attempt goes to the
    /// two best providers and the first to start keeps it.
    #[serde(default)]
    pub hedge_gold: bool,
    pub weights: sharemesh_market::ScoreWeights,
    /// Share of providers that batch (one engine decoding up to 8 jobs together, each
    /// job slower the fuller the batch) instead of running independent slots.
    #[serde(default)]
    pub batching_share: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            providers: 40,
            requests: 4_000,
            seed: 1,
            load: 0.35,
            quote_k: 4,
            reserved_every: 3,
            hedge_gold: true,
            weights: sharemesh_market::ScoreWeights::default(),
            batching_share: 0.0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SimProvider {
    pub region: u8,
    /// Price per token for each tier it offers (index: [`SimTier::index`]), nano-USD.
    pub prices: [Option<u64>; 3],
    pub tokens_per_second: f64,
    pub rtt_ms: f64,
    /// Concurrent jobs; `reserved` of them only take gold work.
    pub slots: u32,
    pub reserved: u32,
    /// Probability that a job runs to completion here.
    pub reliability: f64,
    /// Availability windows, `[start, end)` in simulated seconds.
    pub windows: Vec<(f64, f64)>,
    /// `None`: each slot runs at `tokens_per_second` on its own. `Some(e)`: the slots
    /// are places in one batching engine, whose aggregate with `k` jobs running is
    /// `tokens_per_second · kᵉ` (e = 1: perfect batching; this repo's CPU kernels
    /// measure about 0.45, GPUs come closer to 1).
    pub batch_exponent: Option<f64>,
}

/// Jobs a batching provider decodes together.
pub const SIM_MAX_BATCH: u32 = 8;

impl SimProvider {
    /// Tokens per second of one job when `running` jobs (it included) share the
    /// provider.
    pub fn stream_speed(&self, running: u32) -> f64 {
        match self.batch_exponent {
            None => self.tokens_per_second,
            Some(e) => {
                let k = f64::from(running.max(1));
                self.tokens_per_second * k.powf(e) / k
            }
        }
    }

    /// Tokens per second with every slot busy.
    pub fn capacity(&self) -> f64 {
        self.stream_speed(self.slots) * f64::from(self.slots)
    }

    pub fn available(&self, t: f64) -> bool {
        self.windows.iter().any(|&(a, b)| a <= t && t < b)
    }

    pub fn available_seconds(&self, horizon: f64) -> f64 {
        self.windows
            .iter()
            .map(|&(a, b)| (b.min(horizon) - a.max(0.0)).max(0.0))
            .sum()
    }
}

#[derive(Clone, Debug)]
pub struct SimRequest {
    pub arrival: f64,
    pub tier: SimTier,
    pub tokens: u32,
    pub ceiling: u64,
    pub region: Option<u8>,
}

pub struct World {
    pub providers: Vec<SimProvider>,
    pub requests: Vec<SimRequest>,
    pub horizon: f64,
}

/// Prefill and scheduling on the provider before the first token.
pub const START_OVERHEAD_S: f64 = 0.15;

impl World {
    pub fn generate(config: &SimConfig) -> World {
        let mut rng = StdRng::seed_from_u64(config.seed);
        let mut providers: Vec<SimProvider> = (0..config.providers.max(1))
            .map(|i| provider(&mut rng, i, config.reserved_every))
            .collect();
        // Batching is drawn from its own stream: with a share of 0 the world is the
        // same as before batching existed.
        let mut batch_rng = StdRng::seed_from_u64(config.seed ^ 0xBA7C_0000);
        for p in &mut providers {
            if batch_rng.random::<f64>() < config.batching_share {
                p.batch_exponent = Some(batch_rng.random_range(0.45..0.9));
                p.reserved = if p.reserved > 0 { SIM_MAX_BATCH / 2 } else { 0 };
                p.slots = SIM_MAX_BATCH;
            }
        }
        // Capacity in tokens/s over the providers' windows sets the arrival rate.
        let capacity: f64 = providers.iter().map(SimProvider::capacity).sum();
        let mean_tokens = 272.0;
        let rate = (capacity * config.load / mean_tokens).max(0.01);
        let count = config.requests.max(1);
        let horizon_guess = count as f64 / rate;
        // Three bursts, each 5% of the run at three times the base rate.
        let bursts: Vec<(f64, f64)> = (0..3)
            .map(|k| {
                let start = horizon_guess * (0.15 + 0.3 * k as f64);
                (start, start + horizon_guess * 0.05)
            })
            .collect();
        let mut t = 0.0;
        let mut requests = Vec::with_capacity(count);
        while requests.len() < count {
            let burst = bursts.iter().any(|&(a, b)| a <= t && t < b);
            let r = if burst { rate * 3.0 } else { rate };
            t += -(1.0 - rng.random::<f64>()).ln() / r;
            let tier = match rng.random::<f64>() {
                x if x < 0.10 => SimTier::Gold,
                x if x < 0.65 => SimTier::Silver,
                _ => SimTier::Bronze,
            };
            // Gold buyers reserve capacity and budget for it; others set tighter ceilings.
            let ceiling = match tier {
                SimTier::Gold => rng.random_range(450..=900),
                _ => rng.random_range(150..=600),
            };
            requests.push(SimRequest {
                arrival: t,
                tier,
                tokens: rng.random_range(32..=512),
                ceiling,
                region: (rng.random::<f64>() < 0.2).then(|| rng.random_range(0..2)),
            });
        }
        let horizon = t;
        for p in &mut providers {
            p.windows = windows(&mut rng, horizon);
        }
        World {
            providers,
            requests,
            horizon,
        }
    }
}

fn provider(rng: &mut StdRng, index: usize, reserved_every: usize) -> SimProvider {
    let speed: f64 = rng.random_range(20.0..120.0);
    // Faster hardware asks more, with noise: the market has both bargains and rip-offs.
    let base = (80.0 + speed * 1.5 * rng.random_range(0.6..1.6)) as u64;
    let offers_gold = index.is_multiple_of(reserved_every.max(1));
    let offers_bronze = rng.random::<f64>() < 0.7;
    let slots: u32 = rng.random_range(1..=4);
    let reserved = if offers_gold { slots.div_ceil(2) } else { 0 };
    // A provider whose every slot is reserved has nothing to sell on demand.
    let on_demand = slots > reserved;
    SimProvider {
        region: rng.random_range(0..2),
        prices: [
            offers_gold.then_some(base * 3 / 2),
            on_demand.then_some(base),
            (on_demand && offers_bronze).then_some(base * 3 / 5),
        ],
        tokens_per_second: speed,
        rtt_ms: rng.random_range(5.0..150.0),
        slots,
        reserved,
        reliability: rng.random_range(0.90..0.999),
        windows: Vec::new(),
        batch_exponent: None,
    }
}

/// Seven in ten providers are always on; the rest keep one or two windows covering
/// about 60% of the run.
fn windows(rng: &mut StdRng, horizon: f64) -> Vec<(f64, f64)> {
    if rng.random::<f64>() < 0.7 {
        return vec![(0.0, f64::INFINITY)];
    }
    let first = rng.random_range(0.0..0.4) * horizon;
    if rng.random::<f64>() < 0.5 {
        vec![(first, first + 0.6 * horizon)]
    } else {
        let second = first + 0.45 * horizon;
        vec![
            (first, first + 0.3 * horizon),
            (second, second + 0.3 * horizon),
        ]
    }
}
