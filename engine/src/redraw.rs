//! What a verifier redraws: each delivered step's token as the request's seeded sampler
//! picks it from the replayed logits, after the tokens delivered before it. Generation
//! and replay share the sampler, so on a profile that replays exactly an honest
//! provider's tokens are these draws bit for bit; a provider that chose its own (never
//! ending, steering the text, taking a cheaper model's tokens and fingerprinting them
//! afterwards) differs at its first chosen token.

use sharemesh_protocol::Sampling;

use crate::{sampler, EngineError, LoadedModel};

/// The sampler's state along a delivered transcript.
pub(crate) struct Redraw {
    sampling: Sampling,
    guide: Option<sharemesh_constrain::Guide>,
    /// Prompt, then the delivered tokens so far.
    history: Vec<u32>,
    prompt_len: usize,
}

impl Redraw {
    /// Starts after `prompt` and the delivered tokens before the first redrawn step
    /// (`before`: a resumed prefix the format guide and penalties have seen).
    pub(crate) fn new(
        model: &LoadedModel,
        prompt: &[u32],
        sampling: &Sampling,
        before: &[u32],
    ) -> Result<Self, EngineError> {
        let mut redraw = Self {
            sampling: sampling.clone(),
            guide: model.format_guide(&sampling.format)?,
            history: prompt.to_vec(),
            prompt_len: prompt.len(),
        };
        for &token in before {
            redraw.deliver(token);
        }
        Ok(redraw)
    }

    /// The token the sampler draws from `logits` (the raw logits after the history so
    /// far) and how far that draw lies from `delivered` (`sampler::redraw`), then
    /// `delivered` joins the history whatever was drawn.
    pub(crate) fn step(
        &mut self,
        logits: &[f32],
        delivered: u32,
    ) -> Result<(u32, f32), EngineError> {
        let mut logits = logits.to_vec();
        if let Some(guide) = self.guide.as_mut() {
            guide
                .mask(&mut logits)
                .map_err(|e| EngineError::Inference(format!("response format: {e}")))?;
        }
        let completion = self.history.len() - self.prompt_len;
        let drawn = sampler::redraw(
            &mut logits,
            &self.history,
            completion,
            &self.sampling,
            completion as u64,
            delivered,
        );
        self.deliver(delivered);
        Ok(drawn)
    }

    fn deliver(&mut self, token: u32) {
        // A token the format refuses already differs from every draw (the mask never
        // offers it); the rest of the transcript is redrawn without the format.
        if self
            .guide
            .as_mut()
            .is_some_and(|g| g.consume(token).is_err())
        {
            self.guide = None;
        }
        self.history.push(token);
    }
}
