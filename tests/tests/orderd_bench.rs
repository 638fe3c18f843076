#![cfg(feature = "orderd")]
//! Benchmark (ignored by default; `deploy/bench/orderd.sh` runs it in release mode):
//! drain N queued reservations (default 50,000) from the Redis streams into MariaDB,
//! with batching (one transaction per batch of `consumer.batch_size`) versus one
//! transaction per order (`batch_size = 1`, the same code path), in the same run.
//! Writes `${RESULTS_DIR:-results}/orderd.tsv` and prints a table.

use seckill_tests::Deps;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use futures::StreamExt;
use seckill_tests::orderd::{
    count_all_orders, reserve_direct, seed_activity, set_status, spawn_orderd,
};
use seckill_tests::{RedisCluster, TestDb};

const SHARDS: u32 = 8;

async fn queue(redis: Arc<Client>, a: u64, s: u64, n: usize, tag: &str) {
    let reserved = futures::stream::iter(0..n)
        .map(|u| {
            let redis = redis.clone();
            let user = format!("{tag}-{u}");
            async move {
                reserve_direct(&redis, a, s, SHARDS, &user, "q")
                    .await
                    .outcome
            }
        })
        .buffer_unordered(256)
        .filter(|o| futures::future::ready(o == "RESERVED"))
        .count()
        .await;
    assert_eq!(reserved, n, "every reservation queued");
}

/// Publishes `a`, runs orderd with `batch_size`, and returns orders/s until `target`
/// orders exist in MySQL.
async fn drain(
    cluster: &RedisCluster,
    db: &TestDb,
    a: u64,
    batch_size: u64,
    target: i64,
) -> (f64, Duration) {
    let orderd = spawn_orderd(&Deps::new(cluster, db), |c| {
        c.consumer.batch_size = batch_size;
        c.consumer.discovery_interval_ms = 20;
        c.mysql.max_connections = 16;
    })
    .await;
    // Progress from orderd's own counter (orders created), not COUNT(*) on a
    // growing table, so the probe does not load the database it measures.
    let written = || {
        ["PENDING", "FAILED"]
            .iter()
            .map(|s| orderd.metrics.orders_written.with_label_values(&[*s]).get())
            .sum::<u64>() as i64
    };
    let started = Instant::now();
    set_status(db, a, "PUBLISHED").await;
    while written() < target {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    orderd.stop().await.unwrap();
    assert!(count_all_orders(db).await >= target);
    (target as f64 / took.as_secs_f64(), took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run deploy/bench/orderd.sh"]
async fn bench_drain_queued_reservations_batched_versus_one_transaction_per_order() {
    let n: usize = std::env::var("BENCH_ORDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    // One transaction per order is ~25x slower; its rate is per order and steady, so
    // by default it drains a fifth as many (BENCH_BASELINE_ORDERS=50000 for all).
    let n_single: usize = std::env::var("BENCH_BASELINE_ORDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(n / 5);
    let batch: u64 = std::env::var("BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let redis = Arc::new(cluster.client().await);
    // Room to spare per shard: no home shard runs dry without stockd's rebalancing.
    let stock = (n as u32) * 5 / 4;
    let batched = seed_activity(&redis, &db, SHARDS, &[(stock, 100)]).await;
    let single = seed_activity(&redis, &db, SHARDS, &[(stock, 100)]).await;
    set_status(&db, batched.activity, "SCHEDULED").await;
    set_status(&db, single.activity, "SCHEDULED").await;
    let t = Instant::now();
    queue(redis.clone(), batched.activity, batched.items[0], n, "b").await;
    queue(
        redis.clone(),
        single.activity,
        single.items[0],
        n_single,
        "s",
    )
    .await;
    eprintln!("queued {n} + {n_single} reservations in {:?}", t.elapsed());

    let (ours, took_b) = drain(&cluster, &db, batched.activity, batch, n as i64).await;
    eprintln!("batched ({batch}/tx): {n} orders in {took_b:?} = {ours:.0} orders/s");
    let (anchor, took_s) = drain(&cluster, &db, single.activity, 1, n_single as i64).await;
    eprintln!("one tx per order: {n_single} orders in {took_s:?} = {anchor:.0} orders/s");

    let rows = [
        (
            format!("drain_{n}_batched_{batch}_vs_one_tx_per_order_{n_single}"),
            ours,
            anchor,
        ),
        (
            format!("drain_{n}_batched_{batch}_vs_target_5000"),
            ours,
            5000.0,
        ),
    ];
    let dir = std::env::var("RESULTS_DIR").unwrap_or_else(|_| "results".into());
    std::fs::create_dir_all(&dir).unwrap();
    let mut tsv = String::from("case\tours\tanchor\tratio\tunit\n");
    println!();
    println!(
        "{:<52} {:>12} {:>12} {:>8}  unit",
        "case", "ours", "anchor", "ratio"
    );
    for (case, ours, anchor) in &rows {
        let ratio = ours / anchor;
        tsv.push_str(&format!(
            "{case}\t{ours:.0}\t{anchor:.0}\t{ratio:.2}\torders/s\n"
        ));
        println!("{case:<52} {ours:>12.0} {anchor:>12.0} {ratio:>8.2}  orders/s");
    }
    let path = std::path::Path::new(&dir).join("orderd.tsv");
    std::fs::write(&path, tsv).unwrap();
    println!("written {}", path.display());
    println!(
        "reproduce: deploy/bench/orderd.sh   (BENCH_ORDERS={n} BENCH_BASELINE_ORDERS={n_single} BENCH_BATCH={batch}; \
         cargo test --release -p seckill-tests --no-default-features --features orderd \
         --test orderd_bench -- --ignored --nocapture)"
    );
}
