//! The virtual waiting room (issue 14, item 2), per activity.
//!
//! A buyer joins (`POST /api/v1/activities/{a}/room/join`: one Redis call, a ticket from
//! `HINCRBY`) and gets a signed position token ([`token`]); heartbeats, polls and the
//! SSE stream renew it with no Redis call. Every gateway runs the activity's admission
//! step ([`store::TICK`]) every `room.tick_ms`: one atomic Lua call that moves the
//! fleet-wide watermark `admitted` at `admit_per_sec` while fewer than `max_active`
//! buyers are active, and returns the queue's shape. A ticket is admitted once its
//! position ([`order::Layout::position`]: the pre-queue shuffled at the opening, later
//! arrivals FIFO or shuffled in blocks) is at most the watermark; the gateway then
//! checks once in Redis that the ticket is the user's latest and signs an admission
//! token, which `POST .../items/{s}/token` requires while the room queues
//! ([`Room::gate`]).
//!
//! Parts: [`config`] (`[room]`), [`token`] (signing), [`order`] (shuffle, positions,
//! ETA), [`store`] (keys and Lua), [`tick`] (the background loop and the admin knobs),
//! `web` (the routes). The design and its approximations: docs/gateway.md.

pub mod config;
pub mod order;
pub mod store;
pub mod tick;
pub mod token;
mod web;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde_json::{json, Value};

pub use config::{Method, RoomConfig};
use order::Layout;
use token::Signer;

use crate::answer::Refusal;

/// An activity's queue as its last tick saw it.
#[derive(Debug, Clone)]
pub struct Live {
    /// Redis time of the tick, unix ms.
    pub redis_ms: u64,
    pub method: Method,
    pub paused: bool,
    pub max_active: u64,
    pub admit_per_sec: f64,
    pub random_block: u64,
    /// Tickets issued.
    pub next: u64,
    /// The watermark: positions `1..=admitted` are admitted.
    pub admitted: u64,
    /// Admitted within the last `session_secs`.
    pub active: u64,
    pub layout: Layout,
    /// Measured admissions per second over the last few seconds (this gateway's view).
    pub admitted_per_sec: f64,
    /// How long the longest-waiting ticket has waited, ms (approximate: see
    /// docs/gateway.md).
    pub oldest_wait_ms: u64,
}

impl Live {
    /// People waiting: tickets issued not yet admitted.
    pub fn queued(&self) -> u64 {
        self.next.saturating_sub(self.admitted)
    }

    /// The rate the estimate divides by: the knob, or nothing while paused.
    pub fn eta_rate(&self) -> f64 {
        if self.paused || !self.method.queues() {
            0.0
        } else {
            self.admit_per_sec
        }
    }
}

/// Per-activity history of `(redis ms, admitted, next)` samples, for the admission
/// rate and the oldest wait.
#[derive(Default)]
struct History(VecDeque<(u64, u64, u64)>);

impl History {
    const KEEP_MS: u64 = 10 * 60 * 1000;

    fn push(&mut self, now: u64, admitted: u64, next: u64) {
        if self.0.back().is_some_and(|&(t, _, _)| t >= now) {
            return;
        }
        self.0.push_back((now, admitted, next));
        while self.0.len() > 2
            && self
                .0
                .front()
                .is_some_and(|&(t, _, _)| t + Self::KEEP_MS < now)
        {
            self.0.pop_front();
        }
    }

    /// Admissions per second over the last 5 s.
    fn rate(&self, now: u64) -> f64 {
        let Some(&(t1, w1, _)) = self.0.back() else {
            return 0.0;
        };
        let from = self
            .0
            .iter()
            .find(|&&(t, _, _)| t + 5000 >= now)
            .copied()
            .unwrap_or((t1, w1, 0));
        let dt = t1.saturating_sub(from.0);
        if dt == 0 {
            return 0.0;
        }
        w1.saturating_sub(from.1) as f64 * 1000.0 / dt as f64
    }

    /// Since when ticket `admitted + 1` has waited: the time of the first sample in
    /// which it had been issued.
    fn oldest_wait(&self, now: u64, admitted: u64, next: u64) -> u64 {
        if next <= admitted {
            return 0;
        }
        self.0
            .iter()
            .find(|&&(_, _, n)| n > admitted)
            .map_or(0, |&(t, _, _)| now.saturating_sub(t))
    }
}

/// The room's metrics, labelled by activity.
pub struct RoomMetrics {
    pub queued: IntGaugeVec,
    pub active: IntGaugeVec,
    pub admitted_per_sec: GaugeVec,
    pub oldest_wait: GaugeVec,
    pub estimated_wait: GaugeVec,
    pub joins: IntCounterVec,
    pub admissions: IntCounterVec,
    pub tick_errors: IntCounterVec,
}

impl RoomMetrics {
    fn new(registry: &Registry) -> Self {
        let g =
            |n: &str, h: &str| IntGaugeVec::new(Opts::new(n, h), &["activity"]).expect("metric");
        let f = |n: &str, h: &str| GaugeVec::new(Opts::new(n, h), &["activity"]).expect("metric");
        let c =
            |n: &str, h: &str| IntCounterVec::new(Opts::new(n, h), &["activity"]).expect("metric");
        let m = Self {
            queued: g(
                "gateway_room_queued",
                "Waiting-room tickets issued and not admitted yet",
            ),
            active: g(
                "gateway_room_active",
                "Buyers admitted within the last room.session_secs (the max_active budget)",
            ),
            admitted_per_sec: f(
                "gateway_room_admitted_per_second",
                "Admissions per second over the last 5 s (the fleet's watermark)",
            ),
            oldest_wait: f(
                "gateway_room_oldest_wait_seconds",
                "How long the first ticket not yet admitted has waited",
            ),
            estimated_wait: f(
                "gateway_room_estimated_wait_seconds",
                "Estimated wait of a buyer joining now: queued / admit_per_sec",
            ),
            joins: c(
                "gateway_room_joins_total",
                "Joins answered with a new ticket by this gateway",
            ),
            admissions: c(
                "gateway_room_admissions_total",
                "Admission tokens first signed by this gateway",
            ),
            tick_errors: c(
                "gateway_room_tick_errors_total",
                "Admission steps that failed in Redis",
            ),
        };
        for col in [
            Box::new(m.queued.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.active.clone()),
            Box::new(m.admitted_per_sec.clone()),
            Box::new(m.oldest_wait.clone()),
            Box::new(m.estimated_wait.clone()),
            Box::new(m.joins.clone()),
            Box::new(m.admissions.clone()),
            Box::new(m.tick_errors.clone()),
        ] {
            registry.register(col).expect("room metric registered once");
        }
        m
    }
}

/// The room of every activity, as this gateway knows it.
pub struct Room {
    pub cfg: RoomConfig,
    pub signer: Signer,
    live: RwLock<HashMap<u64, Arc<Live>>>,
    history: Mutex<HashMap<u64, History>>,
    /// The Redis client of the tick loop, shared with joins and the admin call.
    pub(crate) client: OnceLock<fred::prelude::Client>,
    pub metrics: RoomMetrics,
}

/// What [`Room::gate`] decided for a purchase token.
#[derive(Debug, PartialEq)]
pub enum Gate {
    /// No room (passthrough), or a valid admission token.
    Open,
    Refused(Refusal),
}

/// A refusal of the room, with its stable code.
pub fn refusal(status: u16, code: &'static str, message: &'static str) -> Refusal {
    Refusal::Room {
        status,
        code,
        message: message.into(),
    }
}

impl Room {
    pub fn new(cfg: &RoomConfig, purchase_secret: &str, registry: &Registry) -> Self {
        Self {
            signer: Signer::from_config(cfg, purchase_secret),
            cfg: cfg.clone(),
            live: RwLock::new(HashMap::new()),
            history: Mutex::new(HashMap::new()),
            client: OnceLock::new(),
            metrics: RoomMetrics::new(registry),
        }
    }

    /// The activity's queue as last ticked, if any tick answered yet.
    pub fn live(&self, a: u64) -> Option<Arc<Live>> {
        self.live
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&a)
            .cloned()
    }

    /// The method in force: the live one, else the config's (read in place: every
    /// challenge issue in the fast lane asks).
    pub fn method(&self, a: u64) -> Method {
        self.live
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&a)
            .map_or(self.cfg.method, |l| l.method)
    }

    /// Stores a tick's answer, updating the history and the metrics.
    pub(crate) fn store(&self, a: u64, mut live: Live) {
        {
            let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
            let h = h.entry(a).or_default();
            h.push(live.redis_ms, live.admitted, live.next);
            live.admitted_per_sec = h.rate(live.redis_ms);
            live.oldest_wait_ms = h.oldest_wait(live.redis_ms, live.admitted, live.next);
        }
        let label = a.to_string();
        let m = &self.metrics;
        m.queued
            .with_label_values(&[&label])
            .set(live.queued() as i64);
        m.active
            .with_label_values(&[&label])
            .set(live.active as i64);
        m.admitted_per_sec
            .with_label_values(&[&label])
            .set(live.admitted_per_sec);
        m.oldest_wait
            .with_label_values(&[&label])
            .set(live.oldest_wait_ms as f64 / 1000.0);
        m.estimated_wait
            .with_label_values(&[&label])
            .set(order::eta_secs(live.queued(), live.eta_rate()).unwrap_or(0) as f64);
        self.live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(a, Arc::new(live));
    }

    /// Forgets activities no longer in the catalog.
    pub(crate) fn retain(&self, keep: impl Fn(u64) -> bool) {
        self.live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|a, _| keep(*a));
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|a, _| keep(*a));
    }

    /// The one call at the top of the purchase-token handler: with the room queueing,
    /// a valid admission token of this user for this activity (header
    /// `X-Room-Admission` or cookie `sk_admit_<a>`) is required; `reject` refuses
    /// everyone. No Redis call.
    pub fn gate(&self, a: u64, user: &str, headers: &http::HeaderMap, now_ms: u64) -> Gate {
        if let Some(g) = Self::gate_without_token(self.method(a)) {
            return g;
        }
        let Some(t) = presented(headers, "x-room-admission", &admit_cookie(a)) else {
            return Gate::Refused(refusal(
                403,
                "admission_required",
                "join the waiting room first: this sale needs an admission token",
            ));
        };
        match self.signer.check_admission(&t, a, user, now_ms) {
            Ok(_) => Gate::Open,
            Err(e) => Gate::Refused(refusal(403, "bad_admission_token", e.message())),
        }
    }

    /// The gate's verdict under `method` when it needs no admission token
    /// (`passthrough` opens, `reject` refuses); `None` while the room queues. The fast
    /// lane reads the method once and answers only these.
    pub fn gate_without_token(method: Method) -> Option<Gate> {
        match method {
            Method::Passthrough => Some(Gate::Open),
            Method::Reject => Some(Gate::Refused(closed())),
            Method::Fifo | Method::Random => None,
        }
    }

    /// The room's public status: queued, active, rates, waits, knobs.
    pub fn status_json(&self, a: u64) -> Value {
        let cfg = &self.cfg;
        match self.live(a) {
            Some(l) => json!({
                "activity_id": a,
                "method": l.method.name(),
                "paused": l.paused,
                "open": l.layout.pre.is_some(),
                "queued": l.queued(),
                "active": l.active,
                "max_active": l.max_active,
                "admit_per_sec": l.admit_per_sec,
                "admitted_per_sec": (l.admitted_per_sec * 100.0).round() / 100.0,
                "admitted": l.admitted,
                "issued": l.next,
                "oldest_wait_secs": l.oldest_wait_ms as f64 / 1000.0,
                "estimated_wait_secs": order::eta_secs(l.queued(), l.eta_rate()),
                "server_time_ms": l.redis_ms,
            }),
            None => json!({
                "activity_id": a,
                "method": cfg.method.name(),
                "paused": false,
                "open": false,
                "queued": 0,
                "active": 0,
                "max_active": cfg.max_active,
                "admit_per_sec": cfg.admit_per_sec,
                "admitted_per_sec": 0.0,
                "admitted": 0,
                "issued": 0,
                "oldest_wait_secs": 0.0,
                "estimated_wait_secs": 0,
                "server_time_ms": seckill_lua::clock::unix_ms(),
            }),
        }
    }
}

/// The kill switch's answer.
pub fn closed() -> Refusal {
    refusal(
        503,
        "room_closed",
        "the waiting room is closed to every buyer (kill switch); nothing is on sale now",
    )
}

/// Cookie holding the position token of activity `a`.
pub fn place_cookie(a: u64) -> String {
    format!("sk_room_{a}")
}

/// Cookie holding the admission token of activity `a`.
pub fn admit_cookie(a: u64) -> String {
    format!("sk_admit_{a}")
}

/// A token from the header `header`, else from the cookie `cookie`.
pub fn presented(headers: &http::HeaderMap, header: &str, cookie: &str) -> Option<String> {
    if let Some(v) = headers.get(header).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if !v.is_empty() {
            return Some(v.to_string());
        }
    }
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == cookie && !v.is_empty()).then(|| v.to_string())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_read_from_the_header_first_then_the_cookie() {
        let mut h = http::HeaderMap::new();
        assert_eq!(presented(&h, "x-room-admission", "sk_admit_1"), None);
        h.insert(
            http::header::COOKIE,
            "a=b; sk_admit_1=tok1; sk_admit_12=tok12".parse().unwrap(),
        );
        assert_eq!(
            presented(&h, "x-room-admission", "sk_admit_1").as_deref(),
            Some("tok1")
        );
        assert_eq!(
            presented(&h, "x-room-admission", "sk_admit_12").as_deref(),
            Some("tok12")
        );
        h.insert("x-room-admission", "hdr".parse().unwrap());
        assert_eq!(
            presented(&h, "x-room-admission", "sk_admit_1").as_deref(),
            Some("hdr")
        );
    }

    #[test]
    fn the_history_gives_the_admission_rate_and_the_oldest_wait() {
        let mut h = History::default();
        h.push(0, 0, 5);
        h.push(1000, 10, 30);
        h.push(2000, 20, 30);
        assert_eq!(h.rate(2000), 10.0);
        // Ticket 21 was issued by the sample at 1000 ms.
        assert_eq!(h.oldest_wait(2000, 20, 30), 1000);
        // Ticket 3 already by the first sample.
        assert_eq!(h.oldest_wait(2000, 2, 30), 2000);
        assert_eq!(h.oldest_wait(2000, 30, 30), 0);
    }

    #[test]
    fn the_gate_needs_an_admission_token_only_while_the_room_queues() {
        let reg = Registry::new();
        let cfg = RoomConfig {
            method: Method::Fifo,
            ..Default::default()
        };
        let room = Room::new(&cfg, "purchase-secret-0123", &reg);
        let mut h = http::HeaderMap::new();
        let Gate::Refused(Refusal::Room { code, .. }) = room.gate(1, "u", &h, 10) else {
            panic!("no token passed");
        };
        assert_eq!(code, "admission_required");
        let t = room.signer.admission(&token::Admission {
            activity: 1,
            user: "u".into(),
            ticket: 1,
            admitted_ms: 0,
            expires_ms: 100,
        });
        h.insert("x-room-admission", t.parse().unwrap());
        assert_eq!(room.gate(1, "u", &h, 10), Gate::Open);
        assert!(matches!(room.gate(1, "v", &h, 10), Gate::Refused(_)));
        assert!(matches!(room.gate(1, "u", &h, 100), Gate::Refused(_)));
        let off = Room::new(
            &RoomConfig::default(),
            "purchase-secret-0123",
            &Registry::new(),
        );
        assert_eq!(off.gate(1, "u", &http::HeaderMap::new(), 10), Gate::Open);
        let kill = Room::new(
            &RoomConfig {
                method: Method::Reject,
                ..Default::default()
            },
            "purchase-secret-0123",
            &Registry::new(),
        );
        assert_eq!(kill.gate(1, "u", &h, 10), Gate::Refused(closed()));
    }
}
