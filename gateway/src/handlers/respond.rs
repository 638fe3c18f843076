//! What every handler (and the pipeline's refusals) answers with: the lazily built gRPC
//! [`Clients`], a refusal (canned where hot, counted as a strike when abusive), a JSON
//! answer, an upstream failure mapped to its refusal, and the size- and time-bounded
//! JSON body read.

use pingora::prelude::*;
use pingora::proxy::Session;
use serde_json::Value;

use crate::answer::{self, Outcome, Refusal};
use crate::config;
use crate::forward::Clients;
use crate::proxy::{Ctx, Gateway};

impl Gateway {
    pub(crate) async fn clients(&self) -> Result<&Clients> {
        self.shared
            .clients()
            .await
            .map_err(|e| Error::explain(ErrorType::InternalError, e.to_string()))
    }

    /// A refusal: the hot ones (banned, rate limited, busy, sold out) canned, without a
    /// trace id; every other one built, with the request's `trace_id`.
    pub(crate) async fn refuse(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        r: Refusal,
    ) -> Result<bool> {
        self.refusal(session, ctx, r, true).await
    }

    /// A refusal after the request reached a backend: never canned, so even a hot kind
    /// (stockd's sold out) carries the request's `trace_id`.
    pub(crate) async fn refuse_traced(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        r: Refusal,
    ) -> Result<bool> {
        self.refusal(session, ctx, r, false).await
    }

    async fn refusal(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        r: Refusal,
        canned: bool,
    ) -> Result<bool> {
        ctx.outcome = r.outcome();
        self.shared.strike(ctx.client_ip, &r);
        if matches!(r, Refusal::PayloadTooLarge | Refusal::HeadersTooLarge) {
            session.set_keepalive(None);
        }
        self.shared
            .prebuilt
            .refuse(session, &r, ctx.trace.as_ref(), canned)
            .await?;
        Ok(true)
    }

    pub(crate) async fn ok(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        status: u16,
        body: &Value,
    ) -> Result<bool> {
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        self.ok_bytes(session, ctx, status, bytes.into()).await
    }

    /// [`Self::ok`] for a body already serialized.
    pub(crate) async fn ok_bytes(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        status: u16,
        body: bytes::Bytes,
    ) -> Result<bool> {
        ctx.outcome = if status == 202 {
            Outcome::Reserved
        } else {
            Outcome::Ok
        };
        answer::json_bytes_traced(session, status, body, ctx.trace.as_ref()).await?;
        Ok(true)
    }

    /// Starts a Server-Sent Events answer: 200 `text/event-stream`, unbuffered, the
    /// connection not kept alive after it; the caller writes the events.
    pub(crate) async fn open_event_stream(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let mut h = pingora::http::ResponseHeader::build(200, Some(4))?;
        h.insert_header("content-type", "text/event-stream")?;
        h.insert_header("cache-control", "no-cache")?;
        h.insert_header("x-accel-buffering", "no")?;
        session.set_keepalive(None);
        session.write_response_header(Box::new(h), false).await?;
        ctx.outcome = Outcome::Ok;
        Ok(())
    }

    /// Reads a JSON body under the size limit, within `request_read_ms` (on HTTP/1.1 the
    /// connection's read deadline is the tighter bound; on HTTP/2 this one is the bound,
    /// see `deadline.rs`).
    pub(crate) async fn body(
        &self,
        session: &mut Session,
        protection: &config::Protection,
    ) -> Result<std::result::Result<Value, Refusal>> {
        let max = protection.max_body_bytes;
        let req = session.req_header();
        let ctype = req
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !is_json(ctype) {
            return Ok(Err(Refusal::UnsupportedMediaType));
        }
        let declared = req
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > max) {
            return Ok(Err(Refusal::PayloadTooLarge));
        }
        let mut buf = Vec::with_capacity(declared.unwrap_or(256).min(max));
        let read = async {
            while let Some(chunk) = session.read_request_body().await? {
                if buf.len() + chunk.len() > max {
                    return Ok(false);
                }
                buf.extend_from_slice(&chunk);
            }
            Ok::<_, Box<Error>>(true)
        };
        let limit = std::time::Duration::from_millis(protection.request_read_ms);
        match tokio::time::timeout(limit, read).await {
            Err(_) => {
                return Error::e_explain(
                    ErrorType::ReadTimedout,
                    "request body not read within protection.request_read_ms",
                )
            }
            Ok(Err(e)) => return Err(e),
            Ok(Ok(false)) => return Ok(Err(Refusal::PayloadTooLarge)),
            Ok(Ok(true)) => {}
        }
        Ok(serde_json::from_slice::<Value>(&buf)
            .ok()
            .filter(Value::is_object)
            .ok_or(Refusal::BadRequest("the body is not a JSON object".into())))
    }

    pub(crate) async fn upstream_failed(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        clients: &Clients,
        st: &tonic::Status,
    ) -> Result<bool> {
        if matches!(clients.refusal(st), Refusal::BackendUnavailable(_)) {
            self.shared.metrics.upstream_error("orderd", st.code());
        }
        let r = clients.refusal(st);
        self.refuse_traced(session, ctx, r).await
    }
}

/// A `content-type` value naming `application/json` (parameters aside).
pub(crate) fn is_json(ctype: &str) -> bool {
    ctype
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}
