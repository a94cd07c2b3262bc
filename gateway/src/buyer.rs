//! The buyer side of `/sharemesh/infer/1`: opens a stream to a provider, sends a
//! signed job request, yields the provider's answer and tokens, and acknowledges them
//! with signed cumulative receipts (every `RECEIPT_EVERY` tokens and at the end).
//! Dropping the returned stream closes the libp2p stream, which cancels the job.

use std::sync::Arc;
use std::time::Duration;

use futures::AsyncReadExt;
use libp2p::PeerId;
use sharemesh_protocol::{
    Accept, FinishReason, JobRequest, Keypair, NanoUsd, OutputCommitment, Receipt, Reject,
    SignedEnvelope, TokenChunk,
};
use sharemesh_reputation::Outcome;
use tokio::sync::mpsc;

use sharemesh_ledger::Ledger;
use sharemesh_mesh::clock::{now_ms, SeqCounter};
use sharemesh_mesh::framing::{read_frame, write_frame, FrameError};
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
    Finished {
        finish: FinishReason,
        commitment: Option<OutputCommitment>,
    },
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
    /// What the reputation book records about the provider for this ending; `None`
    /// when the fault is this node's own (its ledger could not book a receipt).
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            SegmentError::Stalled(_) => Some(Outcome::Stalled),
            SegmentError::Refused { .. } => Some(Outcome::Refused),
            SegmentError::BadChunk(_) | SegmentError::TermsMismatch(_) => Some(Outcome::Misbehaved),
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

/// Starts a job on `provider`; events arrive on the returned channel.
pub async fn start_job(
    mesh: &MeshHandle,
    key: Arc<Keypair>,
    provider: PeerId,
    request: JobRequest,
    ledger: Option<Arc<Ledger>>,
    stall_timeout: Duration,
) -> Result<mpsc::Receiver<JobEvent>, SegmentError> {
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
    let (events_tx, events) = mpsc::channel(64);
    tokio::spawn(run_job(
        stream,
        key,
        seq,
        envelope,
        request,
        events_tx,
        ledger,
        stall_timeout,
    ));
    Ok(events)
}

// The job's whole context travels into its task.
#[allow(clippy::too_many_arguments)]
async fn run_job(
    stream: libp2p::Stream,
    key: Arc<Keypair>,
    seq: SeqCounter,
    envelope: SignedEnvelope,
    request: JobRequest,
    events: mpsc::Sender<JobEvent>,
    ledger: Option<Arc<Ledger>>,
    stall_timeout: Duration,
) {
    let (mut reader, mut writer) = stream.split();
    let fail = |events: &mpsc::Sender<JobEvent>, why: SegmentError| {
        let events = events.clone();
        async move {
            let _ = events.send(JobEvent::Failed(why)).await;
        }
    };
    if let Err(err) = write_frame(&mut writer, &envelope).await {
        return fail(&events, SegmentError::SendFailed(err.to_string())).await;
    }
    let first = match read_frame(&mut reader, ANSWER_TIMEOUT).await {
        Ok(frame) => frame,
        Err(err) => return fail(&events, SegmentError::NoAnswer(err.to_string())).await,
    };
    let now = now_ms();
    let accept = match (first.open::<Accept>(now), first.open::<Reject>(now)) {
        (Ok(accept), _) => accept.body,
        (_, Ok(reject)) => {
            let _ = events.send(JobEvent::Rejected(reject.body)).await;
            return;
        }
        (Err(err), _) => return fail(&events, SegmentError::BadAnswer(err.to_string())).await,
    };
    if accept.job_id != request.job_id || accept.price_per_token > request.max_price_per_token {
        return fail(
            &events,
            SegmentError::TermsMismatch(format!(
                "job {} at {} nano-USD/token (asked: job {}, at most {})",
                accept.job_id,
                accept.price_per_token.0,
                request.job_id,
                request.max_price_per_token.0
            )),
        )
        .await;
    }
    let price: NanoUsd = accept.price_per_token;
    let prompt_tokens = u64::from(accept.prompt_tokens);
    if events
        .send(JobEvent::Accepted(accept.clone()))
        .await
        .is_err()
    {
        return; // The caller went away: closing the stream cancels the job.
    }
    // Acknowledge at least twice per credit window so the provider never has to pause.
    let every = RECEIPT_EVERY.min((u64::from(accept.credit_window_tokens) / 2).max(1));
    let mut received = 0u64;
    let mut acknowledged = 0u64;
    let mut receipted = false;
    let receipt = |tokens: u64| -> Option<(Receipt, SignedEnvelope)> {
        let body = Receipt::new(
            request.job_id,
            accept.provider,
            key.node_id(),
            prompt_tokens,
            tokens,
            price,
        )?;
        let envelope = key
            .seal(&body, seq.next(), now_ms(), 365 * 24 * 3_600_000)
            .ok()?;
        Some((body, envelope))
    };
    // The first token waits for the prefill (and any resumed tokens' replay).
    let replay = u32::try_from(request.resume.len()).unwrap_or(u32::MAX);
    let mut timeout =
        stall_timeout + PREFILL_ALLOWANCE_PER_TOKEN * accept.prompt_tokens.saturating_add(replay);
    loop {
        let frame = match read_frame(&mut reader, timeout).await {
            Ok(frame) => frame,
            Err(FrameError::Timeout(silence)) => {
                return fail(&events, SegmentError::Stalled(silence)).await
            }
            Err(err) => return fail(&events, SegmentError::StreamBroke(err.to_string())).await,
        };
        let chunk = match frame.open::<TokenChunk>(now_ms()) {
            Ok(opened)
                if opened.body.job_id == request.job_id && opened.signer == accept.provider =>
            {
                opened.body
            }
            Ok(_) => {
                return fail(
                    &events,
                    SegmentError::BadChunk("a chunk for another job or from another signer".into()),
                )
                .await
            }
            Err(err) => return fail(&events, SegmentError::BadChunk(err.to_string())).await,
        };
        received += chunk.token_ids.len() as u64;
        timeout = stall_timeout;
        let finish = chunk.finish;
        if !chunk.token_ids.is_empty() && events.send(JobEvent::Token(chunk)).await.is_err() {
            return;
        }
        if received - acknowledged >= every
            || (finish.is_some() && received > acknowledged)
            || (finish.is_some() && !receipted)
        {
            if let Some((body, envelope)) = receipt(received) {
                // Booked before it is sent: whatever the provider holds, we hold too.
                if let Some(ledger) = &ledger {
                    if let Err(err) = ledger.record_receipt(&envelope) {
                        return fail(&events, SegmentError::Booking(err.to_string())).await;
                    }
                }
                if write_frame(&mut writer, &envelope).await.is_ok() {
                    acknowledged = received;
                    receipted = true;
                }
                // Booked, so owed whether or not the provider got it.
                if events.send(JobEvent::Receipted(body)).await.is_err() {
                    return;
                }
            }
        }
        if let Some(finish) = finish {
            let commitment = match read_frame(&mut reader, Duration::from_secs(5)).await {
                Ok(frame) => frame
                    .open::<OutputCommitment>(now_ms())
                    .ok()
                    .map(|o| o.body),
                Err(_) => None,
            };
            let _ = events.send(JobEvent::Finished { finish, commitment }).await;
            return;
        }
    }
}
