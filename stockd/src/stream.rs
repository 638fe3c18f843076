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
//! commit like concurrent unary calls), and writes every result ready at that moment
//! as one message, tagged with the entry's tag. It stops reading when the daemon shuts
//! down or the edge ends its side, answers every entry it read, then ends with OK: an
//! entry the edge sent that was never read is never answered, and the edge sends it to
//! another stockd with the same request id.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use seckill_proto::pb;
use tonic::{Status, Streaming};

use crate::app::App;
use crate::service::{reserve_entry, result, MAX_BATCH};

/// Entries of one stream being decided at once; past it the stream stops reading (the
/// edge's writes then wait on HTTP/2 flow control) until some are answered.
const MAX_RUNNING: usize = 65_536;

/// The response side of one `ReserveStream` call.
pub struct Answers {
    app: Arc<App>,
    /// `None` once the edge ended its side, the stream failed, or the daemon began to
    /// shut down: nothing more is read.
    inbound: Option<Streaming<pb::ReserveBatchRequest>>,
    running: FuturesUnordered<BoxFuture<'static, pb::ReserveResult>>,
    /// Polled only while `inbound` is `Some` (and never again once ready).
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Answers {
    pub fn new(app: Arc<App>, inbound: Streaming<pb::ReserveBatchRequest>) -> Self {
        let shutdown = Box::pin(app.shutdown.clone().wait());
        Self {
            app,
            inbound: Some(inbound),
            running: FuturesUnordered::new(),
            shutdown,
        }
    }

    /// Starts every entry of `msg`.
    fn start(&mut self, msg: pb::ReserveBatchRequest) {
        let app = &self.app;
        self.app
            .metrics
            .reserve_stream_entries
            .observe(msg.entries.len() as f64);
        let too_many = msg.entries.len() > MAX_BATCH;
        for e in msg.entries {
            let tag = e.tag;
            if too_many {
                let why = format!("a message must hold at most {MAX_BATCH} reservations");
                let r = Err(Status::from(crate::error::invalid("entries", why)));
                self.running
                    .push(Box::pin(std::future::ready(result(tag, r))));
                continue;
            }
            let app = Arc::clone(app);
            self.running
                .push(Box::pin(async move { reserve_entry(&app, e).await }));
        }
    }
}

impl Stream for Answers {
    type Item = Result<pb::ReserveBatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.inbound.is_some() && this.shutdown.as_mut().poll(cx).is_ready() {
            this.inbound = None;
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
        let mut results = Vec::new();
        while let Poll::Ready(Some(r)) = this.running.poll_next_unpin(cx) {
            results.push(r);
        }
        if !results.is_empty() {
            return Poll::Ready(Some(Ok(pb::ReserveBatchResponse { results })));
        }
        if this.inbound.is_none() && this.running.is_empty() {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}
