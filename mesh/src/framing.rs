//! Length-prefixed frames on a libp2p stream: u32 big-endian length, then one encoded
//! `SignedEnvelope`. Frames over the limit are refused before reading the body.

use std::time::Duration;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use sharemesh_protocol::{SignedEnvelope, MAX_ENVELOPE_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("stream closed")]
    Closed,
    #[error("frame of {0} bytes exceeds the {MAX_ENVELOPE_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad frame: {0}")]
    Decode(#[from] sharemesh_protocol::DecodeError),
}

pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    envelope: &SignedEnvelope,
) -> Result<(), FrameError> {
    let bytes = envelope.to_bytes()?;
    let len = u32::try_from(bytes.len()).map_err(|_| FrameError::TooLarge(bytes.len()))?;
    let mut frame = Vec::with_capacity(4 + bytes.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&bytes);
    writer.write_all(&frame).await?;
    // Flushed per frame: a token must not wait in a buffer.
    writer.flush().await?;
    Ok(())
}

pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    timeout: Duration,
) -> Result<SignedEnvelope, FrameError> {
    let read = async {
        let mut len = [0u8; 4];
        match reader.read_exact(&mut len).await {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(FrameError::Closed)
            }
            Err(err) => return Err(err.into()),
        }
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_ENVELOPE_BYTES {
            return Err(FrameError::TooLarge(len));
        }
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body).await?;
        Ok(SignedEnvelope::from_bytes(&body)?)
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| FrameError::Timeout(timeout))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharemesh_protocol::{Keypair, Receipt};

    #[tokio::test]
    async fn frames_round_trip_and_oversized_frames_are_refused() {
        let key = Keypair::from_secret([3; 32]);
        let receipt = Receipt {
            job_id: sharemesh_protocol::JobId::from_bytes([1; 16]),
            provider: key.node_id(),
            buyer: key.node_id(),
            prompt_tokens: 1,
            completion_tokens: 1,
            price_per_token: sharemesh_protocol::NanoUsd(1),
            amount: sharemesh_protocol::NanoUsd(2),
        };
        let envelope = key.seal(&receipt, 1, 0, 1000).unwrap();
        let mut buf = Vec::new();
        write_frame(&mut buf, &envelope).await.unwrap();
        let mut cursor = futures::io::Cursor::new(buf);
        assert_eq!(
            read_frame(&mut cursor, Duration::from_secs(1))
                .await
                .unwrap(),
            envelope
        );
        assert!(matches!(
            read_frame(&mut cursor, Duration::from_secs(1)).await,
            Err(FrameError::Closed)
        ));
        let mut huge = futures::io::Cursor::new(u32::MAX.to_be_bytes().to_vec());
        assert!(matches!(
            read_frame(&mut huge, Duration::from_secs(1)).await,
            Err(FrameError::TooLarge(_))
        ));
    }
}
