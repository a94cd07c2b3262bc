//! Constrained decoding: which tokens an [`OutputFormat`] allows next. A [`FormatEnv`]
//! is built once per model vocabulary (a token trie and llguidance's parser factory);
//! each job gets a [`Guide`] that masks the logits before sampling and follows the
//! tokens drawn. The allowed set depends only on the format and the tokens so far (the
//! parser is deterministic), so a resumed job, a failover and a verifier's replay
//! compute the same masks as the first run.
//!
//! JSON is compiled compact (no whitespace between tokens, `", "` and `": "` as
//! separators): a small model then cannot spend its tokens on spaces and newlines.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use sharemesh_protocol::OutputFormat;
use sharemesh_tokenizer::GgufTokenizer;
use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("the model's vocabulary has no end-of-text token to finish a format with")]
    NoEndToken,
    #[error("building the format engine for this vocabulary: {0}")]
    Vocabulary(String),
    #[error("the JSON schema is not valid JSON: {0}")]
    SchemaNotJson(String),
    #[error("the output format cannot be compiled: {0}")]
    Compile(String),
    #[error("token {token} is not allowed by the output format here: {why}")]
    Rejected { token: u32, why: String },
    #[error("the output format's parser failed: {0}")]
    Parser(String),
}

/// A vocabulary as llguidance sees it: token bytes in a trie (control tokens as
/// `0xFF` + their text, which no grammar produces).
struct VocabularyEnv {
    trie: TokTrie,
}

impl TokenizerEnv for VocabularyEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Only used to turn forced bytes into tokens; greedy over the trie is enough for
    /// that (the masks themselves come from the trie).
    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(bytes)
    }
}

/// What masks are computed against: one per model vocabulary.
pub struct FormatEnv {
    factory: ParserFactory,
    /// Every token that ends the text (end-of-text, end-of-turn): one is allowed
    /// wherever the format is complete.
    end_ids: Vec<u32>,
    vocab_size: usize,
}

impl FormatEnv {
    pub fn new(tokenizer: &GgufTokenizer) -> Result<Self, FormatError> {
        let vocab_size = tokenizer.vocab_size();
        let mut end_ids: Vec<u32> = (0..vocab_size as u32)
            .filter(|&id| tokenizer.is_end(id))
            .collect();
        end_ids.sort_unstable();
        let eos = tokenizer
            .eos_id
            .or_else(|| end_ids.first().copied())
            .ok_or(FormatError::NoEndToken)?;
        let mut words: Vec<Vec<u8>> = (0..vocab_size as u32)
            .map(|id| tokenizer.token_bytes(id).to_vec())
            .collect();
        for (text, id) in tokenizer.control_tokens() {
            if let Some(word) = words.get_mut(id as usize) {
                *word = [&[TokTrie::SPECIAL_TOKEN_MARKER], text.as_bytes()].concat();
            }
        }
        let info = TokRxInfo::new(
            u32::try_from(vocab_size).map_err(|e| FormatError::Vocabulary(e.to_string()))?,
            eos,
        );
        let env: toktrie::TokEnv = Arc::new(VocabularyEnv {
            trie: TokTrie::from(&info, &words),
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| FormatError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            end_ids,
            vocab_size,
        })
    }

    /// The guide for a job's format (`None` for free text).
    pub fn guide(&self, format: &OutputFormat) -> Result<Option<Guide>, FormatError> {
        let schema = match format {
            OutputFormat::Free => return Ok(None),
            OutputFormat::JsonObject => json!({"type": "object"}),
            OutputFormat::JsonSchema(text) => {
                serde_json::from_str(text).map_err(|e| FormatError::SchemaNotJson(e.to_string()))?
            }
        };
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_json_schema(compact(schema)))
            .map_err(|e| FormatError::Compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(FormatError::Compile(error));
        }
        Ok(Some(Guide {
            matcher,
            end_ids: self.end_ids.clone(),
            vocab_size: self.vocab_size,
        }))
    }
}

/// The schema with llguidance's compact-JSON options (unless it sets its own).
fn compact(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// One job's position in its format.
pub struct Guide {
    matcher: Matcher,
    end_ids: Vec<u32>,
    vocab_size: usize,
}

impl Guide {
    /// Sets every logit the format does not allow next to −∞ (an end token only where
    /// the text is complete). Tokens past the vocabulary are never allowed.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), FormatError> {
        // A finished format (the object closed) allows only an end token.
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| FormatError::Parser(e.to_string()))?;
        let complete = self.end_ids.iter().any(|&id| allowed.is_allowed(id));
        for (id, logit) in logits.iter_mut().enumerate() {
            let token = id as u32;
            let ok = id < self.vocab_size
                && if self.end_ids.binary_search(&token).is_ok() {
                    complete
                } else {
                    allowed.is_allowed(token)
                };
            if !ok {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Follows a token drawn (or resumed); an end token is not followed (the text ends).
    pub fn consume(&mut self, token: u32) -> Result<(), FormatError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| FormatError::Rejected {
                token,
                why: e.to_string(),
            })
    }

    /// A guide at the same position with its own state (the compiled format and the
    /// lexer's caches copied, not compiled again): one per segment of a job.
    pub fn fresh(&self) -> Guide {
        Guide {
            matcher: self.matcher.deep_clone(),
            end_ids: self.end_ids.clone(),
            vocab_size: self.vocab_size,
        }
    }

    /// Whether the text so far is a complete instance of the format.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
