//! The room's background loop ([`Ticker`], a pingora background service): every
//! `room.tick_ms`, for every activity of the catalog that has not ended, one
//! [`store::TICK`] call (the admission step, shared by the fleet) whose answer replaces
//! the activity's [`Live`] state. Also the join, claim and admin-knob calls, which use
//! the same client.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fred::prelude::*;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use seckill_lua::clock::unix_ms;

use super::order::Layout;
use super::{store, Live, Method, Room};
use crate::fair::challenge::Pressure;
use crate::shared::Shared;

/// Seconds the room's keys outlive the activity's end.
const KEEP_AFTER_END_SECS: i64 = 86_400;

fn ttl_secs(end_ms: i64) -> String {
    let left = (end_ms - unix_ms() as i64).max(0) / 1000;
    (left + KEEP_AFTER_END_SECS).to_string()
}

/// The background service.
pub struct Ticker {
    shared: Arc<Shared>,
}

impl Ticker {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

fn num(v: Option<&Value>) -> u64 {
    v.and_then(|v| v.as_u64().or_else(|| v.as_string()?.parse().ok()))
        .unwrap_or(0)
}

fn text(v: Option<&Value>) -> String {
    v.and_then(|v| v.as_string()).unwrap_or_default()
}

/// One admission step for activity `a`.
async fn tick(room: &Room, c: &Client, a: u64, start_ms: i64, end_ms: i64) -> Result<(), Error> {
    let cfg = &room.cfg;
    let known = room.live(a).map(|l| l.layout.blocks.clone());
    let read = known.as_ref().map_or(0, |b| b.len());
    let out: Vec<Value> = store::eval(
        c,
        &store::TICK,
        vec![store::room_hash(a), store::blocks(a), store::admissions(a)],
        vec![
            start_ms.to_string(),
            cfg.method.name().to_string(),
            cfg.max_active.to_string(),
            cfg.admit_per_sec.to_string(),
            cfg.random_block.to_string(),
            (cfg.session_secs * 1000).to_string(),
            rand::random::<u64>().to_string(),
            read.to_string(),
            ttl_secs(end_ms),
        ],
    )
    .await?;
    let pre = out
        .get(3)
        .and_then(|v| v.as_i64().or_else(|| v.as_string()?.parse().ok()))
        .unwrap_or(-1);
    let mut blocks = known.unwrap_or_default();
    for b in out.iter().skip(12) {
        let s = text(Some(b));
        if let Some((lo, hi)) = s.split_once(':') {
            if let (Ok(lo), Ok(hi)) = (lo.parse(), hi.parse()) {
                blocks.push((lo, hi));
            }
        }
    }
    let live = Live {
        redis_ms: num(out.first()),
        admitted: num(out.get(1)),
        next: num(out.get(2)),
        method: Method::parse(&text(out.get(5))).unwrap_or(cfg.method),
        max_active: num(out.get(6)),
        admit_per_sec: text(out.get(7)).parse().unwrap_or(cfg.admit_per_sec),
        paused: num(out.get(8)) == 1,
        active: num(out.get(9)),
        layout: Layout {
            pre: u64::try_from(pre).ok(),
            blocks,
            seed: text(out.get(10)).parse().unwrap_or(0),
        },
        random_block: num(out.get(11)),
        admitted_per_sec: 0.0,
        oldest_wait_ms: 0,
    };
    room.store(a, live);
    Ok(())
}

#[async_trait]
impl BackgroundService for Ticker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let room = &self.shared.room;
        // Until the default cluster answers, the rooms keep their config defaults.
        let cfg = &self.shared.cfg.redis;
        let Some(client) = crate::redis::connect(cfg, &cfg.nodes, "default", &mut shutdown).await
        else {
            return;
        };
        let _ = room.client.set(client.clone());
        let mut every = tokio::time::interval(Duration::from_millis(room.cfg.tick_ms));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = every.tick() => {}
            }
            let all = self.shared.catalog.all();
            let now = unix_ms() as i64;
            for act in all.values() {
                if now >= act.end_ms {
                    continue;
                }
                let ticked = tick(room, &client, act.id, act.start_ms, act.end_ms).await;
                // The queue's pressure on the challenge (`challenge.queued_per_bit`).
                let per_bit = self.shared.challenges.settings().cfg.queued_per_bit;
                let queued = room
                    .live(act.id)
                    .filter(|l| l.method.queues())
                    .map_or(0, |l| l.queued());
                self.shared
                    .challenges
                    .pressure
                    .set_activity_extra(act.id, Pressure::queue_extra(queued, per_bit));
                if let Err(e) = ticked {
                    room.metrics
                        .tick_errors
                        .with_label_values(&[&act.id.to_string()])
                        .inc();
                    tracing::warn!(activity = act.id, error = %e, "room: admission step failed");
                }
            }
            room.retain(|a| all.get(&a).is_some_and(|act| now < act.end_ms));
        }
    }
}

/// What a join got from Redis.
pub struct Joined {
    pub ticket: u64,
    pub redis_ms: u64,
}

impl Room {
    fn redis(&self) -> Result<&Client, Error> {
        self.client
            .get()
            .ok_or_else(|| Error::new(ErrorKind::NotFound, "room: Redis client not started"))
    }

    /// A new ticket for `user` (replacing any earlier one).
    pub async fn join(
        &self,
        a: u64,
        user: &str,
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Joined, Error> {
        let out: Vec<Value> = store::eval(
            self.redis()?,
            &store::JOIN,
            vec![store::room_hash(a), store::users(a)],
            vec![
                user.to_string(),
                start_ms.to_string(),
                rand::random::<u64>().to_string(),
                ttl_secs(end_ms),
            ],
        )
        .await?;
        self.metrics
            .joins
            .with_label_values(&[&a.to_string()])
            .inc();
        Ok(Joined {
            ticket: num(out.first()),
            redis_ms: num(out.get(1)),
        })
    }

    /// True when `ticket` is `user`'s latest ticket (one Redis call per admission).
    pub async fn is_latest(&self, a: u64, user: &str, ticket: u64) -> Result<bool, Error> {
        let t: Option<u64> = self.redis()?.hget(store::users(a), user).await?;
        Ok(t == Some(ticket))
    }

    /// Sets live knobs of activity `a` (the admin call), after checking them all.
    /// Fields: `method`, `max_active`, `admit_per_sec`, `paused`, `random_block`.
    pub async fn set_knobs(
        &self,
        a: u64,
        body: &serde_json::Value,
    ) -> Result<Vec<(String, String)>, Result<String, Error>> {
        let Some(obj) = body.as_object() else {
            return Err(Ok("the body must be a JSON object".into()));
        };
        let mut set = Vec::new();
        for (k, v) in obj {
            let value = match k.as_str() {
                "method" => v
                    .as_str()
                    .and_then(Method::parse)
                    .map(|m| m.name().to_string())
                    .ok_or("method: one of fifo, random, passthrough, reject"),
                "max_active" => v
                    .as_u64()
                    .filter(|n| (1..=100_000_000).contains(n))
                    .map(|n| n.to_string())
                    .ok_or("max_active: an integer in 1..=100000000"),
                "admit_per_sec" => v
                    .as_f64()
                    .filter(|r| r.is_finite() && *r > 0.0 && *r <= 1_000_000.0)
                    .map(|r| r.to_string())
                    .ok_or("admit_per_sec: a number in (0, 1000000]"),
                "random_block" => v
                    .as_u64()
                    .filter(|n| (2..=100_000).contains(n))
                    .map(|n| n.to_string())
                    .ok_or("random_block: an integer in 2..=100000"),
                "paused" => v
                    .as_bool()
                    .map(|p| if p { "1" } else { "0" }.to_string())
                    .ok_or("paused: true or false"),
                _ => Err("unknown field (method, max_active, admit_per_sec, paused, random_block)"),
            };
            match value {
                Ok(v) => set.push((k.clone(), v)),
                Err(why) => return Err(Ok(why.to_string())),
            }
        }
        if set.is_empty() {
            return Err(Ok("nothing to change".into()));
        }
        let c = self.redis().map_err(Err)?;
        let _: () = c
            .hset(store::room_hash(a), set.clone())
            .await
            .map_err(Err)?;
        Ok(set)
    }
}
