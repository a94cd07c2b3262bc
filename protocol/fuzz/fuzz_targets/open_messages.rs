#![no_main]
//! Untrusted envelope → every typed message decoder, with and without the clock.
use libfuzzer_sys::fuzz_target;
use sharemesh_protocol::*;

fuzz_target!(|data: &[u8]| {
    let Ok(envelope) = SignedEnvelope::from_bytes(data) else {
        return;
    };
    let now = 1_796_029_200_000;
    let _ = envelope.open::<Advert>(now);
    let _ = envelope.open::<Attestation>(now);
    let _ = envelope.open::<JobRequest>(now);
    let _ = envelope.open::<Quote>(now);
    let _ = envelope.open::<Accept>(now);
    let _ = envelope.open::<Reject>(now);
    let _ = envelope.open::<TokenChunk>(now);
    let _ = envelope.open::<Receipt>(now);
    let _ = envelope.open::<OutputCommitment>(now);
    let _ = envelope.open::<ReputationReport>(now);
});
