//! The pipeline. [`Gateway`] is pingora's `ProxyHttp`: every request is answered in
//! `request_filter`, nothing is proxied over HTTP. The steps run in order over a
//! [`Cx`], each one a [`Filter`] that says "go on" or "answered, stop":
//!
//! 1. header limits (431), route match (404/405);
//! 2. [`IpBan`], [`IpLimit`] (per IP and per route), [`SoldOutEarly`];
//! 3. [`Authenticate`], [`UserLimit`], [`Window`] (425/410/404);
//! 4. the JSON body (415/413/400), then [`PurchaseToken`] and [`Admission`];
//! 5. the route's handler: static files, activities from memory, or gRPC ([`forward`]).
//!
//! [`Shared`] holds what every request reads: the SIGHUP-swappable [`Compiled`]
//! policy, the bans, buckets, catalog, keys, metrics and canned answers.

use crate::admission::{Admission, Admitted};
use crate::answer::{self, Outcome, Prebuilt, Refusal};
use crate::auth::{Authenticate, Jwt, UserLimit};
use crate::config::{self, Config};
use crate::forward::{self, Clients, Reserve};
use crate::ip_ban::{Bans, IpBan, StaticLists};
use crate::metrics::Metrics;
use crate::purchase_token::{request_id_from_token, PurchaseTokens};
use crate::rate_limit::{IpLimit, RateLimiter};
use crate::routes::{self, Route, RouteClass};
use crate::sold_out::{Catalog, ItemLive, SoldOutEarly, Window};
use async_trait::async_trait;
use bytes::Bytes;
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Instant;

/// The reloadable part of the config, with its CIDR lists parsed.
pub struct Compiled {
    pub limits: config::Limits,
    pub bans: config::Bans,
    pub admission: config::Admission,
    pub protection: config::Protection,
    pub lists: StaticLists,
}

impl Compiled {
    pub fn new(p: config::Policy) -> Self {
        Self {
            lists: StaticLists::from_config(&p.bans),
            limits: p.limits,
            bans: p.bans,
            admission: p.admission,
            protection: p.protection,
        }
    }
}

/// State shared by every request and the background feeds.
pub struct Shared {
    /// The config as loaded at start (the policy part may since have been reloaded).
    pub cfg: Config,
    policy: RwLock<Arc<Compiled>>,
    pub bans: Bans,
    pub limiter: RateLimiter,
    pub catalog: Catalog,
    pub jwt: Jwt,
    pub tokens: PurchaseTokens,
    pub metrics: Metrics,
    pub prebuilt: Prebuilt,
    start: Instant,
    /// Set by the health checks of stockd and orderd.
    pub backends_ready: AtomicBool,
}

impl Shared {
    pub fn new(
        cfg: Config,
        metrics: Metrics,
        announce: tokio::sync::mpsc::Sender<seckill_lua::messages::BanChange>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            policy: RwLock::new(Arc::new(Compiled::new(cfg.policy()))),
            bans: Bans::new(announce),
            limiter: RateLimiter::new(cfg.limits.max_tracked),
            catalog: Catalog::default(),
            jwt: Jwt::from_config(&cfg.auth)?,
            tokens: PurchaseTokens::new(
                &cfg.auth.purchase_token_secret,
                cfg.auth.purchase_token_ttl_secs,
            ),
            metrics,
            prebuilt: Prebuilt::new(),
            start: Instant::now(),
            backends_ready: AtomicBool::new(false),
            cfg,
        })
    }

    /// Milliseconds on the gateway's monotonic clock.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn policy(&self) -> Arc<Compiled> {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Counts a refusal toward `ip`'s auto-ban when it is one of the abusive kinds.
    pub fn strike(&self, ip: IpAddr, r: &Refusal) {
        if !r.is_abuse() {
            return;
        }
        let b = &self.policy().bans;
        if self.bans.strike(
            ip,
            b.auto_ban_threshold,
            b.auto_ban_window_secs,
            b.auto_ban_ttl_secs,
            self.now_ms(),
            unix_ms(),
        ) {
            tracing::warn!(%ip, "auto-banned");
        }
    }

    /// Records one answered request: the decision metrics and, when
    /// `server.access_log` is on, the access log line.
    pub fn answered(&self, a: Answered<'_>) {
        self.metrics
            .decision(a.route, a.outcome, a.elapsed.as_secs_f64());
        if self.cfg.server.access_log {
            tracing::info!(
                target: "access",
                method = a.method,
                path = a.path,
                status = a.status,
                outcome = a.outcome.label(),
                client = %a.client,
                user = a.user,
                micros = a.elapsed.as_micros() as u64,
                error = a.error,
            );
        }
    }

    /// Swaps in a reloaded policy; requests in flight keep the one they started with.
    pub fn set_policy(&self, p: config::Policy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Compiled::new(p));
    }
}

/// What [`Shared::answered`] records of one request.
pub struct Answered<'a> {
    pub route: RouteClass,
    pub outcome: Outcome,
    pub elapsed: std::time::Duration,
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub client: IpAddr,
    pub user: &'a str,
    pub error: &'a str,
}

pub(crate) use seckill_lua::clock::unix_ms;

/// What a filter sees.
pub struct Cx<'a> {
    pub shared: &'a Shared,
    pub policy: &'a Compiled,
    pub route: &'a Route,
    pub client_ip: IpAddr,
    pub now_ms: u64,
    pub now_unix_ms: u64,
    pub bearer: Option<&'a str>,
    pub purchase_token: Option<&'a str>,
    pub user: Option<String>,
    pub item: Option<Arc<ItemLive>>,
    pub admitted: Option<Admitted>,
}

/// A filter's verdict.
#[derive(Debug)]
pub enum Flow {
    Go,
    Stop(Refusal),
}

/// One step of the pipeline.
pub trait Filter: Sync {
    fn check(&self, cx: &mut Cx<'_>) -> Flow;
}

/// Steps that need only the request header.
static BEFORE_BODY: [&dyn Filter; 6] = [
    &IpBan,
    &IpLimit,
    &SoldOutEarly,
    &Authenticate,
    &UserLimit,
    &Window,
];
/// Steps that need the body.
static AFTER_BODY: [&dyn Filter; 2] = [&PurchaseToken, &Admission];

fn run(filters: &[&dyn Filter], cx: &mut Cx<'_>) -> Flow {
    for f in filters {
        if let Flow::Stop(r) = f.check(cx) {
            return Flow::Stop(r);
        }
    }
    Flow::Go
}

/// Step 4: the purchase token of a reserve.
pub struct PurchaseToken;

impl Filter for PurchaseToken {
    fn check(&self, cx: &mut Cx<'_>) -> Flow {
        let Route::Reserve(a, s) = cx.route else {
            return Flow::Go;
        };
        let (Some(user), Some(token)) = (cx.user.as_deref(), cx.purchase_token) else {
            return Flow::Stop(Refusal::BadPurchaseToken("missing purchase token"));
        };
        match cx.shared.tokens.verify(token, user, *a, *s, cx.now_unix_ms) {
            Ok(()) => Flow::Go,
            Err(why) => Flow::Stop(Refusal::BadPurchaseToken(why)),
        }
    }
}

/// Per-request state kept by pingora between phases.
pub struct Ctx {
    start: Instant,
    route: RouteClass,
    outcome: Outcome,
    status: u16,
    client_ip: IpAddr,
    user: Option<String>,
}

/// The `ProxyHttp` implementation.
pub struct Gateway {
    shared: Arc<Shared>,
    clients: tokio::sync::OnceCell<Clients>,
}

impl Gateway {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            clients: tokio::sync::OnceCell::new(),
        }
    }

    async fn clients(&self) -> Result<&Clients> {
        self.clients
            .get_or_try_init(|| async {
                Clients::new(&self.shared.cfg.upstreams)
                    .map_err(|e| Error::explain(ErrorType::InternalError, e.to_string()))
            })
            .await
    }

    async fn refuse(&self, session: &mut Session, ctx: &mut Ctx, r: Refusal) -> Result<bool> {
        ctx.outcome = r.outcome();
        self.shared.strike(ctx.client_ip, &r);
        if matches!(r, Refusal::PayloadTooLarge | Refusal::HeadersTooLarge) {
            session.set_keepalive(None);
        }
        self.shared.prebuilt.refuse(session, &r).await?;
        Ok(true)
    }

    async fn ok(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        status: u16,
        body: &Value,
    ) -> Result<bool> {
        ctx.outcome = if status == 202 {
            Outcome::Reserved
        } else {
            Outcome::Ok
        };
        answer::json(session, status, body).await?;
        Ok(true)
    }

    /// Reads a JSON body under the size limit, within `request_read_ms` (on HTTP/1.1 the
    /// connection's read deadline is the tighter bound; on HTTP/2 this one is the bound,
    /// see `deadline.rs`).
    async fn body(
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
        if !ctype
            .split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        {
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

    async fn handle(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let shared = &*self.shared;
        let policy = shared.policy();
        let now_ms = shared.now_ms();
        let now_unix_ms = unix_ms();

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
                matches!(route, Route::OrderEvents(_)),
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
            };
            flow = run(&BEFORE_BODY, &mut cx);
            if matches!(flow, Flow::Go) {
                user = cx.user.take();
                item = cx.item.take();
            }
        }
        if let Flow::Stop(r) = flow {
            return self.refuse(session, ctx, r).await;
        }
        ctx.user = user.clone();

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
            Route::ListActivities => {
                let now = now_unix_ms as i64;
                let all = shared.catalog.all();
                let mut acts: Vec<_> = all.values().filter(|a| a.end_ms > now).collect();
                acts.sort_by_key(|a| (a.start_ms, a.id));
                let body = json!({
                    "server_time_ms": now,
                    "activities": acts.iter().map(|a| a.to_json(now)).collect::<Vec<_>>(),
                });
                self.ok(session, ctx, 200, &body).await
            }
            Route::GetActivity(a) => match shared.catalog.get(*a) {
                Some(act) => {
                    let now = now_unix_ms as i64;
                    let body = json!({"server_time_ms": now, "activity": act.to_json(now)});
                    self.ok(session, ctx, 200, &body).await
                }
                None => {
                    self.refuse(session, ctx, Refusal::NotFound("no such activity"))
                        .await
                }
            },
            Route::DevToken => {
                if !shared.cfg.dev.enabled {
                    return self
                        .refuse(session, ctx, Refusal::NotFound("no such route"))
                        .await;
                }
                let body = match self.body(session, &policy.protection).await? {
                    Ok(b) => b,
                    Err(r) => return self.refuse(session, ctx, r).await,
                };
                let Some(uid) = body
                    .get("user_id")
                    .and_then(Value::as_str)
                    .filter(|u| crate::auth::valid_user_id(u))
                else {
                    return self
                        .refuse(
                            session,
                            ctx,
                            Refusal::BadRequest(
                                "user_id: 1..=64 printable ASCII characters".into(),
                            ),
                        )
                        .await;
                };
                match shared
                    .jwt
                    .issue(uid, shared.cfg.dev.token_ttl_secs, now_unix_ms)
                {
                    Some((token, exp)) => {
                        self.ok(
                            session,
                            ctx,
                            200,
                            &json!({"token": token, "expires_at_ms": exp}),
                        )
                        .await
                    }
                    None => {
                        self.refuse(session, ctx, Refusal::NotFound("no such route"))
                            .await
                    }
                }
            }
            Route::Token(a, s) => {
                let uid = user.as_deref().unwrap_or_default();
                let (token, exp) = shared.tokens.issue(uid, *a, *s, now_unix_ms);
                self.ok(
                    session,
                    ctx,
                    200,
                    &json!({"purchase_token": token, "expires_at_ms": exp}),
                )
                .await
            }
            Route::Reserve(a, s) => {
                let body = match self.body(session, &policy.protection).await? {
                    Ok(b) => b,
                    Err(r) => return self.refuse(session, ctx, r).await,
                };
                let token = body.get("purchase_token").and_then(Value::as_str);
                let request_id = match body.get("request_id") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(r))
                        if !r.is_empty()
                            && r.len() <= seckill_lua::MAX_ID_LEN
                            && r.bytes().all(|b| b.is_ascii_graphic()) =>
                    {
                        Some(r.clone())
                    }
                    Some(_) => {
                        return self
                            .refuse(
                                session,
                                ctx,
                                Refusal::BadRequest(
                                    "request_id: 1..=64 printable ASCII characters".into(),
                                ),
                            )
                            .await
                    }
                };
                let flow;
                let admitted;
                {
                    let mut cx = Cx {
                        shared,
                        policy: &policy,
                        route: &route,
                        client_ip: ctx.client_ip,
                        now_ms,
                        now_unix_ms,
                        bearer: None,
                        purchase_token: token,
                        user: user.clone(),
                        item: item.clone(),
                        admitted: None,
                    };
                    flow = run(&AFTER_BODY, &mut cx);
                    admitted = cx.admitted.take();
                }
                if let Flow::Stop(r) = flow {
                    return self.refuse(session, ctx, r).await;
                }
                let token = token.unwrap_or_default();
                let request_id = request_id.unwrap_or_else(|| request_id_from_token(token));
                let clients = self.clients().await?;
                let uid = user.as_deref().unwrap_or_default();
                let result = clients.reserve(*a, *s, uid, &request_id).await;
                drop(admitted);
                match result {
                    Ok((Reserve::Reserved(rid), _)) => {
                        self.ok(
                            session,
                            ctx,
                            202,
                            &json!({"reservation_id": rid, "order_id": rid, "state": "QUEUED"}),
                        )
                        .await
                    }
                    Ok((Reserve::Duplicate(rid), _)) => {
                        self.refuse(session, ctx, Refusal::Duplicate(rid)).await
                    }
                    Ok((Reserve::SoldOut, _)) => {
                        shared.catalog.set_sold_out(*a, *s, true);
                        self.refuse(session, ctx, Refusal::SoldOut).await
                    }
                    Ok((Reserve::NotStarted { start_at_ms }, _)) => {
                        self.refuse(
                            session,
                            ctx,
                            Refusal::TooEarly {
                                start_at_ms,
                                server_time_ms: now_unix_ms as i64,
                            },
                        )
                        .await
                    }
                    Ok((Reserve::Ended, _)) => self.refuse(session, ctx, Refusal::Ended).await,
                    Ok((Reserve::NotFound, _)) => {
                        self.refuse(session, ctx, Refusal::NotFound("no such item"))
                            .await
                    }
                    Err(status) => {
                        shared.metrics.upstream_error("stockd", status.code());
                        let r = clients.refusal(&status);
                        self.refuse(session, ctx, r).await
                    }
                }
            }
            Route::ListOrders => {
                let clients = self.clients().await?;
                match clients
                    .list_orders(user.as_deref().unwrap_or_default())
                    .await
                {
                    Ok(orders) => {
                        let body = json!({"orders": orders.iter().map(forward::order_json).collect::<Vec<_>>()});
                        self.ok(session, ctx, 200, &body).await
                    }
                    Err(st) => self.upstream_failed(session, ctx, clients, &st).await,
                }
            }
            Route::GetOrder(id) => {
                let clients = self.clients().await?;
                match clients
                    .get_order(id, user.as_deref().unwrap_or_default())
                    .await
                {
                    Ok(o) => self.ok(session, ctx, 200, &forward::order_json(&o)).await,
                    Err(st) => self.upstream_failed(session, ctx, clients, &st).await,
                }
            }
            Route::Pay(id) | Route::Cancel(id) => {
                let clients = self.clients().await?;
                let uid = user.as_deref().unwrap_or_default();
                let r = if matches!(route, Route::Pay(_)) {
                    clients.pay(id, uid).await
                } else {
                    clients.cancel(id, uid).await
                };
                match r {
                    Ok(change) => match forward::change_answer(&change) {
                        Ok(v) => self.ok(session, ctx, 200, &v).await,
                        Err(r) => self.refuse(session, ctx, r).await,
                    },
                    Err(st) => self.upstream_failed(session, ctx, clients, &st).await,
                }
            }
            Route::PaymentCallback => {
                let body = match self.body(session, &policy.protection).await? {
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
                        ) && !st.message().contains("service token") =>
                    {
                        let r = Refusal::BadRequest(st.message().to_string().into());
                        self.refuse(session, ctx, r).await
                    }
                    Err(st) => self.upstream_failed(session, ctx, clients, &st).await,
                }
            }
            Route::OrderEvents(id) => {
                let clients = self.clients().await?.clone();
                self.events(
                    session,
                    ctx,
                    &clients,
                    id,
                    user.as_deref().unwrap_or_default(),
                )
                .await
            }
        }
    }

    async fn upstream_failed(
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
        self.refuse(session, ctx, r).await
    }

    /// `GET /api/v1/orders/{id}/events`: the order's states as server-sent events.
    async fn events(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        clients: &Clients,
        id: &str,
        user: &str,
    ) -> Result<bool> {
        let mut stream = match clients.watch(id, user).await {
            Ok(s) => s,
            Err(st) => return self.upstream_failed(session, ctx, clients, &st).await,
        };
        let mut h = pingora::http::ResponseHeader::build(200, Some(4))?;
        h.insert_header("content-type", "text/event-stream")?;
        h.insert_header("cache-control", "no-cache")?;
        h.insert_header("x-accel-buffering", "no")?;
        session.set_keepalive(None);
        session.write_response_header(Box::new(h), false).await?;
        ctx.outcome = Outcome::Ok;
        loop {
            let next =
                tokio::time::timeout(std::time::Duration::from_secs(15), stream.message()).await;
            match next {
                Err(_) => {
                    // Heartbeat: keeps proxies from closing an idle stream.
                    session
                        .write_response_body(Some(Bytes::from_static(b": keep-alive\n\n")), false)
                        .await?;
                }
                Ok(Ok(Some(order))) => {
                    let data =
                        serde_json::to_string(&forward::order_json(&order)).unwrap_or_default();
                    let done = forward::is_final(order.state);
                    session
                        .write_response_body(
                            Some(Bytes::from(format!("event: order\ndata: {data}\n\n"))),
                            done,
                        )
                        .await?;
                    if done {
                        return Ok(true);
                    }
                }
                Ok(Ok(None)) => break,
                Ok(Err(st)) => {
                    self.shared.metrics.upstream_error("orderd", st.code());
                    break;
                }
            }
        }
        session
            .write_response_body(Some(Bytes::new()), true)
            .await?;
        Ok(true)
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
            error: &error,
        });
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, _error: &Error) -> bool {
        // Client errors are in the access log already.
        true
    }
}
