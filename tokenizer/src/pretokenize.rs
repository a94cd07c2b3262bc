//! llama.cpp's byte-level BPE pre-tokenizers, found by the name a GGUF gives in
//! `tokenizer.ggml.pre`: the regexes `llm_tokenizer_bpe` splits a text with
//! (`src/llama-vocab.cpp` of the llama.cpp that llama-cpp-python 0.3.16 vendors), each
//! splitting the pieces the one before left (a match and the text between matches are
//! both pieces: `Split` with `Isolated`), then GPT-2's byte-to-character mapping; and
//! whether a piece that is a whole token skips the merges (Llama 3's `ignore_merges`).
//! Checked against llama.cpp's own tokenizer tests (`models/ggml-vocab-*.gguf` with
//! `.inp`/`.out`: `tokenizer/tests/llama_vocab.rs`).

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::TokenizerError;

/// GPT-2's split (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_GPT2`).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's, as llama.cpp adapted it (`(?i:'s|…)` spelled out case by case).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// CJK runs, as DeepSeek's vocabularies split them.
const DEEPSEEK_CJK: &str = "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+";

/// How one `tokenizer.ggml.pre` splits text before the merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreTokenizer {
    /// Applied in order, each to the pieces the one before left.
    pub regexes: &'static [&'static str],
    /// A piece that is a whole token is that token, merges or not.
    pub ignore_merges: bool,
    /// A text prompt starts with BOS unless the GGUF says otherwise
    /// (`tokenizer.ggml.add_bos_token`).
    pub adds_bos: bool,
}

const fn splits(regexes: &'static [&'static str]) -> PreTokenizer {
    PreTokenizer {
        regexes,
        ignore_merges: false,
        adds_bos: false,
    }
}

/// The names this module knows, for the error that names an unknown one.
pub const SUPPORTED: &str = "smollm, gpt-2 (gpt2, phi-2, mpt, olmo, …), llama-bpe (llama3, \
     llama-v3, falcon3, pixtral, …), qwen2 (deepseek-r1-qwen, stablelm2), deepseek-llm, \
     deepseek-coder, deepseek-v3, falcon, starcoder (refact, command-r, codeshell, exaone), \
     default";

/// The pre-tokenizer llama.cpp runs for `name` (`tokenizer.ggml.pre`), if known here.
pub fn by_name(name: &str) -> Option<PreTokenizer> {
    Some(match name {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
        | "midm-2.0" | "lfm2" | "dbrx" | "smaug-bpe" => {
            let llama3 = name != "dbrx" && name != "smaug-bpe";
            PreTokenizer {
                regexes: &[LLAMA3],
                ignore_merges: llama3,
                adds_bos: llama3,
            }
        }
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "hunyuan" => splits(&[QWEN2]),
        // Spelled with escapes: a source file's editor may normalise the Greek
        // letters (U+1FD3 → U+0390), which turns a range inside out.
        "deepseek-llm" => splits(&[
            "[\r\n]",
            "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
            "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
            "\\s+$",
            DEEPSEEK_CJK,
            "\\p{N}+",
        ]),
        "deepseek-coder" => splits(&[
            "[\r\n]",
            "\\s?\\p{L}+",
            "\\s?\\p{P}+",
            DEEPSEEK_CJK,
            "\\p{N}",
        ]),
        "deepseek-v3" | "hunyuan-dense" => splits(&[
            "\\p{N}{1,3}",
            "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        ]),
        "falcon" => splits(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
        | "minerva-7b" => splits(&[r"\p{N}", GPT2]),
        "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "jina-es"
        | "jina-de" | "jina-v2-es" | "jina-v2-de" | "gigachat" | "a.x-4.0" | "mellum" => {
            splits(&[GPT2])
        }
        "default" => splits(&[
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2,
            r"\p{N}+",
            "[0-9][0-9][0-9]",
        ]),
        _ => return None,
    })
}

impl PreTokenizer {
    /// The `tokenizers` pre-tokenizer: each regex as an isolating split, then the byte
    /// mapping (no regex of its own).
    pub fn build(&self) -> Result<PreTokenizerWrapper, TokenizerError> {
        let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(self.regexes.len() + 1);
        for regex in self.regexes {
            let split = Split::new(
                SplitPattern::Regex((*regex).to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TokenizerError::BadModel(format!("pre-tokenizer regex `{regex}`: {e}")))?;
            steps.push(split.into());
        }
        steps.push(ByteLevel::new(false, false, false).into());
        Ok(Sequence::new(steps).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer as _};

    fn pieces(name: &str, text: &str) -> Vec<String> {
        let pre = by_name(name).unwrap().build().unwrap();
        let mut string = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut string).unwrap();
        string
            .get_splits(OffsetReferential::Original, OffsetType::Char)
            .into_iter()
            .map(|(piece, _, _)| piece.to_owned())
            .collect()
    }

    #[test]
    fn every_known_name_builds() {
        for name in [
            "llama-bpe",
            "qwen2",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "falcon",
            "smollm",
            "gpt-2",
            "default",
            "dbrx",
        ] {
            assert!(by_name(name).unwrap().build().is_ok(), "{name}");
        }
        assert!(by_name("nonsense").is_none());
    }

    #[test]
    fn llama3_keeps_three_digits_together_and_qwen2_one() {
        // Ġ is GPT-2's mapped space.
        assert_eq!(
            pieces("llama-bpe", "12345 it's"),
            ["123", "45", "Ġit", "'s"]
        );
        assert_eq!(pieces("qwen2", "123"), ["1", "2", "3"]);
        assert!(by_name("llama-bpe").unwrap().ignore_merges);
        assert!(!by_name("qwen2").unwrap().ignore_merges);
    }
}
