//! One way to stream an answer in any dialect: the dispatcher's events reduced to what a
//! client sees (a token of a choice, a choice's end, a failure) and handed to the
//! dialect's [`Encoder`], which turns each into server-sent events. The OpenAI,
//! Anthropic and Responses streams differ only in their encoders.

use std::convert::Infallible;

use axum::response::sse::Event;
use futures::{Stream, StreamExt};
use sharemesh_protocol::{FinishReason, NanoUsd, NodeId, TokenLogprobs};

use crate::dispatch::{DispatchEvent, Segment};
use crate::route::RouteError;

/// A delivered token of one choice.
pub(crate) struct Token {
    pub text: String,
    pub id: u32,
    /// Its log-probabilities, when the request asked.
    pub logprobs: Option<TokenLogprobs>,
}

/// How a choice ended, and what it cost.
pub(crate) struct Finished {
    pub finish: FinishReason,
    pub completion_tokens: u32,
    pub providers: Vec<NodeId>,
    pub cost: NanoUsd,
    pub segments: Vec<Segment>,
}

/// A dialect's shape of a streamed answer.
pub(crate) trait Encoder: Send + 'static {
    /// What is sent before any token.
    fn opening(&mut self) -> Vec<Event>;
    /// What one delivered token of `choice` sends (nothing where it is held back).
    fn token(&mut self, choice: usize, token: Token) -> Vec<Event>;
    /// What `choice`'s end sends, and whether the whole answer is now done.
    fn finished(&mut self, choice: usize, finished: Finished) -> (Vec<Event>, bool);
    /// What a failure sends; the stream ends after it.
    fn failed(&mut self, error: RouteError) -> Vec<Event>;
    /// What is sent after the end, done or failed (OpenAI's `[DONE]`).
    fn closing(&mut self) -> Vec<Event> {
        Vec::new()
    }
}

/// The events of `choices` (each tagged with its index) as `encoder` shapes them: its
/// opening, then each token and end, until the answer is done, fails, or the dispatcher
/// stops; then its closing.
pub(crate) fn encode<S, E>(
    choices: S,
    mut encoder: E,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static
where
    S: Stream<Item = (usize, DispatchEvent)> + Send + Unpin + 'static,
    E: Encoder,
{
    let opening = encoder.opening();
    let body = futures::stream::unfold(
        (choices, encoder, false),
        |(mut choices, mut encoder, ended)| async move {
            if ended {
                return None;
            }
            loop {
                let Some((choice, event)) = choices.next().await else {
                    return Some((encoder.closing(), (choices, encoder, true)));
                };
                let (frames, ended) = match event {
                    DispatchEvent::Token {
                        text,
                        token_id,
                        logprobs,
                    } => {
                        let token = Token {
                            text,
                            id: token_id,
                            logprobs,
                        };
                        (encoder.token(choice, token), false)
                    }
                    DispatchEvent::Done {
                        finish,
                        completion_tokens,
                        providers,
                        cost,
                        segments,
                    } => {
                        let finished = Finished {
                            finish,
                            completion_tokens,
                            providers,
                            cost,
                            segments,
                        };
                        encoder.finished(choice, finished)
                    }
                    DispatchEvent::Failed(error) => (encoder.failed(error), true),
                    DispatchEvent::Accepted { .. } | DispatchEvent::Switched { .. } => continue,
                };
                let mut frames = frames;
                if ended {
                    frames.extend(encoder.closing());
                }
                if !frames.is_empty() || ended {
                    return Some((frames, (choices, encoder, ended)));
                }
            }
        },
    );
    futures::stream::iter(opening)
        .chain(body.flat_map(futures::stream::iter))
        .map(Ok)
}

/// A dispatcher's events as a stream, each tagged with its choice's index.
pub(crate) fn tagged(
    index: usize,
    events: tokio::sync::mpsc::Receiver<DispatchEvent>,
) -> impl Stream<Item = (usize, DispatchEvent)> + Send + Unpin + 'static {
    Box::pin(futures::stream::unfold(
        events,
        move |mut events| async move { events.recv().await.map(|event| ((index, event), events)) },
    ))
}
