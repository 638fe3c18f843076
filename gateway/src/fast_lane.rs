//! The fast lane: the answers the edge exists to give cheaply (banned IP, per-IP or
//! route bucket empty, item sold out, and the challenge issue, which writes nothing)
//! and the reservations (the sale itself) written straight to the socket, before
//! pingora builds a session for the request.
//!
//! Why: under a stampede nearly every request ends in one of those refusals, and the
//! cost of an answer is then what the edge's capacity is. Through pingora's proxy
//! session a refusal cost about 8 µs of CPU (half of it user space: the session, its
//! header maps, allocations, the proxy phases) against nginx's 4.3 µs for the same
//! answer on the same machine. Here a request head is parsed in place by `httparse`
//! into a fixed array, the same filters decide (it walks the pipeline's own
//! [`EDGE`] list with peeks), and the canned answer goes out in one write with no allocation.
//!
//! Equivalence with the pipeline (`proxy.rs`), which stays the reference:
//! - Only plain HTTP/1.1 `GET` and `POST` requests that it can frame with certainty are
//!   answered here: no `Transfer-Encoding`, at most one `Content-Length` (at most
//!   `protection.max_body_bytes`), no `Expect`, `Upgrade` or `Connection` other than
//!   `keep-alive`, an origin-form target, within the header limits. Anything else, and
//!   every request the fast lane does not refuse, is handed to pingora with the bytes
//!   read so far, and pingora serves the rest of that connection.
//! - It refuses exactly what the pipeline's first steps would, with the same side
//!   effects: the ban check, then the buckets *peeked* (a limited request takes nothing
//!   in either path), then the sold-out check, before which the pipeline has taken the
//!   request's tokens, so a sold-out answer here takes them too. A request it does not
//!   refuse has changed nothing, and the pipeline runs in full for it.
//! - The answer is the pipeline's byte for byte (status line, headers in the same
//!   order, `Date`, `Connection: keep-alive`, body), and is counted in the same metrics,
//!   access log and auto-ban strikes.
//! - The challenge issue is answered here, refusals included, when the activity's
//!   waiting room needs no admission token: [`EDGE`] and [`AUTHENTICATED`] run for
//!   real (no walk of peeks first: nothing on that path goes to pingora), then the
//!   room's gate and the pipeline's own `handlers::challenge::challenge_body` (see
//!   [`challenge`]).
//! - So is the purchase token of an activity that asks no puzzle, under the same room
//!   condition, through the same [`gated`] path.
//! - A reserve the [`EDGE`] walk lets through is answered here too ([`reserve`]):
//!   [`EDGE`] and [`AUTHENTICATED`] for real, the body by the pipeline's rules, then
//!   the pipeline's own `handlers::reserve::reserve_answer` (its remaining filters and
//!   stockd). The connection waits for stockd's answer.
//! - The sold-out step sees the request's bearer token, as in the pipeline: a reserve
//!   whose token names (unverified) a user holding a unit of the sold-out item is not
//!   refused by it but goes on, authenticated, to stockd (`filters/sold_out.rs`).
//!   Everyone else's sold-out answer stays canned here.
//! - Deadlines are the pipeline's: the read deadline of `deadline.rs` covers a request
//!   from its first byte (and one whose first bytes came with the request before it,
//!   from when the lane goes on to it); an idle connection is closed after 60 s, as
//!   pingora closes an idle HTTP/1.1 keep-alive, or at shutdown. A connection that has not sent its first
//!   request yet is not idle: at shutdown (a graceful upgrade's old process) the lane
//!   waits for that request's head and hands it to pingora, which answers it with
//!   `Connection: close` (pingora alone would drop the connection).

use crate::answer::{self, Outcome, Refusal};
use crate::auth::TokenMemo;
use crate::fair::room::{Gate, Room};
use crate::filters::{self, Cx, Flow, AUTHENTICATED, EDGE};
use crate::handlers::challenge::{challenge_bits, challenge_body};
use crate::handlers::reserve::token_body;
use crate::handlers::reserve::{reserve_answer, ReserveAnswer};
use crate::routes::{self, Route};
use crate::shared::{Answered, Compiled, Shared};
use bytes::{Buf, BytesMut};
use pingora::server::ShutdownWatch;
use seckill_proto::trace::TraceParent;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long an idle HTTP/1.1 connection is kept (pingora's keep-alive default).
pub const KEEPALIVE: Duration = Duration::from_secs(60);

/// Headers parsed in place; a request with more goes to pingora.
const MAX_HEADERS: usize = 32;

/// How the fast lane left a connection.
#[derive(Debug)]
pub enum Lane {
    /// Closed: end of stream, an I/O error, the idle timeout or shutdown.
    Closed,
    /// A request it does not answer starts at the front of these bytes (which may hold
    /// more after it): pingora serves the connection from here.
    HandOver(BytesMut),
}

/// What one scan of the buffer found.
enum Scan {
    /// The head (or the body after it) is not complete yet.
    Partial,
    /// Not a request for the fast lane.
    Pingora,
    /// A complete request of `len` bytes (head and body), answered: the answer's bytes
    /// are in the scan's output buffer.
    Answered { len: usize, answer: Answer },
    /// A complete reserve that the [`EDGE`] walk lets through: answered by [`reserve`].
    Reserve(LaneReserve),
}

/// A reserve request found by the scan, to be answered here (it waits for stockd).
struct LaneReserve {
    /// The policy the scan read (the request keeps it, as the pipeline's does).
    policy: Arc<Compiled>,
    /// Its length (head and body), its head's, and where its `authorization` value is.
    len: usize,
    head_len: usize,
    authorization: Option<std::ops::Range<usize>>,
    /// Its `content-type` is `application/json` (the pipeline's body rule).
    json: bool,
    item: (u64, u64),
    client: IpAddr,
    start: Instant,
    trace: TraceParent,
}

/// An answer decided, with what the strikes, the metrics and the access log need.
struct Answer {
    route: routes::RouteClass,
    outcome: Outcome,
    status: u16,
    /// The refusal, when it is one (a strike toward an auto-ban when abusive).
    refusal: Option<Refusal>,
    client: IpAddr,
    post: bool,
    start: Instant,
    user: Option<String>,
    /// Set where the pipeline's answer carries one (the challenge issue).
    trace: Option<TraceParent>,
}

impl Answer {
    /// A hot refusal of the [`EDGE`] steps, written canned (no trace id, as the
    /// pipeline writes it).
    fn refused(
        refusal: Refusal,
        route: routes::RouteClass,
        client: IpAddr,
        post: bool,
        start: Instant,
    ) -> Self {
        Self {
            route,
            outcome: refusal.outcome(),
            status: refusal.status(),
            refusal: Some(refusal),
            client,
            post,
            start,
            user: None,
            trace: None,
        }
    }
}

/// Serves requests from `io` while they are fast-lane refusals. `peer` is the TCP
/// peer's address (`None` for a non-IP socket: everything goes to pingora).
pub async fn serve<S>(
    shared: &Shared,
    io: &mut S,
    peer: Option<IpAddr>,
    shutdown: &ShutdownWatch,
) -> Lane
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Some(peer) = peer else {
        return Lane::HandOver(BytesMut::new());
    };
    let mut shutdown = shutdown.clone();
    let mut buf = BytesMut::with_capacity(4096);
    let mut out = Vec::with_capacity(512);
    let mut memo = TokenMemo::default();
    // Whether this connection has had an answer here. Until then the client has just
    // connected and its first request is on the way: shutdown does not close it.
    let mut served = false;
    // The read deadline of a request whose first bytes came with the one before: the
    // stream's own (`deadline.rs`) starts at a request's first byte read and ends at
    // the answer's write, so it does not cover bytes already in `buf` then.
    let mut rest_deadline = None;
    loop {
        let stopping = *shutdown.borrow();
        if stopping && (served && buf.is_empty() || head_complete(shared, &buf)) {
            // pingora answers with `Connection: close` while shutting down. It drops a
            // connection whose request head is not all in hand when shutdown comes (or
            // came), so it gets one only with the whole head, or an idle keep-alive.
            return Lane::HandOver(buf);
        }
        out.clear();
        let scanned = if stopping {
            // The rest of the head first (above).
            Scan::Partial
        } else {
            scan(shared, &buf, peer, &mut out, &mut memo)
        };
        let (len, answer) = match scanned {
            Scan::Pingora => return Lane::HandOver(buf),
            Scan::Answered { len, answer } => (len, answer),
            Scan::Reserve(r) => (r.len, reserve(shared, &buf, r, &mut out, &mut memo).await),
            Scan::Partial => {
                if buf.capacity() - buf.len() < 1024 {
                    buf.reserve(4096);
                }
                let read = match (buf.is_empty(), served) {
                    // Between requests: pingora's keep-alive timeout, or shutdown.
                    (true, true) => tokio::select! {
                        r = tokio::time::timeout(KEEPALIVE, io.read_buf(&mut buf)) => r.unwrap_or(Ok(0)),
                        _ = shutdown.changed() => Ok(0),
                    },
                    // A new connection's first request, also after shutdown: it was
                    // accepted while this process held the listener (a graceful upgrade
                    // hands it over mid-stream), and its client is sending. Closing it
                    // would refuse a request that reached us; the grace period bounds
                    // the wait.
                    (true, false) => tokio::time::timeout(KEEPALIVE, io.read_buf(&mut buf))
                        .await
                        .unwrap_or(Ok(0)),
                    // The rest of a request whose first bytes came with the one before.
                    (false, true) => {
                        let limit =
                            Duration::from_millis(shared.policy().protection.request_read_ms);
                        let at = *rest_deadline
                            .get_or_insert_with(|| tokio::time::Instant::now() + limit);
                        tokio::time::timeout_at(at, io.read_buf(&mut buf))
                            .await
                            .unwrap_or(Ok(0))
                    }
                    // The rest of a first request: the stream's deadline covers it.
                    (false, false) => io.read_buf(&mut buf).await,
                };
                match read {
                    Ok(0) | Err(_) => return Lane::Closed,
                    Ok(_) => continue,
                }
            }
        };
        let written = match io.write_all(&out).await {
            Ok(()) => io.flush().await,
            Err(e) => Err(e),
        };
        served = true;
        shared.metrics.fast_lane_answers.inc();
        if let Some(r) = &answer.refusal {
            shared.strike(answer.client, r);
        }
        let path = if shared.access_log() {
            path_of(&buf[..len])
        } else {
            String::new()
        };
        shared.answered(Answered {
            route: answer.route,
            outcome: answer.outcome,
            elapsed: answer.start.elapsed(),
            method: if answer.post { "POST" } else { "GET" },
            path: &path,
            status: answer.status,
            client: answer.client,
            user: answer.user.as_deref().unwrap_or(""),
            trace_id: answer.trace.as_ref().map_or("", |t| t.trace_id()),
            error: if written.is_ok() { "" } else { "write failed" },
        });
        if written.is_err() {
            return Lane::Closed;
        }
        buf.advance(len);
        rest_deadline = None;
    }
}

/// The most bytes a request head may take before the lane stops waiting for its end
/// (`protection.max_header_bytes` counts header names and values only; the slack is
/// for the request line and the framing).
fn head_cap(p: &crate::config::Protection) -> usize {
    p.max_header_bytes + 8192
}

/// Whether `buf` starts with a whole request head: what pingora needs to serve it
/// during shutdown. A head this parser refuses (more headers than [`MAX_HEADERS`], a
/// request line pingora repairs) counts once its end is in `buf` (or `buf` is past the
/// size the scan allows a head): pingora parses it with its own rules.
fn head_complete(shared: &Shared, buf: &[u8]) -> bool {
    if buf.is_empty() {
        return false;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::Request::new(&mut headers).parse(buf) {
        Ok(httparse::Status::Complete(_)) => true,
        Ok(httparse::Status::Partial) => false,
        Err(_) => {
            buf.windows(4).any(|w| w == b"\r\n\r\n")
                || buf.len() > head_cap(&shared.policy().protection)
        }
    }
}

/// The request target's path, for the access log (only built when it is on).
fn path_of(request: &[u8]) -> String {
    let line = request.split(|b| *b == b' ').nth(1).unwrap_or_default();
    let path = line.split(|b| *b == b'?').next().unwrap_or_default();
    String::from_utf8_lossy(path).into_owned()
}

/// Parses the request at the front of `buf` and, when it is complete and one the fast
/// lane answers, decides it (with the pipeline's side effects) and writes the answer
/// to `out`. `memo` is the connection's last verified bearer token.
fn scan(
    shared: &Shared,
    buf: &[u8],
    peer: IpAddr,
    out: &mut Vec<u8>,
    memo: &mut TokenMemo,
) -> Scan {
    if buf.is_empty() {
        return Scan::Partial;
    }
    let policy = shared.policy();
    let p = &policy.protection;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() <= head_cap(p) => return Scan::Partial,
        _ => return Scan::Pingora,
    };
    let post = match req.method {
        Some("POST") => true,
        Some("GET") => false,
        _ => return Scan::Pingora,
    };
    let (Some(1), Some(target)) = (req.version, req.path) else {
        return Scan::Pingora;
    };
    if !target.starts_with('/') || req.headers.len() > p.max_header_count {
        return Scan::Pingora;
    }
    let mut body_len = None;
    let mut xff = None;
    let mut authorization = None;
    let mut traceparent = None;
    let mut ctype = None;
    let mut header_bytes = 0;
    for h in req.headers.iter() {
        header_bytes += h.name.len() + h.value.len();
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok());
            match (body_len, n) {
                (None, Some(n)) if n <= p.max_body_bytes => body_len = Some(n),
                _ => return Scan::Pingora,
            }
        } else if name.eq_ignore_ascii_case(b"x-forwarded-for") {
            if xff.is_some() {
                return Scan::Pingora;
            }
            xff = Some(h.value);
        } else if name.eq_ignore_ascii_case(b"authorization") {
            if authorization.is_some() {
                return Scan::Pingora;
            }
            authorization = Some(h.value);
        } else if name.eq_ignore_ascii_case(b"traceparent") {
            // The pipeline reads the first one (`HeaderMap::get`).
            traceparent = traceparent.or(Some(h.value));
        } else if name.eq_ignore_ascii_case(b"content-type") {
            ctype = ctype.or(Some(h.value));
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"expect")
            || name.eq_ignore_ascii_case(b"upgrade")
            || (name.eq_ignore_ascii_case(b"connection")
                && !h.value.eq_ignore_ascii_case(b"keep-alive"))
        {
            return Scan::Pingora;
        }
    }
    if header_bytes > p.max_header_bytes {
        return Scan::Pingora;
    }
    let len = head_len + body_len.unwrap_or(0);
    if buf.len() < len {
        return Scan::Partial;
    }
    let method = if post {
        http::Method::POST
    } else {
        http::Method::GET
    };
    let path = target.split('?').next().unwrap_or(target);
    let route = routes::route(&method, path);
    let client = crate::ip_ban::client_ip(peer, xff, &policy.lists.trusted);
    // As `proxy.rs` reads it (no query-string token outside the events route).
    let bearer = crate::auth::bearer(authorization, None, false);
    let mut cx = Cx::new(shared, &policy, &route, client, bearer);
    cx.memo = Some(memo);
    let start = Instant::now();
    if let Route::Challenge(a, s) = route {
        // The pipeline makes a trace context for every request and logs its id; the
        // lane does for the route it answers past the refusals.
        let trace = crate::proxy::trace_context(traceparent);
        return match Room::gate_without_token(shared.room.method(a)) {
            Some(gate) => {
                let answer = gated(&mut cx, gate, trace, (post, start), out, |cx, user, out| {
                    challenge_body(
                        cx.shared,
                        cx.client_ip,
                        user,
                        (a, s),
                        (cx.now_ms, cx.now_unix_ms),
                        out,
                    );
                });
                Scan::Answered { len, answer }
            }
            // The room queues: the answer depends on the admission token (pingora),
            // unless the edge refuses first.
            None => match decide(&mut cx) {
                Some(refusal) if shared.prebuilt.wire(&refusal, out) => {
                    let mut answer = Answer::refused(refusal, route.class(), client, post, start);
                    answer.trace = Some(trace);
                    Scan::Answered { len, answer }
                }
                _ => Scan::Pingora,
            },
        };
    }
    if let Route::Token(a, s) = route {
        // Answered here only where the pipeline's handler would neither read the
        // admission token (the room queues) nor redeem a puzzle (a challenge is on):
        // then it is the filters, the room's gate and a signed token, like the issue.
        let gate = Room::gate_without_token(shared.room.method(a));
        let no_puzzle = || challenge_bits(shared, client, a, cx.now_ms) == 0;
        if let Some(gate) = gate.filter(|_| no_puzzle()) {
            let trace = crate::proxy::trace_context(traceparent);
            let answer = gated(&mut cx, gate, trace, (post, start), out, |cx, user, out| {
                let (token, exp) = cx.shared.tokens.issue(user, a, s, cx.now_unix_ms);
                token_body(&token, exp, out);
            });
            return Scan::Answered { len, answer };
        }
    }
    match (decide(&mut cx), &route) {
        (Some(refusal), _) => {
            if !shared.prebuilt.wire(&refusal, out) {
                return Scan::Pingora;
            }
            let answer = Answer::refused(refusal, route.class(), client, post, start);
            Scan::Answered { len, answer }
        }
        (None, &Route::Reserve(a, s)) => {
            let at = |v: &[u8]| {
                let from = v.as_ptr() as usize - buf.as_ptr() as usize;
                from..from + v.len()
            };
            Scan::Reserve(LaneReserve {
                policy,
                len,
                head_len,
                authorization: authorization.map(at),
                json: ctype
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .is_some_and(crate::handlers::respond::is_json),
                item: (a, s),
                client,
                start,
                trace: crate::proxy::trace_context(traceparent),
            })
        }
        (None, _) => Scan::Pingora,
    }
}

/// A reserve (`POST .../items/{s}/reserve`) that the [`EDGE`] steps let through,
/// answered as the pipeline answers it: [`EDGE`] and [`AUTHENTICATED`] run for real
/// (taking their tokens), the body read by the pipeline's rules (415 unless JSON, 400
/// unless an object), then the pipeline's own `handlers::reserve::reserve_answer` (the
/// [`crate::filters::AFTER_BODY`] steps and the stockd call) with a trace context made
/// as `proxy.rs` makes it. Why here: a reservation through pingora's session cost about
/// as much edge CPU again as the reservation's own work (issue 15); the lane answers
/// it on the connection it read it from, as the sold-out answer is.
async fn reserve(
    shared: &Shared,
    buf: &[u8],
    r: LaneReserve,
    out: &mut Vec<u8>,
    memo: &mut TokenMemo,
) -> Answer {
    let policy = &r.policy;
    let (a, s) = r.item;
    let route = Route::Reserve(a, s);
    let authorization = r.authorization.map(|at| &buf[at]);
    let bearer = crate::auth::bearer(authorization, None, false);
    let mut cx = Cx::new(shared, policy, &route, r.client, bearer);
    cx.memo = Some(memo);
    let flow = match filters::run(&EDGE, &mut cx) {
        Flow::Go => filters::run(&AUTHENTICATED, &mut cx),
        stop => stop,
    };
    // The access log names the user once the filters let the request through.
    let mut user = None;
    let decided = match flow {
        Flow::Stop(refusal) => ReserveAnswer::Refused {
            refusal,
            canned: true,
        },
        Flow::Go if !r.json => ReserveAnswer::Refused {
            refusal: Refusal::UnsupportedMediaType,
            canned: true,
        },
        Flow::Go => {
            user = shared.access_log().then(|| cx.user.clone()).flatten();
            match serde_json::from_slice::<serde_json::Value>(&buf[r.head_len..r.len]) {
                Ok(body) if body.is_object() => match shared.clients().await {
                    Ok(clients) => {
                        cx.memo = None;
                        reserve_answer(cx, &body, clients, Some(&r.trace), (a, s)).await
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot build the gRPC clients");
                        ReserveAnswer::Refused {
                            refusal: Refusal::BackendUnavailable(
                                shared.cfg.upstreams.retry_after_secs,
                            ),
                            canned: false,
                        }
                    }
                },
                _ => ReserveAnswer::Refused {
                    refusal: Refusal::BadRequest("the body is not a JSON object".into()),
                    canned: true,
                },
            }
        }
    };
    let (outcome, status, refusal) = match decided {
        ReserveAnswer::Reserved(body) => {
            answer::json_wire(202, &body, Some(&r.trace), out);
            (Outcome::Reserved, 202, None)
        }
        ReserveAnswer::Refused { refusal, canned } => {
            shared
                .prebuilt
                .wire_refusal_as(&refusal, Some(&r.trace), canned, out);
            (refusal.outcome(), refusal.status(), Some(refusal))
        }
    };
    Answer {
        route: route.class(),
        outcome,
        status,
        refusal,
        client: r.client,
        post: true,
        start: r.start,
        user,
        trace: Some(r.trace),
    }
}

/// A challenge issue (`POST .../items/{s}/challenge`) or a purchase token
/// (`POST .../items/{s}/token` of an activity asking no puzzle), answered as the
/// pipeline answers it: [`EDGE`] and [`AUTHENTICATED`] run for real (taking their
/// tokens; no walk of peeks first, since every answer on this path is written here,
/// refusals included), then the room's `gate` (read once by the caller: this path
/// serves only the methods that need no admission token), then `body` writes the
/// answer's JSON for the authenticated user (`handlers::challenge::challenge_body`,
/// or a signed token as `handlers::reserve` writes it), with a trace context made as
/// `proxy.rs` makes it. Neither writes anything anywhere, so answering them here,
/// without pingora's session, is what lets a flood of issues cost about what a flood
/// of sold-out answers costs (issue 14), and every buyer's token in the opening
/// second cost the edge what a refusal costs (issue 15's burst).
fn gated(
    cx: &mut Cx<'_>,
    gate: Gate,
    trace: TraceParent,
    (post, start): (bool, Instant),
    out: &mut Vec<u8>,
    body: impl FnOnce(&Cx<'_>, &str, &mut Vec<u8>),
) -> Answer {
    let flow = match filters::run(&EDGE, cx) {
        Flow::Go => filters::run(&AUTHENTICATED, cx),
        stop => stop,
    };
    // The access log names the user once the filters let the request through, as
    // `proxy.rs` does (a filter's refusal is logged without one).
    let user = match flow {
        Flow::Go => cx.user.take(),
        Flow::Stop(_) => None,
    };
    let refusal = match (flow, gate) {
        (Flow::Stop(r), _) | (Flow::Go, Gate::Refused(r)) => Some(r),
        (Flow::Go, Gate::Open) => None,
    };
    let (outcome, status) = match &refusal {
        Some(r) => {
            // Canned when hot, else with the trace: as `Gateway::refuse` writes it.
            cx.shared.prebuilt.wire_refusal(r, Some(&trace), out);
            (r.outcome(), r.status())
        }
        None => {
            // The body is written straight into `out`, behind its head.
            answer::json_wire_with(200, Some(&trace), out, |out| {
                body(cx, user.as_deref().unwrap_or_default(), out)
            });
            (Outcome::Ok, 200)
        }
    };
    Answer {
        route: cx.route.class(),
        outcome,
        status,
        refusal,
        client: cx.client_ip,
        post,
        start,
        user,
        trace: Some(trace),
    }
}

/// The pipeline's [`EDGE`] steps as they would end for this request, or `None` when
/// they would go on (and then nothing has been taken). The walk peeks; when it ends in
/// a refusal, the steps before the one that refused and that take something (the
/// per-IP and route buckets) are run for real, as the pipeline would have run them, so
/// a sold-out answer takes the request's tokens (and is a 429 when they are gone).
fn decide(cx: &mut Cx<'_>) -> Option<Refusal> {
    let (at, refusal) = filters::peek(&EDGE, cx)?;
    for f in EDGE[..at].iter().filter(|f| f.takes()) {
        if let Flow::Stop(r) = f.check(cx) {
            return Some(r);
        }
    }
    Some(refusal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_lua::clock::unix_ms;
    use std::net::Ipv4Addr;

    const DENIED: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9));
    const FREE: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7));

    fn shared() -> Shared {
        crate::shared::for_test("[bans]\ndeny = [\"203.0.113.0/24\"]\n")
    }

    const GET: &[u8] = b"GET /api/v1/activities HTTP/1.1\r\nhost: x\r\n\r\n";

    /// A scan whose answer bytes are dropped.
    fn scan(shared: &Shared, buf: &[u8], peer: IpAddr) -> Scan {
        super::scan(
            shared,
            buf,
            peer,
            &mut Vec::new(),
            &mut TokenMemo::default(),
        )
    }

    fn refused_len(s: Scan) -> Option<usize> {
        match s {
            Scan::Answered { len, answer } => {
                assert!(matches!(answer.refusal, Some(Refusal::Banned)));
                Some(len)
            }
            _ => None,
        }
    }

    #[test]
    fn a_complete_head_from_a_banned_ip_is_refused_with_its_length() {
        assert_eq!(refused_len(scan(&shared(), GET, DENIED)), Some(GET.len()));
    }

    #[test]
    fn a_request_the_pipeline_would_let_through_goes_to_pingora() {
        assert!(matches!(scan(&shared(), GET, FREE), Scan::Pingora));
    }

    #[test]
    fn a_partial_head_or_body_waits_for_more_bytes() {
        let sh = shared();
        assert!(matches!(scan(&sh, b"", DENIED), Scan::Partial));
        assert!(matches!(
            scan(&sh, &GET[..GET.len() - 2], DENIED),
            Scan::Partial
        ));
        let post = b"POST /x HTTP/1.1\r\ncontent-length: 10\r\n\r\nabc";
        assert!(matches!(scan(&sh, post, DENIED), Scan::Partial));
        let whole = b"POST /x HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc";
        assert_eq!(refused_len(scan(&sh, whole, DENIED)), Some(whole.len()));
    }

    #[test]
    fn pipelined_requests_are_taken_one_at_a_time() {
        let two = [GET, GET].concat();
        assert_eq!(refused_len(scan(&shared(), &two, DENIED)), Some(GET.len()));
    }

    /// Activity 1, open, with one item 7.
    fn one_item_activity(sh: &Shared, challenge_bits: Option<u32>) {
        sh.catalog
            .replace(vec![crate::sold_out::one_item_activity(1, challenge_bits)]);
    }

    /// The answer the lane wrote for `req`, as (status, headers, JSON body).
    fn answered(sh: &Shared, req: &str) -> Option<(Answer, String, serde_json::Value)> {
        let mut out = Vec::new();
        match super::scan(
            sh,
            req.as_bytes(),
            FREE,
            &mut out,
            &mut TokenMemo::default(),
        ) {
            Scan::Answered { len, answer } => {
                assert_eq!(len, req.len());
                let text = String::from_utf8(out).unwrap();
                let (head, body) = text.split_once("\r\n\r\n").unwrap();
                Some((
                    answer,
                    head.to_string(),
                    serde_json::from_str(body).unwrap(),
                ))
            }
            _ => None,
        }
    }

    fn challenge_request(auth: &str) -> String {
        format!(
            "POST /api/v1/activities/1/items/7/challenge HTTP/1.1\r\nhost: x\r\n{auth}\
             traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\r\n"
        )
    }

    #[test]
    fn a_challenge_issue_is_answered_here_with_a_puzzle_for_the_authenticated_user() {
        let sh = shared();
        one_item_activity(&sh, Some(4));
        let (jwt, _) = sh.jwt().issue("alice", 60, unix_ms()).unwrap();
        let req = challenge_request(&format!("authorization: Bearer {jwt}\r\n"));
        let (answer, head, body) = answered(&sh, &req).expect("answered in the lane");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("\r\nCache-Control: no-store\r\n"), "{head}");
        // The caller's trace continued, as the pipeline continues it.
        assert!(head.contains("traceparent: 00-0af7651916cd43dd8448eb211c80319c-"));
        assert_eq!(answer.user.as_deref(), Some("alice"));
        assert_eq!((answer.status, answer.refusal.is_none()), (200, true));
        assert_eq!(body["required"], true);
        assert_eq!(body["bits"], 4);
        // The puzzle verifies for alice on item 7 (everything but the single-use spend).
        let puzzle = body["challenge"].as_str().unwrap();
        let keys = &sh.challenges.settings().keys;
        let v = keys.verify(puzzle, "alice", 1, 7, unix_ms());
        assert_eq!(v.expect("a valid puzzle").bits, 4);
        assert!(keys.verify(puzzle, "bob", 1, 7, unix_ms()).is_err());

        // No challenge on the activity: the same route answers `required: false`.
        one_item_activity(&sh, Some(0));
        let (_, _, body) = answered(&sh, &req).unwrap();
        assert_eq!(body, serde_json::json!({"required": false}));
    }

    #[test]
    fn a_challenge_issue_refused_here_is_traced_and_a_queueing_room_goes_to_pingora() {
        let sh = shared();
        one_item_activity(&sh, Some(4));
        let (_, head, body) = answered(&sh, &challenge_request("")).unwrap();
        assert!(head.starts_with("HTTP/1.1 401 "), "{head}");
        assert_eq!(body["error"]["code"], "unauthenticated");
        assert_eq!(body["trace_id"], "0af7651916cd43dd8448eb211c80319c");
        let (jwt, _) = sh.jwt().issue("alice", 60, unix_ms()).unwrap();
        let auth = format!("authorization: Bearer {jwt}\r\n");
        let (answer, head, body) = answered(
            &sh,
            &challenge_request(&auth).replace("/items/7/", "/items/8/"),
        )
        .unwrap();
        assert!(head.starts_with("HTTP/1.1 404 "), "{head}");
        // Refused by a filter: logged without the user, as the pipeline logs it.
        assert_eq!(answer.user, None);
        assert!(answer.trace.is_some());
        assert_eq!(body["error"]["message"], "no such item");

        for (method, code) in [("fifo", None), ("random", None), ("reject", Some(503))] {
            let sh = crate::shared::for_test(&format!("[room]\nmethod = \"{method}\"\n"));
            one_item_activity(&sh, Some(4));
            let got = answered(&sh, &challenge_request(&auth)).map(|(a, _, _)| a.status);
            assert_eq!(got, code, "{method}");
        }
    }

    #[test]
    fn a_sold_out_reserve_is_refused_here_but_a_holders_goes_on_to_stockd() {
        use base64::Engine as _;
        let sh = shared();
        one_item_activity(&sh, None);
        let seen = sh.catalog.news(1, 7);
        sh.catalog
            .set_holders(1, 7, [Box::from("alice")].into_iter().collect(), seen);
        let jwt = |sub: &str| {
            let b64 = |s: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
            let payload = b64(format!(r#"{{"sub":"{sub}","exp":1}}"#));
            format!("{}.{payload}.sig", b64(r#"{"alg":"HS256"}"#.into()))
        };
        let reserve = |auth: &str| {
            let body = r#"{"purchase_token":"t","request_id":"r"}"#;
            format!(
                "POST /api/v1/activities/1/items/7/reserve HTTP/1.1\r\nhost: x\r\n{auth}\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        for auth in [
            String::new(),
            format!("authorization: Bearer {}\r\n", jwt("carol")),
            "authorization: Bearer garbage\r\n".into(),
        ] {
            let req = reserve(&auth);
            match scan(&sh, req.as_bytes(), FREE) {
                Scan::Answered { len, answer } => {
                    assert!(matches!(answer.refusal, Some(Refusal::SoldOut)), "{auth}");
                    assert_eq!(len, req.len());
                }
                _ => panic!("not refused: {auth}"),
            }
        }
        // The holder's resend is the lane's reserve: authenticated there, then stockd.
        let holder = reserve(&format!("authorization: Bearer {}\r\n", jwt("alice")));
        match scan(&sh, holder.as_bytes(), FREE) {
            Scan::Reserve(r) => assert_eq!((r.item, r.len), ((1, 7), holder.len())),
            _ => panic!("a holder's reserve is not refused"),
        }
    }

    #[test]
    fn what_the_lane_cannot_frame_with_certainty_goes_to_pingora() {
        let sh = shared();
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            (0..70).map(|i| format!("h{i}: v\r\n")).collect::<String>()
        );
        for req in [
            &b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"[..],
            b"POST /x HTTP/1.1\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.1\r\nupgrade: websocket\r\n\r\n",
            b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
            b"HEAD / HTTP/1.1\r\n\r\n",
            b"POST /x HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\nabc",
            b"POST /x HTTP/1.1\r\ncontent-length: 999999\r\n\r\n",
            b"GET http://x/ HTTP/1.1\r\n\r\n",
            many.as_bytes(),
        ] {
            assert!(
                matches!(scan(&sh, req, DENIED), Scan::Pingora),
                "{}",
                String::from_utf8_lossy(req)
            );
        }
    }

    #[tokio::test]
    async fn at_shutdown_a_first_request_is_awaited_and_an_idle_keepalive_closed() {
        use tokio::io::AsyncWriteExt;
        let sh = Arc::new(shared());
        // Shutdown came before the first byte: the lane waits for the whole head (sent
        // in two parts) and hands it to pingora, which answers it `Connection: close`.
        let (_tx, stopped) = tokio::sync::watch::channel(true);
        let (mut client, mut server) = tokio::io::duplex(4096);
        let lane = tokio::spawn({
            let sh = sh.clone();
            async move { serve(&sh, &mut server, Some(FREE), &stopped).await }
        });
        client.write_all(&GET[..10]).await.unwrap();
        tokio::task::yield_now().await;
        client.write_all(&GET[10..]).await.unwrap();
        match lane.await.unwrap() {
            Lane::HandOver(head) => assert_eq!(&head[..], GET),
            Lane::Closed => panic!("a first request was dropped at shutdown"),
        }
        // A connection with an answer behind it is idle keep-alive: shutdown ends it.
        let (tx, running) = tokio::sync::watch::channel(false);
        let (mut client, mut server) = tokio::io::duplex(4096);
        let lane = tokio::spawn({
            let sh = sh.clone();
            async move { serve(&sh, &mut server, Some(DENIED), &running).await }
        });
        client.write_all(GET).await.unwrap();
        let mut answer = [0u8; 12];
        tokio::io::AsyncReadExt::read_exact(&mut client, &mut answer)
            .await
            .unwrap();
        assert_eq!(&answer, b"HTTP/1.1 403");
        tx.send(true).unwrap();
        match lane.await.unwrap() {
            Lane::Closed => {}
            Lane::HandOver(rest) => assert!(rest.is_empty()),
        }
    }

    #[tokio::test]
    async fn at_shutdown_a_head_of_many_headers_is_handed_over_whole() {
        use tokio::io::AsyncWriteExt;
        let sh = Arc::new(shared());
        // More headers than the lane parses: its parser fails before the head ends, and
        // pingora (256 headers) would drop the half handed to it at shutdown.
        let head = format!(
            "GET /api/v1/activities HTTP/1.1\r\n{}\r\n",
            (0..40).map(|i| format!("h{i}: v\r\n")).collect::<String>()
        );
        let (_tx, stopped) = tokio::sync::watch::channel(true);
        let (mut client, mut server) = tokio::io::duplex(4096);
        let lane = tokio::spawn({
            let sh = sh.clone();
            async move { serve(&sh, &mut server, Some(FREE), &stopped).await }
        });
        let cut = head.len() - 40;
        client.write_all(&head.as_bytes()[..cut]).await.unwrap();
        tokio::task::yield_now().await;
        client.write_all(&head.as_bytes()[cut..]).await.unwrap();
        match lane.await.unwrap() {
            Lane::HandOver(got) => assert_eq!(&got[..], head.as_bytes()),
            Lane::Closed => panic!("dropped"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_of_a_next_request_that_stop_are_cut_at_the_read_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let sh = Arc::new(shared());
        let limit = Duration::from_millis(sh.policy().protection.request_read_ms);
        let (_tx, running) = tokio::sync::watch::channel(false);
        let (mut client, mut server) = tokio::io::duplex(4096);
        let started = tokio::time::Instant::now();
        let lane = tokio::spawn({
            let sh = sh.clone();
            async move { serve(&sh, &mut server, Some(DENIED), &running).await }
        });
        // A whole request and the first byte of the next, then nothing: the first is
        // answered, and the second, which the stream's deadline (ended by that answer)
        // does not cover, is cut at the read deadline instead of held for good.
        let mut sent = GET.to_vec();
        sent.push(b'G');
        client.write_all(&sent).await.unwrap();
        let mut answer = [0u8; 12];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HTTP/1.1 403");
        let ended = tokio::time::timeout(limit * 6, lane).await;
        assert!(matches!(ended, Ok(Ok(Lane::Closed))), "not cut: {ended:?}");
        let took = started.elapsed();
        assert!(took >= limit && took < limit * 2, "cut after {took:?}");
    }
}
