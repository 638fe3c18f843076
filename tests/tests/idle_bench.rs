#![cfg(all(feature = "orderd", feature = "stockd", feature = "gateway"))]
//! Idle CPU against the number of live activities (issue 15, item 5): stockd, orderd
//! and the gateway as child processes, with 10, 100 and 1,000 live activities (8
//! shards each) and no traffic; CPU from `/proc/<pid>/stat` (utime + stime) over
//! `IDLE_SECS` (default 30) per step. Two orderd run side by side, in their own
//! consumer groups on the same streams: one woken by `XADD` key-events (the default)
//! and one polling every `block_ms` (`consumer.keyspace_events = false`, the way every
//! orderd worked before: the anchor of the same run).
//!
//! After each idle window, `IDLE_PROBES` (default 5) reservations, each in a different
//! activity idle until then: the time from stockd's answer to the order row in MySQL,
//! for each orderd (the latency cost of sleeping instead of polling).
//!
//! Writes `${RESULTS_DIR:-results}/idle.tsv`. Run by `deploy/bench/idle.sh`; not part of
//! the suite's timing (no assertion on a figure). `IDLE_COUNTS=2,4 IDLE_SECS=2` is the
//! smoke mode; the suite runs `idle_bench_smoke` (2 and 4 activities, 1 s windows).

use std::time::{Duration, Instant};

use seckill_proto::pb::ReserveOutcome;
use seckill_tests::gateway::{spawn_gateway, EdgeDeps};
use seckill_tests::orderd::spawn_orderd_process;
use seckill_tests::stockd::{create_live_activities, reserve, spawn_stockd_process};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime 15.
    let get = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(14) + get(15)
}

fn clock_ticks_per_sec() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Orders in MySQL.
async fn orders(db: &TestDb) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders")
        .fetch_one(db.pool())
        .await
        .expect("count orders");
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark (minutes): deploy/bench/idle.sh"]
async fn idle_cpu_against_live_activities() {
    let counts: Vec<usize> = std::env::var("IDLE_COUNTS")
        .unwrap_or_else(|_| "10,100,1000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    run(
        &counts,
        env_or("IDLE_SECS", 30),
        env_or("IDLE_SETTLE_SECS", 8),
        env_or("IDLE_PROBES", 5),
        env_or("IDLE_SHARDS", 8),
        &std::env::var("RESULTS_DIR").unwrap_or_else(|_| "results".into()),
        false,
    )
    .await;
}

/// The bench's smoke mode in the suite: 2 then 4 activities, 1 s windows, one probe
/// each; it shows the script's path works (both orderd write the probe orders), not a
/// figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_bench_smoke() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().display().to_string();
    run(&[2, 4], 1, 2, 1, 2, &out, true).await;
    let tsv = std::fs::read_to_string(dir.path().join("idle.tsv")).expect("idle.tsv");
    assert!(
        tsv.starts_with("case\tours\tanchor\tratio\tunit\n"),
        "{tsv}"
    );
    assert_eq!(tsv.lines().count(), 1 + 2 * 6, "{tsv}");
}

/// The two orderd of a run, in their own consumer groups: woken by `XADD` key-events
/// (the default), or polling every `block_ms` (the anchor).
fn orderd_config(c: &mut orderd::Config, woken: bool) {
    c.consumer.group = if woken {
        "orderd-woken"
    } else {
        "orderd-polling"
    }
    .into();
    c.consumer.keyspace_events = woken;
    c.consumer.block_ms = 50;
    c.consumer.claim_idle_ms = 30_000;
    c.consumer.discovery_interval_ms = 2000;
}

/// The steps; with `strict`, every probe must become an order within 60 s.
async fn run(
    counts: &[usize],
    secs: u64,
    settle: u64,
    probes: usize,
    shards: u32,
    dir: &str,
    strict: bool,
) {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    // The shipped loop periods (the harness' child stockd checks every 200 ms).
    let stockd = spawn_stockd_process(&Deps::new(&cluster, &db), |c| {
        c.stock.fence_check_ms = 1000;
        c.stock.schedule_poll_ms = 1000;
    })
    .await;
    let deps = Deps::new(&cluster, &db);
    let mut orderd = spawn_orderd_process(&deps, |c| orderd_config(c, true)).await;
    let mut orderd_poll = spawn_orderd_process(&deps, |c| orderd_config(c, false)).await;
    let gateway = spawn_gateway(
        &EdgeDeps {
            redis: &cluster,
            stockd: &stockd.addr,
            orderd: &orderd.addr,
        },
        |_| {},
    )
    .await;
    let mut pids = [
        ("stockd", stockd.child.id().expect("stockd pid")),
        ("orderd (woken)", orderd.child.id().expect("orderd pid")),
        (
            "orderd (polling, anchor)",
            orderd_poll.child.id().expect("orderd pid"),
        ),
        ("gateway", gateway.child.id().expect("gateway pid")),
    ];
    let tck = clock_ticks_per_sec();
    let admin = stockd.admin_client().await;
    let stock = stockd.stock_client().await;
    let mut activities: Vec<(u64, u64)> = Vec::new();
    let mut rows: Vec<(String, f64, f64, &str)> = Vec::new();
    let mut table = Vec::new();
    let mut first: Option<Vec<f64>> = None;
    let mut probe_no = 0u64;
    for &n in counts {
        // Grow to n live activities (one item of 1,000 units each).
        let need = n.saturating_sub(activities.len());
        let made =
            create_live_activities(&admin, need, 1000, shards, Duration::from_secs(6 * 3600)).await;
        activities.extend(made);
        // Let discovery, group creation and the first claim passes finish (a group per
        // stream, created one after the other: longer with more streams).
        tokio::time::sleep(Duration::from_secs(settle + n as u64 / 40)).await;
        let before: Vec<u64> = pids.iter().map(|(_, p)| cpu_ticks(*p)).collect();
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let wall = t0.elapsed().as_secs_f64();
        let pct: Vec<f64> = pids
            .iter()
            .zip(&before)
            .map(|((_, p), b)| (cpu_ticks(*p).saturating_sub(*b)) as f64 / tck / wall * 100.0)
            .collect();
        // Latency after idle: one reservation each in `probes` idle activities, for
        // each orderd while the other is down (both read the same streams, and the
        // first to write an order deletes the entry for both). Down by SIGTERM and
        // started again afterwards, not frozen by SIGSTOP: a process frozen inside a
        // MySQL transaction (the timeout sweep's `FOR UPDATE`) keeps its locks, and
        // the other orderd's insert then waits out `innodb_lock_wait_timeout`.
        let mut lat_woken = Vec::new();
        let mut lat_poll = Vec::new();
        for woken in [true, false] {
            let lat = if woken { &mut lat_woken } else { &mut lat_poll };
            let other = if woken { &mut orderd_poll } else { &mut orderd };
            other.child.terminate(Duration::from_secs(15));
            for k in 0..probes.min(activities.len()) {
                let (a, s) = activities[(k * 7919 + probe_no as usize) % activities.len()];
                probe_no += 1;
                let before = orders(&db).await;
                let mut c = stock.clone();
                let user = format!("probe-{probe_no}");
                let r = reserve(&mut c, a, s, &user, "q").await.expect("reserve");
                assert_eq!(r.outcome(), ReserveOutcome::Reserved, "probe reservation");
                let t = Instant::now();
                // A figure, not an assertion: 60 s stands for "no order within 60 s".
                while orders(&db).await == before && t.elapsed() < Duration::from_secs(60) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                assert!(
                    !strict || orders(&db).await > before,
                    "no order within 60 s of a reservation"
                );
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                // Idle again before the next probe.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            *other = spawn_orderd_process(&deps, |c| orderd_config(c, !woken)).await;
            pids[if woken { 2 } else { 1 }].1 = other.child.id().expect("orderd pid");
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let (lw, lp) = (median(&mut lat_woken), median(&mut lat_poll));
        let anchor = first.get_or_insert_with(|| pct.clone()).clone();
        for (i, (name, _)) in pids.iter().enumerate() {
            rows.push((
                format!("{name} idle CPU, {n} activities (anchor: {})", counts[0]),
                pct[i],
                anchor[i],
                "% of a core",
            ));
        }
        rows.push((
            format!("woken vs polling orderd idle CPU, {n} activities"),
            pct[1],
            pct[2],
            "% of a core",
        ));
        rows.push((
            format!("entry -> MySQL order after idle, {n} activities (woken vs polling)"),
            lw,
            lp,
            "ms (median)",
        ));
        table.push(format!(
            "{n:>5} activities x {shards} shards: stockd {:6.2} %  orderd woken {:6.2} %  orderd polling {:6.2} %  gateway {:6.2} %  | order after idle: woken {lw:.1} ms, polling {lp:.1} ms",
            pct[0], pct[1], pct[2], pct[3]
        ));
        eprintln!("{}", table.last().expect("row"));
    }
    std::fs::create_dir_all(dir).expect("results dir");
    let mut tsv = String::from("case\tours\tanchor\tratio\tunit\n");
    for (case, ours, anchor, unit) in &rows {
        let ratio = if *anchor > 0.0 {
            ours / anchor
        } else {
            f64::NAN
        };
        tsv.push_str(&format!(
            "{case}\t{ours:.2}\t{anchor:.2}\t{ratio:.2}\t{unit}\n"
        ));
    }
    std::fs::write(format!("{dir}/idle.tsv"), tsv).expect("write idle.tsv");
    for line in orderd.log().lines().filter(|l| l.contains("wake")) {
        eprintln!("orderd: {line}");
    }
    println!("\nIdle CPU (% of one core over {secs} s, no traffic):");
    for line in &table {
        println!("{line}");
    }
}
