//! The buyer side of the reverse auction: ask the best-ranked candidates for a `Quote`
//! in parallel over `/sharemesh/quote/2`, then rank again with what they answered
//! (their live queue wait and speed instead of the advert's).

use std::sync::Arc;
use std::time::Duration;

use futures::AsyncReadExt;
use libp2p::PeerId;
use sharemesh_market::{rank, OfferView, ScoreWeights};
use sharemesh_protocol::{
    Keypair, MessageKind, NanoUsd, NodeId, Quote, QuoteRequest, Reject, SignedEnvelope,
};

use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::framing::{read_frame, write_frame};
use sharemesh_mesh::orderbook::BookEntry;
use sharemesh_mesh::{MeshHandle, QUOTE_PROTOCOL};

/// How long the whole quote round may take (dial, ask, answer).
pub const QUOTE_DEADLINE: Duration = Duration::from_millis(2_000);

/// An eligible provider with what the gateway expects of it.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub entry: Arc<BookEntry>,
    pub price: NanoUsd,
    /// Measured ping round trip (or the default for an unmeasured peer).
    pub rtt_ms: f64,
    pub view: OfferView,
}

impl Candidate {
    pub fn provider(&self) -> NodeId {
        self.entry.advert.provider
    }
}

#[derive(Clone, Debug)]
pub enum QuoteAnswer {
    Quoted(Quote),
    Rejected(Reject),
    /// No answer before the deadline (or an answer that did not verify).
    Silent,
    /// Not asked: the gateway's own in-process provider, whose state it sees directly.
    Local,
}

/// Asks one provider; any failure is `Silent`.
pub async fn ask(
    mesh: &MeshHandle,
    key: &Keypair,
    peer: PeerId,
    request: QuoteRequest,
) -> QuoteAnswer {
    let provider = request.provider;
    let exchange = async {
        let envelope = key
            .seal(&request, now_ms(), now_ms(), 60_000)
            .map_err(|e| e.to_string())?;
        let mut control = mesh.control.clone();
        let stream = control
            .open_stream(peer, QUOTE_PROTOCOL)
            .await
            .map_err(|e| e.to_string())?;
        let (mut reader, mut writer) = stream.split();
        write_frame(&mut writer, &envelope)
            .await
            .map_err(|e| e.to_string())?;
        read_frame(&mut reader, QUOTE_DEADLINE)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(QUOTE_DEADLINE, exchange).await {
        Ok(Ok(answer)) => verify(&answer, provider, &request),
        Ok(Err(err)) => {
            tracing::debug!(%peer, %err, "no quote");
            QuoteAnswer::Silent
        }
        Err(_) => QuoteAnswer::Silent,
    }
}

/// A quote or rejection counts only if the addressed provider signed it for this job.
fn verify(envelope: &SignedEnvelope, provider: NodeId, request: &QuoteRequest) -> QuoteAnswer {
    let now = now_ms();
    match envelope.kind {
        MessageKind::Quote => match envelope.open::<Quote>(now) {
            Ok(q) if q.signer == provider && q.body.job_id == request.job_id => {
                QuoteAnswer::Quoted(q.body)
            }
            _ => QuoteAnswer::Silent,
        },
        MessageKind::Reject => match envelope.open::<Reject>(now) {
            Ok(r) if r.signer == provider && r.body.job_id == request.job_id => {
                QuoteAnswer::Rejected(r.body)
            }
            _ => QuoteAnswer::Silent,
        },
        _ => QuoteAnswer::Silent,
    }
}

/// The order after a quote round over the first `answers.len()` candidates: those that
/// quoted (price ≤ `ceiling`), ranked by the score with their quoted price, speed and
/// queue wait; then the local provider and the silent ones, in their previous order;
/// then the candidates not asked. Rejections and over-ceiling quotes are dropped.
pub fn rerank(
    candidates: Vec<Candidate>,
    answers: &[QuoteAnswer],
    ceiling: NanoUsd,
    tokens: u32,
    weights: &ScoreWeights,
) -> Vec<Candidate> {
    let mut quoted = Vec::new();
    let mut unquoted = Vec::new();
    let mut rest = Vec::new();
    for (i, mut candidate) in candidates.into_iter().enumerate() {
        match answers.get(i) {
            Some(QuoteAnswer::Quoted(q)) if q.price_per_token <= ceiling => {
                candidate.price = q.price_per_token;
                candidate.view.price_per_token = q.price_per_token.0;
                candidate.view.latency_ms = candidate.rtt_ms + f64::from(q.queue_wait_ms);
                if q.expected_milli_tokens_per_second > 0 {
                    candidate.view.tokens_per_second =
                        f64::from(q.expected_milli_tokens_per_second) / 1000.0;
                }
                quoted.push(candidate);
            }
            Some(QuoteAnswer::Quoted(_)) | Some(QuoteAnswer::Rejected(_)) => {}
            Some(QuoteAnswer::Silent) | Some(QuoteAnswer::Local) => unquoted.push(candidate),
            None => rest.push(candidate),
        }
    }
    let views: Vec<OfferView> = quoted.iter().map(|c| c.view).collect();
    let order = rank(&views, tokens, weights);
    let mut slots: Vec<Option<Candidate>> = quoted.into_iter().map(Some).collect();
    let mut out: Vec<Candidate> = order.into_iter().filter_map(|i| slots[i].take()).collect();
    out.extend(unquoted);
    out.extend(rest);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use sharemesh_protocol::{Advert, JobId, RejectReason};

    pub(crate) fn candidate(seed: u8, price: u64) -> Candidate {
        let key = Keypair::from_secret([seed; 32]);
        let advert: Advert = sharemesh_mesh::orderbook::tests_support::advert(&key);
        Candidate {
            entry: Arc::new(BookEntry {
                advert,
                seq: 1,
                issued_at_ms: 0,
                expires_at_ms: u64::MAX,
                last_seen_ms: 0,
                first_seen_ms: 0,
                bytes: 0,
            }),
            price: NanoUsd(price),
            rtt_ms: 10.0,
            view: OfferView {
                price_per_token: price,
                latency_ms: 10.0,
                tokens_per_second: 20.0,
                reliability: 0.5,
            },
        }
    }

    fn quote(c: &Candidate, price: u64, wait_ms: u32) -> QuoteAnswer {
        QuoteAnswer::Quoted(Quote {
            job_id: JobId::from_bytes([0; 16]),
            provider: c.provider(),
            price_per_token: NanoUsd(price),
            queue_wait_ms: wait_ms,
            expected_milli_tokens_per_second: 20_000,
        })
    }

    #[test]
    fn a_long_queue_loses_to_a_free_provider_and_rejections_drop_out() {
        let c: Vec<Candidate> = (1..=5).map(|i| candidate(i, 100 + u64::from(i))).collect();
        let answers = vec![
            quote(&c[0], 101, 60_000), // cheapest, but a minute of queue
            quote(&c[1], 102, 0),
            QuoteAnswer::Rejected(Reject {
                job_id: JobId::from_bytes([0; 16]),
                provider: c[2].provider(),
                reason: RejectReason::OverCapacity,
                detail: "busy".into(),
            }),
            QuoteAnswer::Silent,
        ];
        let ids: Vec<NodeId> = c.iter().map(Candidate::provider).collect();
        let out = rerank(c, &answers, NanoUsd(1_000), 100, &ScoreWeights::default());
        let order: Vec<NodeId> = out.iter().map(Candidate::provider).collect();
        assert_eq!(order, vec![ids[1], ids[0], ids[3], ids[4]]);
        assert_eq!(out[1].view.latency_ms, 10.0 + 60_000.0);
    }

    #[test]
    fn a_quote_above_the_ceiling_is_dropped() {
        let c = vec![candidate(1, 100), candidate(2, 200)];
        let answers = vec![quote(&c[0], 5_000, 0), quote(&c[1], 200, 0)];
        let second = c[1].provider();
        let out = rerank(c, &answers, NanoUsd(1_000), 100, &ScoreWeights::default());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].provider(), second);
    }
}
