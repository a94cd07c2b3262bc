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

/// Reads frames from one stream, cancel-safely: the bytes of a frame read so far stay in
/// its buffer if a `next` is dropped part-way (a `select!` may drop a read), so the next
/// call continues the same frame.
pub struct FrameReader<R> {
    reader: R,
    buffer: Vec<u8>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(reader: R) -> Self {
        Self {
            reader,
            buffer: Vec::new(),
        }
    }

    /// The next frame, waiting at most `timeout` for it.
    pub async fn next(&mut self, timeout: Duration) -> Result<SignedEnvelope, FrameError> {
        tokio::time::timeout(timeout, self.next_frame())
            .await
            .map_err(|_| FrameError::Timeout(timeout))?
    }

    async fn next_frame(&mut self) -> Result<SignedEnvelope, FrameError> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(frame) = self.take_frame()? {
                return Ok(frame);
            }
            // A read either completes (its bytes are kept) or, dropped, consumes nothing.
            let read = self.reader.read(&mut chunk).await?;
            if read == 0 {
                return Err(FrameError::Closed);
            }
            self.buffer.extend_from_slice(&chunk[..read]);
        }
    }

    /// A whole frame off the front of the buffer, if one is there.
    fn take_frame(&mut self) -> Result<Option<SignedEnvelope>, FrameError> {
        let Some(prefix) = self.buffer.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len > MAX_ENVELOPE_BYTES {
            return Err(FrameError::TooLarge(len));
        }
        let Some(body) = self.buffer.get(4..4 + len) else {
            return Ok(None);
        };
        let frame = SignedEnvelope::from_bytes(body);
        self.buffer.drain(..4 + len);
        Ok(Some(frame?))
    }
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
            commitment: sharemesh_protocol::Digest::from_bytes([5; 32]),
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

    /// Yields its bytes a few at a time, as a network stream may.
    struct Trickle(Vec<u8>);

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut [u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.0.len()).min(3);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            std::task::Poll::Ready(Ok(n))
        }
    }

    #[tokio::test]
    async fn the_frame_reader_joins_partial_reads_and_keeps_what_follows() {
        let key = Keypair::from_secret([4; 32]);
        let receipt = Receipt::new(
            sharemesh_protocol::JobId::from_bytes([1; 16]),
            key.node_id(),
            key.node_id(),
            1,
            1,
            sharemesh_protocol::NanoUsd(1),
            sharemesh_protocol::Digest::from_bytes([5; 32]),
        )
        .unwrap();
        let (a, b) = (
            key.seal(&receipt, 1, 0, 1000).unwrap(),
            key.seal(&receipt, 2, 0, 1000).unwrap(),
        );
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &a).await.unwrap();
        write_frame(&mut bytes, &b).await.unwrap();
        let mut reader = FrameReader::new(Trickle(bytes));
        let limit = Duration::from_secs(1);
        assert_eq!(reader.next(limit).await.unwrap(), a);
        assert_eq!(reader.next(limit).await.unwrap(), b);
        assert!(matches!(reader.next(limit).await, Err(FrameError::Closed)));
        let mut huge = FrameReader::new(Trickle(u32::MAX.to_be_bytes().to_vec()));
        assert!(matches!(
            huge.next(limit).await,
            Err(FrameError::TooLarge(_))
        ));
    }
}
