//! Step 8, the read deadline: pingora's read timeout is per read, so a client sending
//! one byte every few seconds could hold a connection forever. [`Guarded`] wraps the
//! HTTP app and gives every connection a [`DeadlineStream`]: a request must be read
//! in full within `protection.request_read_ms` of its first byte (or of the accept,
//! for the first request); past that the pending read fails and the connection is
//! closed. A request ends, for this purpose, when the gateway writes to the socket.
//! Idle keep-alive time between requests is not counted (pingora's keep-alive timeout
//! covers it).

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID,
    UniqueIDType,
};
use pingora::protocols::{SocketDigest, TimingDigest};
use pingora::server::ShutdownWatch;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A stream whose reads must finish within a deadline per request.
#[derive(Debug)]
pub struct DeadlineStream {
    inner: Stream,
    limit: Duration,
    /// When the current request's reading started; `None` between requests.
    started: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
}

impl DeadlineStream {
    pub fn new(inner: Stream, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            started: Some(Instant::now()),
            timer: None,
        }
    }
}

impl AsyncRead for DeadlineStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before && this.started.is_none() {
                    this.started = Some(Instant::now());
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let Some(started) = this.started else {
                    return Poll::Pending;
                };
                let deadline = started + this.limit;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "request not read within protection.request_read_ms",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

use std::future::Future;

impl AsyncWrite for DeadlineStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.started = None;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.started = None;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for DeadlineStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for DeadlineStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for DeadlineStream {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }
    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }
    fn selected_alpn_proto(&self) -> Option<pingora::protocols::ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for DeadlineStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }
    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for DeadlineStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for DeadlineStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
    fn set_socket_digest(&mut self, d: SocketDigest) {
        self.inner.set_socket_digest(d)
    }
}

#[async_trait]
impl Peek for DeadlineStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

/// Wraps an app so that each connection gets a [`DeadlineStream`].
pub struct Guarded<A> {
    inner: Arc<A>,
    /// `protection.request_read_ms`, reloadable.
    limit_ms: Arc<AtomicU64>,
}

impl<A> Guarded<A> {
    pub fn new(inner: A, limit_ms: Arc<AtomicU64>) -> Self {
        Self {
            inner: Arc::new(inner),
            limit_ms,
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Guarded<A> {
    async fn process_new(
        self: &Arc<Self>,
        session: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let limit = Duration::from_millis(self.limit_ms.load(Ordering::Relaxed));
        let wrapped: Stream = Box::new(DeadlineStream::new(session, limit));
        self.inner.process_new(wrapped, shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_slow_request_fails_at_the_deadline_and_idle_keepalive_does_not() {
        let (client, server) = tokio::io::duplex(64);
        let mut s = DeadlineStream::new(Box::new(server), Duration::from_secs(2));
        let mut client = client;
        let mut buf = [0u8; 8];
        client.write_all(b"G").await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), 1);
        // Nothing more arrives: the read fails at 2 s after the accept.
        let err = s.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);

        // After an answer, waiting for the next request is not counted...
        s.write_all(b"ok").await.unwrap();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let n = s.read(&mut buf).await;
            (s, n.map(|_| ()))
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        client.write_all(b"x").await.unwrap();
        let (mut s, r) = reader.await.unwrap();
        assert!(r.is_ok());
        // ...but the next request's own deadline runs from its first byte.
        let err = s.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    }
}
