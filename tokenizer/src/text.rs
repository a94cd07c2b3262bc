//! Tokens to text: UTF-8 assembled across tokens, and stop sequences cut and held
//! back. Both are pure functions of the token bytes, so a provider resuming a job, and
//! a buyer checking what a provider sent, produce exactly the same text.

/// Turns a token stream into valid UTF-8 text deltas, holding back bytes of a
/// character that spans tokens until it is complete.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(text) => {
                    out.push_str(text);
                    self.pending.clear();
                    return out;
                }
                Err(err) => {
                    let valid = err.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match err.error_len() {
                        // Incomplete character at the end: wait for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(len) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + len);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is still held at the end of the stream.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

/// Text emitted so far and the stop-sequence hold-back. Deterministic in the token
/// text alone, so a provider resuming a job emits exactly what the first would have.
pub struct TextStream {
    stops: Vec<String>,
    decoder: StreamDecoder,
    text: String,
    emitted: usize,
}

pub enum Step {
    Delta(String),
    Stopped(String),
}

impl TextStream {
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.to_vec(),
            decoder: StreamDecoder::default(),
            text: String::new(),
            emitted: 0,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) -> Step {
        let piece = self.decoder.push(bytes);
        self.text.push_str(&piece);
        // A stop sequence may straddle earlier text: search from where it could start.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut search_from = self.emitted.saturating_sub(longest);
        while !self.text.is_char_boundary(search_from) {
            search_from -= 1;
        }
        let found = self
            .stops
            .iter()
            .filter_map(|s| {
                self.text[search_from..]
                    .find(s.as_str())
                    .map(|at| search_from + at)
            })
            .min();
        if let Some(at) = found {
            let at = at.max(self.emitted);
            let delta = self.text[self.emitted..at].to_owned();
            self.emitted = at;
            return Step::Stopped(delta);
        }
        let mut boundary = self.text.len() - self.held_back();
        while !self.text.is_char_boundary(boundary) {
            boundary -= 1;
        }
        let boundary = boundary.max(self.emitted);
        let delta = self.text[self.emitted..boundary].to_owned();
        self.emitted = boundary;
        Step::Delta(delta)
    }

    /// Length of the longest suffix of the text that is a proper prefix of a stop sequence.
    fn held_back(&self) -> usize {
        let mut held = 0;
        for stop in &self.stops {
            for len in (1..stop.len()).rev() {
                if len <= held {
                    break;
                }
                if stop.is_char_boundary(len) && self.text.ends_with(&stop[..len]) {
                    held = len;
                    break;
                }
            }
        }
        held
    }

    pub fn finish(&mut self) -> String {
        let tail = self.decoder.finish();
        self.text.push_str(&tail);
        let delta = self.text[self.emitted..].to_owned();
        self.emitted = self.text.len();
        delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_decoder_holds_split_characters() {
        let mut d = StreamDecoder::default();
        let rocket = "🚀".as_bytes();
        assert_eq!(d.push(&rocket[..1]), "");
        assert_eq!(d.push(&rocket[1..3]), "");
        assert_eq!(d.push(&rocket[3..]), "🚀");
        assert_eq!(d.push(b"ok"), "ok");
        assert_eq!(d.push(&[0xff, b'a']), "\u{fffd}a");
        assert_eq!(d.push(&[0xe2]), "");
        assert_eq!(d.finish(), "\u{fffd}");
    }

    fn feed(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut stream = TextStream::new(&stops);
        let mut out = Vec::new();
        for piece in pieces {
            match stream.push(piece.as_bytes()) {
                Step::Delta(d) => out.push(d),
                Step::Stopped(d) => {
                    out.push(d);
                    return (out, true);
                }
            }
        }
        out.push(stream.finish());
        (out, false)
    }

    #[test]
    fn text_without_stops_streams_through() {
        assert_eq!(feed(&[], &["Hel", "lo"]).0, vec!["Hel", "lo", ""]);
    }

    #[test]
    fn a_stop_sequence_across_tokens_is_cut_and_never_shown() {
        let (out, stopped) = feed(&["\n\n"], &["Paris.", "\n", "\nThe"]);
        assert!(stopped);
        assert_eq!(out.concat(), "Paris.");
        assert_eq!(out, vec!["Paris.", "", ""]);
    }

    #[test]
    fn a_false_start_is_released() {
        let (out, stopped) = feed(&["END"], &["the E", "ND", "x"]);
        assert!(stopped);
        assert_eq!(out.concat(), "the ");
        let (out, stopped) = feed(&["END"], &["the E", "ast"]);
        assert!(!stopped);
        assert_eq!(out, vec!["the ", "East", ""]);
    }
}
