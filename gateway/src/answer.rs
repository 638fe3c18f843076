//! Every answer the edge writes: the refusals of `docs/http-api.md` with their stable
//! codes, and JSON successes. The hot refusals (banned, rate limited, busy, sold out)
//! are built once at start-up ([`Prebuilt`]) and only cloned per request.
//!
//! (Over 400 lines: every refusal with its status, stable code and canned bytes, in one
//! table the fast lane and the pipeline share.)

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;
use serde_json::{json, Value};
use std::borrow::Cow;

use seckill_proto::trace::TraceParent;

/// Why a request was refused. Business outcomes, not errors.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    Banned,
    /// Retry-After seconds.
    RateLimited(u32),
    Busy,
    SoldOut,
    Ended,
    TooEarly {
        start_at_ms: i64,
        server_time_ms: i64,
    },
    /// A missing or refused bearer token; the answer names the reason.
    Unauthenticated(crate::auth::JwtError),
    BadPurchaseToken(&'static str),
    Forbidden,
    NotFound(&'static str),
    MethodNotAllowed,
    PayloadTooLarge,
    UnsupportedMediaType,
    HeadersTooLarge,
    BadRequest(Cow<'static, str>),
    /// Retry-After seconds.
    BackendUnavailable(u64),
    /// The reservation the user already holds.
    Duplicate(String),
    /// The order's final state after losing a transition.
    Conflict(Value),
    /// Fewer units than the quantity asked for are left (this many, >= 1).
    NotEnough {
        remaining: i64,
    },
    /// A purchase token asked without a good proof-of-work solution (`fair::challenge`).
    Challenge(crate::fair::challenge::Rejection),
    /// A waiting-room answer (`crate::fair::room`): its status and stable code.
    Room {
        status: u16,
        code: &'static str,
        message: Cow<'static, str>,
    },
}

/// Outcome labels for metrics and the access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Outcome {
    Ok = 0,
    Reserved,
    Banned,
    RateLimited,
    Busy,
    SoldOut,
    Ended,
    TooEarly,
    Unauthenticated,
    BadPurchaseToken,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    PayloadTooLarge,
    UnsupportedMediaType,
    HeadersTooLarge,
    BadRequest,
    BackendUnavailable,
    Duplicate,
    Conflict,
    ChallengeFailed,
    Closed,
    NotEnough,
    /// Refused by the waiting room (no admission, place lost, kill switch).
    Room,
}

impl Outcome {
    pub const ALL: [Outcome; 24] = [
        Self::Ok,
        Self::Reserved,
        Self::Banned,
        Self::RateLimited,
        Self::Busy,
        Self::SoldOut,
        Self::Ended,
        Self::TooEarly,
        Self::Unauthenticated,
        Self::BadPurchaseToken,
        Self::Forbidden,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::PayloadTooLarge,
        Self::UnsupportedMediaType,
        Self::HeadersTooLarge,
        Self::BadRequest,
        Self::BackendUnavailable,
        Self::Duplicate,
        Self::Conflict,
        Self::ChallengeFailed,
        Self::Closed,
        Self::NotEnough,
        Self::Room,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Reserved => "reserved",
            Self::Banned => "banned",
            Self::RateLimited => "rate_limited",
            Self::Busy => "busy",
            Self::SoldOut => "sold_out",
            Self::Ended => "ended",
            Self::TooEarly => "too_early",
            Self::Unauthenticated => "unauthenticated",
            Self::BadPurchaseToken => "bad_purchase_token",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PayloadTooLarge => "payload_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::HeadersTooLarge => "headers_too_large",
            Self::BadRequest => "bad_request",
            Self::BackendUnavailable => "backend_unavailable",
            Self::Duplicate => "duplicate",
            Self::Conflict => "conflict",
            Self::ChallengeFailed => "challenge_failed",
            Self::Closed => "closed",
            Self::NotEnough => "not_enough_stock",
            Self::Room => "room",
        }
    }
}

impl Refusal {
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Banned => Outcome::Banned,
            Self::RateLimited(_) => Outcome::RateLimited,
            Self::Busy => Outcome::Busy,
            Self::SoldOut => Outcome::SoldOut,
            Self::Ended => Outcome::Ended,
            Self::TooEarly { .. } => Outcome::TooEarly,
            Self::Unauthenticated(_) => Outcome::Unauthenticated,
            Self::BadPurchaseToken(_) => Outcome::BadPurchaseToken,
            Self::Forbidden => Outcome::Forbidden,
            Self::NotFound(_) => Outcome::NotFound,
            Self::MethodNotAllowed => Outcome::MethodNotAllowed,
            Self::PayloadTooLarge => Outcome::PayloadTooLarge,
            Self::UnsupportedMediaType => Outcome::UnsupportedMediaType,
            Self::HeadersTooLarge => Outcome::HeadersTooLarge,
            Self::BadRequest(_) => Outcome::BadRequest,
            Self::BackendUnavailable(_) => Outcome::BackendUnavailable,
            Self::Duplicate(_) => Outcome::Duplicate,
            Self::Conflict(_) => Outcome::Conflict,
            Self::NotEnough { .. } => Outcome::NotEnough,
            Self::Challenge(_) => Outcome::ChallengeFailed,
            Self::Room { .. } => Outcome::Room,
        }
    }

    /// True for refusals that count toward the auto-ban.
    pub fn is_abuse(&self) -> bool {
        match self {
            Self::RateLimited(_) | Self::Unauthenticated(_) | Self::BadPurchaseToken(_) => true,
            Self::Challenge(r) => r.is_abuse(),
            _ => false,
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            Self::Banned | Self::BadPurchaseToken(_) | Self::Forbidden => 403,
            Self::RateLimited(_) | Self::Busy => 429,
            Self::SoldOut | Self::Ended => 410,
            Self::TooEarly { .. } => 425,
            Self::Unauthenticated(_) => 401,
            Self::NotFound(_) => 404,
            Self::MethodNotAllowed => 405,
            Self::PayloadTooLarge => 413,
            Self::UnsupportedMediaType => 415,
            Self::HeadersTooLarge => 431,
            Self::BadRequest(_) => 400,
            Self::BackendUnavailable(_) => 503,
            Self::Duplicate(_) | Self::Conflict(_) | Self::NotEnough { .. } => 409,
            Self::Challenge(r) => r.status(),
            Self::Room { status, .. } => *status,
        }
    }

    fn body(&self) -> Value {
        let (code, message): (&str, Cow<'_, str>) = match self {
            Self::Banned => ("banned", "this client is banned".into()),
            Self::RateLimited(_) => ("rate_limited", "too many requests; retry later".into()),
            Self::Busy => (
                "busy",
                "too many buyers at once for this item; retry".into(),
            ),
            Self::SoldOut => ("sold_out", "sold out".into()),
            Self::Ended => ("ended", "the sale is over".into()),
            Self::TooEarly { .. } => ("too_early", "the sale has not started".into()),
            Self::Unauthenticated(e) => ("unauthenticated", e.message().into()),
            Self::BadPurchaseToken(m) => ("bad_purchase_token", (*m).into()),
            Self::Forbidden => ("forbidden", "not your order".into()),
            Self::NotFound(m) => ("not_found", (*m).into()),
            Self::MethodNotAllowed => ("method_not_allowed", "wrong method for this route".into()),
            Self::PayloadTooLarge => ("payload_too_large", "request body too large".into()),
            Self::UnsupportedMediaType => (
                "unsupported_media_type",
                "send Content-Type: application/json".into(),
            ),
            Self::HeadersTooLarge => (
                "headers_too_large",
                "too many or too large request headers".into(),
            ),
            Self::BadRequest(m) => ("bad_request", m.as_ref().into()),
            Self::BackendUnavailable(_) => (
                "backend_unavailable",
                "the service is unavailable; retry later".into(),
            ),
            Self::Duplicate(_) => ("duplicate", "you already hold this item".into()),
            Self::Conflict(_) => ("conflict", "the order changed state first".into()),
            Self::NotEnough { remaining } => (
                "not_enough_stock",
                format!("only {remaining} left: ask for fewer units").into(),
            ),
            Self::Challenge(r) => (r.code(), r.message().into()),
            Self::Room { code, message, .. } => (code, message.as_ref().into()),
        };
        let mut v = json!({"error": {"code": code, "message": message}});
        match self {
            Self::TooEarly {
                start_at_ms,
                server_time_ms,
            } => {
                v["start_at_ms"] = json!(start_at_ms);
                v["server_time_ms"] = json!(server_time_ms);
            }
            Self::Duplicate(rid) => v["reservation_id"] = json!(rid),
            Self::Unauthenticated(e) => v["error"]["reason"] = json!(e.reason()),
            Self::Conflict(order) => v["order"] = order.clone(),
            Self::NotEnough { remaining } => v["remaining"] = json!(remaining),
            Self::Challenge(crate::fair::challenge::Rejection::Unsolved(i)) => {
                v["error"]["index"] = json!(i)
            }
            _ => {}
        }
        v
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            Self::RateLimited(s) => Some(u64::from(*s)),
            Self::Busy => Some(1),
            Self::BackendUnavailable(s) => Some(*s),
            Self::Room { status: 503, .. } => Some(60),
            _ => None,
        }
    }
}

/// A response ready to clone: header and body, and for the fast lane its status line
/// and headers as pingora puts them on the wire.
pub struct Canned {
    header: ResponseHeader,
    body: Bytes,
    wire_head: Vec<u8>,
}

impl Canned {
    fn build(status: u16, ctype: &str, body: Bytes, extra: &[(&'static str, String)]) -> Self {
        let mut h = ResponseHeader::build_no_case(status, Some(4)).expect("static status");
        h.insert_header("content-type", ctype)
            .expect("static header");
        h.insert_header("content-length", body.len().to_string())
            .expect("static header");
        for (k, v) in extra {
            h.insert_header(*k, v.as_str()).expect("static header");
        }
        let mut wire_head = format!(
            "HTTP/1.1 {} {}\r\n",
            h.status.as_u16(),
            h.status.canonical_reason().unwrap_or("")
        )
        .into_bytes();
        h.header_to_h1_wire(&mut wire_head);
        Self {
            header: h,
            body,
            wire_head,
        }
    }

    /// The whole HTTP/1.1 answer on a kept-alive connection, as pingora writes it: the
    /// headers, then `Date` and `Connection: keep-alive`, then the body.
    fn wire(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.wire_head);
        out.extend_from_slice(b"Date: ");
        out.extend_from_slice(pingora::protocols::http::date::get_cached_date().as_bytes());
        out.extend_from_slice(b"\r\nConnection: keep-alive\r\n\r\n");
        out.extend_from_slice(&self.body);
    }

    fn refusal(r: &Refusal) -> Self {
        Self::refusal_traced(r, None)
    }

    /// A refusal with the request's `trace_id` in the body and its `traceparent`
    /// header (the edge's span), when it has one.
    fn refusal_traced(r: &Refusal, trace: Option<&TraceParent>) -> Self {
        let mut v = r.body();
        let mut extra: Vec<(&'static str, String)> = r
            .retry_after()
            .map(|s| vec![("retry-after", s.to_string())])
            .unwrap_or_default();
        if let Some(t) = trace {
            v["trace_id"] = json!(t.trace_id());
            extra.push(("traceparent", t.to_string()));
        }
        let body = Bytes::from(serde_json::to_vec(&v).expect("json"));
        Self::build(r.status(), "application/json", body, &extra)
    }

    pub async fn send(&self, session: &mut Session) -> Result<()> {
        session
            .write_response_header_ref(&self.header, false)
            .await?;
        session
            .write_response_body(Some(self.body.clone()), true)
            .await
    }
}

/// The hot refusals and the static files, built once.
pub struct Prebuilt {
    banned: Canned,
    /// Index = Retry-After seconds - 1, for 1..=8.
    limited: Vec<Canned>,
    busy: Canned,
    sold_out: Canned,
    index: Canned,
    openapi: Canned,
}

impl Prebuilt {
    pub fn new() -> Self {
        Self {
            banned: Canned::refusal(&Refusal::Banned),
            limited: (1..=8)
                .map(|s| Canned::refusal(&Refusal::RateLimited(s)))
                .collect(),
            busy: Canned::refusal(&Refusal::Busy),
            sold_out: Canned::refusal(&Refusal::SoldOut),
            index: Canned::build(
                200,
                "text/html; charset=utf-8",
                Bytes::from_static(include_bytes!("../static/index.html")),
                &[("cache-control", "no-cache".into())],
            ),
            openapi: Canned::build(
                200,
                "application/json",
                Bytes::from_static(include_bytes!("../static/openapi.json")),
                &[],
            ),
        }
    }

    pub async fn index(&self, session: &mut Session) -> Result<()> {
        self.index.send(session).await
    }

    pub async fn openapi(&self, session: &mut Session) -> Result<()> {
        self.openapi.send(session).await
    }

    /// The canned answer of a hot refusal.
    fn canned(&self, r: &Refusal) -> Option<&Canned> {
        match r {
            Refusal::Banned => Some(&self.banned),
            Refusal::SoldOut => Some(&self.sold_out),
            Refusal::Busy => Some(&self.busy),
            Refusal::RateLimited(s) if (1..=8).contains(s) => Some(&self.limited[*s as usize - 1]),
            _ => None,
        }
    }

    /// Writes a refusal: canned when hot and `canned_ok`, else built with `trace`.
    pub async fn refuse(
        &self,
        session: &mut Session,
        r: &Refusal,
        trace: Option<&TraceParent>,
        canned_ok: bool,
    ) -> Result<()> {
        match self.canned(r).filter(|_| canned_ok) {
            Some(c) => c.send(session).await,
            None => Canned::refusal_traced(r, trace).send(session).await,
        }
    }

    /// Appends the wire form of a hot refusal to `out` (the fast lane); false when `r`
    /// has no canned answer.
    pub fn wire(&self, r: &Refusal, out: &mut Vec<u8>) -> bool {
        match self.canned(r) {
            Some(c) => {
                c.wire(out);
                true
            }
            None => false,
        }
    }

    /// Appends the wire form of what [`Self::refuse`] with `canned_ok` writes: the
    /// canned answer of a hot refusal, else one built with `trace` (the fast lane).
    pub fn wire_refusal(&self, r: &Refusal, trace: Option<&TraceParent>, out: &mut Vec<u8>) {
        if !self.wire(r, out) {
            Canned::refusal_traced(r, trace).wire(out);
        }
    }

    /// Appends the wire form of what [`Self::refuse`] writes: with `canned_ok` as
    /// [`Self::wire_refusal`], else always built with `trace` (the fast lane's answers
    /// after a backend call).
    pub fn wire_refusal_as(
        &self,
        r: &Refusal,
        trace: Option<&TraceParent>,
        canned_ok: bool,
        out: &mut Vec<u8>,
    ) {
        if canned_ok {
            self.wire_refusal(r, trace, out);
        } else {
            Canned::refusal_traced(r, trace).wire(out);
        }
    }
}

impl Default for Prebuilt {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes a JSON success.
pub async fn json(session: &mut Session, status: u16, body: &Value) -> Result<()> {
    json_traced(session, status, body, None).await
}

/// [`json_traced`] for a body already serialized.
pub async fn json_bytes_traced(
    session: &mut Session,
    status: u16,
    body: Bytes,
    trace: Option<&TraceParent>,
) -> Result<()> {
    let mut extra = vec![("cache-control", "no-store".to_string())];
    if let Some(t) = trace {
        extra.push(("traceparent", t.to_string()));
    }
    Canned::build(status, "application/json", body, &extra)
        .send(session)
        .await
}

/// The wire form of [`json_bytes_traced`]'s answer on a kept-alive HTTP/1.1
/// connection, byte for byte as pingora writes it, appended to `out` without building
/// a header map (the fast lane; the test below holds the two forms equal).
pub fn json_wire(status: u16, body: &[u8], trace: Option<&TraceParent>, out: &mut Vec<u8>) {
    json_head(status, body.len(), trace, out);
    out.extend_from_slice(body);
}

/// [`json_wire`] for a body its maker appends to `out` (the challenge issue signs its
/// puzzle where it lies in the answer), so the body needs no buffer of its own. The
/// head goes first with a three-digit `Content-Length` filled in once the body is
/// written: a puzzle's answer is 100..=999 bytes. A body of another length is moved
/// behind a head written again (`{"required":false}`, a very long user id).
pub fn json_wire_with(
    status: u16,
    trace: Option<&TraceParent>,
    out: &mut Vec<u8>,
    body: impl FnOnce(&mut Vec<u8>),
) {
    const GUESS: std::ops::Range<usize> = 100..1000;
    let start = out.len();
    let digits = json_head(status, GUESS.start, trace, out);
    let body_at = out.len();
    body(out);
    let body_len = out.len() - body_at;
    if GUESS.contains(&body_len) {
        out[digits..digits + 3].copy_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
    } else {
        out.drain(start..body_at);
        json_head(status, body_len, trace, out);
        out[start..].rotate_left(body_len);
    }
}

/// The head of [`json_wire`], written without `core::fmt` (the challenge issue is a
/// hot path). Returns where the `Content-Length` digits are in `out`.
fn json_head(
    status: u16,
    body_len: usize,
    trace: Option<&TraceParent>,
    out: &mut Vec<u8>,
) -> usize {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\nContent-Type: application/json\r\nContent-Length: ");
    let digits = out.len();
    push_decimal(out, body_len as u64);
    out.extend_from_slice(b"\r\nCache-Control: no-store\r\n");
    if let Some(t) = trace {
        out.extend_from_slice(b"traceparent: ");
        out.extend_from_slice(t.as_str().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Date: ");
    out.extend_from_slice(pingora::protocols::http::date::get_cached_date().as_bytes());
    out.extend_from_slice(b"\r\nConnection: keep-alive\r\n\r\n");
    digits
}

/// Appends `n` in decimal, as `Display` writes it (without `core::fmt`'s machinery:
/// the fast lane's answers and the puzzle are written with it). `itoa` writes two
/// digits per division, from a table.
pub fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// [`json`] with the request's `traceparent` header (the edge's span), when given.
pub async fn json_traced(
    session: &mut Session,
    status: u16,
    body: &Value,
    trace: Option<&TraceParent>,
) -> Result<()> {
    let bytes = Bytes::from(serde_json::to_vec(body).expect("json"));
    json_bytes_traced(session, status, bytes, trace).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_carry_their_stable_codes_and_extra_fields() {
        let cases = [
            (Refusal::Banned, 403, "banned"),
            (Refusal::RateLimited(2), 429, "rate_limited"),
            (Refusal::Busy, 429, "busy"),
            (Refusal::SoldOut, 410, "sold_out"),
            (Refusal::Ended, 410, "ended"),
            (Refusal::HeadersTooLarge, 431, "headers_too_large"),
            (Refusal::BackendUnavailable(1), 503, "backend_unavailable"),
            (Refusal::Duplicate("1-2-3-a-4".into()), 409, "duplicate"),
            (Refusal::NotEnough { remaining: 2 }, 409, "not_enough_stock"),
        ];
        for (r, status, code) in cases {
            assert_eq!(r.status(), status);
            assert_eq!(r.body()["error"]["code"], code);
            assert!(r.body()["error"]["message"].is_string());
        }
        let early = Refusal::TooEarly {
            start_at_ms: 5,
            server_time_ms: 3,
        }
        .body();
        assert_eq!(early["start_at_ms"], 5);
        assert_eq!(early["server_time_ms"], 3);
        assert_eq!(Refusal::Duplicate("r".into()).body()["reservation_id"], "r");
        assert_eq!(Refusal::NotEnough { remaining: 2 }.body()["remaining"], 2);
        assert_eq!(Refusal::RateLimited(3).retry_after(), Some(3));
        assert_eq!(Refusal::SoldOut.retry_after(), None);
    }

    #[test]
    fn the_fast_lanes_json_wire_is_the_built_answers_byte_for_byte() {
        let trace = TraceParent::start([7; 16], [9; 8]);
        // Short (the head is written again), three digits (filled in), four digits.
        let long = |n: usize| format!(r#"{{"challenge":"{}"}}"#, "x".repeat(n - 16));
        let bodies = [
            r#"{"required":false}"#.to_string(),
            long(100),
            long(531),
            long(999),
            long(1000),
        ];
        for (status, trace) in [(200, Some(&trace)), (200, None), (202, Some(&trace))] {
            for body in &bodies {
                let body = body.as_bytes();
                let mut extra = vec![("cache-control", "no-store".to_string())];
                if let Some(t) = trace {
                    extra.push(("traceparent", t.to_string()));
                }
                let mut built = Vec::new();
                Canned::build(
                    status,
                    "application/json",
                    Bytes::copy_from_slice(body),
                    &extra,
                )
                .wire(&mut built);
                let mut direct = Vec::new();
                json_wire(status, body, trace, &mut direct);
                assert_eq!(
                    String::from_utf8(direct).unwrap(),
                    String::from_utf8(built.clone()).unwrap()
                );
                // The body written by its maker, after an earlier answer.
                let mut in_place = b"earlier answer".to_vec();
                json_wire_with(status, trace, &mut in_place, |out| {
                    out.extend_from_slice(body)
                });
                assert_eq!(in_place[..14], *b"earlier answer");
                assert_eq!(
                    String::from_utf8(in_place[14..].to_vec()).unwrap(),
                    String::from_utf8(built).unwrap()
                );
            }
        }
    }

    #[test]
    fn decimals_are_written_as_display_writes_them() {
        for n in [0, 7, 10, 99, 100, 524_288, 1_764_000_000_000, u64::MAX] {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, n);
            assert_eq!(out, format!("x{n}").into_bytes());
        }
    }
}
