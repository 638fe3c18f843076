//! Prometheus metrics of stockd, registered in a [`Metrics`] value that is passed in
//! (no global registry) and served on the admin port.

use std::sync::Arc;

use prometheus::core::{MetricVec, MetricVecBuilder};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// Labels of `stockd_reservations_total` (what `Reserve::label` and the error path
/// give).
pub const RESERVE_OUTCOMES: [&str; 10] = [
    "reserved",
    "retry",
    "duplicate",
    "sold_out",
    "not_enough",
    "not_started",
    "ended",
    "not_found",
    "unavailable",
    "invalid",
];

/// Labels of `stockd_rebalance_round_outcomes_total`: what a rebalancing round found.
/// - `home`: units moved home (all the round claimed, or some while enough remain);
/// - `elsewhere`: nothing moved home, but the shards or the units in transit hold enough,
///   or units were moving when every shard looked empty (the mark was refused); the
///   callers reserve again;
/// - `not_enough`: the shards hold fewer units than the round's caller asked for;
/// - `sold_out`: every shard empty: the item is marked sold out;
/// - `failed`: an error ended the round (the callers it carried retry).
pub const ROUND_OUTCOMES: [&str; 5] = ["home", "elsewhere", "not_enough", "sold_out", "failed"];

/// Labels of `stockd_rebalance_elsewhere_total`: what the look of a round that ended
/// `elsewhere` found.
/// - `shards`: the shards alone hold enough (units bought where they are, or taken by
///   another home's round first);
/// - `transit`: enough only with the units in transit counted (a move between its take
///   and its settle; a give that landed and has not settled is counted twice);
/// - `moving`: every shard looked empty but the mark was refused (units moved during
///   the look).
pub const ELSEWHERE_FOUND: [&str; 3] = ["shards", "transit", "moving"];

/// Labels of `stockd_sold_out_looks_total`: who looked at every shard of an item (a
/// look may end in the sold-out mark).
/// - `round`: a rebalancing round that moved too few units home;
/// - `attempts`: a buyer out of `stock.rebalance_attempts`;
/// - `check`: the check after a reservation emptied its shard, or after a rebuild left
///   an item without units (up to four looks each, while units move).
pub const LOOK_CAUSES: [&str; 3] = ["round", "attempts", "check"];

/// Labels of `stockd_lost_reservations_total`: how the loss was found.
/// - `behind`: a shard's sequence below one this process saw handed out, fence intact
///   (a failover to a replica that lagged);
/// - `fence_missing`: the shard came back without its fence (a node restarted empty,
///   a flush): the reservations this process or MySQL knew of and Redis no longer has;
/// - `key_missing`: a stock key gone while the fence stayed;
/// - `start`: found at start-up, MySQL holding reservations past the shard's sequence.
pub const LOST_PATHS: [&str; 4] = ["behind", "fence_missing", "key_missing", "start"];

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

/// Buckets of the latency histograms of whole calls (a Reserve, a ReserveBatch, a
/// script with its `WAIT`): 0.25 ms to 1 s.
const CALL_BUCKETS: [f64; 12] = [
    0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// A histogram of call latencies in seconds ([`CALL_BUCKETS`]).
fn call_histogram(name: &str, help: &str) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(CALL_BUCKETS.to_vec()))
        .expect("valid metric")
}

/// Buckets of a count of reservations carried together (a call, a message).
const SIZE_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

fn size_histogram(name: &str, help: &str) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(SIZE_BUCKETS.to_vec()))
        .expect("valid metric")
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
    /// `stockd_reserve_batch_rpc_seconds`: one `ReserveBatch` call of an edge, from its
    /// decoded request to its answer, i.e. its slowest entry (every entry waits for it).
    pub reserve_batch_rpc_seconds: Histogram,
    /// `stockd_reserve_stream_entries`: reservations in one message of an edge's
    /// `ReserveStream`.
    pub reserve_stream_entries: Histogram,
    /// `stockd_redis_errors_total{kind}`: timeout, noscript, error.
    pub redis_errors: IntCounterVec,
    /// `stockd_recomputes_total{result}`: ok, error.
    pub recomputes: IntCounterVec,
    /// `stockd_move_repairs_total{when}`: rebuilds failed moves asked for: started
    /// `now`, `deferred` (the gap since the last one was not over), `joined` (one was
    /// already waiting).
    pub move_repairs: IntCounterVec,
    /// `stockd_reserve_gave_up_total`: Reserve calls out of rebalancing attempts while
    /// the shards (and units in transit) still held the quantity asked for, answered
    /// ABORTED (retry). Before, such a buyer was told SOLD_OUT: a false sold-out.
    pub gave_up: IntCounter,
    /// `stockd_sold_out_marks_refused_total`: looks that found every shard empty but
    /// set no sold-out flag, because units were between a take and a give, moved
    /// during the look, or the look's reads spread too wide (`crate::transit`).
    pub sold_out_marks_refused: IntCounter,
    /// `stockd_sold_out_clears_unacked_total`: sold-out clears no replica acknowledged
    /// in time (`redis.replica_acks` > 0), or that failed. Each is sent again in the
    /// background while the item still has units, until a replica holds one
    /// (`App::clear_sold_out`, `crate::clear`).
    pub sold_out_clears_unacked: IntCounter,
    /// `stockd_sold_out_flags_back_total`: clears sent again that found the flag set
    /// while the item had units: a failover lost the first clear (or a mark raced the
    /// look before the send).
    pub sold_out_flags_back: IntCounter,
    /// `stockd_lost_writes_total`: times a shard's sequence was found below one
    /// already handed out (Redis lost writes; a recompute follows).
    pub lost_writes: IntCounter,
    /// `stockd_lost_reservations_total{path}`: reservations answered RESERVED and then
    /// lost by Redis before orderd read them, by the path that found them
    /// ([`LOST_PATHS`]). Page on any rise.
    pub lost_reservations: IntCounterVec,
    /// `stockd_lost_unconfirmed_total`: reservations Redis lost that were never answered
    /// RESERVED (no replica acknowledged them in time; their callers got UNAVAILABLE and
    /// retry): promised to nobody, so no page.
    pub lost_unconfirmed: IntCounter,
    /// `stockd_replica_ack_seconds`: a replica-acknowledged reserve call, script and
    /// `WAIT` together, seconds.
    pub replica_ack_seconds: Histogram,
    /// `stockd_replica_acks_total{outcome}`: replica-acknowledged calls by outcome
    /// (`ok`, `timeout`: fewer replicas than `redis.replica_acks` answered in time).
    pub replica_acks_total: IntCounterVec,
    /// `stockd_replica_ack_timeouts_total`: calls whose writes no replica acknowledged
    /// in time (their reservations answered UNAVAILABLE). Page when it keeps rising.
    pub replica_ack_timeouts: IntCounter,
    /// `stockd_unavailable_activities`: open activities this process answers
    /// UNAVAILABLE for (Redis lost state, a rebuild runs or waits). Page when it stays
    /// above 0.
    pub unavailable_activities: IntGauge,
    /// `stockd_rebuild_leases_held`: activity rebuild leases this process holds now.
    pub rebuild_leases_held: IntGauge,
    /// `stockd_rebuild_lease_waits_total`: rebuilds that found another stockd holding
    /// the activity's lease and waited for it.
    pub rebuild_lease_waits: IntCounter,
    /// `stockd_rebalance_units_total`: units moved between shards.
    pub rebalance_units: IntCounter,
    /// `stockd_rebalance_rounds_total`: rebalancing rounds run (one per item and empty
    /// home shard at a time, for every reservation waiting on it; `crate::mover`).
    pub rebalance_rounds: IntCounter,
    /// `stockd_rebalance_rereads_total`: reads of the shards a round made again within
    /// itself (after a take came back empty with nothing moved yet, or after it waited
    /// for kept units or for a move to land).
    pub rebalance_rereads: IntCounter,
    /// `stockd_rebalance_landing_waits_total`: waits of a round that found no donor
    /// while this process's moves of the item were between a take and a give, for one
    /// of them to land (`crate::mover::Landing`).
    pub rebalance_landing_waits: IntCounter,
    /// `stockd_rebalance_round_outcomes_total{outcome}`: rebalancing rounds ended, by
    /// what they found ([`ROUND_OUTCOMES`]).
    pub rebalance_round_outcomes: IntCounterVec,
    /// `stockd_rebalance_takes_empty_total`: rebalancing takes that found the donor
    /// empty (its units went between the round's read and the take).
    pub rebalance_takes_empty: IntCounter,
    /// `stockd_rebalance_elsewhere_total{found}`: rounds ended `elsewhere`, by what their
    /// look found ([`ELSEWHERE_FOUND`]).
    pub rebalance_elsewhere: IntCounterVec,
    /// `stockd_sold_out_looks_total{by}`: looks at every shard of an item, by who looked
    /// ([`LOOK_CAUSES`]); each is a `GET` and one `look` call per shard.
    pub sold_out_looks: IntCounterVec,
    /// `stockd_rebalance_round_seconds`: one rebalancing round, from its turn to its
    /// outcome (the read of the shards, the takes and gives, the look when too few moved).
    pub rebalance_round_seconds: Histogram,
    /// `stockd_rebalance_wait_seconds`: a reservation whose home shard was empty, from
    /// asking for a round to its turn, or to the outcome of the round that carried it, or
    /// to the sold-out flag.
    pub rebalance_wait_seconds: Histogram,
    /// `stockd_rebalance_waits_per_reserved`: for a reservation answered RESERVED whose
    /// home shard was empty at least once, how many times it was (each time it waited
    /// for a rebalancing round, or ran one).
    pub rebalance_waits_per_reserved: Histogram,
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
        let reserve_seconds =
            call_histogram("stockd_reserve_seconds", "Latency of a whole Reserve");
        let reserve_batch = size_histogram(
            "stockd_reserve_batch_size",
            "Reservations sent in one reserve call",
        );
        let reserve_batch_rpc_seconds = call_histogram(
            "stockd_reserve_batch_rpc_seconds",
            "One ReserveBatch call, request decoded to answer (its slowest entry)",
        );
        let reserve_stream_entries = size_histogram(
            "stockd_reserve_stream_entries",
            "Reservations in one message of an edge's ReserveStream",
        );
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
        let move_repairs = IntCounterVec::new(
            Opts::new(
                "stockd_move_repairs_total",
                "Rebuilds asked for by rebalancing moves whose units may be held back, by when",
            ),
            &["when"],
        )
        .expect("valid metric");
        let sold_out_marks_refused = IntCounter::new(
            "stockd_sold_out_marks_refused_total",
            "Looks at every shard that found them empty but set no sold-out flag: units \
             were moving between shards, moved during the look, or the look's reads \
             spread over more than a second",
        )
        .expect("valid metric");
        let sold_out_clears_unacked = IntCounter::new(
            "stockd_sold_out_clears_unacked_total",
            "Sold-out clears no replica acknowledged in time (or that failed), each sent \
             again in the background while the item has units until a replica holds one",
        )
        .expect("valid metric");
        let sold_out_flags_back = IntCounter::new(
            "stockd_sold_out_flags_back_total",
            "Sold-out clears sent again that found the flag set while the item had units \
             (a failover lost the first clear)",
        )
        .expect("valid metric");
        let gave_up = IntCounter::new(
            "stockd_reserve_gave_up_total",
            "Reserve calls out of rebalancing attempts while the shards still held the \
             quantity asked for, answered ABORTED (retry)",
        )
        .expect("valid metric");
        let lost_writes = IntCounter::new(
            "stockd_lost_writes_total",
            "Shards found with a sequence below one already handed out (Redis lost writes)",
        )
        .expect("valid metric");
        let lost_reservations = IntCounterVec::new(
            Opts::new(
                "stockd_lost_reservations_total",
                "Reservations handed out and then lost by Redis, by the path that found them",
            ),
            &["path"],
        )
        .expect("valid metric");
        let lost_unconfirmed = IntCounter::new(
            "stockd_lost_unconfirmed_total",
            "Reservations Redis lost that were never answered RESERVED (no replica acknowledged them)",
        )
        .expect("valid metric");
        let replica_ack_seconds = call_histogram(
            "stockd_replica_ack_seconds",
            "A replica-acknowledged script call (EVALSHA + WAIT), seconds",
        );
        let replica_acks_total = IntCounterVec::new(
            Opts::new(
                "stockd_replica_acks_total",
                "Replica-acknowledged calls by outcome (ok, timeout)",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let replica_ack_timeouts = IntCounter::new(
            "stockd_replica_ack_timeouts_total",
            "Calls whose writes no replica acknowledged in time (answered UNAVAILABLE)",
        )
        .expect("valid metric");
        let unavailable_activities = IntGauge::new(
            "stockd_unavailable_activities",
            "Open activities answered UNAVAILABLE (Redis state lost, rebuild running or waiting)",
        )
        .expect("valid metric");
        let rebuild_leases_held = IntGauge::new(
            "stockd_rebuild_leases_held",
            "Activity rebuild leases this process holds",
        )
        .expect("valid metric");
        let rebuild_lease_waits = IntCounter::new(
            "stockd_rebuild_lease_waits_total",
            "Rebuilds that waited for another stockd's lease on the activity",
        )
        .expect("valid metric");
        for path in LOST_PATHS {
            lost_reservations.with_label_values(&[path]);
        }
        for outcome in ["ok", "timeout"] {
            replica_acks_total.with_label_values(&[outcome]);
        }
        let rebalance_units = IntCounter::new(
            "stockd_rebalance_units_total",
            "Units moved from a donor shard to an empty home shard",
        )
        .expect("valid metric");
        let rebalance_rounds = IntCounter::new(
            "stockd_rebalance_rounds_total",
            "Rebalancing rounds run: one per item and empty home shard at a time, for every \
             reservation waiting on it",
        )
        .expect("valid metric");
        let rebalance_rereads = IntCounter::new(
            "stockd_rebalance_rereads_total",
            "Reads of the shards a rebalancing round made again within itself: after a take \
             came back empty with nothing moved yet, or after it waited for kept units or \
             for a move to land",
        )
        .expect("valid metric");
        let rebalance_landing_waits = IntCounter::new(
            "stockd_rebalance_landing_waits_total",
            "Waits of a rebalancing round that found no donor while this process's moves \
             of the item were between a take and a give, for one of them to land",
        )
        .expect("valid metric");
        let rebalance_round_outcomes = IntCounterVec::new(
            Opts::new(
                "stockd_rebalance_round_outcomes_total",
                "Rebalancing rounds ended, by what they found",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let rebalance_takes_empty = IntCounter::new(
            "stockd_rebalance_takes_empty_total",
            "Rebalancing takes that found the donor empty (its units went between the \
             round's read and the take)",
        )
        .expect("valid metric");
        let rebalance_elsewhere = IntCounterVec::new(
            Opts::new(
                "stockd_rebalance_elsewhere_total",
                "Rebalancing rounds that moved nothing home while units remained, by what \
                 their look found",
            ),
            &["found"],
        )
        .expect("valid metric");
        let sold_out_looks = IntCounterVec::new(
            Opts::new(
                "stockd_sold_out_looks_total",
                "Looks at every shard of an item (the change count, then each shard's units \
                 and units in transit), by who looked",
            ),
            &["by"],
        )
        .expect("valid metric");
        let rebalance_round_seconds = call_histogram(
            "stockd_rebalance_round_seconds",
            "One rebalancing round, from its turn to its outcome",
        );
        let rebalance_wait_seconds = call_histogram(
            "stockd_rebalance_wait_seconds",
            "A reservation whose home shard was empty: waiting for a rebalancing round's turn \
             or for the round that carried it",
        );
        let rebalance_waits_per_reserved = Histogram::with_opts(
            HistogramOpts::new(
                "stockd_rebalance_waits_per_reserved",
                "Times the home shard of a reservation answered RESERVED was empty (rounds \
                 it waited for or ran), for those that found it empty at least once",
            )
            .buckets(vec![1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0]),
        )
        .expect("valid metric");
        for m in [
            Box::new(reservations.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(releases.clone()),
            Box::new(lua_seconds.clone()),
            Box::new(reserve_seconds.clone()),
            Box::new(reserve_batch.clone()),
            Box::new(reserve_batch_rpc_seconds.clone()),
            Box::new(reserve_stream_entries.clone()),
            Box::new(redis_errors.clone()),
            Box::new(recomputes.clone()),
            Box::new(move_repairs.clone()),
            Box::new(gave_up.clone()),
            Box::new(sold_out_marks_refused.clone()),
            Box::new(sold_out_clears_unacked.clone()),
            Box::new(sold_out_flags_back.clone()),
            Box::new(lost_writes.clone()),
            Box::new(lost_reservations.clone()),
            Box::new(rebalance_units.clone()),
            Box::new(rebalance_rounds.clone()),
            Box::new(rebalance_rereads.clone()),
            Box::new(rebalance_landing_waits.clone()),
            Box::new(rebalance_round_outcomes.clone()),
            Box::new(rebalance_elsewhere.clone()),
            Box::new(rebalance_takes_empty.clone()),
            Box::new(sold_out_looks.clone()),
            Box::new(rebalance_round_seconds.clone()),
            Box::new(rebalance_wait_seconds.clone()),
            Box::new(rebalance_waits_per_reserved.clone()),
            Box::new(lost_unconfirmed.clone()),
            Box::new(replica_ack_seconds.clone()),
            Box::new(replica_acks_total.clone()),
            Box::new(replica_ack_timeouts.clone()),
            Box::new(unavailable_activities.clone()),
            Box::new(rebuild_leases_held.clone()),
            Box::new(rebuild_lease_waits.clone()),
            Box::new(seckill_daemon::telemetry::DroppedLines::new("stockd")),
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
            reserve_batch_rpc_seconds,
            reserve_stream_entries,
            redis_errors,
            recomputes,
            move_repairs,
            gave_up,
            sold_out_marks_refused,
            sold_out_clears_unacked,
            sold_out_flags_back,
            lost_writes,
            lost_reservations,
            rebalance_units,
            rebalance_rounds,
            rebalance_rereads,
            rebalance_landing_waits,
            rebalance_round_outcomes,
            rebalance_elsewhere,
            rebalance_takes_empty,
            sold_out_looks,
            rebalance_round_seconds,
            rebalance_wait_seconds,
            rebalance_waits_per_reserved,
            lost_unconfirmed,
            replica_ack_seconds,
            replica_acks_total,
            replica_ack_timeouts,
            unavailable_activities,
            rebuild_leases_held,
            rebuild_lease_waits,
        }
    }

    /// Lost reservations over every path.
    pub fn lost_reservations_total(&self) -> u64 {
        LOST_PATHS
            .iter()
            .map(|p| self.lost_reservations.with_label_values(&[p]).get())
            .sum()
    }

    /// Counts lost reservations found on `path`: `promised` were answered RESERVED,
    /// `unconfirmed` were not.
    pub fn count_lost(&self, path: &str, promised: u64, unconfirmed: u64) {
        self.lost_reservations
            .with_label_values(&[path])
            .inc_by(promised);
        self.lost_unconfirmed.inc_by(unconfirmed);
    }

    /// Counts one replica-acknowledged call that took `secs`.
    pub fn replica_acks(&self, replicated: bool, secs: f64) {
        self.replica_ack_seconds.observe(secs);
        if replicated {
            self.replica_acks_total.with_label_values(&["ok"]).inc();
        } else {
            self.replica_acks_total
                .with_label_values(&["timeout"])
                .inc();
            self.replica_ack_timeouts.inc();
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

    /// Counts one rebalancing round that found `outcome` (one of [`ROUND_OUTCOMES`]).
    pub fn count_round(&self, outcome: &str) {
        self.rebalance_round_outcomes
            .with_label_values(&[outcome])
            .inc();
    }

    /// Counts one round that ended `elsewhere`, by what its look `found` (one of
    /// [`ELSEWHERE_FOUND`]).
    pub fn count_elsewhere(&self, found: &str) {
        self.rebalance_elsewhere.with_label_values(&[found]).inc();
    }

    /// Counts one look at every shard of an item by `by` (one of [`LOOK_CAUSES`]).
    pub fn count_look(&self, by: &str) {
        self.sold_out_looks.with_label_values(&[by]).inc();
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
                quantity: 1,
            },
            Reserve::Reserved {
                reservation_id: String::new(),
                remaining_hint: 0,
                retry: true,
                quantity: 2,
            },
            Reserve::Duplicate {
                reservation_id: String::new(),
                remaining_hint: 0,
                quantity: 1,
            },
            Reserve::SoldOut,
            Reserve::NotEnough { remaining: 1 },
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
