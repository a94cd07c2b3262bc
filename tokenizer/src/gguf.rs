//! A bounded reader of a GGUF file's header: the metadata (vocabulary, merges, chat
//! template, …) and the tensor table, up to where the tensor data starts. It reads
//! what a peer could send (a model header fetched from a provider), so every count and
//! length is bounded and nothing is allocated ahead of the bytes that back it.

use std::collections::HashMap;
use std::io::Read;

/// The header's size limit: the largest vocabularies (262k tokens with scores and
/// types) take ~10 MiB.
pub const MAX_HEADER_BYTES: u64 = 64 << 20;
const MAX_STRING_BYTES: u64 = 16 << 20;
const MAX_ARRAY_ITEMS: u64 = 4 << 20;
const MAX_KEYS: u64 = 1 << 16;
const MAX_TENSORS: u64 = 1 << 20;
const MAX_DIMS: u32 = 8;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("reading the GGUF header: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a GGUF file (magic {0:02x?})")]
    NotGguf([u8; 4]),
    #[error("GGUF version {0} is not supported (2 and 3 are)")]
    Version(u32),
    #[error("GGUF header: {what} {got} exceeds the limit {limit}")]
    TooLarge {
        what: &'static str,
        got: u64,
        limit: u64,
    },
    #[error("GGUF header: unknown value type {0}")]
    ValueType(u32),
    #[error("GGUF header: a string is not UTF-8")]
    Utf8,
    #[error("GGUF metadata `{key}`: {problem}")]
    Metadata { key: String, problem: String },
}

/// A metadata value (integers widened; arrays of any type).
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Bool(bool),
    Text(String),
    Array(Vec<MetaValue>),
}

/// Metadata by key.
pub type Metadata = HashMap<String, MetaValue>;

fn wrong(expected: &str, got: &MetaValue) -> String {
    format!("expected {expected}, found {got:?}")
        .chars()
        .take(120)
        .collect()
}

impl MetaValue {
    pub fn to_string(&self) -> Result<&String, String> {
        match self {
            MetaValue::Text(text) => Ok(text),
            other => Err(wrong("a string", other)),
        }
    }

    pub fn to_vec(&self) -> Result<&Vec<MetaValue>, String> {
        match self {
            MetaValue::Array(items) => Ok(items),
            other => Err(wrong("an array", other)),
        }
    }

    pub fn to_u64(&self) -> Result<u64, String> {
        match self {
            MetaValue::Unsigned(v) => Ok(*v),
            MetaValue::Signed(v) => u64::try_from(*v).map_err(|_| wrong("a count", self)),
            other => Err(wrong("an integer", other)),
        }
    }

    pub fn to_u32(&self) -> Result<u32, String> {
        u32::try_from(self.to_u64()?).map_err(|_| wrong("a 32-bit integer", self))
    }

    pub fn to_i32(&self) -> Result<i32, String> {
        match self {
            MetaValue::Signed(v) => i32::try_from(*v).map_err(|_| wrong("a 32-bit integer", self)),
            MetaValue::Unsigned(v) => {
                i32::try_from(*v).map_err(|_| wrong("a 32-bit integer", self))
            }
            other => Err(wrong("an integer", other)),
        }
    }

    pub fn to_f32(&self) -> Result<f32, String> {
        match self {
            MetaValue::Float(v) => Ok(*v as f32),
            other => Err(wrong("a float", other)),
        }
    }

    pub fn to_bool(&self) -> Result<bool, String> {
        match self {
            MetaValue::Bool(v) => Ok(*v),
            other => Err(wrong("a bool", other)),
        }
    }
}

/// A model file's header bytes (everything before the tensor data) and the sha256 of
/// its tensor data: what `/sharemesh/model-header/2` sends, and what the model id is
/// made of (`sharemesh_protocol::model_header`).
#[derive(Clone, Debug)]
pub struct ModelHeader {
    pub bytes: Vec<u8>,
    pub tensor_digest: [u8; 32],
}

impl ModelHeader {
    /// Reads a GGUF file's header and hashes its tensor data (one pass over the file).
    pub fn read_file(path: &std::path::Path) -> Result<Self, GgufError> {
        use sha2::{Digest as _, Sha256};
        let header = read_header(std::io::BufReader::new(std::fs::File::open(path)?))?;
        let mut file = std::fs::File::open(path)?;
        let mut bytes = Vec::new();
        (&mut file)
            .take(header.tensor_data_offset)
            .read_to_end(&mut bytes)?;
        if bytes.len() as u64 != header.tensor_data_offset {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(Self {
            bytes,
            tensor_digest: hasher.finalize().into(),
        })
    }

    /// The model id these parts make.
    pub fn id(&self) -> sharemesh_protocol::ModelId {
        use sha2::{Digest as _, Sha256};
        let header_digest: [u8; 32] = Sha256::digest(&self.bytes).into();
        sharemesh_protocol::ModelId::of_parts(&header_digest, &self.tensor_digest)
    }
}

/// A GGUF header read back.
#[derive(Debug)]
pub struct GgufHeader {
    pub metadata: Metadata,
    pub tensor_count: u64,
    /// Where the tensor data starts (the header's length, alignment padding included).
    pub tensor_data_offset: u64,
    /// How many bytes of tensor data the tensor table describes: the furthest end of a
    /// tensor (offset plus its size), for the ggml types whose size is known here; a
    /// tensor of another type counts from its offset only, so this is a lower bound.
    pub tensor_data_bytes: u64,
}

/// Bytes of a tensor of ggml type `ggml_type` with `elements` elements (`None`: a type
/// whose block size is not known here).
fn tensor_bytes(ggml_type: u32, elements: u64) -> Option<u64> {
    // (elements per block, bytes per block), from ggml's type traits.
    let (block, bytes) = match ggml_type {
        0 => (1, 4),      // F32
        1 | 30 => (1, 2), // F16, BF16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        _ => return None,
    };
    elements.div_ceil(block).checked_mul(bytes)
}

/// Counts the bytes read so the header's length is known and bounded.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Counted<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf)?;
        self.advance(N as u64)?;
        Ok(buf)
    }

    fn advance(&mut self, n: u64) -> Result<(), GgufError> {
        self.read += n;
        if self.read > MAX_HEADER_BYTES {
            return Err(GgufError::TooLarge {
                what: "header bytes",
                got: self.read,
                limit: MAX_HEADER_BYTES,
            });
        }
        Ok(())
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn bounded(&mut self, what: &'static str, limit: u64) -> Result<u64, GgufError> {
        let got = self.u64()?;
        if got > limit {
            return Err(GgufError::TooLarge { what, got, limit });
        }
        Ok(got)
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let len = self.bounded("string length", MAX_STRING_BYTES)?;
        let mut bytes = Vec::new();
        // `take` reads what is there: a lying length meets the end of the input.
        (&mut self.inner).take(len).read_to_end(&mut bytes)?;
        if bytes.len() as u64 != len {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        self.advance(len)?;
        String::from_utf8(bytes).map_err(|_| GgufError::Utf8)
    }

    fn value(&mut self, kind: u32, depth: u8) -> Result<MetaValue, GgufError> {
        Ok(match kind {
            0 => MetaValue::Unsigned(u64::from(self.bytes::<1>()?[0])),
            1 => MetaValue::Signed(i64::from(i8::from_le_bytes(self.bytes()?))),
            2 => MetaValue::Unsigned(u64::from(u16::from_le_bytes(self.bytes()?))),
            3 => MetaValue::Signed(i64::from(i16::from_le_bytes(self.bytes()?))),
            4 => MetaValue::Unsigned(u64::from(self.u32()?)),
            5 => MetaValue::Signed(i64::from(i32::from_le_bytes(self.bytes()?))),
            6 => MetaValue::Float(f64::from(f32::from_le_bytes(self.bytes()?))),
            7 => MetaValue::Bool(self.bytes::<1>()?[0] != 0),
            8 => MetaValue::Text(self.string()?),
            9 if depth < 2 => {
                let item_kind = self.u32()?;
                let count = self.bounded("array length", MAX_ARRAY_ITEMS)?;
                let mut items = Vec::new();
                for _ in 0..count {
                    items.push(self.value(item_kind, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::Unsigned(self.u64()?),
            11 => MetaValue::Signed(i64::from_le_bytes(self.bytes()?)),
            12 => MetaValue::Float(f64::from_le_bytes(self.bytes()?)),
            other => return Err(GgufError::ValueType(other)),
        })
    }
}

/// Reads a GGUF header from the start of `reader` (which is left just after the
/// tensor table, before the alignment padding).
pub fn read_header<R: Read>(reader: R) -> Result<GgufHeader, GgufError> {
    let mut input = Counted {
        inner: reader,
        read: 0,
    };
    let magic = input.bytes::<4>()?;
    if &magic != b"GGUF" {
        return Err(GgufError::NotGguf(magic));
    }
    let version = input.u32()?;
    if version != 2 && version != 3 {
        return Err(GgufError::Version(version));
    }
    let tensor_count = input.bounded("tensor count", MAX_TENSORS)?;
    let key_count = input.bounded("metadata key count", MAX_KEYS)?;
    let mut metadata = Metadata::new();
    for _ in 0..key_count {
        let key = input.string()?;
        let kind = input.u32()?;
        let value = input.value(kind, 0)?;
        metadata.insert(key, value);
    }
    let mut tensor_data_bytes = 0u64;
    for _ in 0..tensor_count {
        let _name = input.string()?;
        let dims = input.u32()?;
        if dims > MAX_DIMS {
            return Err(GgufError::TooLarge {
                what: "tensor dimensions",
                got: u64::from(dims),
                limit: u64::from(MAX_DIMS),
            });
        }
        let mut elements = 1u64;
        for _ in 0..dims {
            elements = elements.saturating_mul(input.u64()?);
        }
        let ggml_type = input.u32()?;
        let offset = input.u64()?;
        let size = tensor_bytes(ggml_type, elements).unwrap_or(0);
        tensor_data_bytes = tensor_data_bytes.max(offset.saturating_add(size));
    }
    let alignment = match metadata.get("general.alignment") {
        Some(value) => value.to_u64().map_err(|problem| GgufError::Metadata {
            key: "general.alignment".into(),
            problem,
        })?,
        None => 32,
    };
    if alignment == 0 || alignment > 1 << 16 {
        return Err(GgufError::Metadata {
            key: "general.alignment".into(),
            problem: format!("{alignment} is not a usable alignment"),
        });
    }
    let tensor_data_offset = input.read.div_ceil(alignment) * alignment;
    Ok(GgufHeader {
        metadata,
        tensor_count,
        tensor_data_offset,
        tensor_data_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny GGUF header: two keys, one tensor.
    pub(crate) fn tiny() -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(1u64.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        let string = |out: &mut Vec<u8>, s: &str| {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        };
        string(&mut out, "general.architecture");
        out.extend(8u32.to_le_bytes());
        string(&mut out, "llama");
        string(&mut out, "tokenizer.ggml.tokens");
        out.extend(9u32.to_le_bytes());
        out.extend(8u32.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        string(&mut out, "a");
        string(&mut out, "b");
        string(&mut out, "output.weight");
        out.extend(2u32.to_le_bytes());
        out.extend(4u64.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out
    }

    #[test]
    fn reads_keys_arrays_and_where_the_data_starts() {
        let bytes = tiny();
        let header = read_header(bytes.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        // One F32 tensor of 4 × 2 at offset 0.
        assert_eq!(header.tensor_data_bytes, 32);
        assert_eq!(
            header.metadata["general.architecture"].to_string(),
            Ok(&"llama".to_owned())
        );
        assert_eq!(
            header.metadata["tokenizer.ggml.tokens"]
                .to_vec()
                .map(Vec::len),
            Ok(2)
        );
        assert_eq!(header.tensor_count, 1);
        assert_eq!(
            header.tensor_data_offset,
            (bytes.len() as u64).div_ceil(32) * 32
        );
    }

    #[test]
    fn lying_lengths_are_errors_not_allocations() {
        let bytes = tiny();
        // The first key's length set to 2^60, then to just past the end.
        for len in [1u64 << 60, 10_000] {
            let mut bad = bytes.clone();
            bad[24..32].copy_from_slice(&len.to_le_bytes());
            assert!(read_header(bad.as_slice()).is_err(), "length {len}");
        }
        // An array claiming 4 billion items.
        let at = bytes
            .windows(8)
            .position(|w| w == 2u64.to_le_bytes())
            .unwrap_or(0);
        let mut bad = bytes.clone();
        bad[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(read_header(bad.as_slice()).is_err());
        for cut in 0..bytes.len() {
            assert!(read_header(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert!(matches!(
            read_header(&b"GGUX\x03\0\0\0"[..]),
            Err(GgufError::NotGguf(_))
        ));
    }
}
