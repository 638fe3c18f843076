#![cfg(feature = "orderd")]
//! Reservations in the Redis streams become orders in MySQL: exactly once, never an
//! oversell, poison entries dead-lettered and replayable.
//!
//! (Over 400 lines: an integration suite: each test sets up real processes and states its
//! invariants inline, so the cases read top to bottom.)

use seckill_tests::Deps;
use std::collections::HashSet;
use std::time::Duration;

use fred::prelude::*;
use fred::types::Value;
use futures::StreamExt;
use seckill_lua::keys;
use seckill_proto::pb;
use seckill_tests::orderd::{
    backlog, count_all_orders, count_orders, mysql_stock, redis_stock, reserve_direct,
    seed_activity, spawn_orderd, wait_orders,
};
use seckill_tests::process::wait_until_async;
use seckill_tests::{init_tracing, RedisCluster, TestDb};

/// Reserves for `users` concurrently (64 at a time); returns the reservation ids.
async fn reserve_many(
    redis: &Client,
    a: u64,
    s: u64,
    shards: u32,
    users: &[String],
) -> Vec<String> {
    let results: Vec<_> = futures::stream::iter(users.iter().cloned())
        .map(|u| async move { reserve_direct(redis, a, s, shards, &u, &format!("req-{u}")).await })
        .buffer_unordered(64)
        .collect()
        .await;
    results
        .into_iter()
        .filter(|r| r.outcome == "RESERVED")
        .map(|r| r.rid)
        .collect()
}

#[tokio::test]
async fn a_thousand_reservations_become_a_thousand_orders_and_redelivery_adds_none() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    // More units than buyers: without stockd's rebalancing a home shard may run dry.
    let seeded = seed_activity(&redis, &db, 8, &[(2000, 990)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let _orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.consumer.claim_idle_ms = 300;
        c.consumer.batch_size = 100;
    })
    .await;

    let users: Vec<String> = (0..1000).map(|u| format!("user-{u}")).collect();
    let rids = reserve_many(&redis, a, s, 8, &users).await;
    assert_eq!(rids.len(), 1000);
    wait_orders(&db, 1000, Duration::from_secs(60)).await;
    wait_until_async("streams drained", Duration::from_secs(30), || async {
        backlog(&redis, a, 8).await == 0
    })
    .await;

    let ids: Vec<(String,)> = sqlx::query_as("SELECT id FROM orders")
        .fetch_all(db.pool())
        .await
        .unwrap();
    let ids: HashSet<String> = ids.into_iter().map(|r| r.0).collect();
    assert_eq!(ids, rids.iter().cloned().collect::<HashSet<_>>());
    assert_eq!(count_orders(&db, "PENDING").await, 1000);
    assert_eq!(mysql_stock(&db, s).await, 1000);
    let (logs,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM stock_log WHERE reason = 'ORDER'")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(logs, 1000);
    let (amounts,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders WHERE amount_cents = 990")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(amounts, 1000);

    // Redelivery: copies of acknowledged entries appended again, and copies left
    // pending on a consumer that died (claimed after the idle timeout).
    let mut copies = 0;
    for (n, rid) in rids.iter().enumerate().take(200) {
        let parsed: seckill_lua::ReservationId = rid.parse().unwrap();
        let stream = keys::orders_stream(a, parsed.shard);
        let user: String =
            sqlx::query_as::<_, (String,)>("SELECT user_id FROM orders WHERE id = ?")
                .bind(rid)
                .fetch_one(db.pool())
                .await
                .unwrap()
                .0;
        let _: Value = redis
            .xadd(
                &stream,
                false,
                None,
                "*",
                vec![
                    ("rid", rid.clone()),
                    ("uid", user),
                    ("a", a.to_string()),
                    ("s", s.to_string()),
                    ("req", "again".to_string()),
                    ("ts", "1".to_string()),
                ],
            )
            .await
            .unwrap();
        copies += 1;
        if n % 2 == 0 {
            // A ghost consumer reads it and dies before acknowledging.
            let _: Value = redis
                .xreadgroup("orderd", "ghost", Some(10), None, false, &stream, ">")
                .await
                .unwrap();
        }
    }
    assert_eq!(copies, 200);
    wait_until_async(
        "redeliveries processed",
        Duration::from_secs(30),
        || async { backlog(&redis, a, 8).await == 0 },
    )
    .await;
    assert_eq!(count_all_orders(&db).await, 1000);
    assert_eq!(mysql_stock(&db, s).await, 1000);
    let (logs,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM stock_log")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(logs, 1000);
    assert_eq!(redis_stock(&redis, a, s, 8).await, 1000);
}

#[tokio::test]
async fn when_redis_overcounts_the_extra_reservations_fail_and_mysql_stock_never_goes_below_zero() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 4, &[(100, 500)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    // MySQL has 80 of the 100 units Redis hands out.
    sqlx::query("UPDATE activity_items SET stock = 80 WHERE id = ?")
        .bind(s)
        .execute(db.pool())
        .await
        .unwrap();
    let _orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| c.consumer.batch_size = 7).await;
    let users: Vec<String> = (0..150).map(|u| format!("buyer-{u}")).collect();
    let rids = reserve_many(&redis, a, s, 4, &users).await;
    assert_eq!(rids.len(), 100, "Redis hands out its 100 units");
    wait_orders(&db, 100, Duration::from_secs(60)).await;
    assert_eq!(count_orders(&db, "PENDING").await, 80);
    assert_eq!(count_orders(&db, "FAILED").await, 20);
    assert_eq!(mysql_stock(&db, s).await, 0);
    let (reasons,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM orders WHERE status = 'FAILED' AND failure_reason LIKE 'sold out after all%'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(reasons, 20);
    // The failed ones lose their Redis buyer record, and no unit comes back.
    wait_until_async("outbox relayed", Duration::from_secs(30), || async {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM stock_return_outbox WHERE done_at IS NULL")
                .fetch_one(db.pool())
                .await
                .unwrap();
        n == 0
    })
    .await;
    let failed: Vec<(String, String)> =
        sqlx::query_as("SELECT id, user_id FROM orders WHERE status = 'FAILED'")
            .fetch_all(db.pool())
            .await
            .unwrap();
    for (id, user) in &failed {
        let rid: seckill_lua::ReservationId = id.parse().unwrap();
        let held: Option<String> = redis
            .hget(keys::buyers(a, rid.shard, s), user)
            .await
            .unwrap();
        assert_eq!(held, None, "{user} still holds {id} in Redis");
    }
    assert_eq!(redis_stock(&redis, a, s, 4).await, 0);
}

#[tokio::test]
async fn a_poison_entry_is_dead_lettered_after_n_tries_and_replay_creates_the_order_once() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 2, &[(10, 100)]).await;
    let a = seeded.activity;
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.consumer.claim_idle_ms = 100;
        c.consumer.max_deliveries = 3;
    })
    .await;
    // An entry for an item MySQL does not know (yet), and one that is garbage.
    let missing_item: u64 = 777_777;
    let rid = format!("{a}-{missing_item}-0-abc-1");
    let stream = keys::orders_stream(a, 0);
    for fields in [
        vec![
            ("rid", rid.clone()),
            ("uid", "poisoned".to_string()),
            ("a", a.to_string()),
            ("s", missing_item.to_string()),
            ("req", "r1".to_string()),
            ("ts", "1700000000000".to_string()),
        ],
        vec![("garbage", "yes".to_string())],
    ] {
        let _: Value = redis.xadd(&stream, false, None, "*", fields).await.unwrap();
    }
    // A good reservation in the same stream is not held up.
    let good = reserve_direct(&redis, a, seeded.items[0], 2, "fine-user", "r").await;
    assert_eq!(good.outcome, "RESERVED");

    // A letter's row is written before its `sk:dlq` entry and the ack; the counter
    // moves once both are done, so wait on it too.
    wait_until_async("two dead letters", Duration::from_secs(30), || async {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM dead_letters")
            .fetch_one(db.pool())
            .await
            .unwrap();
        n == 2 && orderd.metrics.dead_letters_total.get() == 2
    })
    .await;
    let mut client = orderd.order_client().await;
    let listed = client
        .list_dead_letters(pb::ListDeadLettersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.total_unreplayed, 2);
    let letter = listed
        .dead_letters
        .iter()
        .find(|d| d.reservation_id == rid)
        .expect("the poisoned reservation is listed");
    assert!(letter.deliveries > 3, "{letter:?}");
    assert!(letter.last_error.contains("does not exist"), "{letter:?}");
    let dlq_len: u64 = redis.xlen(seckill_orderd_dlq()).await.unwrap();
    assert_eq!(dlq_len, 2);
    assert_eq!(orderd.metrics.dead_letters_total.get(), 2);
    assert_eq!(
        count_orders(&db, "PENDING").await,
        1,
        "the good one went through"
    );

    // Replay before the fix: still failing, still listed.
    let out = client
        .replay_dead_letters(pb::ReplayDeadLettersRequest {
            ids: vec![letter.id],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((out.replayed, out.failed), (0, 1), "{out:?}");

    // Fix the cause: the item now exists in this activity.
    sqlx::query(
        "INSERT INTO activity_items (id, activity_id, title, price_cents, sale_price_cents, total_stock, stock) \
         VALUES (?, ?, 'late item', 100, 50, 5, 5)",
    )
    .bind(missing_item)
    .bind(a)
    .execute(db.pool())
    .await
    .unwrap();
    let out = client
        .replay_dead_letters(pb::ReplayDeadLettersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.replayed, 1, "{out:?}");
    assert_eq!(
        out.failed, 1,
        "the garbage entry cannot be replayed: {out:?}"
    );
    let again = client
        .replay_dead_letters(pb::ReplayDeadLettersRequest {
            ids: vec![letter.id],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.replayed, 0);
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders WHERE id = ?")
        .bind(&rid)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(mysql_stock(&db, missing_item).await, 4);
    let listed = client
        .list_dead_letters(pb::ListDeadLettersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.total_unreplayed, 1);
}

fn seckill_orderd_dlq() -> &'static str {
    orderd::redis::DLQ_STREAM
}

#[tokio::test]
async fn seckillctl_dlq_lists_and_replays_dead_letters() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 1, &[(10, 100)]).await;
    let a = seeded.activity;
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.consumer.claim_idle_ms = 100;
        c.consumer.max_deliveries = 1;
    })
    .await;
    let missing_item: u64 = 555_555;
    let rid = format!("{a}-{missing_item}-0-abc-1");
    let _: Value = redis
        .xadd(
            keys::orders_stream(a, 0),
            false,
            None,
            "*",
            vec![
                ("rid", rid.clone()),
                ("uid", "u1".to_string()),
                ("a", a.to_string()),
                ("s", missing_item.to_string()),
                ("req", "r".to_string()),
                ("ts", "1700000000000".to_string()),
            ],
        )
        .await
        .unwrap();
    wait_until_async("a dead letter", Duration::from_secs(30), || async {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM dead_letters")
            .fetch_one(db.pool())
            .await
            .unwrap();
        n == 1
    })
    .await;
    // Not std::process: a blocking wait would stall this runtime, which runs orderd.
    let addr = orderd.addr_str();
    let ctl = |args: &[&str]| {
        let mut cmd =
            tokio::process::Command::new(seckill_tests::process::workspace_bin("seckillctl"));
        cmd.args(["--orderd", &addr, "--token", seckill_tests::SERVICE_TOKEN])
            .args(args);
        async move { cmd.output().await.unwrap() }
    };
    let out = ctl(&["--json", "dlq", "list"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["total_unreplayed"], 1);
    assert_eq!(listed["dead_letters"][0]["reservation_id"], rid.as_str());
    let id = listed["dead_letters"][0]["id"]
        .as_u64()
        .unwrap()
        .to_string();
    // Still broken: replay fails, exit status says so.
    let out = ctl(&["dlq", "replay", &id]).await;
    assert!(!out.status.success());
    sqlx::query(
        "INSERT INTO activity_items (id, activity_id, title, price_cents, sale_price_cents, total_stock, stock) \
         VALUES (?, ?, 'late item', 100, 50, 5, 5)",
    )
    .bind(missing_item)
    .bind(a)
    .execute(db.pool())
    .await
    .unwrap();
    let out = ctl(&["dlq", "replay", &id]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("replayed 1"));
    assert_eq!(count_orders(&db, "PENDING").await, 1);
    let out = ctl(&["--json", "dlq", "list", "--all"]).await;
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["total_unreplayed"], 0);
    assert!(
        listed["dead_letters"][0]["replayed_at_ms"]
            .as_i64()
            .unwrap()
            > 0
    );
}

#[tokio::test]
async fn a_second_reservation_of_a_user_who_holds_an_active_order_fails_without_taking_stock() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 1, &[(10, 100)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let _orderd = spawn_orderd(&Deps::new(&cluster, &db), |_| {}).await;
    let first = reserve_direct(&redis, a, s, 1, "twice", "q1").await;
    assert_eq!(first.outcome, "RESERVED");
    wait_orders(&db, 1, Duration::from_secs(30)).await;
    // Redis forgets the buyer (as after a lost write) and hands out a second unit.
    let _: i64 = redis.hdel(keys::buyers(a, 0, s), "twice").await.unwrap();
    let second = reserve_direct(&redis, a, s, 1, "twice", "q2").await;
    assert_eq!(second.outcome, "RESERVED");
    wait_orders(&db, 2, Duration::from_secs(30)).await;
    let (status, reason): (String, Option<String>) =
        sqlx::query_as("SELECT status, failure_reason FROM orders WHERE id = ?")
            .bind(&second.rid)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(status, "FAILED");
    assert!(reason.unwrap().contains("already holds"));
    assert_eq!(count_orders(&db, "PENDING").await, 1);
    assert_eq!(mysql_stock(&db, s).await, 9, "one unit taken, not two");
}

/// Reservations trickling into one stream (one every 10 ms for 300 ms), with orderd's
/// `consumer.linger_ms` at `linger` and `consumer.batch_size` at `batch`: returns (MySQL
/// transactions written, orders in MySQL at each of `checks` after the first
/// reservation). Every reservation becomes an order in any case.
async fn trickle_into_one_stream(linger: u64, batch: u64, checks: &[u64]) -> (u64, Vec<i64>) {
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 1, &[(100, 990)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.consumer.claim_idle_ms = 12_000;
        c.consumer.linger_ms = linger;
        c.consumer.batch_size = batch;
    })
    .await;
    // The consumer is up and idle before the first reservation.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let first = tokio::time::Instant::now();
    for u in 0..30 {
        let r = reserve_direct(&redis, a, s, 1, &format!("u{u}"), &format!("r{u}")).await;
        assert_eq!(r.outcome, "RESERVED");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut seen = Vec::new();
    for at in checks {
        tokio::time::sleep_until(first + Duration::from_millis(*at)).await;
        seen.push(count_all_orders(&db).await);
    }
    wait_orders(&db, 30, Duration::from_secs(30)).await;
    assert_eq!(count_all_orders(&db).await, 30);
    assert_eq!(mysql_stock(&db, s).await, 70);
    (orderd.metrics.batch_size.get_sample_count(), seen)
}

#[tokio::test]
async fn a_trickle_of_reservations_waits_out_the_linger_and_is_written_as_one_transaction() {
    init_tracing();
    // Lingering 3 s: the 30 entries of the 300 ms trickle are one batch, written after
    // the linger (none in MySQL at 1.5 s).
    let (batches, seen) = trickle_into_one_stream(3_000, 500, &[1_500]).await;
    assert_eq!(seen, [0], "written before the linger was over");
    assert_eq!(batches, 1, "one transaction for the whole trickle");
    // A full read is not held: with 10 per batch the first read (short) lingers and
    // its top-up fills it; the 20 entries queued by then are two full reads, written
    // at once (all 30 in MySQL well before a second linger could end, at 6 s).
    let (batches, seen) = trickle_into_one_stream(3_000, 10, &[1_500, 4_500]).await;
    assert_eq!(batches, 3, "three full batches");
    // Held, the second full batch would not be written before about 6 s.
    assert!(
        seen[0] == 0 && seen[1] >= 20,
        "{seen:?}: the full batches were held"
    );
    // Without lingering (the checks above can fail): the entries go as they come, a
    // few per transaction, and are in MySQL at once.
    let (batches, seen) = trickle_into_one_stream(0, 500, &[1_500]).await;
    assert!(batches > 5, "{batches} transactions without lingering");
    assert!(
        seen[0] > 0,
        "nothing written within 1.5 s without lingering"
    );
}

#[tokio::test]
async fn a_shutdown_during_the_linger_writes_the_batch_in_hand() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 1, &[(100, 990)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    // Queued before orderd starts: its first read takes all five, then lingers.
    for u in 0..5 {
        let r = reserve_direct(&redis, a, s, 1, &format!("u{u}"), &format!("r{u}")).await;
        assert_eq!(r.outcome, "RESERVED");
    }
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.consumer.claim_idle_ms = 60_000;
        c.consumer.linger_ms = 15_000;
    })
    .await;
    // Read and held (pending on this consumer), not written.
    wait_until_async("the entries read", Duration::from_secs(10), || async {
        // NOGROUP until orderd has created its group.
        let pending: Result<Value, _> = redis
            .xpending(keys::orders_stream(a, 0), "orderd", ())
            .await;
        pending.is_ok_and(|p| p.into_array().first().and_then(|n| n.as_u64()) == Some(5))
    })
    .await;
    assert_eq!(count_all_orders(&db).await, 0);
    let stopping = tokio::time::Instant::now();
    orderd.stop().await.unwrap();
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "the stop waited out the linger"
    );
    assert_eq!(
        count_all_orders(&db).await,
        5,
        "the batch in hand was dropped"
    );
    assert_eq!(
        backlog(&redis, a, 1).await,
        0,
        "written but not acknowledged"
    );
}
