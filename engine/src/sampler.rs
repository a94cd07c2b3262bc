//! Token sampling. Deterministic: the random draw for completion position `i` comes
//! from splitmix64(seed, i), so a resumed job samples exactly as an uninterrupted one
//! without replaying any generator state; and the draw uses only IEEE operations and
//! the kernels' own `exp`, so a verifier redraws it bit for bit on any libc (SPEC §12).

use sharemesh_protocol::Sampling;

/// How many recent tokens the repetition penalty looks at (llama.cpp's default).
pub const PENALTY_LAST_N: usize = 64;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A uniform draw in [0, 1) for completion position `index`.
pub fn uniform(seed: u64, index: u64) -> f64 {
    let bits = splitmix64(seed ^ splitmix64(index));
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Applies the repetition penalty (as llama.cpp/CTRL: divide positive logits, multiply
/// negative ones) over the last [`PENALTY_LAST_N`] tokens of `history`.
pub fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let start = history.len().saturating_sub(PENALTY_LAST_N);
    let mut seen = std::collections::HashSet::new();
    for &token in &history[start..] {
        if !seen.insert(token) {
            continue;
        }
        if let Some(logit) = logits.get_mut(token as usize) {
            *logit = if *logit > 0.0 {
                *logit / penalty
            } else {
                *logit * penalty
            };
        }
    }
}

/// OpenAI's presence and frequency penalties over the completion's tokens so far.
pub fn apply_presence_frequency(
    logits: &mut [f32],
    completion: &[u32],
    presence: f32,
    frequency: f32,
) {
    if presence == 0.0 && frequency == 0.0 {
        return;
    }
    let mut counts = std::collections::BTreeMap::<u32, u32>::new();
    for &token in completion {
        *counts.entry(token).or_default() += 1;
    }
    for (token, count) in counts {
        if let Some(logit) = logits.get_mut(token as usize) {
            *logit -= presence + frequency * count as f32;
        }
    }
}

/// Adds each listed token's bias to its logit (ids past the logits are skipped: the
/// engine refuses them before generating).
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(token, add) in bias {
        if let Some(logit) = logits.get_mut(token as usize) {
            *logit += add;
        }
    }
}

/// `token`'s log-probability under the raw distribution `raw` (log-softmax, summed in
/// f64), with the `top` best tokens (ties by id).
pub fn logprobs(raw: &[f32], token: u32, top: usize) -> sharemesh_protocol::TokenLogprobs {
    let max = raw
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = raw
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| f64::from(l - max).exp())
        .sum();
    let lse = f64::from(max) + sum.ln();
    let of = |id: u32| {
        let logit = raw.get(id as usize).copied().unwrap_or(f32::NEG_INFINITY);
        let value = (f64::from(logit) - lse) as f32;
        // A token the raw distribution cannot draw: the least a finite f32 says.
        (if value.is_finite() { value } else { f32::MIN }).to_bits()
    };
    let mut best: Vec<u32> = (0..raw.len() as u32).collect();
    let top = top.min(best.len());
    if top > 0 {
        let order = |a: &u32, b: &u32| raw[*b as usize].total_cmp(&raw[*a as usize]).then(a.cmp(b));
        best.select_nth_unstable_by(top - 1, order);
        best.truncate(top);
        best.sort_by(order);
    } else {
        best.clear();
    }
    sharemesh_protocol::TokenLogprobs {
        logprob: of(token),
        top: best.into_iter().map(|id| (id, of(id))).collect(),
    }
}

/// The highest logit; ties go to the lowest id.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The distribution a step draws from: the logits after bias and penalties, and for a
/// sampled step its candidates by weight (the kernels' own `exp`), cut by top-k and
/// top-p. Generation and a verifier's redraw both go through it.
struct Distribution<'a> {
    /// The penalized logits (greedy steps take their argmax).
    logits: &'a [f32],
    /// Candidates best first with their weights (`exp(l/T - max)`), empty when greedy.
    candidates: Vec<(u32, f64)>,
    /// How many of `candidates` the nucleus keeps.
    keep: usize,
    /// Their summed weight.
    kept_total: f64,
}

impl<'a> Distribution<'a> {
    /// Applies bias and penalties to `logits` in place.
    fn new(logits: &'a mut [f32], history: &[u32], completion: usize, sampling: &Sampling) -> Self {
        apply_logit_bias(logits, &sampling.logit_bias);
        apply_repetition_penalty(logits, history, sampling.repetition_penalty);
        apply_presence_frequency(
            logits,
            &history[history.len().saturating_sub(completion)..],
            sampling.presence_penalty,
            sampling.frequency_penalty,
        );
        let mut distribution = Self {
            logits,
            candidates: Vec::new(),
            keep: 0,
            kept_total: 0.0,
        };
        if sampling.temperature <= 0.0 {
            return distribution;
        }
        let mut scaled: Vec<(u32, f32)> = distribution
            .logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l / sampling.temperature))
            .collect();
        scaled.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if sampling.top_k > 0 {
            scaled.truncate(sampling.top_k as usize);
        }
        let Some(&(_, max)) = scaled.first() else {
            return distribution;
        };
        // The kernels' own exp (IEEE operations only), not the C library's: a verifier on
        // another libc redraws the same token from the same logits.
        let candidates: Vec<(u32, f64)> = scaled
            .iter()
            .map(|&(id, l)| (id, f64::from(sharemesh_kernels::math::exp(l - max))))
            .collect();
        let total: f64 = candidates.iter().map(|(_, w)| w).sum();
        // Nucleus: the smallest prefix whose probability reaches top_p.
        let mut keep = candidates.len();
        if sampling.top_p < 1.0 {
            let mut cumulative = 0.0;
            for (i, (_, w)) in candidates.iter().enumerate() {
                cumulative += w / total;
                if cumulative >= f64::from(sampling.top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        distribution.kept_total = candidates[..keep].iter().map(|(_, w)| w).sum();
        distribution.keep = keep;
        distribution.candidates = candidates;
        distribution
    }

    /// The token the draw `uniform` (in [0, 1)) picks.
    fn pick(&self, uniform: f64) -> u32 {
        if self.candidates.is_empty() {
            return argmax(self.logits);
        }
        let mut target = uniform * self.kept_total;
        for &(id, w) in &self.candidates[..self.keep] {
            if target < w {
                return id;
            }
            target -= w;
        }
        self.candidates[self.keep - 1].0
    }

    /// How far, in probability, the draw `uniform` lies from picking `delivered`: 0 when
    /// it picks it, otherwise the distance from `uniform` to `delivered`'s interval of
    /// the cumulative distribution (a token past the nucleus lies beyond 1, one the
    /// candidates lack at 1). Greedy steps: 0 for the argmax, else the probability (at
    /// temperature 1) the argmax has over `delivered`.
    fn distance(&self, uniform: f64, delivered: u32) -> f32 {
        if self.candidates.is_empty() {
            return greedy_distance(self.logits, delivered);
        }
        let mut low = 0.0;
        for &(id, w) in &self.candidates {
            let high = low + w / self.kept_total;
            if id == delivered {
                let outside = if uniform < low {
                    low - uniform
                } else {
                    (uniform - high).max(0.0)
                };
                return outside.min(1.0) as f32;
            }
            low = high;
        }
        1.0
    }
}

/// Greedy: how much more probable (softmax at temperature 1) the argmax is than
/// `delivered`; 0 when `delivered` is the argmax.
fn greedy_distance(logits: &[f32], delivered: u32) -> f32 {
    let best = argmax(logits);
    if best == delivered {
        return 0.0;
    }
    let max = logits[best as usize];
    let Some(&theirs) = logits.get(delivered as usize).filter(|l| l.is_finite()) else {
        return 1.0;
    };
    let weight = |l: f32| f64::from(sharemesh_kernels::math::exp(l - max));
    let total: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| weight(l))
        .sum();
    ((weight(max) - weight(theirs)) / total) as f32
}

/// Picks the token for completion position `index`; `history` is the prompt and the
/// completion so far, its last `completion` tokens the completion's.
pub fn sample(
    logits: &mut [f32],
    history: &[u32],
    completion: usize,
    sampling: &Sampling,
    index: u64,
) -> u32 {
    Distribution::new(logits, history, completion, sampling).pick(uniform(sampling.seed, index))
}

/// What a verifier redraws at one step: the token the request's seeded sampler picks
/// from `logits`, and how far (in probability) that draw lies from picking `delivered`
/// ([`Distribution::distance`]: 0 when they agree; small when another profile's
/// slightly different logits moved an honest draw across a boundary; typically large
/// when the provider chose `delivered` itself).
pub fn redraw(
    logits: &mut [f32],
    history: &[u32],
    completion: usize,
    sampling: &Sampling,
    index: u64,
    delivered: u32,
) -> (u32, f32) {
    let distribution = Distribution::new(logits, history, completion, sampling);
    let draw = uniform(sampling.seed, index);
    (
        distribution.pick(draw),
        distribution.distance(draw, delivered),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(temperature: f32, top_k: u32, top_p: f32, seed: u64) -> Sampling {
        Sampling {
            temperature,
            top_k,
            top_p,
            seed,
            ..Sampling::default()
        }
    }

    #[test]
    fn greedy_takes_the_argmax_and_lowest_id_on_ties() {
        let mut logits = vec![0.1, 3.0, 3.0, -1.0];
        assert_eq!(sample(&mut logits, &[], 0, &with(0.0, 0, 1.0, 0), 0), 1);
    }

    /// A redraw agrees with its own draw at distance 0; another token's distance is how
    /// far the draw lies from its interval of the cumulative distribution; a token the
    /// candidates lack is 1 away; greedy steps measure the argmax's lead.
    #[test]
    fn redraw_distances_measure_how_far_a_draw_lies_from_a_token() {
        // Probabilities 0.25 / 0.75 (token 1 first: [0, 0.75), token 0: [0.75, 1)).
        let logits = [0.0, 3f32.ln()];
        let sampled = with(1.0, 0, 1.0, 5);
        for index in 0..200 {
            let u = uniform(5, index);
            let (drawn, distance) = redraw(&mut logits.clone(), &[], 0, &sampled, index, 1);
            assert_eq!(drawn, sample(&mut logits.clone(), &[], 0, &sampled, index));
            let (_, own) = redraw(&mut logits.clone(), &[], 0, &sampled, index, drawn);
            assert_eq!(own, 0.0);
            let (_, to_zero) = redraw(&mut logits.clone(), &[], 0, &sampled, index, 0);
            if u < 0.75 {
                assert_eq!(distance, 0.0);
                assert!(
                    (f64::from(to_zero) - (0.75 - u)).abs() < 1e-4,
                    "{u} {to_zero}"
                );
            } else {
                assert!(
                    (f64::from(distance) - (u - 0.75)).abs() < 1e-4,
                    "{u} {distance}"
                );
                assert_eq!(to_zero, 0.0);
            }
        }
        let top_one = with(1.0, 1, 1.0, 5);
        assert_eq!(redraw(&mut logits.clone(), &[], 0, &top_one, 0, 0).1, 1.0);
        let greedy = with(0.0, 0, 1.0, 5);
        assert_eq!(redraw(&mut logits.clone(), &[], 0, &greedy, 0, 1), (1, 0.0));
        let (_, lead) = redraw(&mut logits.clone(), &[], 0, &greedy, 0, 0);
        assert!((lead - 0.5).abs() < 1e-6, "{lead}");
    }

    #[test]
    fn top_k_one_is_greedy() {
        for index in 0..50 {
            let mut logits = vec![0.1, 0.5, 2.0, 1.9];
            assert_eq!(sample(&mut logits, &[], 0, &with(1.0, 1, 1.0, 9), index), 2);
        }
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        for index in 0..50 {
            let mut logits = vec![0.1, 0.5, 5.0, 1.9];
            assert_eq!(
                sample(&mut logits, &[], 0, &with(1.0, 0, 0.01, 3), index),
                2
            );
        }
    }

    #[test]
    fn same_seed_same_draws_other_seed_other_draws() {
        let draw = |seed| -> Vec<u32> {
            (0..64)
                .map(|i| sample(&mut [1.0; 16], &[], 0, &with(1.0, 0, 1.0, seed), i))
                .collect()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn sampling_follows_the_distribution() {
        // logits ln(1), ln(3): expect ~25% / 75%.
        let mut ones = 0;
        for i in 0..4000 {
            let mut logits = vec![0.0, 3f32.ln()];
            ones += sample(&mut logits, &[], 0, &with(1.0, 0, 1.0, 5), i);
        }
        assert!((2800..3200).contains(&ones), "{ones}");
    }

    #[test]
    fn repetition_penalty_demotes_recent_tokens() {
        let mut logits = vec![2.0, 1.9, -1.0];
        apply_repetition_penalty(&mut logits, &[0, 0, 2], 1.5);
        assert_eq!(logits, vec![2.0 / 1.5, 1.9, -1.5]);
        let mut logits = vec![2.0, 1.9];
        let s = Sampling {
            repetition_penalty: 1.5,
            ..Sampling::default()
        };
        assert_eq!(sample(&mut logits, &[0], 1, &s, 0), 1);
    }

    #[test]
    fn uniform_is_in_range() {
        for i in 0..1000 {
            let u = uniform(42, i);
            assert!((0.0..1.0).contains(&u));
        }
    }

    #[test]
    fn presence_and_frequency_count_only_the_completion() {
        // Prompt [0], completion [1, 1, 2]: token 1 seen twice, 2 once, 0 not at all.
        let mut logits = vec![1.0, 1.0, 1.0, 1.0];
        apply_presence_frequency(&mut logits, &[1, 1, 2], 0.5, 0.25);
        assert_eq!(logits, vec![1.0, 1.0 - 0.5 - 0.5, 1.0 - 0.5 - 0.25, 1.0]);
        // Through `sample`: the prompt's token 0 is not penalised, the completion's are.
        let s = Sampling {
            presence_penalty: 1.0,
            ..Sampling::default()
        };
        let mut logits = vec![2.0, 2.5, 0.0];
        assert_eq!(sample(&mut logits, &[0, 1], 1, &s, 0), 0);
    }

    #[test]
    fn logit_bias_can_ban_and_force() {
        let s = Sampling {
            logit_bias: vec![(0, -100.0), (2, 5.0)],
            ..Sampling::default()
        };
        let mut logits = vec![9.0, 1.0, 0.0];
        assert_eq!(sample(&mut logits, &[], 0, &s, 0), 2);
        // Ids past the vocabulary are skipped, not a panic.
        apply_logit_bias(&mut [0.0; 2], &[(7, 1.0)]);
    }

    #[test]
    fn logprobs_are_the_raw_log_softmax_with_the_best_first() {
        let raw = [0.0f32, 2f32.ln(), f32::NEG_INFINITY, 2f32.ln()];
        // Probabilities 1/5, 2/5, 0, 2/5.
        let lp = logprobs(&raw, 0, 2);
        assert!((lp.logprob() - 0.2f32.ln()).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1, 3]);
        assert!((f32::from_bits(lp.top[0].1) - 0.4f32.ln()).abs() < 1e-6);
        assert_eq!(f32::from_bits(logprobs(&raw, 2, 0).logprob), f32::MIN);
        assert!(logprobs(&raw, 0, 0).top.is_empty());
        assert!(lp.validate().is_ok());
    }
}
