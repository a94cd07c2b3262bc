//! The provider side of `/sharemesh/model-header/2`: a buyer asks for a model's GGUF
//! header (to count prompt tokens and check text itself) and gets it with the tensor
//! data's digest, which together prove it is the model's (SPEC §1, §8).

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncReadExt, AsyncWriteExt};
use libp2p::PeerId;
use sharemesh_mesh::MODEL_HEADER_PROTOCOL;
use sharemesh_protocol::ModelId;

use super::Provider;

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
        let header = crate::adversary::tamper_header(self.policy.adversary(), header).await;
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
