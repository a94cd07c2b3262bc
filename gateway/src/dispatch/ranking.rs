//! Ranking the live offers for a request, with this node's view of each provider
//! (`Trust::standings`: success rate, trust, hardware findings, measured speed).

use super::*;

impl Dispatcher {
    /// Eligible providers for `model`, best first (see [`plan::candidates`]).
    pub fn candidates(
        &self,
        model: &ModelId,
        request: &RouteRequest,
        rtt_ms: &std::collections::HashMap<libp2p::PeerId, f64>,
    ) -> (Vec<Candidate>, Tier) {
        self.rank(self.live(), model, request, rtt_ms)
    }

    /// [`Self::candidates`] over a copy of the book the caller already took.
    pub(super) fn rank(
        &self,
        live: Vec<Arc<BookEntry>>,
        model: &ModelId,
        request: &RouteRequest,
        rtt_ms: &std::collections::HashMap<libp2p::PeerId, f64>,
    ) -> (Vec<Candidate>, Tier) {
        let now = now_ms();
        self.check_memory_claims(&live, model);
        let standings = self.trust.standings(&live, now);
        let record = |provider: &NodeId| {
            let standing = standings.of(provider);
            plan::ProviderRecord {
                reliability: standing.reliability(),
                measured_speed: standing.measured_speed,
            }
        };
        let context = plan::Context {
            live,
            defaults: &self.defaults,
            rtt_ms,
            record: &record,
            now_ms: now,
        };
        plan::candidates(model, request, &context)
    }

    /// Where this gateway holds `model`'s header: an advert offering it on less memory
    /// than its weights and a KV cache for the advertised context need is a hardware
    /// finding (ranked lower, every job verified) until the advert changes.
    pub(super) fn check_memory_claims(&self, live: &[Arc<BookEntry>], model: &ModelId) {
        let Some(memory) = self.vocabularies.get(model).and_then(|v| v.memory) else {
            return;
        };
        let attestations = &self.trust.attestations;
        for entry in live {
            let Some(offer) = entry.advert.offer(model) else {
                continue;
            };
            let needed = memory.needed_for(offer.model.context_length);
            let name = offer.model.name.as_str();
            let finding =
                crate::verify::attest::memory_shortfall(&entry.advert.hardware, name, needed);
            let provider = entry.advert.provider;
            if attestations.note_memory(provider, name, finding) {
                tracing::warn!(%provider, model = name, "advertised memory below what the model needs");
                self.trust.auditor.suspect(provider);
            }
        }
    }

    /// While this gateway fetches `model` to replay its jobs, a provider that served it
    /// meanwhile waits for that work to be judged (`Trust::on_credit`); when every
    /// candidate waits, so does the request (a busy error: it waits for a turn).
    pub(super) fn hold_on_credit(
        &self,
        model: &ModelId,
        candidates: Vec<Candidate>,
    ) -> Result<Vec<Candidate>, RouteError> {
        let offered = candidates.len();
        let hold = crate::verify::escalate::credit_hold(self.defaults.waiting.max_wait);
        let free: Vec<Candidate> = candidates
            .into_iter()
            .filter(|c| !self.trust.on_credit(model, &c.provider(), hold))
            .collect();
        if free.is_empty() && offered > 0 {
            return Err(RouteError::busy(format!(
                "all {offered} providers of this model served it since this gateway began \
                 fetching it to verify their work; waiting until that work is replayed"
            )));
        }
        Ok(free)
    }

    pub(super) fn limit_unproven(&self, candidates: Vec<Candidate>) -> Vec<Candidate> {
        let Ok(book) = self.mesh.book.read() else {
            return candidates;
        };
        plan::limit_unproven(candidates, self.defaults.unproven_ahead, |id| {
            book.is_known_good(id)
        })
    }
}
