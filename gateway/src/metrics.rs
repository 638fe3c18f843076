//! Prometheus metrics, registered in a [`Metrics`] value passed in (not a global):
//! decisions by outcome and route, latency histograms by outcome, upstream errors,
//! upstream health and failovers, tracked buckets. Counters for every (route, outcome) pair are resolved once, so a
//! request costs two atomic adds and no label hashing.

use crate::answer::Outcome;
use crate::routes::RouteClass;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

pub struct Metrics {
    pub registry: Registry,
    decisions: Vec<IntCounter>,
    latency: Vec<Histogram>,
    upstream_errors: IntCounterVec,
    upstream_healthy: IntGaugeVec,
    upstream_failovers: IntCounterVec,
    upstream_seconds: HistogramVec,
    pub tracked_ips: IntGauge,
    pub auto_bans: IntCounter,
    pub catalog_refresh_errors: IntCounter,
    /// 1 while `limits.fleet` budgets run on the local share (Redis unreachable).
    pub fleet_fallback: IntGauge,
    /// Failed reconciliations of the fleet-shared budgets with Redis.
    pub fleet_sync_errors: IntCounter,
    /// Failed stock reads, by Redis Cluster (`default` or the `[redis.clusters]` name).
    stock_poll_errors: IntCounterVec,
    /// Published activities placed on a Redis Cluster this gateway is not configured
    /// with (no sold-out short-circuit for them).
    pub activities_on_unknown_cluster: IntGauge,
    /// Requests the fast lane answered (the rest of `gateway_decisions_total` went
    /// through pingora's session).
    pub fast_lane_answers: IntCounter,
}

const N_OUT: usize = Outcome::ALL.len();

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let decisions_vec = IntCounterVec::new(
            Opts::new(
                "gateway_decisions_total",
                "Requests answered by the gateway, by route and outcome",
            ),
            &["route", "outcome"],
        )
        .expect("metric");
        let latency_vec = HistogramVec::new(
            HistogramOpts::new(
                "gateway_request_duration_seconds",
                "Time from request header to answer, by outcome",
            )
            .buckets(vec![
                0.000_05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                0.25, 0.5, 1.0, 2.5,
            ]),
            &["outcome"],
        )
        .expect("metric");
        let upstream_errors = IntCounterVec::new(
            Opts::new(
                "gateway_upstream_errors_total",
                "gRPC calls to stockd/orderd that failed, by upstream and gRPC code",
            ),
            &["upstream", "code"],
        )
        .expect("metric");
        let upstream_healthy = IntGaugeVec::new(
            Opts::new(
                "gateway_upstream_healthy",
                "1 while an upstream endpoint is marked healthy (health check or last call), else 0",
            ),
            &["service", "endpoint"],
        )
        .expect("metric");
        let upstream_failovers = IntCounterVec::new(
            Opts::new(
                "gateway_upstream_failovers_total",
                "Calls tried again on another endpoint after a transport error or UNAVAILABLE",
            ),
            &["service"],
        )
        .expect("metric");
        let upstream_seconds = HistogramVec::new(
            HistogramOpts::new(
                "gateway_upstream_call_seconds",
                "Whole gRPC calls to stockd/orderd as the edge sees them (channel queueing, \
                 failover and the daemon's own time included), by service",
            )
            .buckets(vec![
                0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                0.5, 1.0, 2.5,
            ]),
            &["service"],
        )
        .expect("metric");
        let tracked_ips =
            IntGauge::new("gateway_tracked_ips", "Per-IP token buckets held").expect("metric");
        let auto_bans = IntCounter::new("gateway_auto_bans_total", "IPs banned by the auto-ban")
            .expect("metric");
        let catalog_refresh_errors = IntCounter::new(
            "gateway_feed_errors_total",
            "Failed reads of activities, stock or bans from Redis",
        )
        .expect("metric");
        let fleet_fallback = IntGauge::new(
            "gateway_fleet_fallback",
            "1 while the fleet-shared budgets (limits.fleet) run on rate / fleet_size because Redis is unreachable",
        )
        .expect("metric");
        let fleet_sync_errors = IntCounter::new(
            "gateway_fleet_sync_errors_total",
            "Failed reconciliations of the fleet-shared budgets with Redis",
        )
        .expect("metric");
        let stock_poll_errors = IntCounterVec::new(
            Opts::new(
                "gateway_stock_poll_errors_total",
                "Failed reads of shard stock and buyers, by Redis Cluster (default or a \
                 [redis.clusters] name); each also counts in gateway_feed_errors_total",
            ),
            &["cluster"],
        )
        .expect("metric");
        let activities_on_unknown_cluster = IntGauge::new(
            "gateway_activities_on_unknown_cluster",
            "Published activities whose redis_cluster names a cluster missing from \
             [redis.clusters]: no sold-out short-circuit for them, stockd answers",
        )
        .expect("metric");
        let fast_lane_answers = IntCounter::new(
            "gateway_fast_lane_answers_total",
            "Requests answered by the fast lane (plain HTTP/1.1, before pingora's session): \
             the hot refusals, the challenge issue and reservations",
        )
        .expect("metric");
        for c in [
            Box::new(fleet_fallback.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(fast_lane_answers.clone()),
            Box::new(stock_poll_errors.clone()),
            Box::new(activities_on_unknown_cluster.clone()),
            Box::new(fleet_sync_errors.clone()),
            Box::new(decisions_vec.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(latency_vec.clone()),
            Box::new(upstream_errors.clone()),
            Box::new(upstream_healthy.clone()),
            Box::new(upstream_failovers.clone()),
            Box::new(upstream_seconds.clone()),
            Box::new(tracked_ips.clone()),
            Box::new(auto_bans.clone()),
            Box::new(catalog_refresh_errors.clone()),
            Box::new(seckill_daemon::telemetry::DroppedLines::new("gateway")),
        ] {
            registry.register(c).expect("unique metric names");
        }
        let mut decisions = Vec::with_capacity(RouteClass::ALL.len() * N_OUT);
        for r in RouteClass::ALL {
            for o in Outcome::ALL {
                decisions.push(decisions_vec.with_label_values(&[r.name(), o.label()]));
            }
        }
        let latency = Outcome::ALL
            .iter()
            .map(|o| latency_vec.with_label_values(&[o.label()]))
            .collect();
        Self {
            registry,
            decisions,
            latency,
            upstream_errors,
            upstream_healthy,
            upstream_failovers,
            upstream_seconds,
            tracked_ips,
            auto_bans,
            catalog_refresh_errors,
            fleet_fallback,
            fleet_sync_errors,
            stock_poll_errors,
            activities_on_unknown_cluster,
            fast_lane_answers,
        }
    }

    /// The stock-read error counter of one cluster (`None`: the default one); resolved
    /// once by its feed.
    pub fn stock_poll_errors(&self, cluster: Option<&str>) -> IntCounter {
        self.stock_poll_errors
            .with_label_values(&[cluster.unwrap_or(seckill_daemon::config::DEFAULT_CLUSTER)])
    }

    pub fn decision(&self, route: RouteClass, outcome: Outcome, seconds: f64) {
        self.decisions[route as usize * N_OUT + outcome as usize].inc();
        self.latency[outcome as usize].observe(seconds);
    }

    pub fn upstream_error(&self, upstream: &str, code: tonic::Code) {
        self.upstream_errors
            .with_label_values(&[upstream, &format!("{code:?}")])
            .inc();
    }

    /// The health gauge of one endpoint (resolved once, by `upstream::Fleet`).
    pub fn upstream_healthy(&self, service: &str, endpoint: &str) -> IntGauge {
        self.upstream_healthy
            .with_label_values(&[service, endpoint])
    }

    /// The failover counter of one service (resolved once, by `upstream::Fleet`).
    pub fn upstream_failovers(&self, service: &str) -> IntCounter {
        self.upstream_failovers.with_label_values(&[service])
    }

    /// The call latency histogram of one service (resolved once, by `upstream::Fleet`).
    pub fn upstream_seconds(&self, service: &str) -> Histogram {
        self.upstream_seconds.with_label_values(&[service])
    }

    /// The registry in Prometheus text (the `/metrics` body).
    pub fn text(&self) -> Result<String, prometheus::Error> {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_are_counted_by_route_and_outcome() {
        let m = Metrics::new();
        m.decision(RouteClass::Reserve, Outcome::SoldOut, 0.0001);
        m.decision(RouteClass::Reserve, Outcome::SoldOut, 0.0001);
        m.upstream_error("stockd", tonic::Code::Unavailable);
        let text = {
            use prometheus::Encoder;
            let mut buf = Vec::new();
            prometheus::TextEncoder::new()
                .encode(&m.registry.gather(), &mut buf)
                .unwrap();
            String::from_utf8(buf).unwrap()
        };
        assert!(
            text.contains(r#"gateway_decisions_total{outcome="sold_out",route="reserve"} 2"#),
            "{text}"
        );
        assert!(text
            .contains(r#"gateway_upstream_errors_total{code="Unavailable",upstream="stockd"} 1"#));
    }
}
