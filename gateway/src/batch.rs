//! Reservations to one stockd endpoint, batched: the client side of
//! `StockService.ReserveBatch`.
//!
//! Why: a unary `Reserve` per reservation cost the edge and stockd more CPU in HTTP/2
//! and tonic (a stream opened and closed, HPACK, a hand-off to the channel's worker
//! task and back, per call) than the reservation itself cost anywhere. Here each
//! endpoint has one task per gateway runtime that owns its calls: a reservation is
//! queued to it, and the task sends what has queued as one call.
//!
//! How it batches: at most `upstreams.reserve_batch_inflight` calls are out per
//! endpoint; the reservations that arrive while they are out queue and leave
//! together (up to `upstreams.reserve_batch_max`) when one comes back. A lone
//! reservation on a quiet edge goes at once, alone: nothing waits on a timer, so
//! batching adds no latency when the sale is quiet, and under a stampede the batch
//! grows with the load (the same group commit stockd does per shard toward Redis).
//!
//! Semantics are the unary call's, entry by entry: stockd decides each entry as a
//! `Reserve` of its own and answers each with its own status, so one entry's
//! `UNAVAILABLE` fails over alone (`upstream::Fleet::call`), and a failed call fails
//! every entry it carried with its status (a transport error fails over; a retry on
//! another stockd with the same request id answers the same reservation). A caller
//! that went away before its entry was sent (deadline, client gone) is not sent; one
//! that goes away after is answered by stockd as a unary call would have been, and
//! its retry with the same request id gets the reservation back.
//!
//! A stockd that does not know `ReserveBatch` (UNIMPLEMENTED: an older one in a rolling
//! upgrade) is called unary from then on, by this runtime's queue for that endpoint.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use seckill_proto::pb;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::forward::Stock;

/// Most entries one `ReserveBatch` may carry (stockd's limit).
pub const MAX_BATCH: usize = 1024;

/// What a caller gets back: the entry's response, or its status.
type Answer = Result<pb::ReserveResponse, Status>;

/// One queued reservation.
struct Job {
    entry: pb::ReserveBatchEntry,
    /// When the caller stops waiting.
    deadline: Instant,
    answer: oneshot::Sender<Answer>,
}

/// The reservations of one runtime to one stockd endpoint. Cheap to clone (a queue
/// handle); the task behind it ends when the last handle is dropped.
#[derive(Clone)]
pub struct Batcher {
    client: Stock,
    /// `None` when batching is off (`reserve_batch_max` = 1).
    queue: Option<mpsc::UnboundedSender<Job>>,
    /// Set once the endpoint answered UNIMPLEMENTED to a batch.
    unary: Arc<AtomicBool>,
}

impl Batcher {
    /// Must run inside a tokio runtime (the batching task is spawned on it).
    pub fn new(client: Stock, max: usize, inflight: usize) -> Self {
        let unary = Arc::new(AtomicBool::new(false));
        let queue = (max > 1).then(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run(client.clone(), rx, max.min(MAX_BATCH), inflight.max(1)));
            tx
        });
        Self {
            client,
            queue,
            unary,
        }
    }

    /// One reservation with `left` to go, as `Reserve` would answer it. `entry`
    /// makes the request (twice when the endpoint turns out not to batch).
    pub async fn reserve(
        &self,
        entry: impl Fn() -> pb::ReserveBatchEntry,
        left: Duration,
    ) -> Result<tonic::Response<pb::ReserveResponse>, Status> {
        let queue = match &self.queue {
            Some(q) if !self.unary.load(Ordering::Relaxed) => q,
            _ => {
                return unary(self.client.clone(), entry(), left)
                    .await
                    .map(tonic::Response::new)
            }
        };
        let deadline = Instant::now() + left;
        let (tx, rx) = oneshot::channel();
        let job = Job {
            entry: entry(),
            deadline,
            answer: tx,
        };
        if let Err(mpsc::error::SendError(job)) = queue.send(job) {
            // The task is gone (its runtime is shutting down): this one as a unary call.
            return unary(self.client.clone(), job.entry, left)
                .await
                .map(tonic::Response::new);
        }
        let answer = rx
            .await
            .unwrap_or_else(|_| Err(Status::unavailable("the reservation's batch was dropped")));
        match answer {
            // The batch never reached a service that knows it: as a unary call now.
            Err(s) if s.code() == Code::Unimplemented => {
                if !self.unary.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "stockd does not serve ReserveBatch (an older version?): calling Reserve"
                    );
                }
                let left = deadline.saturating_duration_since(Instant::now());
                unary(self.client.clone(), entry(), left).await
            }
            other => other,
        }
        .map(tonic::Response::new)
    }
}

/// A unary `Reserve` of `entry` (its traceparent as metadata).
async fn unary(mut client: Stock, entry: pb::ReserveBatchEntry, left: Duration) -> Answer {
    let mut r = tonic::Request::new(entry.request.unwrap_or_default());
    r.set_timeout(left);
    if !entry.traceparent.is_empty() {
        if let Ok(tp) = entry.traceparent.parse() {
            r.metadata_mut().insert(seckill_proto::trace::METADATA, tp);
        }
    }
    client.reserve(r).await.map(tonic::Response::into_inner)
}

/// The batching task of one endpoint: takes a call slot, then everything queued (up
/// to `max`), and sends it.
async fn run(client: Stock, mut rx: mpsc::UnboundedReceiver<Job>, max: usize, inflight: usize) {
    let slots = Arc::new(Semaphore::new(inflight));
    loop {
        // A slot first: while every slot is out, arrivals queue in the channel.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        // Let the tasks already runnable go first: requests that one read of the
        // sockets made ready queue behind this task and join this call (no timer: the
        // yield costs one reschedule).
        tokio::task::yield_now().await;
        let mut jobs = Vec::with_capacity(max.min(64));
        jobs.push(first);
        while jobs.len() < max {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        // Nobody waits for these any more: nothing was promised, nothing is sent.
        jobs.retain(|j| !j.answer.is_closed());
        if jobs.is_empty() {
            continue;
        }
        let client = client.clone();
        tokio::spawn(async move {
            let _slot = slot;
            send(client, jobs).await;
        });
    }
}

/// One `ReserveBatch` call for `jobs`, each answered with its own result (a failed
/// call: every entry with its status; UNIMPLEMENTED sends the callers to `Reserve`).
async fn send(mut client: Stock, jobs: Vec<Job>) {
    let now = Instant::now();
    let Some(left) = jobs
        .iter()
        .map(|j| j.deadline.saturating_duration_since(now))
        .max()
    else {
        return;
    };
    let (entries, waiting): (Vec<_>, Vec<_>) =
        jobs.into_iter().map(|j| (j.entry, j.answer)).unzip();
    let mut r = tonic::Request::new(pb::ReserveBatchRequest { entries });
    r.set_timeout(left);
    match client.reserve_batch(r).await {
        Ok(resp) => {
            let results = resp.into_inner().results;
            if results.len() != waiting.len() {
                let e = Status::internal(format!(
                    "stockd answered {} results to a batch of {}",
                    results.len(),
                    waiting.len()
                ));
                for tx in waiting {
                    let _ = tx.send(Err(e.clone()));
                }
                return;
            }
            for (tx, r) in waiting.into_iter().zip(results) {
                let _ = tx.send(result(r));
            }
        }
        Err(s) => {
            for tx in waiting {
                let _ = tx.send(Err(s.clone()));
            }
        }
    }
}

/// One entry's result as the unary call's.
fn result(r: pb::ReserveResult) -> Answer {
    if r.code == Code::Ok as i32 {
        return r
            .response
            .ok_or_else(|| Status::internal("stockd answered OK without a response"));
    }
    Err(Status::new(Code::from_i32(r.code), r.message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_proto::auth::AttachToken;
    use seckill_proto::pb::stock_service_server::{StockService, StockServiceServer};
    use std::sync::Mutex;
    use tonic::{Request, Response};

    /// A StockService speaking the real protocol whose answers name the user, so a
    /// crossed answer shows: `ReserveBatch` (or UNIMPLEMENTED, as a stockd older than
    /// it answers), a slow one, and a per-entry refusal for user `bad`.
    #[derive(Default)]
    struct Echo {
        /// Entries per `ReserveBatch` call, and unary calls.
        batches: Mutex<Vec<usize>>,
        unary: Mutex<usize>,
        old: bool,
    }

    fn reserved(user: &str) -> pb::ReserveResponse {
        pb::ReserveResponse {
            outcome: pb::ReserveOutcome::Reserved as i32,
            reservation_id: format!("rid-{user}"),
            ..Default::default()
        }
    }

    /// The served face of a shared [`Echo`].
    struct Svc(Arc<Echo>);

    impl std::ops::Deref for Svc {
        type Target = Echo;
        fn deref(&self) -> &Echo {
            &self.0
        }
    }

    #[tonic::async_trait]
    impl StockService for Svc {
        async fn reserve(
            &self,
            r: Request<pb::ReserveRequest>,
        ) -> Result<Response<pb::ReserveResponse>, Status> {
            *self.unary.lock().unwrap() += 1;
            Ok(Response::new(reserved(&r.into_inner().user_id)))
        }
        async fn reserve_batch(
            &self,
            r: Request<pb::ReserveBatchRequest>,
        ) -> Result<Response<pb::ReserveBatchResponse>, Status> {
            if self.old {
                return Err(Status::unimplemented("unknown method"));
            }
            let entries = r.into_inner().entries;
            self.batches.lock().unwrap().push(entries.len());
            tokio::time::sleep(Duration::from_millis(20)).await;
            let results = entries
                .into_iter()
                .map(|e| {
                    let user = e.request.unwrap_or_default().user_id;
                    if user == "bad" {
                        pb::ReserveResult {
                            code: Code::InvalidArgument as i32,
                            message: "user_id: bad".into(),
                            response: None,
                        }
                    } else {
                        pb::ReserveResult {
                            code: 0,
                            message: String::new(),
                            response: Some(reserved(&user)),
                        }
                    }
                })
                .collect();
            Ok(Response::new(pb::ReserveBatchResponse { results }))
        }
        async fn release(
            &self,
            _: Request<pb::ReleaseRequest>,
        ) -> Result<Response<pb::ReleaseResponse>, Status> {
            Err(Status::unimplemented("not here"))
        }
        async fn get_stock(
            &self,
            _: Request<pb::GetStockRequest>,
        ) -> Result<Response<pb::GetStockResponse>, Status> {
            Err(Status::unimplemented("not here"))
        }
    }

    async fn serve(echo: Arc<Echo>) -> Stock {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(StockServiceServer::new(Svc(echo)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        StockServiceClient::with_interceptor(
            channel,
            AttachToken::new("t0123456789abcdef").unwrap(),
        )
    }

    fn entry(user: &str) -> pb::ReserveBatchEntry {
        pb::ReserveBatchEntry {
            request: Some(pb::ReserveRequest {
                activity_id: 1,
                item_id: 1,
                user_id: user.into(),
                request_id: "r".into(),
                quantity: 1,
            }),
            traceparent: String::new(),
        }
    }

    use seckill_proto::pb::stock_service_client::StockServiceClient;

    /// `n` reservations at once through `b`: each caller's answer.
    async fn crowd(b: &Batcher, users: Vec<String>) -> Vec<(String, Answer)> {
        let calls = users.into_iter().map(|u| {
            let b = b.clone();
            async move {
                let r = b.reserve(|| entry(&u), Duration::from_secs(5)).await;
                (u, r.map(tonic::Response::into_inner))
            }
        });
        futures::future::join_all(calls).await
    }

    #[tokio::test]
    async fn reservations_that_queue_behind_a_call_go_together_and_each_gets_its_own_answer() {
        let echo = Arc::new(Echo::default());
        let b = Batcher::new(serve(echo.clone()).await, 256, 1);
        let mut users: Vec<String> = (0..200).map(|i| format!("u{i}")).collect();
        users[17] = "bad".into();
        for (user, answer) in crowd(&b, users).await {
            match answer {
                Ok(r) => assert_eq!(r.reservation_id, format!("rid-{user}")),
                Err(s) => {
                    assert_eq!(user, "bad");
                    assert_eq!(s.code(), Code::InvalidArgument);
                    assert_eq!(s.message(), "user_id: bad");
                }
            }
        }
        let batches = echo.batches.lock().unwrap().clone();
        assert_eq!(batches.iter().sum::<usize>(), 200, "{batches:?}");
        assert!(batches.len() < 200 / 4, "hardly batched: {batches:?}");
        assert_eq!(*echo.unary.lock().unwrap(), 0);
    }

    #[tokio::test]
    async fn a_lone_reservation_goes_at_once_and_max_bounds_a_batch() {
        let echo = Arc::new(Echo::default());
        let b = Batcher::new(serve(echo.clone()).await, 8, 1);
        let (_, r) = crowd(&b, vec!["solo".into()]).await.remove(0);
        assert_eq!(r.unwrap().reservation_id, "rid-solo");
        assert_eq!(*echo.batches.lock().unwrap(), [1]);
        let users = (0..50).map(|i| format!("u{i}")).collect();
        assert!(crowd(&b, users).await.iter().all(|(_, r)| r.is_ok()));
        let batches = echo.batches.lock().unwrap().clone();
        assert!(batches.iter().all(|&n| n <= 8), "{batches:?}");
        assert_eq!(batches.iter().sum::<usize>(), 51);
    }

    #[tokio::test]
    async fn an_endpoint_without_reserve_batch_is_called_unary_from_then_on() {
        let echo = Arc::new(Echo {
            old: true,
            ..Default::default()
        });
        let b = Batcher::new(serve(echo.clone()).await, 256, 2);
        let users: Vec<String> = (0..20).map(|i| format!("u{i}")).collect();
        for (user, r) in crowd(&b, users).await {
            assert_eq!(r.unwrap().reservation_id, format!("rid-{user}"));
        }
        assert_eq!(*echo.unary.lock().unwrap(), 20);
        assert!(b.unary.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn batching_off_is_one_unary_call_each() {
        let echo = Arc::new(Echo::default());
        let b = Batcher::new(serve(echo.clone()).await, 1, 2);
        let users: Vec<String> = (0..10).map(|i| format!("u{i}")).collect();
        assert!(crowd(&b, users).await.iter().all(|(_, r)| r.is_ok()));
        assert_eq!(*echo.unary.lock().unwrap(), 10);
        assert!(echo.batches.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_dead_endpoint_fails_every_entry_with_a_status_that_fails_over() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        let client = StockServiceClient::with_interceptor(
            channel,
            AttachToken::new("t0123456789abcdef").unwrap(),
        );
        let b = Batcher::new(client, 256, 2);
        let users: Vec<String> = (0..10).map(|i| format!("u{i}")).collect();
        for (_, r) in crowd(&b, users).await {
            let s = r.expect_err("nobody listens");
            assert!(crate::upstream::fails_over(&s), "{s:?}");
        }
    }
}
