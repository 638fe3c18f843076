#![cfg(all(feature = "orderd", feature = "stockd"))]
//! orderd behind the real stockd: the sale ends with every unit sold exactly once,
//! and a cancelled unit is sold again.

use seckill_tests::Deps;
use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use seckill_proto::pb::{self, ChangeOutcome, ReserveOutcome};
use seckill_tests::orderd::{count_orders, mysql_stock, spawn_orderd, wait_orders};
use seckill_tests::process::wait_until_async;
use seckill_tests::stockd::{
    create_published_activity, reserve, reserve_retrying_busy, spawn_stockd,
};
use seckill_tests::{init_tracing, RedisCluster, TestDb};

#[tokio::test]
async fn with_stockd_in_front_every_unit_becomes_one_order_and_a_cancelled_unit_sells_again() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |_| {}).await;
    let activity = create_published_activity(
        &stockd,
        &[(100, 1999)],
        4,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let (a, s) = (activity.id, activity.items[0].id);
    let stock_client = stockd.stock_client().await;
    let answers: Vec<(String, pb::ReserveResponse)> = futures::stream::iter(0..300)
        .map(|u| {
            let mut c = stock_client.clone();
            async move {
                let user = format!("fan-{u}");
                let r = reserve_retrying_busy(&mut c, a, s, &user, "q")
                    .await
                    .expect("reserve");
                (user, r)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let won: Vec<&(String, pb::ReserveResponse)> = answers
        .iter()
        .filter(|(_, r)| r.outcome() == ReserveOutcome::Reserved)
        .collect();
    assert_eq!(won.len(), 100, "demand exceeds stock: every unit sold");
    wait_orders(&db, 100, Duration::from_secs(60)).await;
    assert_eq!(count_orders(&db, "PENDING").await, 100);
    assert_eq!(mysql_stock(&db, s).await, 0);
    let (users,): (i64,) = sqlx::query_as("SELECT COUNT(DISTINCT user_id) FROM orders")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(users, 100);
    let ids: HashSet<&str> = won.iter().map(|(_, r)| r.reservation_id.as_str()).collect();
    assert_eq!(ids.len(), 100);

    // One winner cancels; the unit returns to Redis and a latecomer gets it.
    let mut orders = orderd.order_client().await;
    let (user, r) = won[0];
    let change = orders
        .cancel(pb::CancelRequest {
            order_id: r.reservation_id.clone(),
            user_id: user.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(change.outcome(), ChangeOutcome::Applied);
    let mut c = stock_client.clone();
    wait_until_async("the unit is back in Redis", Duration::from_secs(30), || {
        let mut c = c.clone();
        async move {
            let r = reserve(&mut c, a, s, "latecomer", "q").await.unwrap();
            r.outcome() == ReserveOutcome::Reserved
        }
    })
    .await;
    let again = reserve(&mut c, a, s, "latecomer-2", "q").await.unwrap();
    assert_eq!(again.outcome(), ReserveOutcome::SoldOut);
    wait_orders(&db, 101, Duration::from_secs(30)).await;
    assert_eq!(count_orders(&db, "PENDING").await, 100);
    assert_eq!(count_orders(&db, "CANCELLED").await, 1);
    assert_eq!(mysql_stock(&db, s).await, 0);
}

/// Redis loses everything mid-sale (a restart without data): its streams and orderd's
/// consumer group go too. stockd rebuilds from MySQL, and the reservations made after
/// it still become orders, without an orderd restart.
#[tokio::test]
async fn reservations_after_redis_lost_its_data_still_become_orders() {
    use seckill_tests::stockd::stock_status;
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let _orderd = spawn_orderd(&Deps::new(&cluster, &db), |_| {}).await;
    let activity = create_published_activity(
        &stockd,
        &[(100, 500)],
        4,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let (a, s) = (activity.id, activity.items[0].id);
    let mut c = stockd.stock_client().await;
    for u in 0..10 {
        let r = reserve(&mut c, a, s, &format!("before-{u}"), "q")
            .await
            .unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    }
    wait_orders(&db, 10, Duration::from_secs(60)).await;

    cluster.flush_all();
    wait_until_async("the rebuild from MySQL", Duration::from_secs(60), || {
        let mut c = c.clone();
        async move {
            matches!(stock_status(&mut c, a, s).await, Some(st) if st.available && st.remaining == 90)
        }
    })
    .await;
    let mut won = 0;
    for u in 0..10 {
        let user = format!("after-{u}");
        // UNAVAILABLE while a shard is still being rebuilt: retried like a client would.
        for _ in 0..50 {
            match reserve(&mut c, a, s, &user, "q").await {
                Ok(r) => {
                    assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{user}");
                    won += 1;
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    assert_eq!(won, 10);
    wait_orders(&db, 20, Duration::from_secs(60)).await;
    assert_eq!(count_orders(&db, "PENDING").await, 20);
    assert_eq!(mysql_stock(&db, s).await, 80);
}
