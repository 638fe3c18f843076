#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]
//! The production shape: two gateways, two stockd and two orderd (child processes) on
//! one Redis Cluster with a replica per master, stockd acknowledging every reservation
//! on a replica. A crowd buys through both edges; mid-sale one stockd and one orderd are
//! killed -9, and later the stockd is started again (with `recompute_at_start`, the
//! default) while the sale runs; then the other stockd is stopped gracefully (SIGTERM,
//! with the edges' reservation streams open on it) and started again. The invariants hold, no shard is rebuilt while its
//! fence is intact, and the edges answer from the surviving peers.
//!
//! Needs `cargo build --bins -p stockd -p orderd -p gateway`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use seckill_lua::keys;
use seckill_tests::gateway::{set, spawn_gateway, url_list, EdgeDeps};
use seckill_tests::orderd::spawn_orderd_process;
use seckill_tests::process::wait_until_async;
use seckill_tests::redis::Persistence;
use seckill_tests::stockd::{create_published_activity_with, spawn_stockd_process};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const STOCK: u32 = 150;
const BUYERS: usize = 2 * STOCK as usize;
const SHARDS: u32 = 4;
const CONCURRENCY: usize = 12;

/// The value of an unlabelled-or-labelled sample line `name{labels} v` in Prometheus
/// text, 0 when absent.
fn sample(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn scrape(admin: &str) -> String {
    reqwest::get(format!("http://{admin}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body")
}

async fn fences(redis: &Client, a: u64) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for i in 0..SHARDS {
        out.push(redis.get(keys::fence(a, i)).await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_each_daemon_keep_every_promise_through_kills_and_a_restart_mid_sale() {
    init_tracing();
    let redis = RedisCluster::start_replicated(3, 1, Persistence::AofEverySec);
    let db = TestDb::create().await;
    let deps = Deps::new(&redis, &db);
    let acks = |c: &mut stockd::Config| c.redis.replica_acks = 1;
    let mut stockd_a = spawn_stockd_process(&deps, acks).await;
    let mut stockd_b = spawn_stockd_process(&deps, acks).await;
    let orderd_a = spawn_orderd_process(&deps, |_| {}).await;
    let mut orderd_b = spawn_orderd_process(&deps, |_| {}).await;

    let mut admin = stockd_a.admin_client().await;
    let sale = create_published_activity_with(
        &mut admin,
        &[(STOCK, 100)],
        SHARDS,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let (a, s) = (sale.id, sale.items[0].id);
    let mut edges = Vec::new();
    for _ in 0..2 {
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
                set(c, "upstreams", "reserve_deadline_ms", 8000);
                set(c, "upstreams", "order_deadline_ms", 8000);
            },
        )
        .await;
        gw.wait_activity(a).await;
        edges.push(gw);
    }
    // Both stockd know the sale before the crowd (a fresh stockd answers NOT_FOUND for
    // an activity it has not loaded yet).
    for addr in [&stockd_a.addr, &stockd_b.addr] {
        let c = seckill_tests::stockd::stock_client(addr).await;
        wait_until_async("stockd knows the sale", Duration::from_secs(20), || {
            let mut c = c.clone();
            async move {
                c.get_stock(seckill_proto::pb::GetStockRequest {
                    activity_id: a,
                    item_id: s,
                })
                .await
                .is_ok_and(|r| r.into_inner().available)
            }
        })
        .await;
    }
    let client = redis.client().await;
    let opened = fences(&client, a).await;

    let now = seckill_lua::clock::now_ms() as u64;
    let mut buyers = Vec::with_capacity(BUYERS);
    for i in 0..BUYERS {
        let user = format!("fleet-{i}");
        let edge = &edges[i % 2];
        let jwt = edge.jwt(&user, 3600, now);
        let token = edge.purchase_token(&jwt, a, s).await;
        buyers.push((user, jwt, token));
    }
    let edges = Arc::new(edges);
    let buyers = Arc::new(buyers);
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (edges, buyers, next, done) =
            (edges.clone(), buyers.clone(), next.clone(), done.clone());
        workers.spawn(async move {
            let mut out = Vec::new();
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some((user, jwt, token)) = buyers.get(k) else {
                    return out;
                };
                // A buyer whose answer is 503 sends the same request again (same token,
                // same request id) on the other edge, a few times.
                let mut answer = None;
                let mut unavailable = 0;
                for attempt in 0..6 {
                    let r = edges[(k + attempt) % 2].reserve(jwt, a, s, token).await;
                    if r.status == 503 {
                        unavailable += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    answer = Some(r);
                    break;
                }
                let r = answer.unwrap_or_else(|| panic!("{user}: 503 six times"));
                out.push((
                    user.clone(),
                    r.status,
                    r.body["reservation_id"].as_str().map(str::to_string),
                    unavailable,
                ));
                done.fetch_add(1, Ordering::Release);
            }
        });
    }
    // A third in: kill -9 one stockd and one orderd.
    wait_until_async("a third answered", Duration::from_secs(120), || async {
        done.load(Ordering::Acquire) >= BUYERS / 3
    })
    .await;
    stockd_b.kill();
    orderd_b.child.kill();
    // Two thirds in: the stockd comes back (same ports, same config) while the sale runs.
    wait_until_async("two thirds answered", Duration::from_secs(120), || async {
        done.load(Ordering::Acquire) >= 2 * BUYERS / 3
    })
    .await;
    stockd_b.restart().await;
    // Five sixths in: stockd A stops gracefully (SIGTERM, the first half of a rolling
    // restart) with both edges' reservation streams open on it, and starts again. It
    // stops by itself (a stream never holds the drain: it refuses what comes, finishes
    // what it started, ends the stream), and its buyers fail over inside the edges.
    wait_until_async("five sixths answered", Duration::from_secs(120), || async {
        done.load(Ordering::Acquire) >= 5 * BUYERS / 6
    })
    .await;
    let pid = stockd_a.child.id().expect("stockd A runs");
    seckill_tests::process::signal(pid, "TERM");
    wait_until_async(
        "stockd A stopped on SIGTERM",
        Duration::from_secs(15),
        || {
            let running = stockd_a.child.is_running();
            async move { !running }
        },
    )
    .await;
    stockd_a.restart().await;
    let mut answers = Vec::new();
    while let Some(w) = workers.join_next().await {
        answers.extend(w.expect("crowd worker"));
    }
    assert_eq!(answers.len(), BUYERS);
    let by_status: HashMap<u16, usize> = answers.iter().fold(HashMap::new(), |mut m, x| {
        *m.entry(x.1).or_default() += 1;
        m
    });
    let retried: usize = answers.iter().map(|x| x.3).sum();
    eprintln!("fleet answers by status: {by_status:?}; 503s retried: {retried}");
    for (user, status, _, _) in &answers {
        assert!(
            matches!(status, 202 | 409 | 410 | 429),
            "{user}: {status} ({by_status:?})"
        );
    }
    // The surviving peers answered: at most the calls in flight when the kill hit met a
    // 503, and each was answered on its retry.
    assert!(retried <= 2 * CONCURRENCY, "{retried} 503s ({by_status:?})");

    // No shard was closed or reopened: neither the kill nor the restart with
    // recompute_at_start rebuilt anything while the fences were intact.
    assert_eq!(fences(&client, a).await, opened, "a shard was rebuilt");
    for admin in [&stockd_a.admin_addr, &stockd_b.admin_addr] {
        let m = scrape(admin).await;
        assert_eq!(
            sample(&m, "stockd_recomputes_total{result=\"ok\"} "),
            0.0,
            "{admin}"
        );
        assert_eq!(
            sample(&m, "stockd_lost_reservations_total{path=\"start\"} "),
            0.0,
            "{admin}"
        );
    }

    // One reservation per buyer, none beyond the stock, nearly all of it sold.
    let held: HashMap<&str, &str> = answers
        .iter()
        .filter(|x| x.1 == 202)
        .map(|x| {
            (
                x.0.as_str(),
                x.2.as_deref().expect("202 names a reservation"),
            )
        })
        .collect();
    assert!(held.len() <= STOCK as usize, "oversold at the edge");
    assert!(
        held.len() >= STOCK as usize * 9 / 10,
        "{} of {STOCK}",
        held.len()
    );

    // Every 202 becomes exactly one order of its buyer (orderd A claims B's pending).
    wait_until_async(
        "an order for every 202",
        Duration::from_secs(90),
        || async {
            let rows: Vec<(String,)> = sqlx::query_as("SELECT id FROM orders WHERE item_id = ?")
                .bind(s)
                .fetch_all(db.pool())
                .await
                .unwrap();
            let ids: HashSet<String> = rows.into_iter().map(|r| r.0).collect();
            held.values().all(|rid| ids.contains(*rid))
        },
    )
    .await;
    for (user, rid) in &held {
        let (owner, status): (String, String) =
            sqlx::query_as("SELECT user_id, status FROM orders WHERE id = ?")
                .bind(rid)
                .fetch_one(db.pool())
                .await
                .unwrap();
        assert_eq!(&owner, user, "{rid}");
        assert_eq!(status, "PENDING", "{rid}");
    }
    let (left, active): (u32, i64) = sqlx::query_as(
        "SELECT stock, (SELECT COUNT(*) FROM orders WHERE item_id = ? \
         AND status IN ('PENDING', 'PAID')) FROM activity_items WHERE id = ?",
    )
    .bind(s)
    .bind(s)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(i64::from(left) + active, i64::from(STOCK));
    assert_eq!(active as usize, held.len(), "an order nobody was promised");
    drop(orderd_a);
}
