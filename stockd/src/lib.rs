//! stockd: activities and items, warm-up, stock sharded over a Redis Cluster, the
//! one-call atomic reservation, release, rebalancing, sold-out publication,
//! recompute from MySQL, and the admin API (DESIGN.md).
//!
//! Layout:
//! - [`config`]: the TOML config and its validation.
//! - [`domain`]: request inputs parsed into types that cannot be malformed.
//! - [`redis`]: the fred cluster pool, scripts by SHA, deadlines.
//! - [`db`]: MySQL (activities, items, active orders).
//! - [`catalog`]: published activities in memory (window checks without Redis).
//! - [`shard`]: per-shard state: the high-water mark and the group-commit queue;
//!   [`mover`]: one rebalancing move at a time per item and home shard; [`transit`]:
//!   units between a take and a give hold the sold-out mark back.
//! - [`app`]: shared state; its methods by concern in [`stock`] (Reserve, Release,
//!   rebalancing, sold-out), [`clear`] (the sold-out clear, sent again until a replica
//!   holds it), [`recompute`] (rebuild from MySQL, lost-reservation
//!   accounting, start-up check), [`fence`] (the periodic fence check, flat in the
//!   number of activities), [`lease`] (one rebuilder per activity
//!   across a fleet) and [`admin`] (create, publish, status, reconcile, bans).
//! - [`service`]: the thin gRPC impls; [`error`]: the one error type; [`metrics`].
//! - [`run`]: serve until shutdown.
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod batch;
pub mod catalog;
pub mod clear;
pub mod config;
pub mod db;
pub mod domain;
pub mod error;
pub mod fence;
pub mod gate;
pub mod lease;
pub mod metrics;
pub mod mover;
pub mod recompute;
pub mod redis;
pub mod service;
pub mod shard;
pub mod stock;
pub mod stream;
pub mod transit;

use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use seckill_daemon::shutdown::{drain, Shutdown};
use seckill_proto::auth::Callers;
use seckill_proto::pb::admin_service_server::AdminServiceServer;
use seckill_proto::pb::stock_service_server::StockServiceServer;

pub use config::Config;
pub use metrics::Metrics;

/// Serves stockd on `grpc` (and `/metrics` on `admin` when given) until `shutdown`
/// fires, then drains in-flight calls for at most `grpc.drain_ms`.
///
/// Redis and MySQL may be down at start: Reserve answers UNAVAILABLE until the
/// activities are loaded and each activity's shards passed the fence check (or were
/// recomputed).
pub async fn run(
    config: Config,
    grpc: TcpListener,
    admin: Option<TcpListener>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    run_with_metrics(config, grpc, admin, shutdown, Metrics::new()).await
}

/// [`run`] with a caller-owned [`Metrics`] (tests read it).
pub async fn run_with_metrics(
    config: Config,
    grpc: TcpListener,
    admin: Option<TcpListener>,
    shutdown: Shutdown,
    metrics: Metrics,
) -> anyhow::Result<()> {
    // The TLS files first: a bad one fails the start before Redis or MySQL is touched.
    let tls = match &config.grpc.tls {
        Some(t) => Some(t.load("grpc.tls").map_err(|e| anyhow::anyhow!("{e}"))?),
        None => None,
    };
    let redis = redis::Clusters::connect(&config.redis, metrics.clone())
        .await
        .context("redis")?;
    let db = db::pool(&config.mysql).context("mysql")?;
    let callers = Callers::new(&config.grpc.service_token, &config.grpc.callers);
    let drain_for = Duration::from_millis(config.grpc.drain_ms);
    let app = app::App::new(
        config,
        redis.clone(),
        db.clone(),
        metrics.clone(),
        shutdown.clone(),
    );

    let refresh = tokio::spawn(app.clone().refresh_loop());
    let fences = tokio::spawn(app.clone().fence_loop());
    let admin_task = admin.map(|l| {
        tokio::spawn(seckill_daemon::admin_http::serve(
            l,
            metrics.registry.clone(),
            shutdown.clone(),
        ))
    });

    let (health, router) = seckill_daemon::serve::router(
        &[
            seckill_proto::pb::stock_service_server::SERVICE_NAME,
            seckill_proto::pb::admin_service_server::SERVICE_NAME,
        ],
        tls,
    )
    .context("gRPC TLS")?;
    let router = router
        .add_service(callers.guard(StockServiceServer::new(service::StockSvc {
            app: app.clone(),
        })))
        .add_service(callers.guard(AdminServiceServer::new(service::AdminSvc {
            app: app.clone(),
        })));
    // SERVING once the activities are loaded and their shards open (readiness:
    // start-up recomputes done), NOT_SERVING before.
    health
        .set_not_serving::<StockServiceServer<service::StockSvc>>()
        .await;
    {
        let (app, shutdown) = (app.clone(), shutdown.clone());
        tokio::spawn(async move {
            while !app.catalog.is_ready(seckill_lua::clock::now_ms()) {
                if shutdown.is_fired() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            health
                .set_serving::<StockServiceServer<service::StockSvc>>()
                .await;
            health
                .set_serving::<AdminServiceServer<service::AdminSvc>>()
                .await;
        });
    }
    tracing::info!(addr = ?grpc.local_addr().ok(), "stockd serving");

    let server = tokio::spawn(seckill_daemon::serve::run(router, grpc, shutdown.clone()));
    shutdown.clone().wait().await;
    tracing::info!("stockd shutting down");
    let served = drain("grpc calls", drain_for, server).await;
    let _ = drain("background loops", Duration::from_secs(2), async {
        let _ = refresh.await;
        let _ = fences.await;
        if let Some(t) = admin_task {
            let _ = t.await;
        }
    })
    .await;
    redis.quit().await;
    db.close().await;
    match served {
        Some(Ok(Ok(()))) | None => Ok(()),
        Some(Ok(Err(e))) => Err(e).context("grpc server"),
        Some(Err(e)) => Err(e).context("grpc server task"),
    }
}
