#![cfg(feature = "orderd")]
//! Hot-item isolation in orderd (issue 15): an activity placed on a named Redis Cluster
//! (`[redis.clusters.hot]`) is consumed, looked up and released on that cluster, and
//! keeps selling while the default cluster is down; an activity on the default cluster
//! waits for it and resumes when it is back; an activity naming a cluster orderd does
//! not have is skipped (no crash, no consuming from the wrong cluster); a named cluster
//! that is down at start does not stop orderd.
//!
//! stockd's routing to named clusters is built separately, so these tests seed and
//! reserve with the real WARM and RESERVE scripts straight on the activity's cluster
//! (`seed_activity_on`, `reserve_direct`), with `activities.redis_cluster` set in MySQL.

use std::time::Duration;

use fred::prelude::*;
use fred::types::Value;
use seckill_daemon::config::NamedCluster;
use seckill_lua::{keys, ReservationId};
use seckill_proto::pb::{self, OrderState};
use seckill_tests::orderd::{
    backlog, mysql_stock, redis_stock, reserve_direct, seed_activity, seed_activity_on, set_status,
    spawn_orderd, OrderClient,
};
use seckill_tests::process::wait_until_async;
use seckill_tests::redis::Persistence;
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

/// Moves activity `a` to `cluster` in MySQL.
async fn place(db: &TestDb, a: u64, cluster: &str) {
    sqlx::query("UPDATE activities SET redis_cluster = ? WHERE id = ?")
        .bind(cluster)
        .bind(a)
        .execute(db.pool())
        .await
        .unwrap();
}

/// Orders of activity `a` in MySQL (any state).
async fn orders_of(db: &TestDb, a: u64) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders WHERE activity_id = ?")
        .bind(a)
        .fetch_one(db.pool())
        .await
        .unwrap();
    n
}

/// Orders of activity `a` in state `status`.
async fn orders_in(db: &TestDb, a: u64, status: &str) -> i64 {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM orders WHERE activity_id = ? AND status = ?")
            .bind(a)
            .bind(status)
            .fetch_one(db.pool())
            .await
            .unwrap();
    n
}

/// Stock returns of activity `a` the relay has done.
async fn returns_done(db: &TestDb, a: u64) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM stock_return_outbox WHERE activity_id = ? AND done_at IS NOT NULL",
    )
    .bind(a)
    .fetch_one(db.pool())
    .await
    .unwrap();
    n
}

async fn wait_orders_of(db: &TestDb, a: u64, n: i64) {
    wait_until_async(
        &format!("{n} orders of activity {a}"),
        Duration::from_secs(60),
        || async { orders_of(db, a).await >= n },
    )
    .await;
}

/// The stock-side keys of activity `a` (shard keys, streams, sold-out flags) on a live
/// single-master cluster (node 0); its meta hash is the default cluster's anyway.
fn stock_keys_of(cluster: &RedisCluster, a: u64) -> Vec<String> {
    let mut found = Vec::new();
    for pattern in [format!("sk:{{{a}:*"), format!("sk:{{{a}}}:soldout:*")] {
        found.extend(
            cluster
                .cli(0, &["KEYS", &pattern])
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string),
        );
    }
    found
}

/// A cluster of one master, which no `CLUSTER MEET` ever told its own address: it
/// names itself with an empty host in `CLUSTER SLOTS`, which clients cannot dial, until
/// it is given one. Again after every restart.
fn announce(cluster: &RedisCluster) {
    let out = cluster.cli(0, &["CONFIG", "SET", "cluster-announce-ip", "127.0.0.1"]);
    assert_eq!(out.trim(), "OK", "{out}");
}

/// A Redis Cluster of one master: killed and restarted whole with
/// `RedisCluster::kill_node(0)` / `restart_node(0)` (then [`announce`] again).
fn single_master() -> RedisCluster {
    let cluster = RedisCluster::start_with(1, Persistence::None);
    announce(&cluster);
    cluster
}

async fn get(client: &mut OrderClient, id: &str, user: &str) -> Result<pb::Order, tonic::Status> {
    seckill_tests::orderd::get_order(client, id, user).await
}

fn hot(cluster: &RedisCluster) -> impl FnOnce(&mut orderd::Config) + '_ {
    move |c| {
        c.redis.clusters.insert(
            "hot".into(),
            NamedCluster {
                nodes: cluster.nodes(),
            },
        );
    }
}

#[tokio::test]
async fn a_hot_activity_keeps_selling_on_its_own_cluster_while_the_default_cluster_is_down() {
    init_tracing();
    // A: the default cluster, one master so it can be killed and restarted whole
    // (`SAVE` keeps its data across the restart). B: the named cluster `hot`.
    let mut cluster_a = single_master();
    let cluster_b = RedisCluster::start();
    let db = TestDb::create().await;
    let a = cluster_a.client().await;
    let b = cluster_b.client().await;

    // X on B (hot); Y on A (default), not yet published so orderd leaves its streams
    // alone until A is down.
    let x = seed_activity_on(&a, &b, "hot", &db, 4, &[(50, 700)]).await;
    let y = seed_activity(&a, &db, 2, &[(10, 500)]).await;
    set_status(&db, y.activity, "SCHEDULED").await;
    let (xa, xs) = (x.activity, x.items[0]);
    let (ya, ys) = (y.activity, y.items[0]);

    let orderd = spawn_orderd(&Deps::new(&cluster_a, &db), hot(&cluster_b)).await;
    let mut client = orderd.order_client().await;

    // W on A sells before A dies; its order is cancelled while A is down, so the return
    // of its unit to A waits in the outbox, ahead of X's returns.
    let w = seed_activity(&a, &db, 1, &[(5, 100)]).await;
    let (wa, ws) = (w.activity, w.items[0]);
    let rw = reserve_direct(&a, wa, ws, 1, "w-user", "req-w").await;
    assert_eq!(rw.outcome, "RESERVED", "{rw:?}");
    wait_orders_of(&db, wa, 1).await;

    let y_users: Vec<String> = (0..3).map(|u| format!("y-user-{u}")).collect();
    for u in &y_users {
        let r = reserve_direct(&a, ya, ys, 2, u, &format!("req-{u}")).await;
        assert_eq!(r.outcome, "RESERVED", "{r:?}");
    }
    // Y's entries and stock are on disk; then the whole default cluster dies.
    assert_eq!(cluster_a.cli(0, &["SAVE"]).trim(), "OK");
    cluster_a.kill_node(0);
    set_status(&db, ya, "PUBLISHED").await;
    let cancelled = client
        .cancel(pb::CancelRequest {
            order_id: rw.rid.clone(),
            user_id: "w-user".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.outcome, pb::ChangeOutcome::Applied as i32);

    // Reservations on B after A died: they become orders, acknowledged and deleted on B.
    let x_users: Vec<String> = (0..10).map(|u| format!("x-user-{u}")).collect();
    let mut rids = Vec::new();
    for u in &x_users {
        let r = reserve_direct(&b, xa, xs, 4, u, &format!("req-{u}")).await;
        assert_eq!(r.outcome, "RESERVED", "{r:?}");
        rids.push(r.rid);
    }
    wait_orders_of(&db, xa, 10).await;
    wait_until_async(
        "X's streams drained on B",
        Duration::from_secs(30),
        || async { backlog(&b, xa, 4).await == 0 },
    )
    .await;
    assert_eq!(orders_in(&db, xa, "PENDING").await, 10);
    assert_eq!(mysql_stock(&db, xs).await, 40);
    assert_eq!(redis_stock(&b, xa, xs, 4).await, 40);

    // Lookups go to B: a queued reservation (a buyer record with no order yet) is
    // found there, an unknown one is NOT_FOUND (A would answer UNAVAILABLE).
    let first: ReservationId = rids[0].parse().unwrap();
    let queued_user = "x-queued";
    let home = seckill_lua::home_shard(queued_user, 4);
    let queued = ReservationId {
        shard: home,
        seq: 999_999,
        ..first.clone()
    };
    let _: Value = b
        .hset(
            keys::buyers(xa, home, xs),
            (queued_user, format!("{queued}|req-q|1")),
        )
        .await
        .unwrap();
    let found = get(&mut client, &queued.to_string(), queued_user)
        .await
        .unwrap();
    assert_eq!(found.state, OrderState::Queued as i32);
    let unknown = ReservationId {
        seq: 999_998,
        ..first.clone()
    };
    let e = get(&mut client, &unknown.to_string(), &x_users[0])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let _: i64 = b
        .hdel(keys::buyers(xa, home, xs), queued_user)
        .await
        .unwrap();

    // Pay one, cancel one, and let two miss their payment deadline: the three units go
    // back to B's shard keys through the outbox relay of `hot`.
    let paid = orderd.pay(&rids[0], &x_users[0]).await.unwrap();
    assert_eq!(paid.outcome, pb::ChangeOutcome::Applied as i32);
    let cancelled = client
        .cancel(pb::CancelRequest {
            order_id: rids[1].clone(),
            user_id: x_users[1].clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.outcome, pb::ChangeOutcome::Applied as i32);
    sqlx::query("UPDATE orders SET pay_deadline = '2000-01-01 00:00:00' WHERE id IN (?, ?)")
        .bind(&rids[2])
        .bind(&rids[3])
        .execute(db.pool())
        .await
        .unwrap();
    wait_until_async(
        "cancel and timeouts relayed to B",
        Duration::from_secs(30),
        || async { returns_done(&db, xa).await == 3 },
    )
    .await;
    assert_eq!(orders_in(&db, xa, "CANCELLED").await, 3);
    assert_eq!(orders_in(&db, xa, "PAID").await, 1);
    assert_eq!(mysql_stock(&db, xs).await, 43);
    assert_eq!(redis_stock(&b, xa, xs, 4).await, 43);
    for (n, u) in x_users.iter().enumerate().take(4) {
        let shard = seckill_lua::home_shard(u, 4);
        let held: Option<String> = b.hget(keys::buyers(xa, shard, xs), u).await.unwrap();
        // The payer keeps its buyer record; the cancelled and expired ones lost theirs.
        assert_eq!(held.is_some(), n == 0, "{u}: {held:?}");
    }

    // Y and W, on the dead default cluster, made no progress in all that time.
    assert_eq!(orders_of(&db, ya).await, 0);
    assert_eq!(returns_done(&db, wa).await, 0);

    // A comes back with its data: Y's reservations become orders.
    cluster_a.restart_node(0);
    announce(&cluster_a);
    let a = cluster_a.client().await;
    wait_orders_of(&db, ya, 3).await;
    wait_until_async(
        "Y's streams drained on A",
        Duration::from_secs(30),
        || async { backlog(&a, ya, 2).await == 0 },
    )
    .await;
    assert_eq!(mysql_stock(&db, ys).await, 7);
    wait_until_async(
        "W's return relayed to A",
        Duration::from_secs(30),
        || async { returns_done(&db, wa).await == 1 },
    )
    .await;
    assert_eq!(redis_stock(&a, wa, ws, 1).await, 5);
    // Nothing of X was ever written to A (nor is now, with A back).
    let stray = stock_keys_of(&cluster_a, xa);
    assert!(stray.is_empty(), "{stray:?}");
    assert_eq!(orders_of(&db, xa).await, 10);
}

#[tokio::test]
async fn a_named_cluster_down_at_start_or_missing_holds_up_only_its_own_activities() {
    init_tracing();
    let cluster_a = RedisCluster::start();
    let mut cluster_b = single_master();
    let db = TestDb::create().await;
    let a = cluster_a.client().await;
    // C names a cluster orderd does not have; its entry is on the default cluster,
    // where orderd must not take it.
    let c = seed_activity_on(&a, &a, "cold", &db, 1, &[(5, 100)]).await;
    let rc = reserve_direct(&a, c.activity, c.items[0], 1, "c-user", "req-c").await;
    assert_eq!(rc.outcome, "RESERVED");
    // `hot` is configured but down when orderd starts.
    cluster_b.kill_node(0);
    let orderd = spawn_orderd(&Deps::new(&cluster_a, &db), hot(&cluster_b)).await;
    let mut client = orderd.order_client().await;

    // D on the default cluster sells as usual.
    let d = seed_activity(&a, &db, 2, &[(5, 100)]).await;
    let r = reserve_direct(&a, d.activity, d.items[0], 2, "d-user", "req-d").await;
    assert_eq!(r.outcome, "RESERVED");
    wait_orders_of(&db, d.activity, 1).await;
    wait_until_async("C counted", Duration::from_secs(30), || async {
        orderd.metrics.unknown_cluster_activities.get() == 1
    })
    .await;

    // `hot` comes up: orderd connects to it in the background, and H placed on it sells.
    cluster_b.restart_node(0);
    announce(&cluster_b);
    let b = cluster_b.client().await;
    let h = seed_activity_on(&a, &b, "hot", &db, 2, &[(5, 100)]).await;
    let rh = reserve_direct(&b, h.activity, h.items[0], 2, "h-user", "req-h").await;
    assert_eq!(rh.outcome, "RESERVED");
    wait_orders_of(&db, h.activity, 1).await;
    wait_until_async(
        "H's streams drained on B",
        Duration::from_secs(30),
        || async { backlog(&b, h.activity, 2).await == 0 },
    )
    .await;

    // All that time C was left alone: no group on its stream, no order, still counted;
    // a lookup of its queued order is UNAVAILABLE, not a guess on the wrong cluster.
    let groups: Value = a
        .xinfo_groups(keys::orders_stream(c.activity, 0))
        .await
        .unwrap();
    assert!(groups.into_array().is_empty(), "a group on C's stream");
    assert_eq!(orders_of(&db, c.activity).await, 0);
    assert_eq!(orderd.metrics.unknown_cluster_activities.get(), 1);
    let e = get(&mut client, &rc.rid, "c-user").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");

    // C placed on the default cluster after all: the gauge drops, its entry is taken.
    place(&db, c.activity, "").await;
    wait_orders_of(&db, c.activity, 1).await;
    assert_eq!(orderd.metrics.unknown_cluster_activities.get(), 0);
}
