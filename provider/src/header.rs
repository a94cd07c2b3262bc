//! The provider side of `/sharemesh/model-header/2`: a buyer asks for a model's GGUF
//! header (to count prompt tokens and check text itself) and gets it with the tensor
//! data's digest, which together prove it is the model's (SPEC §1, §8).

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncReadExt, AsyncWriteExt};
use libp2p::PeerId;
use sharemesh_mesh::MODEL_HEADER_PROTOCOL;
use sharemesh_protocol::ModelId;
use sharemesh_tokenizer::ModelHeader;

use super::Provider;
use crate::policy::Adversary;

/// The model id must arrive this soon after the stream opens.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// A buyer that cannot take a header in this long is cut off.
const SEND_TIMEOUT: Duration = Duration::from_secs(60);

impl Provider {
    /// Answers `/sharemesh/model-header/2` streams until the mesh stops.
    pub async fn serve_headers(self: Arc<Self>) -> anyhow::Result<()> {
        self.accept_streams(
            MODEL_HEADER_PROTOCOL,
            "model header",
            |provider, peer, stream| async move { provider.send_header(peer, stream).await },
        )
        .await
    }

    async fn send_header(&self, peer: PeerId, mut stream: libp2p::Stream) -> std::io::Result<()> {
        let mut id = [0u8; 32];
        tokio::time::timeout(ASK_TIMEOUT, stream.read_exact(&mut id))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let model = ModelId::from_bytes(id);
        let engine = self.engine.clone();
        // The first ask reads and hashes the model file: off the async runtime.
        let header = tokio::task::spawn_blocking(move || engine.model_header(&model))
            .await
            .ok()
            .flatten();
        let header = match self.policy.adversary {
            // Adversary: a convincing vocabulary that is not the model's.
            Some(Adversary::ForgeHeader) => Some(Arc::new(forged_header())),
            // Adversary: hold the asker as long as it waits.
            Some(Adversary::SlowHeader(seconds)) => {
                tokio::time::sleep(Duration::from_secs(seconds)).await;
                header
            }
            _ => header,
        };
        let mut answer = Vec::new();
        match &header {
            Some(header) => {
                tracing::debug!(%peer, %model, bytes = header.bytes.len(), "sending a model header");
                answer.extend_from_slice(&header.tensor_digest);
                answer.extend_from_slice(&(header.bytes.len() as u64).to_be_bytes());
            }
            None => {
                answer.extend_from_slice(&[0; 32]);
                answer.extend_from_slice(&0u64.to_be_bytes());
            }
        }
        let send = async {
            stream.write_all(&answer).await?;
            if let Some(header) = &header {
                stream.write_all(&header.bytes).await?;
            }
            stream.close().await
        };
        tokio::time::timeout(SEND_TIMEOUT, send)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
    }
}

/// `forge-header`: a well-formed GGUF header with a byte-level BPE vocabulary of its
/// own (every token a single letter, so it counts a prompt as one token per letter)
/// and a made-up tensor digest: it parses, but it does not make the model's id.
fn forged_header() -> ModelHeader {
    fn string(out: &mut Vec<u8>, text: &str) {
        out.extend((text.len() as u64).to_le_bytes());
        out.extend(text.as_bytes());
    }
    fn strings(out: &mut Vec<u8>, key: &str, items: &[&str]) {
        string(out, key);
        out.extend(9u32.to_le_bytes());
        out.extend(8u32.to_le_bytes());
        out.extend((items.len() as u64).to_le_bytes());
        for item in items {
            string(out, item);
        }
    }
    let letters: Vec<String> = ('a'..='z').chain(['Ġ']).map(String::from).collect();
    let letters: Vec<&str> = letters.iter().map(String::as_str).collect();
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(3u64.to_le_bytes());
    string(&mut bytes, "tokenizer.ggml.model");
    bytes.extend(8u32.to_le_bytes());
    string(&mut bytes, "gpt2");
    strings(&mut bytes, "tokenizer.ggml.tokens", &letters);
    strings(&mut bytes, "tokenizer.ggml.merges", &[]);
    ModelHeader {
        bytes,
        tensor_digest: [0x5a; 32],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forged_header_parses_but_is_not_the_model() {
        let forged = forged_header();
        let vocabulary = sharemesh_tokenizer::Vocabulary::read(forged.bytes.as_slice())
            .unwrap_or_else(|e| panic!("{e}"));
        let ids = vocabulary
            .prompt_tokens(&sharemesh_protocol::Prompt::Text("abc".into()))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ids.len(), 3);
        assert!(!ModelId::from_bytes([1; 32]).is_header_of(&forged.bytes, &forged.tensor_digest));
    }
}
