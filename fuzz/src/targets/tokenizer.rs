//! Text through the model's tokenizer (the engine encodes every prompt a buyer sends).
//! Invariants: every id is in the vocabulary, and the tokens spell the text back.

use std::path::Path;

use sharemesh_tokenizer::Vocabulary;

use crate::Target;

const TEXTS: &[&str] = &[
    "Hello, world! How are you?",
    "  leading spaces\tand\ttabs\n\nnew lines",
    "числа 12345 и emoji 🦀🔥, 中文, ∑ ∫ ≠",
    "<|im_start|>user\nhi<|im_end|>",
    "a\u{0}b\u{7f}c\u{feff}",
];

pub fn target(model: &Path) -> Target {
    let file = std::fs::File::open(model)
        .unwrap_or_else(|e| panic!("the tokenizer target reads {}: {e}", model.display()));
    let tokenizer = Vocabulary::read(std::io::BufReader::new(file))
        .unwrap_or_else(|e| panic!("{e}"))
        .tokenizer;
    let mut single_bytes = [false; 256];
    for id in 0..tokenizer.vocab_size() as u32 {
        if let [byte] = tokenizer.token_bytes(id) {
            single_bytes[usize::from(*byte)] = true;
        }
    }
    Target {
        name: "tokenizer",
        seeds: || TEXTS.iter().map(|t| t.as_bytes().to_vec()).collect(),
        run: Box::new(move |input: &[u8]| {
            let text = String::from_utf8_lossy(input);
            let Ok(ids) = tokenizer.encode(&text) else {
                return;
            };
            let vocab = tokenizer.vocab_size();
            assert!(
                ids.iter().all(|&id| (id as usize) < vocab),
                "id out of the vocabulary"
            );
            // The tokens spell the text, byte for byte: control tokens (which decode
            // to nothing) as the literal they were recognised from. A vocabulary may
            // lack a byte (SmolLM2's has no token for six C0 control bytes and some
            // UTF-8 lead bytes): such bytes are dropped, by every node alike.
            let spelled: Vec<u8> = ids
                .iter()
                .flat_map(|&id| match tokenizer.token_bytes(id) {
                    [] => tokenizer.token_literal(id).into_bytes(),
                    bytes => bytes.to_vec(),
                })
                .collect();
            let representable: Vec<u8> = text
                .bytes()
                .filter(|b| single_bytes[usize::from(*b)])
                .collect();
            assert_eq!(spelled, representable, "text does not round-trip");
        }),
    }
}
