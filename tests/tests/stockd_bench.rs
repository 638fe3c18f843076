#![cfg(feature = "stockd")]
//! Benchmark (issue 3): Reserve over gRPC at 64 concurrent callers against a
//! release-built `stockd` child process, versus the same `reserve.lua` called
//! directly with EVALSHA (fred, 64 concurrent callers) on the same 3-master cluster,
//! in the same run. Every call reserves (a fresh user each time; stock never runs
//! out), so both sides run the full script: HGET, DECR, INCR, HSET, XADD.
//!
//! Both sides run on the same load generator: two threads, each with its own
//! current-thread runtime and its own connections (one HTTP/2 connection to stockd,
//! or one fred client with a connection per Redis node), as wrk runs its threads.
//! The run alternates anchor and ours for `BENCH_ROUNDS` rounds; each round gives a
//! ratio of two cases seconds apart, and the report takes the median round, because
//! this shared machine's speed drifts by more than the effects measured.
//!
//! Where the time goes: stockd's own histograms (`stockd_reserve_seconds`, the
//! handler; `stockd_lua_seconds{script="reserve"}`, the EVALSHA round trip) split the
//! client-observed latency into gRPC+HTTP/2, handler overhead and Redis; CPU seconds
//! per reservation of stockd (from /proc), of the Redis nodes (INFO cpu) and of the
//! load generator (this process, /proc) show who burns the 2 cores.
//!
//! Run: `deploy/bench/stockd.sh` (or `cargo build --release -p stockd --bins && cargo
//! test --release -p seckill-tests --no-default-features --features stockd --test
//! stockd_bench -- --ignored --nocapture`). Writes `${RESULTS_DIR:-results}/stockd.tsv`.
//! Knobs: `BENCH_SECS` (per case, default 5), `BENCH_ROUNDS` (anchor-then-ours
//! rounds, default 5), `BENCH_CONCURRENCY` (default 64), `BENCH_CONNS` (HTTP/2
//! connections per load-generator thread, default 1), `BENCH_LOADGEN_THREADS`
//! (default 2), and for A/B runs `BENCH_STOCKD_GRPC` / `BENCH_STOCKD_STOCK`: TOML
//! lines added to stockd's `[grpc]` / `[stock]` sections (default: none, the shipped
//! defaults).
//!
//! (Over 400 lines: an integration suite: each test sets up real processes and states its
//! invariants inline, so the cases read top to bottom.)

use seckill_tests::Deps;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use futures::future::BoxFuture;
use seckill_lua::calls::ReserveCall;
use seckill_lua::home_shard;
use seckill_lua::scripts;
use seckill_proto::pb;
use seckill_tests::redis::{request_id, user_id, Persistence};
use seckill_tests::stockd::{
    create_published_activity_with, merge_toml, spawn_stockd_process, stock_client, StockdProcess,
};
use seckill_tests::{RedisCluster, TestDb};

struct Run {
    calls: u64,
    secs: f64,
    lat_us: Vec<u64>,
    /// CPU seconds of each process the case's sampler reads, over the measured window
    /// only (not the connect and warm-up before it), so that dividing by `calls` gives
    /// CPU per reservation.
    cpu: Vec<f64>,
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

/// One caller's call: `(worker, seq)` → whether it reserved.
type Call = Arc<dyn Fn(usize, u64) -> BoxFuture<'static, bool> + Send + Sync>;
/// Builds a load-generator thread's [`Call`] (its own connections) inside that
/// thread's runtime.
type Setup = Arc<dyn Fn() -> BoxFuture<'static, Call> + Send + Sync>;

/// Runs `conc` callers for `secs` (after a 1 s warm-up) on `BENCH_LOADGEN_THREADS`
/// threads (default 2), each with its own current-thread runtime and its own
/// connections from `setup`, as wrk runs its threads: the load generator shares the
/// 2 cores with what it measures, and one event loop per thread batches the writes
/// of its callers instead of waking a connection task per call. Both sides of the
/// bench go through here, so both get the same load generator.
///
/// `cpu` samples the CPU seconds used so far by the processes of the case; it is read
/// when the measured window opens and when it closes.
async fn drive(conc: usize, secs: u64, setup: Setup, cpu: &dyn Fn() -> Vec<f64>) -> Run {
    let threads = (env_u64("BENCH_LOADGEN_THREADS", 2) as usize).clamp(1, conc);
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(std::sync::Barrier::new(threads + 1));
    let mut handles = Vec::new();
    for t in 0..threads {
        let (setup, measuring, stop, errors, ready) = (
            setup.clone(),
            measuring.clone(),
            stop.clone(),
            errors.clone(),
            ready.clone(),
        );
        // Workers t, t + threads, t + 2 * threads, ...: `conc` callers in all.
        let workers: Vec<usize> = (t..conc).step_by(threads).collect();
        handles.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("load generator runtime");
            rt.block_on(async move {
                let call = setup().await;
                ready.wait();
                let mut tasks = Vec::new();
                for w in workers {
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
                let mut lat = Vec::new();
                for t in tasks {
                    lat.extend(t.await.unwrap());
                }
                lat
            })
        }));
    }
    {
        let ready = ready.clone();
        tokio::task::spawn_blocking(move || ready.wait())
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cpu0 = cpu();
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let cpu: Vec<f64> = cpu().iter().zip(&cpu0).map(|(b, a)| b - a).collect();
    stop.store(true, Ordering::Relaxed);
    let mut lat_us = tokio::task::spawn_blocking(move || {
        let mut all = Vec::new();
        for h in handles {
            all.extend(h.join().expect("load generator thread"));
        }
        all
    })
    .await
    .unwrap();
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
        cpu,
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
    /// CPU of this process (the load generator) during the case.
    cpu_client: f64,
    handler_ms: f64,
    lua_ms: f64,
    batch_mean: f64,
}

/// One anchor case: `reserve.lua` by EVALSHA from fred.
struct AnchorCase {
    run: Run,
    cpu_redis: f64,
    cpu_client: f64,
}

/// Publishes an item that never sells out on `p` and drives Reserve over gRPC
/// (`conc` callers over `BENCH_CONNS` HTTP/2 connections, a fresh user per call).
async fn grpc_case(
    p: &StockdProcess,
    cluster: &RedisCluster,
    conc: usize,
    secs: u64,
    tag: String,
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
    let (oa, os) = (act.id, act.items[0].id);
    let pid = p.child.id().unwrap();
    let before = scrape(&p.admin_addr).await;
    let addr = Arc::new(p.addr.clone());
    let tag = Arc::new(tag);
    let setup: Setup = Arc::new(move || {
        let (addr, tag) = (addr.clone(), tag.clone());
        Box::pin(async move {
            let mut clients = Vec::new();
            for _ in 0..env_u64("BENCH_CONNS", 1) {
                clients.push(stock_client(&addr).await);
            }
            let call: Call = Arc::new(move |w, seq| {
                let mut c = clients[w % clients.len()].clone();
                let user_id = format!("{tag}{w}-{seq}");
                Box::pin(async move {
                    let r = c
                        .reserve(pb::ReserveRequest {
                            activity_id: oa,
                            item_id: os,
                            user_id,
                            request_id: "r".into(),
                            ..Default::default()
                        })
                        .await;
                    matches!(r, Ok(r) if r.get_ref().outcome() == pb::ReserveOutcome::Reserved)
                })
            });
            call
        })
    });
    let sample = || {
        vec![
            proc_cpu(pid),
            redis_cpu(cluster),
            proc_cpu(std::process::id()),
        ]
    };
    let run = drive(conc, secs, setup, &sample).await;
    let (cpu_stockd, cpu_redis, cpu_client) = (run.cpu[0], run.cpu[1], run.cpu[2]);
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
        cpu_client,
    }
}

/// The anchor: `reserve.lua` by EVALSHA on item (`a`, `s`), one reservation per call,
/// same cluster, same shape of keys (8 shards, a fresh user per call).
async fn anchor_case(
    cluster: &RedisCluster,
    (a, s): (u64, u64),
    conc: usize,
    secs: u64,
    tag: String,
) -> AnchorCase {
    let sha = scripts::RESERVE.sha1();
    let url = Arc::new(cluster.url());
    let tag = Arc::new(tag);
    let setup: Setup = Arc::new(move || {
        let (url, tag, sha) = (url.clone(), tag.clone(), sha.clone());
        Box::pin(async move {
            let redis = seckill_tests::redis::connect(&url).await;
            let call: Call = Arc::new(move |w, seq| {
                let (redis, sha) = (redis.clone(), sha.clone());
                let user = format!("{tag}{w}-{seq}");
                Box::pin(async move {
                    let shard = home_shard(&user, 8);
                    let now = seckill_lua::clock::now_ms();
                    let mut call = ReserveCall::new(a, shard, now, "", 0, 1);
                    call.push(s, user_id(&user), request_id("r"));
                    let r: Result<Vec<fred::types::Value>, _> =
                        redis.evalsha(sha, call.keys, call.args).await;
                    matches!(r, Ok(v) if v.first().and_then(|x| x.as_str().map(|s| s == "RESERVED")).unwrap_or(false))
                })
            });
            call
        })
    });
    let sample = || vec![redis_cpu(cluster), proc_cpu(std::process::id())];
    let run = drive(conc, secs, setup, &sample).await;
    AnchorCase {
        cpu_redis: run.cpu[0],
        cpu_client: run.cpu[1],
        run,
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run through deploy/bench/stockd.sh"]
async fn bench_reserve_over_grpc_versus_the_lua_script_called_directly() {
    let secs = env_u64("BENCH_SECS", 5);
    let conc = env_u64("BENCH_CONCURRENCY", 64) as usize;
    let rounds = env_u64("BENCH_ROUNDS", 5).max(1) as usize;
    let conns = env_u64("BENCH_CONNS", 1);
    let threads = env_u64("BENCH_LOADGEN_THREADS", 2);
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;

    // A/B knobs: extra `[grpc]` / `[stock]` TOML lines for both stockd processes
    // (empty = the shipped defaults), e.g. BENCH_STOCKD_GRPC="worker_threads = 1".
    let extra_grpc = std::env::var("BENCH_STOCKD_GRPC").unwrap_or_default();
    let extra_stock = std::env::var("BENCH_STOCKD_STOCK").unwrap_or_default();
    let deps = Deps::new(&cluster, &db);
    let knobs = |c: &mut stockd::Config| {
        merge_toml(c, "grpc", &extra_grpc);
        merge_toml(c, "stock", &extra_stock);
    };
    let p = spawn_stockd_process(&deps, knobs).await;
    let theirs = create_published_activity_with(
        &mut p.admin_client().await,
        &[(50_000_000, 100)],
        8,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    for i in 0..cluster.nodes().len() {
        cluster.cli(i, &["SCRIPT", "LOAD", scripts::RESERVE.body]);
    }
    let item = (theirs.id, theirs.items[0].id);

    // Rounds of (anchor, ours) back to back: the machine's speed drifts by more than
    // the effect measured, so each ratio compares two cases seconds apart, and the
    // report takes the median round.
    let mut pairs = Vec::new();
    for r in 0..rounds {
        let anchor = anchor_case(&cluster, item, conc, secs, format!("d{r}-")).await;
        let ours = grpc_case(&p, &cluster, conc, secs, format!("g{r}-")).await;
        pairs.push((anchor, ours));
    }
    drop(p);
    // `reserve_batch_max = 1` (one reserve call per reservation), once, next to one
    // more anchor: a second process (the first one stopped), which leaves the shards
    // it finds intact instead of rebuilding them from the streams the cases above
    // filled.
    let p = spawn_stockd_process(&deps, |c| {
        knobs(c);
        c.stock.recompute_at_start = false;
        c.stock.reserve_batch_max = 1;
    })
    .await;
    let single_anchor = anchor_case(&cluster, item, conc, secs, "du-".into()).await;
    let single = grpc_case(&p, &cluster, conc, secs, "s-".into()).await;
    drop(p);

    let ratios: Vec<f64> = pairs
        .iter()
        .map(|(a, o)| o.run.rps() / a.run.rps())
        .collect();
    let mid = median(&ratios);
    let (anchor, ours) = pairs
        .iter()
        .find(|(a, o)| o.run.rps() / a.run.rps() == mid)
        .expect("the median is one of the rounds");

    let per_1k = |cpu: f64, calls: u64| cpu / (calls as f64 / 1000.0);
    let mut rows = Vec::new();
    let cases = [
        ("", "group commit, median round", anchor, ours),
        ("_unbatched", "no group commit", &single_anchor, &single),
    ];
    for (name, _, a, c) in cases {
        let g = &c.run;
        let mut row = |case: &str, o: f64, a: f64, unit: &'static str| {
            rows.push((format!("{case}{name}"), o, a, o / a, unit))
        };
        row(
            "reserve_throughput_64",
            g.rps(),
            a.run.rps(),
            "reservations/s",
        );
        row("reserve_p50_64", g.pct(0.50), a.run.pct(0.50), "ms");
        row("reserve_p99_64", g.pct(0.99), a.run.pct(0.99), "ms");
        row(
            "redis_cpu_per_1k",
            per_1k(c.cpu_redis, g.calls),
            per_1k(a.cpu_redis, a.run.calls),
            "cpu-s/1k reservations",
        );
        row(
            "client_cpu_per_1k",
            per_1k(c.cpu_client, g.calls),
            per_1k(a.cpu_client, a.run.calls),
            "cpu-s/1k reservations",
        );
    }
    let dir = std::env::var("RESULTS_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../results").to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let mut tsv = String::from("case\tours\tanchor\tratio\tunit\n");
    for (case, o, a, r, unit) in &rows {
        tsv.push_str(&format!("{case}\t{o:.3}\t{a:.3}\t{r:.3}\t{unit}\n"));
    }
    std::fs::write(format!("{dir}/stockd.tsv"), &tsv).unwrap();

    println!("\nstockd Reserve benchmark: {conc} concurrent callers, {secs} s per case, {rounds} rounds, 3-master Redis Cluster, 8 shards");
    println!(
        "load generator: {threads} threads, each its own current-thread runtime and connections"
    );
    println!("ours = StockService.Reserve over gRPC ({conns} HTTP/2 connection(s) per thread; release stockd child process, default config: group commit)");
    println!(
        "_unbatched: the same with stock.reserve_batch_max = 1 (one reserve call per reservation), one round"
    );
    println!("anchor = EVALSHA reserve.lua via fred (one client per thread, one connection per node), one reservation per call; each round runs the anchor, then ours");
    if !(extra_grpc.is_empty() && extra_stock.is_empty()) {
        println!("stockd config changed from the defaults: [grpc] {extra_grpc:?} [stock] {extra_stock:?}");
    }
    println!();
    let listed: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
    println!(
        "throughput ratio per round: {} (median {mid:.3})",
        listed.join(", ")
    );
    println!("the table shows the median round\n");
    println!(
        "{:<32} {:>14} {:>14} {:>8}  unit",
        "case", "ours", "anchor", "ratio"
    );
    for (case, o, a, r, unit) in &rows {
        println!("{case:<32} {o:>14.3} {a:>14.3} {r:>8.3}  {unit}");
    }
    for (_, name, a, c) in cases {
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
        let us = |cpu: f64, calls: u64| per_1k(cpu, calls) * 1000.0;
        println!(
            "  CPU per reservation: stockd {:.1} µs, redis {:.1} µs, load generator {:.1} µs = {:.1} µs",
            us(c.cpu_stockd, c.run.calls),
            us(c.cpu_redis, c.run.calls),
            us(c.cpu_client, c.run.calls),
            us(c.cpu_stockd + c.cpu_redis + c.cpu_client, c.run.calls),
        );
        println!(
            "  anchor's CPU per reservation: redis {:.1} µs, fred caller {:.1} µs = {:.1} µs",
            us(a.cpu_redis, a.run.calls),
            us(a.cpu_client, a.run.calls),
            us(a.cpu_redis + a.cpu_client, a.run.calls),
        );
    }
    println!("\nresults: {dir}/stockd.tsv");
    println!("reproduce: deploy/bench/stockd.sh");
}

/// The cost of `redis.replica_acks` (issue 13): on a Redis Cluster of 3 masters with a
/// replica each (AOF everysec on all), Reserve over gRPC from a stockd that waits for a
/// replica (`WAIT 1`, one per group-commit call) against one that does not, alternating
/// rounds, same load generator. The anchor here is the unacknowledged stockd: the ratio
/// is what the acknowledgement costs. Writes `${RESULTS_DIR:-results}/stockd_replicas.tsv`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run through deploy/bench/stockd.sh"]
async fn bench_reserve_with_and_without_replica_acks_on_a_replicated_cluster() {
    let secs = env_u64("BENCH_SECS", 5);
    let conc = env_u64("BENCH_CONCURRENCY", 64) as usize;
    let rounds = env_u64("BENCH_ROUNDS", 5).max(1) as usize;
    let cluster = RedisCluster::start_replicated(3, 1, Persistence::AofEverySec);
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    let acked = spawn_stockd_process(&deps, |c| c.redis.replica_acks = 1).await;
    let unacked = spawn_stockd_process(&deps, |c| c.redis.replica_acks = 0).await;
    let mut pairs = Vec::new();
    for r in 0..rounds {
        let without = grpc_case(&unacked, &cluster, conc, secs, format!("n{r}-")).await;
        let with = grpc_case(&acked, &cluster, conc, secs, format!("w{r}-")).await;
        pairs.push((without, with));
    }
    let ratios: Vec<f64> = pairs
        .iter()
        .map(|(n, w)| w.run.rps() / n.run.rps())
        .collect();
    let mid = median(&ratios);
    let (without, with) = pairs
        .iter()
        .find(|(n, w)| w.run.rps() / n.run.rps() == mid)
        .expect("the median is one of the rounds");
    let us = |cpu: f64, calls: u64| cpu / calls as f64 * 1e6;
    let rows = [
        (
            "reserve_throughput_64",
            with.run.rps(),
            without.run.rps(),
            "reservations/s",
        ),
        (
            "reserve_p50_64",
            with.run.pct(0.50),
            without.run.pct(0.50),
            "ms",
        ),
        (
            "reserve_p99_64",
            with.run.pct(0.99),
            without.run.pct(0.99),
            "ms",
        ),
        (
            "stockd_cpu_per_reservation",
            us(with.cpu_stockd, with.run.calls),
            us(without.cpu_stockd, without.run.calls),
            "µs",
        ),
        (
            "redis_cpu_per_reservation",
            us(with.cpu_redis, with.run.calls),
            us(without.cpu_redis, without.run.calls),
            "µs (masters and replicas)",
        ),
        (
            "reservations_per_call",
            with.batch_mean,
            without.batch_mean,
            "reservations",
        ),
    ];
    let dir = std::env::var("RESULTS_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../results").to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let mut tsv = String::from("case\treplica_acks_1\treplica_acks_0\tratio\tunit\n");
    for (case, w, n, unit) in &rows {
        tsv.push_str(&format!("{case}\t{w:.3}\t{n:.3}\t{:.3}\t{unit}\n", w / n));
    }
    std::fs::write(format!("{dir}/stockd_replicas.tsv"), &tsv).unwrap();
    println!("\nstockd Reserve with and without replica acknowledgement: {conc} concurrent callers, {secs} s per case, {rounds} rounds");
    println!("Redis Cluster: 3 masters + 3 replicas, AOF everysec; 8 shards; release stockd child processes");
    let listed: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
    println!(
        "throughput ratio (acks 1 / acks 0) per round: {} (median {mid:.3}); the table shows the median round\n",
        listed.join(", ")
    );
    println!(
        "{:<30} {:>14} {:>14} {:>8}  unit",
        "case", "replica_acks=1", "replica_acks=0", "ratio"
    );
    for (case, w, n, unit) in &rows {
        println!("{case:<30} {w:>14.3} {n:>14.3} {:>8.3}  {unit}", w / n);
    }
    println!("\nresults: {dir}/stockd_replicas.tsv");
    println!("reproduce: deploy/bench/stockd.sh (both benchmarks) or BENCH_ONLY=replicas deploy/bench/stockd.sh");
}
