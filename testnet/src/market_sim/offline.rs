//! The offline comparators (hindsight assignment, relaxed lower bound) and fleet capacity.

use super::{SimProvider, SimRequest, World, START_OVERHEAD_S};

pub(super) fn serves(provider: &SimProvider, request: &SimRequest, now: f64) -> bool {
    provider.prices[request.tier.index()].is_some_and(|price| price <= request.ceiling)
        && request
            .region
            .is_none_or(|region| provider.region == region)
        && provider.available(now)
}

pub(super) fn cheapest_at_arrival(world: &World, request: &SimRequest) -> Option<u64> {
    world
        .providers
        .iter()
        .filter(|p| serves(p, request, request.arrival))
        .filter_map(|p| p.prices[request.tier.index()])
        .min()
}

pub(super) fn fleet_capacity(world: &World) -> f64 {
    world
        .providers
        .iter()
        .map(|p| p.capacity() * p.available_seconds(world.horizon))
        .sum::<f64>()
        .max(1.0)
}

/// Mean price per token of (a) the offline assignment — with hindsight of the whole
/// trace and of every job's duration, each request in arrival order goes to the
/// cheapest eligible provider that has a slot free at its arrival for its whole run —
/// and (b) the relaxed lower bound, every request at the cheapest eligible provider
/// with capacity ignored.
pub(super) fn offline_prices(world: &World) -> (f64, f64) {
    let mut slot_free_at: Vec<Vec<f64>> = world
        .providers
        .iter()
        .map(|p| vec![0.0; p.slots as usize])
        .collect();
    let (mut cost, mut tokens, mut bound_cost, mut bound_tokens) = (0.0, 0.0, 0.0, 0.0);
    for r in &world.requests {
        let Some(cheapest) = cheapest_at_arrival(world, r) else {
            continue;
        };
        bound_cost += cheapest as f64 * f64::from(r.tokens);
        bound_tokens += f64::from(r.tokens);
        let mut options: Vec<(u64, usize, usize)> = world
            .providers
            .iter()
            .enumerate()
            .filter(|(_, p)| serves(p, r, r.arrival))
            .filter_map(|(i, p)| {
                let slot = slot_free_at[i].iter().position(|&t| t <= r.arrival)?;
                Some((p.prices[r.tier.index()]?, i, slot))
            })
            .collect();
        options.sort_unstable();
        if let Some(&(price, i, slot)) = options.first() {
            let p = &world.providers[i];
            slot_free_at[i][slot] = r.arrival
                + p.rtt_ms / 1000.0
                + START_OVERHEAD_S
                // A batching provider's slots at its full-batch speed.
                + f64::from(r.tokens) / p.stream_speed(p.slots);
            cost += price as f64 * f64::from(r.tokens);
            tokens += f64::from(r.tokens);
        }
    }
    (cost / tokens.max(1.0), bound_cost / bound_tokens.max(1.0))
}
