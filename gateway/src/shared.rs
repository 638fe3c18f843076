//! [`Shared`]: what every request and every background feed reads: the config as
//! loaded, the SIGHUP-swappable [`Compiled`] policy (and the other live fields:
//! `limits.max_tracked`, `server.access_log`), the bans, buckets, catalog, keys,
//! metrics and canned answers; and [`Answered`], the record of one answered request
//! (metrics, access log), shared by the pipeline and the fast lane.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use seckill_lua::clock::unix_ms;

use crate::answer::{Outcome, Prebuilt, Refusal};
use crate::auth::Jwt;
use crate::config::{self, Config};
use crate::fair::challenge::Challenges;
use crate::forward::Clients;
use crate::ip_ban::{Bans, StaticLists};
use crate::metrics::Metrics;
use crate::purchase_token::PurchaseTokens;
use crate::rate_limit::RateLimiter;
use crate::routes::RouteClass;
use crate::sold_out::Catalog;
use crate::upstream::Fleets;

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
    /// The config as loaded at start (the policy part, `limits.max_tracked` and
    /// `server.access_log` may since have been reloaded: read them through
    /// [`Shared::policy`] and [`Shared::access_log`]).
    pub cfg: Config,
    policy: RwLock<Arc<Compiled>>,
    access_log: AtomicBool,
    pub bans: Bans,
    pub limiter: RateLimiter,
    pub catalog: Catalog,
    jwt: RwLock<Arc<Jwt>>,
    pub tokens: PurchaseTokens,
    /// The proof-of-work challenge (`[challenge]`, reloaded on SIGHUP).
    pub challenges: Challenges,
    pub metrics: Metrics,
    pub prebuilt: Prebuilt,
    start: Instant,
    /// The stockd and orderd endpoints and their health marks.
    pub upstreams: Fleets,
    /// The waiting room of every activity.
    pub room: crate::fair::room::Room,
    /// The gRPC clients, made on first use on the proxy's runtime (their tasks run
    /// there): the pipeline's handlers and the fast lane's reserve share them.
    clients: tokio::sync::OnceCell<Clients>,
}

impl Shared {
    pub fn new(
        cfg: Config,
        metrics: Metrics,
        announce: tokio::sync::mpsc::Sender<seckill_lua::messages::BanChange>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            policy: RwLock::new(Arc::new(Compiled::new(cfg.policy()))),
            access_log: AtomicBool::new(cfg.server.access_log),
            bans: Bans::new(announce),
            limiter: RateLimiter::new(cfg.limits.max_tracked),
            catalog: Catalog::default(),
            jwt: RwLock::new(Arc::new(Jwt::from_config(&cfg.auth)?)),
            tokens: PurchaseTokens::new(
                &cfg.auth.purchase_token_secret,
                cfg.auth.purchase_token_ttl_secs,
            ),
            challenges: Challenges::new(&cfg.challenge, &cfg.redis, &metrics.registry)?,
            prebuilt: Prebuilt::new(),
            start: Instant::now(),
            upstreams: Fleets::new(&cfg.upstreams, &metrics),
            room: crate::fair::room::Room::new(
                &cfg.room,
                &cfg.auth.purchase_token_secret,
                &metrics.registry,
            ),
            metrics,
            cfg,
            clients: tokio::sync::OnceCell::new(),
        })
    }

    /// The gRPC clients (made on the first call, inside the runtime that calls).
    pub async fn clients(&self) -> anyhow::Result<&Clients> {
        self.clients
            .get_or_try_init(|| async { Clients::new(&self.cfg.upstreams, &self.upstreams) })
            .await
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
        if self.access_log() {
            tracing::info!(
                target: "access",
                method = a.method,
                path = a.path,
                status = a.status,
                outcome = a.outcome.label(),
                client = %a.client,
                user = a.user,
                trace_id = a.trace_id,
                micros = a.elapsed.as_micros() as u64,
                error = a.error,
            );
        }
    }

    /// The JWT key set in force.
    pub fn jwt(&self) -> Arc<Jwt> {
        self.jwt.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Swaps in a reloaded key set (SIGHUP); requests in flight keep the one they read.
    pub fn set_jwt(&self, jwt: Jwt) {
        *self.jwt.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(jwt);
    }

    /// Swaps in a reloaded policy; requests in flight keep the one they started with.
    pub fn set_policy(&self, p: config::Policy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Compiled::new(p));
    }

    /// `server.access_log` as last loaded.
    pub fn access_log(&self) -> bool {
        self.access_log.load(Ordering::Relaxed)
    }

    /// Applies the live fields of a reloaded config: the policy (`[limits]`, `[bans]`,
    /// `[admission]`, `[protection]`), `[challenge]`, `limits.max_tracked` and
    /// `server.access_log`.
    /// (`protection.request_read_ms` is also read by the listener: `lib.rs` stores it.)
    pub fn apply_reload(&self, c: &Config) {
        self.set_policy(c.policy());
        self.challenges.reload(&c.challenge);
        self.limiter.set_max_tracked(c.limits.max_tracked);
        self.access_log
            .store(c.server.access_log, Ordering::Relaxed);
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
    /// The request's W3C trace id (32 hex), empty when none was made (fast lane).
    pub trace_id: &'a str,
    pub error: &'a str,
}

/// A [`Shared`] for unit tests: a minimal valid config plus `extra` TOML sections,
/// no Redis, no backends.
#[cfg(test)]
pub(crate) fn for_test(extra: &str) -> Shared {
    let text = format!("{}{extra}", config::MINIMAL);
    let cfg: Config =
        seckill_daemon::config::load_str(&text, "test.toml", config::ENV_PREFIX, Vec::new())
            .expect("test config");
    let (announce, _) = tokio::sync::mpsc::channel(1);
    Shared::new(cfg, Metrics::new(), announce).expect("test shared state")
}
