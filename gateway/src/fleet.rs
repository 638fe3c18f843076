//! Budgets shared by the fleet (`limits.fleet`): the per-user and per-route token
//! buckets and the admission cap hold for every gateway together, while each request
//! still decides on local state (one lock or one atomic add, no Redis call).
//!
//! [`FleetSync`] is a background service; every `limits.sync_ms` it makes one
//! pipelined round trip to Redis:
//! - **Buckets** (`scripts/fleet_bucket.lua`): the tokens each local per-user and
//!   per-route bucket let through since the last round ([`RateLimiter::drain_users`])
//!   are taken from a fleet-wide bucket of the same rate and burst in Redis (one Lua
//!   call per hash-tag group of users, one per route); the level that comes back
//!   replaces the local bucket's (less what it let through meanwhile). Between two
//!   rounds each gateway refills its bucket at the full rate, so the fleet may let
//!   through up to about `fleet_size` × rate × `sync_ms` more than one bucket in a
//!   round; that excess is owed (the fleet-wide level goes negative) and paid back in
//!   the next rounds, so the long-run rate stays the configured one. A user first seen
//!   by a gateway starts from a full local bucket: at most `fleet_size` × burst at
//!   first contact. Only users active on this gateway are reported (at most
//!   `limits.max_tracked` keys; a Redis key per user lives until the bucket would be
//!   full again).
//! - **Admission** (`scripts/fleet_slots.lua`): each gateway leases in-flight slots of
//!   every open item's cap (k × remaining, at least `min_in_flight`): it asks for its
//!   calls in flight plus a slice ([`crate::admission::want`]) and Redis grants at most
//!   the cap less what the other gateways hold; the grant becomes the item's local cap
//!   ([`ItemLive::fleet_cap`](crate::sold_out::ItemLive)). Slots of a gateway that
//!   stops renewing expire after `max(2 s, 5 × sync_ms)`.
//! - **A round that fails** (an error or its deadline): the buckets run at rate /
//!   `fleet_size` (burst likewise), with `gateway_fleet_fallback` = 1, until a round
//!   succeeds again. The admission slots this gateway holds in Redis stand until they
//!   expire, and the other gateways count them meanwhile, so until then each item's cap
//!   is kept, lowered to the calls in flight (the failed round may have recorded a
//!   smaller holding than the last grant; what is in flight is recorded in any case):
//!   admissions go on as calls finish, never above what Redis counts for this gateway.
//!   Only once the slots would have expired is the cap cap / `fleet_size` (rounded up).
//!   (Falling back to the share at once let a gateway that held fewer slots than its
//!   share admit more while the others still held theirs: 11 in flight against a cap
//!   of 10 in `gateway_budgets`.)

use crate::admission;
use crate::config::Limits;
use crate::routes::RouteClass;
use crate::shared::Shared;
use async_trait::async_trait;
use fred::interfaces::LuaInterface;
use fred::prelude::*;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use seckill_lua::clock::unix_ms;
use seckill_lua::keys;
use seckill_lua::scripts::{FLEET_BUCKET, FLEET_SLOTS};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Most bucket keys in one Lua call.
const CHUNK: usize = 256;

/// The background service.
pub struct FleetSync {
    shared: Arc<Shared>,
    /// This gateway's name in the slot hashes: random per process.
    id: String,
}

impl FleetSync {
    pub fn new(shared: Arc<Shared>) -> Self {
        let id = format!("{:016x}", rand::random::<u64>());
        Self { shared, id }
    }
}

/// How long a gateway's admission slots stand in Redis after its round.
fn slots_ttl_ms(limits: &Limits) -> u64 {
    (limits.sync_ms * 5).max(2000)
}

/// What one round sends, to read the answers back in order.
enum Sent {
    Users(Vec<u64>),
    Route(RouteClass),
    Slots(Arc<crate::sold_out::ItemLive>),
}

fn levels(v: &Value) -> Vec<Option<f64>> {
    match v {
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().and_then(|s| s.parse().ok()))
            .collect(),
        _ => Vec::new(),
    }
}

impl FleetSync {
    /// One round: report and read back every budget. Any error fails the round.
    async fn round(
        &self,
        c: &Client,
        limits: &Limits,
        slice: u32,
        k: f64,
        min: u32,
    ) -> Result<(), Error> {
        fail::fail_point!("gateway::fleet::round", |_| Err(Error::new(
            ErrorKind::IO,
            "fail point gateway::fleet::round"
        )));
        let shared = &self.shared;
        let limiter = &shared.limiter;
        // The calls go out together (fred pipelines concurrent commands on a
        // connection): one round trip per node.
        let mut calls = Vec::new();
        let mut sent = Vec::new();

        // Per-user buckets, grouped by hash tag.
        let mut groups: HashMap<u64, Vec<(u64, u32)>> = HashMap::new();
        for (key, n) in limiter.drain_users() {
            groups
                .entry(key % keys::FLEET_USER_GROUPS)
                .or_default()
                .push((key, n));
        }
        let b = limits.per_user;
        for (_, all) in groups {
            for chunk in all.chunks(CHUNK) {
                let ks: Vec<String> = chunk.iter().map(|(k, _)| keys::fleet_user(*k)).collect();
                let mut args = vec![b.rate.to_string(), b.burst.to_string()];
                args.extend(chunk.iter().map(|(_, n)| n.to_string()));
                calls.push(c.eval::<Value, _, _, _>(FLEET_BUCKET.body, ks, args));
                sent.push(Sent::Users(chunk.iter().map(|(k, _)| *k).collect()));
            }
        }
        // Per-route buckets.
        for (route, n) in limiter.drain_routes() {
            let Some(b) = limits.routes.get(route.name()) else {
                continue;
            };
            let args = vec![b.rate.to_string(), b.burst.to_string(), n.to_string()];
            calls.push(c.eval::<Value, _, _, _>(
                FLEET_BUCKET.body,
                vec![keys::fleet_route(route.name())],
                args,
            ));
            sent.push(Sent::Route(route));
        }
        // Admission slots of every item of the activities not over.
        let now = unix_ms() as i64;
        let ttl = slots_ttl_ms(limits);
        for act in shared.catalog.all().values() {
            if now >= act.end_ms {
                continue;
            }
            for item in &act.items {
                let full = admission::cap(item, k, min);
                let (want, in_flight) = admission::ask(item, full, slice, limits.fleet_size);
                let args = vec![
                    self.id.clone(),
                    want.to_string(),
                    full.to_string(),
                    in_flight.to_string(),
                    ttl.to_string(),
                ];
                calls.push(c.eval::<Value, _, _, _>(
                    FLEET_SLOTS.body,
                    vec![keys::fleet_slots(act.id, item.id)],
                    args,
                ));
                sent.push(Sent::Slots(item.clone()));
            }
        }
        if sent.is_empty() {
            // Nothing to report; still a sign of life from Redis.
            let _: Value = c.ping(None).await?;
            return Ok(());
        }
        let answers: Vec<Value> = futures::future::try_join_all(calls).await?;
        let now_ms = shared.now_ms();
        for (s, v) in sent.into_iter().zip(answers) {
            match s {
                Sent::Users(ks) => {
                    for (key, level) in ks.into_iter().zip(levels(&v)) {
                        if let Some(l) = level {
                            limiter.reconcile_user(key, l, limits, now_ms);
                        }
                    }
                }
                Sent::Route(route) => {
                    if let Some(Some(l)) = levels(&v).first() {
                        limiter.reconcile_route(route, *l, limits, now_ms);
                    }
                }
                Sent::Slots(item) => {
                    if let Some(g) = v.as_i64() {
                        item.fleet_cap.store(g.max(0), Ordering::Relaxed);
                    }
                }
            }
        }
        Ok(())
    }

    /// A failed round, or none yet: the local share of every budget. While the slots
    /// this gateway holds in Redis stand (`leased`: the last good round was sent less
    /// than the slots' lifetime ago), each item's cap is its lease lowered to the calls
    /// in flight instead of the share (see the module doc).
    fn fall_back(&self, limits: &Limits, k: f64, min: u32, leased: bool) {
        let shared = &self.shared;
        shared.limiter.set_fleet_down(true);
        shared.metrics.fleet_fallback.set(1);
        let n = limits.fleet_size.max(1);
        for act in shared.catalog.all().values() {
            for item in &act.items {
                let share = i64::from(admission::cap(item, k, min).div_ceil(n));
                if !leased {
                    item.fleet_cap.store(share, Ordering::Relaxed);
                    continue;
                }
                // A lease granted by a round that failed: at most the calls in flight,
                // which Redis records for this gateway whatever it granted. (An item no
                // round has leased yet: the share.)
                let in_flight = i64::from(item.in_flight.load(Ordering::Relaxed));
                let _ = item
                    .fleet_cap
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cap| {
                        Some(if cap < 0 { share } else { cap.min(in_flight) })
                    });
            }
        }
    }

    /// Fleet sharing turned off (a reload): every gateway on its own again.
    fn turn_off(&self) {
        let shared = &self.shared;
        shared.limiter.set_fleet_down(false);
        shared.metrics.fleet_fallback.set(0);
        for act in shared.catalog.all().values() {
            for item in &act.items {
                item.fleet_cap.store(-1, Ordering::Relaxed);
            }
        }
        // Forget the takes counted while it was on.
        shared.limiter.drain_users();
        shared.limiter.drain_routes();
    }
}

#[async_trait]
impl BackgroundService for FleetSync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let shared = self.shared.clone();
        let cfg = shared.cfg.redis.clone();
        let Ok(mut c) = crate::redis::client(&cfg) else {
            tracing::error!("bad redis config");
            return;
        };
        let mut on = false;
        let mut period = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut connected = false;
        // Until when the slots the last good round leased stand in Redis (from when it
        // was sent: Redis set their expiry later than that).
        let mut leased_until: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {}
            }
            let policy = shared.policy();
            let limits = &policy.limits;
            if limits.sync_ms != period {
                period = limits.sync_ms;
                tick = tokio::time::interval(Duration::from_millis(period));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            }
            if !limits.fleet {
                if on {
                    self.turn_off();
                    on = false;
                }
                continue;
            }
            let (k, min) = (policy.admission.k, policy.admission.min_in_flight);
            if !on {
                // Until the first round succeeds, the local share.
                self.fall_back(limits, k, min, false);
                leased_until = None;
                on = true;
            }
            let leased = leased_until.is_some_and(|u| tokio::time::Instant::now() < u);
            let deadline = Duration::from_millis(cfg.timeout_ms.max(period));
            if !connected {
                // fred does not try a first connection again once it failed (Redis down
                // when the gateway starts): a fresh client each round until one connects,
                // the local share meanwhile; then the client's reconnect policy takes over.
                match tokio::time::timeout(deadline, c.init()).await {
                    Ok(Ok(_task)) => connected = true,
                    _ => {
                        let _ = c.quit().await;
                        if let Ok(fresh) = crate::redis::client(&cfg) {
                            c = fresh;
                        }
                        shared.metrics.fleet_sync_errors.inc();
                        self.fall_back(limits, k, min, leased);
                        continue;
                    }
                }
            }
            let slice = policy.admission.lease_slice;
            let sent = tokio::time::Instant::now();
            match tokio::time::timeout(deadline, self.round(&c, limits, slice, k, min)).await {
                Ok(Ok(())) => {
                    shared.limiter.set_fleet_down(false);
                    shared.metrics.fleet_fallback.set(0);
                    leased_until = Some(sent + Duration::from_millis(slots_ttl_ms(limits)));
                }
                Ok(Err(e)) => {
                    shared.metrics.fleet_sync_errors.inc();
                    tracing::debug!(error = %e, "fleet budget sync failed");
                    self.fall_back(limits, k, min, leased);
                }
                Err(_) => {
                    shared.metrics.fleet_sync_errors.inc();
                    tracing::debug!("fleet budget sync timed out");
                    self.fall_back(limits, k, min, leased);
                }
            }
        }
        let _ = c.quit().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway of a fleet of two with activity 1, item 7 (100 units left), and the
    /// item's live state.
    fn gateway() -> (FleetSync, Arc<crate::sold_out::ItemLive>) {
        let shared = Arc::new(crate::shared::for_test(
            "[limits]\nfleet = true\nfleet_size = 2\n",
        ));
        shared
            .catalog
            .replace(vec![crate::sold_out::one_item_activity(100, None)]);
        let item = shared.catalog.all().values().next().unwrap().items[0].clone();
        item.remaining.store(100, Ordering::Relaxed);
        (FleetSync::new(shared), item)
    }

    #[test]
    fn a_failed_round_keeps_the_lease_lowered_to_the_calls_in_flight_until_it_expires() {
        let (fleet, item) = gateway();
        let limits = fleet.shared.policy().limits.clone();
        // Cap 0.1 x 100 = 10 for the fleet; this gateway leased 4 and has 3 in flight.
        let (k, min) = (0.1, 1);
        item.fleet_cap.store(4, Ordering::Relaxed);
        item.in_flight.store(3, Ordering::Relaxed);
        fleet.fall_back(&limits, k, min, true);
        assert_eq!(
            item.fleet_cap.load(Ordering::Relaxed),
            3,
            "not the share (5): the other gateway may hold the other 6 slots"
        );
        // Never raised by a failed round, even with more in flight than the lease.
        item.in_flight.store(9, Ordering::Relaxed);
        fleet.fall_back(&limits, k, min, true);
        assert_eq!(item.fleet_cap.load(Ordering::Relaxed), 3);
        // An item no round leased yet gets the share.
        item.fleet_cap.store(-1, Ordering::Relaxed);
        fleet.fall_back(&limits, k, min, true);
        assert_eq!(item.fleet_cap.load(Ordering::Relaxed), 5);
        // Once the slots have expired in Redis: the share.
        item.fleet_cap.store(3, Ordering::Relaxed);
        fleet.fall_back(&limits, k, min, false);
        assert_eq!(item.fleet_cap.load(Ordering::Relaxed), 5);
        assert_eq!(fleet.shared.metrics.fleet_fallback.get(), 1);
    }
}
