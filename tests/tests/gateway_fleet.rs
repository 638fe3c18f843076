#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]
//! A fleet behind the edge: one gateway configured with two stockd and two orderd
//! (child processes on one Redis Cluster and one database). A crowd reserves through the
//! edge while one stockd and one orderd are killed with SIGKILL mid-way: the calls fail
//! over to the survivors within the deadline, every 202 becomes an order, nothing is
//! oversold, nobody holds two. Then, with the dead endpoints marked down, no call goes to
//! them (the failover counter stands still) and `/readyz` stays ready on the survivors.
//!
//! Needs `cargo build --bins -p stockd -p orderd -p gateway`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use seckill_lua::keys;
use seckill_proto::pb;
use seckill_tests::gateway::{metric_value, set, spawn_gateway, url_list, EdgeDeps, GatewayHandle};
use seckill_tests::orderd::spawn_orderd_process;
use seckill_tests::process::wait_until_async;
use seckill_tests::stockd::{
    create_published_activity_with, spawn_stockd_process, spawn_stockd_process_listening,
    StockdProcess,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

/// Units of the crowd's item; twice as many buyers want one.
const STOCK: u32 = 120;
const BUYERS: usize = 2 * STOCK as usize;
/// Requests in flight at any time.
const CONCURRENCY: usize = 12;

/// One answer of the crowd.
struct Answered {
    user: String,
    status: u16,
    reservation: Option<String>,
    /// Sent after the kill (its endpoint choice saw the dead stockd at most as stale).
    sent_after_kill: bool,
}

/// The value of `name{labels}` in Prometheus text (labels in the encoder's sorted order).
fn healthy_labels(service: &str, addr: &str) -> String {
    format!(r#"endpoint="http://{addr}",service="{service}""#)
}

async fn failovers(gw: &GatewayHandle, service: &str) -> f64 {
    let labels = format!(r#"service="{service}""#);
    metric_value(
        &gw.metrics().await,
        "gateway_upstream_failovers_total",
        &labels,
    )
    .unwrap_or(0.0)
}

/// Waits until the gateway's health gauge of `addr` reads `want`.
async fn wait_gauge(gw: &GatewayHandle, service: &str, addr: &str, want: f64) {
    let labels = healthy_labels(service, addr);
    wait_until_async(
        &format!("gateway_upstream_healthy{{{labels}}} = {want}"),
        Duration::from_secs(20),
        || {
            let labels = labels.clone();
            async move {
                metric_value(&gw.metrics().await, "gateway_upstream_healthy", &labels) == Some(want)
            }
        },
    )
    .await;
}

/// Waits until stockd at `addr` knows item `s` of activity `a` (its catalog is
/// refreshed from MySQL in the background).
async fn wait_known(addr: &str, a: u64, s: u64) {
    let c = seckill_tests::stockd::stock_client(addr).await;
    wait_until_async(
        "stockd to know the activity",
        Duration::from_secs(20),
        || {
            let mut c = c.clone();
            async move {
                c.get_stock(pb::GetStockRequest {
                    activity_id: a,
                    item_id: s,
                })
                .await
                .is_ok()
            }
        },
    )
    .await;
}

/// Two open activities of one item (50 units over 2 shards) each, made through
/// `stockd`: `[(activity, item); 2]`.
async fn two_sales(stockd: &StockdProcess) -> [(u64, u64); 2] {
    let mut admin = stockd.admin_client().await;
    let hour = Duration::from_secs(3600);
    let mut sales = [(0, 0); 2];
    for sale in &mut sales {
        let made =
            create_published_activity_with(&mut admin, &[(50, 100)], 2, Duration::ZERO, hour).await;
        *sale = (made.id, made.items[0].id);
    }
    sales
}

/// Holds activity `a`'s rebuild back (the returned transaction holds its row of
/// `rebuild_leases`, which a rebuilding stockd's lease must raise; roll it back to let
/// the rebuild run), then loses its 2 shards' Redis state (their fences).
async fn hold_rebuild_and_lose_shards(
    db: &TestDb,
    redis: &RedisCluster,
    a: u64,
) -> sqlx::Transaction<'static, sqlx::MySql> {
    let mut hold = db.pool().begin().await.unwrap();
    sqlx::query(
        "INSERT INTO rebuild_leases (activity_id, token, holder) VALUES (?, 1, 'test') \
         ON DUPLICATE KEY UPDATE holder = 'test'",
    )
    .bind(a)
    .execute(&mut *hold)
    .await
    .unwrap();
    let client = redis.client().await;
    for i in 0..2 {
        let _: i64 = client.del(keys::fence(a, i)).await.unwrap();
    }
    hold
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_fails_over_to_the_survivors_when_a_stockd_and_an_orderd_are_killed() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&redis, &db);
    let stockd_a = spawn_stockd_process(&deps, |_| {}).await;
    let mut stockd_b = spawn_stockd_process(&deps, |_| {}).await;
    let orderd_a = spawn_orderd_process(&deps, |_| {}).await;
    let mut orderd_b = spawn_orderd_process(&deps, |_| {}).await;

    let mut admin = stockd_a.admin_client().await;
    let sale = create_published_activity_with(
        &mut admin,
        &[(STOCK, 100), (20, 100)],
        2,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let (a, crowd_item, calm_item) = (sale.id, sale.items[0].id, sale.items[1].id);
    for s in [&stockd_a, &stockd_b] {
        wait_known(&s.addr, a, crowd_item).await;
    }

    let (stockds, orderds) = (
        url_list(&[&stockd_a.addr, &stockd_b.addr]),
        url_list(&[&orderd_a.addr, &orderd_b.addr]),
    );
    let gw = spawn_gateway(
        &EdgeDeps {
            redis: &redis,
            stockd: &stockd_a.addr,
            orderd: &orderd_a.addr,
        },
        |c| {
            set(c, "upstreams", "stockd", stockds);
            set(c, "upstreams", "orderd", orderds);
            // Slow checks: for a while after the kill the dead endpoints are still marked
            // healthy, so calls reach them and must fail over.
            set(c, "upstreams", "health_interval_ms", 3000);
            // Far above what a loaded debug build takes: a 503 here is a failover that
            // did not happen, not a slow machine.
            set(c, "upstreams", "reserve_deadline_ms", 8000);
            set(c, "upstreams", "order_deadline_ms", 8000);
        },
    )
    .await;
    gw.wait_activity(a).await;
    for (service, addr) in [
        ("stockd", &stockd_a.addr),
        ("stockd", &stockd_b.addr),
        ("orderd", &orderd_a.addr),
        ("orderd", &orderd_b.addr),
    ] {
        wait_gauge(&gw, service, addr, 1.0).await;
    }

    // Every buyer logs in and takes a purchase token before the crowd starts.
    let now = seckill_lua::clock::now_ms() as u64;
    let mut buyers = Vec::with_capacity(BUYERS);
    for i in 0..BUYERS {
        let user = format!("fleet-{i}");
        let jwt = gw.jwt(&user, 3600, now);
        let token = gw.purchase_token(&jwt, a, crowd_item).await;
        buyers.push((user, jwt, token));
    }
    // Every fourth buyer double-clicks (the same token, so the same request id).
    let mut requests: Vec<usize> = (0..BUYERS).collect();
    requests.extend((0..BUYERS).step_by(4));

    let gw = Arc::new(gw);
    let buyers = Arc::new(buyers);
    let requests = Arc::new(requests);
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (gw, buyers, requests, next, done, killed) = (
            gw.clone(),
            buyers.clone(),
            requests.clone(),
            next.clone(),
            done.clone(),
            killed.clone(),
        );
        workers.spawn(async move {
            let mut out = Vec::new();
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&b) = requests.get(k) else {
                    return out;
                };
                let (user, jwt, token) = &buyers[b];
                let sent_after_kill = killed.load(Ordering::Acquire);
                let r = gw.reserve(jwt, a, crowd_item, token).await;
                out.push(Answered {
                    user: user.clone(),
                    status: r.status,
                    reservation: r.body["reservation_id"].as_str().map(str::to_string),
                    sent_after_kill,
                });
                done.fetch_add(1, Ordering::Release);
            }
        });
    }
    // A quarter of the stock in: kill -9 one of each.
    wait_until_async(
        "a quarter of the stock answered",
        Duration::from_secs(120),
        || async { done.load(Ordering::Acquire) >= STOCK as usize / 4 },
    )
    .await;
    stockd_b.kill();
    orderd_b.child.kill();
    killed.store(true, Ordering::Release);
    // orderd calls right away, while orderd B is still marked healthy: they fail over.
    for (user, _, _) in buyers.iter().take(4) {
        let jwt = gw.jwt(user, 3600, now);
        let r = gw.get("/api/v1/orders", Some(&jwt)).await;
        assert_eq!(r.status, 200, "orders of {user} after the kill: {}", r.body);
    }
    let mut answers = Vec::new();
    while let Some(w) = workers.join_next().await {
        answers.extend(w.expect("crowd worker"));
    }
    let gw = Arc::into_inner(gw).expect("workers done");
    assert_eq!(answers.len(), requests.len());

    let count = |status: u16| answers.iter().filter(|x| x.status == status).count();
    let by_status: HashMap<u16, usize> = answers.iter().fold(HashMap::new(), |mut m, x| {
        *m.entry(x.status).or_default() += 1;
        m
    });
    eprintln!("answers by status: {by_status:?}");
    for x in &answers {
        assert!(
            matches!(x.status, 202 | 409 | 410 | 429 | 503),
            "{}: unexpected {} (all: {by_status:?})",
            x.user,
            x.status
        );
    }
    // The survivors answered everything sent after the kill; at most the requests in
    // flight when it hit may have failed.
    let late_503 = answers
        .iter()
        .filter(|x| x.sent_after_kill && x.status == 503)
        .count();
    assert_eq!(late_503, 0, "503s sent after the kill: {by_status:?}");
    assert!(count(503) <= CONCURRENCY, "{by_status:?}");
    for service in ["stockd", "orderd"] {
        assert!(
            failovers(&gw, service).await >= 1.0,
            "calls reached the dead {service} and failed over"
        );
    }

    // One reservation per buyer: a double click answers the same reservation (202 again,
    // or 409 naming it), never a second one.
    let mut held: HashMap<&str, &str> = HashMap::new();
    for x in answers.iter().filter(|x| x.status == 202) {
        let rid = x.reservation.as_deref().expect("202 has a reservation id");
        let first = *held.entry(x.user.as_str()).or_insert(rid);
        assert_eq!(first, rid, "{} holds two reservations", x.user);
    }
    // The bulk succeeded: demand was twice the stock, so nearly every unit went to a
    // 202 (a stockd killed in the middle of moving units between shards may strand a
    // few until reconciliation: an undersell, never an oversell).
    assert!(
        held.len() >= STOCK as usize * 9 / 10,
        "{} buyers hold a unit of {STOCK} ({by_status:?})",
        held.len()
    );
    assert!(held.len() <= STOCK as usize, "oversold at the edge");

    // orderd A drains every 202, orderd B's unacknowledged entries included (claimed).
    let order_ids = || async {
        let rows: Vec<(String, String, String)> =
            sqlx::query_as("SELECT id, user_id, status FROM orders WHERE item_id = ?")
                .bind(crowd_item)
                .fetch_all(db.pool())
                .await
                .expect("orders");
        rows
    };
    wait_until_async(
        "an order for every 202",
        Duration::from_secs(90),
        || async {
            let rows = order_ids().await;
            let ids: HashSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
            held.values().all(|rid| ids.contains(rid))
        },
    )
    .await;
    let rows = order_ids().await;
    let active: Vec<_> = rows
        .iter()
        .filter(|r| r.2 == "PENDING" || r.2 == "PAID")
        .collect();
    assert!(active.len() <= STOCK as usize, "oversold in MySQL");
    let users: HashSet<&str> = active.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(users.len(), active.len(), "a buyer holds two orders");
    // Stock and active orders read in one statement (one snapshot) while orders for the
    // buyers whose answer was lost may still be landing.
    let (left, ordered): (u32, i64) = sqlx::query_as(
        "SELECT stock, (SELECT COUNT(*) FROM orders WHERE item_id = ? \
         AND status IN ('PENDING', 'PAID')) FROM activity_items WHERE id = ?",
    )
    .bind(crowd_item)
    .bind(crowd_item)
    .fetch_one(db.pool())
    .await
    .expect("stock and orders");
    assert_eq!(
        i64::from(left) + ordered,
        i64::from(STOCK),
        "MySQL stock is the units not ordered"
    );

    // The dead endpoints are marked down, the survivors up; the edge stays ready.
    wait_gauge(&gw, "stockd", &stockd_b.addr, 0.0).await;
    wait_gauge(&gw, "orderd", &orderd_b.addr, 0.0).await;
    wait_gauge(&gw, "stockd", &stockd_a.addr, 1.0).await;
    wait_gauge(&gw, "orderd", &orderd_a.addr, 1.0).await;
    let ready = reqwest::get(format!("{}/readyz", gw.admin_url()))
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);

    // Marked down, they get no calls: any call to them would fail and count a failover.
    let (stockd_before, orderd_before) = (
        failovers(&gw, "stockd").await,
        failovers(&gw, "orderd").await,
    );
    for i in 0..10 {
        let user = format!("calm-{i}");
        let jwt = gw.jwt(&user, 3600, now);
        let token = gw.purchase_token(&jwt, a, calm_item).await;
        let r = gw.reserve(&jwt, a, calm_item, &token).await;
        assert_eq!(r.status, 202, "{}", r.body);
    }
    for (user, rid) in held.iter().take(20) {
        let jwt = gw.jwt(user, 3600, now);
        let r = gw.get(&format!("/api/v1/orders/{rid}"), Some(&jwt)).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_eq!(failovers(&gw, "stockd").await, stockd_before);
    assert_eq!(failovers(&gw, "orderd").await, orderd_before);
    drop(orderd_a);
}

/// One activity unavailable at every stockd (its shards lost, its rebuild held back)
/// marks no stockd down: the edge answers its buyers 503 and goes on serving every other
/// activity, `/readyz` stays ready, and no call fails over for the others. (Until the
/// eighteenth session each such answer marked the stockd that sent it down, so every
/// stockd in turn, and took the edge out of `/readyz` for all activities.)
///
/// The rebuild is held back in MySQL: this test's transaction holds the activity's row
/// of `rebuild_leases`, which the rebuilding stockd's lease must raise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_activity_rebuilding_marks_no_stockd_down_and_the_others_sell() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&redis, &db);
    let stockd_a = spawn_stockd_process(&deps, |_| {}).await;
    let stockd_b = spawn_stockd_process(&deps, |_| {}).await;
    let orderd = spawn_orderd_process(&deps, |_| {}).await;
    let [(x, x_item), (y, y_item)] = two_sales(&stockd_a).await;
    for s in [&stockd_a, &stockd_b] {
        wait_known(&s.addr, x, x_item).await;
        wait_known(&s.addr, y, y_item).await;
    }
    let gw = spawn_gateway(
        &EdgeDeps {
            redis: &redis,
            stockd: &stockd_a.addr,
            orderd: &orderd.addr,
        },
        |c| {
            set(
                c,
                "upstreams",
                "stockd",
                url_list(&[&stockd_a.addr, &stockd_b.addr]),
            );
            set(c, "upstreams", "reserve_deadline_ms", 8000);
        },
    )
    .await;
    gw.wait_activity(x).await;
    gw.wait_activity(y).await;
    for addr in [&stockd_a.addr, &stockd_b.addr] {
        wait_gauge(&gw, "stockd", addr, 1.0).await;
    }
    let now = seckill_lua::clock::now_ms() as u64;
    let buyer = |i: usize, (a, s): (u64, u64)| {
        let gw = &gw;
        async move {
            let jwt = gw.jwt(&format!("b{i}"), 3600, now);
            let token = gw.purchase_token(&jwt, a, s).await;
            (jwt, token)
        }
    };
    let mut x_buyers = Vec::new();
    for i in 0..20 {
        x_buyers.push(buyer(i, (x, x_item)).await);
    }

    // X's rebuild is held back, then X's shards are lost: every stockd answers X with
    // UNAVAILABLE ("being rebuilt", or "lost its Redis state") until the rebuild runs.
    let hold = hold_rebuild_and_lose_shards(&db, &redis, x).await;
    let ready = || async {
        reqwest::get(format!("{}/readyz", gw.admin_url()))
            .await
            .expect("readyz")
            .status()
            .as_u16()
    };
    let mut unavailable = 0;
    for (i, (jwt, token)) in x_buyers.iter().enumerate() {
        let r = gw.reserve(jwt, x, x_item, token).await;
        assert!(
            matches!(r.status, 503 | 202),
            "buyer {i} of X: {} {}",
            r.status,
            r.body
        );
        if r.status == 503 {
            unavailable += 1;
            assert_eq!(r.code(), "backend_unavailable", "{}", r.body);
            // The answer just came back: an endpoint it marked down would show now.
            let m = gw.metrics().await;
            for addr in [&stockd_a.addr, &stockd_b.addr] {
                assert_eq!(
                    metric_value(
                        &m,
                        "gateway_upstream_healthy",
                        &healthy_labels("stockd", addr)
                    ),
                    Some(1.0),
                    "stockd {addr} marked down after X's 503 (buyer {i})"
                );
            }
            assert_eq!(ready().await, 200, "the edge left /readyz over X");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The loss was found (by the fence check or a reservation) while X's buyers came.
    assert!(
        unavailable >= 10,
        "{unavailable} of 20 buyers of X told 503"
    );

    // Y sells meanwhile, with no failover.
    let before = failovers(&gw, "stockd").await;
    for i in 100..110 {
        let (jwt, token) = buyer(i, (y, y_item)).await;
        let r = gw.reserve(&jwt, y, y_item, &token).await;
        assert_eq!(r.status, 202, "buyer {i} of Y: {}", r.body);
    }
    assert_eq!(failovers(&gw, "stockd").await, before);

    // The rebuild runs once the row is free; X sells again.
    hold.rollback().await.unwrap();
    let (jwt, token) = buyer(200, (x, x_item)).await;
    wait_until_async("X sells again", Duration::from_secs(30), || async {
        gw.reserve(&jwt, x, x_item, &token).await.status == 202
    })
    .await;
}

/// A stockd that listens but is not ready (one of its activities is being rebuilt, so
/// its `seckill.v1.StockService` health is NOT_SERVING while the server's overall ""
/// status is SERVING) is marked down by the gateway's health loop and gets no
/// reservation; once ready it is marked up and sells. (The loop used to ask for "",
/// which a stockd answers SERVING from its first second, ready or not.)
///
/// The rebuild is held back as above: this test's transaction holds the activity's row
/// of `rebuild_leases`, and the activity's fences are gone, so the new stockd cannot
/// finish its start-up rebuild until the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stockd_not_ready_yet_is_marked_down_by_the_health_loop_until_it_is() {
    use tonic_health::pb::health_check_response::ServingStatus;
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&redis, &db);
    let stockd_a = spawn_stockd_process(&deps, |_| {}).await;
    let orderd = spawn_orderd_process(&deps, |_| {}).await;
    let [(x, x_item), (y, y_item)] = two_sales(&stockd_a).await;
    wait_known(&stockd_a.addr, x, x_item).await;
    wait_known(&stockd_a.addr, y, y_item).await;

    // X's rebuild is held back, then X's shards are lost.
    let hold = hold_rebuild_and_lose_shards(&db, &redis, x).await;

    // B starts now: it listens, and answers "" SERVING, but not its StockService.
    let stockd_b = spawn_stockd_process_listening(&deps, |_| {}).await;
    let status = |service: &'static str| {
        let addr = stockd_b.addr.clone();
        async move { seckill_tests::grpc::health(&addr, service).await }
    };
    wait_until_async(
        "B's server to answer health",
        Duration::from_secs(20),
        || async { status("").await == ServingStatus::Serving },
    )
    .await;
    assert_eq!(
        status("seckill.v1.StockService").await,
        ServingStatus::NotServing,
        "the premise: B is not ready while X's rebuild is held"
    );

    let gw = spawn_gateway(
        &EdgeDeps {
            redis: &redis,
            stockd: &stockd_a.addr,
            orderd: &orderd.addr,
        },
        |c| {
            set(
                c,
                "upstreams",
                "stockd",
                url_list(&[&stockd_a.addr, &stockd_b.addr]),
            );
            set(c, "upstreams", "health_interval_ms", 100);
        },
    )
    .await;
    gw.wait_activity(y).await;
    wait_gauge(&gw, "stockd", &stockd_a.addr, 1.0).await;
    wait_gauge(&gw, "stockd", &stockd_b.addr, 0.0).await;
    // It stays down over many checks, not for one.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let m = gw.metrics().await;
        assert_eq!(
            metric_value(
                &m,
                "gateway_upstream_healthy",
                &healthy_labels("stockd", &stockd_b.addr)
            ),
            Some(0.0),
            "B marked up while not ready"
        );
    }

    // Y's buyers are all served by A: B, marked down, is never tried.
    let now = seckill_lua::clock::now_ms() as u64;
    let before = failovers(&gw, "stockd").await;
    for i in 0..20 {
        let jwt = gw.jwt(&format!("y{i}"), 3600, now);
        let token = gw.purchase_token(&jwt, y, y_item).await;
        let r = gw.reserve(&jwt, y, y_item, &token).await;
        assert_eq!(r.status, 202, "buyer {i} of Y: {}", r.body);
    }
    assert_eq!(failovers(&gw, "stockd").await, before);

    // The rebuild runs once the row is free: B becomes ready, is marked up, and X sells.
    hold.rollback().await.unwrap();
    wait_until_async("B ready", Duration::from_secs(30), || async {
        status("seckill.v1.StockService").await == ServingStatus::Serving
    })
    .await;
    wait_gauge(&gw, "stockd", &stockd_b.addr, 1.0).await;
    gw.wait_activity(x).await;
    let jwt = gw.jwt("x0", 3600, now);
    let token = gw.purchase_token(&jwt, x, x_item).await;
    wait_until_async("X sells again", Duration::from_secs(30), || async {
        gw.reserve(&jwt, x, x_item, &token).await.status == 202
    })
    .await;
}
