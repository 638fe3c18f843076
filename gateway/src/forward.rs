//! Forwarding the survivors over gRPC (the handlers' client). `reserve` → `StockService.Reserve`;
//! orders → `OrderService` (get, list, watch, pay, cancel, payment callback).
//!
//! Channels are pooled by tonic (one HTTP/2 connection per upstream, multiplexed) and
//! created lazily on the proxy's runtime. Every unary call runs under the configured
//! deadline, so a dead or hung backend costs at most that and answers 503 with
//! `Retry-After`; gRPC codes map to the HTTP statuses of `docs/http-api.md`.

use crate::answer::Refusal;
use crate::config::Upstreams;
use seckill_proto::auth::AttachToken;
use seckill_proto::pb;
use seckill_proto::pb::order_service_client::OrderServiceClient;
use seckill_proto::pb::stock_service_client::StockServiceClient;
use serde_json::{json, Value};
use std::time::Duration;
use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

type Stock = StockServiceClient<InterceptedService<Channel, AttachToken>>;
type Orders = OrderServiceClient<InterceptedService<Channel, AttachToken>>;

/// The gRPC clients of one runtime.
#[derive(Clone)]
pub struct Clients {
    stock: Stock,
    orders: Orders,
    reserve_deadline: Duration,
    order_deadline: Duration,
    retry_after: u64,
}

/// What stockd said about a reservation.
#[derive(Debug, Clone, PartialEq)]
pub enum Reserve {
    Reserved(String),
    Duplicate(String),
    SoldOut,
    NotStarted { start_at_ms: i64 },
    Ended,
    NotFound,
}

fn endpoint(url: &str, u: &Upstreams) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(url.to_string())?
        .connect_timeout(Duration::from_millis(u.connect_timeout_ms))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .connect_lazy())
}

impl Clients {
    /// Must run inside a tokio runtime (channels spawn their workers there).
    pub fn new(u: &Upstreams) -> anyhow::Result<Self> {
        let token = AttachToken::new(&u.service_token).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Self {
            stock: StockServiceClient::with_interceptor(endpoint(&u.stockd, u)?, token.clone()),
            orders: OrderServiceClient::with_interceptor(endpoint(&u.orderd, u)?, token),
            reserve_deadline: Duration::from_millis(u.reserve_deadline_ms),
            order_deadline: Duration::from_millis(u.order_deadline_ms),
            retry_after: u.retry_after_secs,
        })
    }

    /// Maps a failed call to the client's answer.
    pub fn refusal(&self, s: &tonic::Status) -> Refusal {
        match s.code() {
            Code::InvalidArgument | Code::OutOfRange => {
                Refusal::BadRequest(s.message().to_string().into())
            }
            Code::NotFound => Refusal::NotFound("not found"),
            // A refusal of our own token's scope is an operator's problem: 503 below.
            Code::PermissionDenied if !seckill_proto::auth::is_service_token_refusal(s) => {
                Refusal::Forbidden
            }
            Code::FailedPrecondition | Code::AlreadyExists => Refusal::Conflict(Value::Null),
            _ => Refusal::BackendUnavailable(self.retry_after),
        }
    }

    async fn deadline<T>(
        d: Duration,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        match tokio::time::timeout(d, call).await {
            Ok(r) => r.map(tonic::Response::into_inner),
            Err(_) => Err(tonic::Status::deadline_exceeded("upstream deadline")),
        }
    }

    fn req<T>(&self, msg: T, d: Duration) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(d);
        r
    }

    pub async fn reserve(
        &self,
        a: u64,
        s: u64,
        user: &str,
        request_id: &str,
        traceparent: Option<&str>,
    ) -> Result<(Reserve, i64), tonic::Status> {
        let mut c = self.stock.clone();
        let msg = pb::ReserveRequest {
            activity_id: a,
            item_id: s,
            user_id: user.to_string(),
            request_id: request_id.to_string(),
        };
        let mut req = self.req(msg, self.reserve_deadline);
        // The buyer's trace context, for stockd to write into the stream entry.
        if let Some(tp) = traceparent.and_then(|t| t.parse().ok()) {
            req.metadata_mut()
                .insert(seckill_proto::trace::METADATA, tp);
        }
        let r = Self::deadline(self.reserve_deadline, c.reserve(req)).await?;
        use pb::ReserveOutcome as O;
        let outcome = match O::try_from(r.outcome).unwrap_or(O::Unspecified) {
            O::Reserved => Reserve::Reserved(r.reservation_id),
            O::Duplicate => Reserve::Duplicate(r.reservation_id),
            O::SoldOut => Reserve::SoldOut,
            O::NotStarted => Reserve::NotStarted {
                start_at_ms: r.start_at_ms,
            },
            O::Ended => Reserve::Ended,
            O::NotFound => Reserve::NotFound,
            O::Unspecified => return Err(tonic::Status::unknown("unspecified outcome")),
        };
        Ok((outcome, r.remaining_hint))
    }

    pub async fn get_order(&self, id: &str, user: &str) -> Result<pb::Order, tonic::Status> {
        let mut c = self.orders.clone();
        let msg = pb::GetOrderRequest {
            order_id: id.to_string(),
            user_id: user.to_string(),
        };
        Self::deadline(
            self.order_deadline,
            c.get_order(self.req(msg, self.order_deadline)),
        )
        .await
    }

    pub async fn list_orders(&self, user: &str) -> Result<Vec<pb::Order>, tonic::Status> {
        let mut c = self.orders.clone();
        let msg = pb::ListOrdersRequest {
            user_id: user.to_string(),
            page_size: 100,
            page_token: String::new(),
        };
        Ok(Self::deadline(
            self.order_deadline,
            c.list_orders(self.req(msg, self.order_deadline)),
        )
        .await?
        .orders)
    }

    pub async fn pay(&self, id: &str, user: &str) -> Result<pb::OrderChange, tonic::Status> {
        let mut c = self.orders.clone();
        let msg = pb::PayRequest {
            order_id: id.to_string(),
            user_id: user.to_string(),
        };
        Self::deadline(
            self.order_deadline,
            c.pay(self.req(msg, self.order_deadline)),
        )
        .await
    }

    pub async fn cancel(&self, id: &str, user: &str) -> Result<pb::OrderChange, tonic::Status> {
        let mut c = self.orders.clone();
        let msg = pb::CancelRequest {
            order_id: id.to_string(),
            user_id: user.to_string(),
        };
        Self::deadline(
            self.order_deadline,
            c.cancel(self.req(msg, self.order_deadline)),
        )
        .await
    }

    pub async fn payment_callback(
        &self,
        msg: pb::PaymentCallbackRequest,
    ) -> Result<pb::OrderChange, tonic::Status> {
        let mut c = self.orders.clone();
        Self::deadline(
            self.order_deadline,
            c.payment_callback(self.req(msg, self.order_deadline)),
        )
        .await
    }

    /// Opens the order's state stream (the first message is the current state).
    pub async fn watch(
        &self,
        id: &str,
        user: &str,
    ) -> Result<tonic::Streaming<pb::Order>, tonic::Status> {
        let mut c = self.orders.clone();
        let msg = pb::GetOrderRequest {
            order_id: id.to_string(),
            user_id: user.to_string(),
        };
        Self::deadline(self.order_deadline, c.watch_order(tonic::Request::new(msg))).await
    }
}

/// The state names of the HTTP API.
pub fn state_name(state: i32) -> &'static str {
    use pb::OrderState as S;
    match S::try_from(state).unwrap_or(S::Unspecified) {
        S::Queued => "QUEUED",
        S::PendingPayment => "PENDING_PAYMENT",
        S::Paid => "PAID",
        S::Cancelled => "CANCELLED",
        S::Failed => "FAILED",
        S::Unspecified => "QUEUED",
    }
}

/// True for PAID, CANCELLED and FAILED.
pub fn is_final(state: i32) -> bool {
    matches!(state_name(state), "PAID" | "CANCELLED" | "FAILED")
}

/// The `Order` object of the HTTP API.
pub fn order_json(o: &pb::Order) -> Value {
    json!({
        "id": o.id,
        "activity_id": o.activity_id,
        "item_id": o.item_id,
        "state": state_name(o.state),
        "amount_cents": o.amount_cents,
        "created_at_ms": o.created_at_ms,
        "pay_deadline_ms": o.pay_deadline_ms,
        "paid_at_ms": o.paid_at_ms,
        "updated_at_ms": o.updated_at_ms,
        "failure_reason": o.failure_reason,
    })
}

/// The answer to pay, cancel and the payment callback.
pub fn change_answer(c: &pb::OrderChange) -> Result<Value, Refusal> {
    let order = c.order.as_ref().map(order_json).unwrap_or(Value::Null);
    use pb::ChangeOutcome as C;
    match C::try_from(c.outcome).unwrap_or(C::Unspecified) {
        C::Applied => Ok(json!({"outcome": "applied", "order": order})),
        C::Already => Ok(json!({"outcome": "already", "order": order})),
        C::Conflict | C::Unspecified => Err(Refusal::Conflict(order)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_map_to_the_api_shape() {
        let o = pb::Order {
            id: "1-7-0-a-1".into(),
            activity_id: 1,
            item_id: 7,
            state: pb::OrderState::PendingPayment as i32,
            amount_cents: 19900,
            ..Default::default()
        };
        let v = order_json(&o);
        assert_eq!(v["state"], "PENDING_PAYMENT");
        assert_eq!(v["amount_cents"], 19900);
        assert!(!is_final(o.state));
        assert!(is_final(pb::OrderState::Paid as i32));
        let lost = pb::OrderChange {
            outcome: pb::ChangeOutcome::Conflict as i32,
            order: Some(o),
        };
        assert!(matches!(change_answer(&lost), Err(Refusal::Conflict(_))));
    }
}
