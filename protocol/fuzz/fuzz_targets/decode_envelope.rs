#![no_main]
//! Untrusted bytes → envelope: must never panic; a decoded envelope re-encodes to the
//! same bytes (one encoding per value).
use libfuzzer_sys::fuzz_target;
use sharemesh_protocol::SignedEnvelope;

fuzz_target!(|data: &[u8]| {
    if let Ok(envelope) = SignedEnvelope::from_bytes(data) {
        let again = envelope.to_bytes().expect("a decoded envelope re-encodes");
        assert_eq!(again, data);
        let _ = envelope.verify_signature();
    }
});
