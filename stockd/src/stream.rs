//! `StockService.ReserveStream`: the edge's reservations on one long-lived stream.
//!
//! Why: with `ReserveBatch` every batch opened an HTTP/2 stream (a HEADERS frame and its
//! HPACK work each way, trailers, three writes from the edge and two back, each waking
//! the other process) and waited for its slowest shard's Redis call before any of its
//! buyers got an answer. On a stream a message is one DATA frame each way, and an
//! entry is answered when its own shard's call is done.
//!
//! How: [`Answers`] is the response stream. Each poll reads every message that has
//! arrived, starts each entry as a `Reserve` of its own (they meet in the shards' group
//! commit like concurrent unary calls), bounded by the entry's `timeout_ms` as a
//! `Reserve` is by its `grpc-timeout`, and writes the results ready at that moment as
//! one message (at most [`MAX_RESULTS`]), tagged with the entries' tags.
//!
//! Shutdown: from the daemon's shutdown on, every entry that arrives is answered
//! UNAVAILABLE at once (the edge sends it to another stockd at once, instead of waiting
//! for this one's drain); the entries already started finish; then the stream ends with
//! OK. An entry the edge sent that was never read is never answered, and the edge sends
//! it to another stockd with the same request id. The edge ending its side ends the
//! stream the same way, once what was read is answered.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use seckill_proto::pb;
use tonic::{Status, Streaming};

use crate::app::App;
use crate::service::{reserve_entry, result, MAX_BATCH};

/// Entries of one stream being decided at once; past it the stream stops reading (the
/// edge's messages then wait in HTTP/2 flow control and its own queue) until some are
/// answered.
const MAX_RUNNING: usize = 65_536;

/// Most results in one answer message (the rest go in the next one, at once): a
/// message stays far below the 4 MiB gRPC decoding limit whatever piled up.
pub const MAX_RESULTS: usize = 1024;

/// The response side of one `ReserveStream` call.
pub struct Answers {
    app: Arc<App>,
    /// `None` once the edge ended its side or the stream failed: nothing more is read.
    inbound: Option<Streaming<pb::ReserveBatchRequest>>,
    running: FuturesUnordered<BoxFuture<'static, pb::ReserveResult>>,
    /// Answers decided without work (refusals while draining, oversized messages).
    ready: Vec<pb::ReserveResult>,
    /// Polled until it fires, then `None`: from then on the stream drains.
    shutdown: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Answers {
    pub fn new(app: Arc<App>, inbound: Streaming<pb::ReserveBatchRequest>) -> Self {
        let shutdown = Some(Box::pin(app.shutdown.clone().wait()) as Pin<Box<_>>);
        Self {
            app,
            inbound: Some(inbound),
            running: FuturesUnordered::new(),
            ready: Vec::new(),
            shutdown,
        }
    }

    fn draining(&self) -> bool {
        self.shutdown.is_none()
    }

    /// Starts every entry of `msg` (or refuses each, while draining or when too many).
    fn start(&mut self, msg: pb::ReserveBatchRequest) {
        if msg.entries.is_empty() {
            return;
        }
        self.app
            .metrics
            .reserve_stream_entries
            .observe(msg.entries.len() as f64);
        let refusal = if self.draining() {
            Some(Status::unavailable(
                "stockd is shutting down: send it to another stockd",
            ))
        } else if msg.entries.len() > MAX_BATCH {
            let why = format!("a message must hold at most {MAX_BATCH} reservations");
            Some(Status::from(crate::error::invalid("entries", why)))
        } else {
            None
        };
        for e in msg.entries {
            if let Some(s) = &refusal {
                self.ready.push(result(e.tag, Err(s.clone())));
                continue;
            }
            let app = Arc::clone(&self.app);
            let (tag, timeout_ms) = (e.tag, e.timeout_ms);
            self.running.push(Box::pin(async move {
                if timeout_ms == 0 {
                    return reserve_entry(&app, e).await;
                }
                let left = Duration::from_millis(u64::from(timeout_ms));
                match tokio::time::timeout(left, reserve_entry(&app, e)).await {
                    Ok(r) => r,
                    Err(_) => result(tag, Err(Status::deadline_exceeded("timeout_ms passed"))),
                }
            }));
        }
    }
}

impl Stream for Answers {
    type Item = Result<pb::ReserveBatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(shutdown) = this.shutdown.as_mut() {
            if shutdown.as_mut().poll(cx).is_ready() {
                this.shutdown = None;
            }
        }
        while this.running.len() < MAX_RUNNING {
            let Some(inbound) = this.inbound.as_mut() else {
                break;
            };
            match Pin::new(inbound).poll_next(cx) {
                Poll::Ready(Some(Ok(msg))) => this.start(msg),
                // The edge ended its side, or the stream broke: what was read is answered
                // (if the edge is gone, hyper drops this stream and the entries with it,
                // as it cancels a unary call whose caller went away).
                Poll::Ready(Some(Err(_)) | None) => this.inbound = None,
                Poll::Pending => break,
            }
        }
        let mut results = std::mem::take(&mut this.ready);
        if results.len() > MAX_RESULTS {
            this.ready = results.split_off(MAX_RESULTS);
        }
        while results.len() < MAX_RESULTS {
            match this.running.poll_next_unpin(cx) {
                Poll::Ready(Some(r)) => results.push(r),
                _ => break,
            }
        }
        if !results.is_empty() {
            if results.len() == MAX_RESULTS {
                // More may be ready: come back for them without waiting for a wake-up.
                cx.waker().wake_by_ref();
            }
            return Poll::Ready(Some(Ok(pb::ReserveBatchResponse { results })));
        }
        // Done when nothing more will be read, or the daemon drains and nothing it
        // started is left (what the edge sends meanwhile is not read, and fails over).
        if this.running.is_empty() && (this.inbound.is_none() || this.draining()) {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}
