#![no_main]
//! Untrusted payload bytes straight into each body decoder (no signature in the way),
//! so the fuzzer reaches the body decoders and validators directly.
use libfuzzer_sys::fuzz_target;
use sharemesh_protocol::codec::decode;
use sharemesh_protocol::*;

fn check<T: WireMessage>(data: &[u8]) {
    if let Ok(body) = decode::<T>(data, "payload", T::MAX_BYTES) {
        let _ = body.validate();
    }
}

fuzz_target!(|data: &[u8]| {
    check::<Advert>(data);
    check::<Attestation>(data);
    check::<JobRequest>(data);
    check::<Quote>(data);
    check::<Accept>(data);
    check::<Reject>(data);
    check::<TokenChunk>(data);
    check::<Receipt>(data);
    check::<OutputCommitment>(data);
    check::<ReputationReport>(data);
});
