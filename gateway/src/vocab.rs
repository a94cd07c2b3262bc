//! The buyer's own counts: each served model's vocabulary, fetched once from a provider
//! (`/sharemesh/model-header/2`) and accepted only if the header and the tensor digest
//! beside it make the model's id (SPEC §1), so no provider can hand the buyer a
//! tokenizer that counts in its favour. With it the gateway counts every prompt it
//! pays for and checks every chunk's text against its token ids (`buyer`); without it
//! (a provider that sends no header, a scripted test engine) it falls back to the
//! prompt's token bound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{AsyncReadExt, AsyncWriteExt};
use libp2p::PeerId;
use sharemesh_mesh::{MeshHandle, MODEL_HEADER_PROTOCOL};
use sharemesh_protocol::model_header::MAX_HEADER_BYTES;
use sharemesh_protocol::{ModelId, Prompt};
use sharemesh_tokenizer::{TokenizerError, Vocabulary};

/// How long fetching one header may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// After a failed fetch, the model is not asked for again this soon.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// Vocabularies held at once (each up to a 64 MiB header's worth): the least recently
/// used goes first.
const HELD: usize = 16;
/// Providers asked per fetch, in the order of the request that started it.
const ASKED: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("could not reach {0}: {1}")]
    Unreachable(PeerId, String),
    #[error("{0} does not serve the model's header")]
    NotServed(PeerId),
    #[error("{peer} sent a {len}-byte header, over the {MAX_HEADER_BYTES}-byte limit")]
    TooLarge { peer: PeerId, len: u64 },
    #[error("{0} sent a header that is not the model's (its digest does not make the id)")]
    NotTheModel(PeerId),
    #[error("the model's header does not give a vocabulary: {0}")]
    Unusable(#[from] TokenizerError),
    #[error("asked recently and failed; not asking again yet")]
    Backoff,
    #[error("still fetching the model's header")]
    Pending,
}

/// A prompt as the buyer counts it.
#[derive(Clone)]
pub struct Counted {
    pub prompt_tokens: u32,
    pub vocabulary: Arc<Vocabulary>,
    /// The request's output format compiled for the vocabulary, at its start (when it
    /// has one): each segment follows its delivered tokens through a fresh copy.
    pub format: Option<Arc<std::sync::Mutex<sharemesh_constrain::Guide>>>,
}

/// Held vocabularies by model, each with its last use, and the logical clock.
type Held = (HashMap<ModelId, (Arc<Vocabulary>, u64)>, u64);

/// The vocabularies this gateway holds, by model.
#[derive(Default)]
pub struct Vocabularies {
    /// By model, with when each was last used (a logical clock): at most `HELD`.
    known: Mutex<Held>,
    failed: Mutex<HashMap<ModelId, Instant>>,
    /// Fetches under way, each a task of its own: a request waits for one at most
    /// `wait` (the gateway's `count_wait`), so a provider that sends its header slowly
    /// on purpose delays nobody by more than that (the request is then held to the
    /// token bound).
    in_flight: Mutex<HashMap<ModelId, tokio::sync::watch::Receiver<bool>>>,
    /// Format engines of held vocabularies, built on first use (forgotten with them).
    formats: Mutex<HashMap<ModelId, Arc<sharemesh_constrain::FormatEnv>>>,
    /// When a request last waited for a model's header in vain (to count a prompt a
    /// provider claimed above its bound): for `RETRY_AFTER` no request waits again, so a
    /// provider that holds its header back costs requests one wait, not one each.
    waited_in_vain: Mutex<HashMap<ModelId, Instant>>,
}

impl Vocabularies {
    /// The model's vocabulary, fetched from `providers` if need be, waiting at most
    /// `wait` — unless a wait for it came to nothing in the last `RETRY_AFTER`; a
    /// fruitless wait is remembered.
    pub async fn wait_once_for(
        self: &Arc<Self>,
        mesh: &MeshHandle,
        model: ModelId,
        providers: &[(PeerId, Vec<String>)],
        wait: Duration,
    ) -> Result<Arc<Vocabulary>, FetchError> {
        let waited_lately = within_retry(&self.waited_in_vain, &model);
        let wait = if waited_lately { Duration::ZERO } else { wait };
        let fetched = self.get_or_fetch(mesh, model, providers, wait).await;
        if fetched.is_err() && !waited_lately {
            if let Ok(mut waited) = self.waited_in_vain.lock() {
                waited.retain(|_, at| at.elapsed() < RETRY_AFTER);
                waited.insert(model, Instant::now());
            }
        }
        fetched
    }

    pub fn get(&self, model: &ModelId) -> Option<Arc<Vocabulary>> {
        let mut known = self.known.lock().ok()?;
        let (held, clock) = &mut *known;
        *clock += 1;
        let (vocabulary, used) = held.get_mut(model)?;
        *used = *clock;
        Some(vocabulary.clone())
    }

    /// The format engine of `model`'s held vocabulary (built once, then shared).
    pub fn formats(&self, model: &ModelId) -> Option<Arc<sharemesh_constrain::FormatEnv>> {
        let vocabulary = self.get(model)?;
        let mut formats = self.formats.lock().ok()?;
        if let Some(env) = formats.get(model) {
            return Some(env.clone());
        }
        match sharemesh_constrain::FormatEnv::new(&vocabulary.tokenizer) {
            Ok(env) => {
                let env = Arc::new(env);
                if formats.len() >= HELD {
                    formats.clear(); // Rebuilt on use: at most one per held vocabulary.
                }
                formats.insert(*model, env.clone());
                Some(env)
            }
            Err(err) => {
                tracing::warn!(%model, %err, "no format engine for this vocabulary");
                None
            }
        }
    }

    /// Holds `vocabulary` for `model`, forgetting the least recently used beyond `HELD`.
    fn hold(&self, model: ModelId, vocabulary: Vocabulary) {
        let Ok(mut known) = self.known.lock() else {
            return;
        };
        let (held, clock) = &mut *known;
        *clock += 1;
        if held.len() >= HELD && !held.contains_key(&model) {
            if let Some(oldest) = held
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(id, _)| *id)
            {
                held.remove(&oldest);
            }
        }
        held.insert(model, (Arc::new(vocabulary), *clock));
    }

    /// `model`'s vocabulary: held, or fetched (in a task of its own) from the first of
    /// `providers` that sends a header that is the model's, waited for at most `wait`.
    pub async fn get_or_fetch(
        self: &Arc<Self>,
        mesh: &MeshHandle,
        model: ModelId,
        providers: &[(PeerId, Vec<String>)],
        wait: Duration,
    ) -> Result<Arc<Vocabulary>, FetchError> {
        if let Some(known) = self.get(&model) {
            return Ok(known);
        }
        let recently_failed = within_retry(&self.failed, &model);
        if recently_failed {
            return Err(FetchError::Backoff);
        }
        let mut done = {
            let Ok(mut in_flight) = self.in_flight.lock() else {
                return Err(FetchError::Backoff);
            };
            match in_flight.get(&model) {
                Some(done) => done.clone(),
                None => {
                    let (finished, done) = tokio::sync::watch::channel(false);
                    in_flight.insert(model, done.clone());
                    let this = self.clone();
                    let (mesh, providers) = (mesh.clone(), providers.to_vec());
                    tokio::spawn(async move {
                        this.fetch_from(&mesh, model, &providers).await;
                        if let Ok(mut in_flight) = this.in_flight.lock() {
                            in_flight.remove(&model);
                        }
                        let _ = finished.send(true);
                    });
                    done
                }
            }
        };
        let _ = tokio::time::timeout(wait, done.wait_for(|finished| *finished)).await;
        self.get(&model).ok_or(FetchError::Pending)
    }

    async fn fetch_from(
        &self,
        mesh: &MeshHandle,
        model: ModelId,
        providers: &[(PeerId, Vec<String>)],
    ) {
        for (peer, addresses) in providers.iter().take(ASKED) {
            match fetch(mesh, *peer, addresses, model).await {
                Ok(vocabulary) => {
                    self.hold(model, vocabulary);
                    return;
                }
                Err(err) => {
                    tracing::info!(%model, %peer, %err, "no model header from this provider")
                }
            }
        }
        if let Ok(mut failed) = self.failed.lock() {
            failed.insert(model, Instant::now());
        }
    }
}

/// Whether `model` is marked in `marks` less than `RETRY_AFTER` ago.
fn within_retry(marks: &Mutex<HashMap<ModelId, Instant>>, model: &ModelId) -> bool {
    marks
        .lock()
        .ok()
        .and_then(|marks| marks.get(model).copied())
        .is_some_and(|at| at.elapsed() < RETRY_AFTER)
}

/// Counts `prompt` with `vocabulary` (the engine's own function).
pub fn count(vocabulary: &Arc<Vocabulary>, prompt: &Prompt) -> Result<Counted, TokenizerError> {
    let ids = vocabulary.prompt_tokens(prompt)?;
    Ok(Counted {
        prompt_tokens: u32::try_from(ids.len()).unwrap_or(u32::MAX),
        vocabulary: vocabulary.clone(),
        format: None,
    })
}

async fn fetch(
    mesh: &MeshHandle,
    peer: PeerId,
    addresses: &[String],
    model: ModelId,
) -> Result<Vocabulary, FetchError> {
    mesh.dial_advertised(&peer, addresses).await;
    let unreachable = |e: String| FetchError::Unreachable(peer, e);
    let read = async {
        let mut control = mesh.control.clone();
        let mut stream = control
            .open_stream(peer, MODEL_HEADER_PROTOCOL)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        stream
            .write_all(model.as_bytes())
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let mut head = [0u8; 40];
        stream
            .read_exact(&mut head)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let mut tensor_digest = [0u8; 32];
        tensor_digest.copy_from_slice(&head[..32]);
        let len = u64::from_be_bytes(head[32..].try_into().unwrap_or_default());
        if len == 0 {
            return Err(FetchError::NotServed(peer));
        }
        if len > MAX_HEADER_BYTES {
            return Err(FetchError::TooLarge { peer, len });
        }
        let mut header = Vec::new();
        (&mut stream)
            .take(len)
            .read_to_end(&mut header)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        if header.len() as u64 != len {
            return Err(unreachable("the header ended early".into()));
        }
        Ok((header, tensor_digest))
    };
    let (header, tensor_digest) = tokio::time::timeout(FETCH_TIMEOUT, read)
        .await
        .map_err(|_| unreachable(format!("no header within {FETCH_TIMEOUT:?}")))??;
    if !model.is_header_of(&header, &tensor_digest) {
        return Err(FetchError::NotTheModel(peer));
    }
    // Building a 262k-token vocabulary takes a while: off the async runtime.
    tokio::task::spawn_blocking(move || Vocabulary::read(header.as_slice()))
        .await
        .map_err(|e| FetchError::Unusable(TokenizerError::BadModel(e.to_string())))?
        .map_err(FetchError::from)
}
