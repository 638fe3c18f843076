//! The read deadline: pingora's read timeout is per read, so a client sending
//! one byte every few seconds could hold a connection forever. [`Guarded`] wraps the
//! HTTP app and gives every connection a [`DeadlineStream`]: a request must be read
//! in full within `protection.request_read_ms` of its first byte (or of the accept,
//! for the first request); past that the pending read fails and the connection is
//! closed. A request ends, for this purpose, when the gateway writes to the socket.
//! Idle keep-alive time between requests is not counted (pingora's keep-alive timeout
//! covers it).
//!
//! HTTP/2 (h2c prior knowledge, or ALPN `h2` over TLS) multiplexes requests as frames of
//! one connection, so "a request is read when the gateway writes" does not hold there:
//! a client frame that needs no answer (a SETTINGS ack, a WINDOW_UPDATE) would start a
//! deadline no write ends, and the whole connection would be cut `request_read_ms` after
//! its last request. On an HTTP/2 connection the deadline covers the connection preface
//! and the client's first frames, up to the gateway's first write (its SETTINGS); after
//! that pingora's HTTP/2 idle timeout closes connections with no request in flight, and
//! the body of each request is read under `request_read_ms` by the proxy.
//!
//! With h2c on, pingora peeks the first 24 bytes for the HTTP/2 preface before parsing
//! HTTP/1.1; [`Guarded`] does that peek itself under the deadline, so a client that
//! sends fewer bytes and stops is cut too.

use crate::fast_lane::{self, Lane};
use crate::shared::Shared;
use async_trait::async_trait;
use bytes::BytesMut;
use pingora::apps::ServerApp;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID,
    UniqueIDType,
};
use pingora::protocols::{SocketDigest, TimingDigest, ALPN};
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
    /// HTTP/2: the first write ends the deadline for good.
    http2: bool,
    /// Set by the first write on an HTTP/2 connection: no deadline any more.
    disarmed: bool,
    /// Bytes the fast lane read and handed over: read (and peeked) before the socket.
    replay: BytesMut,
}

impl DeadlineStream {
    pub fn new(inner: Stream, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            started: Some(Instant::now()),
            timer: None,
            http2: false,
            disarmed: false,
            replay: BytesMut::new(),
        }
    }

    /// Puts `bytes` back in front of what the socket will give (the fast lane's hand-over).
    pub fn replay(&mut self, bytes: BytesMut) {
        self.replay = bytes;
    }

    /// This connection speaks HTTP/2: the deadline runs until the gateway's first write.
    pub fn set_http2(&mut self) {
        self.http2 = true;
    }

    fn wrote(&mut self) {
        self.started = None;
        if self.http2 {
            self.disarmed = true;
        }
    }
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn timed_out() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "request not read within protection.request_read_ms",
    )
}

impl AsyncRead for DeadlineStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if !this.replay.is_empty() && buf.remaining() > 0 {
            let n = this.replay.len().min(buf.remaining());
            buf.put_slice(&this.replay.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before && this.started.is_none() && !this.disarmed {
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
                    Poll::Ready(()) => Poll::Ready(Err(timed_out())),
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
        self.wrote();
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
        self.wrote();
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
    /// The peek (pingora's h2c preface check) reads from the socket too: under the deadline.
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        if !self.replay.is_empty() {
            // A request the fast lane parsed as HTTP/1.1: whatever the peek compares it
            // with, these are its first bytes.
            let n = self.replay.len().min(buf.len());
            buf[..n].copy_from_slice(&self.replay[..n]);
            buf[n..].fill(0);
            return Ok(true);
        }
        match self.started {
            Some(started) if !self.disarmed => {
                tokio::time::timeout_at(started + self.limit, self.inner.try_peek(buf))
                    .await
                    .unwrap_or_else(|_| Err(timed_out()))
            }
            _ => self.inner.try_peek(buf).await,
        }
    }
}

/// Wraps an app so that each connection gets a [`DeadlineStream`], and plain HTTP/1.1
/// connections go through the fast lane first.
pub struct Guarded<A> {
    inner: Arc<A>,
    /// `protection.request_read_ms`, reloadable.
    limit_ms: Arc<AtomicU64>,
    /// `server.h2c`: plain connections may open with the HTTP/2 preface.
    h2c: bool,
    /// `server.fast_lane`: what the fast lane reads and answers from.
    fast_lane: Option<Arc<Shared>>,
}

impl<A> Guarded<A> {
    pub fn new(
        inner: A,
        limit_ms: Arc<AtomicU64>,
        h2c: bool,
        fast_lane: Option<Arc<Shared>>,
    ) -> Self {
        Self {
            inner: Arc::new(inner),
            limit_ms,
            h2c,
            fast_lane,
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
        let mut stream = DeadlineStream::new(session, limit);
        let http2 = if stream.get_ssl_digest().is_some() {
            matches!(stream.selected_alpn_proto(), Some(ALPN::H2))
        } else if self.h2c {
            // The same peek pingora makes next (it reads the bytes back from the stream's
            // rewind buffer), here under the deadline.
            let mut preface = [0u8; H2_PREFACE.len()];
            match stream.try_peek(&mut preface).await {
                Ok(peeked) => peeked && preface == *H2_PREFACE,
                Err(e) => {
                    tracing::debug!(error = %e, "no request or HTTP/2 preface in time");
                    return None;
                }
            }
        } else {
            false
        };
        if http2 {
            stream.set_http2();
        } else if let (Some(shared), None) = (&self.fast_lane, stream.get_ssl_digest()) {
            let peer = stream
                .get_socket_digest()
                .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
            match fast_lane::serve(shared, &mut stream, peer, shutdown).await {
                Lane::Closed => return None,
                Lane::HandOver(bytes) => stream.replay(bytes),
            }
        }
        self.inner.process_new(Box::new(stream), shutdown).await
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

    #[tokio::test(start_paused = true)]
    async fn on_http2_the_deadline_ends_at_the_first_write() {
        // A preface that stops half way is cut like a slow request...
        let (mut client, server) = tokio::io::duplex(64);
        let mut s = DeadlineStream::new(Box::new(server), Duration::from_secs(2));
        s.set_http2();
        client.write_all(&H2_PREFACE[..10]).await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(s.read(&mut buf).await.unwrap(), 10);
        let err = s.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);

        // ...but once the server has written (its SETTINGS), a client frame that gets no
        // answer (a SETTINGS ack) does not start a deadline for the connection.
        let (mut client, server) = tokio::io::duplex(64);
        let mut s = DeadlineStream::new(Box::new(server), Duration::from_secs(2));
        s.set_http2();
        client.write_all(H2_PREFACE).await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), H2_PREFACE.len());
        s.write_all(b"settings").await.unwrap();
        client.write_all(b"ack").await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), 3);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            s.read(&mut buf).await
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        client.write_all(b"x").await.unwrap();
        assert_eq!(reader.await.unwrap().unwrap(), 1);
    }
}
