//! `POST /api/v1/payments/callback`: the payment provider's signed webhook, passed to
//! `OrderService.PaymentCallback`; a bad signature is the caller's 4xx, our own service
//! token refused is a 503 (told apart by the refusal's mark, not its message).

use pingora::prelude::*;
use pingora::proxy::Session;

use crate::answer::Refusal;
use crate::forward;
use crate::proxy::{Ctx, Gateway, Req};
use serde_json::Value;

impl Gateway {
    /// The webhook.
    pub(crate) async fn payment_callback(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
    ) -> Result<bool> {
        let body = match self.body(session, &req.policy.protection).await? {
            Ok(b) => b,
            Err(r) => return self.refuse(session, ctx, r).await,
        };
        let msg = match callback_request(&body) {
            Ok(m) => m,
            Err(r) => return self.refuse(session, ctx, r).await,
        };
        let clients = self.clients().await?;
        match clients.payment_callback(msg).await {
            Ok(change) => match forward::change_answer(&change) {
                Ok(v) => self.ok(session, ctx, 200, &v).await,
                Err(r) => self.refuse(session, ctx, r).await,
            },
            Err(st)
                if matches!(
                    st.code(),
                    tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                ) && !seckill_proto::auth::is_service_token_refusal(&st) =>
            {
                let r = Refusal::BadRequest(st.message().to_string().into());
                self.refuse(session, ctx, r).await
            }
            Err(st) => self.upstream_failed(session, ctx, clients, &st).await,
        }
    }
}

fn callback_request(
    body: &Value,
) -> std::result::Result<seckill_proto::pb::PaymentCallbackRequest, Refusal> {
    let s = |k: &'static str| {
        body.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or(Refusal::BadRequest(format!("{k}: required string").into()))
    };
    let n = |k: &'static str| {
        body.get(k)
            .and_then(Value::as_i64)
            .ok_or(Refusal::BadRequest(format!("{k}: required integer").into()))
    };
    Ok(seckill_proto::pb::PaymentCallbackRequest {
        order_id: s("order_id")?,
        amount_cents: n("amount_cents")?,
        provider_ref: s("provider_ref")?,
        timestamp_ms: n("timestamp_ms")?,
        signature: s("signature")?,
    })
}
