#![cfg(all(feature = "orderd", feature = "stockd"))]
//! An idle orderd's Redis traffic does not grow with the number of live streams (issue
//! 15, item 5). With `XADD` wake-ups, a stream whose group has nothing pending sleeps
//! until an `XADD` wakes it; only the clean-stream sweep visits it, one stream per
//! `consumer.clean_sweep_ms` (50) for all of them together (`orderd::wake::sweep`). Counted on the Redis side
//! (`INFO commandstats` on every primary: the stream reads, claims and pending checks
//! the consumers send), so it is a count, not a timing.
//!
//! The same setup with wake-ups off (`consumer.keyspace_events = false`, polling every
//! `block_ms`) sends far more, which shows the bound can fail; and a reservation made
//! after the idle window still becomes an order at once (the sleeping stream is woken).

use std::time::{Duration, Instant};

use fred::prelude::*;
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::orderd::spawn_orderd_process;
use seckill_tests::process::{signal, wait_until_async};
use seckill_tests::stockd::{
    create_live_activities, create_published_activity_with, reserve, spawn_stockd_process,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const ACTIVITIES: usize = 40;
const SHARDS: u32 = 8;
/// A claim pass every 100 ms per stream, were the streams not clean.
const CLAIM_IDLE_MS: u64 = 200;
const WINDOW: Duration = Duration::from_secs(3);
/// The shipped sweep step.
const SWEEP_MS: f64 = 50.0;

/// Stream reads, claims and pending checks served by the cluster's primaries so far.
fn stream_calls(cluster: &RedisCluster) -> u64 {
    let calls = cluster.command_counts();
    ["xreadgroup", "xautoclaim", "xpending"]
        .iter()
        .map(|c| calls.get(*c).copied().unwrap_or(0))
        .sum()
}

/// Orders in MySQL.
async fn orders(db: &TestDb) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders")
        .fetch_one(db.pool())
        .await
        .expect("count orders");
    n
}

/// Starts the stack with `ACTIVITIES` live activities of `SHARDS` shards, lets orderd
/// settle, and returns the stream calls per second over `WINDOW` of idleness, and the
/// seconds from a reservation made after the window to its order row.
async fn idle_calls_per_sec(keyspace_events: bool) -> (f64, f64) {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = spawn_stockd_process(&Deps::new(&cluster, &db), |_| {}).await;
    let admin = stockd.admin_client().await;
    let made =
        create_live_activities(&admin, ACTIVITIES, 100, SHARDS, Duration::from_secs(3600)).await;
    let orderd = spawn_orderd_process(&Deps::new(&cluster, &db), |c| {
        c.consumer.keyspace_events = keyspace_events;
        c.consumer.block_ms = 50;
        c.consumer.claim_idle_ms = CLAIM_IDLE_MS;
        c.consumer.clean_sweep_ms = SWEEP_MS as u64;
        c.consumer.discovery_interval_ms = 500;
    })
    .await;
    // Every stream found and its group made, then its first passes done.
    let redis = cluster.client().await;
    for &(a, _) in &made {
        for i in 0..SHARDS {
            let key = seckill_lua::keys::orders_stream(a, i);
            wait_until_async(
                "orderd's group on every stream",
                Duration::from_secs(30),
                || {
                    let (redis, key) = (&redis, &key);
                    async move {
                        let groups: Result<fred::types::Value, _> = redis.xinfo_groups(key).await;
                        groups.is_ok_and(|g| !g.into_array().is_empty())
                    }
                },
            )
            .await;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    let before = stream_calls(&cluster);
    tokio::time::sleep(WINDOW).await;
    let per_sec = (stream_calls(&cluster) - before) as f64 / WINDOW.as_secs_f64();

    // A reservation in a stream that slept through the window becomes an order.
    let mut stock = stockd.stock_client().await;
    let (a, s) = made[ACTIVITIES / 2];
    let before_orders = orders(&db).await;
    let t0 = Instant::now();
    let r = reserve(&mut stock, a, s, "late-buyer", "late-1")
        .await
        .expect("reserve");
    assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{r:?}");
    wait_until_async(
        "the late reservation's order",
        Duration::from_secs(20),
        || {
            let db = &db;
            async move { orders(db).await == before_orders + 1 }
        },
    )
    .await;
    let latency = t0.elapsed().as_secs_f64();
    drop(orderd);
    (per_sec, latency)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_orderd_sends_a_bounded_trickle_whatever_the_number_of_streams() {
    let (per_sec, latency) = idle_calls_per_sec(true).await;
    let streams = ACTIVITIES * SHARDS as usize;
    // Unclean, every stream would take a claim pass and a read every 100 ms: 6,400/s.
    // Clean, the sweep wakes one stream per 50 ms (a claim pass, a read and a pending
    // check: 3 calls): 60/s. The bound doubles that, for a stream or two becoming clean
    // late; it does not depend on the number of streams.
    let bound = 3.0 * 1000.0 / SWEEP_MS + 60.0;
    eprintln!(
        "woken orderd, {streams} idle streams: {per_sec:.0} stream calls/s (bound {bound:.0}); \
         late reservation to order {latency:.2} s"
    );
    assert!(
        per_sec <= bound,
        "{per_sec:.0} stream calls/s for {streams} idle streams: above {bound:.0}"
    );
    assert!(latency < 5.0, "a woken stream took {latency:.2} s to order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wake_ups_off_the_same_idle_orderd_polls_every_stream() {
    let (per_sec, _) = idle_calls_per_sec(false).await;
    let streams = ACTIVITIES * SHARDS as usize;
    let bound = 3.0 * 1000.0 / SWEEP_MS + 60.0;
    eprintln!("polling orderd, {streams} idle streams: {per_sec:.0} stream calls/s");
    // Every stream read every block_ms (50 ms) would be 6,400/s; even at a tenth of that
    // (a loaded machine) it is far above the woken orderd's bound.
    assert!(
        per_sec > 4.0 * bound,
        "{per_sec:.0} stream calls/s: polling should be far above {bound:.0}"
    );
}

/// A clean stream must not stay asleep while another consumer of the group holds entries
/// it may never acknowledge: the orderd that is woken by their `XADD` and reads nothing
/// (another consumer got them first) finds them pending, keeps its claim passes, and
/// claims them once they are idle. Here the other consumer is a "ghost" that reads the
/// entries and dies without a trace, while the orderd is frozen (SIGSTOP) so the ghost
/// gets them all. The sweep is slowed to once a minute so that only the pending check
/// can bring the claim in time (with it treating every empty read as clean, this fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_held_by_a_dead_consumer_are_claimed_although_the_stream_was_clean() {
    init_tracing();
    const GROUP: &str = "orderd-idle-test";
    const UNITS: usize = 6;
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = spawn_stockd_process(&Deps::new(&cluster, &db), |_| {}).await;
    let mut admin = stockd.admin_client().await;
    let act = create_published_activity_with(
        &mut admin,
        &[(100, 100)],
        2,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let (a, s) = (act.id, act.items[0].id);
    let orderd = spawn_orderd_process(&Deps::new(&cluster, &db), |c| {
        c.consumer.group = GROUP.into();
        c.consumer.claim_idle_ms = 1000;
        c.consumer.clean_sweep_ms = 60_000;
        c.consumer.discovery_interval_ms = 200;
    })
    .await;
    let redis = cluster.client().await;
    let streams: Vec<String> = (0..2)
        .map(|i| seckill_lua::keys::orders_stream(a, i))
        .collect();
    for key in &streams {
        wait_until_async("orderd's group", Duration::from_secs(30), || {
            let (redis, key) = (&redis, key);
            async move {
                let groups: Result<fred::types::Value, _> = redis.xinfo_groups(key).await;
                groups.is_ok_and(|g| !g.into_array().is_empty())
            }
        })
        .await;
    }
    // Idle long enough for both streams to be clean.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let pid = orderd.child.id().expect("orderd pid");
    signal(pid, "STOP");
    let mut stock = stockd.stock_client().await;
    for u in 0..UNITS {
        let r = reserve(&mut stock, a, s, &format!("buyer-{u}"), &format!("r-{u}"))
            .await
            .expect("reserve");
        assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{r:?}");
    }
    let mut ghost_held = 0;
    for key in &streams {
        let port = cluster.master_of_key(key);
        let out = cluster.cli_at(
            port,
            &[
                "XREADGROUP",
                "GROUP",
                GROUP,
                "ghost",
                "COUNT",
                "100",
                "STREAMS",
                key,
                ">",
            ],
        );
        // One `req` field per entry read.
        ghost_held += out.lines().filter(|l| l.trim() == "req").count();
    }
    assert_eq!(ghost_held, UNITS, "the ghost read every entry");
    signal(pid, "CONT");

    wait_until_async(
        "the ghost's entries claimed into orders",
        Duration::from_secs(15),
        || {
            let db = &db;
            async move { orders(db).await == UNITS as i64 }
        },
    )
    .await;
    for key in &streams {
        let port = cluster.master_of_key(key);
        let pending = cluster.cli_at(port, &["XPENDING", key, GROUP]);
        assert!(
            pending.trim_start().starts_with('0'),
            "{key} still has pending entries: {pending}"
        );
    }
    drop(orderd);
}
