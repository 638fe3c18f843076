//! The fast lane: the answers the edge exists to give cheaply (banned IP, per-IP or
//! route bucket empty, item sold out) written straight to the socket, before pingora
//! builds a session for the request.
//!
//! Why: under a stampede nearly every request ends in one of those refusals, and the
//! cost of an answer is then what the edge's capacity is. Through pingora's proxy
//! session a refusal cost about 8 µs of CPU (half of it user space: the session, its
//! header maps, allocations, the proxy phases) against nginx's 4.3 µs for the same
//! answer on the same machine. Here a request head is parsed in place by `httparse`
//! into a fixed array, the same filters decide ([`IpBan`], [`IpLimit`],
//! [`SoldOutEarly`]), and the canned answer goes out in one write with no allocation.
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
//! - Deadlines are the pipeline's: the read deadline of `deadline.rs` covers a request
//!   from its first byte; an idle connection is closed after 60 s, as pingora closes an
//!   idle HTTP/1.1 keep-alive, or at shutdown.

use crate::answer::Refusal;
use crate::ip_ban::IpBan;
use crate::proxy::{unix_ms, Answered, Cx, Filter, Flow, Shared};
use crate::rate_limit::{IpLimit, Take};
use crate::routes;
use crate::sold_out::SoldOutEarly;
use bytes::{Buf, BytesMut};
use pingora::server::ShutdownWatch;
use std::net::IpAddr;
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
    /// A complete request of `len` bytes (head and body), refused.
    Refuse { len: usize, answer: Refused },
}

/// A refusal decided, with what the metrics and the access log need.
struct Refused {
    refusal: Refusal,
    route: routes::RouteClass,
    client: IpAddr,
    post: bool,
    start: Instant,
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
    loop {
        if *shutdown.borrow() {
            // pingora answers with `Connection: close` while shutting down.
            return Lane::HandOver(buf);
        }
        let (len, answer) = match scan(shared, &buf, peer) {
            Scan::Pingora => return Lane::HandOver(buf),
            Scan::Refuse { len, answer } => (len, answer),
            Scan::Partial => {
                if buf.capacity() - buf.len() < 1024 {
                    buf.reserve(4096);
                }
                let read = if buf.is_empty() {
                    // Between requests: pingora's keep-alive timeout, or shutdown.
                    tokio::select! {
                        r = tokio::time::timeout(KEEPALIVE, io.read_buf(&mut buf)) => r.unwrap_or(Ok(0)),
                        _ = shutdown.changed() => Ok(0),
                    }
                } else {
                    io.read_buf(&mut buf).await
                };
                match read {
                    Ok(0) | Err(_) => return Lane::Closed,
                    Ok(_) => continue,
                }
            }
        };
        out.clear();
        if !shared.prebuilt.wire(&answer.refusal, &mut out) {
            return Lane::HandOver(buf);
        }
        let written = match io.write_all(&out).await {
            Ok(()) => io.flush().await,
            Err(e) => Err(e),
        };
        shared.strike(answer.client, &answer.refusal);
        let path = if shared.cfg.server.access_log {
            path_of(&buf[..len])
        } else {
            String::new()
        };
        shared.answered(Answered {
            route: answer.route,
            outcome: answer.refusal.outcome(),
            elapsed: answer.start.elapsed(),
            method: if answer.post { "POST" } else { "GET" },
            path: &path,
            status: answer.refusal.status(),
            client: answer.client,
            user: "",
            error: if written.is_ok() { "" } else { "write failed" },
        });
        if written.is_err() {
            return Lane::Closed;
        }
        buf.advance(len);
    }
}

/// The request target's path, for the access log (only built when it is on).
fn path_of(request: &[u8]) -> String {
    let line = request.split(|b| *b == b' ').nth(1).unwrap_or_default();
    let path = line.split(|b| *b == b'?').next().unwrap_or_default();
    String::from_utf8_lossy(path).into_owned()
}

/// Parses the request at the front of `buf` and, when it is complete and one of the
/// fast lane's refusals, decides it (with the pipeline's side effects).
fn scan(shared: &Shared, buf: &[u8], peer: IpAddr) -> Scan {
    if buf.is_empty() {
        return Scan::Partial;
    }
    let policy = shared.policy();
    let p = &policy.protection;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() <= p.max_header_bytes + 8192 => {
            return Scan::Partial
        }
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
    let mut cx = Cx {
        shared,
        policy: &policy,
        route: &route,
        client_ip: client,
        now_ms: shared.now_ms(),
        now_unix_ms: unix_ms(),
        bearer: None,
        purchase_token: None,
        user: None,
        item: None,
        admitted: None,
    };
    let start = Instant::now();
    match decide(&mut cx) {
        Some(refusal) => Scan::Refuse {
            len,
            answer: Refused {
                refusal,
                route: route.class(),
                client,
                post,
                start,
            },
        },
        None => Scan::Pingora,
    }
}

/// The pipeline's first steps as they would end for this request, or `None` when they
/// would go on (and then nothing has been taken).
fn decide(cx: &mut Cx<'_>) -> Option<Refusal> {
    if let Flow::Stop(r) = IpBan.check(cx) {
        return Some(r);
    }
    let peeked =
        cx.shared
            .limiter
            .peek_ip(cx.client_ip, cx.route.class(), &cx.policy.limits, cx.now_ms);
    if let Take::Limited { retry_after_secs } = peeked {
        return Some(Refusal::RateLimited(retry_after_secs));
    }
    if let Flow::Stop(sold_out) = SoldOutEarly.check(cx) {
        // The pipeline takes the request's tokens before it answers sold out.
        return Some(match IpLimit.check(cx) {
            Flow::Stop(limited) => limited,
            Flow::Go => sold_out,
        });
    }
    None
}
