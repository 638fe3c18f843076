//! The gRPC face: thin `StockService` and `AdminService` impls that parse requests
//! into domain types, call [`App`], and map outcomes to responses. Errors become
//! statuses through the one `From<Error> for Status`.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::instrument;

use seckill_proto::pb::{
    self, admin_service_server::AdminService, stock_service_server::StockService,
};

use crate::app::App;
use crate::domain::{positive_id, quantity, request_id, user_id, TRACE_PARENT};
use crate::error::invalid;
use crate::stock::{Release, Reserve};
use seckill_proto::trace::TraceParent;

/// `seckill.v1.StockService`.
#[derive(Clone)]
pub struct StockSvc {
    pub app: Arc<App>,
}

/// `seckill.v1.AdminService`.
#[derive(Clone)]
pub struct AdminSvc {
    pub app: Arc<App>,
}

#[tonic::async_trait]
impl StockService for StockSvc {
    // The hot path: a span at DEBUG, so at the default INFO level no span is built per
    // reservation (one costs a registry slot, an enter and an exit per poll). Warnings
    // on this path name their activity themselves.
    #[instrument(level = "debug", skip_all, fields(a = req.get_ref().activity_id, s = req.get_ref().item_id))]
    async fn reserve(
        &self,
        req: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveResponse>, Status> {
        let trace = req
            .metadata()
            .get(seckill_proto::trace::METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(trace_parent);
        let r = req.into_inner();
        Ok(Response::new(reserve_one(&self.app, r, trace).await?))
    }

    // The edge's path: every entry runs as a Reserve of its own, all at once, so they
    // meet in the shards' group commit like concurrent unary calls would.
    #[instrument(level = "debug", skip_all, fields(n = req.get_ref().entries.len()))]
    async fn reserve_batch(
        &self,
        req: Request<pb::ReserveBatchRequest>,
    ) -> Result<Response<pb::ReserveBatchResponse>, Status> {
        let entries = req.into_inner().entries;
        if entries.is_empty() || entries.len() > MAX_BATCH {
            return Err(invalid(
                "entries",
                format!(
                    "must hold 1..={MAX_BATCH} reservations, not {}",
                    entries.len()
                ),
            )
            .into());
        }
        let started = std::time::Instant::now();
        let results = futures::future::join_all(entries.into_iter().map(|mut e| {
            // Results are in request order here: no tag.
            e.tag = 0;
            reserve_entry(&self.app, e)
        }))
        .await;
        self.app
            .metrics
            .reserve_batch_rpc_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(Response::new(pb::ReserveBatchResponse { results }))
    }

    type ReserveStreamStream = crate::stream::Answers;

    // The edge's path: entries as they come, each answered when its Redis call is done
    // (`crate::stream`).
    async fn reserve_stream(
        &self,
        req: Request<tonic::Streaming<pb::ReserveBatchRequest>>,
    ) -> Result<Response<Self::ReserveStreamStream>, Status> {
        Ok(Response::new(crate::stream::Answers::new(
            Arc::clone(&self.app),
            req.into_inner(),
        )))
    }

    #[instrument(skip_all, fields(rid = %req.get_ref().reservation_id))]
    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let r = req.into_inner();
        let user = user_id("user_id", &r.user_id)?;
        if r.reservation_id.is_empty() {
            return Err(invalid("reservation_id", "must not be empty").into());
        }
        if r.reason.len() > 64 {
            return Err(invalid("reason", "must be at most 64 bytes").into());
        }
        let outcome = match self.app.release(&r.reservation_id, &user).await? {
            Release::Released => pb::ReleaseOutcome::Released,
            Release::NotHeld => pb::ReleaseOutcome::NotHeld,
        };
        tracing::debug!(reason = %r.reason, ?outcome, "release");
        Ok(Response::new(pb::ReleaseResponse {
            outcome: outcome as i32,
        }))
    }

    #[instrument(skip_all, fields(a = req.get_ref().activity_id, s = req.get_ref().item_id))]
    async fn get_stock(
        &self,
        req: Request<pb::GetStockRequest>,
    ) -> Result<Response<pb::GetStockResponse>, Status> {
        let r = req.into_inner();
        let a = positive_id("activity_id", r.activity_id)?;
        let s = positive_id("item_id", r.item_id)?;
        Ok(Response::new(self.app.get_stock(a, s).await?))
    }
}

/// Most entries one `ReserveBatch` may carry.
pub const MAX_BATCH: usize = 1024;

/// The caller's W3C traceparent, validated: a malformed one is dropped, not refused
/// (tracing never fails a sale).
fn trace_parent(tp: &str) -> Option<Arc<str>> {
    TraceParent::parse(tp).map(|t| Arc::<str>::from(t.as_str()))
}

/// One entry of a `ReserveBatch` or `ReserveStream` message, decided as a `Reserve` of
/// its own and answered with the entry's tag.
pub(crate) async fn reserve_entry(app: &Arc<App>, e: pb::ReserveBatchEntry) -> pb::ReserveResult {
    let r = match e.request {
        Some(r) => reserve_one(app, r, trace_parent(&e.traceparent)).await,
        None => Err(Status::from(invalid("request", "must be set"))),
    };
    result(e.tag, r)
}

/// An entry's answer: its outcome, or the status a `Reserve` of its own would have had.
pub(crate) fn result(tag: u64, r: Result<pb::ReserveResponse, Status>) -> pb::ReserveResult {
    match r {
        Ok(response) => pb::ReserveResult {
            code: 0,
            message: String::new(),
            response: Some(response),
            tag,
        },
        Err(status) => pb::ReserveResult {
            code: status.code() as i32,
            message: status.message().to_string(),
            response: None,
            tag,
        },
    }
}

/// One reservation, as `Reserve` answers it: the request parsed at the door (each
/// refusal names its field), [`App::reserve`] under the buyer's trace context, the
/// outcome as a response.
async fn reserve_one(
    app: &Arc<App>,
    r: pb::ReserveRequest,
    trace: Option<Arc<str>>,
) -> Result<pb::ReserveResponse, Status> {
    let a = positive_id("activity_id", r.activity_id)?;
    let s = positive_id("item_id", r.item_id)?;
    let user = user_id("user_id", &r.user_id)?;
    let request = request_id("request_id", &r.request_id)?;
    let units = quantity("quantity", r.quantity)?;
    let (outcome, window) = TRACE_PARENT
        .scope(trace, app.reserve(a, s, &user, &request, units))
        .await?;
    let (start_at_ms, end_at_ms) = window.unwrap_or((0, 0));
    use pb::ReserveOutcome as O;
    let mut item_remaining = 0;
    let (outcome, reservation_id, remaining_hint, quantity) = match outcome {
        Reserve::Reserved {
            reservation_id,
            remaining_hint,
            quantity,
            ..
        } => (O::Reserved, reservation_id, remaining_hint, quantity),
        Reserve::Duplicate {
            reservation_id,
            remaining_hint,
            quantity,
        } => (O::Duplicate, reservation_id, remaining_hint, quantity),
        Reserve::SoldOut => (O::SoldOut, String::new(), 0, 0),
        Reserve::NotEnough { remaining } => {
            item_remaining = remaining;
            (O::NotEnough, String::new(), remaining, 0)
        }
        Reserve::NotStarted => (O::NotStarted, String::new(), 0, 0),
        Reserve::Ended => (O::Ended, String::new(), 0, 0),
        Reserve::NotFound => (O::NotFound, String::new(), 0, 0),
    };
    Ok(pb::ReserveResponse {
        outcome: outcome as i32,
        reservation_id,
        remaining_hint,
        start_at_ms,
        end_at_ms,
        quantity,
        item_remaining,
    })
}

#[tonic::async_trait]
impl AdminService for AdminSvc {
    #[instrument(skip_all, fields(title = %req.get_ref().title))]
    async fn create_activity(
        &self,
        req: Request<pb::CreateActivityRequest>,
    ) -> Result<Response<pb::Activity>, Status> {
        Ok(Response::new(
            self.app.create_activity(req.get_ref()).await?,
        ))
    }

    #[instrument(skip_all, fields(a = req.get_ref().activity_id))]
    async fn get_activity(
        &self,
        req: Request<pb::GetActivityRequest>,
    ) -> Result<Response<pb::Activity>, Status> {
        let a = positive_id("activity_id", req.get_ref().activity_id)?;
        Ok(Response::new(self.app.get_activity(a).await?))
    }

    #[instrument(skip_all)]
    async fn list_activities(
        &self,
        req: Request<pb::ListActivitiesRequest>,
    ) -> Result<Response<pb::ListActivitiesResponse>, Status> {
        let activities = self.app.list_activities(req.get_ref().current_only).await?;
        Ok(Response::new(pb::ListActivitiesResponse { activities }))
    }

    #[instrument(skip_all, fields(a = req.get_ref().activity_id, at = req.get_ref().publish_at_ms))]
    async fn publish_activity(
        &self,
        req: Request<pb::PublishActivityRequest>,
    ) -> Result<Response<pb::PublishActivityResponse>, Status> {
        let r = req.into_inner();
        let a = positive_id("activity_id", r.activity_id)?;
        let (activity, warmed) = self.app.publish(a, r.publish_at_ms).await?;
        Ok(Response::new(pb::PublishActivityResponse {
            activity: Some(activity),
            warmed,
        }))
    }

    #[instrument(skip_all, fields(a = req.get_ref().activity_id))]
    async fn get_activity_status(
        &self,
        req: Request<pb::GetActivityStatusRequest>,
    ) -> Result<Response<pb::ActivityStatusResponse>, Status> {
        let a = positive_id("activity_id", req.get_ref().activity_id)?;
        Ok(Response::new(self.app.activity_status(a).await?))
    }

    #[instrument(skip_all, fields(a = req.get_ref().activity_id, s = req.get_ref().item_id, repair = req.get_ref().repair))]
    async fn reconcile(
        &self,
        req: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        let r = req.into_inner();
        let a = positive_id("activity_id", r.activity_id)?;
        let items = self.app.reconcile(a, r.item_id, r.repair).await?;
        Ok(Response::new(pb::ReconcileResponse { items }))
    }

    #[instrument(skip_all, fields(cidr = %req.get_ref().cidr))]
    async fn ban_ip(
        &self,
        req: Request<pb::BanIpRequest>,
    ) -> Result<Response<pb::BanIpResponse>, Status> {
        let r = req.into_inner();
        self.app.ban(&r.cidr, r.ttl_secs, &r.reason).await?;
        Ok(Response::new(pb::BanIpResponse {}))
    }

    #[instrument(skip_all, fields(cidr = %req.get_ref().cidr))]
    async fn unban_ip(
        &self,
        req: Request<pb::UnbanIpRequest>,
    ) -> Result<Response<pb::UnbanIpResponse>, Status> {
        let removed = self.app.unban(&req.get_ref().cidr).await?;
        Ok(Response::new(pb::UnbanIpResponse { removed }))
    }

    #[instrument(skip_all)]
    async fn list_bans(
        &self,
        _req: Request<pb::ListBansRequest>,
    ) -> Result<Response<pb::ListBansResponse>, Status> {
        Ok(Response::new(pb::ListBansResponse {
            bans: self.app.list_bans().await?,
        }))
    }
}
