//! The canonical encoding: bincode 2 (serde), little-endian, fixed-width integers,
//! with a hard byte limit so a hostile length prefix cannot make the decoder allocate
//! more than [`crate::MAX_ENVELOPE_BYTES`].

use bincode::config::{Configuration, Fixint, Limit, LittleEndian};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::DecodeError;
use crate::MAX_ENVELOPE_BYTES;

type Config = Configuration<LittleEndian, Fixint, Limit<MAX_ENVELOPE_BYTES>>;

const fn config() -> Config {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<MAX_ENVELOPE_BYTES>()
}

/// Encodes a value canonically. Fails only if the value is over the global limit.
pub fn encode<T: Serialize>(value: &T, what: &'static str) -> Result<Vec<u8>, DecodeError> {
    let bytes =
        bincode::serde::encode_to_vec(value, config()).map_err(|e| DecodeError::Malformed {
            what,
            detail: e.to_string(),
        })?;
    if bytes.len() > MAX_ENVELOPE_BYTES {
        return Err(DecodeError::TooLarge {
            what,
            len: bytes.len(),
            limit: MAX_ENVELOPE_BYTES,
        });
    }
    Ok(bytes)
}

/// Decodes exactly one value from `bytes`: the whole slice must be consumed, so each
/// value has one encoding and nothing can be smuggled after it.
pub fn decode<T: DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
    limit: usize,
) -> Result<T, DecodeError> {
    if bytes.len() > limit {
        return Err(DecodeError::TooLarge {
            what,
            len: bytes.len(),
            limit,
        });
    }
    let (value, used) =
        bincode::serde::decode_from_slice::<T, _>(bytes, config()).map_err(|e| {
            DecodeError::Malformed {
                what,
                detail: e.to_string(),
            }
        })?;
    if used != bytes.len() {
        return Err(DecodeError::TrailingBytes {
            what,
            extra: bytes.len() - used,
        });
    }
    Ok(value)
}
