//! Token buckets per client IP, per user and per route (state of the `ip_limit` and
//! `user_limit` filters).
//!
//! [`BucketMap`] is a sharded map `u64 key → (tokens, last refill)` of 16 bytes per
//! entry (plus hashbrown's control byte), so a million distinct client IPs cost about
//! 35 MiB at most. Memory is bounded twice: a sweeper drops buckets idle for
//! `idle_evict_secs`, and a shard that reaches its share of `max_tracked` first drops
//! its full buckets (a full bucket behaves exactly like a missing one, so that loses
//! nothing) and then, if still full, arbitrary ones (a dropped client starts again
//! with a full bucket: bounded memory wins over exactness under a flood of new IPs).
//!
//! Time is passed in as milliseconds on the gateway's monotonic clock, so tests drive
//! the buckets with an explicit clock.
//!
//! Fleet sharing (`limits.fleet`, driven by `crate::fleet`): the per-user and per-route
//! buckets also count what they let through per key (a second map per shard, `pending`,
//! holding only the keys taken since the last drain, so the bucket entry stays 16
//! bytes); the background sync drains those counts,
//! reports them to the fleet-wide bucket in Redis and writes the fleet-wide level back
//! into the local bucket ([`BucketMap::reconcile`]). A request still only touches its
//! shard's lock. While Redis is unreachable the limiter uses rate and burst divided by
//! `limits.fleet_size` ([`RateLimiter::set_fleet_down`]).
//!
//! (Over 400 lines: the bucket map, its eviction and the limiter over three keys (IP, user,
//! route) with their tests.)

use crate::config::{Bucket, Limits};
use crate::routes::RouteClass;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Outcome of a bucket check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    Allowed,
    /// Empty; a token comes back after this many whole seconds (at least 1).
    Limited {
        retry_after_secs: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct State {
    tokens: f32,
    /// Milliseconds on the gateway clock, truncated to u32 (wraps after 49 days; the
    /// wrapping difference keeps refills right for buckets touched within that span).
    last_ms: u32,
}

/// A multiplicative hasher for u64 keys (client IPs, user-id hashes): one multiply per
/// lookup instead of SipHash. Keys are mixed with a per-process random seed so a
/// client cannot aim collisions at one bucket chain.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 =
                (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, n: u64) {
        let x = (n ^ seed()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 29);
    }
}

fn seed() -> u64 {
    use std::sync::OnceLock;
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ (std::process::id() as u64).rotate_left(32)
    })
}

impl State {
    /// The tokens at `now`: refilled at `limit.rate`, never above `limit.burst`.
    fn refilled(&self, limit: Bucket, now: u32) -> f64 {
        let elapsed = now.wrapping_sub(self.last_ms) as f64 / 1000.0;
        (self.tokens as f64 + elapsed * limit.rate).min(limit.burst)
    }
}

/// Whether a request may take one of `tokens`, and if not, when one comes back.
fn verdict(tokens: f64, limit: Bucket) -> Take {
    if tokens >= 1.0 {
        return Take::Allowed;
    }
    let wait = ((1.0 - tokens) / limit.rate).ceil().max(1.0);
    Take::Limited {
        retry_after_secs: wait.min(u32::MAX as f64) as u32,
    }
}

type Map = HashMap<u64, State, BuildHasherDefault<KeyHasher>>;

#[derive(Default)]
struct Shard {
    map: Map,
    /// Tokens taken per key since the last drain (fleet sharing only; empty otherwise).
    pending: HashMap<u64, u32, BuildHasherDefault<KeyHasher>>,
}

const SHARDS: usize = 64;

/// Token buckets keyed by u64.
pub struct BucketMap {
    shards: Box<[Mutex<Shard>]>,
    /// `max_tracked` / shards; changed live by a reload ([`Self::set_max_tracked`]).
    per_shard_cap: AtomicUsize,
}

fn per_shard_cap(max_tracked: usize) -> usize {
    (max_tracked / SHARDS).max(16)
}

impl BucketMap {
    /// A map that tracks at most about `max_tracked` keys.
    pub fn new(max_tracked: usize) -> Self {
        let shards = (0..SHARDS)
            .map(|_| Mutex::new(Shard::default()))
            .collect::<Vec<_>>()
            .into_boxed_slice();
        Self {
            shards,
            per_shard_cap: AtomicUsize::new(per_shard_cap(max_tracked)),
        }
    }

    /// A new `max_tracked` (a reload). A smaller one takes effect shard by shard: the
    /// next new key of a shard over its share drops the excess first.
    pub fn set_max_tracked(&self, max_tracked: usize) {
        self.per_shard_cap
            .store(per_shard_cap(max_tracked), Ordering::Relaxed);
    }

    fn shard(&self, key: u64) -> &Mutex<Shard> {
        let mut h = KeyHasher::default();
        h.write_u64(key);
        // High bits pick the shard; hashbrown uses the low bits and the top 7 inside it.
        &self.shards[((h.finish() >> 40) as usize) % SHARDS]
    }

    /// Takes one token from `key`'s bucket.
    pub fn take(&self, key: u64, limit: Bucket, now_ms: u64) -> Take {
        self.take_tracked(key, limit, now_ms, false)
    }

    /// [`Self::take`] that, when `track`, also counts the token for the next
    /// [`Self::drain`] (fleet sharing).
    pub fn take_tracked(&self, key: u64, limit: Bucket, now_ms: u64, track: bool) -> Take {
        let now = now_ms as u32;
        let mut guard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        let shard = &mut *guard;
        let cap = self.per_shard_cap.load(Ordering::Relaxed);
        if shard.map.len() >= cap && !shard.map.contains_key(&key) {
            Self::make_room(&mut shard.map, limit, now, cap);
        }
        let st = shard.map.entry(key).or_insert(State {
            tokens: limit.burst as f32,
            last_ms: now,
        });
        let tokens = st.refilled(limit, now);
        st.last_ms = now;
        let verdict = verdict(tokens, limit);
        st.tokens = match verdict {
            Take::Allowed => tokens - 1.0,
            Take::Limited { .. } => tokens,
        } as f32;
        if track && verdict == Take::Allowed {
            let n = shard.pending.entry(key).or_insert(0);
            *n = n.saturating_add(1);
        }
        verdict
    }

    /// The tokens taken per key since the last drain (tracked takes only), reset to 0.
    pub fn drain(&self) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let pending = {
                let mut shard = s.lock().unwrap_or_else(|p| p.into_inner());
                std::mem::take(&mut shard.pending)
            };
            out.extend(pending);
        }
        out
    }

    /// `key`'s bucket takes the fleet-wide `level` (read after the last drain), less
    /// what it let through since that drain; never above `limit.burst`. A key no
    /// longer tracked is left alone.
    pub fn reconcile(&self, key: u64, level: f64, limit: Bucket, now_ms: u64) {
        let now = now_ms as u32;
        let mut guard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        let shard = &mut *guard;
        let since = shard.pending.get(&key).copied().unwrap_or(0);
        if let Some(st) = shard.map.get_mut(&key) {
            let tokens = level - f64::from(since);
            // Never owe more than a few seconds' worth: a bucket that cannot refill
            // in reasonable time would lock its user out for the fleet's mistakes.
            let floor = -(limit.burst + limit.rate * 10.0);
            st.tokens = tokens.clamp(floor, limit.burst) as f32;
            st.last_ms = now;
        }
    }

    /// What [`Self::take`] would answer now, without taking or recording anything: a
    /// key with no bucket is full. The fast lane (`fast_lane.rs`) asks this before it
    /// knows whether it answers the request itself.
    pub fn peek(&self, key: u64, limit: Bucket, now_ms: u64) -> Take {
        let now = now_ms as u32;
        let shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        match shard.map.get(&key) {
            Some(st) => verdict(st.refilled(limit, now), limit),
            None => Take::Allowed,
        }
    }

    fn make_room(shard: &mut Map, limit: Bucket, now: u32, cap: usize) {
        let full_after_ms = (limit.burst / limit.rate * 1000.0) as u32;
        shard.retain(|_, st| now.wrapping_sub(st.last_ms) < full_after_ms);
        if shard.len() >= cap {
            // Still full of active clients: drop an eighth, arbitrary ones (and whatever
            // exceeds a cap lowered by a reload).
            let excess = shard.len() - cap;
            let drop: Vec<u64> = shard.keys().take(excess + cap / 8 + 1).copied().collect();
            for k in drop {
                shard.remove(&k);
            }
        }
    }

    /// Drops buckets untouched for `idle_ms`. Called by the sweeper.
    pub fn evict_idle(&self, idle_ms: u64, now_ms: u64) -> usize {
        let now = now_ms as u32;
        let idle = idle_ms.min(u32::MAX as u64 / 2) as u32;
        let mut dropped = 0;
        for s in self.shards.iter() {
            let mut shard = s.lock().unwrap_or_else(|p| p.into_inner());
            let before = shard.map.len();
            shard
                .map
                .retain(|_, st| now.wrapping_sub(st.last_ms) < idle);
            dropped += before - shard.map.len();
        }
        dropped
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).map.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The u64 key of a client IP: IPv4 as is, IPv6 by its /64 (one subscriber's prefix).
pub fn ip_key(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(v4) => u64::from(u32::from(v4)),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => u64::from(u32::from(v4)),
            None => (u128::from(v6) >> 64) as u64 | (1 << 63),
        },
    }
}

/// The u64 key of a user id.
pub fn user_key(user: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(user.as_bytes())
}

/// The three kinds of buckets.
pub struct RateLimiter {
    ips: BucketMap,
    users: BucketMap,
    routes: BucketMap,
    /// With `limits.fleet`: Redis could not be reached at the last sync, so the
    /// per-user and per-route buckets run at rate / `fleet_size` on their own.
    fleet_down: AtomicBool,
}

/// What a fleet-shared bucket (per user, per route) runs with: the configured bucket
/// and tracked takes, or, while Redis is unreachable, its share of the fleet
/// (rate and burst / `fleet_size`, burst at least 1) untracked.
fn fleet_bucket(b: Bucket, limits: &Limits, down: bool) -> (Bucket, bool) {
    if !limits.fleet {
        return (b, false);
    }
    if down {
        let n = f64::from(limits.fleet_size.max(1));
        let share = Bucket {
            rate: b.rate / n,
            burst: (b.burst / n).max(1.0),
        };
        return (share, false);
    }
    (b, true)
}

impl RateLimiter {
    pub fn new(max_tracked: usize) -> Self {
        Self {
            ips: BucketMap::new(max_tracked),
            users: BucketMap::new(max_tracked),
            routes: BucketMap::new(1024),
            fleet_down: AtomicBool::new(false),
        }
    }

    /// Marks Redis unreachable (`true`: the fleet-shared buckets fall back to their
    /// share) or reachable again.
    pub fn set_fleet_down(&self, down: bool) {
        self.fleet_down.store(down, Ordering::Relaxed);
    }

    pub fn fleet_down(&self) -> bool {
        self.fleet_down.load(Ordering::Relaxed)
    }

    /// The per-user takes since the last drain, by [`user_key`].
    pub fn drain_users(&self) -> Vec<(u64, u32)> {
        self.users.drain()
    }

    /// The per-route takes since the last drain.
    pub fn drain_routes(&self) -> Vec<(RouteClass, u32)> {
        self.routes
            .drain()
            .into_iter()
            .filter_map(|(k, n)| Some((*RouteClass::ALL.iter().find(|r| **r as u64 == k)?, n)))
            .collect()
    }

    /// A user's bucket takes the fleet-wide level read from Redis.
    pub fn reconcile_user(&self, key: u64, level: f64, limits: &Limits, now_ms: u64) {
        self.users.reconcile(key, level, limits.per_user, now_ms);
    }

    /// A route's bucket takes the fleet-wide level read from Redis.
    pub fn reconcile_route(&self, route: RouteClass, level: f64, limits: &Limits, now_ms: u64) {
        if let Some(b) = limits.routes.get(route.name()) {
            self.routes.reconcile(route as u64, level, *b, now_ms);
        }
    }

    /// The per-IP bucket, then the route's shared bucket when the route has one.
    pub fn check_ip(&self, ip: IpAddr, route: RouteClass, limits: &Limits, now_ms: u64) -> Take {
        self.ip_then_route(ip, route, limits, |m, k, b, track| {
            m.take_tracked(k, b, now_ms, track)
        })
    }

    /// What [`Self::check_ip`] would answer now, taking nothing.
    pub fn peek_ip(&self, ip: IpAddr, route: RouteClass, limits: &Limits, now_ms: u64) -> Take {
        self.ip_then_route(ip, route, limits, |m, k, b, _| m.peek(k, b, now_ms))
    }

    fn ip_then_route(
        &self,
        ip: IpAddr,
        route: RouteClass,
        limits: &Limits,
        bucket: impl Fn(&BucketMap, u64, Bucket, bool) -> Take,
    ) -> Take {
        let t = bucket(&self.ips, ip_key(ip), limits.per_ip, false);
        if t != Take::Allowed {
            return t;
        }
        match limits.routes.get(route.name()) {
            Some(b) => {
                let (b, track) = fleet_bucket(*b, limits, self.fleet_down());
                bucket(&self.routes, route as u64, b, track)
            }
            None => Take::Allowed,
        }
    }

    /// The per-user bucket.
    pub fn check_user(&self, user: &str, limits: &Limits, now_ms: u64) -> Take {
        let (b, track) = fleet_bucket(limits.per_user, limits, self.fleet_down());
        self.users.take_tracked(user_key(user), b, now_ms, track)
    }

    /// A new `limits.max_tracked` (a reload) for the per-IP and per-user buckets.
    pub fn set_max_tracked(&self, max_tracked: usize) {
        self.ips.set_max_tracked(max_tracked);
        self.users.set_max_tracked(max_tracked);
    }

    /// Sweeper pass; returns how many buckets were dropped.
    pub fn evict_idle(&self, limits: &Limits, now_ms: u64) -> usize {
        let idle = limits.idle_evict_secs * 1000;
        self.ips.evict_idle(idle, now_ms) + self.users.evict_idle(idle, now_ms)
    }

    pub fn tracked_ips(&self) -> usize {
        self.ips.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Bucket = Bucket {
        rate: 2.0,
        burst: 3.0,
    };

    #[test]
    fn a_max_tracked_lowered_live_bounds_the_map_from_the_next_new_keys() {
        let m = BucketMap::new(1_000_000);
        for k in 0..20_000 {
            m.take(k, B, 1000);
        }
        assert_eq!(m.len(), 20_000);
        // 16 per shard: at most 1024 keys once every shard has seen a new key.
        m.set_max_tracked(0);
        for k in 20_000..40_000 {
            m.take(k, B, 1000);
        }
        assert!(m.len() <= 16 * SHARDS, "{} keys", m.len());
        // Raised again: room for every new key.
        m.set_max_tracked(1_000_000);
        let before = m.len();
        for k in 40_000..41_000 {
            m.take(k, B, 1000);
        }
        assert_eq!(m.len(), before + 1000);
    }

    #[test]
    fn tracked_takes_are_drained_once_and_a_reconcile_takes_the_fleet_level() {
        let m = BucketMap::new(10_000);
        for _ in 0..3 {
            assert_eq!(m.take_tracked(1, B, 1000, true), Take::Allowed);
        }
        // Refused and untracked takes are not counted.
        assert!(matches!(
            m.take_tracked(1, B, 1000, true),
            Take::Limited { .. }
        ));
        assert_eq!(m.take_tracked(2, B, 1000, false), Take::Allowed);
        assert_eq!(m.drain(), vec![(1, 3)]);
        assert_eq!(m.drain(), vec![]);
        // One more take after the drain, then the fleet says 2.5 tokens are left: the
        // local bucket holds 2.5 - 1.
        m.take_tracked(1, B, 1500, true);
        m.reconcile(1, 2.5, B, 1500);
        assert_eq!(m.take(1, B, 1500), Take::Allowed);
        assert!(matches!(m.take(1, B, 1500), Take::Limited { .. }));
        // The fleet owes tokens: the bucket goes negative and refills from there
        // (2/s: -2 + 1.5 s x 2 = 1 token after 1.5 s).
        m.reconcile(1, -1.0, B, 2000);
        assert!(matches!(m.take(1, B, 3400), Take::Limited { .. }));
        assert_eq!(m.take(1, B, 3500), Take::Allowed);
        // Never above the burst, never below the floor; unknown keys are left alone.
        m.reconcile(1, 100.0, B, 4000);
        for _ in 0..3 {
            assert_eq!(m.take(1, B, 4000), Take::Allowed);
        }
        assert!(matches!(m.take(1, B, 4000), Take::Limited { .. }));
        m.reconcile(99, 1.0, B, 4000);
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn with_fleet_on_redis_down_means_the_share_of_the_fleet() {
        let mut limits = Limits {
            fleet: true,
            fleet_size: 4,
            per_user: Bucket {
                rate: 8.0,
                burst: 8.0,
            },
            ..Limits::default()
        };
        let r = RateLimiter::new(10_000);
        r.set_fleet_down(true);
        // burst 8 / 4 gateways = 2.
        assert_eq!(r.check_user("u", &limits, 0), Take::Allowed);
        assert_eq!(r.check_user("u", &limits, 0), Take::Allowed);
        assert!(matches!(
            r.check_user("u", &limits, 0),
            Take::Limited { .. }
        ));
        assert!(r.drain_users().is_empty(), "untracked while down");
        r.set_fleet_down(false);
        assert_eq!(r.check_user("v", &limits, 0), Take::Allowed);
        assert_eq!(r.drain_users(), vec![(user_key("v"), 1)]);
        limits.fleet = false;
        assert_eq!(r.check_user("v", &limits, 0), Take::Allowed);
        assert!(r.drain_users().is_empty(), "untracked with fleet off");
    }

    #[test]
    fn a_burst_passes_then_the_bucket_refuses_until_it_refills() {
        let m = BucketMap::new(10_000);
        for _ in 0..3 {
            assert_eq!(m.take(1, B, 1000), Take::Allowed);
        }
        assert_eq!(
            m.take(1, B, 1000),
            Take::Limited {
                retry_after_secs: 1
            }
        );
        // Another key has its own bucket.
        assert_eq!(m.take(2, B, 1000), Take::Allowed);
        // 2 tokens/s: one token back after 500 ms, not before.
        assert!(matches!(m.take(1, B, 1400), Take::Limited { .. }));
        assert_eq!(m.take(1, B, 1900), Take::Allowed);
        assert!(matches!(m.take(1, B, 1900), Take::Limited { .. }));
        // After a long pause the bucket is full again, never more.
        for _ in 0..3 {
            assert_eq!(m.take(1, B, 60_000), Take::Allowed);
        }
        assert!(matches!(m.take(1, B, 60_000), Take::Limited { .. }));
    }

    #[test]
    fn a_peek_answers_what_a_take_would_and_takes_nothing() {
        let m = BucketMap::new(10_000);
        // No bucket yet: full, and a peek does not create one.
        assert_eq!(m.peek(7, B, 1000), Take::Allowed);
        assert_eq!(m.len(), 0);
        for _ in 0..3 {
            assert_eq!(m.peek(7, B, 1000), Take::Allowed);
            assert_eq!(m.take(7, B, 1000), Take::Allowed);
        }
        let limited = m.take(7, B, 1000);
        assert!(matches!(limited, Take::Limited { .. }));
        for _ in 0..5 {
            assert_eq!(m.peek(7, B, 1000), limited);
        }
        // Refill is seen by the peek as by the take.
        assert_eq!(m.peek(7, B, 1500), Take::Allowed);
        assert_eq!(m.take(7, B, 1500), Take::Allowed);
        assert!(matches!(m.peek(7, B, 1500), Take::Limited { .. }));
    }

    #[test]
    fn retry_after_is_the_time_to_the_next_token() {
        let m = BucketMap::new(10_000);
        let slow = Bucket {
            rate: 0.1,
            burst: 1.0,
        };
        assert_eq!(m.take(9, slow, 0), Take::Allowed);
        assert_eq!(
            m.take(9, slow, 0),
            Take::Limited {
                retry_after_secs: 10
            }
        );
    }

    #[test]
    fn idle_buckets_are_evicted_and_come_back_full() {
        let m = BucketMap::new(10_000);
        for k in 0..100 {
            m.take(k, B, 0);
        }
        m.take(5, B, 50_000);
        assert_eq!(m.evict_idle(30_000, 60_000), 99);
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn a_flood_of_new_keys_never_grows_the_map_past_its_cap() {
        let m = BucketMap::new(64 * 100);
        for k in 0..200_000u64 {
            m.take(k, B, k / 1000);
        }
        assert!(m.len() <= 64 * 100 + 64, "{}", m.len());
    }

    #[test]
    fn ipv6_clients_share_their_64_prefix_and_mapped_v4_is_v4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(ip_key(a), ip_key(b));
        assert_ne!(ip_key(a), ip_key(c));
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(ip_key(v4), ip_key(mapped));
    }

    #[test]
    fn route_buckets_are_shared_by_every_client() {
        let mut limits = Limits {
            per_ip: Bucket {
                rate: 1000.0,
                burst: 1000.0,
            },
            ..Limits::default()
        };
        limits.routes.insert(
            "reserve".into(),
            Bucket {
                rate: 1.0,
                burst: 2.0,
            },
        );
        let r = RateLimiter::new(10_000);
        let ip = |n: u8| IpAddr::from([10, 0, 0, n]);
        assert_eq!(
            r.check_ip(ip(1), RouteClass::Reserve, &limits, 0),
            Take::Allowed
        );
        assert_eq!(
            r.check_ip(ip(2), RouteClass::Reserve, &limits, 0),
            Take::Allowed
        );
        assert!(matches!(
            r.check_ip(ip(3), RouteClass::Reserve, &limits, 0),
            Take::Limited { .. }
        ));
        // Other routes have no route bucket.
        assert_eq!(
            r.check_ip(ip(3), RouteClass::Activities, &limits, 0),
            Take::Allowed
        );
    }
}
