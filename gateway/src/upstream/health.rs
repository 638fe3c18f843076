//! [`Health`]: a pingora background service running one loop per stockd and orderd
//! endpoint. Every `upstreams.health_interval_ms` it asks `grpc.health.v1.Health/Check`
//! for the service the edge calls there (`seckill.v1.StockService`,
//! `seckill.v1.OrderService`) on a channel of its own, bounded by
//! `upstreams.health_timeout_ms`, and marks the endpoint healthy when the answer is
//! SERVING, down otherwise (no answer, an error, NOT_SERVING). The service, not the
//! server as a whole (""): stockd serves "" from its start but its `StockService` only
//! once its activities are loaded and their shards open, and the calls no longer mark
//! an endpoint down for an `UNAVAILABLE` it sent (`super::marks_down`). The channel is
//! dialled as the calls' ([`super::dial`]): over TLS for `https://` URLs.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::Fleet;
use crate::shared::Shared;

/// The health loops of every endpoint of both fleets.
pub struct Health {
    shared: Arc<Shared>,
}

impl Health {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

/// The timings of one loop.
#[derive(Clone, Copy)]
struct Timing {
    interval: Duration,
    timeout: Duration,
    connect: Duration,
}

#[async_trait]
impl BackgroundService for Health {
    async fn start(&self, shutdown: ShutdownWatch) {
        let u = &self.shared.cfg.upstreams;
        let timing = Timing {
            interval: Duration::from_millis(u.health_interval_ms),
            timeout: Duration::from_millis(u.health_timeout_ms),
            connect: Duration::from_millis(u.connect_timeout_ms.min(u.health_timeout_ms)),
        };
        let mut loops = tokio::task::JoinSet::new();
        let fleets = [
            (
                &self.shared.upstreams.stockd,
                seckill_proto::pb::stock_service_server::SERVICE_NAME,
            ),
            (
                &self.shared.upstreams.orderd,
                seckill_proto::pb::order_service_server::SERVICE_NAME,
            ),
        ];
        for (fleet, service) in fleets {
            for i in 0..fleet.endpoints().len() {
                loops.spawn(watch(
                    self.shared.clone(),
                    fleet.clone(),
                    service,
                    i,
                    timing,
                    shutdown.clone(),
                ));
            }
        }
        while loops.join_next().await.is_some() {}
    }
}

async fn watch(
    shared: Arc<Shared>,
    fleet: Arc<Fleet>,
    service: &'static str,
    i: usize,
    t: Timing,
    mut shutdown: ShutdownWatch,
) {
    let url = fleet.endpoints()[i].url.clone();
    // The URL and the TLS files were checked with the config; a failure here (a file
    // removed since) leaves the endpoint marked down, logged once.
    let channel = match super::dial(&url, &shared.cfg.upstreams) {
        Ok(e) => e
            .connect_timeout(t.connect)
            .tcp_nodelay(true)
            .connect_lazy(),
        Err(e) => {
            tracing::error!(service = fleet.service(), endpoint = %url, error = %e, "upstream cannot be dialled; never checked");
            return;
        }
    };
    let mut tick = tokio::time::interval(t.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let ok = tokio::select! {
            _ = shutdown.changed() => return,
            ok = check(&channel, service, t.timeout) => ok,
        };
        fleet.mark(i, ok);
    }
}

/// True when the server answers SERVING for `service` within `timeout`.
async fn check(channel: &Channel, service: &str, timeout: Duration) -> bool {
    let mut h = HealthClient::new(channel.clone());
    let call = h.check(HealthCheckRequest {
        service: service.to_string(),
    });
    matches!(
        tokio::time::timeout(timeout, call).await,
        Ok(Ok(r)) if r.get_ref().status == ServingStatus::Serving as i32
    )
}
