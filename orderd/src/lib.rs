//! orderd: reservations from the Redis streams become durable orders in MySQL;
//! payment, timeout cancellation, stock return and dead letters.
//!
//! Layout:
//! - [`config`]: the config file and its validation.
//! - [`consumer`]: stream discovery and the per-stream consumers (batches, claiming,
//!   dead letters, back-off).
//! - [`db`]: every MySQL statement, each transition in one transaction (`db/`: intake,
//!   transitions, outbox, dead letters).
//! - [`clusters`]: one Redis client per configured cluster (the default and each
//!   `[redis.clusters.<name>]`) and which cluster each activity is placed on.
//! - [`redis`]: a cluster client, stream commands, the release script.
//! - [`orders`]: the OrderService operations; [`service`]: their gRPC face.
//! - [`background`]: timeout sweep, stock-return outbox relay, gauges.
//! - [`payment`]: the provider callback's HMAC and freshness check.
//! - [`wake`]: idle consumers woken by `XADD` key-events instead of polling.
//! - [`model`], [`error`], [`metrics`].
#![forbid(unsafe_code)]

pub mod background;
pub mod clusters;
pub mod config;
pub mod consumer;
pub mod db;
pub mod error;
pub mod metrics;
pub mod model;
pub mod orders;
pub mod payment;
pub mod redis;
pub mod service;
pub mod wake;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use seckill_daemon::shutdown::{drain, Shutdown};
use seckill_proto::auth::Callers;
use seckill_proto::pb::order_service_server::OrderServiceServer;
use tokio::net::TcpListener;

pub use config::Config;
pub use metrics::Metrics;

/// Runs orderd on the given listeners until `shutdown` fires: the gRPC server, the
/// stream consumers, the timeout sweep, the outbox relay and (with `admin`) the
/// `/metrics` port. On shutdown the consumers finish the batch in hand, within
/// `grpc.drain_ms`.
pub async fn run(
    config: Config,
    grpc: TcpListener,
    admin: Option<TcpListener>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    run_with_metrics(config, grpc, admin, shutdown, Metrics::new()).await
}

/// [`run`] with a [`Metrics`] value of the caller's (tests read it).
pub async fn run_with_metrics(
    config: Config,
    grpc: TcpListener,
    admin: Option<TcpListener>,
    shutdown: Shutdown,
    metrics: Metrics,
) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let db = db::Db::connect_lazy(&config.mysql).context("mysql.url")?;
    // Every cluster connects in the background: one that is down (the default one
    // included) holds up only the activities placed on it.
    let clusters = clusters::Clusters::start(&config.redis).context("redis")?;

    let mut loops = tokio::task::JoinSet::new();
    let ctx = consumer::Ctx {
        db: db.clone(),
        clusters: clusters.clone(),
        cfg: config.consumer.clone(),
        consumer: config.consumer_name(),
        pay_timeout: config.payment_timeout(),
        metrics: metrics.clone(),
        errors: Arc::new(Mutex::new(Default::default())),
    };
    // Per cluster: its connection report, its wake-ups and its outbox relay.
    for cluster in clusters.all() {
        loops.spawn(clusters::report_connection(
            cluster.clone(),
            Duration::from_millis(config.redis.connect_timeout_ms),
            shutdown.clone(),
        ));
        if config.consumer.keyspace_events {
            loops.spawn(wake::listen(
                cluster.redis.client().clone(),
                config.redis.clone(),
                cluster.wakes.clone(),
                Duration::from_millis(config.consumer.discovery_interval_ms),
                shutdown.clone(),
            ));
            loops.spawn(wake::sweep(
                cluster.wakes.clone(),
                Duration::from_millis(config.consumer.clean_sweep_ms),
                shutdown.clone(),
            ));
        }
        loops.spawn(background::outbox_relay(
            db.clone(),
            cluster.clone(),
            metrics.clone(),
            Duration::from_millis(config.outbox.relay_interval_ms),
            config.outbox.relay_batch,
            shutdown.clone(),
        ));
    }
    tracing::info!(consumer = %ctx.consumer, group = %ctx.cfg.group,
        clusters = ?clusters.all().map(|c| c.name.as_str()).collect::<Vec<_>>(), "orderd starting");
    loops.spawn(consumer::discover(ctx, shutdown.clone()));
    loops.spawn(background::timeout_sweep(
        db.clone(),
        metrics.clone(),
        Duration::from_millis(config.payment.sweep_interval_ms),
        shutdown.clone(),
    ));
    loops.spawn(background::stats(
        db.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    if let Some(admin) = admin {
        loops.spawn(seckill_daemon::admin_http::serve(
            admin,
            metrics.registry.clone(),
            shutdown.clone(),
        ));
    }

    let orders = orders::Orders {
        db: db.clone(),
        clusters: clusters.clone(),
        config: config.clone(),
    };
    let svc = service::OrderSvc::new(orders, shutdown.clone());
    let tls = match &config.grpc.tls {
        Some(t) => Some(t.load("grpc.tls").map_err(|e| anyhow::anyhow!("{e}"))?),
        None => None,
    };
    let (health, router) = seckill_daemon::serve::router(
        &[seckill_proto::pb::order_service_server::SERVICE_NAME],
        tls,
    )
    .context("gRPC TLS")?;
    let callers = Callers::new(&config.grpc.service_token, &config.grpc.callers);
    let router = router.add_service(callers.guard(OrderServiceServer::new(svc)));
    health
        .set_serving::<OrderServiceServer<service::OrderSvc>>()
        .await;
    let served = seckill_daemon::serve::run(router, grpc, shutdown.clone()).await;

    let drain_for = Duration::from_millis(config.grpc.drain_ms);
    drain("orderd background loops", drain_for, async {
        while loops.join_next().await.is_some() {}
    })
    .await;
    clusters.quit().await;
    db.pool().close().await;
    served.context("gRPC server")?;
    tracing::info!("orderd stopped");
    Ok(())
}
