//! pingora's `ProxyHttp` for the edge: every request is answered in
//! `request_filter`, nothing is proxied over HTTP. [`Gateway::handle`] only sequences:
//!
//! - the header limits (431) and the route (404/405);
//! - the filters of [`crate::filters`]: [`EDGE`], then [`AUTHENTICATED`];
//! - the route's handler in [`crate::handlers`] (a reserve runs the
//!   [`crate::filters::AFTER_BODY`] filters once its body is read).
//!
//! What the handlers share (the gRPC clients, the refusal and JSON answers, the
//! bounded body read) is in `handlers/respond.rs`.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};
use seckill_lua::clock::unix_ms;

use crate::answer::{Outcome, Refusal};
use crate::filters::{run, Cx, Flow, AUTHENTICATED, EDGE};
use crate::routes::{self, Route, RouteClass};
use crate::shared::{Answered, Compiled, Shared};
use crate::sold_out::ItemLive;
use seckill_proto::trace::TraceParent;

/// What the pipeline learnt of a request before its handler runs.
pub(crate) struct Req<'a> {
    /// The policy the request started with (a SIGHUP mid-request does not change it).
    pub policy: &'a Compiled,
    pub route: &'a Route,
    /// The authenticated user, on routes that need one.
    pub user: Option<String>,
    /// The item [`crate::filters::Window`] found (token and reserve).
    pub item: Option<Arc<ItemLive>>,
    /// Gateway monotonic ms and wall-clock ms at the start of the request.
    pub now_ms: u64,
    pub now_unix_ms: u64,
}

/// Per-request state kept by pingora between phases.
pub struct Ctx {
    start: Instant,
    route: RouteClass,
    pub(crate) outcome: Outcome,
    status: u16,
    pub(crate) client_ip: IpAddr,
    user: Option<String>,
    /// This request's trace context: the caller's trace (a valid `traceparent` header)
    /// or a new one, with the edge's own span id; sent to stockd, shown in the access
    /// log and in the JSON answers as `trace_id`.
    pub(crate) trace: Option<TraceParent>,
}

/// The trace context of a request: a valid incoming `traceparent` continued with a new
/// span id, else a new trace (a malformed header is replaced, never refused).
pub(crate) fn trace_context(header: Option<&[u8]>) -> TraceParent {
    let span: [u8; 8] = rand::random();
    match header
        .and_then(|h| std::str::from_utf8(h).ok())
        .and_then(TraceParent::parse)
    {
        Some(incoming) => incoming.child(span),
        None => TraceParent::start(rand::random(), span),
    }
}

/// The `ProxyHttp` implementation.
pub struct Gateway {
    pub(crate) shared: Arc<Shared>,
}

impl Gateway {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    async fn handle(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let shared = &*self.shared;
        let policy = shared.policy();
        let now_ms = shared.now_ms();
        let now_unix_ms = unix_ms();
        ctx.trace = Some(trace_context(
            session
                .req_header()
                .headers
                .get(seckill_proto::trace::METADATA)
                .map(|v| v.as_bytes()),
        ));

        let route;
        let flow;
        let mut user = None;
        let mut item = None;
        {
            let req = session.req_header();
            let p = &policy.protection;
            if req.headers.len() > p.max_header_count
                || req
                    .headers
                    .iter()
                    .map(|(k, v)| k.as_str().len() + v.len())
                    .sum::<usize>()
                    > p.max_header_bytes
            {
                return self.refuse(session, ctx, Refusal::HeadersTooLarge).await;
            }
            route = routes::route(&req.method, req.uri.path());
            ctx.route = route.class();
            let peer = session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip())
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            let req = session.req_header();
            ctx.client_ip = crate::ip_ban::client_ip(
                peer,
                req.headers.get("x-forwarded-for").map(|v| v.as_bytes()),
                &policy.lists.trusted,
            );
            let bearer = crate::auth::bearer(
                req.headers
                    .get(http::header::AUTHORIZATION)
                    .map(|v| v.as_bytes()),
                req.uri.query(),
                matches!(route, Route::OrderEvents(_) | Route::RoomEvents(_)),
            );
            let mut cx = Cx {
                shared,
                policy: &policy,
                route: &route,
                client_ip: ctx.client_ip,
                now_ms,
                now_unix_ms,
                bearer,
                purchase_token: None,
                user: None,
                item: None,
                admitted: None,
                memo: None,
            };
            flow = match run(&EDGE, &mut cx) {
                Flow::Go => run(&AUTHENTICATED, &mut cx),
                stop => stop,
            };
            if matches!(flow, Flow::Go) {
                user = cx.user.take();
                item = cx.item.take();
            }
        }
        if let Flow::Stop(r) = flow {
            return self.refuse(session, ctx, r).await;
        }
        ctx.user = user.clone();

        let req = Req {
            policy: &policy,
            route: &route,
            user,
            item,
            now_ms,
            now_unix_ms,
        };
        match &route {
            Route::NotFound => {
                self.refuse(session, ctx, Refusal::NotFound("no such route"))
                    .await
            }
            Route::WrongMethod => self.refuse(session, ctx, Refusal::MethodNotAllowed).await,
            Route::Index => {
                ctx.outcome = Outcome::Ok;
                shared.prebuilt.index(session).await?;
                Ok(true)
            }
            Route::OpenApi => {
                ctx.outcome = Outcome::Ok;
                shared.prebuilt.openapi(session).await?;
                Ok(true)
            }
            Route::ListActivities => self.list_activities(session, ctx, req).await,
            Route::GetActivity(a) => self.get_activity(session, ctx, req, *a).await,
            Route::DevToken => self.dev_token(session, ctx, req).await,
            Route::Token(a, s) => self.purchase_token(session, ctx, req, (*a, *s)).await,
            Route::Challenge(a, s) => self.challenge(session, ctx, req, (*a, *s)).await,
            Route::Reserve(a, s) => self.reserve(session, ctx, req, (*a, *s)).await,
            Route::ListOrders => self.list_orders(session, ctx, req).await,
            Route::GetOrder(id) => self.get_order(session, ctx, req, id).await,
            Route::Pay(id) | Route::Cancel(id) => self.pay_or_cancel(session, ctx, req, id).await,
            Route::PaymentCallback => self.payment_callback(session, ctx, req).await,
            Route::OrderEvents(id) => self.order_events(session, ctx, req, id).await,
            Route::RoomStatus(a) => self.room_status(session, ctx, *a).await,
            Route::RoomJoin(a) => self.room_join(session, ctx, req, *a).await,
            Route::RoomBeat(a) => self.room_beat(session, ctx, req, *a).await,
            Route::RoomEvents(a) => self.room_events(session, ctx, req, *a).await,
        }
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            start: Instant::now(),
            route: RouteClass::Other,
            outcome: Outcome::Closed,
            status: 0,
            client_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            user: None,
            trace: None,
        }
    }

    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {
        // No compression module: every answer is small or already compact, and an unused
        // module still costs a context per request.
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        ctx.start = Instant::now();
        self.handle(session, ctx).await
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        Error::e_explain(ErrorType::InternalError, "the gateway has no HTTP upstream")
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        ctx.status = session
            .response_written()
            .map(|h| h.status.as_u16())
            .unwrap_or(0);
        let req = session.req_header();
        let error = e.map(|e| e.to_string()).unwrap_or_default();
        self.shared.answered(Answered {
            route: ctx.route,
            outcome: ctx.outcome,
            elapsed: ctx.start.elapsed(),
            method: req.method.as_str(),
            path: req.uri.path(),
            status: ctx.status,
            client: ctx.client_ip,
            user: ctx.user.as_deref().unwrap_or(""),
            trace_id: ctx.trace.as_ref().map_or("", |t| t.trace_id()),
            error: &error,
        });
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, _error: &Error) -> bool {
        // Client errors are in the access log already.
        true
    }
}
