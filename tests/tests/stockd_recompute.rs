#![cfg(feature = "stockd")]
//! Redis losing state mid-sale: stockd rebuilds every shard from MySQL before the
//! item reopens, answers UNAVAILABLE (never RESERVED) meanwhile, and never oversells.
//!
//! (Over 400 lines: an integration suite: each test sets up real processes and states its
//! invariants inline, so the cases read top to bottom.)

use seckill_tests::Deps;
use std::collections::HashSet;
use std::time::Duration;

use fred::prelude::*;
use seckill_lua::keys;
use seckill_proto::pb::{self, ReserveOutcome};
use seckill_tests::process::wait_until_async;
use seckill_tests::stockd::{
    create_published_activity, crowd, make_order, reserve, shard_stock, spawn_stockd, stock_status,
};
use seckill_tests::{init_tracing, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_redis_flush_mid_sale_is_recomputed_from_mysql_and_nothing_is_oversold() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(100, 100)], 8, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let mut c = h.stock_client().await;
    // 30 sold and written as orders.
    let mut buyers = Vec::new();
    for u in 0..30 {
        let user = format!("early-{u}");
        let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
        make_order(&db, a, s, &user, "r", &r.reservation_id).await;
        buyers.push(user);
    }
    cluster.flush_all();
    // The fence check notices with nobody buying, and the item reopens with 70.
    wait_until_async("the recompute", Duration::from_secs(30), || {
        let mut c = c.clone();
        async move {
            matches!(stock_status(&mut c, a, s).await, Some(st) if st.available && st.remaining == 70)
        }
    })
    .await;
    let st = stock_status(&mut c, a, s).await.unwrap();
    assert_eq!(st.reserved, 30, "buyers rebuilt from the orders");
    let mut calls: Vec<(String, String)> = Vec::new();
    for round in 0..2 {
        for u in 0..1000 {
            calls.push((format!("late-{u}"), format!("late-{u}-{round}")));
        }
    }
    for u in &buyers {
        calls.push((u.clone(), "second-try".into()));
    }
    let answers = crowd(&c, a, s, calls).await;
    let winners: HashSet<&String> = answers
        .iter()
        .filter(|(_, r)| r.outcome() == ReserveOutcome::Reserved)
        .map(|(u, _)| u)
        .collect();
    let reserved = answers
        .iter()
        .filter(|(_, r)| r.outcome() == ReserveOutcome::Reserved)
        .count();
    assert_eq!(reserved, 70, "exactly the units MySQL still had");
    assert_eq!(winners.len(), 70);
    assert!(
        buyers.iter().all(|b| !winners.contains(b)),
        "early buyers stay one per user"
    );
    let redis = cluster.client().await;
    let shards = shard_stock(&redis, a, s, 8).await;
    assert!(shards.iter().all(|&n| n >= 0), "{shards:?}");
    assert_eq!(shards.iter().sum::<i64>(), 0);
    assert!(h.metrics.recomputes.with_label_values(&["ok"]).get() >= 1);
}

#[tokio::test]
async fn a_lost_fence_rebuilds_the_activity_keeping_reservations_in_flight() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(50, 100)], 4, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let mut c = h.stock_client().await;
    let mut held = Vec::new();
    for u in 0..20 {
        let user = format!("inflight-{u}");
        let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
        held.push((user, r.reservation_id));
    }
    // 5 of them already ordered, 15 still in the streams only.
    for (user, rid) in &held[..5] {
        make_order(&db, a, s, user, "r", rid).await;
    }
    let redis = cluster.client().await;
    let _: i64 = redis.del(keys::fence(a, 0)).await.unwrap();
    // Meanwhile Reserve is UNAVAILABLE or an honest answer; never beyond the stock.
    wait_until_async("the recompute", Duration::from_secs(30), || {
        let mut c = c.clone();
        async move {
            matches!(stock_status(&mut c, a, s).await, Some(st) if st.available && st.remaining == 30)
        }
    })
    .await;
    let st = stock_status(&mut c, a, s).await.unwrap();
    assert_eq!(st.reserved, 20);
    for (user, rid) in &held {
        let r = reserve(&mut c, a, s, user, "other").await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Duplicate);
        assert_eq!(&r.reservation_id, rid);
    }
    let calls = (0..200)
        .map(|u| (format!("new-{u}"), "r".to_string()))
        .collect();
    let answers = crowd(&c, a, s, calls).await;
    let reserved = answers
        .iter()
        .filter(|(_, r)| r.outcome() == ReserveOutcome::Reserved)
        .count();
    assert_eq!(reserved, 30);
    let shards = shard_stock(&redis, a, s, 4).await;
    assert!(shards.iter().all(|&n| n >= 0), "{shards:?}");
    // New ids differ from every old one (new epoch).
    let rids: HashSet<String> = answers
        .iter()
        .map(|(_, r)| r.reservation_id.clone())
        .collect();
    assert!(held.iter().all(|(_, rid)| !rids.contains(rid)));
}

#[tokio::test]
async fn reserve_answers_unavailable_while_a_node_is_down_and_recovers_after_it_returns_empty() {
    init_tracing();
    let mut cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| {
        c.redis.timeout_ms = 300;
    })
    .await;
    let act = create_published_activity(&h, &[(40, 100)], 8, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let c = h.stock_client().await;
    cluster.kill_node(0);
    let calls: Vec<(String, String)> = (0..40).map(|u| (format!("d-{u}"), "r".into())).collect();
    let mut unavailable = 0;
    let mut reserved = 0;
    for (user, req) in &calls {
        let mut c = c.clone();
        let r = tokio::time::timeout(Duration::from_secs(15), reserve(&mut c, a, s, user, req))
            .await
            .expect("an answer, never a hang");
        match r {
            Ok(r) if r.outcome() == ReserveOutcome::Reserved => reserved += 1,
            Ok(r) => panic!("{r:?}"),
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
                unavailable += 1;
            }
        }
    }
    assert!(unavailable > 0, "some home shards live on the dead node");
    cluster.restart_node(0);
    // The node came back empty: its shards have no fence; stockd rebuilds.
    let mut c2 = c.clone();
    wait_until_async("the recompute", Duration::from_secs(40), || {
        let mut c = c2.clone();
        async move { matches!(stock_status(&mut c, a, s).await, Some(st) if st.available) }
    })
    .await;
    let st = stock_status(&mut c2, a, s).await.unwrap();
    // Reservations on the surviving shards are in flight (their streams survived);
    // the lost node's are gone with it, so the total may only be lower. A call
    // answered UNAVAILABLE may still have reserved (its outcome is unknown): the
    // client's retry with the same request id finds it.
    assert!(st.remaining + st.reserved <= 40, "{st:?}");
    let mut calls = calls.clone();
    calls.extend((0..100).map(|u| (format!("after-{u}"), "r".to_string())));
    let answers = crowd(&c, a, s, calls).await;
    let winners: HashSet<String> = answers
        .iter()
        .filter(|(_, r)| r.outcome() == ReserveOutcome::Reserved)
        .map(|(_, r)| r.reservation_id.clone())
        .collect();
    assert!(winners.len() <= 40, "{}", winners.len());
    assert!(reserved <= 40);
    let after = stock_status(&mut c2, a, s).await.unwrap();
    assert_eq!(after.remaining, 0, "every remaining unit sells: {after:?}");
    let shards = shard_stock(&cluster.client().await, a, s, 8).await;
    assert!(shards.iter().all(|&n| n == 0), "{shards:?}");
}

/// The keys of one shard that a replica lagging behind its master would hold older
/// versions of: everything the reserve script writes except the fence (set once at
/// warm-up, so every replica has it).
fn written_by_reserve(a: u64, shard: u32, s: u64) -> Vec<String> {
    vec![
        keys::stock(a, shard, s),
        keys::buyers(a, shard, s),
        keys::orders_stream(a, shard),
        keys::seq(a, shard),
    ]
}

async fn dump_keys(redis: &Client, keys: &[String]) -> Vec<(String, fred::types::Value)> {
    let mut out = Vec::new();
    for k in keys {
        let v: fred::types::Value = redis.dump(k.as_str()).await.unwrap();
        assert!(!v.is_null(), "{k} exists");
        out.push((k.clone(), v));
    }
    out
}

/// Puts the dumped versions back: the shard now looks like a replica promoted before
/// it received the writes made since the dump (the fence is untouched).
async fn roll_back(redis: &Client, dumped: Vec<(String, fred::types::Value)>) {
    for (k, v) in dumped {
        let _: () = redis
            .restore(k.as_str(), 0, v, true, false, None, None)
            .await
            .unwrap();
    }
}

/// Users whose home shard is `shard` of `shards`.
fn users_on(shard: u32, shards: u32, prefix: &str, n: usize) -> Vec<String> {
    (0..)
        .map(|u| format!("{prefix}-{u}"))
        .filter(|u| seckill_lua::home_shard(u, shards) == shard)
        .take(n)
        .collect()
}

/// A failover to a replica that had not received the last writes keeps the fence (set
/// at warm-up) but rewinds the shard: its sequence, stock, buyer records and stream go
/// back. Without detection the next reserve would hand out a reservation id already
/// promised to someone else, and sell the lost units a second time.
#[tokio::test]
async fn a_rewound_shard_with_its_fence_intact_is_caught_at_the_next_reserve_and_rebuilt() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| {
        // Only the reserve path may find it in this test.
        c.stock.fence_check_ms = 600_000;
    })
    .await;
    let shards = 4;
    let act = create_published_activity(&h, &[(100, 100)], shards, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let mut c = h.stock_client().await;
    let redis = cluster.client().await;
    let users = users_on(0, shards, "rw", 16);
    for u in &users[..10] {
        let r = reserve(&mut c, a, s, u, "r").await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
        make_order(&db, a, s, u, "r", &r.reservation_id).await;
    }
    let dumped = dump_keys(&redis, &written_by_reserve(a, 0, s)).await;
    let mut lost = HashSet::new();
    for u in &users[10..15] {
        let r = reserve(&mut c, a, s, u, "r").await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
        lost.insert(r.reservation_id);
    }
    roll_back(&redis, dumped).await;

    // The next reserve on that shard is refused, not handed a lost reservation's id.
    let err = reserve(&mut c, a, s, &users[15], "r").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert_eq!(h.metrics.lost_writes.get(), 1);
    assert_eq!(h.metrics.lost_reservations_total(), 5, "the sequence gap");

    // Rebuilt from MySQL: 10 orders; the 5 lost reservations left no trace there.
    wait_until_async("the recompute", Duration::from_secs(30), || {
        let mut c = c.clone();
        async move {
            matches!(stock_status(&mut c, a, s).await, Some(st) if st.available && st.remaining == 90)
        }
    })
    .await;
    let calls = (0..300)
        .map(|u| (format!("after-{u}"), "r".to_string()))
        .chain(users[..10].iter().map(|u| (u.clone(), "again".to_string())))
        .collect();
    let answers = crowd(&c, a, s, calls).await;
    let won: Vec<&pb::ReserveResponse> = answers
        .iter()
        .filter(|(_, r)| r.outcome() == ReserveOutcome::Reserved)
        .map(|(_, r)| r)
        .collect();
    assert_eq!(won.len(), 90, "exactly what MySQL still had");
    assert!(
        won.iter().all(|r| !lost.contains(&r.reservation_id)),
        "no lost reservation's id is handed out again"
    );
    let ordered_again = answers
        .iter()
        .filter(|(u, r)| users[..10].contains(u) && r.outcome() == ReserveOutcome::Reserved)
        .count();
    assert_eq!(ordered_again, 0, "one per user survives the rebuild");
    let left = shard_stock(&redis, a, s, shards).await;
    assert!(left.iter().all(|&n| n == 0), "{left:?}");
}

/// The same rewind with nobody buying: the periodic check compares each shard's
/// sequence with the highest this stockd handed out and rebuilds on its own.
#[tokio::test]
async fn a_rewound_shard_is_found_by_the_periodic_check_while_nobody_buys() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let shards = 2;
    let act = create_published_activity(&h, &[(50, 100)], shards, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let mut c = h.stock_client().await;
    let redis = cluster.client().await;
    let users = users_on(1, shards, "idle", 8);
    for u in &users[..5] {
        let r = reserve(&mut c, a, s, u, "r").await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
        make_order(&db, a, s, u, "r", &r.reservation_id).await;
    }
    let dumped = dump_keys(&redis, &written_by_reserve(a, 1, s)).await;
    let fence_before: String = redis.get(keys::fence(a, 1)).await.unwrap();
    for u in &users[5..8] {
        let r = reserve(&mut c, a, s, u, "r").await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    }
    roll_back(&redis, dumped).await;
    let metrics = h.metrics.clone();
    wait_until_async("the periodic check", Duration::from_secs(30), || {
        let metrics = metrics.clone();
        async move { metrics.lost_reservations_total() == 3 }
    })
    .await;
    wait_until_async("the recompute", Duration::from_secs(30), || {
        let mut c = c.clone();
        async move {
            matches!(stock_status(&mut c, a, s).await, Some(st) if st.available && st.remaining == 45)
        }
    })
    .await;
    let fence_after: String = redis.get(keys::fence(a, 1)).await.unwrap();
    assert_ne!(fence_before, fence_after, "reopened under a new epoch");
    assert_eq!(h.metrics.lost_writes.get(), 1, "one gap, reported once");
}

/// The other side of the high-water check: a healthy Redis under a steady stream of
/// reservations, checked every 50 ms, is never taken for one that lost writes (the
/// marks move on while the check reads Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_healthy_shard_is_never_taken_for_a_rewound_one() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| {
        c.stock.fence_check_ms = 50;
    })
    .await;
    let act = create_published_activity(&h, &[(1_000_000, 100)], 4, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let c = h.stock_client().await;
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let workers: Vec<_> = (0..32)
        .map(|w| {
            let mut c = c.clone();
            tokio::spawn(async move {
                let mut n = 0u32;
                while std::time::Instant::now() < until {
                    let user = format!("busy-{w}-{n}");
                    let r = reserve(&mut c, a, s, &user, "r").await;
                    let r = r.unwrap_or_else(|e| panic!("{user}: {e:?}"));
                    assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{user}");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for w in workers {
        total += w.await.unwrap();
    }
    assert!(total > 100, "enough traffic to matter: {total}");
    assert_eq!(h.metrics.lost_writes.get(), 0);
    assert_eq!(h.metrics.recomputes.with_label_values(&["ok"]).get(), 0);
}
