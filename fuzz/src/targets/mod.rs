//! The targets, by name.

use crate::Target;

mod gguf;
mod ledger;
mod openai;
mod orderbook;
pub mod samples;
mod tokenizer;
mod wire;

/// Every target (`model` is the GGUF the tokenizer and GGUF targets read).
pub fn all(model: Option<&std::path::Path>) -> Vec<Target> {
    let mut targets = vec![
        wire::frames(),
        wire::bodies(),
        orderbook::target(),
        ledger::target(),
        openai::target(),
    ];
    if let Some(model) = model {
        targets.push(tokenizer::target(model));
        targets.push(gguf::target(model));
    }
    targets
}

/// The names [`all`] knows, in order.
pub const NAMES: &[&str] = &[
    "frames",
    "bodies",
    "orderbook",
    "ledger",
    "openai",
    "tokenizer",
    "gguf",
];
