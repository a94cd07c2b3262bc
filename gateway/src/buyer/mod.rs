//! The buyer side of `/sharemesh/infer/2`: opens a stream to a provider, sends a
//! signed job request, yields the provider's answer and tokens, and acknowledges them
//! with signed cumulative receipts (every `RECEIPT_EVERY` tokens and at the end). The
//! stream is a state machine its owner polls ([`BuyerStream::next`]): no task or
//! channel sits between the wire and the dispatcher. Dropping it closes the libp2p
//! stream, which cancels the job.

mod checks;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::io::{ReadHalf, WriteHalf};
use futures::AsyncReadExt;
use libp2p::PeerId;
use sharemesh_protocol::commitment::commitment_root;
use sharemesh_protocol::{
    Accept, Digest, FinishReason, JobRequest, Keypair, Receipt, Reject, SignedEnvelope, TokenChunk,
};
use sharemesh_reputation::Outcome;

use sharemesh_ledger::Ledger;
use sharemesh_tokenizer::{Step, TextStream};

use crate::verify::transcript::Transcript;
use crate::vocab::Counted;
use checks::{check_accept, check_chunk, check_commitment, preview, AcceptProblem};
use sharemesh_mesh::clock::{now_ms, SeqCounter};
use sharemesh_mesh::framing::{write_frame, FrameError, FrameReader};
use sharemesh_mesh::{MeshHandle, INFER_PROTOCOL};

/// Receipts go out at least this often (in tokens); the provider's credit window is
/// larger, so a paying buyer never stalls it.
pub const RECEIPT_EVERY: u64 = 8;
/// How long a provider may take to accept or reject a request.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Prefill allowance before the first token, per prompt token (10 tokens/s at worst).
pub const PREFILL_ALLOWANCE_PER_TOKEN: Duration = Duration::from_millis(100);
/// A provider silent this long is considered stalled (gateways may set their own).
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The slowest a segment may stream once its first token arrived, on average, beyond
/// one stall timeout of slack: a provider that drips one token per stall timeout would
/// otherwise hold the buyer (and bill) for as long as `max_tokens` allows.
pub const MIN_TOKENS_PER_SECOND: f64 = 1.0;

/// What a job stream yields, in order: `Accepted` or `Rejected`, then `Token`s with a
/// `Receipted` after each receipt the buyer signed and booked, then `Finished` or
/// `Failed`. The last `Receipted` is what the segment costs: amounts are read from
/// receipts, never recomputed.
#[derive(Debug, Clone)]
pub enum JobEvent {
    Accepted(Accept),
    Rejected(Reject),
    Token(TokenChunk),
    Receipted(Receipt),
    Finished { finish: FinishReason },
    Failed(SegmentError),
}

/// Why a provider's segment of a response ended before it finished. Each is a typed
/// outcome the dispatcher branches on and the reputation book records: a stall is a
/// stall, a forged chunk is not a broken stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    #[error("could not open a stream to the provider: {0}")]
    Unreachable(String),
    #[error("sending the request failed: {0}")]
    SendFailed(String),
    #[error("no answer from the provider: {0}")]
    NoAnswer(String),
    #[error("bad answer from the provider: {0}")]
    BadAnswer(String),
    #[error("the provider accepted on terms we did not ask for: {0}")]
    TermsMismatch(String),
    /// Without the model's vocabulary, a count above the prompt's token bound: waited
    /// on before it is held against the provider (`Dispatcher::serve`).
    #[error("the provider counted the prompt as {claim} tokens, more than its bound of {bound} without the model's own template, which did not arrive")]
    Uncounted { bound: u64, claim: u32 },
    #[error("the provider went silent for {0:?}")]
    Stalled(Duration),
    #[error("the provider's stream broke: {0}")]
    StreamBroke(String),
    #[error("bad chunk: {0}")]
    BadChunk(String),
    #[error("could not book a receipt: {0}")]
    Booking(String),
    #[error("the provider's engine failed: {0}")]
    EngineFailed(String),
    #[error("the provider refused the job ({reason:?}): {detail}")]
    Refused {
        reason: sharemesh_protocol::RejectReason,
        detail: String,
    },
}

impl SegmentError {
    /// Whether opening the job again may help: the stream could not be opened or was
    /// dropped before any answer (a busy provider drops streams it cannot take yet).
    pub fn worth_retrying(&self) -> bool {
        matches!(
            self,
            SegmentError::Unreachable(_)
                | SegmentError::SendFailed(_)
                | SegmentError::NoAnswer(_)
                | SegmentError::StreamBroke(_)
        )
    }

    /// A refusal for lack of capacity (`RejectReason::is_at_capacity`).
    pub fn is_at_capacity(&self) -> bool {
        matches!(self, SegmentError::Refused { reason, .. } if reason.is_at_capacity())
    }

    /// The provider cannot take the job now but may soon: at capacity, or not reachable
    /// (yet: a provider behind NAT is reachable once it holds a relay reservation, and
    /// its next advert says where). A request every provider was unavailable for waits
    /// for a turn instead of failing.
    pub fn is_unavailable(&self) -> bool {
        self.is_at_capacity() || matches!(self, SegmentError::Unreachable(_))
    }

    /// What the reputation book records about the provider for this ending; `None`
    /// when the fault is this node's own (its ledger could not book a receipt).
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            SegmentError::Stalled(_) => Some(Outcome::Stalled),
            SegmentError::Refused { .. } => Some(Outcome::Refused),
            // An over-bound count is waited on (the vocabulary is fetched and the
            // provider asked again) before it counts against the provider.
            SegmentError::BadChunk(_)
            | SegmentError::TermsMismatch(_)
            | SegmentError::Uncounted { .. } => Some(Outcome::Misbehaved),
            SegmentError::Booking(_) => None,
            SegmentError::Unreachable(_)
            | SegmentError::SendFailed(_)
            | SegmentError::NoAnswer(_)
            | SegmentError::BadAnswer(_)
            | SegmentError::StreamBroke(_)
            | SegmentError::EngineFailed(_) => Some(Outcome::Failed),
        }
    }
}

/// What the buyer signs receipts for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Billing {
    /// Cumulative receipts for what this provider delivered (every job a client asked
    /// for), booked against the API key (id) the request came with, if any.
    Metered(Option<String>),
    /// No receipts at all: a standby warm-up, which SPEC §10 leaves unbilled (it is the
    /// provider's bid to be next in line), or a test's buyer that never pays.
    Unbilled,
}

/// How the buyer side runs a job stream.
#[derive(Clone)]
pub struct StreamTerms {
    /// Books each receipt before it is sent (`None`: not booked).
    pub ledger: Option<Arc<Ledger>>,
    /// A provider silent this long counts as stalled.
    pub stall_timeout: Duration,
    pub billing: Billing,
    /// The prompt as this buyer counted it with the model's vocabulary (`None`: no
    /// vocabulary; the prompt's token bound applies and text is not checked).
    pub counted: Option<Counted>,
}

/// Starts a job on `provider`: opens the stream and sends the signed request. The
/// returned [`BuyerStream`] yields the job's events as it is polled.
pub async fn start_job(
    mesh: &MeshHandle,
    key: Arc<Keypair>,
    provider: PeerId,
    request: JobRequest,
    terms: StreamTerms,
) -> Result<BuyerStream, SegmentError> {
    // The stream's peer is the provider the request (and so its `Accept`) must name:
    // its transport key proves it, which binds the answer to the addressed identity.
    if request.provider.peer_id().ok() != Some(provider) {
        return Err(SegmentError::SendFailed(format!(
            "a request addressed to {} sent on a stream to {provider}",
            request.provider
        )));
    }
    let seq = SeqCounter::default();
    let envelope = key
        .seal(&request, seq.next(), now_ms(), 3_600_000)
        .map_err(|e| SegmentError::SendFailed(format!("sealing the request: {e}")))?;
    let mut control = mesh.control.clone();
    let stream = tokio::time::timeout(
        Duration::from_secs(15),
        control.open_stream(provider, INFER_PROTOCOL),
    )
    .await
    .map_err(|_| SegmentError::Unreachable(format!("timed out opening a stream to {provider}")))?
    .map_err(|e| SegmentError::Unreachable(format!("{provider}: {e}")))?;
    let (reader, mut writer) = stream.split();
    write_frame(&mut writer, &envelope)
        .await
        .map_err(|e| SegmentError::SendFailed(e.to_string()))?;
    Ok(BuyerStream {
        reader: FrameReader::new(reader),
        writer: Some(writer),
        key,
        seq,
        request,
        sealed_request: envelope,
        terms,
        state: State::AwaitAnswer,
        pending: VecDeque::new(),
        transcript: None,
        owed: None,
    })
}

/// The buyer's side of one job stream, a state machine polled by its owner (no task
/// of its own): `AwaitAnswer` → (`Rejected` | `Accepted` → `Streaming` → `Finished`),
/// or `Failed` with a typed reason from any state. Receipts are signed, booked and sent
/// as tokens arrive. Dropping it closes the stream, which cancels the job.
pub struct BuyerStream {
    reader: FrameReader<ReadHalf<libp2p::Stream>>,
    /// `None` only once dropped with tokens owed: a task of its own pays them.
    writer: Option<WriteHalf<libp2p::Stream>>,
    key: Arc<Keypair>,
    seq: SeqCounter,
    request: JobRequest,
    /// The request as signed and sent: evidence in a fraud proof.
    sealed_request: SignedEnvelope,
    terms: StreamTerms,
    state: State,
    /// Events decoded from one frame and not yet returned.
    pending: VecDeque<JobEvent>,
    /// What the provider signed for this job, once it accepted.
    transcript: Option<Transcript>,
    /// While metered tokens stream: the receipt for everything received so far, and
    /// whether it was sent. Kept outside `state` (which a pending `next` holds) so a
    /// stream dropped mid-job pays for what arrived (see its `Drop`).
    owed: Option<(Receipt, bool)>,
}

enum State {
    AwaitAnswer,
    Streaming(Box<Streaming>),
    Done,
}

/// What the buyer counts while tokens arrive.
struct Streaming {
    accept: Accept,
    /// The text the tokens must spell (with the vocabulary): the engine's own
    /// function of the token bytes and stop sequences, fed the resumed prefix first.
    text: Option<TextStream>,
    /// A stop sequence ended the text: only the final chunk may follow.
    stopped: bool,
    /// Receipts go out every this many tokens.
    every: u64,
    received: u64,
    acknowledged: u64,
    /// The commitment head the last receipt sent acknowledged.
    acknowledged_head: Option<Digest>,
    /// Silence allowed before the next chunk (the first waits for the prefill).
    timeout: Duration,
    /// When the first token arrived: the rate floor counts from there.
    first_token: Option<std::time::Instant>,
    /// The provider's commitment chain as this buyer recomputed it.
    head: Digest,
    /// The request's output format, followed token by token (with the vocabulary).
    format: Option<crate::format_check::FormatCheck>,
}

impl BuyerStream {
    /// The next event; `None` once the job ended (after `Finished`, `Rejected` or
    /// `Failed`).
    pub async fn next(&mut self) -> Option<JobEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            match std::mem::replace(&mut self.state, State::Done) {
                State::Done => return None,
                State::AwaitAnswer => self.state = self.read_answer().await,
                State::Streaming(streaming) => self.state = self.read_chunk(streaming).await,
            }
        }
    }

    fn fail(&mut self, why: SegmentError) -> State {
        // A segment that failed is not paid beyond its last receipt (a bad chunk ends
        // the paying; a stalled or broken stream has no one to pay).
        self.owed = None;
        self.pending.push_back(JobEvent::Failed(why));
        State::Done
    }

    /// What the provider signed for this job so far: its `Accept` and every chunk that
    /// passed the checks (and the one that failed them, if one did), for verification.
    pub fn transcript(&self) -> Option<&Transcript> {
        self.transcript.as_ref()
    }

    /// `Accept` (checked against the request) or `Reject`.
    async fn read_answer(&mut self) -> State {
        let first = match self.reader.next(ANSWER_TIMEOUT).await {
            Ok(frame) => frame,
            Err(err) => return self.fail(SegmentError::NoAnswer(err.to_string())),
        };
        let now = now_ms();
        let sealed_accept = first.clone();
        let accept = match (first.open::<Accept>(now), first.open::<Reject>(now)) {
            (Ok(accept), _) => accept.body,
            (_, Ok(reject)) => {
                self.pending.push_back(JobEvent::Rejected(reject.body));
                return State::Done;
            }
            (Err(err), _) => return self.fail(SegmentError::BadAnswer(err.to_string())),
        };
        let counted = self.terms.counted.as_ref().map(|c| c.prompt_tokens);
        match check_accept(&accept, &self.request, counted) {
            Ok(()) => {}
            Err(AcceptProblem::Mismatch(why)) => {
                return self.fail(SegmentError::TermsMismatch(why))
            }
            Err(AcceptProblem::Uncounted { bound, claim }) => {
                return self.fail(SegmentError::Uncounted { bound, claim })
            }
        }
        // Acknowledge at least twice per credit window so the provider never has to
        // pause. The first token waits for the prefill (and any resumed tokens' replay).
        let every = RECEIPT_EVERY.min((u64::from(accept.credit_window_tokens) / 2).max(1));
        let replay = u32::try_from(self.request.resume.len()).unwrap_or(u32::MAX);
        let prefill = accept.prompt_tokens.saturating_add(replay);
        let timeout = self.terms.stall_timeout + PREFILL_ALLOWANCE_PER_TOKEN * prefill;
        let text = self.terms.counted.as_ref().map(|counted| {
            let mut text = TextStream::new(&self.request.sampling.stop);
            for &token in &self.request.resume {
                let _ = text.push(counted.vocabulary.tokenizer.token_bytes(token));
            }
            text
        });
        let Ok(request_digest) = sharemesh_protocol::envelope::body_digest(&self.request) else {
            return self.fail(SegmentError::SendFailed(
                "the request does not encode".into(),
            ));
        };
        let head = commitment_root(
            &self.request.job_id,
            &accept.provider,
            &request_digest,
            &accept.profile,
        );
        self.transcript = Some(Transcript::new(
            self.sealed_request.clone(),
            sealed_accept,
            self.request.clone(),
            accept.clone(),
        ));
        self.pending.push_back(JobEvent::Accepted(accept.clone()));
        let format =
            crate::format_check::FormatCheck::start(&self.request, self.terms.counted.as_ref());
        State::Streaming(Box::new(Streaming {
            head,
            format,
            accept,
            text,
            stopped: false,
            every,
            received: 0,
            acknowledged: 0,
            acknowledged_head: None,
            timeout,
            first_token: None,
        }))
    }

    /// One chunk: checked, relayed, receipted when due.
    async fn read_chunk(&mut self, mut at: Box<Streaming>) -> State {
        let frame = match self.reader.next(at.timeout).await {
            Ok(frame) => frame,
            Err(FrameError::Timeout(silence)) => return self.fail(SegmentError::Stalled(silence)),
            Err(err) => return self.fail(SegmentError::StreamBroke(err.to_string())),
        };
        let chunk = match frame.open::<TokenChunk>(now_ms()) {
            Ok(opened)
                if opened.body.job_id == self.request.job_id
                    && opened.signer == at.accept.provider =>
            {
                opened.body
            }
            Ok(_) => {
                let why = "a chunk for another job or from another signer".into();
                return self.fail(SegmentError::BadChunk(why));
            }
            Err(err) => return self.fail(SegmentError::BadChunk(err.to_string())),
        };
        let mut checked = check_chunk(&chunk, &self.request, at.received)
            .and_then(|()| check_commitment(&chunk, &self.request, &at.head))
            .and_then(|()| self.check_text(&chunk, &mut at));
        if let (Ok(()), Some(format)) = (&checked, at.format.as_mut()) {
            checked = format.follow(&chunk, at.stopped);
        }
        if let Some(transcript) = self.transcript.as_mut() {
            // Kept even when it fails the checks: a provider-signed chunk that breaks
            // the greedy rule is evidence on its own.
            transcript.push(frame, chunk.clone());
        }
        if let Err(why) = checked {
            // Nothing more is paid: the bad chunk is neither relayed nor receipted.
            return self.fail(SegmentError::BadChunk(why));
        }
        at.head = chunk.commitment;
        at.received += chunk.token_ids.len() as u64;
        if at.received > 0 {
            let first = *at.first_token.get_or_insert_with(std::time::Instant::now);
            let until_floor =
                rate_floor(self.terms.stall_timeout, at.received).checked_sub(first.elapsed());
            let Some(until_floor) = until_floor else {
                // Behind the rate floor: cut off as stalled, whatever it sends next.
                return self.fail(SegmentError::Stalled(first.elapsed()));
            };
            at.timeout = self.terms.stall_timeout.min(until_floor);
        } else {
            at.timeout = self.terms.stall_timeout;
        }
        if matches!(self.terms.billing, Billing::Metered(_)) && at.received > at.acknowledged {
            self.owed = self.receipt_for(&at).map(|receipt| (receipt, false));
        }
        let finish = chunk.finish;
        if !chunk.token_ids.is_empty() {
            self.pending.push_back(JobEvent::Token(chunk));
        }
        // Nothing delivered, nothing receipted (a job that ends before its first token
        // is not paid for its prompt either). The final receipt acknowledges the final
        // chunk's head even when the last tokens were receipted already (the provider
        // waits for it).
        let due = at.received - at.acknowledged >= at.every
            || (finish.is_some()
                && at.received > 0
                && (at.received > at.acknowledged || at.acknowledged_head != Some(at.head)));
        if due && matches!(self.terms.billing, Billing::Metered(_)) {
            if let Err(why) = self.pay(&mut at).await {
                return self.fail(why);
            }
        }
        match finish {
            None => State::Streaming(at),
            Some(finish) => {
                self.pending.push_back(JobEvent::Finished { finish });
                State::Done
            }
        }
    }

    /// The cumulative receipt for everything received so far (`None`: the amount
    /// overflows, nothing sensible to sign).
    fn receipt_for(&self, at: &Streaming) -> Option<Receipt> {
        Receipt::new(
            self.request.job_id,
            at.accept.provider,
            self.key.node_id(),
            self.request.billed_prompt_tokens(at.accept.prompt_tokens),
            at.received,
            at.accept.price_per_token,
            at.head,
        )
    }

    /// Signs a cumulative receipt for what arrived, books it, then sends it.
    async fn pay(&mut self, at: &mut Streaming) -> Result<(), SegmentError> {
        let Some(body) = self.receipt_for(at) else {
            return Ok(());
        };
        let Ok(envelope) = self.seal_receipt(&body) else {
            return Ok(());
        };
        book_receipt(&self.terms, &envelope).await?;
        // The receipt is booked: from here on it is owed whether or not it is sent.
        if let Some((_, sent)) = self.owed.as_mut() {
            *sent = true;
        }
        let written = match self.writer.as_mut() {
            Some(writer) => write_frame(writer, &envelope).await.is_ok(),
            None => false,
        };
        if written {
            at.acknowledged = at.received;
            at.acknowledged_head = Some(at.head);
        }
        self.pending.push_back(JobEvent::Receipted(body));
        Ok(())
    }

    fn seal_receipt(&self, receipt: &Receipt) -> Result<SignedEnvelope, SegmentError> {
        self.key
            .seal(receipt, self.seq.next(), now_ms(), 365 * 24 * 3_600_000)
            .map_err(|err| SegmentError::Booking(err.to_string()))
    }
}

/// Books a receipt before it is sent: whatever the provider holds, the buyer holds too.
async fn book_receipt(terms: &StreamTerms, envelope: &SignedEnvelope) -> Result<(), SegmentError> {
    let Some(ledger) = &terms.ledger else {
        return Ok(());
    };
    let api_key = match &terms.billing {
        Billing::Metered(api_key) => api_key.clone(),
        Billing::Unbilled => None,
    };
    // sled flushes to disk: off the async runtime's threads.
    let (ledger, booked) = (ledger.clone(), envelope.clone());
    tokio::task::spawn_blocking(move || ledger.record_receipt(&booked, api_key.as_deref()))
        .await
        .map_err(|err| SegmentError::Booking(err.to_string()))?
        .map_err(|err| SegmentError::Booking(err.to_string()))?;
    Ok(())
}

impl Drop for BuyerStream {
    /// A buyer that leaves mid-job (its client went away, or it moved on) still pays
    /// for every token it received: the receipt is booked and sent from a task of its
    /// own, which then closes the stream. A provider counts a buyer that pays nothing
    /// for what it was sent as walking away (SPEC §10).
    fn drop(&mut self) {
        let Some((receipt, false)) = self.owed.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (Ok(envelope), Some(mut writer)) = (self.seal_receipt(&receipt), self.writer.take())
        else {
            return;
        };
        let terms = self.terms.clone();
        runtime.spawn(async move {
            if book_receipt(&terms, &envelope).await.is_ok() {
                let _ = write_frame(&mut writer, &envelope).await;
                let _ = futures::AsyncWriteExt::close(&mut writer).await;
            }
        });
    }
}

/// How long after its first token a segment may take to deliver its next token after
/// `received` (the first included): one stall timeout, then at least
/// [`MIN_TOKENS_PER_SECOND`] on average.
fn rate_floor(stall_timeout: Duration, received: u64) -> Duration {
    stall_timeout + Duration::from_secs_f64(received as f64 / MIN_TOKENS_PER_SECOND)
}

impl BuyerStream {
    /// With the vocabulary: every token (and log-probability alternative) is in it, the
    /// chunk's text is exactly what its tokens spell (after the stop-sequence hold-back
    /// the engine applies), and nothing follows a stop sequence but the end.
    fn check_text(&self, chunk: &TokenChunk, at: &mut Streaming) -> Result<(), String> {
        let (Some(text), Some(counted)) = (at.text.as_mut(), self.terms.counted.as_ref()) else {
            return Ok(());
        };
        let tokenizer = &counted.vocabulary.tokenizer;
        if at.stopped && !chunk.token_ids.is_empty() {
            return Err("tokens after a stop sequence ended the text".into());
        }
        let alternatives = chunk
            .logprobs
            .iter()
            .flat_map(|lp| lp.top.iter().map(|(id, _)| id));
        if let Some(id) = alternatives
            .copied()
            .find(|&id| id as usize >= tokenizer.vocab_size())
        {
            return Err(format!(
                "log-probability alternative {id} is outside the model's vocabulary"
            ));
        }
        let mut expected = String::new();
        for (i, &id) in chunk.token_ids.iter().enumerate() {
            if id as usize >= tokenizer.vocab_size() {
                return Err(format!("token {id} is outside the model's vocabulary"));
            }
            match text.push(tokenizer.token_bytes(id)) {
                Step::Delta(delta) => expected.push_str(&delta),
                Step::Stopped(delta) => {
                    expected.push_str(&delta);
                    at.stopped = true;
                    if i + 1 < chunk.token_ids.len() {
                        return Err("tokens after a stop sequence ended the text".into());
                    }
                }
            }
        }
        if chunk.text_delta != expected {
            return Err(format!(
                "text {:?} is not what tokens {:?} spell ({:?})",
                preview(&chunk.text_delta),
                &chunk.token_ids[..chunk.token_ids.len().min(8)],
                preview(&expected)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_floor_allows_one_stall_timeout_then_a_token_a_second() {
        let stall = Duration::from_secs(30);
        assert_eq!(rate_floor(stall, 1), Duration::from_secs(31));
        assert_eq!(rate_floor(stall, 100), Duration::from_secs(130));
        // A drip of one token per 29 s falls behind by its second token.
        let drip = |n: u32| Duration::from_secs(29) * n;
        assert!(drip(1) < rate_floor(stall, 1));
        assert!(drip(2) > rate_floor(stall, 2));
    }
}
