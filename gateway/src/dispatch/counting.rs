//! Counting a request's prompt with the model's own vocabulary (fetched from a
//! provider's header), and decoding tokens with it.

use super::*;
use std::sync::Arc;

/// How long counting a prompt waits for the model's header.
#[derive(Clone, Copy, Debug)]
pub(super) enum HeaderWait {
    /// At most this long.
    UpTo(std::time::Duration),
    /// At most this long, unless a wait like it for the model came to nothing lately
    /// (a recount after an over-bound claim: a provider holding its header back costs
    /// requests one wait, not one each).
    OnceLately(std::time::Duration),
}

impl Dispatcher {
    /// Counts the prompt with the model's vocabulary (fetched from the candidates the
    /// first time, checked against the model id), and refuses a prompt that does not
    /// fit the model's context before any provider work. `None` when no candidate sends
    /// the header: the buyer then holds Accepts to the prompt's token bound.
    /// The model's vocabulary: held, or fetched from one of `sources` (waiting at most
    /// `wait`).
    pub(super) async fn vocabulary(
        &self,
        model: ModelId,
        sources: &[&BookEntry],
        wait: HeaderWait,
    ) -> Result<Arc<sharemesh_tokenizer::Vocabulary>, crate::vocab::FetchError> {
        if let Some(vocabulary) = self.vocabularies.get(&model) {
            return Ok(vocabulary);
        }
        // Only the first requests of a model need the providers' addresses.
        let remote: Vec<(libp2p::PeerId, Vec<String>)> = sources
            .iter()
            .filter(|e| e.advert.provider != self.node_id())
            .filter_map(|e| {
                Some((
                    e.advert.provider.peer_id().ok()?,
                    e.advert.addresses.clone(),
                ))
            })
            .collect();
        match wait {
            HeaderWait::UpTo(wait) => {
                self.vocabularies
                    .get_or_fetch(&self.mesh, model, &remote, wait)
                    .await
            }
            HeaderWait::OnceLately(wait) => {
                self.vocabularies
                    .wait_once_for(&self.mesh, model, &remote, wait)
                    .await
            }
        }
    }

    /// How many tokens `prompt` runs as on the model `name` names (Anthropic's
    /// `count_tokens`), with the model's own vocabulary.
    pub async fn count_tokens(
        &self,
        name: &str,
        prompt: &sharemesh_protocol::Prompt,
    ) -> Result<u32, RouteError> {
        let live = self.live();
        let model = plan::resolve_model(&live, name)?;
        let sources: Vec<&BookEntry> = live
            .iter()
            .filter(|e| e.advert.offer(&model).is_some())
            .map(|e| e.as_ref())
            .collect();
        let wait = self
            .defaults
            .count_wait
            .max(std::time::Duration::from_secs(10));
        let wait = HeaderWait::UpTo(wait);
        let vocabulary = self.vocabulary(model, &sources, wait).await.map_err(|e| {
            RouteError::NoProvider(format!("cannot count tokens for `{name}`: {e}"))
        })?;
        vocab::count(&vocabulary, prompt)
            .map(|c| c.prompt_tokens)
            .map_err(|e| RouteError::invalid("messages", e.to_string()))
    }

    /// `ids` decoded with the vocabulary of the model `name` names, if this node holds
    /// it.
    /// The vocabulary of model `name`, if held (to spell tokens for log-probabilities).
    pub fn vocabulary_of(&self, name: &str) -> Option<Arc<sharemesh_tokenizer::Vocabulary>> {
        let model = self.resolve_model(name).ok()?;
        self.vocabularies.get(&model)
    }

    pub fn decode(&self, name: &str, ids: &[u32]) -> Option<String> {
        let model = self.resolve_model(name).ok()?;
        let vocabulary = self.vocabularies.get(&model)?;
        Some(vocabulary.tokenizer.decode(ids))
    }

    pub(super) async fn count_prompt(
        &self,
        model: ModelId,
        request: &RouteRequest,
        candidates: &[Candidate],
        wait: HeaderWait,
    ) -> Result<Option<Counted>, RouteError> {
        let sources: Vec<&BookEntry> = candidates.iter().map(|c| c.entry.as_ref()).collect();
        let vocabulary = self.vocabulary(model, &sources, wait).await;
        let vocabulary = match vocabulary {
            Ok(vocabulary) => vocabulary,
            Err(err) => {
                tracing::debug!(%model, %err, "counting with the prompt's token bound");
                return Ok(None);
            }
        };
        let param = match request.prompt {
            sharemesh_protocol::Prompt::Chat(_) => "messages",
            _ => "prompt",
        };
        let mut counted = vocab::count(&vocabulary, &request.prompt)
            .map_err(|e| RouteError::invalid(param, e.to_string()))?;
        if !request.sampling.format.is_free() {
            let (vocabularies, format) =
                (self.vocabularies.clone(), request.sampling.format.clone());
            // The token trie (once per model) and the format (once per request) take a
            // moment to build: off the runtime.
            let compiled = tokio::task::spawn_blocking(move || {
                vocabularies.formats(&model).map(|env| env.guide(&format))
            })
            .await
            .ok()
            .flatten();
            match compiled {
                // A format the vocabulary cannot follow is refused before any provider works.
                Some(Err(err)) => {
                    return Err(RouteError::invalid("response_format", err.to_string()))
                }
                Some(Ok(guide)) => {
                    counted.format = guide.map(|g| Arc::new(std::sync::Mutex::new(g)))
                }
                None => {}
            }
        }
        // From the verified header, not from adverts: a provider advertising a tiny
        // context must not make the gateway refuse every request for the model.
        let context = vocabulary.context_length.unwrap_or(u32::MAX);
        if counted.prompt_tokens >= context {
            return Err(RouteError::invalid(
                param,
                format!(
                    "the prompt is {} tokens, but the model's context is {context}",
                    counted.prompt_tokens
                ),
            ));
        }
        Ok(Some(counted))
    }
}
