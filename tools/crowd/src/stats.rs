//! What the crowd saw: every HTTP answer of the buy path classified into a [`Kind`],
//! with its latency (an HDR histogram per kind, microseconds) and the second of the run
//! it arrived in (throughput over time).
//!
//! Pure bookkeeping, no I/O: the report maths are unit-tested here.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The answer kinds of the buy path (purchase token and reserve routes), after
/// docs/http-api.md. Every request of those routes lands in exactly one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// 200 from the token route: a purchase token.
    Token,
    /// 202: a unit is held.
    Reserved,
    /// 409 `duplicate`: the user already holds this item.
    Duplicate,
    /// 410 `sold_out`: answered at the edge.
    SoldOut,
    /// 410 `ended`.
    Ended,
    /// 425 `too_early`.
    TooEarly,
    /// 429 `rate_limited`.
    Limited,
    /// 429 `busy` (admission cap).
    Busy,
    /// 403 `banned`.
    Banned,
    /// 403 `bad_purchase_token` (or `forbidden`).
    BadToken,
    /// 503 `backend_unavailable`.
    Unavailable,
    /// Anything else: other statuses, 5xx, transport errors, unreadable bodies.
    Errors,
}

impl Kind {
    pub const ALL: [Kind; 12] = [
        Kind::Token,
        Kind::Reserved,
        Kind::Duplicate,
        Kind::SoldOut,
        Kind::Ended,
        Kind::TooEarly,
        Kind::Limited,
        Kind::Busy,
        Kind::Banned,
        Kind::BadToken,
        Kind::Unavailable,
        Kind::Errors,
    ];

    /// The key used in report.json and the terminal.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Token => "token",
            Kind::Reserved => "reserved",
            Kind::Duplicate => "duplicate",
            Kind::SoldOut => "sold_out",
            Kind::Ended => "ended",
            Kind::TooEarly => "too_early",
            Kind::Limited => "limited",
            Kind::Busy => "busy",
            Kind::Banned => "banned",
            Kind::BadToken => "bad_token",
            Kind::Unavailable => "unavailable",
            Kind::Errors => "errors",
        }
    }

    /// Classifies an HTTP answer by status and the stable `error.code` of its body.
    /// `None` status means the request failed in transport.
    pub fn classify(status: Option<u16>, code: Option<&str>) -> Kind {
        match (status, code) {
            (Some(200), _) => Kind::Token,
            (Some(202), _) => Kind::Reserved,
            (Some(409), Some("duplicate")) => Kind::Duplicate,
            (Some(410), Some("sold_out")) => Kind::SoldOut,
            (Some(410), Some("ended")) => Kind::Ended,
            (Some(425), _) => Kind::TooEarly,
            (Some(429), Some("busy")) => Kind::Busy,
            (Some(429), _) => Kind::Limited,
            (Some(403), Some("banned")) => Kind::Banned,
            (Some(403), Some("bad_purchase_token" | "forbidden")) => Kind::BadToken,
            (Some(503), _) => Kind::Unavailable,
            _ => Kind::Errors,
        }
    }

    /// Worth another try (with the same request id) after a pause.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Kind::Limited | Kind::Busy | Kind::Unavailable | Kind::Errors
        )
    }
}

/// Latency percentiles of one kind, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// One second of the run: answers per kind that arrived in it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Second {
    pub t: u64,
    pub total: u64,
    pub by_kind: BTreeMap<Kind, u64>,
}

/// Edges of the latency histogram drawn in report.html, microseconds: powers of two
/// from 0.125 ms to 16 s, then everything above.
pub const BUCKET_EDGES_US: [u64; 18] = [
    125, 250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 512_000,
    1_024_000, 2_048_000, 4_096_000, 8_192_000, 16_384_000,
];

/// Every answer of the run.
#[derive(Debug)]
pub struct Stats {
    per_kind: BTreeMap<Kind, Histogram<u64>>,
    all: Histogram<u64>,
    seconds: Vec<BTreeMap<Kind, u64>>,
    /// Every answer as (`at`, latency, kind), when kept ([`Stats::keeping_answers`]).
    each: Option<Vec<(Duration, Duration, Kind)>>,
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 10 min with 3 significant figures; larger values saturate.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("static histogram bounds are valid")
}

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

impl Stats {
    pub fn new() -> Self {
        Self {
            per_kind: BTreeMap::new(),
            all: histogram(),
            seconds: Vec::new(),
            each: None,
        }
    }

    /// As [`Stats::new`], also keeping every answer ([`Stats::each_answer`]).
    pub fn keeping_answers() -> Self {
        Self {
            each: Some(Vec::new()),
            ..Self::new()
        }
    }

    /// Every answer recorded as (`at`, latency, kind), in the order recorded (the crowd
    /// records `at` as the request's send time from the opening); empty
    /// unless made by [`Stats::keeping_answers`].
    pub fn each_answer(&self) -> &[(Duration, Duration, Kind)] {
        self.each.as_deref().unwrap_or_default()
    }

    /// One answer of `kind` that took `latency` and arrived `at` after the run began.
    pub fn record(&mut self, kind: Kind, latency: Duration, at: Duration) {
        let us = (latency.as_micros() as u64).max(1);
        self.per_kind
            .entry(kind)
            .or_insert_with(histogram)
            .saturating_record(us);
        self.all.saturating_record(us);
        let second = at.as_secs() as usize;
        if self.seconds.len() <= second {
            self.seconds.resize_with(second + 1, BTreeMap::new);
        }
        *self.seconds[second].entry(kind).or_insert(0) += 1;
        if let Some(each) = &mut self.each {
            each.push((at, latency, kind));
        }
    }

    /// Requests recorded (every kind).
    pub fn requests(&self) -> u64 {
        self.all.len()
    }

    pub fn count(&self, kind: Kind) -> u64 {
        self.per_kind.get(&kind).map_or(0, |h| h.len())
    }

    /// Counts of every kind, zeros included, so report.json always has every key.
    pub fn answers(&self) -> BTreeMap<&'static str, u64> {
        Kind::ALL
            .iter()
            .map(|k| (k.name(), self.count(*k)))
            .collect()
    }

    /// Percentiles per kind seen, plus `all`.
    pub fn latency(&self) -> BTreeMap<&'static str, Percentiles> {
        let mut out: BTreeMap<&'static str, Percentiles> = self
            .per_kind
            .iter()
            .map(|(k, h)| (k.name(), percentiles(h)))
            .collect();
        out.insert("all", percentiles(&self.all));
        out
    }

    /// Answers per second, one entry per second from the start (empty seconds too).
    pub fn throughput(&self) -> Vec<Second> {
        self.seconds
            .iter()
            .enumerate()
            .map(|(t, m)| Second {
                t: t as u64,
                total: m.values().sum(),
                by_kind: m.clone(),
            })
            .collect()
    }

    /// Counts of all answers per latency bucket: `(upper edge µs or None for the
    /// overflow bucket, count)`; the counts add up to [`Stats::requests`].
    pub fn latency_buckets(&self) -> Vec<(Option<u64>, u64)> {
        let mut out = Vec::with_capacity(BUCKET_EDGES_US.len() + 1);
        let mut below = 0u64;
        for edge in BUCKET_EDGES_US {
            let upto = if self.all.is_empty() {
                0
            } else {
                self.all.count_between(0, edge - 1)
            };
            out.push((Some(edge), upto - below));
            below = upto;
        }
        out.push((None, self.all.len() - below));
        out
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// p50/p90/p99/max of a histogram in milliseconds (zeros when empty).
pub fn percentiles(h: &Histogram<u64>) -> Percentiles {
    if h.is_empty() {
        return Percentiles {
            count: 0,
            p50_ms: 0.0,
            p90_ms: 0.0,
            p99_ms: 0.0,
            max_ms: 0.0,
        };
    }
    Percentiles {
        count: h.len(),
        p50_ms: ms(h.value_at_quantile(0.50)),
        p90_ms: ms(h.value_at_quantile(0.90)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        max_ms: ms(h.max()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms_(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn every_documented_refusal_lands_in_its_own_kind() {
        assert_eq!(Kind::classify(Some(202), None), Kind::Reserved);
        assert_eq!(Kind::classify(Some(200), None), Kind::Token);
        assert_eq!(
            Kind::classify(Some(409), Some("duplicate")),
            Kind::Duplicate
        );
        assert_eq!(Kind::classify(Some(410), Some("sold_out")), Kind::SoldOut);
        assert_eq!(Kind::classify(Some(410), Some("ended")), Kind::Ended);
        assert_eq!(Kind::classify(Some(425), Some("too_early")), Kind::TooEarly);
        assert_eq!(
            Kind::classify(Some(429), Some("rate_limited")),
            Kind::Limited
        );
        assert_eq!(Kind::classify(Some(429), Some("busy")), Kind::Busy);
        assert_eq!(Kind::classify(Some(403), Some("banned")), Kind::Banned);
        assert_eq!(
            Kind::classify(Some(403), Some("bad_purchase_token")),
            Kind::BadToken
        );
        assert_eq!(
            Kind::classify(Some(503), Some("backend_unavailable")),
            Kind::Unavailable
        );
    }

    #[test]
    fn server_errors_transport_failures_and_unknown_answers_are_errors() {
        assert_eq!(Kind::classify(Some(500), None), Kind::Errors);
        assert_eq!(Kind::classify(None, None), Kind::Errors);
        assert_eq!(Kind::classify(Some(409), Some("conflict")), Kind::Errors);
        assert_eq!(Kind::classify(Some(400), Some("bad_request")), Kind::Errors);
    }

    #[test]
    fn answers_add_up_to_requests_and_list_every_kind() {
        let mut s = Stats::new();
        for i in 0..100 {
            s.record(Kind::SoldOut, ms_(1), ms_(i * 10));
        }
        s.record(Kind::Reserved, ms_(5), ms_(0));
        let answers = s.answers();
        assert_eq!(answers.len(), Kind::ALL.len());
        assert_eq!(answers.values().sum::<u64>(), s.requests());
        assert_eq!(answers["sold_out"], 100);
        assert_eq!(answers["reserved"], 1);
        assert_eq!(answers["errors"], 0);
    }

    #[test]
    fn percentiles_follow_the_recorded_latencies() {
        let mut s = Stats::new();
        for i in 1..=100u64 {
            s.record(Kind::SoldOut, ms_(i), ms_(0));
        }
        let p = s.latency()["sold_out"];
        assert_eq!(p.count, 100);
        // HDR with 3 significant figures: within 0.1 %.
        assert!((p.p50_ms - 50.0).abs() < 0.1, "{p:?}");
        assert!((p.p90_ms - 90.0).abs() < 0.1, "{p:?}");
        assert!((p.p99_ms - 99.0).abs() < 0.1, "{p:?}");
        assert!((p.max_ms - 100.0).abs() < 0.1, "{p:?}");
        assert_eq!(s.latency()["all"].count, 100);
    }

    #[test]
    fn an_empty_run_has_zero_percentiles() {
        let s = Stats::new();
        assert_eq!(s.latency()["all"].count, 0);
        assert_eq!(s.latency()["all"].max_ms, 0.0);
        assert!(s.throughput().is_empty());
        assert_eq!(s.latency_buckets().iter().map(|b| b.1).sum::<u64>(), 0);
    }

    #[test]
    fn every_answer_is_kept_only_when_asked() {
        let mut plain = Stats::new();
        plain.record(Kind::Reserved, ms_(3), ms_(10));
        assert!(plain.each_answer().is_empty());
        let mut kept = Stats::keeping_answers();
        kept.record(Kind::Reserved, ms_(3), ms_(10));
        kept.record(Kind::SoldOut, ms_(1), ms_(2));
        assert_eq!(
            kept.each_answer(),
            [
                (ms_(10), ms_(3), Kind::Reserved),
                (ms_(2), ms_(1), Kind::SoldOut)
            ]
        );
        assert_eq!(kept.requests(), 2, "the histograms count them as before");
    }

    #[test]
    fn throughput_counts_each_answer_in_the_second_it_arrived() {
        let mut s = Stats::new();
        s.record(Kind::Reserved, ms_(1), ms_(100));
        s.record(Kind::SoldOut, ms_(1), ms_(999));
        s.record(Kind::SoldOut, ms_(1), ms_(2_500));
        let t = s.throughput();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].total, 2);
        assert_eq!(t[1].total, 0);
        assert_eq!(t[2].by_kind[&Kind::SoldOut], 1);
    }

    #[test]
    fn latency_buckets_partition_every_answer() {
        let mut s = Stats::new();
        s.record(Kind::SoldOut, Duration::from_micros(100), ms_(0));
        s.record(Kind::SoldOut, Duration::from_micros(130), ms_(0));
        s.record(Kind::SoldOut, ms_(3), ms_(0));
        s.record(Kind::SoldOut, Duration::from_secs(30), ms_(0));
        let b = s.latency_buckets();
        assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), 4);
        assert_eq!(b[0], (Some(125), 1));
        assert_eq!(b[1], (Some(250), 1));
        assert_eq!(b[5], (Some(4_000), 1));
        assert_eq!(*b.last().unwrap(), (None, 1));
    }
}
