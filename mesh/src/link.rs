//! Emulated links for in-process meshes: latency, jitter and loss on libp2p's memory
//! transport (the kernel here has no `tc netem`), with byte counters.
//!
//! A dialled connection is wrapped: every chunk written or read is held until
//! `now + latency ± jitter`, never overtaking an earlier chunk (a link is FIFO). Loss
//! on a reliable stream shows up as retransmission delay, so a "lost" chunk arrives one
//! retransmission timeout late instead of never. Draws come from a per-connection RNG
//! seeded from the profile's seed and the connection's sequence number, so a run is
//! repeatable as far as the runtime's scheduling allows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::compat::{Compat, TokioAsyncReadCompatExt};

/// One-way delay model of a link.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkProfile {
    pub latency: Duration,
    pub jitter: Duration,
    /// Probability that a chunk is "lost" and retransmitted.
    pub loss: f64,
    /// Delay a lost chunk suffers.
    pub retransmit_after: Duration,
    pub seed: u64,
}

impl LinkProfile {
    pub fn is_ideal(&self) -> bool {
        self.latency.is_zero() && self.jitter.is_zero() && self.loss <= 0.0
    }
}

/// Chooses the profile of a connection from the dialling node and the dialled address.
pub type LinkModel = Arc<dyn Fn(&libp2p::Multiaddr) -> LinkProfile + Send + Sync>;

/// Bytes through every wrapped connection of one node.
#[derive(Debug, Default)]
pub struct LinkCounters {
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    connections: AtomicU64,
}

impl LinkCounters {
    pub fn sent(&self) -> u64 {
        self.bytes_sent.load(Ordering::Relaxed)
    }

    pub fn received(&self) -> u64 {
        self.bytes_received.load(Ordering::Relaxed)
    }
}

const PIPE_BYTES: usize = 64 * 1024;
const CHUNK_BYTES: usize = 8 * 1024;

/// A connection whose link is ideal: bytes are only counted, with no tasks or copies
/// (the accepting side of every connection, whose delays the dialling side applies).
pub struct Counted<T> {
    inner: T,
    counters: Arc<LinkCounters>,
}

impl<T> Counted<T> {
    pub fn new(inner: T, counters: Arc<LinkCounters>) -> Self {
        Self { inner, counters }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &poll {
            self.counters
                .bytes_received
                .fetch_add(*n as u64, Ordering::Relaxed);
        }
        poll
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &poll {
            self.counters
                .bytes_sent
                .fetch_add(*n as u64, Ordering::Relaxed);
        }
        poll
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_close(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_close(cx)
    }
}

/// A wrapped connection: emulated ([`wrap`]) or only counted ([`Counted`]).
pub type Link<T> = futures::future::Either<Compat<tokio::io::DuplexStream>, Counted<T>>;

/// Wraps `inner` with `profile`, or only counts its bytes when the profile is ideal.
pub fn link<T>(inner: T, profile: LinkProfile, counters: Arc<LinkCounters>) -> Link<T>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    if profile.is_ideal() {
        futures::future::Either::Right(Counted::new(inner, counters))
    } else {
        futures::future::Either::Left(wrap(inner, profile, counters))
    }
}

/// Wraps a raw connection: the returned stream is what libp2p's upgrades see.
pub fn wrap<T>(
    inner: T,
    profile: LinkProfile,
    counters: Arc<LinkCounters>,
) -> Compat<tokio::io::DuplexStream>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let sequence = counters.connections.fetch_add(1, Ordering::Relaxed);
    let (app, pump) = tokio::io::duplex(PIPE_BYTES);
    let (pump_read, pump_write) = tokio::io::split(pump);
    let (inner_read, inner_write) = inner.split();
    let seed = profile.seed ^ sequence.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // Outgoing: what the node writes travels to the remote after the delay.
    spawn_direction(
        pump_read.compat(),
        inner_write,
        profile,
        seed,
        counters.clone(),
        true,
    );
    // Incoming: what the remote sends reaches the node after the delay.
    spawn_direction(
        inner_read,
        tokio_util::compat::TokioAsyncWriteCompatExt::compat_write(pump_write),
        profile,
        seed ^ 1,
        counters,
        false,
    );
    app.compat()
}

fn spawn_direction<R, W>(
    mut source: R,
    mut sink: W,
    profile: LinkProfile,
    seed: u64,
    counters: Arc<LinkCounters>,
    outgoing: bool,
) where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut last = Instant::now();
        let mut buffer = vec![0u8; CHUNK_BYTES];
        loop {
            let n = match source.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let counter = if outgoing {
                &counters.bytes_sent
            } else {
                &counters.bytes_received
            };
            counter.fetch_add(n as u64, Ordering::Relaxed);
            let mut delay = profile.latency;
            if !profile.jitter.is_zero() {
                let jitter = profile.jitter.as_secs_f64();
                let offset = rng.random_range(-jitter..=jitter);
                delay = Duration::from_secs_f64((delay.as_secs_f64() + offset).max(0.0));
            }
            if profile.loss > 0.0 && rng.random::<f64>() < profile.loss {
                delay += profile.retransmit_after;
            }
            // FIFO: a chunk never overtakes the one before it.
            last = last.max(Instant::now() + delay);
            if chunks.send((last, buffer[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if sink.write_all(&chunk).await.is_err() || sink.flush().await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_arrive_in_order_after_the_latency_and_are_counted() {
        let (a, b) = tokio::io::duplex(1024);
        let counters = Arc::new(LinkCounters::default());
        let profile = LinkProfile {
            latency: Duration::from_millis(80),
            jitter: Duration::from_millis(20),
            seed: 7,
            ..LinkProfile::default()
        };
        let mut wrapped = wrap(a.compat(), profile, counters.clone());
        let mut remote = b.compat();
        let started = Instant::now();
        for i in 0..20u8 {
            wrapped.write_all(&[i; 10]).await.unwrap_or_default();
        }
        wrapped.flush().await.unwrap_or_default();
        let mut got = vec![0u8; 200];
        remote.read_exact(&mut got).await.unwrap_or_default();
        let elapsed = started.elapsed();
        let expected: Vec<u8> = (0..20u8).flat_map(|i| [i; 10]).collect();
        assert_eq!(got, expected);
        assert!(elapsed >= Duration::from_millis(60), "{elapsed:?}");
        assert_eq!(counters.sent(), 200);
        // And back.
        remote.write_all(b"pong").await.unwrap_or_default();
        let mut pong = [0u8; 4];
        wrapped.read_exact(&mut pong).await.unwrap_or_default();
        assert_eq!(&pong, b"pong");
        assert_eq!(counters.received(), 4);
    }

    #[tokio::test]
    async fn loss_delays_by_the_retransmission_timeout() {
        let (a, b) = tokio::io::duplex(1024);
        let profile = LinkProfile {
            loss: 1.0,
            retransmit_after: Duration::from_millis(150),
            ..LinkProfile::default()
        };
        let mut wrapped = wrap(a.compat(), profile, Arc::new(LinkCounters::default()));
        let mut remote = b.compat();
        let started = Instant::now();
        wrapped.write_all(b"x").await.unwrap_or_default();
        let mut got = [0u8; 1];
        remote.read_exact(&mut got).await.unwrap_or_default();
        assert!(started.elapsed() >= Duration::from_millis(140));
    }
}
