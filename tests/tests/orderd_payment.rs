#![cfg(feature = "orderd")]
//! Orders after the stream: lookups (QUEUED, then PENDING_PAYMENT), pay, cancel, the
//! signed provider callback, the payment timeout and its race with payment.
//!
//! (Over 400 lines: an integration suite: each test sets up real processes and states its
//! invariants inline, so the cases read top to bottom.)

use seckill_tests::Deps;
use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use futures::StreamExt;
use seckill_lua::keys;
use seckill_proto::pb::{self, ChangeOutcome, OrderState};
use seckill_tests::orderd::{
    count_orders, mysql_stock, redis_stock, reserve_direct, seed_activity, spawn_orderd,
    wait_orders, OrderClient, CALLBACK_SECRET,
};
use seckill_tests::process::wait_until_async;
use seckill_tests::{init_tracing, RedisCluster, TestDb};

fn now_ms() -> i64 {
    seckill_tests::orderd::chrono_now_ms()
}

async fn get(client: &mut OrderClient, id: &str, user: &str) -> Result<pb::Order, tonic::Status> {
    seckill_tests::orderd::get_order(client, id, user).await
}

fn callback(id: &str, amount: i64, reference: &str, ts: i64) -> pb::PaymentCallbackRequest {
    pb::PaymentCallbackRequest {
        order_id: id.into(),
        amount_cents: amount,
        provider_ref: reference.into(),
        timestamp_ms: ts,
        signature: orderd::payment::sign(CALLBACK_SECRET.as_bytes(), id, amount, reference, ts),
    }
}

async fn outbox_drained(db: &TestDb) {
    wait_until_async("outbox relayed", Duration::from_secs(30), || async {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM stock_return_outbox WHERE done_at IS NULL")
                .fetch_one(db.pool())
                .await
                .unwrap();
        n == 0
    })
    .await;
}

#[tokio::test]
async fn an_order_is_queued_then_pending_then_paid_and_watch_sees_each_state() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 4, &[(10, 1234)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    // Not yet published in MySQL: orderd does not consume its streams.
    sqlx::query("UPDATE activities SET status = 'SCHEDULED' WHERE id = ?")
        .bind(a)
        .execute(db.pool())
        .await
        .unwrap();
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |_| {}).await;
    let mut client = orderd.order_client().await;
    let r = reserve_direct(&redis, a, s, 4, "alice", "req-1").await;
    assert_eq!(r.outcome, "RESERVED");
    let o = get(&mut client, &r.rid, "alice").await.unwrap();
    assert_eq!(o.state(), OrderState::Queued);
    assert_eq!(o.user_id, "alice");
    // Someone else's guess at the id does not find it; an admin without a user neither.
    assert_eq!(
        get(&mut client, &r.rid, "mallory")
            .await
            .unwrap_err()
            .code(),
        tonic::Code::NotFound
    );
    assert_eq!(
        get(&mut client, &r.rid, "").await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    // Paying a queued order is refused without a change.
    let err = orderd.pay(&r.rid, "alice").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);

    let mut watch = client
        .watch_order(pb::GetOrderRequest {
            order_id: r.rid.clone(),
            user_id: "alice".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.state(), OrderState::Queued);
    sqlx::query("UPDATE activities SET status = 'PUBLISHED' WHERE id = ?")
        .bind(a)
        .execute(db.pool())
        .await
        .unwrap();
    let pending = watch.next().await.unwrap().unwrap();
    assert_eq!(pending.state(), OrderState::PendingPayment);
    assert_eq!(pending.amount_cents, 1234);
    assert!(pending.pay_deadline_ms > now_ms());
    let paid = orderd.pay(&r.rid, "alice").await.unwrap();
    assert_eq!(paid.outcome(), ChangeOutcome::Applied);
    assert_eq!(paid.order.as_ref().unwrap().state(), OrderState::Paid);
    let last = watch.next().await.unwrap().unwrap();
    assert_eq!(last.state(), OrderState::Paid);
    assert!(
        watch.next().await.is_none(),
        "the stream ends after a final state"
    );
    // Paying again is a harmless retry; cancelling a paid order is a conflict.
    let again = orderd.pay(&r.rid, "alice").await.unwrap();
    assert_eq!(again.outcome(), ChangeOutcome::Already);
    let cancel = client
        .cancel(pb::CancelRequest {
            order_id: r.rid.clone(),
            user_id: "alice".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancel.outcome(), ChangeOutcome::Conflict);
    assert_eq!(cancel.order.unwrap().state(), OrderState::Paid);
    let list = client
        .list_orders(pb::ListOrdersRequest {
            user_id: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.orders.len(), 1);
    assert_eq!(list.orders[0].id, r.rid);
}

#[tokio::test]
async fn a_cancel_by_its_owner_returns_the_unit_to_mysql_and_redis_once_and_allows_a_rebuy() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 1, &[(1, 100)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |_| {}).await;
    let mut client = orderd.order_client().await;
    let r = reserve_direct(&redis, a, s, 1, "bob", "req").await;
    assert_eq!(r.outcome, "RESERVED");
    assert_eq!(
        reserve_direct(&redis, a, s, 1, "carol", "req")
            .await
            .outcome,
        "SOLD_OUT"
    );
    let _: () = redis
        .set(keys::sold_out(a, s), "1", None, None, false)
        .await
        .unwrap();
    wait_orders(&db, 1, Duration::from_secs(30)).await;
    assert_eq!(mysql_stock(&db, s).await, 0);

    let err = client
        .cancel(pb::CancelRequest {
            order_id: r.rid.clone(),
            user_id: "carol".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    let err = client
        .cancel(pb::CancelRequest {
            order_id: r.rid.clone(),
            user_id: "".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let done = client
        .cancel(pb::CancelRequest {
            order_id: r.rid.clone(),
            user_id: "bob".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.outcome(), ChangeOutcome::Applied);
    assert_eq!(done.order.unwrap().state(), OrderState::Cancelled);
    let again = client
        .cancel(pb::CancelRequest {
            order_id: r.rid.clone(),
            user_id: "bob".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.outcome(), ChangeOutcome::Already);
    assert_eq!(mysql_stock(&db, s).await, 1);
    outbox_drained(&db).await;
    assert_eq!(redis_stock(&redis, a, s, 1).await, 1);
    let flag: Option<String> = redis.get(keys::sold_out(a, s)).await.unwrap();
    assert_eq!(flag, None, "the sold-out flag is cleared");
    // The unit is back: carol buys it, and bob may buy again after his cancel.
    let c = reserve_direct(&redis, a, s, 1, "carol", "req2").await;
    assert_eq!(c.outcome, "RESERVED");
    wait_orders(&db, 2, Duration::from_secs(30)).await;
    assert_eq!(count_orders(&db, "PENDING").await, 1);
    assert_eq!(mysql_stock(&db, s).await, 0);
}

#[tokio::test]
async fn bad_payment_input_gets_clear_errors_and_changes_nothing() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 2, &[(10, 2500)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.payment.freshness_window_secs = 60
    })
    .await;
    let mut client = orderd.order_client().await;
    let r1 = reserve_direct(&redis, a, s, 2, "dora", "q").await.rid;
    let r2 = reserve_direct(&redis, a, s, 2, "erin", "q").await.rid;
    wait_orders(&db, 2, Duration::from_secs(30)).await;
    let now = now_ms();

    let code = |r: Result<tonic::Response<pb::OrderChange>, tonic::Status>| r.unwrap_err();
    // Unknown order (well-formed id), malformed id.
    let e = code(
        client
            .payment_callback(callback(&format!("{a}-{s}-0-zz-999"), 2500, "p0", now))
            .await,
    );
    assert_eq!(e.code(), tonic::Code::NotFound);
    let e = code(
        client
            .payment_callback(callback("nope", 2500, "p0", now))
            .await,
    );
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Another user's order.
    let e = client
        .pay(pb::PayRequest {
            order_id: r1.clone(),
            user_id: "erin".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    // Wrong amount (correctly signed).
    let e = code(
        client
            .payment_callback(callback(&r1, 2499, "p1", now))
            .await,
    );
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("amount_cents"), "{}", e.message());
    // Bad signature.
    let mut forged = callback(&r1, 2500, "p1", now);
    forged.signature = orderd::payment::sign(b"not-the-secret-at-all", &r1, 2500, "p1", now);
    let e = code(client.payment_callback(forged).await);
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut garbage = callback(&r1, 2500, "p1", now);
    garbage.signature = "xyz".into();
    assert_eq!(
        code(client.payment_callback(garbage).await).code(),
        tonic::Code::Unauthenticated
    );
    // Stale, and from the future.
    for ts in [now - 120_000, now + 120_000] {
        let e = code(client.payment_callback(callback(&r1, 2500, "p1", ts)).await);
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with("timestamp_ms"), "{}", e.message());
    }
    // Bad fields.
    let e = code(client.payment_callback(callback(&r1, 0, "p1", now)).await);
    assert!(e.message().starts_with("amount_cents"));
    let e = code(client.payment_callback(callback(&r1, 2500, "", now)).await);
    assert!(e.message().starts_with("provider_ref"));
    // Nothing changed so far.
    assert_eq!(count_orders(&db, "PENDING").await, 2);
    let (seen,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM payment_callbacks")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(seen, 0);

    // The good callback pays; the same callback again is a harmless retry.
    let ok = client
        .payment_callback(callback(&r1, 2500, "p1", now))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.outcome(), ChangeOutcome::Applied);
    let order = ok.order.unwrap();
    assert_eq!(order.state(), OrderState::Paid);
    assert_eq!(order.provider_ref, "p1");
    let again = client
        .payment_callback(callback(&r1, 2500, "p1", now))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.outcome(), ChangeOutcome::Already);
    // The same provider reference replayed for another order is refused.
    let e = code(
        client
            .payment_callback(callback(&r2, 2500, "p1", now))
            .await,
    );
    assert_eq!(e.code(), tonic::Code::AlreadyExists);
    let o2 = get(&mut client, &r2, "erin").await.unwrap();
    assert_eq!(o2.state(), OrderState::PendingPayment);
    assert_eq!(count_orders(&db, "PAID").await, 1);
    // Listing: bad page size and token.
    let e = client
        .list_orders(pb::ListOrdersRequest {
            user_id: "dora".into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = client
        .list_orders(pb::ListOrdersRequest {
            user_id: "dora".into(),
            page_token: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn when_pay_and_timeout_race_each_order_ends_paid_or_cancelled_and_stock_returns_exactly_for_the_cancelled(
) {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 4, &[(400, 700)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.payment.timeout_secs = 3;
        c.payment.sweep_interval_ms = 20;
    })
    .await;
    let users: Vec<String> = (0..200).map(|u| format!("racer-{u}")).collect();
    let mut rids = HashMap::new();
    for u in &users {
        let r = reserve_direct(&redis, a, s, 4, u, "q").await;
        assert_eq!(r.outcome, "RESERVED");
        rids.insert(u.clone(), r.rid);
    }
    wait_orders(&db, 200, Duration::from_secs(30)).await;
    let before_redis = redis_stock(&redis, a, s, 4).await;
    assert_eq!(before_redis, 200);
    let (deadline,): (i64,) = sqlx::query_as(
        "SELECT CAST(UNIX_TIMESTAMP(MIN(pay_deadline)) * 1000 AS SIGNED) FROM orders",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    // Start paying just before the first deadline, spread over about half a second.
    let wait = deadline - now_ms() - 250;
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
    let client = orderd.order_client().await;
    let outcomes: Vec<(String, ChangeOutcome, OrderState)> = futures::stream::iter(users.clone())
        .map(|u| {
            let mut client = client.clone();
            let rid = rids[&u].clone();
            async move {
                let jitter = rand::random::<u64>() % 500;
                tokio::time::sleep(Duration::from_millis(jitter)).await;
                let r = client
                    .pay(pb::PayRequest {
                        order_id: rid.clone(),
                        user_id: u.clone(),
                    })
                    .await
                    .unwrap()
                    .into_inner();
                let state = r.order.as_ref().unwrap().state();
                (u, r.outcome(), state)
            }
        })
        .buffer_unordered(200)
        .collect()
        .await;
    wait_until_async("every order final", Duration::from_secs(30), || async {
        count_orders(&db, "PENDING").await == 0
    })
    .await;
    let paid = count_orders(&db, "PAID").await;
    let cancelled = count_orders(&db, "CANCELLED").await;
    assert_eq!(paid + cancelled, 200);
    eprintln!("race: {paid} paid, {cancelled} cancelled");
    for (u, outcome, state) in &outcomes {
        let (status,): (String,) = sqlx::query_as("SELECT status FROM orders WHERE id = ?")
            .bind(&rids[u])
            .fetch_one(db.pool())
            .await
            .unwrap();
        match outcome {
            ChangeOutcome::Applied => {
                assert_eq!(*state, OrderState::Paid);
                assert_eq!(status, "PAID");
            }
            ChangeOutcome::Conflict => {
                assert_eq!(*state, OrderState::Cancelled);
                assert_eq!(status, "CANCELLED");
            }
            other => panic!("{u}: unexpected {other:?}"),
        }
    }
    // Stock came back exactly for the cancelled ones: in MySQL at once, in Redis
    // through the outbox.
    assert_eq!(mysql_stock(&db, s).await, 200 + cancelled);
    let (returned,): (i64,) = sqlx::query_as(
        "SELECT CAST(COALESCE(SUM(delta), 0) AS SIGNED) FROM stock_log WHERE reason = 'TIMEOUT'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(returned, cancelled);
    outbox_drained(&db).await;
    assert_eq!(redis_stock(&redis, a, s, 4).await, 200 + cancelled);
    for (u, _, state) in &outcomes {
        let rid: seckill_lua::ReservationId = rids[u].parse().unwrap();
        let held: Option<String> = redis.hget(keys::buyers(a, rid.shard, s), u).await.unwrap();
        match state {
            OrderState::Paid => assert!(held.is_some(), "{u} paid but lost the buyer record"),
            _ => assert!(held.is_none(), "{u} cancelled but still recorded"),
        }
    }
    assert_eq!(orderd.metrics.timeouts.get() as i64, cancelled);
}

/// Two transactions locking two rows in opposite order: MariaDB picks one as the
/// deadlock's victim, and orderd recognises that error as one to run again (its pay,
/// cancel and callback transitions do, so a pay that crosses the timeout sweep is not
/// answered UNAVAILABLE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_victim_is_recognised_as_safe_to_run_again() {
    let db = seckill_tests::mysql::TestDb::create().await;
    let pool = db.pool();
    sqlx::query("CREATE TABLE crossing (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO crossing VALUES (1, 0), (2, 0)")
        .execute(pool)
        .await
        .unwrap();
    let (mut a, mut b) = (pool.begin().await.unwrap(), pool.begin().await.unwrap());
    let lock = "SELECT v FROM crossing WHERE id = ? FOR UPDATE";
    sqlx::query(lock).bind(1).execute(&mut *a).await.unwrap();
    sqlx::query(lock).bind(2).execute(&mut *b).await.unwrap();
    let (ra, rb) = tokio::join!(sqlx::query(lock).bind(2).execute(&mut *a), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        sqlx::query(lock).bind(1).execute(&mut *b).await
    });
    let victim = match (ra, rb) {
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => orderd::error::Error::Db(e),
        other => panic!("want exactly one deadlock victim, got {other:?}"),
    };
    assert!(victim.is_deadlock(), "{victim:?}");
    assert!(!orderd::error::Error::NotFound("order").is_deadlock());
}

/// A cancel whose shard is closed for a rebuild (no fence): the relay leaves the return
/// pending, because the rebuild's reopen would write its snapshot (the buyer record,
/// the count without the unit) over a release made now, and releases it once the shard
/// is open again. A closed shard of a sale that is over is let go: nothing rebuilds it
/// and nobody can buy the unit.
#[tokio::test]
async fn a_return_waits_while_its_shard_is_closed_for_a_rebuild() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 1, &[(5, 100)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |_| {}).await;
    let mut client = orderd.order_client().await;
    let r1 = reserve_direct(&redis, a, s, 1, "bob", "req").await;
    let r2 = reserve_direct(&redis, a, s, 1, "dan", "req").await;
    assert_eq!(
        (r1.outcome.as_str(), r2.outcome.as_str()),
        ("RESERVED", "RESERVED")
    );
    wait_orders(&db, 2, Duration::from_secs(30)).await;
    assert_eq!(redis_stock(&redis, a, s, 1).await, 3);

    // The shard closes (REBUILD close deletes the fence), then bob cancels.
    let epoch: String = redis.get(keys::fence(a, 0)).await.unwrap();
    let _: i64 = redis.del(keys::fence(a, 0)).await.unwrap();
    let cancel = |order: String, user: &str| pb::CancelRequest {
        order_id: order,
        user_id: user.into(),
    };
    let done = client
        .cancel(cancel(r1.rid.clone(), "bob"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.outcome(), ChangeOutcome::Applied);
    wait_until_async(
        "the relay tried the closed shard",
        Duration::from_secs(30),
        || async {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM stock_return_outbox WHERE done_at IS NULL AND attempts >= 2",
            )
            .fetch_one(db.pool())
            .await
            .unwrap();
            n == 1
        },
    )
    .await;
    assert_eq!(
        redis_stock(&redis, a, s, 1).await,
        3,
        "nothing released meanwhile"
    );
    let held: Option<String> = redis.hget(keys::buyers(a, 0, s), "bob").await.unwrap();
    assert!(held.is_some_and(|h| h.starts_with(&r1.rid)));

    // Open again: the return goes through, once.
    let _: () = redis
        .set(keys::fence(a, 0), &epoch, None, None, false)
        .await
        .unwrap();
    outbox_drained(&db).await;
    assert_eq!(redis_stock(&redis, a, s, 1).await, 4);
    let held: Option<String> = redis.hget(keys::buyers(a, 0, s), "bob").await.unwrap();
    assert_eq!(held, None);

    // The sale over and the shard closed (Redis lost it; nothing rebuilds an ended
    // activity): dan's cancel is let go instead of waiting for ever.
    sqlx::query("UPDATE activities SET end_at = FROM_UNIXTIME(? / 1000) WHERE id = ?")
        .bind(seckill_tests::orderd::chrono_now_ms() - 1000)
        .bind(a)
        .execute(db.pool())
        .await
        .unwrap();
    let _: i64 = redis.del(keys::fence(a, 0)).await.unwrap();
    let done = client
        .cancel(cancel(r2.rid.clone(), "dan"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.outcome(), ChangeOutcome::Applied);
    outbox_drained(&db).await;
    assert_eq!(
        orderd
            .metrics
            .stock_returns
            .with_label_values(&["closed_sale_over"])
            .get(),
        1
    );
    assert_eq!(mysql_stock(&db, s).await, 5, "both units are back in MySQL");
}
