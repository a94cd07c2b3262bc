//! Planning a request before any provider runs it: which model and tier, which providers
//! in which order (the order book filtered to eligible offers, ranked by
//! `sharemesh_market::rank`, then re-ranked with live quotes), and what the request may
//! cost at worst (held against the budgets).

use std::collections::HashMap;
use std::sync::Arc;

use libp2p::PeerId;
use sharemesh_market::{OfferView, ScoreWeights};
use sharemesh_mesh::orderbook::BookEntry;
use sharemesh_mesh::MeshHandle;
use sharemesh_protocol::{JobId, Keypair, ModelId, NanoUsd, NodeId, QuoteRequest, Tier};

use crate::quote::{self, Candidate, QuoteAnswer};
use crate::route::{RouteError, RouteRequest};

/// Gateway-wide defaults for routing options a request leaves out.
#[derive(Clone, Debug)]
pub struct RoutingDefaults {
    pub max_price_per_token: NanoUsd,
    pub tier: Tier,
    pub region: Option<String>,
    /// Providers tried (first plus failovers) before giving up.
    pub max_attempts: usize,
    /// Of the providers tried for one request, at most this many ahead of the best
    /// proven one may be unproven (never served this gateway): fresh keys, however
    /// cheap, cannot take every attempt.
    pub unproven_ahead: usize,
    /// A provider silent this long mid-job is replaced.
    pub stall_timeout: std::time::Duration,
    /// Weights of the ranking score (SPEC §10).
    pub score: ScoreWeights,
    /// Candidates asked for a quote before the choice (0: rank by adverts alone).
    pub quote_k: usize,
    /// Start gold work on two providers and keep the first to answer, unless the
    /// request says otherwise (`sharemesh.hedge`).
    pub hedge_gold: bool,
    /// Every this many delivered tokens, warm the next provider in line so a failover
    /// there prefills only what came since (0: never). See `Segments::warm_standby`.
    pub warm_standby_every: usize,
    /// How long a request waits for the model's header when this gateway cannot count
    /// with its vocabulary yet (then the prompt's token bound applies).
    pub count_wait: std::time::Duration,
    /// How long and how many requests wait for capacity when every provider is full.
    pub waiting: crate::waiting::WaitPolicy,
}

impl Default for RoutingDefaults {
    fn default() -> Self {
        Self {
            max_price_per_token: NanoUsd(1_000_000),
            tier: Tier::OnDemand,
            region: None,
            max_attempts: 4,
            unproven_ahead: 2,
            stall_timeout: crate::buyer::DEFAULT_STALL_TIMEOUT,
            score: ScoreWeights::default(),
            quote_k: 4,
            hedge_gold: false,
            warm_standby_every: 64,
            count_wait: std::time::Duration::from_secs(3),
            waiting: crate::waiting::WaitPolicy::default(),
        }
    }
}

/// Round trip assumed for a provider the gateway has not pinged yet.
const UNKNOWN_RTT_MS: f64 = 200.0;

/// What a planned request will run with.
pub struct Plan {
    pub job_id: JobId,
    pub model: ModelId,
    pub tier: Tier,
    /// Providers to try, best first (the first `max_attempts`).
    pub candidates: Vec<Candidate>,
    /// Every prompt byte a token, every completion token produced, at the highest
    /// price among the candidates the request may fail over to.
    pub worst_case: u64,
    /// The prompt as this gateway counted it (`None`: no vocabulary for the model).
    pub counted: Option<crate::vocab::Counted>,
}

/// What the planner needs to know beyond the request.
pub struct Context<'a> {
    pub live: Vec<Arc<BookEntry>>,
    pub defaults: &'a RoutingDefaults,
    pub rtt_ms: &'a HashMap<PeerId, f64>,
    /// What this gateway knows of a provider's record (one lookup per candidate).
    pub record: &'a dyn Fn(&NodeId) -> ProviderRecord,
    pub now_ms: u64,
}

/// A provider's record as ranking reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProviderRecord {
    /// Observed success rate, blended with trust and findings, in [0, 1].
    pub reliability: f64,
    /// The speed this gateway measured of the provider's recent jobs (median of the
    /// last three, tokens/s), if it has.
    pub measured_speed: Option<f64>,
}

/// A catalog name → the id the catalog binds it to; a model id (hex) → itself; if
/// anyone offers that model now. A name outside the catalog resolves to nothing: such a
/// model is addressed by its id (`GET /v1/models` lists it), so no provider can capture
/// a name by declaring it.
pub fn resolve_model(live: &[Arc<BookEntry>], name: &str) -> Result<ModelId, RouteError> {
    let id = match sharemesh_protocol::catalog::catalog_id(name) {
        Some(id) => id,
        None => name
            .parse::<ModelId>()
            .map_err(|_| RouteError::model_not_found(name))?,
    };
    if live.iter().any(|e| e.advert.offer(&id).is_some()) {
        Ok(id)
    } else {
        Err(RouteError::model_not_found(name))
    }
}

/// The tier a request runs in: interruptible if it says so, else its tier or the
/// gateway's default.
pub fn tier_of(request: &RouteRequest, defaults: &RoutingDefaults) -> Tier {
    if request.routing.interruptible {
        Tier::Interruptible
    } else {
        request.routing.tier.unwrap_or(defaults.tier)
    }
}

/// The highest price per token the request accepts.
pub fn ceiling_of(request: &RouteRequest, defaults: &RoutingDefaults) -> NanoUsd {
    request
        .routing
        .max_price_per_token
        .unwrap_or(defaults.max_price_per_token)
}

/// A provider whose measured speed is below this share of its claim is ranked by the
/// measured speed (TRUST.md's mystery-shopper rule: the median of the last three).
pub const SPEED_CLAIM_TOLERANCE: f64 = 0.8;

/// Eligible providers for `model`, best first by `sharemesh_market::rank`: expected
/// cost of the request from price, latency (measured round trip, plus the advertised
/// queue at the advertised speed), throughput and observed success rate.
pub fn candidates(
    model: &ModelId,
    request: &RouteRequest,
    context: &Context<'_>,
) -> (Vec<Candidate>, Tier) {
    let defaults = context.defaults;
    let routing = &request.routing;
    let tier = tier_of(request, defaults);
    let ceiling = ceiling_of(request, defaults);
    let region = routing.region.clone().or_else(|| defaults.region.clone());
    let tokens = request.sampling.max_tokens;
    let eligible: Vec<(Candidate, bool)> = context
        .live
        .iter()
        .filter_map(|entry| {
            let advert = &entry.advert;
            let offer = advert.offer(model)?;
            let price = offer.price_for(tier)?;
            let load = advert.load;
            let ok = price <= ceiling
                && advert.tiers.contains(&tier)
                && region.as_ref().is_none_or(|r| &advert.region == r)
                && routing
                    .min_vram_bytes
                    .is_none_or(|min| advert.hardware.vram_total_bytes() >= min)
                && advert.available_at(context.now_ms);
            if !ok {
                return None;
            }
            let claimed = f64::from(offer.generation_milli_tokens_per_second) / 1000.0;
            let record = (context.record)(&advert.provider);
            // A provider slower than it claims is ranked by what was measured.
            let speed = match record.measured_speed {
                Some(measured) if measured < SPEED_CLAIM_TOLERANCE * claimed => measured,
                _ => claimed,
            };
            let rtt = advert
                .provider
                .peer_id()
                .ok()
                .and_then(|peer| context.rtt_ms.get(&peer).copied())
                .unwrap_or(UNKNOWN_RTT_MS);
            // A job ahead in the queue takes about as long as this one will.
            let queue_ms = if speed > 0.0 {
                f64::from(load.queue_depth) * f64::from(tokens) / speed * 1000.0
            } else {
                0.0
            };
            let view = OfferView {
                price_per_token: price.0,
                latency_ms: rtt + queue_ms,
                tokens_per_second: speed,
                reliability: record.reliability,
            };
            Some((
                Candidate {
                    entry: entry.clone(),
                    price,
                    rtt_ms: rtt,
                    view,
                },
                load.is_full(),
            ))
        })
        .collect();
    let views: Vec<OfferView> = eligible.iter().map(|(c, _)| c.view).collect();
    let order = sharemesh_market::rank(&views, tokens, &defaults.score);
    // A provider whose last advert said it was full stays a candidate, after every one
    // with room: adverts are seconds old, a burst that filled it may be over (its quote
    // or its refusal is the live answer), and refusing outright turned a finished burst
    // into a 503 until the next advert.
    let (with_room, full): (Vec<usize>, Vec<usize>) =
        order.into_iter().partition(|&i| !eligible[i].1);
    let mut slots: Vec<Option<Candidate>> = eligible.into_iter().map(|(c, _)| Some(c)).collect();
    (
        with_room
            .into_iter()
            .chain(full)
            .filter_map(|i| slots[i].take())
            .collect(),
        tier,
    )
}

/// The most the request can cost: its prompt as `counted` with the model's vocabulary
/// (else the prompt's token bound, `Prompt::token_bound`, the most a provider may bill
/// for it without one), every completion token produced, at the highest price among
/// `candidates`. A template's own text can make the count exceed the bound.
pub fn worst_case(request: &RouteRequest, candidates: &[Candidate], counted: Option<u32>) -> u64 {
    let highest = candidates.iter().map(|c| c.price.0).max().unwrap_or(0);
    let prompt = counted.map_or_else(|| request.prompt.token_bound(), u64::from);
    highest.saturating_mul(prompt + u64::from(request.sampling.max_tokens))
}

/// Moves the best proven provider (`is_proven`) up so that at most `unproven_ahead`
/// unproven ones come before it; every other place is kept. A flood of cheap fresh
/// keys then costs a request at most that many failed attempts before a provider
/// that has served this gateway.
pub fn limit_unproven(
    candidates: Vec<Candidate>,
    unproven_ahead: usize,
    is_proven: impl Fn(&NodeId) -> bool,
) -> Vec<Candidate> {
    let Some(first_proven) = candidates.iter().position(|c| is_proven(&c.provider())) else {
        return candidates;
    };
    let mut ordered = candidates;
    if first_proven > unproven_ahead {
        let proven = ordered.remove(first_proven);
        ordered.insert(unproven_ahead, proven);
    }
    ordered
}

/// Asks the first `quote_k` candidates for a quote in parallel and ranks again with
/// their answers (SPEC §10). With `quote_k = 0` the advert-based ranking stands.
/// Also says whether any provider declined for lack of capacity (the request may wait).
pub async fn quote_round(
    mesh: &MeshHandle,
    key: &Keypair,
    candidates: Vec<Candidate>,
    plan: (JobId, ModelId, Tier),
    request: &RouteRequest,
    defaults: &RoutingDefaults,
) -> (Vec<Candidate>, bool) {
    let (job_id, model, tier) = plan;
    let k = defaults.quote_k.min(candidates.len());
    if k == 0 {
        return (candidates, false);
    }
    let ceiling = ceiling_of(request, defaults);
    let asks = candidates[..k].iter().map(|candidate| async move {
        let provider = candidate.provider();
        let Ok(peer) = provider.peer_id() else {
            return QuoteAnswer::Silent;
        };
        if provider == key.node_id() {
            return QuoteAnswer::Local;
        }
        mesh.dial_advertised(&peer, &candidate.entry.advert.addresses)
            .await;
        let ask = QuoteRequest {
            job_id,
            buyer: key.node_id(),
            provider,
            model,
            tier,
            max_price_per_token: ceiling,
            max_tokens: request.sampling.max_tokens.max(1),
        };
        quote::ask(mesh, key, peer, ask).await
    });
    let answers = futures::future::join_all(asks).await;
    for (candidate, answer) in candidates.iter().zip(&answers) {
        tracing::debug!(job = %job_id, provider = %candidate.provider(), ?answer, "quote");
    }
    let at_capacity = answers.iter().any(
        |answer| matches!(answer, QuoteAnswer::Rejected(reject) if reject.reason.is_at_capacity()),
    );
    let ranked = quote::rerank(
        candidates,
        &answers,
        ceiling,
        request.sampling.max_tokens,
        &defaults.score,
    );
    (ranked, at_capacity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quote::tests::candidate;

    #[test]
    fn fresh_keys_take_at_most_their_share_of_the_attempts() {
        let ranked: Vec<Candidate> = (1..=8).map(|seed| candidate(seed, 1)).collect();
        let proven: Vec<NodeId> = [ranked[5].provider(), ranked[7].provider()].into();
        let order = |ahead| -> Vec<NodeId> {
            limit_unproven(ranked.clone(), ahead, |id| proven.contains(id))
                .iter()
                .map(Candidate::provider)
                .collect()
        };
        let ids: Vec<NodeId> = ranked.iter().map(Candidate::provider).collect();
        assert_eq!(
            order(2),
            [ids[0], ids[1], ids[5], ids[2], ids[3], ids[4], ids[6], ids[7]]
        );
        assert_eq!(order(0)[..2], [ids[5], ids[0]]);
        assert_eq!(
            order(8),
            ids,
            "room for every unproven one: ranking unchanged"
        );
        // Nobody proven yet: the ranking stands.
        assert_eq!(
            limit_unproven(ranked.clone(), 0, |_| false)
                .iter()
                .map(Candidate::provider)
                .collect::<Vec<_>>(),
            ids
        );
    }
}
