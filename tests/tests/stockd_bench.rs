#![cfg(feature = "stockd")]
//! Benchmark (issue 3): Reserve over gRPC at 64 concurrent callers against a
//! release-built `stockd` child process, versus the same `reserve.lua` called
//! directly with EVALSHA (fred, 64 concurrent callers) on the same 3-master cluster,
//! in the same run. Every call reserves (a fresh user each time; stock never runs
//! out), so both sides run the full script: HGET, DECR, INCR, HSET, XADD.
//!
//! Where the time goes: stockd's own histograms (`stockd_reserve_seconds`, the
//! handler; `stockd_lua_seconds{script="reserve"}`, the EVALSHA round trip) split the
//! client-observed latency into gRPC+HTTP/2, handler overhead and Redis; CPU seconds
//! per 1,000 reservations of stockd (from /proc) and of the Redis nodes (INFO cpu)
//! show who burns the 2 cores.
//!
//! Run: `deploy/bench/stockd.sh` (or `cargo build --release -p stockd --bins && cargo
//! test --release -p seckill-tests --no-default-features --features stockd --test
//! stockd_bench -- --ignored --nocapture`). Writes `${RESULTS_DIR:-results}/stockd.tsv`.
//! Knobs: `BENCH_SECS` (per case, default 8), `BENCH_CONCURRENCY` (default 64),
//! `BENCH_CONNS` (HTTP/2 connections of the gRPC client, default 4), and for A/B runs
//! `BENCH_STOCKD_GRPC` / `BENCH_STOCKD_STOCK`: TOML lines added to stockd's `[grpc]` /
//! `[stock]` sections (default: none, the shipped defaults).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use seckill_lua::home_shard;
use seckill_lua::scripts::{self, ReserveCall};
use seckill_proto::pb;
use seckill_tests::stockd::{
    create_published_activity_with, spawn_stockd_process_with, StockdProcess,
};
use seckill_tests::{RedisCluster, TestDb};

struct Run {
    calls: u64,
    secs: f64,
    lat_us: Vec<u64>,
}

impl Run {
    fn rps(&self) -> f64 {
        self.calls as f64 / self.secs
    }
    fn pct(&self, p: f64) -> f64 {
        if self.lat_us.is_empty() {
            return 0.0;
        }
        let k = ((self.lat_us.len() as f64 - 1.0) * p).round() as usize;
        self.lat_us[k] as f64 / 1000.0
    }
    fn mean_ms(&self) -> f64 {
        self.lat_us.iter().sum::<u64>() as f64 / self.lat_us.len().max(1) as f64 / 1000.0
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `call(worker, seq)` from `conc` workers for `secs` (after a 1 s warm-up).
async fn drive<F, Fut>(conc: usize, secs: u64, call: F) -> Run
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let call = Arc::new(call);
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..conc {
        let (call, measuring, stop, errors) = (
            call.clone(),
            measuring.clone(),
            stop.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(100_000);
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = call(w, seq).await;
                seq += 1;
                if !ok {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                if measuring.load(Ordering::Relaxed) {
                    lat.push(t.elapsed().as_micros() as u64);
                }
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut lat_us = Vec::new();
    for t in tasks {
        lat_us.extend(t.await.unwrap());
    }
    lat_us.sort_unstable();
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "calls failed during the bench"
    );
    Run {
        calls: lat_us.len() as u64,
        secs: elapsed,
        lat_us,
    }
}

/// (sum, count) of a histogram in Prometheus text, matching a label filter.
fn histogram(metrics: &str, name: &str, label: &str) -> (f64, f64) {
    let mut sum = 0.0;
    let mut count = 0.0;
    for line in metrics.lines() {
        let value = || line.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
        if line.starts_with(&format!("{name}_sum")) && line.contains(label) {
            sum = value();
        } else if line.starts_with(&format!("{name}_count")) && line.contains(label) {
            count = value();
        }
    }
    (sum, count)
}

async fn scrape(addr: &str) -> String {
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// CPU seconds (user + system) of a process.
fn proc_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split(' ').collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of stat are 11 and 12 after the command name.
    (ticks(11) + ticks(12)) / 100.0
}

fn redis_cpu(cluster: &RedisCluster) -> f64 {
    (0..cluster.nodes().len())
        .map(|i| {
            cluster
                .cli(i, &["INFO", "cpu"])
                .lines()
                .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
                .map(|l| l.split(':').nth(1).unwrap().trim().parse::<f64>().unwrap())
                .sum::<f64>()
        })
        .sum()
}

/// One Reserve-over-gRPC case against its own stockd process.
struct GrpcCase {
    run: Run,
    cpu_stockd: f64,
    cpu_redis: f64,
    handler_ms: f64,
    lua_ms: f64,
    batch_mean: f64,
}

/// Publishes an item that never sells out on `p` and drives Reserve over gRPC
/// (64 callers over 4 HTTP/2 connections, a fresh user per call).
async fn grpc_case(
    p: &StockdProcess,
    cluster: &RedisCluster,
    conc: usize,
    secs: u64,
    tag: &'static str,
) -> GrpcCase {
    let mut admin = p.admin_client().await;
    let act = create_published_activity_with(
        &mut admin,
        &[(50_000_000, 100)],
        8,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let mut clients = Vec::new();
    for _ in 0..env_u64("BENCH_CONNS", 4) {
        clients.push(p.stock_client().await);
    }
    let (oa, os) = (act.id, act.items[0].id);
    let pid = p.child.id().unwrap();
    let before = scrape(&p.admin_addr).await;
    let (cpu_stockd0, cpu_redis0) = (proc_cpu(pid), redis_cpu(cluster));
    let clients = Arc::new(clients);
    let run = drive(conc, secs, move |w, seq| {
        let mut c = clients[w % clients.len()].clone();
        async move {
            let r = c
                .reserve(pb::ReserveRequest {
                    activity_id: oa,
                    item_id: os,
                    user_id: format!("{tag}{w}-{seq}"),
                    request_id: "r".into(),
                })
                .await;
            matches!(r, Ok(r) if r.get_ref().outcome() == pb::ReserveOutcome::Reserved)
        }
    })
    .await;
    let cpu_stockd = proc_cpu(pid) - cpu_stockd0;
    let cpu_redis = redis_cpu(cluster) - cpu_redis0;
    let after = scrape(&p.admin_addr).await;
    // Means over the whole case (the 1 s warm-up's calls included; a mean is fine).
    let diff = |name: &str, label: &str, scale: f64| {
        let (s1, c1) = histogram(&after, name, label);
        let (s0, c0) = histogram(&before, name, label);
        ((s1 - s0) / (c1 - c0).max(1.0)) * scale
    };
    GrpcCase {
        handler_ms: diff("stockd_reserve_seconds", "", 1000.0),
        lua_ms: diff("stockd_lua_seconds", "script=\"reserve\"", 1000.0),
        batch_mean: diff("stockd_reserve_batch_size", "", 1.0),
        run,
        cpu_stockd,
        cpu_redis,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run through deploy/bench/stockd.sh"]
async fn bench_reserve_over_grpc_versus_the_lua_script_called_directly() {
    let secs = env_u64("BENCH_SECS", 8);
    let conc = env_u64("BENCH_CONCURRENCY", 64) as usize;
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;

    // --- anchor: reserve.lua by EVALSHA, one reservation per call, same cluster,
    // same shape of keys.
    // A/B knobs: extra `[grpc]` / `[stock]` TOML lines for both stockd processes
    // (empty = the shipped defaults), e.g. BENCH_STOCKD_GRPC="worker_threads = 1".
    let extra_grpc = std::env::var("BENCH_STOCKD_GRPC").unwrap_or_default();
    let extra_stock = std::env::var("BENCH_STOCKD_STOCK").unwrap_or_default();
    let p = spawn_stockd_process_with(&cluster, &db, &extra_grpc, &extra_stock).await;
    let theirs = create_published_activity_with(
        &mut p.admin_client().await,
        &[(50_000_000, 100)],
        8,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let redis = cluster.client().await;
    for i in 0..cluster.nodes().len() {
        cluster.cli(i, &["SCRIPT", "LOAD", scripts::RESERVE.body]);
    }
    let (ta, ts) = (theirs.id, theirs.items[0].id);
    let sha = scripts::RESERVE.sha1();
    let cpu_redis0 = redis_cpu(&cluster);
    let anchor = {
        let redis = redis.clone();
        drive(conc, secs, move |w, seq| {
            let redis = redis.clone();
            let sha = sha.clone();
            async move {
                let user = format!("d{w}-{seq}");
                let shard = home_shard(&user, 8);
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64;
                let mut call = ReserveCall::new(ta, shard, now, "", 0, 1);
                call.push(ts, &user, "r");
                let r: Result<Vec<fred::types::Value>, _> = redis
                    .evalsha(sha, call.keys, call.args)
                    .await;
                matches!(r, Ok(v) if v.first().and_then(|x| x.as_str().map(|s| s == "RESERVED")).unwrap_or(false))
            }
        })
        .await
    };
    let cpu_redis_anchor = redis_cpu(&cluster) - cpu_redis0;

    // --- ours: StockService.Reserve over gRPC, with group commit (the default), then
    // with `reserve_batch_max = 1` (one reserve call per reservation).
    let ours = grpc_case(&p, &cluster, conc, secs, "g").await;
    drop(p);
    // A second process (the first one stopped), which leaves the shards it finds
    // intact instead of rebuilding them from the streams the cases above filled.
    let p = spawn_stockd_process_with(
        &cluster,
        &db,
        &extra_grpc,
        &format!("{extra_stock}\nrecompute_at_start = false\nreserve_batch_max = 1"),
    )
    .await;
    let single = grpc_case(&p, &cluster, conc, secs, "s").await;
    drop(p);

    let per_1k = |cpu: f64, calls: u64| cpu / (calls as f64 / 1000.0);
    let mut rows = Vec::new();
    let cases = [
        ("", "group commit", &ours),
        ("_unbatched", "no group commit", &single),
    ];
    for (name, _, c) in cases {
        let g = &c.run;
        rows.push((
            format!("reserve_throughput_64{name}"),
            g.rps(),
            anchor.rps(),
            g.rps() / anchor.rps(),
            "reservations/s",
        ));
        rows.push((
            format!("reserve_p50_64{name}"),
            g.pct(0.50),
            anchor.pct(0.50),
            g.pct(0.50) / anchor.pct(0.50),
            "ms",
        ));
        rows.push((
            format!("reserve_p99_64{name}"),
            g.pct(0.99),
            anchor.pct(0.99),
            g.pct(0.99) / anchor.pct(0.99),
            "ms",
        ));
        rows.push((
            format!("redis_cpu_per_1k{name}"),
            per_1k(c.cpu_redis, g.calls),
            per_1k(cpu_redis_anchor, anchor.calls),
            per_1k(c.cpu_redis, g.calls) / per_1k(cpu_redis_anchor, anchor.calls),
            "cpu-s/1k reservations",
        ));
    }
    let dir = std::env::var("RESULTS_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../results").to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let mut tsv = String::from("case\tours\tanchor\tratio\tunit\n");
    for (case, o, a, r, unit) in &rows {
        tsv.push_str(&format!("{case}\t{o:.3}\t{a:.3}\t{r:.3}\t{unit}\n"));
    }
    std::fs::write(format!("{dir}/stockd.tsv"), &tsv).unwrap();

    println!("\nstockd Reserve benchmark: {conc} concurrent callers, {secs} s per case, 3-master Redis Cluster, 8 shards");
    println!("ours = StockService.Reserve over gRPC (release stockd child process, default config: group commit)");
    println!(
        "_unbatched: the same with stock.reserve_batch_max = 1 (one reserve call per reservation)"
    );
    println!("anchor = EVALSHA reserve.lua via fred, one reservation per call");
    if !(extra_grpc.is_empty() && extra_stock.is_empty()) {
        println!("stockd config changed from the defaults: [grpc] {extra_grpc:?} [stock] {extra_stock:?}");
    }
    println!();
    println!(
        "{:<32} {:>14} {:>14} {:>8}  unit",
        "case", "ours", "anchor", "ratio"
    );
    for (case, o, a, r, unit) in &rows {
        println!("{case:<32} {o:>14.3} {a:>14.3} {r:>8.3}  {unit}");
    }
    for (_, name, c) in cases {
        println!("\nwhere the time goes ({name}, mean per reservation):");
        println!("  client-observed            {:>8.3} ms", c.run.mean_ms());
        println!(
            "  stockd handler             {:>8.3} ms  (stockd_reserve_seconds)",
            c.handler_ms
        );
        println!(
            "    of which EVALSHA reserve {:>8.3} ms  (stockd_lua_seconds, per call)",
            c.lua_ms
        );
        println!(
            "  gRPC/HTTP2 + scheduling    {:>8.3} ms  (client-observed minus handler)",
            c.run.mean_ms() - c.handler_ms
        );
        println!(
            "  reservations per call      {:>8.2}     (stockd_reserve_batch_size)",
            c.batch_mean
        );
        println!(
            "  CPU per 1k reservations: stockd {:.3} s, redis {:.3} s (anchor: redis {:.3} s)",
            per_1k(c.cpu_stockd, c.run.calls),
            per_1k(c.cpu_redis, c.run.calls),
            per_1k(cpu_redis_anchor, anchor.calls)
        );
    }
    println!("\nresults: {dir}/stockd.tsv");
    println!("reproduce: deploy/bench/stockd.sh");
}
