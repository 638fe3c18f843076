#![cfg(feature = "orderd")]
//! orderd under faults: kill -9 mid-stream, MySQL down mid-stream. Nothing lost,
//! nothing doubled.

use seckill_tests::Deps;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use futures::StreamExt;
use seckill_lua::keys;
use seckill_proto::pb::ChangeOutcome;
use seckill_tests::orderd::{
    count_all_orders, mysql_stock, reserve_direct, seed_activity, spawn_orderd,
    spawn_orderd_process, wait_orders,
};
use seckill_tests::process::wait_until_async;
use seckill_tests::{init_tracing, RedisCluster, TestDb};

/// Reserves for `users` with `parallel` calls in flight; returns the reservation ids.
async fn reserve_all(
    redis: Arc<Client>,
    a: u64,
    s: u64,
    shards: u32,
    users: Vec<String>,
    parallel: usize,
) -> Vec<String> {
    futures::stream::iter(users)
        .map(|u| {
            let redis = redis.clone();
            async move { reserve_direct(&redis, a, s, shards, &u, "q").await }
        })
        .buffer_unordered(parallel)
        .filter_map(|r| async move { (r.outcome == "RESERVED").then_some(r.rid) })
        .collect()
        .await
}

async fn assert_exactly_once(db: &TestDb, rids: &[String], item: u64, total: i64) {
    let ids: Vec<(String,)> = sqlx::query_as("SELECT id FROM orders")
        .fetch_all(db.pool())
        .await
        .unwrap();
    let ids: HashSet<String> = ids.into_iter().map(|r| r.0).collect();
    assert_eq!(ids.len(), rids.len(), "one order per reservation");
    assert_eq!(ids, rids.iter().cloned().collect::<HashSet<_>>());
    let (pending,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders WHERE status = 'PENDING'")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(pending, rids.len() as i64);
    let (logs,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM stock_log")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(logs, rids.len() as i64, "one stock log row per order");
    assert_eq!(mysql_stock(db, item).await, total - rids.len() as i64);
}

async fn streams_empty(redis: &Client, a: u64, shards: u32) -> bool {
    for i in 0..shards {
        let n: u64 = redis.xlen(keys::orders_stream(a, i)).await.unwrap();
        if n > 0 {
            return false;
        }
    }
    true
}

#[tokio::test]
async fn kill_9_of_orderd_mid_stream_loses_nothing_and_doubles_nothing() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = Arc::new(cluster.client().await);
    let seeded = seed_activity(&redis, &db, 8, &[(4000, 100)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let tweak = |c: &mut orderd::Config| {
        c.consumer.claim_idle_ms = 1000;
        c.consumer.batch_size = 20;
    };
    let mut first = spawn_orderd_process(&Deps::new(&cluster, &db), tweak).await;
    let users: Vec<String> = (0..2000).map(|u| format!("k9-{u}")).collect();
    let reserver = tokio::spawn(reserve_all(redis.clone(), a, s, 8, users, 8));
    wait_until_async("some orders written", Duration::from_secs(60), || async {
        count_all_orders(&db).await >= 200
    })
    .await;
    first.child.kill();
    let at_kill = count_all_orders(&db).await;
    eprintln!("killed with {at_kill} orders written");
    let second = spawn_orderd_process(&Deps::new(&cluster, &db), tweak).await;
    let rids = reserver.await.unwrap();
    assert_eq!(rids.len(), 2000);
    wait_orders(&db, 2000, Duration::from_secs(90)).await;
    wait_until_async("streams empty", Duration::from_secs(30), || async {
        streams_empty(&redis, a, 8).await
    })
    .await;
    assert_exactly_once(&db, &rids, s, 4000).await;
    drop(second);
}

#[tokio::test]
async fn mysql_down_for_seconds_mid_stream_backs_off_then_drains_the_backlog() {
    init_tracing();
    let cluster = RedisCluster::start();
    let mut db = TestDb::create_owned().await;
    let redis = Arc::new(cluster.client().await);
    let seeded = seed_activity(&redis, &db, 4, &[(3000, 100)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.consumer.batch_size = 25;
        c.consumer.claim_idle_ms = 1000;
        c.consumer.backoff_base_ms = 50;
        c.consumer.backoff_cap_ms = 800;
        c.mysql.acquire_timeout_ms = 500;
    })
    .await;
    let users: Vec<String> = (0..1200).map(|u| format!("db-{u}")).collect();
    let reserver = tokio::spawn(reserve_all(redis.clone(), a, s, 4, users, 4));
    wait_until_async("some orders written", Duration::from_secs(60), || async {
        count_all_orders(&db).await >= 100
    })
    .await;
    db.server().unwrap().stop();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let failures = orderd.metrics.batch_failures.get();
    let lag: i64 = (0..4)
        .map(|i| {
            orderd
                .metrics
                .stream_lag
                .with_label_values(&[keys::orders_stream(a, i).as_str()])
                .get()
        })
        .sum();
    eprintln!("while down: {failures} failed batches, lag {lag}");
    assert!(failures > 0, "consumers noticed MySQL was down");
    db.server().unwrap().restart();
    let rids = reserver.await.unwrap();
    assert_eq!(rids.len(), 1200);
    wait_orders(&db, 1200, Duration::from_secs(90)).await;
    wait_until_async("streams empty", Duration::from_secs(30), || async {
        streams_empty(&redis, a, 4).await
    })
    .await;
    assert_exactly_once(&db, &rids, s, 3000).await;
    orderd.stop().await.unwrap();
}

/// Redis lost a reservation's writes in a failover and, before a rebuild, handed its
/// sequence (so its id) out again to another buyer. The second entry is not a
/// redelivery: it is dead-lettered with the reason, visible, never silently dropped,
/// and the first buyer's order is untouched.
#[tokio::test]
async fn a_reservation_id_handed_out_twice_is_dead_lettered_not_taken_for_a_redelivery() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 1, &[(10, 100)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.consumer.claim_idle_ms = 100;
        c.consumer.max_deliveries = 2;
    })
    .await;
    let first = reserve_direct(&redis, a, s, 1, "first-buyer", "r1").await;
    assert_eq!(first.outcome, "RESERVED");
    wait_orders(&db, 1, Duration::from_secs(30)).await;
    // The same id again, for someone else (what a rewound shard would append).
    let entry = vec![
        ("rid", first.rid.clone()),
        ("uid", "second-buyer".to_string()),
        ("a", a.to_string()),
        ("s", s.to_string()),
        ("req", "r2".to_string()),
        ("ts", "1700000000000".to_string()),
    ];
    let _: fred::types::Value = redis
        .xadd(keys::orders_stream(a, 0), false, None, "*", entry)
        .await
        .unwrap();
    // The row is written first, then `sk:dlq`, then the ack; the counter moves last,
    // once the entry is fully handled. Wait for both.
    wait_until_async("a dead letter", Duration::from_secs(30), || async {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM dead_letters")
            .fetch_one(db.pool())
            .await
            .unwrap();
        n == 1 && orderd.metrics.dead_letters_total.get() == 1
    })
    .await;
    let (rid, error): (String, String) =
        sqlx::query_as("SELECT reservation_id, last_error FROM dead_letters")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(rid, first.rid);
    assert!(error.contains("handed out twice"), "{error}");
    let (user,): (String,) = sqlx::query_as("SELECT user_id FROM orders WHERE id = ?")
        .bind(&first.rid)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(user, "first-buyer");
    assert_eq!(count_all_orders(&db).await, 1);
    assert_eq!(orderd.metrics.dead_letters_total.get(), 1);
}

/// A stock return stuck because its Redis is down stays visible while MySQL is down
/// too: the oldest-pending age (what `SeckillStockReturnsStuck` pages on) goes on
/// growing from the last read, since the row cannot be marked done meanwhile. Before,
/// the gauge kept the value of its last successful read for the whole outage. The other
/// gauges keep theirs, and `orderd_stats_refreshed_timestamp_seconds` says since when.
/// Then both come back and the return goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_return_keeps_ageing_while_mysql_is_down() {
    init_tracing();
    let cluster = RedisCluster::start();
    let mut db = TestDb::create_owned().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 1, &[(5, 100)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.outbox.relay_interval_ms = 200;
        c.mysql.acquire_timeout_ms = 500;
    })
    .await;
    let r = reserve_direct(&redis, a, s, 1, "bob", "req").await;
    assert_eq!(r.outcome, "RESERVED");
    wait_orders(&db, 1, Duration::from_secs(30)).await;

    // The shard's master stops answering (stopped, its data kept): bob's cancel is
    // committed in MySQL, its return cannot reach Redis.
    let master = cluster.master_of_key(&keys::fence(a, 0));
    let stall = cluster.stall(master, 30_000);
    let done = orderd.cancel(&r.rid, "bob").await.unwrap();
    assert_eq!(done.outcome(), ChangeOutcome::Applied);
    let age = || orderd.metrics.stock_return_oldest_pending_seconds.get();
    wait_until_async("one return pending", Duration::from_secs(15), || async {
        orderd.metrics.stock_returns_pending.get() == 1 && age() > 0.0
    })
    .await;

    // MySQL goes away too: the age read before the outage must go on growing (the
    // gauges are refreshed every 5 s).
    db.server().unwrap().stop();
    let before = age();
    wait_until_async(
        "the oldest return's age grows while MySQL is down",
        Duration::from_secs(20),
        || async { age() >= before + 8.0 },
    )
    .await;
    assert_eq!(orderd.metrics.stock_returns_pending.get(), 1);
    // The gauges that keep their value meanwhile are marked stale: the last refresh
    // whose reads all succeeded is from before the outage (8 s and more ago; a pass
    // every 5 s would have set it within the last 5).
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64()
    };
    let refreshed = || orderd.metrics.stats_refreshed.get();
    let stale_for = unix_now() - refreshed();
    assert!(
        refreshed() > 0.0 && stale_for >= 7.0,
        "stats refreshed {stale_for:.1} s ago while MySQL is down"
    );

    db.server().unwrap().restart();
    tokio::task::block_in_place(|| stall.join());
    wait_until_async(
        "the return went through",
        Duration::from_secs(60),
        || async { orderd.metrics.stock_returns_pending.get() == 0 && age() == 0.0 },
    )
    .await;
    wait_until_async(
        "the stats are fresh again",
        Duration::from_secs(15),
        || async { unix_now() - refreshed() < 6.0 },
    )
    .await;
    assert_eq!(mysql_stock(&db, s).await, 5);
    orderd.stop().await.unwrap();
}
