//! The buyer's own check of an output format: it follows every delivered token through
//! the request's format with its copy of the vocabulary, so a provider that ignores the
//! format (garbage, or a cheaper unconstrained run) is caught at its first wrong token
//! and failed over, not paid, and a provider that ends a format early (end of text
//! where the format is not complete) likewise.

use sharemesh_constrain::Guide;
use sharemesh_protocol::{FinishReason, JobRequest, TokenChunk};

use crate::vocab::Counted;

pub(crate) struct FormatCheck {
    guide: Guide,
}

impl FormatCheck {
    /// The check for `request`'s format, past its resumed tokens (`None`: free text, or
    /// no format engine for the vocabulary).
    pub(crate) fn start(request: &JobRequest, counted: Option<&Counted>) -> Option<Self> {
        let mut guide = counted?.format.as_ref()?.lock().ok()?.fresh();
        for &token in &request.resume {
            // The buyer's own delivered prefix: it passed this check when it arrived.
            guide.consume(token).ok()?;
        }
        Some(Self { guide })
    }

    /// Follows a chunk's tokens; a chunk that ends the text (`Stop`) must leave the
    /// format complete, unless a stop sequence cut it (`stopped`).
    pub(crate) fn follow(&mut self, chunk: &TokenChunk, stopped: bool) -> Result<(), String> {
        for &token in &chunk.token_ids {
            self.guide
                .consume(token)
                .map_err(|_| format!("token {token} breaks the response format"))?;
        }
        if chunk.finish == Some(FinishReason::Stop) && !stopped && !self.guide.is_complete() {
            return Err("the text ended before its response format was complete".into());
        }
        Ok(())
    }
}
