//! `POST .../items/{s}/token` (a purchase token for the authenticated user, after the
//! proof-of-work redeem when the activity asks one: `handlers/challenge.rs`) and
//! `POST .../items/{s}/reserve`: the body, the [`AFTER_BODY`] filters, then one
//! `StockService.Reserve` call; the answer mapped to 202/409/410/425/404/503.

use crate::fair::room::Gate;
use pingora::prelude::*;
use pingora::proxy::Session;

use crate::answer::Refusal;
use crate::filters::{run, Cx, Flow, AFTER_BODY};
use crate::forward::{Clients, Reserve};
use crate::proxy::{Ctx, Gateway, Req};
use crate::purchase_token::request_id_from_token;
use seckill_proto::trace::TraceParent;
use serde_json::{json, Value};

/// Largest `quantity` a reserve body may name (stockd's largest `per_user_limit`).
const MAX_QUANTITY: u64 = 100;

impl Gateway {
    /// A purchase token for `(a, s)`.
    pub(crate) async fn purchase_token(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
        (a, s): (u64, u64),
    ) -> Result<bool> {
        let shared = &*self.shared;
        let user = req.user.clone();
        let uid = user.as_deref().unwrap_or_default();
        // The waiting room first: an admission token while the room queues (sold-out
        // and window answers came before, in the `window` filter), so a buyer who is
        // not admitted never spends a solved puzzle.
        let headers = &session.req_header().headers;
        if let Gate::Refused(r) = shared.room.gate(a, uid, headers, req.now_unix_ms) {
            return self.refuse(session, ctx, r).await;
        }
        // The proof-of-work challenge, when the activity asks one: a solved, unspent
        // puzzle for this user and item (spent now, once across the fleet), or a 4xx.
        if let Err(r) = self.redeem_challenge(session, ctx, &req, (a, s)).await? {
            return self.refuse(session, ctx, r).await;
        }
        let (token, exp) = shared.tokens.issue(uid, a, s, req.now_unix_ms);
        let mut body = Vec::with_capacity(96);
        token_body(&token, exp, &mut body);
        self.ok_bytes(session, ctx, 200, body.into()).await
    }

    /// A reservation of `(a, s)`.
    pub(crate) async fn reserve(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
        (a, s): (u64, u64),
    ) -> Result<bool> {
        let body = match self.body(session, &req.policy.protection).await? {
            Ok(b) => b,
            Err(r) => return self.refuse(session, ctx, r).await,
        };
        let clients = self.clients().await?;
        let cx = Cx {
            shared: &self.shared,
            policy: req.policy,
            route: req.route,
            client_ip: ctx.client_ip,
            now_ms: req.now_ms,
            now_unix_ms: req.now_unix_ms,
            bearer: None,
            purchase_token: None,
            user: req.user,
            item: req.item,
            admitted: None,
            memo: None,
        };
        match reserve_answer(cx, &body, clients, ctx.trace.as_ref(), (a, s)).await {
            ReserveAnswer::Reserved(body) => self.ok_bytes(session, ctx, 202, body.into()).await,
            ReserveAnswer::Refused {
                refusal,
                canned: true,
            } => self.refuse(session, ctx, refusal).await,
            ReserveAnswer::Refused { refusal, .. } => {
                self.refuse_traced(session, ctx, refusal).await
            }
        }
    }
}

/// How a reserve request ends.
pub(crate) enum ReserveAnswer {
    /// 202, with this JSON body.
    Reserved(Vec<u8>),
    /// A refusal; `canned`: decided before stockd was asked, so a hot kind may go out
    /// canned (after the call every answer carries the trace id).
    Refused { refusal: Refusal, canned: bool },
}

impl ReserveAnswer {
    fn early(refusal: Refusal) -> Self {
        Self::Refused {
            refusal,
            canned: true,
        }
    }
}

/// A reserve request whose [`crate::filters::EDGE`] and [`crate::filters::AUTHENTICATED`]
/// steps let it through (`cx` holds their user and item), decided from its JSON
/// `body`: the body's fields, the [`AFTER_BODY`] filters, then one `StockService`
/// reservation, mapped to the answer. The pipeline (above) and the fast lane
/// (`crate::fast_lane`) both answer with it.
pub(crate) async fn reserve_answer(
    mut cx: Cx<'_>,
    body: &Value,
    clients: &Clients,
    trace: Option<&TraceParent>,
    (a, s): (u64, u64),
) -> ReserveAnswer {
    let token = body.get("purchase_token").and_then(Value::as_str);
    let request_id = match body.get("request_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) if seckill_lua::user::check_id(r).is_ok() => Some(r.as_str()),
        Some(_) => {
            let why = "request_id: 1..=64 printable ASCII characters, no '|'";
            return ReserveAnswer::early(Refusal::BadRequest(why.into()));
        }
    };
    // 1..=100 units (the activity's own per_user_limit is stockd's to check: it
    // answers INVALID_ARGUMENT naming `quantity`, a 400 here); absent or null is 1.
    let quantity = match body.get("quantity") {
        None | Some(Value::Null) => 1,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|q| (1..=MAX_QUANTITY).contains(&q)) => {
            n.as_u64().unwrap_or(1) as u32
        }
        Some(_) => {
            let why =
                "quantity: a whole number of units, 1..=100 and at most the item's per-user limit";
            return ReserveAnswer::early(Refusal::BadRequest(why.into()));
        }
    };
    cx.purchase_token = token;
    if let Flow::Stop(r) = run(&AFTER_BODY, &mut cx) {
        return ReserveAnswer::early(r);
    }
    let admitted = cx.admitted.take();
    let shared = cx.shared;
    let token = token.unwrap_or_default();
    let derived;
    let request_id = match request_id {
        Some(r) => r,
        None => {
            derived = request_id_from_token(token);
            &derived
        }
    };
    let uid = cx.user.as_deref().unwrap_or_default();
    let result = clients
        .reserve((a, s), uid, request_id, quantity, trace.map(|t| t.as_str()))
        .await;
    drop(admitted);
    let trace_id = trace.map_or("", |t| t.trace_id());
    // From here every answer carries the trace id, the hot kinds too.
    let refusal = match result {
        Ok((Reserve::Reserved(rid, quantity), _)) => {
            return ReserveAnswer::Reserved(reserved_body(&rid, quantity, trace_id));
        }
        Ok((Reserve::Duplicate(rid, _), _)) => Refusal::Duplicate(rid),
        Ok((Reserve::NotEnough(remaining), _)) => Refusal::NotEnough { remaining },
        Ok((Reserve::SoldOut, _)) => {
            shared.catalog.report_sold_out_answer(a, s);
            Refusal::SoldOut
        }
        Ok((Reserve::NotStarted { start_at_ms }, _)) => Refusal::TooEarly {
            start_at_ms,
            server_time_ms: cx.now_unix_ms as i64,
        },
        Ok((Reserve::Ended, _)) => Refusal::Ended,
        Ok((Reserve::NotFound, _)) => Refusal::NotFound("no such item"),
        Err(status) => {
            shared.metrics.upstream_error("stockd", status.code());
            clients.refusal(&status)
        }
    };
    ReserveAnswer::Refused {
        refusal,
        canned: false,
    }
}

/// The 202 body: `{"order_id", "quantity", "reservation_id", "state", "trace_id"}`.
fn reserved_body(rid: &str, quantity: u32, trace_id: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"reservation_id": rid, "order_id": rid, "state": "QUEUED",
        "quantity": quantity, "trace_id": trace_id}),
    )
    .unwrap_or_default()
}

/// The purchase token's answer, `{"expires_at_ms":<exp>,"purchase_token":"<token>"}`,
/// appended to `out` (the pipeline and the fast lane both answer with it). The token
/// is `<exp>.<base64url>`: nothing in it needs escaping.
pub(crate) fn token_body(token: &str, exp: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"expires_at_ms\":");
    crate::answer::push_decimal(out, exp);
    out.extend_from_slice(b",\"purchase_token\":\"");
    out.extend_from_slice(token.as_bytes());
    out.extend_from_slice(b"\"}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_token_answer_is_the_json_serde_writes() {
        let mut out = Vec::new();
        super::token_body("1700000000000.abc-_Z", 1_700_000_000_000, &mut out);
        let want = serde_json::json!({"purchase_token": "1700000000000.abc-_Z",
            "expires_at_ms": 1_700_000_000_000u64});
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&out).unwrap(),
            want
        );
        assert_eq!(out, serde_json::to_vec(&want).unwrap());
    }
}
