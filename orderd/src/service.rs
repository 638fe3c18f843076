//! OrderService over gRPC: parse the request at the door (bad input is
//! `INVALID_ARGUMENT` naming the field, nothing changes), call [`Orders`], convert.
//!
//! Another user's order is `PERMISSION_DENIED`, as `order.proto` specifies (the
//! contract the gateway maps); an unknown id is `NOT_FOUND`.

use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::Stream;
use seckill_daemon::shutdown::Shutdown;
use seckill_lua::ReservationId;
use seckill_proto::pb;
use seckill_proto::pb::order_service_server::OrderService;
use tonic::{Request, Response, Status};
use tracing::instrument;

use crate::error::Error;
use crate::model::{ms, Change, OrderRow};
use crate::orders::Orders;

/// The gRPC face of [`Orders`].
#[derive(Clone, Debug)]
pub struct OrderSvc {
    orders: Orders,
    shutdown: Shutdown,
}

impl OrderSvc {
    pub fn new(orders: Orders, shutdown: Shutdown) -> Self {
        Self { orders, shutdown }
    }
}

fn order_id(s: &str) -> Result<ReservationId, Error> {
    s.parse()
        .map_err(|e: seckill_lua::ids::BadReservationId| Error::invalid("order_id", e.to_string()))
}

/// `user_id` under the one id rule (`seckill_lua::user`); empty is "not given" when
/// the call does not require it.
fn user_id(s: &str, required: bool) -> Result<Option<&str>, Error> {
    if s.is_empty() && !required {
        return Ok(None);
    }
    seckill_lua::user::check_id(s).map_err(|e| Error::invalid("user_id", e.to_string()))?;
    Ok(Some(s))
}

fn change(c: Change, row: OrderRow) -> pb::OrderChange {
    pb::OrderChange {
        outcome: c.to_pb() as i32,
        order: Some(row.to_pb()),
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::Order, Status>> + Send>>;

#[tonic::async_trait]
impl OrderService for OrderSvc {
    #[instrument(skip_all, fields(order = %req.get_ref().order_id))]
    async fn get_order(
        &self,
        req: Request<pb::GetOrderRequest>,
    ) -> Result<Response<pb::Order>, Status> {
        let r = req.into_inner();
        let rid = order_id(&r.order_id)?;
        let user = user_id(&r.user_id, false)?;
        let found = self.orders.get(&rid, user).await?;
        Ok(Response::new(found.to_pb()))
    }

    type WatchOrderStream = WatchStream;

    #[instrument(skip_all, fields(order = %req.get_ref().order_id))]
    async fn watch_order(
        &self,
        req: Request<pb::GetOrderRequest>,
    ) -> Result<Response<Self::WatchOrderStream>, Status> {
        let r = req.into_inner();
        let rid = order_id(&r.order_id)?;
        let user = user_id(&r.user_id, false)?.map(str::to_string);
        // The first read answers errors (not found, another user's) on the call.
        let first = self.orders.get(&rid, user.as_deref()).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let orders = self.orders.clone();
        let shutdown = self.shutdown.clone();
        let cfg = &orders.config.grpc;
        let poll = Duration::from_millis(cfg.watch_poll_ms);
        let lifetime = Duration::from_secs(cfg.watch_max_secs);
        tokio::spawn(async move {
            let started = Instant::now();
            let mut last = first.to_pb();
            let mut done = first.is_final();
            if tx.send(Ok(last.clone())).await.is_err() {
                return;
            }
            while !done && started.elapsed() < lifetime {
                tokio::select! {
                    _ = tokio::time::sleep(poll) => {}
                    _ = shutdown.clone().wait() => return,
                    _ = tx.closed() => return,
                }
                match orders.get(&rid, user.as_deref()).await {
                    Ok(now) => {
                        let pb = now.to_pb();
                        done = now.is_final();
                        if pb.state != last.state || pb.updated_at_ms != last.updated_at_ms {
                            last = pb.clone();
                            if tx.send(Ok(pb)).await.is_err() {
                                return;
                            }
                        }
                    }
                    // Released before it was written (no longer QUEUED): say so, stop.
                    Err(Error::NotFound(_)) => {
                        let _ = tx.send(Err(Status::not_found("order not found"))).await;
                        return;
                    }
                    Err(e) => tracing::debug!(error = %e, "watch poll failed; retrying"),
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    #[instrument(skip_all, fields(user = %req.get_ref().user_id))]
    async fn list_orders(
        &self,
        req: Request<pb::ListOrdersRequest>,
    ) -> Result<Response<pb::ListOrdersResponse>, Status> {
        let r = req.into_inner();
        let user = user_id(&r.user_id, true)?.unwrap_or_default();
        let size = match r.page_size {
            0 => 20,
            n @ 1..=100 => n,
            _ => return Err(Error::invalid("page_size", "must be 0..=100").into()),
        };
        let offset: u64 = if r.page_token.is_empty() {
            0
        } else {
            r.page_token
                .parse()
                .map_err(|_| Error::invalid("page_token", "not a token from a previous page"))?
        };
        let mut rows = self
            .orders
            .db
            .orders_of(user, size + 1, offset)
            .await
            .map_err(Status::from)?;
        let next = if rows.len() > size as usize {
            rows.truncate(size as usize);
            (offset + u64::from(size)).to_string()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListOrdersResponse {
            orders: rows.iter().map(OrderRow::to_pb).collect(),
            next_page_token: next,
        }))
    }

    #[instrument(skip_all, fields(order = %req.get_ref().order_id))]
    async fn pay(&self, req: Request<pb::PayRequest>) -> Result<Response<pb::OrderChange>, Status> {
        let r = req.into_inner();
        let rid = order_id(&r.order_id)?;
        let user = user_id(&r.user_id, true)?.unwrap_or_default();
        let (c, row) = self.orders.pay(&rid, user).await?;
        Ok(Response::new(change(c, row)))
    }

    #[instrument(skip_all, fields(order = %req.get_ref().order_id))]
    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::OrderChange>, Status> {
        let r = req.into_inner();
        let rid = order_id(&r.order_id)?;
        let user = user_id(&r.user_id, true)?.unwrap_or_default();
        let (c, row) = self.orders.cancel(&rid, user).await?;
        Ok(Response::new(change(c, row)))
    }

    #[instrument(skip_all, fields(order = %req.get_ref().order_id, provider_ref = %req.get_ref().provider_ref))]
    async fn payment_callback(
        &self,
        req: Request<pb::PaymentCallbackRequest>,
    ) -> Result<Response<pb::OrderChange>, Status> {
        let r = req.into_inner();
        let rid = order_id(&r.order_id)?;
        if r.amount_cents <= 0 {
            return Err(Error::invalid("amount_cents", "must be positive").into());
        }
        if r.provider_ref.is_empty()
            || r.provider_ref.len() > 128
            || !r.provider_ref.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(Error::invalid(
                "provider_ref",
                "must be 1..=128 printable ASCII characters",
            )
            .into());
        }
        if r.timestamp_ms <= 0 {
            return Err(Error::invalid("timestamp_ms", "must be a positive unix ms time").into());
        }
        if r.signature.is_empty() || r.signature.len() > 128 {
            return Err(Error::invalid("signature", "must be a hex HMAC-SHA256").into());
        }
        let (c, row) = self
            .orders
            .payment_callback(
                &rid,
                r.amount_cents,
                &r.provider_ref,
                r.timestamp_ms,
                &r.signature,
                seckill_lua::clock::now_ms(),
            )
            .await?;
        Ok(Response::new(change(c, row)))
    }

    #[instrument(skip_all)]
    async fn list_dead_letters(
        &self,
        req: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        let r = req.into_inner();
        let limit = match r.limit {
            0 => 100,
            n => n.min(10_000),
        };
        let db = &self.orders.db;
        let rows = db
            .dead_letters(limit, r.include_replayed)
            .await
            .map_err(Status::from)?;
        let total = db.unreplayed_dead_letters().await.map_err(Status::from)?;
        Ok(Response::new(pb::ListDeadLettersResponse {
            dead_letters: rows
                .into_iter()
                .map(|d| pb::DeadLetter {
                    id: d.id,
                    stream: d.stream,
                    entry_id: d.entry_id,
                    reservation_id: d.reservation_id.unwrap_or_default(),
                    payload: d.payload,
                    deliveries: d.deliveries,
                    last_error: d.last_error,
                    created_at_ms: ms(d.created_at),
                    replayed_at_ms: d.replayed_at.map(ms).unwrap_or(0),
                })
                .collect(),
            total_unreplayed: total,
        }))
    }

    #[instrument(skip_all, fields(ids = req.get_ref().ids.len()))]
    async fn replay_dead_letters(
        &self,
        req: Request<pb::ReplayDeadLettersRequest>,
    ) -> Result<Response<pb::ReplayDeadLettersResponse>, Status> {
        let r = req.into_inner();
        if r.ids.len() > 10_000 {
            return Err(Error::invalid("ids", "at most 10000 per call").into());
        }
        let out = self.orders.replay(&r.ids).await?;
        Ok(Response::new(pb::ReplayDeadLettersResponse {
            replayed: out.replayed,
            failed: out.failed,
            errors: out.errors,
        }))
    }
}
