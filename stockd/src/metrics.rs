//! Prometheus metrics of stockd, registered in a [`Metrics`] value that is passed in
//! (no global registry) and served on the admin port.

use std::sync::Arc;

use prometheus::core::{MetricVec, MetricVecBuilder};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};

/// Labels of `stockd_reservations_total` (what `Reserve::label` and the error path
/// give).
pub const RESERVE_OUTCOMES: [&str; 9] = [
    "reserved",
    "retry",
    "duplicate",
    "sold_out",
    "not_started",
    "ended",
    "not_found",
    "unavailable",
    "invalid",
];

/// The children of a labelled metric for a known set of labels, resolved once:
/// counting on the hot path then skips `with_label_values` (hashing the labels, the
/// vector's lock, and an `Arc` clone and drop shared by every thread).
#[derive(Clone)]
pub struct Children<M>(Arc<[(&'static str, M)]>);

impl<M: Clone> Children<M> {
    fn resolve<T: MetricVecBuilder<M = M>>(vec: &MetricVec<T>, labels: &[&'static str]) -> Self {
        Self(
            labels
                .iter()
                .map(|&l| (l, vec.with_label_values(&[l])))
                .collect(),
        )
    }

    fn get(&self, label: &str) -> Option<&M> {
        self.0.iter().find(|(l, _)| *l == label).map(|(_, m)| m)
    }
}

/// Every stockd metric and the registry holding them.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// `stockd_reservations_total{outcome}`: Reserve answers by outcome
    /// (reserved, retry, duplicate, sold_out, not_started, ended, not_found,
    /// unavailable, invalid).
    pub reservations: IntCounterVec,
    /// `stockd_releases_total{outcome}`: released, not_held.
    pub releases: IntCounterVec,
    /// `stockd_lua_seconds{script}`: latency of one EVALSHA, seconds.
    pub lua_seconds: HistogramVec,
    /// `stockd_reserve_seconds`: latency of a whole Reserve (rebalancing included).
    pub reserve_seconds: Histogram,
    /// `stockd_reserve_batch_size`: reservations per reserve call (group commit).
    pub reserve_batch: Histogram,
    /// `stockd_redis_errors_total{kind}`: timeout, noscript, error.
    pub redis_errors: IntCounterVec,
    /// `stockd_recomputes_total{result}`: ok, error.
    pub recomputes: IntCounterVec,
    /// `stockd_false_sold_out_total`: SOLD_OUT answered while another shard still held
    /// units (rebalancing gave up).
    pub false_sold_out: IntCounter,
    /// `stockd_lost_writes_total`: times a shard's sequence was found below one
    /// already handed out (Redis lost writes; a recompute follows).
    pub lost_writes: IntCounter,
    /// `stockd_lost_reservations_total`: reservations handed out and then lost by Redis
    /// before orderd read them (the sequence gap at each detection).
    pub lost_reservations: IntCounter,
    /// `stockd_rebalance_moves_total`: units moved between shards.
    pub rebalance_units: IntCounter,
    reservations_by: Children<IntCounter>,
    lua_seconds_by: Children<Histogram>,
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let registry = Registry::new();
        let reservations = IntCounterVec::new(
            Opts::new("stockd_reservations_total", "Reserve answers by outcome"),
            &["outcome"],
        )
        .expect("valid metric");
        let releases = IntCounterVec::new(
            Opts::new("stockd_releases_total", "Release answers by outcome"),
            &["outcome"],
        )
        .expect("valid metric");
        let lua_seconds = HistogramVec::new(
            HistogramOpts::new("stockd_lua_seconds", "Latency of one Lua call (EVALSHA)").buckets(
                vec![
                    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    0.5, 1.0,
                ],
            ),
            &["script"],
        )
        .expect("valid metric");
        let reserve_seconds = Histogram::with_opts(
            HistogramOpts::new("stockd_reserve_seconds", "Latency of a whole Reserve").buckets(
                vec![
                    0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                ],
            ),
        )
        .expect("valid metric");
        let reserve_batch = Histogram::with_opts(
            HistogramOpts::new(
                "stockd_reserve_batch_size",
                "Reservations sent in one reserve call",
            )
            .buckets(vec![
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0,
            ]),
        )
        .expect("valid metric");
        let redis_errors = IntCounterVec::new(
            Opts::new("stockd_redis_errors_total", "Redis errors by kind"),
            &["kind"],
        )
        .expect("valid metric");
        let recomputes = IntCounterVec::new(
            Opts::new(
                "stockd_recomputes_total",
                "Rebuilds of an activity's shards from MySQL",
            ),
            &["result"],
        )
        .expect("valid metric");
        let false_sold_out = IntCounter::new(
            "stockd_false_sold_out_total",
            "SOLD_OUT answers given while another shard still held units",
        )
        .expect("valid metric");
        let lost_writes = IntCounter::new(
            "stockd_lost_writes_total",
            "Shards found with a sequence below one already handed out (Redis lost writes)",
        )
        .expect("valid metric");
        let lost_reservations = IntCounter::new(
            "stockd_lost_reservations_total",
            "Reservations handed out and then lost by Redis (sequence gaps)",
        )
        .expect("valid metric");
        let rebalance_units = IntCounter::new(
            "stockd_rebalance_units_total",
            "Units moved from a donor shard to an empty home shard",
        )
        .expect("valid metric");
        for m in [
            Box::new(reservations.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(releases.clone()),
            Box::new(lua_seconds.clone()),
            Box::new(reserve_seconds.clone()),
            Box::new(reserve_batch.clone()),
            Box::new(redis_errors.clone()),
            Box::new(recomputes.clone()),
            Box::new(false_sold_out.clone()),
            Box::new(lost_writes.clone()),
            Box::new(lost_reservations.clone()),
            Box::new(rebalance_units.clone()),
        ] {
            registry.register(m).expect("metric names are unique");
        }
        Self {
            registry,
            reservations_by: Children::resolve(&reservations, &RESERVE_OUTCOMES),
            lua_seconds_by: Children::resolve(
                &lua_seconds,
                &seckill_lua::scripts::ALL.map(|s| s.name),
            ),
            reservations,
            releases,
            lua_seconds,
            reserve_seconds,
            reserve_batch,
            redis_errors,
            recomputes,
            false_sold_out,
            lost_writes,
            lost_reservations,
            rebalance_units,
        }
    }
}

impl Metrics {
    /// Counts one Reserve answer (`outcome`: one of [`RESERVE_OUTCOMES`]).
    pub fn count_reservation(&self, outcome: &str) {
        match self.reservations_by.get(outcome) {
            Some(c) => c.inc(),
            None => self.reservations.with_label_values(&[outcome]).inc(),
        }
    }

    /// Observes one Lua call of `script`, in seconds.
    pub fn observe_lua(&self, script: &str, secs: f64) {
        match self.lua_seconds_by.get(script) {
            Some(h) => h.observe(secs),
            None => self.lua_seconds.with_label_values(&[script]).observe(secs),
        }
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
    use crate::stock::Reserve;

    #[test]
    fn every_reserve_outcome_has_a_resolved_counter() {
        let m = Metrics::new();
        let answers = [
            Reserve::Reserved {
                reservation_id: String::new(),
                remaining_hint: 0,
                retry: false,
            },
            Reserve::Reserved {
                reservation_id: String::new(),
                remaining_hint: 0,
                retry: true,
            },
            Reserve::Duplicate {
                reservation_id: String::new(),
                remaining_hint: 0,
            },
            Reserve::SoldOut,
            Reserve::NotStarted,
            Reserve::Ended,
            Reserve::NotFound,
        ];
        for label in answers
            .iter()
            .map(Reserve::label)
            .chain(["unavailable", "invalid"])
        {
            assert!(m.reservations_by.get(label).is_some(), "{label}");
            m.count_reservation(label);
            assert_eq!(
                m.reservations.with_label_values(&[label]).get(),
                1,
                "{label}"
            );
        }
        for s in seckill_lua::scripts::ALL {
            m.observe_lua(s.name, 0.001);
            assert_eq!(
                m.lua_seconds
                    .with_label_values(&[s.name])
                    .get_sample_count(),
                1
            );
        }
    }
}
