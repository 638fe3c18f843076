#![cfg(all(feature = "stockd", feature = "orderd"))]
//! Hot-item isolation (issue 15 item 4): an activity placed on a named Redis Cluster of
//! its own sells and drains while the default cluster is down.
//!
//! Two real Redis Clusters: A (the `[redis]` section's own, the default) and B
//! (`[redis.clusters.hot]`). stockd and orderd are configured with both. One activity on
//! each. The checks:
//! - placement: the hot activity's shard keys are on B and none on A; the cold one's on
//!   A and none on B; the meta hash (the catalog) is on A and names `hot`;
//! - a `redis_cluster` stockd is not configured with, or not a name at all, is refused
//!   with INVALID_ARGUMENT naming the field, and creates nothing;
//! - with every node of A killed: a crowd of distinct buyers on the hot activity gets
//!   exactly its stock in RESERVED answers (the rest SOLD_OUT), the item is flagged
//!   sold out on B, and orderd turns every reservation into exactly one order in MySQL
//!   and empties B's streams; the cold activity answers UNAVAILABLE meanwhile.
//!
//! The test fails when any of the hot path's calls goes to the default cluster: those
//! calls would wait out the dead nodes and answer UNAVAILABLE.

use std::collections::HashSet;
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface, StreamsInterface};
use futures::StreamExt;
use seckill_daemon::config::NamedCluster;
use seckill_lua::keys;
use seckill_proto::pb::{self, ReserveOutcome};
use seckill_tests::orderd::spawn_orderd;
use seckill_tests::stockd::{
    create_and_publish, reserve, reserve_retrying_busy, sale_request, spawn_stockd,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 4;
const HOT_STOCK: u32 = 60;
const BUYERS: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_activity_on_its_own_cluster_sells_and_drains_while_the_default_cluster_is_down() {
    init_tracing();
    let mut a = RedisCluster::start();
    let b = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&a, &db);
    let hot_nodes = b.nodes();
    let with_hot = |nodes: &[String]| {
        (
            "hot".to_string(),
            NamedCluster {
                nodes: nodes.to_vec(),
            },
        )
    };
    let stockd = spawn_stockd(&deps, |c| {
        c.redis.clusters.extend([with_hot(&hot_nodes)]);
    })
    .await;
    let orderd = spawn_orderd(&deps, |c| {
        c.redis.clusters.extend([with_hot(&hot_nodes)]);
    })
    .await;
    let mut admin = stockd.admin_client().await;

    // A cluster stockd does not know, and a name that is no name: refused, nothing made.
    let before = activities(&mut admin).await;
    for bad in ["cold", "Hot!", &"x".repeat(33)] {
        let mut req = sale_request(&[(5, 100)], SHARDS, Duration::ZERO, HOUR, 1);
        req.redis_cluster = bad.to_string();
        let e = admin.create_activity(req).await.expect_err(bad);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}: {e:?}");
        assert!(
            e.message().contains("redis_cluster"),
            "{bad}: {}",
            e.message()
        );
    }
    let after = activities(&mut admin).await;
    assert_eq!(before, after, "a refused activity was created");

    let cold = create_and_publish(
        &mut admin,
        sale_request(&[(20, 100)], SHARDS, Duration::ZERO, HOUR, 1),
    )
    .await;
    let mut req = sale_request(&[(HOT_STOCK, 100)], SHARDS, Duration::ZERO, HOUR, 1);
    req.redis_cluster = "hot".into();
    let hot = create_and_publish(&mut admin, req).await;
    assert_eq!(hot.redis_cluster, "hot");
    assert_eq!(cold.redis_cluster, "");
    let (hot_a, hot_s) = (hot.id, hot.items[0].id);
    let (cold_a, cold_s) = (cold.id, cold.items[0].id);

    // Placement.
    let (ca, cb) = (a.client().await, b.client().await);
    for i in 0..SHARDS {
        let on_b: Option<i64> = cb.get(keys::stock(hot_a, i, hot_s)).await.expect("GET");
        let on_a: Option<i64> = ca.get(keys::stock(hot_a, i, hot_s)).await.expect("GET");
        assert!(
            on_b.is_some() && on_a.is_none(),
            "hot shard {i}: B {on_b:?}, A {on_a:?}"
        );
        let on_a: Option<i64> = ca.get(keys::stock(cold_a, i, cold_s)).await.expect("GET");
        let on_b: Option<i64> = cb.get(keys::stock(cold_a, i, cold_s)).await.expect("GET");
        assert!(
            on_a.is_some() && on_b.is_none(),
            "cold shard {i}: A {on_a:?}, B {on_b:?}"
        );
    }
    let cluster: Option<String> = ca
        .hget(keys::meta(hot_a), keys::meta::CLUSTER)
        .await
        .expect("HGET");
    assert_eq!(cluster.as_deref(), Some("hot"), "the catalog on A names B");
    let on_b: i64 = cb.exists(keys::meta(hot_a)).await.expect("EXISTS");
    assert_eq!(on_b, 0, "the meta hash stays on the default cluster");

    // Both sell while both clusters are up.
    let mut stock = stockd.stock_client().await;
    for (act, item) in [(hot_a, hot_s), (cold_a, cold_s)] {
        let r = reserve(&mut stock, act, item, "early", "r")
            .await
            .expect("reserve");
        assert_eq!(r.outcome(), ReserveOutcome::Reserved, "activity {act}");
    }

    // The default cluster goes down, every node of it.
    for port in a.ports() {
        a.kill(port);
    }

    // The hot sale runs on B alone: a crowd of distinct buyers.
    let users: Vec<String> = (0..BUYERS).map(|k| format!("buyer-{k}")).collect();
    let answers: Vec<(String, Result<pb::ReserveResponse, tonic::Status>)> =
        futures::stream::iter(users)
            .map(|u| {
                let mut c = stock.clone();
                async move {
                    // ABORTED is the contention answer over the last units ("retry with the
                    // same request id"): the buyer sends again, as a caller does.
                    let r = reserve_retrying_busy(&mut c, hot_a, hot_s, &u, "r").await;
                    (u, r)
                }
            })
            .buffer_unordered(24)
            .collect()
            .await;
    let mut reserved = HashSet::new();
    let mut sold_out = 0;
    for (u, r) in &answers {
        let r = r
            .as_ref()
            .unwrap_or_else(|e| panic!("{u}: {e:?} (A is down, B is not)"));
        match r.outcome() {
            ReserveOutcome::Reserved => assert!(reserved.insert(r.reservation_id.clone())),
            ReserveOutcome::SoldOut => sold_out += 1,
            other => panic!("{u}: {other:?}"),
        }
    }
    assert_eq!(
        reserved.len() as u32,
        HOT_STOCK - 1,
        "every unit but the early buyer's sold, none twice"
    );
    assert_eq!(sold_out, BUYERS - reserved.len());
    seckill_tests::process::wait_until_async(
        "the sold-out flag on B",
        Duration::from_secs(10),
        || {
            let cb = cb.clone();
            async move {
                let n: i64 = cb.exists(keys::sold_out(hot_a, hot_s)).await.unwrap_or(0);
                n == 1
            }
        },
    )
    .await;

    // The cold sale, on the dead cluster, cannot answer.
    let e = reserve(&mut stock, cold_a, cold_s, "cold-buyer", "r")
        .await
        .expect_err("the default cluster is down");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");

    // orderd drains B into MySQL while A stays down: one order per reservation.
    let pool = db.pool().clone();
    seckill_tests::process::wait_until_async(
        "every hot reservation an order",
        Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move { hot_orders(&pool, hot_a).await == i64::from(HOT_STOCK) }
        },
    )
    .await;
    let rows: Vec<(String,)> = sqlx::query_as("SELECT id FROM orders WHERE activity_id = ?")
        .bind(hot_a)
        .fetch_all(&pool)
        .await
        .expect("orders");
    let ids: HashSet<String> = rows.into_iter().map(|(r,)| r).collect();
    assert_eq!(ids.len(), HOT_STOCK as usize, "one order per reservation");
    assert!(
        reserved.is_subset(&ids),
        "a promised reservation has no order"
    );
    let mut backlog = 0;
    for i in 0..SHARDS {
        let n: u64 = cb.xlen(keys::orders_stream(hot_a, i)).await.expect("XLEN");
        backlog += n;
    }
    assert_eq!(backlog, 0, "B's streams drained (acknowledged and deleted)");

    drop(orderd);
    drop(stockd);
}

async fn hot_orders(pool: &sqlx::MySqlPool, activity: u64) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE activity_id = ?")
        .bind(activity)
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

/// stockd started while a cluster it is configured with is down: the other cluster's
/// sales run at once, and the down one's once it is up (fred gives up on a failed first
/// connection unless told to retry it; before that was set, this stockd never connected).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_down_at_start_is_served_once_it_comes_up() {
    init_tracing();
    let a = RedisCluster::start();
    let mut b = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&a, &db);
    let hot_nodes = b.nodes();
    for port in b.ports() {
        b.kill(port);
    }
    let stockd = spawn_stockd(&deps, |c| {
        c.redis.clusters.insert(
            "hot".into(),
            NamedCluster {
                nodes: hot_nodes.clone(),
            },
        );
    })
    .await;
    let mut admin = stockd.admin_client().await;
    let cold = create_and_publish(
        &mut admin,
        sale_request(&[(5, 100)], SHARDS, Duration::ZERO, HOUR, 1),
    )
    .await;
    let mut stock = stockd.stock_client().await;
    let r = reserve(&mut stock, cold.id, cold.items[0].id, "u1", "r")
        .await
        .expect("the default cluster is up");
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);

    let ports = b.ports();
    tokio::task::block_in_place(|| b.restart_all(&ports));
    let mut req = sale_request(&[(5, 100)], SHARDS, Duration::ZERO, HOUR, 1);
    req.redis_cluster = "hot".into();
    let created = admin
        .create_activity(req)
        .await
        .expect("create")
        .into_inner();
    // Publishing warms B: it succeeds once stockd's client for B has connected.
    seckill_tests::process::wait_until_async(
        "publishing on the cluster that came up",
        Duration::from_secs(20),
        || {
            let mut admin = admin.clone();
            async move {
                admin
                    .publish_activity(pb::PublishActivityRequest {
                        activity_id: created.id,
                        publish_at_ms: 0,
                    })
                    .await
                    .is_ok()
            }
        },
    )
    .await;
    let hot_item = created.items[0].id;
    seckill_tests::process::wait_until_async(
        "a reservation on the cluster that came up",
        Duration::from_secs(20),
        || {
            let mut stock = stock.clone();
            async move {
                matches!(
                    reserve(&mut stock, created.id, hot_item, "u1", "r").await,
                    Ok(r) if r.outcome() == ReserveOutcome::Reserved
                )
            }
        },
    )
    .await;
}

/// How many activities stockd lists.
async fn activities(admin: &mut seckill_tests::stockd::AdminClient) -> usize {
    admin
        .list_activities(pb::ListActivitiesRequest::default())
        .await
        .expect("list")
        .into_inner()
        .activities
        .len()
}
