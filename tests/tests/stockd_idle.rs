#![cfg(feature = "stockd")]
//! An idle stockd's Redis traffic does not grow with the number of live activities
//! (issue 15, item 5). Its one periodic Redis reader is the fence check
//! (`stockd::fence`): each `stock.fence_check_ms` it reads `stock.fence_check_shards`
//! shards (one `MGET` each) in turn over the open activities, where it used to read
//! every shard of every activity. Counted on the Redis side (`INFO commandstats` on every
//! primary, every command but the harness' own `INFO`), so it is a count, not a timing.
//!
//! The same stockd with `fence_check_shards` above the number of shards (every shard
//! every period: the old behaviour) sends far more, which shows the bound can fail. And
//! what the check is for still happens: a fence deleted alone, a flushed Redis, a
//! scheduled publication and an activity published by a peer are caught within the
//! bounds `stockd::fence` and docs/stockd.md state; and a restarted node shows as the
//! topology change that makes the next fence period a full pass.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fred::prelude::*;
use futures::StreamExt;
use seckill_lua::keys;
use seckill_proto::pb::{self, ReserveOutcome};
use seckill_tests::process::wait_until_async;
use seckill_tests::stockd::{
    create_published_activity, create_published_activity_with, reserve, spawn_stockd,
    spawn_stockd_process, until_available, StockClient, StockdProcess,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

/// How long a test waits for an activity to open.
const OPEN_WITHIN: Duration = Duration::from_secs(60);

const SHARDS: u32 = 8;
/// `stock.fence_check_ms` and `stock.schedule_poll_ms`: ten periods a second.
const PERIOD_MS: u64 = 100;
/// `stock.fence_check_shards`: two activities of 8 shards per period.
const ROUND_SHARDS: u32 = 16;
const WINDOW: Duration = Duration::from_secs(3);
const HOUR: Duration = Duration::from_secs(3600);

/// Calls served by the cluster's primaries so far, by command, but `INFO`.
fn commands(cluster: &RedisCluster) -> HashMap<String, u64> {
    cluster.command_counts()
}

/// stockd's MySQL statements so far, and the rows they returned, from its log
/// (`sqlx::query=debug` logs one line per statement with `rows_returned=`).
fn statements(stockd: &StockdProcess) -> (u64, u64) {
    let log = stockd.log();
    // A log file carries no colour codes (they are written only to a terminal).
    assert!(!log.contains('\x1b'), "colour codes in stockd's log file");
    let mut n = 0;
    let mut rows = 0;
    for line in log.lines().filter(|l| l.contains("sqlx::query")) {
        n += 1;
        rows += line
            .split("rows_returned=")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|r| r.parse::<u64>().ok())
            .unwrap_or(0);
    }
    (n, rows)
}

/// What an idle stockd sent over `WINDOW` (nothing else talks to Redis, and the
/// harness sends no MySQL statement meanwhile), per second.
struct Idle {
    redis: f64,
    /// The busiest Redis commands, for the report.
    top: String,
    mysql: f64,
    mysql_rows: f64,
}

async fn idle_rate(cluster: &RedisCluster, stockd: &StockdProcess) -> Idle {
    let before = commands(cluster);
    let (q0, r0) = statements(stockd);
    tokio::time::sleep(WINDOW).await;
    let after = commands(cluster);
    let (q1, r1) = statements(stockd);
    let mut by: Vec<(String, u64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect();
    by.sort_by_key(|b| std::cmp::Reverse(b.1));
    let total: u64 = by.iter().map(|(_, d)| d).sum();
    let secs = WINDOW.as_secs_f64();
    let top = by
        .iter()
        .take(4)
        .map(|(k, d)| format!("{k} {:.0}/s", *d as f64 / secs))
        .collect::<Vec<_>>()
        .join(", ");
    Idle {
        redis: total as f64 / secs,
        top,
        mysql: (q1 - q0) as f64 / secs,
        mysql_rows: (r1 - r0) as f64 / secs,
    }
}

/// Creates and publishes `n` activities of one item over `SHARDS` shards through
/// `stockd`, and waits until each answers GetStock as available.
async fn publish_many(stockd: &StockdProcess, n: usize) -> Vec<(u64, u64)> {
    let admin = stockd.admin_client().await;
    let made: Vec<(u64, u64)> = futures::stream::iter(0..n)
        .map(|_| {
            let mut admin = admin.clone();
            async move {
                let a = create_published_activity_with(
                    &mut admin,
                    &[(100, 100)],
                    SHARDS,
                    Duration::ZERO,
                    HOUR,
                )
                .await;
                (a.id, a.items[0].id)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let c = stockd.stock_client().await;
    for &(a, s) in &made {
        until_available(&c, a, s, OPEN_WITHIN).await;
    }
    made
}

/// The child-process stockd with fast periods and `round` shards per fence period.
async fn stockd(cluster: &RedisCluster, db: &TestDb, round: u32) -> StockdProcess {
    spawn_stockd_process(&Deps::new(cluster, db), |c| {
        c.stock.fence_check_ms = PERIOD_MS;
        c.stock.schedule_poll_ms = PERIOD_MS;
        c.stock.fence_check_shards = round;
        // One line per MySQL statement, with the rows it returned.
        c.log.level = Some("warn,sqlx::query=debug".into());
    })
    .await
}

/// Per period the round reads `ROUND_SHARDS` shards, one `MGET` each (whole activities:
/// with 8 shards each, exactly 16); the catalog poll sends nothing to Redis; nothing
/// waits to open once every activity is open. So 160 `MGET`s/s, whatever the number of
/// activities. The bound takes half as much again plus 20/s for a period run late
/// (each period sleeps `PERIOD_MS` after its work) and a stray command.
fn bound() -> f64 {
    let per_sec = f64::from(ROUND_SHARDS) * 1000.0 / PERIOD_MS as f64;
    per_sec * 1.5 + 20.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stockd_sends_the_same_trickle_for_16_or_48_activities_and_still_catches_losses() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = stockd(&cluster, &db, ROUND_SHARDS).await;

    let mut made = publish_many(&stockd, 16).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let few = idle_rate(&cluster, &stockd).await;
    made.extend(publish_many(&stockd, 32).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let many = idle_rate(&cluster, &stockd).await;
    let bound = bound();
    for (n, idle) in [(16, &few), (48, &many)] {
        eprintln!(
            "idle stockd, {n} activities: {:.0} Redis commands/s ({}), {:.1} MySQL \
             statements/s returning {:.1} rows/s; bound {bound:.0} commands/s",
            idle.redis, idle.top, idle.mysql, idle.mysql_rows
        );
        assert!(
            idle.redis <= bound,
            "{:.0} commands/s for {n} activities: above {bound:.0}",
            idle.redis
        );
        // The catalog poll: one one-row mark query and the due-schedule query per
        // period, 20/s, and at most one row each. (Before, the poll read every
        // published activity and its items each period: 2 rows per activity.)
        assert!(
            idle.mysql <= 2.0 * 10.0 * 1.5 + 5.0,
            "{:.1} MySQL statements/s for {n} activities",
            idle.mysql
        );
        assert!(
            idle.mysql_rows <= 10.0 * 1.5 + 5.0,
            "{:.1} MySQL rows/s for {n} activities",
            idle.mysql_rows
        );
    }
    // Flat: three times the activities, about the same count (the old check tripled).
    assert!(
        (many.redis - few.redis).abs() <= 0.25 * few.redis.max(many.redis) + 20.0,
        "{:.0}/s for 16 activities against {:.0}/s for 48",
        few.redis,
        many.redis
    );

    // 1. A fence deleted alone (no node event): the round reaches it within
    //    ceil(384 shards / 16) = 24 periods, 2.4 s, and the activity is rebuilt.
    let redis = cluster.client().await;
    let (a, s) = made[made.len() / 2];
    let old: String = redis.get(keys::fence(a, 3)).await.expect("fence");
    let t0 = Instant::now();
    let _: i64 = redis.del(keys::fence(a, 3)).await.expect("DEL fence");
    wait_until_async("the lone fence rebuilt", Duration::from_secs(30), || {
        let redis = &redis;
        let old = &old;
        async move {
            let f: Option<String> = redis.get(keys::fence(a, 3)).await.unwrap_or(None);
            f.is_some_and(|f| &f != old)
        }
    })
    .await;
    let c = stockd.stock_client().await;
    until_available(&c, a, s, OPEN_WITHIN).await;
    eprintln!(
        "a lone deleted fence rebuilt after {:.2} s (round bound 2.4 s)",
        t0.elapsed().as_secs_f64()
    );

    // 2. Every node flushed: the first period of the round finds a missing fence, the
    //    next one is a full pass, and every activity is rebuilt.
    let t0 = Instant::now();
    cluster.flush_all();
    for &(a, s) in &made {
        wait_until_async(
            "fence back after the flush",
            Duration::from_secs(120),
            || {
                let redis = &redis;
                async move {
                    let f: Option<String> = redis.get(keys::fence(a, 0)).await.unwrap_or(None);
                    f.is_some()
                }
            },
        )
        .await;
        until_available(&c, a, s, OPEN_WITHIN).await;
    }
    eprintln!(
        "all 48 activities rebuilt {:.2} s after a flush",
        t0.elapsed().as_secs_f64()
    );
    let mut stock = c.clone();
    let r = reserve(&mut stock, made[0].0, made[0].1, "after-flush", "r")
        .await
        .expect("reserve after the flush");
    assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{r:?}");

    // 3. A scheduled publication is done by the catalog poll (`schedule_poll_ms`).
    let mut admin = stockd.admin_client().await;
    let now = seckill_lua::clock::now_ms();
    let created = admin
        .create_activity(pb::CreateActivityRequest {
            title: "scheduled".into(),
            start_at_ms: now - 1000,
            end_at_ms: now + 3_600_000,
            shard_count: SHARDS,
            per_user_limit: 1,
            challenge_bits: 0,
            redis_cluster: String::new(),
            items: vec![pb::ItemSpec {
                title: "item".into(),
                price_cents: 200,
                sale_price_cents: 100,
                stock: 10,
            }],
        })
        .await
        .expect("create")
        .into_inner();
    admin
        .publish_activity(pb::PublishActivityRequest {
            activity_id: created.id,
            publish_at_ms: now + 500,
        })
        .await
        .expect("schedule");
    let t0 = Instant::now();
    let item = created.items[0].id;
    until_reserved(&c, created.id, item, "scheduled-buyer").await;
    eprintln!(
        "a publication scheduled 0.5 s ahead sells {:.2} s after it was scheduled",
        t0.elapsed().as_secs_f64()
    );

    // 4. An activity published by a peer stockd: this one's catalog poll sees the
    //    published activities' mark move, loads it, and the fence check opens it within
    //    schedule_poll_ms + fence_check_ms.
    let peer = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&peer, &[(10, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let t0 = Instant::now();
    until_reserved(&c, act.id, act.items[0].id, "peer-buyer").await;
    eprintln!(
        "an activity published by a peer sells here after {:.2} s (bound 0.2 s + a check)",
        t0.elapsed().as_secs_f64()
    );
    drop(peer);
    drop(stockd);
}

/// Reserves until the answer is RESERVED (UNAVAILABLE or NOT_FOUND meanwhile).
async fn until_reserved(c: &StockClient, a: u64, s: u64, user: &str) {
    wait_until_async("a reservation", Duration::from_secs(30), || {
        let mut c = c.clone();
        async move {
            matches!(reserve(&mut c, a, s, user, "r").await,
                Ok(r) if r.outcome() == ReserveOutcome::Reserved)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_shard_read_every_period_the_same_idle_stockd_grows_with_the_activities() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    // Above the 384 shards: every shard every period, as before the round.
    let stockd = stockd(&cluster, &db, 1_000_000).await;
    publish_many(&stockd, 48).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = idle_rate(&cluster, &stockd).await;
    let (rate, bound) = (idle.redis, bound());
    eprintln!(
        "every shard every period, 48 activities: {rate:.0} commands/s ({})",
        idle.top
    );
    // 384 MGETs per period, ten periods a second: 3,840/s; even at a third of that (a
    // loaded machine stretching the periods) it is far above the round's bound.
    assert!(
        rate > 4.0 * bound,
        "{rate:.0} commands/s: reading every shard should be far above {bound:.0}"
    );
    drop(stockd);
}

/// The other trigger of a full pass: a node that restarts (maybe empty) shows on
/// stockd's Redis clients as a topology change (fred's reconnect and cluster-change
/// events), with no command of stockd in flight or failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_shows_as_a_topology_change_with_nobody_sending() {
    init_tracing();
    let mut cluster = RedisCluster::start();
    let config = stockd::Config::for_test(cluster.nodes(), "mysql://u@h/d".into(), "t");
    let redis =
        stockd::redis::Redis::connect(&config.redis, &config.redis.nodes, stockd::Metrics::new())
            .await
            .expect("connect");
    let before = redis.topology_changes();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        redis.topology_changes(),
        before,
        "no change while nothing happens"
    );
    tokio::task::block_in_place(|| cluster.restart_node(0));
    wait_until_async("a topology change", Duration::from_secs(30), || {
        let n = redis.topology_changes();
        async move { n > before }
    })
    .await;
    redis.quit().await;
}
