//! orderd's Prometheus metrics, registered in a [`Metrics`] value that is passed in
//! (not a global), served on the admin port.
//!
//! - `orderd_stream_lag{stream}`: entries in the stream not yet written to MySQL
//!   (read but unacknowledged included; acknowledged entries are deleted).
//! - `orderd_orders{state}`: orders in MySQL by state, refreshed periodically.
//! - `orderd_dead_letters`: dead letters not yet replayed; `orderd_dead_letters_total`.
//! - `orderd_batch_size`, `orderd_batch_seconds`: entries per batch and batch latency.
//! - `orderd_orders_written_total{state}`: orders created by the consumers.
//! - `orderd_batch_failures_total`: failed batches (each followed by a back-off).
//! - `orderd_stock_returns_total{outcome}`: outbox rows relayed to Redis.
//! - `orderd_stock_return_retries_total{reason}`: outbox rows left pending for the next
//!   pass (`shard_closed`, `unreplicated`, `error`).
//! - `orderd_stock_returns_pending`, `orderd_stock_return_oldest_pending_seconds`: outbox
//!   rows not yet relayed (every cluster's, read from MySQL) and the age of the oldest,
//!   refreshed periodically: units cancelled or timed out that are not back on sale yet.
//! - `orderd_timeouts_total`: orders cancelled by the payment timeout.
//! - `orderd_unknown_cluster_activities`: published activities placed on a Redis cluster
//!   this orderd is not configured with (their streams are not consumed).

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// The values of `orderd_stock_returns_total{outcome}`, exported at 0 from the start.
pub const RETURN_OUTCOMES: [&str; 4] =
    ["released", "buyer_dropped", "not_held", "closed_sale_over"];
/// The values of `orderd_stock_return_retries_total{reason}`, exported at 0 from the start
/// (so `increase()` sees a series' first retry).
pub const RETRY_REASONS: [&str; 3] = ["shard_closed", "unreplicated", "error"];

/// Every metric orderd exports, and the registry they live in.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub stream_lag: IntGaugeVec,
    pub orders_by_state: IntGaugeVec,
    pub dead_letters: IntGauge,
    pub dead_letters_total: IntCounter,
    pub batch_size: Histogram,
    pub batch_seconds: Histogram,
    pub orders_written: IntCounterVec,
    pub batch_failures: IntCounter,
    pub stock_returns: IntCounterVec,
    pub stock_return_retries: IntCounterVec,
    pub stock_returns_pending: IntGauge,
    pub stock_return_oldest_pending_seconds: Gauge,
    pub stats_refreshed: Gauge,
    pub timeouts: IntCounter,
    pub unknown_cluster_activities: IntGauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics(..)")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let stream_lag = IntGaugeVec::new(
            Opts::new(
                "orderd_stream_lag",
                "Entries in a reservation stream not yet written to MySQL",
            ),
            &["stream"],
        )
        .expect("valid metric");
        let orders_by_state = IntGaugeVec::new(
            Opts::new("orderd_orders", "Orders in MySQL by state"),
            &["state"],
        )
        .expect("valid metric");
        let dead_letters = IntGauge::new("orderd_dead_letters", "Dead letters not yet replayed")
            .expect("valid metric");
        let dead_letters_total = IntCounter::new(
            "orderd_dead_letters_total",
            "Stream entries moved to the dead letters",
        )
        .expect("valid metric");
        let batch_size = Histogram::with_opts(
            HistogramOpts::new("orderd_batch_size", "Stream entries per MySQL batch").buckets(
                vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0],
            ),
        )
        .expect("valid metric");
        let batch_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "orderd_batch_seconds",
                "Latency of one batch: MySQL transaction and acknowledgement",
            )
            .buckets(vec![
                0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
            ]),
        )
        .expect("valid metric");
        let orders_written = IntCounterVec::new(
            Opts::new(
                "orderd_orders_written_total",
                "Orders created from stream entries, by initial state",
            ),
            &["state"],
        )
        .expect("valid metric");
        let batch_failures = IntCounter::new(
            "orderd_batch_failures_total",
            "Batches that failed (MySQL or Redis unavailable) and were retried after a back-off",
        )
        .expect("valid metric");
        let stock_returns = IntCounterVec::new(
            Opts::new(
                "orderd_stock_returns_total",
                "Stock-return outbox rows relayed to Redis, by release outcome",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let stock_return_retries = IntCounterVec::new(
            Opts::new(
                "orderd_stock_return_retries_total",
                "Stock-return outbox rows left pending for the next pass, by reason",
            ),
            &["reason"],
        )
        .expect("valid metric");
        for outcome in RETURN_OUTCOMES {
            stock_returns.with_label_values(&[outcome]);
        }
        for reason in RETRY_REASONS {
            stock_return_retries.with_label_values(&[reason]);
        }
        let stock_returns_pending = IntGauge::new(
            "orderd_stock_returns_pending",
            "Stock-return outbox rows not yet relayed to Redis (every cluster's, from MySQL)",
        )
        .expect("valid metric");
        let stock_return_oldest_pending_seconds = Gauge::new(
            "orderd_stock_return_oldest_pending_seconds",
            "Age of the oldest stock-return outbox row not yet relayed (0 when none)",
        )
        .expect("valid metric");
        let stats_refreshed = Gauge::new(
            "orderd_stats_refreshed_timestamp_seconds",
            "Unix time of the last refresh of the gauges read from MySQL (orders by state, \
             dead letters, pending stock returns) whose reads all succeeded; 0 before the first",
        )
        .expect("valid metric");
        let timeouts = IntCounter::new(
            "orderd_timeouts_total",
            "Orders cancelled because the payment deadline passed",
        )
        .expect("valid metric");
        let unknown_cluster_activities = IntGauge::new(
            "orderd_unknown_cluster_activities",
            "Published activities on a Redis cluster this orderd is not configured with; \
             their streams are not consumed",
        )
        .expect("valid metric");
        for c in [
            Box::new(stream_lag.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(orders_by_state.clone()),
            Box::new(dead_letters.clone()),
            Box::new(dead_letters_total.clone()),
            Box::new(batch_size.clone()),
            Box::new(batch_seconds.clone()),
            Box::new(orders_written.clone()),
            Box::new(batch_failures.clone()),
            Box::new(stock_returns.clone()),
            Box::new(stock_return_retries.clone()),
            Box::new(stock_returns_pending.clone()),
            Box::new(stock_return_oldest_pending_seconds.clone()),
            Box::new(stats_refreshed.clone()),
            Box::new(timeouts.clone()),
            Box::new(unknown_cluster_activities.clone()),
            Box::new(seckill_daemon::telemetry::DroppedLines::new("orderd")),
        ] {
            registry.register(c).expect("metric registered once");
        }
        Self {
            registry,
            stream_lag,
            orders_by_state,
            dead_letters,
            dead_letters_total,
            batch_size,
            batch_seconds,
            orders_written,
            batch_failures,
            stock_returns,
            stock_return_retries,
            stock_returns_pending,
            stock_return_oldest_pending_seconds,
            stats_refreshed,
            timeouts,
            unknown_cluster_activities,
        }
    }
}
