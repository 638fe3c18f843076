//! Forwarding the survivors over gRPC (the handlers' client). `reserve` →
//! `StockService.Reserve`; orders → `OrderService` (get, list, watch, pay, cancel,
//! payment callback).
//!
//! One channel per endpoint of each fleet (`[upstreams] stockd`, `orderd`), pooled by
//! tonic (one HTTP/2 connection per endpoint, multiplexed) and created lazily on the
//! proxy's runtime. Every call goes through [`Fleet::call`]: round-robin over the
//! healthy endpoints, failover on a transport error or `UNAVAILABLE`, the whole under
//! the configured deadline (`upstream/mod.rs` says why a second try is safe for each
//! call here). A dead or hung fleet costs at most the deadline and answers 503 with
//! `Retry-After`; gRPC codes map to the HTTP statuses of `docs/http-api.md`.

use crate::answer::Refusal;
use crate::batch::Batcher;
use crate::config::Upstreams;
use crate::upstream::{Fleet, Fleets};
use seckill_proto::auth::AttachToken;
use seckill_proto::pb;
use seckill_proto::pb::order_service_client::OrderServiceClient;
use seckill_proto::pb::stock_service_client::StockServiceClient;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;
use tonic::Code;

/// A stockd endpoint's client.
pub(crate) type Stock = StockServiceClient<InterceptedService<Channel, AttachToken>>;
type Orders = OrderServiceClient<InterceptedService<Channel, AttachToken>>;

/// The gRPC clients of one runtime: one per endpoint, in the fleets' order.
#[derive(Clone)]
pub struct Clients {
    /// Reservations, batched per endpoint (`crate::batch`).
    stock: Arc<[Batcher]>,
    orders: Arc<[Orders]>,
    stock_fleet: Arc<Fleet>,
    order_fleet: Arc<Fleet>,
    reserve_deadline: Duration,
    order_deadline: Duration,
    retry_after: u64,
}

/// What stockd said about a reservation.
#[derive(Debug, Clone, PartialEq)]
pub enum Reserve {
    /// The reservation id and the units it holds.
    Reserved(String, u32),
    /// The reservation the user already holds and its units.
    Duplicate(String, u32),
    SoldOut,
    /// Fewer units than asked for are left (this many, >= 1).
    NotEnough(i64),
    NotStarted {
        start_at_ms: i64,
    },
    Ended,
    NotFound,
}

fn endpoint(url: &str, u: &Upstreams) -> anyhow::Result<Channel> {
    Ok(crate::upstream::dial(url, u)?
        .connect_timeout(Duration::from_millis(u.connect_timeout_ms))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .connect_lazy())
}

/// A request carrying `d` as its gRPC deadline (`grpc-timeout`).
fn req<T>(msg: T, d: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(d);
    r
}

impl Clients {
    /// Must run inside a tokio runtime (channels spawn their workers there).
    pub fn new(u: &Upstreams, fleets: &Fleets) -> anyhow::Result<Self> {
        let token = AttachToken::new(&u.service_token).map_err(|e| anyhow::anyhow!("{e}"))?;
        let stock = fleets
            .stockd
            .endpoints()
            .iter()
            .map(|e| {
                let client =
                    StockServiceClient::with_interceptor(endpoint(&e.url, u)?, token.clone());
                Ok(Batcher::new(
                    client,
                    u.reserve_batch_max,
                    u.reserve_batch_inflight,
                    u.reserve_stream,
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        let orders = fleets
            .orderd
            .endpoints()
            .iter()
            .map(|e| {
                Ok(OrderServiceClient::with_interceptor(
                    endpoint(&e.url, u)?,
                    token.clone(),
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            stock,
            orders,
            stock_fleet: fleets.stockd.clone(),
            order_fleet: fleets.orderd.clone(),
            reserve_deadline: Duration::from_millis(u.reserve_deadline_ms),
            order_deadline: Duration::from_millis(u.order_deadline_ms),
            retry_after: u.retry_after_secs,
        })
    }

    /// Maps a failed call to the client's answer.
    pub fn refusal(&self, s: &tonic::Status) -> Refusal {
        refusal_of(s, self.retry_after)
    }

    /// Safe to try on a second stockd: the same request id answers the same reservation.
    /// `quantity` 0 means 1.
    pub async fn reserve(
        &self,
        (a, s): (u64, u64),
        user: &str,
        request_id: &str,
        quantity: u32,
        traceparent: Option<&str>,
    ) -> Result<(Reserve, i64), tonic::Status> {
        // With the buyer's trace context, for stockd to write into the stream entry.
        let entry = || pb::ReserveBatchEntry {
            request: Some(pb::ReserveRequest {
                activity_id: a,
                item_id: s,
                user_id: user.to_string(),
                request_id: request_id.to_string(),
                quantity,
            }),
            traceparent: traceparent.unwrap_or_default().to_string(),
            tag: 0,
            timeout_ms: 0,
        };
        let r = self
            .stock_fleet
            .call(
                &self.stock,
                self.reserve_deadline,
                |c: Batcher, left| async move { c.reserve(entry, left).await },
            )
            .await?;
        use pb::ReserveOutcome as O;
        let outcome = match O::try_from(r.outcome).unwrap_or(O::Unspecified) {
            O::Reserved => Reserve::Reserved(r.reservation_id, r.quantity.max(1)),
            O::Duplicate => Reserve::Duplicate(r.reservation_id, r.quantity.max(1)),
            O::SoldOut => Reserve::SoldOut,
            O::NotEnough => Reserve::NotEnough(r.item_remaining),
            O::NotStarted => Reserve::NotStarted {
                start_at_ms: r.start_at_ms,
            },
            O::Ended => Reserve::Ended,
            O::NotFound => Reserve::NotFound,
            O::Unspecified => return Err(tonic::Status::unknown("unspecified outcome")),
        };
        Ok((outcome, r.remaining_hint))
    }

    /// A read: safe on any orderd.
    pub async fn get_order(&self, id: &str, user: &str) -> Result<pb::Order, tonic::Status> {
        self.order_fleet
            .call(&self.orders, self.order_deadline, |mut c, left| {
                let msg = pb::GetOrderRequest {
                    order_id: id.to_string(),
                    user_id: user.to_string(),
                };
                async move { c.get_order(req(msg, left)).await }
            })
            .await
    }

    /// A read: safe on any orderd.
    pub async fn list_orders(&self, user: &str) -> Result<Vec<pb::Order>, tonic::Status> {
        let r = self
            .order_fleet
            .call(&self.orders, self.order_deadline, |mut c, left| {
                let msg = pb::ListOrdersRequest {
                    user_id: user.to_string(),
                    page_size: 100,
                    page_token: String::new(),
                };
                async move { c.list_orders(req(msg, left)).await }
            })
            .await?;
        Ok(r.orders)
    }

    /// `PENDING → PAID` is conditional: a second try of an applied pay answers `already`.
    pub async fn pay(&self, id: &str, user: &str) -> Result<pb::OrderChange, tonic::Status> {
        self.order_fleet
            .call(&self.orders, self.order_deadline, |mut c, left| {
                let msg = pb::PayRequest {
                    order_id: id.to_string(),
                    user_id: user.to_string(),
                };
                async move { c.pay(req(msg, left)).await }
            })
            .await
    }

    /// `PENDING → CANCELLED` is conditional, as [`Self::pay`].
    pub async fn cancel(&self, id: &str, user: &str) -> Result<pb::OrderChange, tonic::Status> {
        self.order_fleet
            .call(&self.orders, self.order_deadline, |mut c, left| {
                let msg = pb::CancelRequest {
                    order_id: id.to_string(),
                    user_id: user.to_string(),
                };
                async move { c.cancel(req(msg, left)).await }
            })
            .await
    }

    /// Conditional, as [`Self::pay`] (and keyed by the provider's reference).
    pub async fn payment_callback(
        &self,
        msg: pb::PaymentCallbackRequest,
    ) -> Result<pb::OrderChange, tonic::Status> {
        self.order_fleet
            .call(&self.orders, self.order_deadline, |mut c, left| {
                let msg = msg.clone();
                async move { c.payment_callback(req(msg, left)).await }
            })
            .await
    }

    /// Opens the order's state stream (the first message is the current state). Only
    /// the opening fails over and runs under the deadline; the stream then lives on the
    /// endpoint that opened it.
    pub async fn watch(
        &self,
        id: &str,
        user: &str,
    ) -> Result<tonic::Streaming<pb::Order>, tonic::Status> {
        self.order_fleet
            .call(&self.orders, self.order_deadline, |mut c, _| {
                let msg = pb::GetOrderRequest {
                    order_id: id.to_string(),
                    user_id: user.to_string(),
                };
                async move { c.watch_order(tonic::Request::new(msg)).await }
            })
            .await
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
        // Units the order holds; 1 from an orderd older than the field.
        "quantity": o.quantity.max(1),
        "amount_cents": o.amount_cents,
        "created_at_ms": o.created_at_ms,
        "pay_deadline_ms": o.pay_deadline_ms,
        "paid_at_ms": o.paid_at_ms,
        "updated_at_ms": o.updated_at_ms,
        "failure_reason": o.failure_reason,
    })
}

/// A failed call's status as the client's answer (`Retry-After: retry_after` on 503).
fn refusal_of(s: &tonic::Status, retry_after: u64) -> Refusal {
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
        // stockd's contention answer (buyers took the units it gathered for this one,
        // and some remain): the item is busy, retry; the endpoint is healthy.
        Code::Aborted => Refusal::Busy,
        _ => Refusal::BackendUnavailable(retry_after),
    }
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
        assert_eq!(v["quantity"], 1);
        assert!(!is_final(o.state));
        assert!(is_final(pb::OrderState::Paid as i32));
        let lost = pb::OrderChange {
            outcome: pb::ChangeOutcome::Conflict as i32,
            order: Some(o),
        };
        assert!(matches!(change_answer(&lost), Err(Refusal::Conflict(_))));
    }

    #[test]
    fn contention_is_busy_and_fails_over_nowhere_while_unavailable_is_a_backend_503() {
        let aborted = tonic::Status::aborted("could not gather 1 unit(s) of item 7; retry");
        assert!(matches!(refusal_of(&aborted, 1), Refusal::Busy));
        assert!(!crate::upstream::fails_over(&aborted));
        let unavailable = tonic::Status::unavailable("activity 1 is being rebuilt");
        assert!(matches!(
            refusal_of(&unavailable, 3),
            Refusal::BackendUnavailable(3)
        ));
        assert!(crate::upstream::fails_over(&unavailable));
    }
}
