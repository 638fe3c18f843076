//! The fast lane: the answers the edge exists to give cheaply (banned IP, per-IP or
//! route bucket empty, item sold out) written straight to the socket, before pingora
//! builds a session for the request.
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
//! - The sold-out step sees the request's bearer token, as in the pipeline: a reserve
//!   whose token names (unverified) a user holding a unit of the sold-out item is not
//!   refused here but handed to pingora, which authenticates it and asks stockd
//!   (`filters/sold_out.rs`). Everyone else's sold-out answer stays here.
//! - Deadlines are the pipeline's: the read deadline of `deadline.rs` covers a request
//!   from its first byte; an idle connection is closed after 60 s, as pingora closes an
//!   idle HTTP/1.1 keep-alive, or at shutdown.

use crate::answer::Refusal;
use crate::filters::{self, Cx, Flow, EDGE};
use crate::routes;
use crate::shared::{Answered, Shared};
use bytes::{Buf, BytesMut};
use pingora::server::ShutdownWatch;
use seckill_lua::clock::unix_ms;
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
        let path = if shared.access_log() {
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
            // The fast lane answers before any header but the request line is read.
            trace_id: "",
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
    let mut authorization = None;
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
        // As `proxy.rs` reads it (no query-string token outside the events route).
        bearer: crate::auth::bearer(authorization, None, false),
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
    use std::net::Ipv4Addr;

    const DENIED: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9));
    const FREE: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7));

    fn shared() -> Shared {
        crate::shared::for_test("[bans]\ndeny = [\"203.0.113.0/24\"]\n")
    }

    const GET: &[u8] = b"GET /api/v1/activities HTTP/1.1\r\nhost: x\r\n\r\n";

    fn refused_len(s: Scan) -> Option<usize> {
        match s {
            Scan::Refuse { len, answer } => {
                assert!(matches!(answer.refusal, Refusal::Banned));
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

    #[test]
    fn a_sold_out_reserve_is_refused_here_but_for_a_holder_who_goes_to_pingora() {
        use crate::sold_out::{ItemMeta, Meta};
        use base64::Engine as _;
        let sh = shared();
        sh.catalog.replace(vec![Meta {
            id: 1,
            title: "t".into(),
            start_ms: 0,
            end_ms: i64::MAX,
            shards: 2,
            per_user_limit: 1,
            version: 1,
            items: vec![ItemMeta {
                id: 7,
                title: "i".into(),
                price_cents: 200,
                sale_price_cents: 100,
                total: 1,
            }],
            challenge_bits: None,
            cluster: None,
        }]);
        sh.catalog
            .set_holders(1, 7, [Box::from("alice")].into_iter().collect());
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
                Scan::Refuse { len, answer } => {
                    assert!(matches!(answer.refusal, Refusal::SoldOut), "{auth}");
                    assert_eq!(len, req.len());
                }
                _ => panic!("not refused: {auth}"),
            }
        }
        let holder = reserve(&format!("authorization: Bearer {}\r\n", jwt("alice")));
        assert!(matches!(scan(&sh, holder.as_bytes(), FREE), Scan::Pingora));
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
}
