//! Reservations to one stockd endpoint, batched: the client side of
//! `StockService.ReserveStream` (and of `ReserveBatch`, its predecessor).
//!
//! Why: a unary `Reserve` per reservation cost the edge and stockd more CPU in HTTP/2
//! and tonic (a stream opened and closed, HPACK, a hand-off to the channel's worker
//! task and back, per call) than the reservation itself cost anywhere. Here each
//! endpoint has one task per gateway runtime that owns its calls: a reservation is
//! queued to it, and the task sends what has queued together.
//!
//! On a stream (`upstreams.reserve_stream`, the default): one long-lived
//! `ReserveStream`, opened at the first reservation after the last one ended. What
//! queued while the task was busy goes out as one message (up to
//! `upstreams.reserve_batch_max` entries), each entry tagged; each caller is answered
//! when stockd answers its tag, i.e. when its own shard's Redis call is done. A message
//! is one DATA frame each way: no HEADERS, HPACK or trailers per batch, and no batch
//! waiting for its slowest entry.
//!
//! In `ReserveBatch` calls (the stream off, or a stockd that does not serve it): at
//! most `upstreams.reserve_batch_inflight` calls are out per endpoint; the reservations
//! that arrive while they are out queue and leave together when one comes back.
//!
//! Either way a lone reservation on a quiet edge goes at once, alone: nothing waits on
//! a timer, so batching adds no latency when the sale is quiet, and under a stampede
//! the batch grows with the load (the same group commit stockd does per shard toward
//! Redis).
//!
//! Semantics are the unary call's, entry by entry: stockd decides each entry as a
//! `Reserve` of its own and answers each with its own status, so one entry's
//! `UNAVAILABLE` fails over alone (`upstream::Fleet::call`), and a failed call, or a
//! stream that breaks or ends, fails every entry it has not answered with
//! `UNAVAILABLE` (a retry on another stockd with the same request id answers the same
//! reservation). A caller that went away before its entry was sent (deadline, client
//! gone) is not sent; one that goes away after is answered by stockd as a unary call
//! would have been, and its retry with the same request id gets the reservation back.
//!
//! A stockd that does not know `ReserveStream` (UNIMPLEMENTED: an older one in a rolling
//! upgrade) gets `ReserveBatch` calls from then on, and one that does not know
//! `ReserveBatch` either is called unary, by this runtime's queue for that endpoint.

use std::collections::HashMap;
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
    /// Must run inside a tokio runtime (the batching task is spawned on it). `stream`:
    /// on a `ReserveStream` (else `ReserveBatch` calls, `inflight` at a time).
    pub fn new(client: Stock, max: usize, inflight: usize, stream: bool) -> Self {
        let unary = Arc::new(AtomicBool::new(false));
        let queue = (max > 1).then(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let (max, inflight) = (max.min(MAX_BATCH), inflight.max(1));
            tokio::spawn(run(client.clone(), rx, max, inflight, stream));
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

/// The task of one endpoint: its reservations on a `ReserveStream` while stockd
/// serves it, else (`stream` off, or an older stockd) in `ReserveBatch` calls.
async fn run(
    client: Stock,
    mut rx: mpsc::UnboundedReceiver<Job>,
    max: usize,
    inflight: usize,
    stream: bool,
) {
    let carried = if stream {
        match streams(&client, &mut rx, max).await {
            Ended::Closed => return,
            Ended::Unimplemented(jobs) => {
                tracing::warn!(
                    "stockd does not serve ReserveStream (an older version?): calling ReserveBatch"
                );
                jobs
            }
        }
    } else {
        Vec::new()
    };
    batches(client, rx, max, inflight, carried).await
}

/// Takes `first` and what else has queued (up to `max` in all), after letting the tasks
/// already runnable go first: requests that one read of the sockets made ready queue
/// behind this task and join these (no timer: the yield costs one reschedule). Those
/// whose caller stopped waiting are left out: nothing was promised, nothing is sent.
async fn gather(first: Job, rx: &mut mpsc::UnboundedReceiver<Job>, max: usize) -> Vec<Job> {
    tokio::task::yield_now().await;
    let mut jobs = Vec::with_capacity(max.min(64));
    jobs.push(first);
    while jobs.len() < max {
        match rx.try_recv() {
            Ok(j) => jobs.push(j),
            Err(_) => break,
        }
    }
    jobs.retain(|j| !j.answer.is_closed());
    jobs
}

/// How a run of streams ended.
enum Ended {
    /// The queue closed (the runtime is going away).
    Closed,
    /// stockd does not know `ReserveStream`: these jobs, not sent, go another way.
    Unimplemented(Vec<Job>),
}

/// One `ReserveStream` after another, each opened at the first reservation after the
/// last one ended (none on an idle edge). Entries go out as they queue, tagged; each
/// caller is answered when its tag comes back. When a stream ends or breaks, the
/// entries it did not answer get UNAVAILABLE and fail over (stockd answers every entry
/// it read before it ends a stream, so those were not read, or their answers were lost
/// with the connection: the same request id on another stockd answers the same
/// reservation either way).
async fn streams(client: &Stock, rx: &mut mpsc::UnboundedReceiver<Job>, max: usize) -> Ended {
    let mut tag = 0u64;
    loop {
        let Some(first) = rx.recv().await else {
            return Ended::Closed;
        };
        let jobs = gather(first, rx, max).await;
        if jobs.is_empty() {
            continue;
        }
        let mut waiting = HashMap::with_capacity(jobs.len());
        let first = message(jobs, &mut tag, &mut waiting);
        // Kept until stockd answers the call: an older stockd's UNIMPLEMENTED gives
        // these entries back to the batch path.
        let sent = first.clone();
        let (out, body) = mpsc::unbounded_channel();
        let _ = out.send(first);
        let mut call = client.clone();
        let answers = call
            .reserve_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(body))
            .await;
        let mut answers = match answers {
            Ok(a) => a.into_inner(),
            // An older stockd: it does not know the RPC (UNIMPLEMENTED), or its scope
            // table does not, and classifies it `admin` (a scope refusal).
            Err(s)
                if s.code() == Code::Unimplemented || seckill_proto::auth::is_scope_refusal(&s) =>
            {
                let jobs = sent
                    .entries
                    .into_iter()
                    .filter_map(|e| {
                        let mut job = waiting.remove(&e.tag)?;
                        job.entry = e;
                        Some(job)
                    })
                    .collect();
                return Ended::Unimplemented(jobs);
            }
            Err(s) => {
                fail(waiting, &endpoint_failed(s));
                continue;
            }
        };
        drop(sent);
        let why = loop {
            tokio::select! {
                m = answers.message() => match m {
                    Ok(Some(m)) => {
                        for r in m.results {
                            if let Some(job) = waiting.remove(&r.tag) {
                                let _ = job.answer.send(result(r));
                            }
                        }
                    }
                    Ok(None) => break Status::unavailable("stockd ended the reservation stream"),
                    Err(s) => break Status::unavailable(format!("reservation stream: {}", s.message())),
                },
                j = rx.recv() => {
                    let Some(j) = j else { return Ended::Closed };
                    let jobs = gather(j, rx, max).await;
                    if !jobs.is_empty() {
                        let m = message(jobs, &mut tag, &mut waiting);
                        if out.send(m).is_err() {
                            break Status::unavailable("the reservation stream closed");
                        }
                    }
                }
            }
        };
        fail(waiting, &endpoint_failed(why));
    }
}

/// An `UNAVAILABLE` of the endpoint rather than of one entry (the stream or call could
/// not open, broke or ended): given a source, as tonic gives a transport error's status,
/// so the fleet marks the endpoint down at once (`upstream::marks_down`). An entry's own
/// status, as stockd answered it, has none; other codes are left as they are (they do
/// not fail over).
fn endpoint_failed(mut s: Status) -> Status {
    if s.code() == Code::Unavailable && std::error::Error::source(&s).is_none() {
        let why = std::io::Error::other(s.message().to_string());
        s.set_source(Arc::new(why));
    }
    s
}

/// The message for `jobs`: each entry tagged and given the time its caller still waits,
/// each job kept under its tag.
fn message(
    jobs: Vec<Job>,
    tag: &mut u64,
    waiting: &mut HashMap<u64, Job>,
) -> pb::ReserveBatchRequest {
    let now = Instant::now();
    let mut entries = Vec::with_capacity(jobs.len());
    for mut job in jobs {
        *tag = tag.wrapping_add(1);
        let mut e = std::mem::take(&mut job.entry);
        e.tag = *tag;
        let left = job.deadline.saturating_duration_since(now).as_millis();
        e.timeout_ms = left.clamp(1, u128::from(u32::MAX)) as u32;
        entries.push(e);
        waiting.insert(*tag, job);
    }
    pb::ReserveBatchRequest { entries }
}

/// Answers every job still waiting with `s`.
fn fail(waiting: HashMap<u64, Job>, s: &Status) {
    for (_, job) in waiting {
        let _ = job.answer.send(Err(s.clone()));
    }
}

/// `ReserveBatch` calls: takes a call slot, then everything queued (up to `max`), and
/// sends it; `carried` (jobs an earlier path handed over) go first.
async fn batches(
    client: Stock,
    mut rx: mpsc::UnboundedReceiver<Job>,
    max: usize,
    inflight: usize,
    mut carried: Vec<Job>,
) {
    let slots = Arc::new(Semaphore::new(inflight));
    loop {
        // A slot first: while every slot is out, arrivals queue in the channel.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let jobs = if carried.is_empty() {
            let Some(first) = rx.recv().await else {
                return;
            };
            gather(first, &mut rx, max).await
        } else {
            let n = carried.len().min(max);
            carried.drain(..n).collect()
        };
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
            let s = endpoint_failed(s);
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
    use seckill_proto::pb::stock_service_client::StockServiceClient;
    use seckill_proto::pb::stock_service_server::{StockService, StockServiceServer};
    use std::pin::Pin;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;
    use tonic::{Request, Response};

    /// A StockService speaking the real protocol whose answers name the user, so a
    /// crossed answer shows: `ReserveStream`, `ReserveBatch` (or UNIMPLEMENTED for
    /// either, as an older stockd answers), a per-entry refusal for user `bad`, and a
    /// user `slow` decided long after the others.
    #[derive(Default)]
    struct Echo {
        /// Entries per `ReserveBatch` call, per `ReserveStream` message, and unary calls.
        batches: Mutex<Vec<usize>>,
        streams: Mutex<Vec<usize>>,
        unary: Mutex<usize>,
        /// Serves neither `ReserveBatch` nor `ReserveStream`.
        old: bool,
        /// Serves `ReserveBatch` but not `ReserveStream`.
        no_stream: bool,
        /// Serves `ReserveBatch`, and refuses `ReserveStream` as a stockd whose scope
        /// table predates it does (PERMISSION_DENIED, marked a scope refusal).
        stream_needs_admin: bool,
        /// Answers only the first entry of a stream, then ends the stream (OK).
        end_after_one: bool,
        /// Set when user `slow` has been decided.
        slow_done: AtomicBool,
        /// The `timeout_ms` of every stream entry.
        timeouts: Mutex<Vec<u32>>,
    }

    fn reserved(user: &str) -> pb::ReserveResponse {
        pb::ReserveResponse {
            outcome: pb::ReserveOutcome::Reserved as i32,
            reservation_id: format!("rid-{user}"),
            ..Default::default()
        }
    }

    impl Echo {
        /// Entries per `ReserveStream` message (`stream`) or per `ReserveBatch` call.
        fn sizes(&self, stream: bool) -> Vec<usize> {
            let sizes = if stream { &self.streams } else { &self.batches };
            sizes.lock().unwrap().clone()
        }

        /// One entry decided: after 20 ms, `slow` after 500 ms.
        async fn decide(&self, e: pb::ReserveBatchEntry) -> pb::ReserveResult {
            let user = e.request.unwrap_or_default().user_id;
            let ms = if user == "slow" { 500 } else { 20 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if user == "slow" {
                self.slow_done.store(true, Ordering::SeqCst);
            }
            if user == "bad" {
                return pb::ReserveResult {
                    code: Code::InvalidArgument as i32,
                    message: "user_id: bad".into(),
                    response: None,
                    tag: e.tag,
                };
            }
            if user == "rebuilding" {
                return pb::ReserveResult {
                    code: Code::Unavailable as i32,
                    message: "activity 1 is being rebuilt from MySQL; retry shortly".into(),
                    response: None,
                    tag: e.tag,
                };
            }
            pb::ReserveResult {
                code: 0,
                message: String::new(),
                response: Some(reserved(&user)),
                tag: e.tag,
            }
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

    type Answers =
        Pin<Box<dyn futures::Stream<Item = Result<pb::ReserveBatchResponse, Status>> + Send>>;

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
            let results =
                futures::future::join_all(entries.into_iter().map(|e| self.decide(e))).await;
            Ok(Response::new(pb::ReserveBatchResponse { results }))
        }
        type ReserveStreamStream = Answers;
        async fn reserve_stream(
            &self,
            r: Request<tonic::Streaming<pb::ReserveBatchRequest>>,
        ) -> Result<Response<Answers>, Status> {
            if self.old || self.no_stream {
                return Err(Status::unimplemented("unknown method"));
            }
            if self.stream_needs_admin {
                return Err(seckill_proto::auth::scope_refusal(
                    "caller \"gateway\" lacks the \"admin\" scope that \
                     /seckill.v1.StockService/ReserveStream needs"
                        .into(),
                ));
            }
            let mut inbound = r.into_inner();
            let echo = Arc::clone(&self.0);
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                while let Ok(Some(m)) = inbound.message().await {
                    echo.streams.lock().unwrap().push(m.entries.len());
                    for e in m.entries {
                        echo.timeouts.lock().unwrap().push(e.timeout_ms);
                        let (echo, tx) = (Arc::clone(&echo), tx.clone());
                        tokio::spawn(async move {
                            let r = echo.decide(e).await;
                            let _ = tx.send(Ok(pb::ReserveBatchResponse { results: vec![r] }));
                        });
                    }
                    if echo.end_after_one {
                        break;
                    }
                }
            });
            let mut answers = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
            if self.end_after_one {
                // One answer, then the end of the stream.
                return Ok(Response::new(Box::pin(futures::stream::once(async move {
                    use futures::StreamExt;
                    answers.next().await.unwrap()
                }))));
            }
            Ok(Response::new(Box::pin(answers)))
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
        client(addr)
    }

    fn client(addr: std::net::SocketAddr) -> Stock {
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
            tag: 0,
            timeout_ms: 0,
        }
    }

    /// Every reservation at once through `b`: each caller's answer, and the order in
    /// which the answers came (0 first).
    async fn crowd(b: &Batcher, users: Vec<String>) -> Vec<(String, Answer, usize)> {
        let order = AtomicUsize::new(0);
        let calls = users.into_iter().map(|u| {
            let (b, order) = (b.clone(), &order);
            async move {
                let r = b.reserve(|| entry(&u), Duration::from_secs(5)).await;
                let n = order.fetch_add(1, Ordering::SeqCst);
                (u, r.map(tonic::Response::into_inner), n)
            }
        });
        futures::future::join_all(calls).await
    }

    /// Each answer is the caller's own: its user's reservation, or `bad`'s refusal.
    fn each_their_own(answers: &[(String, Answer, usize)]) {
        for (user, answer, _) in answers {
            match answer {
                Ok(r) => assert_eq!(r.reservation_id, format!("rid-{user}")),
                Err(s) => {
                    assert_eq!(user, "bad");
                    assert_eq!(s.code(), Code::InvalidArgument);
                    assert_eq!(s.message(), "user_id: bad");
                }
            }
        }
    }

    fn users(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("u{i}")).collect()
    }

    #[tokio::test]
    async fn reservations_that_queue_go_together_and_each_gets_its_own_answer() {
        for stream in [true, false] {
            let echo = Arc::new(Echo::default());
            let b = Batcher::new(serve(echo.clone()).await, 256, 1, stream);
            let mut users = users(200);
            users[17] = "bad".into();
            each_their_own(&crowd(&b, users).await);
            let sizes = echo.sizes(stream);
            assert_eq!(
                sizes.iter().sum::<usize>(),
                200,
                "stream {stream}: {sizes:?}"
            );
            assert!(
                sizes.len() < 200 / 4,
                "stream {stream}: hardly batched: {sizes:?}"
            );
            assert!(echo.sizes(!stream).is_empty(), "stream {stream}");
            assert_eq!(*echo.unary.lock().unwrap(), 0);
            // Each stream entry carries the time its caller still waits (5 s here).
            let timeouts = echo.timeouts.lock().unwrap().clone();
            assert_eq!(timeouts.len(), if stream { 200 } else { 0 });
            assert!(
                timeouts.iter().all(|&t| (1..=5000).contains(&t)),
                "{timeouts:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_lone_reservation_goes_at_once_and_max_bounds_a_message() {
        for stream in [true, false] {
            let echo = Arc::new(Echo::default());
            let b = Batcher::new(serve(echo.clone()).await, 8, 1, stream);
            let (_, r, _) = crowd(&b, vec!["solo".into()]).await.remove(0);
            assert_eq!(r.unwrap().reservation_id, "rid-solo");
            assert_eq!(echo.sizes(stream), [1]);
            assert!(crowd(&b, users(50)).await.iter().all(|(_, r, _)| r.is_ok()));
            let sizes = echo.sizes(stream);
            assert!(sizes.iter().all(|&n| n <= 8), "stream {stream}: {sizes:?}");
            assert_eq!(sizes.iter().sum::<usize>(), 51);
        }
    }

    #[tokio::test]
    async fn on_a_stream_a_slow_reservation_holds_no_other_back() {
        // With ReserveBatch every entry of a call waits for its slowest; on a stream
        // each is answered when it is decided: all the others before `slow` is.
        for stream in [true, false] {
            let echo = Arc::new(Echo::default());
            let b = Batcher::new(serve(echo.clone()).await, 256, 1, stream);
            let mut users = users(40);
            users[5] = "slow".into();
            let calls = users.into_iter().map(|u| {
                let (b, echo) = (b.clone(), Arc::clone(&echo));
                async move {
                    let r = b.reserve(|| entry(&u), Duration::from_secs(5)).await;
                    (u, r.is_ok(), echo.slow_done.load(Ordering::SeqCst))
                }
            });
            let answers = futures::future::join_all(calls).await;
            let early = answers
                .iter()
                .filter(|(u, ok, slow_done)| *ok && u != "slow" && !slow_done)
                .count();
            assert!(answers.iter().all(|(_, ok, _)| *ok));
            if stream {
                assert_eq!(early, 39, "answered before `slow` was decided");
            } else {
                assert_eq!(early, 0, "a batch answers when its slowest entry is");
            }
        }
    }

    #[tokio::test]
    async fn entries_a_stream_ended_without_answering_fail_over_and_the_next_opens_a_new_one() {
        let echo = Arc::new(Echo {
            end_after_one: true,
            ..Default::default()
        });
        let b = Batcher::new(serve(echo.clone()).await, 256, 1, true);
        let answers = crowd(&b, users(10)).await;
        let ok = answers.iter().filter(|(_, r, _)| r.is_ok()).count();
        assert_eq!(ok, 1, "stockd answered one entry");
        for (user, r, _) in &answers {
            match r {
                Ok(r) => assert_eq!(r.reservation_id, format!("rid-{user}")),
                Err(s) => {
                    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                    assert!(crate::upstream::fails_over(s), "{s:?}");
                    assert!(crate::upstream::marks_down(s), "{s:?}");
                }
            }
        }
        // The next reservation opens a stream of its own.
        let (_, r, _) = crowd(&b, vec!["later".into()]).await.remove(0);
        assert_eq!(r.unwrap().reservation_id, "rid-later");
        assert_eq!(echo.streams.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_stockd_without_streams_gets_batches_and_one_without_either_unary_calls() {
        // Older stockds: one without the RPC, one whose scope table classifies it admin.
        for needs_admin in [false, true] {
            let echo = Arc::new(Echo {
                no_stream: !needs_admin,
                stream_needs_admin: needs_admin,
                ..Default::default()
            });
            let b = Batcher::new(serve(echo.clone()).await, 256, 2, true);
            let mut some = users(20);
            some[3] = "bad".into();
            each_their_own(&crowd(&b, some.clone()).await);
            each_their_own(&crowd(&b, some).await);
            let batched = echo.batches.lock().unwrap().iter().sum::<usize>();
            assert_eq!(batched, 40, "needs admin {needs_admin}");
            assert!(echo.streams.lock().unwrap().is_empty());
            assert_eq!(*echo.unary.lock().unwrap(), 0);
        }

        let echo = Arc::new(Echo {
            old: true,
            ..Default::default()
        });
        let b = Batcher::new(serve(echo.clone()).await, 256, 2, true);
        for (user, r, _) in crowd(&b, users(20)).await {
            assert_eq!(r.unwrap().reservation_id, format!("rid-{user}"));
        }
        assert_eq!(*echo.unary.lock().unwrap(), 20);
        assert!(b.unary.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn batching_off_is_one_unary_call_each() {
        let echo = Arc::new(Echo::default());
        let b = Batcher::new(serve(echo.clone()).await, 1, 2, true);
        assert!(crowd(&b, users(10)).await.iter().all(|(_, r, _)| r.is_ok()));
        assert_eq!(*echo.unary.lock().unwrap(), 10);
        assert!(echo.batches.lock().unwrap().is_empty());
        assert!(echo.streams.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_dead_endpoint_fails_every_entry_with_a_status_that_fails_over() {
        for stream in [true, false] {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            drop(listener);
            let b = Batcher::new(client(addr), 256, 2, stream);
            for (_, r, _) in crowd(&b, users(10)).await {
                let s = r.expect_err("nobody listens");
                assert!(crate::upstream::fails_over(&s), "stream {stream}: {s:?}");
                assert!(crate::upstream::marks_down(&s), "stream {stream}: {s:?}");
            }
        }
    }

    #[tokio::test]
    async fn an_entry_stockd_answers_unavailable_fails_over_without_marking_the_endpoint_down() {
        // One activity rebuilding: every peer would answer the same, and this endpoint
        // serves every other activity.
        for stream in [true, false] {
            let echo = Arc::new(Echo::default());
            let b = Batcher::new(serve(echo.clone()).await, 256, 2, stream);
            let mut some = users(10);
            some[4] = "rebuilding".into();
            for (user, r, _) in crowd(&b, some).await {
                match r {
                    Ok(r) => assert_eq!(r.reservation_id, format!("rid-{user}")),
                    Err(s) => {
                        assert_eq!(user, "rebuilding");
                        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                        assert!(crate::upstream::fails_over(&s), "stream {stream}: {s:?}");
                        assert!(!crate::upstream::marks_down(&s), "stream {stream}: {s:?}");
                    }
                }
            }
        }
    }
}
