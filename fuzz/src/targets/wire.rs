//! What arrives on a stream: length-prefixed frames, each an envelope, each envelope's
//! body for its kind.

use std::time::Duration;

use sharemesh_mesh::framing::FrameReader;
use sharemesh_protocol::{
    Accept, Advert, Attestation, FraudProof, JobRequest, MessageKind, Quote, QuoteRequest, Receipt,
    Reject, ReputationReport, SettlementBinding, SignedEnvelope, SpendingAuthorisation, TokenChunk,
    WireMessage,
};

use super::samples::{self, decode_and_validate};
use crate::Target;

/// Every body decoder, by kind.
fn decode_body(kind: MessageKind, payload: &[u8]) {
    match kind {
        MessageKind::Advert => decode_and_validate::<Advert>(payload),
        MessageKind::Attestation => decode_and_validate::<Attestation>(payload),
        MessageKind::JobRequest => {
            decode_and_validate::<JobRequest>(payload);
            if let Ok(job) =
                sharemesh_protocol::codec::decode::<JobRequest>(payload, "payload", usize::MAX)
            {
                let _ = job.prompt.token_bound();
            }
        }
        MessageKind::Quote => decode_and_validate::<Quote>(payload),
        MessageKind::Accept => decode_and_validate::<Accept>(payload),
        MessageKind::Reject => decode_and_validate::<Reject>(payload),
        MessageKind::TokenChunk => decode_and_validate::<TokenChunk>(payload),
        MessageKind::Receipt => decode_and_validate::<Receipt>(payload),
        // Retired: no body decodes under it any more.
        MessageKind::OutputCommitment => {}
        MessageKind::FraudProof => {
            decode_and_validate::<FraudProof>(payload);
            if let Ok(proof) =
                sharemesh_protocol::codec::decode::<FraudProof>(payload, "payload", usize::MAX)
            {
                let _ = proof.evidence();
            }
        }
        MessageKind::ReputationReport => decode_and_validate::<ReputationReport>(payload),
        MessageKind::QuoteRequest => decode_and_validate::<QuoteRequest>(payload),
        MessageKind::SettlementBinding => decode_and_validate::<SettlementBinding>(payload),
        MessageKind::SpendingAuthorisation => decode_and_validate::<SpendingAuthorisation>(payload),
    }
}

const KINDS: [MessageKind; 14] = [
    MessageKind::Advert,
    MessageKind::Attestation,
    MessageKind::JobRequest,
    MessageKind::Quote,
    MessageKind::Accept,
    MessageKind::Reject,
    MessageKind::TokenChunk,
    MessageKind::Receipt,
    MessageKind::OutputCommitment,
    MessageKind::ReputationReport,
    MessageKind::QuoteRequest,
    MessageKind::FraudProof,
    MessageKind::SettlementBinding,
    MessageKind::SpendingAuthorisation,
];

fn open_as_its_kind(envelope: &SignedEnvelope) {
    fn open<T: WireMessage>(envelope: &SignedEnvelope) {
        let _ = envelope.open::<T>(samples::NOW);
    }
    match envelope.kind {
        MessageKind::Advert => open::<Advert>(envelope),
        MessageKind::JobRequest => open::<JobRequest>(envelope),
        MessageKind::TokenChunk => open::<TokenChunk>(envelope),
        MessageKind::Receipt => open::<Receipt>(envelope),
        MessageKind::QuoteRequest => open::<QuoteRequest>(envelope),
        _ => open::<Accept>(envelope),
    }
    decode_body(envelope.kind, &envelope.payload);
}

/// A byte stream of frames, read as a peer's stream is read.
pub fn frames() -> Target {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("a runtime for the frame reader: {e}"));
    Target {
        name: "frames",
        seeds: || {
            let framed: Vec<Vec<u8>> = samples::envelope_bytes()
                .into_iter()
                .map(|bytes| {
                    let mut frame = (bytes.len() as u32).to_be_bytes().to_vec();
                    frame.extend_from_slice(&bytes);
                    frame
                })
                .collect();
            let mut seeds = framed.clone();
            seeds.push(framed.concat());
            seeds
        },
        run: Box::new(move |input: &[u8]| {
            runtime.block_on(async {
                let mut reader = FrameReader::new(futures::io::Cursor::new(input.to_vec()));
                // Each frame is at least 5 bytes: the loop ends.
                while let Ok(envelope) = reader.next(Duration::from_millis(100)).await {
                    open_as_its_kind(&envelope);
                }
            });
        }),
    }
}

/// `[kind] ‖ body`: every body decoder and validation, past the signature.
pub fn bodies() -> Target {
    Target {
        name: "bodies",
        seeds: samples::bodies,
        run: Box::new(|input: &[u8]| {
            let Some((&kind, payload)) = input.split_first() else {
                return;
            };
            decode_body(KINDS[usize::from(kind) % KINDS.len()], payload);
        }),
    }
}
