#![cfg(all(feature = "orderd", feature = "stockd"))]
//! Multi-unit purchase (issue 15 item 3), end to end over real stockd, orderd, Redis
//! Cluster and MariaDB: a reservation holds k units (1..=per_user_limit), one per user
//! per item; units, not orders, are what is counted everywhere.

use std::collections::HashMap;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use futures::StreamExt;
use seckill_proto::pb::{self, ChangeOutcome, ReserveOutcome};
use seckill_tests::orderd::{mysql_stock, spawn_orderd};
use seckill_tests::process::wait_until_async;
use seckill_tests::stockd::{
    create_published_activity_limited, shard_stock, spawn_stockd, StockClient,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};
use tonic::Code;

const PRICE: i64 = 1999;

async fn reserve_k(
    c: &mut StockClient,
    (a, s): (u64, u64),
    user: &str,
    req: &str,
    quantity: u32,
) -> Result<pb::ReserveResponse, tonic::Status> {
    c.reserve(pb::ReserveRequest {
        activity_id: a,
        item_id: s,
        user_id: user.into(),
        request_id: req.into(),
        quantity,
    })
    .await
    .map(|r| r.into_inner())
}

/// ABORTED and UNAVAILABLE answers [`reserve_k_retrying`] retried, reported with the
/// crowd's outcome.
static RETRIED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// [`reserve_k`] as a client follows the contract: ABORTED and UNAVAILABLE mean "retry with
/// the same request id" (stockd answers ABORTED when concurrent multi-unit buyers kept
/// taking the units its rounds gathered, more often on a loaded machine, where a round
/// takes longer; UNAVAILABLE when a round failed), so it is sent again, a few times.
async fn reserve_k_retrying(
    c: &mut StockClient,
    at: (u64, u64),
    user: &str,
    req: &str,
    quantity: u32,
) -> Result<pb::ReserveResponse, tonic::Status> {
    let mut tries = 0;
    loop {
        match reserve_k(c, at, user, req, quantity).await {
            Err(e)
                if matches!(e.code(), tonic::Code::Aborted | tonic::Code::Unavailable)
                    && tries < 5 =>
            {
                tries += 1;
                RETRIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(20 * tries)).await;
            }
            r => return r,
        }
    }
}

/// stockd's `GetStock` for item `s` of `a`.
async fn stock_of(
    c: &mut StockClient,
    (a, s): (u64, u64),
) -> Result<pb::GetStockResponse, tonic::Status> {
    c.get_stock(pb::GetStockRequest {
        activity_id: a,
        item_id: s,
    })
    .await
    .map(|r| r.into_inner())
}

/// (orders, distinct users, units of active orders, orders whose amount is not
/// quantity x price) of item `s`.
async fn order_facts(db: &TestDb, s: u64) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT COUNT(*), COUNT(DISTINCT user_id), \
         CAST(COALESCE(SUM(IF(status IN ('PENDING', 'PAID'), quantity, 0)), 0) AS SIGNED), \
         CAST(COALESCE(SUM(amount_cents <> quantity * ?), 0) AS SIGNED) \
         FROM orders WHERE item_id = ?",
    )
    .bind(PRICE)
    .bind(s)
    .fetch_one(db.pool())
    .await
    .unwrap()
}

/// The order `id`'s (status, quantity), if written.
async fn order_row(db: &TestDb, id: &str) -> Option<(String, u32)> {
    sqlx::query_as("SELECT status, quantity FROM orders WHERE id = ?")
        .bind(id)
        .fetch_optional(db.pool())
        .await
        .unwrap()
}

async fn redis_units(redis: &fred::clients::Client, a: u64, s: u64, shards: u32) -> i64 {
    shard_stock(redis, a, s, shards).await.iter().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_k_unit_buyers_with_duplicate_clicks_never_oversell_and_the_sale_drains() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |_| {}).await;
    const STOCK: u32 = 200;
    const LIMIT: u32 = 5;
    const SHARDS: u32 = 8;
    let mut admin = stockd.admin_client().await;
    let act = create_published_activity_limited(
        &mut admin,
        &[(STOCK, PRICE)],
        SHARDS,
        Duration::ZERO,
        Duration::from_secs(3600),
        LIMIT,
    )
    .await;
    let (a, s) = (act.id, act.items[0].id);
    let client = stockd.stock_client().await;

    // 120 users, each clicking three times at once: request r1 twice (a resend) and
    // r2 once (a second attempt), each with a random k <= the limit. Demand (~360 k
    // up to 5) is well above the 200 units.
    let mut clicks = Vec::new();
    for u in 0..120 {
        let (k1, k2) = (
            rand::random::<u32>() % LIMIT + 1,
            rand::random::<u32>() % LIMIT + 1,
        );
        let user = format!("buyer-{u}");
        clicks.push((user.clone(), "r1".to_string(), k1));
        clicks.push((user.clone(), "r1".to_string(), k1));
        clicks.push((user, "r2".to_string(), k2));
    }
    let answers: Vec<(
        String,
        String,
        u32,
        Result<pb::ReserveResponse, tonic::Status>,
    )> = futures::stream::iter(clicks)
        .map(|(user, req, k)| {
            let mut c = client.clone();
            async move {
                let r = reserve_k_retrying(&mut c, (a, s), &user, &req, k).await;
                (user, req, k, r)
            }
        })
        .buffer_unordered(96)
        .collect()
        .await;

    // Per user: at most one reservation; every answer naming one names the same; a
    // reservation holds exactly the k of the request id that made it.
    let mut held: HashMap<String, (String, u32)> = HashMap::new();
    let mut asked: HashMap<(String, String), u32> = HashMap::new();
    for (user, req, k, r) in &answers {
        asked.insert((user.clone(), req.clone()), *k);
        let r = r.as_ref().unwrap_or_else(|e| panic!("{user} {req}: {e}"));
        match r.outcome() {
            ReserveOutcome::Reserved | ReserveOutcome::Duplicate => {
                let prev = held
                    .entry(user.clone())
                    .or_insert_with(|| (r.reservation_id.clone(), r.quantity));
                assert_eq!(
                    *prev,
                    (r.reservation_id.clone(), r.quantity),
                    "{user}: two reservations"
                );
            }
            ReserveOutcome::NotEnough => {
                assert!(
                    (1..i64::from(*k)).contains(&r.item_remaining),
                    "{user} asked {k}, told {} remain",
                    r.item_remaining
                );
            }
            ReserveOutcome::SoldOut => {}
            other => panic!("{user}: {other:?}"),
        }
    }
    for (user, req, _, r) in &answers {
        let r = r.as_ref().unwrap();
        if r.outcome() == ReserveOutcome::Reserved {
            // RESERVED (first or resend) names the units of its own request id.
            assert_eq!(
                r.quantity,
                asked[&(user.clone(), req.clone())],
                "{user} {req}"
            );
        }
    }
    let count = |o: ReserveOutcome| {
        answers
            .iter()
            .filter(|(_, _, _, r)| r.as_ref().is_ok_and(|r| r.outcome() == o))
            .count()
    };
    let (dups, short) = (
        count(ReserveOutcome::Duplicate),
        count(ReserveOutcome::NotEnough),
    );
    eprintln!(
        "multi-unit crowd: {} users hold {} units; {dups} DUPLICATE, {short} NOT_ENOUGH, {} SOLD_OUT; \
         {} ABORTED or UNAVAILABLE retried",
        held.len(),
        held.values().map(|(_, k)| *k).sum::<u32>(),
        count(ReserveOutcome::SoldOut),
        RETRIED.load(std::sync::atomic::Ordering::Relaxed)
    );
    // Every user who holds a reservation clicked under two request ids: the other one
    // was a DUPLICATE (or the same reservation's resend).
    assert!(dups > 0, "the duplicate clicks were exercised");
    let sold: u32 = held.values().map(|(_, k)| *k).sum();
    assert!(sold <= STOCK, "oversold: {sold} units of {STOCK}");
    assert!(held.values().all(|(_, k)| (1..=LIMIT).contains(k)));

    // A wave of single-unit latecomers: demand > stock ends with every unit sold.
    let late: Vec<pb::ReserveResponse> = futures::stream::iter(0..(STOCK + 50))
        .map(|u| {
            let mut c = client.clone();
            async move {
                reserve_k(&mut c, (a, s), &format!("late-{u}"), "r", 1)
                    .await
                    .expect("reserve")
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let late_won: Vec<&pb::ReserveResponse> = late
        .iter()
        .filter(|r| r.outcome() == ReserveOutcome::Reserved)
        .collect();
    let total = sold + late_won.len() as u32;
    assert_eq!(total, STOCK, "every unit sold exactly once");
    let redis = cluster.client().await;
    assert_eq!(redis_units(&redis, a, s, SHARDS).await, 0);

    // Every RESERVED became an order with its k; MySQL took exactly the units.
    let reservations = held.len() + late_won.len();
    wait_until_async("every reservation ordered", Duration::from_secs(60), || {
        let db = &db;
        async move { order_facts(db, s).await.0 == reservations as i64 }
    })
    .await;
    let (orders, users, active_units, bad_amounts) = order_facts(&db, s).await;
    assert_eq!(orders, users, "one order per user");
    assert_eq!(active_units, i64::from(STOCK));
    assert_eq!(bad_amounts, 0, "amount = quantity x sale price");
    assert_eq!(mysql_stock(&db, s).await + active_units, i64::from(STOCK));
    for (user, (rid, k)) in &held {
        assert_eq!(
            order_row(&db, rid).await,
            Some(("PENDING".to_string(), *k)),
            "{user}"
        );
    }

    // Reconciliation counts units.
    let rec = admin
        .reconcile(pb::ReconcileRequest {
            activity_id: a,
            item_id: 0,
            repair: false,
        })
        .await
        .unwrap()
        .into_inner();
    let it = &rec.items[0];
    assert!(it.consistent, "{it:?}");
    assert_eq!(
        (it.active_orders, it.in_flight, it.redis_remaining),
        (i64::from(STOCK), 0, 0)
    );
    drop(orderd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_home_shard_gathers_k_units_and_cancel_and_timeout_return_exactly_k() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |c| {
        c.payment.timeout_secs = 2;
    })
    .await;
    const SHARDS: u32 = 8;
    let mut admin = stockd.admin_client().await;
    // One unit per shard: any k > 1 needs units from other shards.
    let act = create_published_activity_limited(
        &mut admin,
        &[(8, PRICE)],
        SHARDS,
        Duration::ZERO,
        Duration::from_secs(3600),
        5,
    )
    .await;
    let (a, s) = (act.id, act.items[0].id);
    let mut c = stockd.stock_client().await;
    let redis = cluster.client().await;

    // Bad quantities: INVALID_ARGUMENT naming the field, nothing taken.
    for bad in [6, 101, u32::MAX] {
        let e = reserve_k(&mut c, (a, s), "mallory", "r", bad)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e:?}");
        assert!(e.message().contains("quantity"), "{e:?}");
    }
    assert_eq!(redis_units(&redis, a, s, SHARDS).await, 8);

    // k = 4 from a home shard holding 1: stockd moves 3 there and reserves.
    let r = reserve_k(&mut c, (a, s), "alice", "r1", 4).await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{r:?}");
    assert_eq!(r.quantity, 4);
    let alice = r.reservation_id.clone();
    assert_eq!(redis_units(&redis, a, s, SHARDS).await, 4);
    // The resend answers the same reservation; another request id is DUPLICATE.
    let again = reserve_k(&mut c, (a, s), "alice", "r1", 4).await.unwrap();
    assert_eq!(
        (
            again.outcome(),
            again.reservation_id.as_str(),
            again.quantity
        ),
        (ReserveOutcome::Reserved, alice.as_str(), 4)
    );
    let dup = reserve_k(&mut c, (a, s), "alice", "r2", 1).await.unwrap();
    assert_eq!(
        (dup.outcome(), dup.reservation_id.as_str(), dup.quantity),
        (ReserveOutcome::Duplicate, alice.as_str(), 4)
    );
    // More than the item has left: NOT_ENOUGH naming how many, nothing taken.
    let short = reserve_k(&mut c, (a, s), "bob", "r1", 5).await.unwrap();
    assert_eq!(
        (short.outcome(), short.item_remaining),
        (ReserveOutcome::NotEnough, 4)
    );
    assert_eq!(redis_units(&redis, a, s, SHARDS).await, 4);
    let st = stock_of(&mut c, (a, s)).await.unwrap();
    assert_eq!(
        (st.remaining, st.reserved),
        (4, 4),
        "units held, not buyers"
    );

    // Carol takes 3; the order carries k and k x price; MySQL took 4 + 3.
    let r = reserve_k(&mut c, (a, s), "carol", "r1", 3).await.unwrap();
    assert_eq!((r.outcome(), r.quantity), (ReserveOutcome::Reserved, 3));
    let carol = r.reservation_id.clone();
    let mut orders = orderd.order_client().await;
    wait_until_async("both orders in MySQL", Duration::from_secs(30), || {
        let db = &db;
        async move { order_facts(db, s).await.0 == 2 }
    })
    .await;
    assert_eq!(mysql_stock(&db, s).await, 1);
    let o = orders
        .get_order(pb::GetOrderRequest {
            order_id: carol.clone(),
            user_id: "carol".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((o.quantity, o.amount_cents), (3, 3 * PRICE));

    // Carol cancels (or the timeout beats her to it): 3 units go back, no more.
    let change = orders
        .cancel(pb::CancelRequest {
            order_id: carol.clone(),
            user_id: "carol".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        change.outcome(),
        ChangeOutcome::Applied | ChangeOutcome::Conflict
    ));
    assert_eq!(
        order_row(&db, &carol).await,
        Some(("CANCELLED".to_string(), 3))
    );
    // Alice never pays: the timeout cancels her order and returns her 4.
    wait_until_async("alice's order times out", Duration::from_secs(30), || {
        let db = &db;
        let alice = alice.clone();
        async move { order_row(db, &alice).await.map(|o| o.0).as_deref() == Some("CANCELLED") }
    })
    .await;
    assert_eq!(mysql_stock(&db, s).await, 8, "MySQL got back exactly 3 + 4");
    wait_until_async("Redis got every unit back", Duration::from_secs(30), || {
        let redis = &redis;
        async move { redis_units(redis, a, s, SHARDS).await == 8 }
    })
    .await;
    // The outbox is done; nothing returns twice.
    let (pending,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM stock_return_outbox WHERE done_at IS NULL")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(pending, 0);
    assert_eq!(redis_units(&redis, a, s, SHARDS).await, 8);
    let (logged,): (i64,) = sqlx::query_as(
        "SELECT CAST(COALESCE(SUM(delta), 0) AS SIGNED) FROM stock_log WHERE item_id = ?",
    )
    .bind(s)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(logged, 0, "stock log: -4 -3 +3 +4");

    // Bob can now have all 5 he asked for (gathered from several shards).
    let r = reserve_k(&mut c, (a, s), "bob", "r2", 5).await.unwrap();
    assert_eq!((r.outcome(), r.quantity), (ReserveOutcome::Reserved, 5));
    assert_eq!(redis_units(&redis, a, s, SHARDS).await, 3);
}

#[tokio::test]
async fn per_user_limit_is_1_to_100() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let mut admin = stockd.admin_client().await;
    let now = seckill_lua::clock::now_ms();
    let req = |limit| pb::CreateActivityRequest {
        title: "t".into(),
        start_at_ms: now,
        end_at_ms: now + 60_000,
        shard_count: 2,
        per_user_limit: limit,
        challenge_bits: 0,
        redis_cluster: String::new(),
        items: vec![pb::ItemSpec {
            title: "i".into(),
            price_cents: 2,
            sale_price_cents: 1,
            stock: 5,
        }],
    };
    for bad in [101, u32::MAX] {
        let e = admin.create_activity(req(bad)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("per_user_limit"), "{e:?}");
    }
    for good in [0, 1, 100] {
        let a = admin.create_activity(req(good)).await.unwrap().into_inner();
        assert_eq!(a.per_user_limit, good.max(1));
    }
}

/// One stockd selling one item of `units` over `shards`, 5 units per user at most.
struct LimitedSale {
    cluster: RedisCluster,
    db: TestDb,
    stockd: seckill_tests::stockd::StockdHandle,
    a: u64,
    s: u64,
}

impl LimitedSale {
    async fn start(units: u32, shards: u32) -> Self {
        init_tracing();
        let cluster = RedisCluster::start();
        let db = TestDb::create().await;
        let stockd = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
        let mut admin = stockd.admin_client().await;
        let act = create_published_activity_limited(
            &mut admin,
            &[(units, PRICE)],
            shards,
            Duration::ZERO,
            Duration::from_secs(3600),
            5,
        )
        .await;
        let (a, s) = (act.id, act.items[0].id);
        Self {
            cluster,
            db,
            stockd,
            a,
            s,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_from_mysql_counts_units_of_reservations_in_flight_and_of_orders() {
    const SHARDS: u32 = 4;
    let sale = LimitedSale::start(10, SHARDS).await;
    let (cluster, db, stockd, a, s) = (&sale.cluster, &sale.db, &sale.stockd, sale.a, sale.s);
    let mut admin = stockd.admin_client().await;
    let mut c = stockd.stock_client().await;
    let redis = cluster.client().await;
    let alice = reserve_k(&mut c, (a, s), "alice", "r1", 3).await.unwrap();
    let bob = reserve_k(&mut c, (a, s), "bob", "r1", 2).await.unwrap();
    assert_eq!((alice.quantity, bob.quantity), (3, 2));
    assert_eq!(redis_units(&redis, a, s, SHARDS).await, 5);

    // Redis loses a shard's fence: the next reserve there (zed's home) starts a
    // rebuild from MySQL with both reservations still in flight (no orderd yet): 3 + 2
    // units held, 5 on sale; zed then takes 1.
    let zed = seckill_tests::redis::user_on_shard("zed", 0, SHARDS);
    let _: i64 = redis.del(seckill_lua::keys::fence(a, 0)).await.unwrap();
    wait_until_async("the activity is rebuilt", Duration::from_secs(30), || {
        let (mut c, zed) = (c.clone(), zed.clone());
        async move {
            let bought = reserve_k(&mut c, (a, s), &zed, "r1", 1)
                .await
                .is_ok_and(|r| r.outcome() == ReserveOutcome::Reserved);
            let open = stock_of(&mut c, (a, s)).await.is_ok_and(|r| r.available);
            bought && open
        }
    })
    .await;
    let zed_units = 1;
    let st = stock_of(&mut c, (a, s)).await.unwrap();
    assert_eq!(
        (st.remaining, st.reserved),
        (4, 6),
        "rebuilt: 10 - units in flight (3 + 2), then zed's 1"
    );
    let again = reserve_k(&mut c, (a, s), "alice", "r1", 3).await.unwrap();
    assert_eq!(
        (again.reservation_id, again.quantity),
        (alice.reservation_id.clone(), 3)
    );
    let dup = reserve_k(&mut c, (a, s), "bob", "r9", 1).await.unwrap();
    assert_eq!(
        (dup.outcome(), dup.quantity),
        (ReserveOutcome::Duplicate, 2)
    );

    // orderd writes the orders; a repair rebuilds from the active orders' units.
    let _orderd = spawn_orderd(&Deps::new(cluster, db), |_| {}).await;
    wait_until_async("orders written", Duration::from_secs(30), || {
        let db = &db;
        async move { order_facts(db, s).await.0 == 2 + zed_units }
    })
    .await;
    wait_until_async("streams drained", Duration::from_secs(30), || {
        let mut admin = admin.clone();
        async move {
            let rec = admin
                .reconcile(pb::ReconcileRequest {
                    activity_id: a,
                    item_id: 0,
                    repair: true,
                })
                .await
                .unwrap()
                .into_inner();
            rec.items[0].repaired
        }
    })
    .await;
    let rec = admin
        .reconcile(pb::ReconcileRequest {
            activity_id: a,
            item_id: 0,
            repair: false,
        })
        .await
        .unwrap()
        .into_inner();
    let it = &rec.items[0];
    assert!(it.consistent, "{it:?}");
    assert_eq!(
        (it.active_orders, it.redis_remaining, it.mysql_stock),
        (5 + zed_units, 5 - zed_units, 5 - zed_units)
    );
    // After the rebuild the buyer records still hold k: a release returns 3.
    let released = c
        .release(pb::ReleaseRequest {
            reservation_id: alice.reservation_id.clone(),
            user_id: "alice".into(),
            reason: "test".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.outcome(), pb::ReleaseOutcome::Released);
    assert_eq!(redis_units(&redis, a, s, SHARDS).await, 8 - zed_units);
}

/// Units in transit (another stockd's take, not given yet: on no shard) count toward what
/// a k-unit buyer is told remains: with every shard empty and 2 units in transit, a buyer
/// of 3 is told NOT_ENOUGH with 2 remaining, neither SOLD_OUT nor to retry; once the give
/// has landed and the move settled, a buyer of 2 gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_in_transit_count_toward_what_a_multi_unit_buyer_is_told_remains() {
    use seckill_tests::stockd::{set_shard_stock, settle_by_hand, take_in_transit};
    let sale = LimitedSale::start(8, 4).await;
    let (a, s) = (sale.a, sale.s);
    let mut c = sale.stockd.stock_client().await;
    let redis = sale.cluster.client().await;
    set_shard_stock(&redis, a, s, &[0, 0, 2, 0]).await;
    assert_eq!(
        take_in_transit(&redis, (a, 2, s), 2, "peer", 60_000).await,
        2
    );
    let r = reserve_k(&mut c, (a, s), "bob", "r1", 3).await.unwrap();
    assert_eq!(
        (r.outcome(), r.item_remaining),
        (ReserveOutcome::NotEnough, 2),
        "{r:?}"
    );
    assert!(!seckill_tests::stockd::sold_out_flagged(&redis, a, s).await);

    // The give lands on shard 1 and the move settles.
    set_shard_stock(&redis, a, s, &[0, 2, 0, 0]).await;
    settle_by_hand(&redis, (a, 2, s), "peer", 2).await;
    let r = reserve_k(&mut c, (a, s), "bob", "r2", 2).await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{r:?}");
    assert_eq!(r.quantity, 2);
}
