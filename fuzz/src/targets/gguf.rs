//! GGUF headers (metadata, vocabulary, tensor table): as a gateway reads a header a
//! provider sent (`sharemesh-tokenizer`'s bounded reader, then the vocabulary built
//! from it) and as the engine reads a model file (candle's reader). A corrupt or
//! hostile header must be an error, not a crash.

use std::io::{Cursor, Read};
use std::path::Path;

use sharemesh_engine::weights;
use sharemesh_tokenizer::Vocabulary;

use crate::Target;

/// Seeds are read from the model once; `Target::seeds` is a plain `fn`.
static HEADER: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

fn header_of(model: &Path) -> Vec<u8> {
    let mut file = std::fs::File::open(model)
        .unwrap_or_else(|e| panic!("the GGUF target reads {}: {e}", model.display()));
    let content = weights::read_content(&mut file, model).unwrap_or_else(|e| panic!("{e}"));
    let mut header = vec![0u8; content.tensor_data_offset as usize];
    let mut file = std::fs::File::open(model).unwrap_or_else(|e| panic!("{e}"));
    file.read_exact(&mut header)
        .unwrap_or_else(|e| panic!("{e}"));
    header
}

pub fn target(model: &Path) -> Target {
    let _ = HEADER.set(header_of(model));
    let path = model.to_owned();
    Target {
        name: "gguf",
        seeds: || HEADER.get().into_iter().cloned().collect(),
        run: Box::new(move |input: &[u8]| {
            if let Ok(header) = sharemesh_tokenizer::read_header(input) {
                assert!(
                    header.tensor_data_offset >= 24,
                    "a header is at least 24 bytes"
                );
                let _ = Vocabulary::from_metadata(&header.metadata);
            }
            if let Ok(content) = weights::read_content(&mut Cursor::new(input), &path) {
                let _ = weights::info(&content);
            }
        }),
    }
}
