//! SentencePiece-style tokenizer (GGUF `tokenizer.ggml.model = "llama"`: Gemma, Llama 2,
//! Mistral), written to give llama.cpp's ids: special and user-defined tokens are cut
//! out of the text first (longest first), spaces become `▁`, then adjacent pieces merge
//! greedily by vocabulary score (ties: leftmost first) and pieces that are no token fall
//! back to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// GGUF token types (llama.cpp `llama_token_type`).
pub const TOKEN_TYPE_UNKNOWN: i32 = 2;
pub const TOKEN_TYPE_CONTROL: i32 = 3;
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
pub const TOKEN_TYPE_BYTE: i32 = 6;

const SPACE_MARK: char = '\u{2581}';

pub struct Spm {
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// `<0xXX>` token of each byte (or the unknown token where the vocabulary lacks it).
    byte_ids: [Option<u32>; 256],
    unknown_id: Option<u32>,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<(String, u32)>,
    add_space_prefix: bool,
}

enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// Highest score first; among equal scores the leftmost pair (llama.cpp's order).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Spm {
    pub fn new(
        tokens: &[String],
        scores: Vec<f32>,
        types: &[i32],
        unknown_id: Option<u32>,
        add_space_prefix: bool,
    ) -> Self {
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut byte_ids = [None; 256];
        for (byte, slot) in byte_ids.iter_mut().enumerate() {
            *slot = ids
                .get(&format!("<0x{byte:02X}>"))
                .copied()
                .or_else(|| {
                    // Vocabularies without byte tokens may hold the character itself.
                    char::from_u32(byte as u32)
                        .filter(|_| byte < 0x80)
                        .and_then(|c| ids.get(&c.to_string()).copied())
                })
                .or(unknown_id);
        }
        let mut specials: Vec<(String, u32)> = tokens
            .iter()
            .zip(types)
            .enumerate()
            .filter(|(_, (text, &t))| {
                !text.is_empty()
                    && matches!(
                        t,
                        TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED | TOKEN_TYPE_UNKNOWN
                    )
            })
            .map(|(i, (text, _))| (text.clone(), i as u32))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Self {
            ids,
            scores,
            byte_ids,
            unknown_id,
            specials,
            add_space_prefix,
        }
    }

    /// Token ids of `text`, special tokens written in it recognised; no BOS.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut output = Vec::new();
        let mut previous_was_special = true;
        for fragment in self.partition(text) {
            match fragment {
                Fragment::Token(id) => {
                    output.push(id);
                    previous_was_special = true;
                }
                Fragment::Text(raw) => {
                    let mut escaped = String::with_capacity(raw.len() + 3);
                    if self.add_space_prefix && previous_was_special {
                        escaped.push(SPACE_MARK);
                    }
                    escaped.extend(raw.chars().map(|c| if c == ' ' { SPACE_MARK } else { c }));
                    self.segment(&escaped, &mut output);
                    previous_was_special = false;
                }
            }
        }
        output
    }

    /// Splits `text` on every special token's occurrences, longest tokens first.
    fn partition<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        // No text, no fragment: llama.cpp gives an empty text no tokens at all (not
        // the space prefix alone).
        let mut fragments = if text.is_empty() {
            Vec::new()
        } else {
            vec![Fragment::Text(text)]
        };
        for (special, id) in &self.specials {
            if !text.contains(special.as_str()) {
                continue;
            }
            let mut split = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    split.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(special.as_str()) {
                    if at > 0 {
                        split.push(Fragment::Text(&rest[..at]));
                    }
                    split.push(Fragment::Token(*id));
                    rest = &rest[at + special.len()..];
                }
                if !rest.is_empty() {
                    split.push(Fragment::Text(rest));
                }
            }
            fragments = split;
        }
        fragments
    }

    fn score_of(&self, text: &str) -> Option<(u32, f32)> {
        let id = *self.ids.get(text)?;
        Some((id, self.scores.get(id as usize).copied().unwrap_or(0.0)))
    }

    fn segment(&self, text: &str, output: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let count = symbols.len();
        for (i, symbol) in symbols.iter_mut().enumerate() {
            symbol.prev = i.checked_sub(1);
            symbol.next = (i + 1 < count).then_some(i + 1);
        }
        let mut queue = BinaryHeap::new();
        let mut merged_from: HashMap<&str, (usize, usize)> = HashMap::new();
        for i in 1..count {
            self.try_pair(
                text,
                &symbols,
                &mut queue,
                &mut merged_from,
                Some(i - 1),
                Some(i),
            );
        }
        while let Some(bigram) = queue.pop() {
            let (left_len, right_len) = (symbols[bigram.left].len, symbols[bigram.right].len);
            // Stale: one side has merged since this pair was queued.
            if left_len == 0 || right_len == 0 || left_len + right_len != bigram.size {
                continue;
            }
            symbols[bigram.left].len += right_len;
            symbols[bigram.right].len = 0;
            let after = symbols[bigram.right].next;
            symbols[bigram.left].next = after;
            if let Some(after) = after {
                symbols[after].prev = Some(bigram.left);
            }
            let before = symbols[bigram.left].prev;
            self.try_pair(
                text,
                &symbols,
                &mut queue,
                &mut merged_from,
                before,
                Some(bigram.left),
            );
            self.try_pair(
                text,
                &symbols,
                &mut queue,
                &mut merged_from,
                Some(bigram.left),
                after,
            );
        }
        let mut at = (count > 0).then_some(0);
        while let Some(i) = at {
            self.resegment(text, &symbols, i, &merged_from, output);
            at = symbols[i].next;
        }
    }

    /// Queues the merge of two neighbours if their joined text is a token.
    fn try_pair<'t>(
        &self,
        text: &'t str,
        symbols: &[Symbol],
        queue: &mut BinaryHeap<Bigram>,
        merged_from: &mut HashMap<&'t str, (usize, usize)>,
        left: Option<usize>,
        right: Option<usize>,
    ) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let start = symbols[left].start;
        let size = symbols[left].len + symbols[right].len;
        let Some(piece) = text.get(start..start + size) else {
            return;
        };
        let Some((_, score)) = self.score_of(piece) else {
            return;
        };
        queue.push(Bigram {
            score,
            left,
            right,
            size,
        });
        merged_from.insert(piece, (left, right));
    }

    /// Emits the token of a merged piece, or splits it back along its merges; bytes of
    /// what never formed a token become byte tokens.
    fn resegment(
        &self,
        text: &str,
        symbols: &[Symbol],
        index: usize,
        merged_from: &HashMap<&str, (usize, usize)>,
        output: &mut Vec<u32>,
    ) {
        let symbol = &symbols[index];
        let piece = &text[symbol.start..symbol.start + symbol.len];
        if let Some(&id) = self.ids.get(piece) {
            output.push(id);
            return;
        }
        match merged_from.get(piece) {
            Some(&(left, right)) => {
                self.resegment(text, symbols, left, merged_from, output);
                self.resegment(text, symbols, right, merged_from, output);
            }
            None => output.extend(
                piece
                    .bytes()
                    .filter_map(|b| self.byte_ids[b as usize].or(self.unknown_id)),
            ),
        }
    }

    /// The text a token stands for: `▁` back to spaces, byte tokens to their byte.
    pub fn token_bytes(text: &str, token_type: i32) -> Vec<u8> {
        match token_type {
            TOKEN_TYPE_CONTROL => Vec::new(),
            TOKEN_TYPE_USER_DEFINED => text.as_bytes().to_vec(),
            TOKEN_TYPE_BYTE => text
                .strip_prefix("<0x")
                .and_then(|t| t.strip_suffix('>'))
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .map_or_else(|| text.as_bytes().to_vec(), |b| vec![b]),
            _ => text.replace(SPACE_MARK, " ").into_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Spm {
        let (tokens, types, scores) = vocab_parts();
        Spm::new(&tokens, scores, &types, Some(0), false)
    }

    fn vocab_parts() -> (Vec<String>, Vec<i32>, Vec<f32>) {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "\n", "▁", "a", "b", "ab", "▁ab", "abab"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut types = vec![2, 3, 4, 1, 1, 1, 1, 1, 1];
        let mut scores = vec![0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -1.5, -0.5, -3.0];
        for byte in 0..=255u8 {
            tokens.push(format!("<0x{byte:02X}>"));
            types.push(TOKEN_TYPE_BYTE);
            scores.push(0.0);
        }
        (tokens, types, scores)
    }

    #[test]
    fn merges_by_score_and_cuts_out_special_tokens() {
        let spm = vocab();
        // "ab" merges first (score −1.5), then "▁"+"ab" (−0.5); "abab" is a token
        // but needs "ab"+"ab" to meet.
        assert_eq!(spm.encode(" ab"), vec![7]);
        assert_eq!(spm.encode("abab"), vec![8]);
        assert_eq!(spm.encode("<s>ab\nb"), vec![1, 6, 2, 5]);
    }

    #[test]
    fn unknown_characters_fall_back_to_byte_tokens() {
        let spm = vocab();
        let é = "é".as_bytes();
        let ids = spm.encode("aé");
        assert_eq!(ids[0], 4);
        assert_eq!(&ids[1..], &[9 + é[0] as u32, 9 + é[1] as u32]);
        let bytes: Vec<u8> = ids[1..]
            .iter()
            .flat_map(|&id| Spm::token_bytes(&format!("<0x{:02X}>", id - 9), TOKEN_TYPE_BYTE))
            .collect();
        assert_eq!(bytes, é);
    }

    #[test]
    fn space_prefix_only_where_the_model_asks() {
        let tokens: Vec<String> = ["<unk>", "▁", "a", "▁a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let with = Spm::new(
            &tokens,
            vec![0.0, -1.0, -1.0, -0.5],
            &[2, 1, 1, 1],
            Some(0),
            true,
        );
        assert_eq!(with.encode("a"), vec![3]);
        let without = Spm::new(
            &tokens,
            vec![0.0, -1.0, -1.0, -0.5],
            &[2, 1, 1, 1],
            Some(0),
            false,
        );
        assert_eq!(without.encode("a"), vec![2]);
        assert_eq!(Spm::token_bytes("▁a", 1), b" a");
        assert!(Spm::token_bytes("<s>", TOKEN_TYPE_CONTROL).is_empty());
    }

    fn decode(spm_tokens: &[String], types: &[i32], ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| Spm::token_bytes(&spm_tokens[id as usize], types[id as usize]))
            .collect();
        String::from_utf8(bytes).expect("decoded bytes are UTF-8")
    }

    proptest::proptest! {
        /// Any text round-trips (byte fallback covers every character) and never panics.
        #[test]
        fn any_text_round_trips(text in "\\PC{0,40}") {
            let spm = vocab();
            let (tokens, types, _) = vocab_parts();
            proptest::prop_assume!(!text.contains("<s>") && !text.contains("<unk>"));
            let ids = spm.encode(&text);
            proptest::prop_assert_eq!(decode(&tokens, &types, &ids), text);
        }
    }
}
