//! `sharemesh testnet trust-sim`: the trust layer against adversaries, without
//! inference. Providers serve jobs to buyers that verify them at the gateway's own
//! audit rate (`sharemesh_reputation::AuditRule`), convict cheats with fraud proofs
//! that every verifying buyer confirms, void pay still in the dispute window, and rank
//! providers by their own EigenTrust view (`sharemesh_reputation::eigentrust`) over
//! their verified dealings and the reports others gossip.
//!
//! What is modelled rather than run: a verified job of a cheat (garbage, another
//! quantization, a truncated network) is always caught and an honest one never is —
//! the measured behaviour of same-profile replay on the real model (every step of a
//! truncated network and of garbage differs; 110/110 honest steps replay bit for bit,
//! `engine/tests/verify.rs`). Cross-profile verification is not modelled.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sharemesh_reputation::{view, AuditRule, Dealings, TrustParams};

/// Who a simulated node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Kind {
    Honest,
    /// Noise tokens under the model's name.
    Garbage,
    /// A cheaper quantization under the model's name.
    Substitute,
    /// A network with layers dropped.
    Truncated,
    /// Honest for its first jobs, then garbage.
    Camouflage,
    /// Garbage; after a conviction it returns under a fresh key.
    Whitewash,
    /// Honest work, but drops a share of its jobs.
    DropOut,
    /// Garbage, one of a sybil ring whose reporters praise every member.
    Ring,
}

impl Kind {
    fn cheats(self, served: u32) -> bool {
        match self {
            Kind::Honest | Kind::DropOut => false,
            Kind::Camouflage => served >= CAMOUFLAGE_HONEST_JOBS,
            _ => true,
        }
    }
}

const CAMOUFLAGE_HONEST_JOBS: u32 = 20;
const TOKENS_PER_JOB: u64 = 64;
/// Jobs before a convicted whitewasher returns under a new key.
const WHITEWASH_DELAY: usize = 100;

#[derive(Clone, Debug, Serialize)]
pub struct TrustSimConfig {
    pub providers: usize,
    /// Share of `providers` that cheat or drop (split over the kinds).
    pub malicious: f64,
    pub jobs: usize,
    /// Buyers that verify (hold the model).
    pub buyers: usize,
    /// Reporters that never verify and gossip "verified, fine" about every provider.
    pub lazy_verifiers: usize,
    /// Sybil ring: this many garbage providers and as many reporters praising them.
    pub ring: usize,
    /// Reporters that gossip a caught mismatch against every honest provider (what a
    /// flood of false reports tries against reputation; false fraud proofs themselves
    /// are refuted by replay, `node/tests/trust.rs`).
    pub slanderers: usize,
    pub seed: u64,
    /// Jobs between gossiped reports and recomputed views.
    pub epoch_jobs: usize,
    /// Jobs during which a payment stays pending (the dispute window).
    pub dispute_window_jobs: usize,
    /// Share of jobs that go to a provider the buyer has no verified record with.
    pub exploration: f64,
    /// Buyers verify (off: the control, what the market pays without verification).
    pub verify: bool,
}

impl Default for TrustSimConfig {
    fn default() -> Self {
        Self {
            providers: 100,
            malicious: 0.3,
            jobs: 20_000,
            buyers: 20,
            lazy_verifiers: 3,
            ring: 5,
            slanderers: 3,
            seed: 1,
            epoch_jobs: 500,
            dispute_window_jobs: 2_000,
            exploration: 0.05,
            verify: true,
        }
    }
}

/// The table's numbers for one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TrustSimReport {
    pub seed: u64,
    pub ring: usize,
    pub slanderers: usize,
    pub verify: bool,
    /// Paid tokens that were garbage (cheats' jobs whose pay was not voided), as a
    /// share of all paid tokens.
    pub garbage_paid_share: f64,
    /// The same over the last quarter of the jobs.
    pub garbage_paid_share_last_quarter: f64,
    /// Verified cheating jobs that were caught, as a share of them.
    pub caught_per_check: f64,
    pub cheat_jobs_verified: u64,
    pub honest_false_positives: u64,
    pub convictions: u64,
    /// Trust the sybil ring holds in an honest buyer's view at the end (mean over
    /// buyers).
    pub ring_trust_mass: f64,
    /// The share of the trust buyers give providers that honest providers hold at the
    /// end (mean over buyers): what slander would lower.
    pub honest_trust_share: f64,
    /// Replayed tokens as a share of generated tokens.
    pub verification_overhead: f64,
    pub jobs_to_cheats: u64,
}

struct Provider {
    kind: Kind,
    price: f64,
    served: u32,
    convicted: bool,
}

#[derive(Default)]
struct Buyer {
    /// What it verified itself, per provider.
    dealings: BTreeMap<usize, Dealings>,
    view: BTreeMap<Node, f64>,
    /// Verified jobs per provider that reporters this buyer trusts gossiped (each
    /// reporter counts at most the newcomer threshold): recomputed every epoch.
    vouched: BTreeMap<usize, u32>,
}

/// A node of the trust graph: a provider or a reporter (a buyer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    Provider(usize),
    Reporter(usize),
}

/// One job's pay, kept until the dispute window passes.
struct Pending {
    job: usize,
    provider: usize,
    garbage: bool,
}

struct World {
    config: TrustSimConfig,
    rng: StdRng,
    providers: Vec<Provider>,
    buyers: Vec<Buyer>,
    rule: AuditRule,
    pending: Vec<Pending>,
    /// Reports of the last epoch: reporter → provider → dealings claimed.
    reports: BTreeMap<usize, BTreeMap<usize, Dealings>>,
    returns: Vec<(usize, Kind)>,
    report: TrustSimReport,
    paid: [u64; 2],
    garbage_paid: [u64; 2],
    generated: u64,
    replayed: u64,
    /// Verified cheating jobs that led to a conviction.
    caught: u64,
}

pub fn simulate(config: &TrustSimConfig) -> TrustSimReport {
    let mut world = World::new(config.clone());
    for job in 0..config.jobs {
        world.return_whitewashers(job);
        if job % config.epoch_jobs == 0 {
            world.gossip_and_recompute();
        }
        world.run_job(job);
        world.settle(job);
    }
    world.settle(usize::MAX);
    world.finish()
}

impl World {
    fn new(config: TrustSimConfig) -> Self {
        let mut rng = StdRng::seed_from_u64(config.seed);
        let cheats = [
            Kind::Garbage,
            Kind::Substitute,
            Kind::Truncated,
            Kind::Camouflage,
            Kind::Whitewash,
            Kind::DropOut,
        ];
        let bad = (config.providers as f64 * config.malicious).round() as usize;
        let mut providers = Vec::new();
        for i in 0..config.providers {
            let kind = if i < bad {
                cheats[i % cheats.len()]
            } else {
                Kind::Honest
            };
            providers.push(Provider::new(kind, &mut rng));
        }
        for _ in 0..config.ring {
            providers.push(Provider::new(Kind::Ring, &mut rng));
        }
        let buyers = (0..config.buyers).map(|_| Buyer::default()).collect();
        Self {
            report: TrustSimReport {
                seed: config.seed,
                ring: config.ring,
                slanderers: config.slanderers,
                verify: config.verify,
                ..TrustSimReport::default()
            },
            config,
            rng,
            providers,
            buyers,
            rule: AuditRule::default(),
            pending: Vec::new(),
            reports: BTreeMap::new(),
            returns: Vec::new(),
            paid: [0; 2],
            garbage_paid: [0; 2],
            generated: 0,
            replayed: 0,
            caught: 0,
        }
    }

    fn return_whitewashers(&mut self, job: usize) {
        let due: Vec<(usize, Kind)> = self
            .returns
            .iter()
            .filter(|(at, _)| *at <= job)
            .copied()
            .collect();
        self.returns.retain(|(at, _)| *at > job);
        for (_, kind) in due {
            let fresh = Provider::new(kind, &mut self.rng);
            self.providers.push(fresh);
        }
    }

    /// Reporters publish their dealings; every verifying buyer recomputes its view.
    fn gossip_and_recompute(&mut self) {
        self.reports.clear();
        for (b, buyer) in self.buyers.iter().enumerate() {
            self.reports.insert(b, buyer.dealings.clone());
        }
        // Lazy verifiers stamp every provider "fine"; the ring's reporters praise the ring.
        let praise = Dealings {
            verified_jobs: 50,
            verified_tokens: 50 * TOKENS_PER_JOB,
            ..Dealings::default()
        };
        let base = self.config.buyers;
        for l in 0..self.config.lazy_verifiers {
            let all = (0..self.providers.len()).map(|p| (p, praise)).collect();
            self.reports.insert(base + l, all);
        }
        let ring: Vec<usize> = (0..self.providers.len())
            .filter(|&p| self.providers[p].kind == Kind::Ring)
            .collect();
        for r in 0..self.config.ring {
            let all = ring.iter().map(|&p| (p, praise)).collect();
            self.reports
                .insert(base + self.config.lazy_verifiers + r, all);
        }
        let accusation = Dealings {
            mismatches: 1,
            ..Dealings::default()
        };
        let honest: Vec<usize> = (0..self.providers.len())
            .filter(|&p| self.providers[p].kind == Kind::Honest)
            .collect();
        for s in 0..self.config.slanderers {
            let all = honest.iter().map(|&p| (p, accusation)).collect();
            self.reports.insert(
                base + self.config.lazy_verifiers + self.config.ring + s,
                all,
            );
        }
        let convicted: BTreeSet<Node> = (0..self.providers.len())
            .filter(|&p| self.providers[p].convicted)
            .map(Node::Provider)
            .collect();
        let reports: BTreeMap<Node, BTreeMap<Node, Dealings>> = self
            .reports
            .iter()
            .map(|(&r, claims)| {
                let claims = claims
                    .iter()
                    .map(|(&p, d)| (Node::Provider(p), *d))
                    .collect();
                (Node::Reporter(r), claims)
            })
            .collect();
        for b in 0..self.buyers.len() {
            let own: BTreeMap<Node, Dealings> = self.buyers[b]
                .dealings
                .iter()
                .map(|(&p, d)| (Node::Provider(p), *d))
                .collect();
            let seen = view(
                &Node::Reporter(b),
                &own,
                &reports,
                &convicted,
                &self.rule,
                &TrustParams::default(),
            );
            self.buyers[b].vouched = seen
                .vouched
                .iter()
                .filter_map(|(node, n)| match node {
                    Node::Provider(p) => Some((*p, *n)),
                    Node::Reporter(_) => None,
                })
                .collect();
            self.buyers[b].view = seen.trust;
        }
    }

    fn choose(&mut self, b: usize) -> Option<usize> {
        let live: Vec<usize> = (0..self.providers.len())
            .filter(|&p| !self.providers[p].convicted)
            .collect();
        let buyer = &self.buyers[b];
        let unknown: Vec<usize> = live
            .iter()
            .copied()
            .filter(|p| buyer.view.get(&Node::Provider(*p)).copied().unwrap_or(0.0) <= 0.0)
            .collect();
        if !unknown.is_empty() && (self.rng.random::<f64>() < self.config.exploration) {
            return Some(unknown[self.rng.random_range(0..unknown.len())]);
        }
        // Trusted providers by trust per unit of price (a noisy auction).
        let best = live
            .iter()
            .copied()
            .filter_map(|p| {
                let trust = buyer.view.get(&Node::Provider(p)).copied().unwrap_or(0.0);
                (trust > 0.0).then(|| {
                    let noise = 0.8 + 0.4 * self.rng.random::<f64>();
                    (p, trust.sqrt() * noise / self.providers[p].price)
                })
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(p, _)| p);
        best.or_else(|| (!live.is_empty()).then(|| live[self.rng.random_range(0..live.len())]))
    }

    fn run_job(&mut self, job: usize) {
        let b = self.rng.random_range(0..self.buyers.len());
        let Some(p) = self.choose(b) else { return };
        let kind = self.providers[p].kind;
        let garbage = kind.cheats(self.providers[p].served);
        self.providers[p].served += 1;
        self.generated += TOKENS_PER_JOB;
        if garbage {
            self.report.jobs_to_cheats += 1;
        }
        let dropped = kind == Kind::DropOut && self.rng.random::<f64>() < 0.3;
        if dropped {
            self.buyers[b].dealings.entry(p).or_default().failures += 1;
            return;
        }
        // Drawn from the buyer's secret after delivery, at its audit rate: its own
        // verified record with the provider plus what reporters it trusts vouched for.
        let own = self.buyers[b]
            .dealings
            .get(&p)
            .map_or(0, |d| d.verified_jobs);
        let vouched = self.buyers[b].vouched.get(&p).copied().unwrap_or(0);
        let verified_jobs = self.rule.record(own, vouched);
        let median = 100.0;
        let cheap = self.providers[p].price < 0.5 * median;
        let rate = self.rule.rate(verified_jobs, false, cheap);
        self.pending.push(Pending {
            job,
            provider: p,
            garbage,
        });
        if !self.config.verify || self.rng.random::<f64>() >= rate {
            return;
        }
        self.replayed += TOKENS_PER_JOB;
        let dealings = self.buyers[b].dealings.entry(p).or_default();
        if garbage {
            self.report.cheat_jobs_verified += 1;
            dealings.mismatches += 1;
            self.convict(p, job);
        } else {
            dealings.verified_jobs += 1;
            dealings.verified_tokens += TOKENS_PER_JOB;
        }
    }

    /// A confirmed proof: every verifying buyer drops the provider and voids its
    /// pending pay; a whitewasher comes back under a new key.
    fn convict(&mut self, p: usize, job: usize) {
        if self.providers[p].convicted {
            return;
        }
        self.providers[p].convicted = true;
        self.report.convictions += 1;
        self.caught += 1;
        if self.providers[p].kind == Kind::Honest || self.providers[p].kind == Kind::DropOut {
            self.report.honest_false_positives += 1;
        }
        self.pending.retain(|pending| pending.provider != p);
        if self.providers[p].kind == Kind::Whitewash {
            self.returns.push((job + WHITEWASH_DELAY, Kind::Whitewash));
        }
    }

    /// Pay older than the dispute window becomes final.
    fn settle(&mut self, job: usize) {
        let window = self.config.dispute_window_jobs;
        let last_quarter = self.config.jobs * 3 / 4;
        let (final_now, still): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|pending| job == usize::MAX || pending.job + window <= job);
        self.pending = still;
        for paid in final_now {
            let quarter = usize::from(paid.job >= last_quarter);
            self.paid[quarter] += TOKENS_PER_JOB;
            if paid.garbage {
                self.garbage_paid[quarter] += TOKENS_PER_JOB;
            }
        }
    }

    fn finish(mut self) -> TrustSimReport {
        let share = |garbage: u64, paid: u64| garbage as f64 / (paid as f64).max(1.0);
        let (all_garbage, all_paid) = (
            self.garbage_paid[0] + self.garbage_paid[1],
            self.paid[0] + self.paid[1],
        );
        self.report.garbage_paid_share = share(all_garbage, all_paid);
        self.report.garbage_paid_share_last_quarter = share(self.garbage_paid[1], self.paid[1]);
        // Every verified cheating job convicts (a conviction ends its jobs).
        self.report.caught_per_check =
            self.caught as f64 / (self.report.cheat_jobs_verified as f64).max(1.0);
        self.gossip_and_recompute();
        let ring: Vec<usize> = (0..self.providers.len())
            .filter(|&p| self.providers[p].kind == Kind::Ring)
            .collect();
        let mass: f64 = self
            .buyers
            .iter()
            .map(|buyer| {
                ring.iter()
                    .map(|&p| buyer.view.get(&Node::Provider(p)).copied().unwrap_or(0.0))
                    .sum::<f64>()
            })
            .sum();
        self.report.ring_trust_mass = mass / self.buyers.len().max(1) as f64;
        let honest_share: f64 = self
            .buyers
            .iter()
            .map(|buyer| {
                let (mut honest, mut all) = (0.0, 0.0);
                for (p, provider) in self.providers.iter().enumerate() {
                    let trust = buyer.view.get(&Node::Provider(p)).copied().unwrap_or(0.0);
                    all += trust;
                    if provider.kind == Kind::Honest {
                        honest += trust;
                    }
                }
                honest / all.max(f64::MIN_POSITIVE)
            })
            .sum();
        self.report.honest_trust_share = honest_share / self.buyers.len().max(1) as f64;
        self.report.verification_overhead = self.replayed as f64 / (self.generated as f64).max(1.0);
        self.report
    }
}

impl Provider {
    fn new(kind: Kind, rng: &mut StdRng) -> Self {
        // Cheats undercut (that is how they get work); honest prices spread ±20%.
        let price = match kind {
            Kind::Honest | Kind::DropOut | Kind::Camouflage => 80.0 + 40.0 * rng.random::<f64>(),
            _ => 60.0 + 20.0 * rng.random::<f64>(),
        };
        Self {
            kind,
            price,
            served: 0,
            convicted: false,
        }
    }
}

/// The table the command prints.
pub fn table(reports: &[TrustSimReport]) -> String {
    let mut out = String::from(
        "verify | seed | ring | slander | garbage paid | last quarter | caught/check | cheat jobs verified | honest FP | convictions | ring trust | honest trust | overhead\n",
    );
    for r in reports {
        out.push_str(&format!(
            "{:>6} | {:>4} | {:>4} | {:>7} | {:>11.3}% | {:>11.3}% | {:>12.3} | {:>19} | {:>9} | {:>11} | {:>9.4}% | {:>11.1}% | {:>7.1}%\n",
            if r.verify { "yes" } else { "no" },
            r.seed,
            r.ring,
            r.slanderers,
            100.0 * r.garbage_paid_share,
            100.0 * r.garbage_paid_share_last_quarter,
            r.caught_per_check,
            r.cheat_jobs_verified,
            r.honest_false_positives,
            r.convictions,
            100.0 * r.ring_trust_mass,
            100.0 * r.honest_trust_share,
            100.0 * r.verification_overhead,
        ));
    }
    out
}

/// Counts per kind, for the JSON output.
pub fn kinds(config: &TrustSimConfig) -> HashMap<String, usize> {
    let world = World::new(config.clone());
    let mut counts = HashMap::new();
    for p in &world.providers {
        *counts.entry(format!("{:?}", p.kind)).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cheats_are_caught_and_rings_hold_no_trust_on_a_small_world() {
        for ring in [5, 40] {
            let config = TrustSimConfig {
                providers: 40,
                jobs: 4_000,
                buyers: 6,
                ring,
                epoch_jobs: 250,
                dispute_window_jobs: 500,
                ..TrustSimConfig::default()
            };
            let report = simulate(&config);
            assert_eq!(report.honest_false_positives, 0);
            assert!(report.convictions > 0);
            assert!((report.caught_per_check - 1.0).abs() < 1e-9, "{report:?}");
            assert!(report.garbage_paid_share < 0.05, "{report:?}");
            assert!(report.ring_trust_mass < 0.005, "{report:?}");
        }
    }

    /// Slanderers accusing every honest provider contradict what each buyer verified
    /// itself, so they get no weight: honest providers keep their share of trust (within
    /// a point of the same world without them) and nobody honest is convicted.
    #[test]
    fn slander_costs_honest_providers_no_trust() {
        let world = |slanderers| TrustSimConfig {
            providers: 40,
            jobs: 4_000,
            buyers: 6,
            epoch_jobs: 250,
            dispute_window_jobs: 500,
            slanderers,
            ..TrustSimConfig::default()
        };
        let quiet = simulate(&world(0));
        let slandered = simulate(&world(40));
        assert!(quiet.honest_trust_share > 0.5, "{quiet:?}");
        assert!(
            (slandered.honest_trust_share - quiet.honest_trust_share).abs() < 0.01,
            "{quiet:?} {slandered:?}"
        );
        assert_eq!(slandered.honest_false_positives, 0);
    }

    #[test]
    fn without_verification_garbage_is_paid() {
        let config = TrustSimConfig {
            providers: 30,
            jobs: 2_000,
            buyers: 4,
            verify: false,
            ..TrustSimConfig::default()
        };
        let report = simulate(&config);
        assert_eq!(report.convictions, 0);
        assert!(report.garbage_paid_share > 0.1, "{report:?}");
    }
}
