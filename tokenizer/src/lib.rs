//! A model's vocabulary as a buyer and a provider both need it: read from the GGUF
//! header alone (a bounded reader, no weights, no inference engine), it turns a prompt
//! into the token ids the engine runs (chat prompts through the model's template) and
//! token ids back into the text a provider must send. The engine generates with it;
//! the gateway counts every prompt it pays for and checks every chunk's text with it.

pub mod chat;
pub mod gguf;
mod gguf_tokenizer;
pub mod pretokenize;
pub mod spm;
pub mod strftime;
pub mod text;

use std::io::Read;

use sharemesh_protocol::Prompt;

pub use chat::{ChatTemplate, Fallback};
pub use gguf::{read_header, GgufError, GgufHeader, MetaValue, Metadata, ModelHeader};
pub use gguf_tokenizer::GgufTokenizer;
pub use text::{Step, StreamDecoder, TextStream};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Header(#[from] GgufError),
    #[error("bad model: {0}")]
    BadModel(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// A model's tokenizer and chat template.
pub struct Vocabulary {
    pub tokenizer: GgufTokenizer,
    pub chat: ChatTemplate,
    /// The model's context length from its metadata (`<architecture>.context_length`),
    /// when the header names one.
    pub context_length: Option<u32>,
    /// What serving the model needs in memory at least (from a whole header: `read`).
    pub memory: Option<ModelMemory>,
}

/// A lower bound on the memory a model needs to be served: its weights as the tensor
/// table sizes them, and a KV cache of one byte per element (no engine stores less).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelMemory {
    pub weights_bytes: u64,
    /// K and V for every layer and KV head, per token of context.
    pub kv_bytes_per_token: u64,
}

impl ModelMemory {
    /// From a header: `<arch>.block_count`, `<arch>.attention.head_count_kv` (else
    /// `head_count`) and the head size (`<arch>.attention.key_length`, else
    /// `embedding_length / head_count`); no KV bound when any is missing.
    pub fn of(header: &gguf::GgufHeader) -> Self {
        let metadata = &header.metadata;
        let key = |name: &str| -> Option<u64> {
            let arch = metadata.get("general.architecture")?.to_string().ok()?;
            metadata.get(&format!("{arch}.{name}"))?.to_u64().ok()
        };
        let kv = (|| {
            let layers = key("block_count")?;
            let heads = key("attention.head_count")?;
            let kv_heads = key("attention.head_count_kv").unwrap_or(heads);
            let head_size = match key("attention.key_length") {
                Some(size) => size,
                None => key("embedding_length")?.checked_div(heads)?,
            };
            2u64.checked_mul(layers)?
                .checked_mul(kv_heads)?
                .checked_mul(head_size)
        })();
        Self {
            weights_bytes: header.tensor_data_bytes,
            kv_bytes_per_token: kv.unwrap_or(0),
        }
    }

    /// Bytes needed to serve a context of `tokens`, at least.
    pub fn needed_for(&self, tokens: u32) -> u64 {
        self.weights_bytes
            .saturating_add(self.kv_bytes_per_token.saturating_mul(u64::from(tokens)))
    }
}

impl Vocabulary {
    /// From a GGUF header's metadata.
    pub fn from_metadata(metadata: &Metadata) -> Result<Self, TokenizerError> {
        let tokenizer = GgufTokenizer::from_metadata(metadata)?;
        let token_text =
            |id: Option<u32>| id.map(|id| tokenizer.token_literal(id)).unwrap_or_default();
        let template_source = metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok())
            .cloned();
        let fallback = Fallback::for_vocabulary(tokenizer.has_control_token("<start_of_turn>"));
        let chat = ChatTemplate::new(
            template_source,
            fallback,
            token_text(tokenizer.bos_id),
            token_text(tokenizer.eos_id),
        )?;
        let context_length = metadata
            .get("general.architecture")
            .and_then(|a| a.to_string().ok())
            .and_then(|arch| metadata.get(&format!("{arch}.context_length")))
            .and_then(|v| v.to_u32().ok());
        Ok(Self {
            tokenizer,
            chat,
            context_length,
            memory: None,
        })
    }

    /// From the start of a GGUF file (or a header fetched from a provider).
    pub fn read<R: Read>(reader: R) -> Result<Self, TokenizerError> {
        let header = read_header(reader)?;
        Ok(Self {
            memory: Some(ModelMemory::of(&header)),
            ..Self::from_metadata(&header.metadata)?
        })
    }

    /// The token ids a prompt runs as (chat prompts through the model's template):
    /// what a provider's `Accept.prompt_tokens` must count.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = match prompt {
            Prompt::Text(text) => {
                let mut ids = Vec::new();
                if self.tokenizer.add_bos {
                    ids.extend(self.tokenizer.bos_id);
                }
                ids.extend(self.tokenizer.encode(text)?);
                ids
            }
            Prompt::Chat(messages) => {
                if messages.is_empty() {
                    return Err(TokenizerError::BadRequest("`messages` is empty".into()));
                }
                self.tokenizer.encode(&self.chat.render(messages)?)?
            }
            Prompt::Tokens(ids) => {
                let vocab = self.tokenizer.vocab_size() as u32;
                if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
                    return Err(TokenizerError::BadRequest(format!(
                        "prompt token id {bad} is outside the vocabulary (size {vocab})"
                    )));
                }
                ids.clone()
            }
        };
        if ids.is_empty() {
            match self.tokenizer.bos_id {
                Some(bos) => ids.push(bos),
                None => return Err(TokenizerError::BadRequest("the prompt is empty".into())),
            }
        }
        Ok(ids)
    }
}
