//! The tokenizer, built from the GGUF's own `tokenizer.ggml.*` metadata: no
//! tokenizer.json needed. candle's `TokenizerFromGguf` does not know the `smollm`
//! pre-tokenizer and adds a leading space, giving ids that differ from llama.cpp; this
//! builds the byte-level BPE with the model's pre-tokenizer (llama.cpp's, by the name
//! in `tokenizer.ggml.pre`: `crate::pretokenize`) and registers control tokens as
//! special tokens.

use std::collections::HashMap;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

use crate::gguf::{MetaValue, Metadata};
use crate::spm::{Spm, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED};
use crate::TokenizerError;

enum Segmenter {
    /// Byte-level BPE (`gpt2`) through the `tokenizers` crate.
    Bpe(Box<Tokenizer>),
    /// SentencePiece (`llama`).
    Spm(Box<Spm>),
}

pub struct GgufTokenizer {
    inner: Segmenter,
    /// Raw bytes of each token (byte-level BPE undone); empty for control tokens,
    /// which are not rendered in output text.
    token_bytes: Vec<Vec<u8>>,
    /// Control tokens by text (rendered as empty, but templates name them).
    control_ids: HashMap<String, u32>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// Control tokens that end a turn (e.g. `<|im_end|>`, `<end_of_turn>`).
    pub end_of_turn_ids: Vec<u32>,
    pub add_bos: bool,
}

fn md<'a>(meta: &'a Metadata, key: &str) -> Result<&'a MetaValue, TokenizerError> {
    meta.get(key)
        .ok_or_else(|| TokenizerError::BadModel(format!("GGUF metadata lacks `{key}`")))
}

fn bad(key: &str, err: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::BadModel(format!("GGUF metadata `{key}`: {err}"))
}

/// GPT-2's byte → printable-char table, inverted: char → byte.
fn byte_decoder() -> HashMap<char, u8> {
    let mut bytes: Vec<u8> = (b'!'..=b'~')
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .collect();
    let mut chars: Vec<u32> = bytes.iter().map(|&b| u32::from(b)).collect();
    let mut extra = 0;
    for b in 0..=255u8 {
        if !bytes.contains(&b) {
            bytes.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    bytes
        .into_iter()
        .zip(chars)
        .filter_map(|(b, c)| char::from_u32(c).map(|c| (c, b)))
        .collect()
}

impl GgufTokenizer {
    pub fn from_metadata(meta: &Metadata) -> Result<Self, TokenizerError> {
        let model = md(meta, "tokenizer.ggml.model")?
            .to_string()
            .map_err(|e| bad("tokenizer.ggml.model", e))?;
        let model = model.as_str();
        if model != "gpt2" && model != "llama" {
            return Err(TokenizerError::Unsupported(format!(
                "tokenizer model `{model}` (supported: `gpt2` byte-level BPE, `llama` SentencePiece)"
            )));
        }
        let pre = meta
            .get("tokenizer.ggml.pre")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_else(|| "default".to_owned());
        let tokens: Vec<String> = md(meta, "tokenizer.ggml.tokens")?
            .to_vec()
            .map_err(|e| bad("tokenizer.ggml.tokens", e))?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<Result<_, _>>()
            .map_err(|e| bad("tokenizer.ggml.tokens", e))?;
        let types: Vec<i32> = match meta.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| bad("tokenizer.ggml.token_type", e))?
                .iter()
                .map(|t| t.to_i32())
                .collect::<Result<_, _>>()
                .map_err(|e| bad("tokenizer.ggml.token_type", e))?,
            None => vec![1; tokens.len()],
        };
        let get_id = |key: &str| meta.get(key).and_then(|v| v.to_u32().ok());
        let bos_id = get_id("tokenizer.ggml.bos_token_id");
        let eos_id = get_id("tokenizer.ggml.eos_token_id");
        // llama.cpp's defaults where the GGUF says nothing: BOS for SentencePiece and
        // for Llama 3's vocabulary, none for other byte-level ones.
        let split = crate::pretokenize::by_name(&pre);
        let adds_bos = model == "llama" || split.is_some_and(|p| p.adds_bos);
        let add_bos = meta
            .get("tokenizer.ggml.add_bos_token")
            .and_then(|v| v.to_bool().ok())
            .unwrap_or(adds_bos);

        let inner = if model == "llama" {
            let scores: Vec<f32> = match meta.get("tokenizer.ggml.scores") {
                Some(v) => v
                    .to_vec()
                    .map_err(|e| bad("tokenizer.ggml.scores", e))?
                    .iter()
                    .map(|s| s.to_f32())
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad("tokenizer.ggml.scores", e))?,
                None => vec![0.0; tokens.len()],
            };
            let add_space_prefix = meta
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(|v| v.to_bool().ok())
                .unwrap_or(true);
            let unknown_id = get_id("tokenizer.ggml.unknown_token_id");
            Segmenter::Spm(Box::new(Spm::new(
                &tokens,
                scores,
                &types,
                unknown_id,
                add_space_prefix,
            )))
        } else {
            let Some(split) = split else {
                return Err(TokenizerError::Unsupported(format!(
                    "pre-tokenizer `{pre}` (supported: {})",
                    crate::pretokenize::SUPPORTED
                )));
            };
            let bpe = Self::byte_level_bpe(meta, &tokens, &types, &pre, split)?;
            Segmenter::Bpe(Box::new(bpe))
        };
        let decoder = byte_decoder();
        let token_bytes = tokens
            .iter()
            .zip(&types)
            .map(|(text, &t)| {
                if matches!(inner, Segmenter::Spm(_)) {
                    Spm::token_bytes(text, t)
                } else if t == TOKEN_TYPE_CONTROL {
                    Vec::new()
                } else if t == TOKEN_TYPE_USER_DEFINED {
                    text.as_bytes().to_vec()
                } else {
                    text.chars()
                        .flat_map(|c| match decoder.get(&c) {
                            Some(&b) => vec![b],
                            None => c.to_string().into_bytes(),
                        })
                        .collect()
                }
            })
            .collect();
        let control_ids = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (_, &t))| t == TOKEN_TYPE_CONTROL)
            .map(|(id, (text, _))| (text.clone(), id as u32))
            .collect();
        let end_of_turn_ids = ["<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>"]
            .iter()
            .filter_map(|t| tokens.iter().position(|x| x == t).map(|i| i as u32))
            .filter(|&i| types.get(i as usize) == Some(&TOKEN_TYPE_CONTROL))
            .collect();
        Ok(Self {
            inner,
            token_bytes,
            control_ids,
            bos_id,
            eos_id,
            end_of_turn_ids,
            add_bos,
        })
    }

    fn byte_level_bpe(
        meta: &Metadata,
        tokens: &[String],
        types: &[i32],
        pre: &str,
        split: crate::pretokenize::PreTokenizer,
    ) -> Result<Tokenizer, TokenizerError> {
        let merges: Vec<(String, String)> = md(meta, "tokenizer.ggml.merges")?
            .to_vec()
            .map_err(|e| bad("tokenizer.ggml.merges", e))?
            .iter()
            .map(|v| {
                let text = v.to_string().map_err(|e| bad("tokenizer.ggml.merges", e))?;
                let (a, b) = text.split_once(' ').ok_or_else(|| {
                    bad("tokenizer.ggml.merges", format!("`{text}` is not `a b`"))
                })?;
                Ok((a.to_owned(), b.to_owned()))
            })
            .collect::<Result<_, TokenizerError>>()?;
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(split.ignore_merges)
            .build()
            .map_err(|e| TokenizerError::BadModel(format!("building BPE: {e}")))?;
        let mut inner = Tokenizer::new(bpe);
        let pre_tokenizer: PreTokenizerWrapper = match pre {
            // Individual digits, then GPT-2's split, as the tokenizer has always built
            // the catalog's SmolLM2 (the same split as the table's).
            "smollm" => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, false, true).into(),
            ])
            .into(),
            _ => split.build()?,
        };
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(types)
            .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
            .map(|(text, _)| AddedToken::from(text.clone(), true))
            .collect();
        inner
            .add_special_tokens(specials)
            .map_err(|e| TokenizerError::BadModel(format!("registering special tokens: {e}")))?;

        Ok(inner)
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// Token ids for `text`; special tokens written in the text are recognised (as
    /// llama.cpp does with `parse_special`). No BOS is added here.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match &self.inner {
            Segmenter::Spm(spm) => Ok(spm.encode(text)),
            Segmenter::Bpe(bpe) => {
                let encoding = bpe
                    .encode_fast(text, false)
                    .map_err(|e| TokenizerError::Tokenizer(e.to_string()))?;
                Ok(encoding.get_ids().to_vec())
            }
        }
    }

    /// The raw bytes a token stands for (empty for control tokens).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// Whole-text decoding (lossy on invalid UTF-8).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| self.token_bytes(id).to_vec())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether the vocabulary has a control token with exactly this text (e.g.
    /// `<start_of_turn>`).
    pub fn has_control_token(&self, text: &str) -> bool {
        self.control_ids.contains_key(text)
    }

    /// Every control token (`<|im_end|>`, `<start_of_turn>`, …) with its id.
    pub fn control_tokens(&self) -> impl Iterator<Item = (&str, u32)> {
        self.control_ids
            .iter()
            .map(|(text, &id)| (text.as_str(), id))
    }

    /// The literal text of a token as a template writes it: `<bos>` for a control
    /// token, the decoded text otherwise.
    pub fn token_literal(&self, id: u32) -> String {
        self.control_ids
            .iter()
            .find(|(_, &control)| control == id)
            .map(|(text, _)| text.clone())
            .unwrap_or_else(|| String::from_utf8_lossy(self.token_bytes(id)).into_owned())
    }

    pub fn is_end(&self, id: u32) -> bool {
        Some(id) == self.eos_id || self.end_of_turn_ids.contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_decoder_covers_all_bytes() {
        let table = byte_decoder();
        assert_eq!(table.len(), 256);
        assert_eq!(table[&'Ġ'], b' ');
        assert_eq!(table[&'Ċ'], b'\n');
    }
}
