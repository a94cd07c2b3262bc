//! Reading an OpenAI-style server-sent-event stream (`data: {json}` events, ended by
//! `data: [DONE]`) from a gateway: used by `sharemesh chat`, the demo and scenarios.

use std::collections::VecDeque;
use std::pin::Pin;

use anyhow::{Context, Result};
use futures::{Stream, StreamExt};

type Body = Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

pub struct SseChunks {
    body: Body,
    buffer: String,
    ready: VecDeque<String>,
    done: bool,
}

impl SseChunks {
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            body: Box::pin(response.bytes_stream()),
            buffer: String::new(),
            ready: VecDeque::new(),
            done: false,
        }
    }

    /// The next chunk, `None` after `[DONE]` or the end of the body.
    pub async fn next(&mut self) -> Option<Result<serde_json::Value>> {
        loop {
            if let Some(data) = self.ready.pop_front() {
                if data == "[DONE]" {
                    self.done = true;
                    return None;
                }
                return Some(serde_json::from_str(&data).context("a malformed stream chunk"));
            }
            if self.done {
                return None;
            }
            match self.body.next().await {
                Some(Ok(bytes)) => {
                    self.buffer.push_str(&String::from_utf8_lossy(&bytes));
                    while let Some(end) = self.buffer.find("\n\n") {
                        let event: String = self.buffer.drain(..end + 2).collect();
                        if let Some(data) = event.trim_end().strip_prefix("data: ") {
                            self.ready.push_back(data.to_owned());
                        }
                    }
                }
                Some(Err(err)) => return Some(Err(err).context("the stream broke")),
                None => {
                    self.done = true;
                    return None;
                }
            }
        }
    }
}
