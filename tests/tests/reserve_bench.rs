#![cfg(all(feature = "stockd", feature = "gateway"))]
//! `deploy/bench/reserve.sh` (issue 15: reservations through the edge versus the OpenResty
//! anchor) in its smoke mode: one short round on free ports, with the binaries of this test
//! profile. It asserts what the script itself checks in that mode: both stockd settings
//! (replica acks 0 and 1) behind their gateways and the nginx anchor answered every request
//! 202 (signed JWTs and purchase tokens accepted, distinct users, no sell-out), and the
//! result files have their rows (Redis alone, both scripts, included). No timing assertion: the figures are the script's job.
//!
//! Needs nginx with ngx_lua, wrk, redis-server, MariaDB (SECKILL_TEST_MYSQL_URL) and
//! `cargo build --workspace --bins`; the script installs the first three when missing.

use seckill_tests::process::workspace_bin;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_reserve_benchmark_runs_end_to_end_in_smoke_mode() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin_dir = workspace_bin("gateway")
        .parent()
        .expect("bin dir")
        .to_path_buf();
    // The binaries the script starts must exist in this profile.
    workspace_bin("stockd");
    workspace_bin("seckillctl");
    let tmp = std::env::temp_dir().join(format!("reserve-bench-smoke-{}", std::process::id()));
    let results = tmp.join("results");
    let out = Command::new("bash")
        .arg(root.join("deploy/bench/reserve.sh"))
        .current_dir(&root)
        .env("SMOKE", "1")
        .env("BIN_DIR", &bin_dir)
        .env("WORK", tmp.join("work"))
        .env("RESULTS_DIR", &results)
        .output()
        .expect("run deploy/bench/reserve.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "reserve.sh failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("every request of every side was answered 202"),
        "{stderr}"
    );
    let tsv = std::fs::read_to_string(results.join("reserve.tsv")).expect("reserve.tsv");
    for case in [
        "reserve_acks0_headline\t",
        "reserve_acks1\t",
        "reserve_acks0_headline_p99\t",
        "reserve_acks1_server_cpu\t",
        "redis_only_b4_master_cpu\t",
        "redis_only_b8_script_exec\t",
    ] {
        assert!(tsv.contains(case), "no row {case:?} in:\n{tsv}");
    }
    // Every answer counted was a 202 on both sides.
    for line in tsv.lines().filter(|l| l.contains("_not_202")) {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!((f[1], f[2]), ("0", "0"), "{line}");
    }
    // Redis alone (the script checks that every reservation reached the stream): the
    // execution time Redis counted for each script was measured.
    for line in tsv.lines().filter(|l| l.starts_with("redis_only_")) {
        let f: Vec<&str> = line.split('\t').collect();
        if line.contains("_script_exec") {
            let (ours, anchor): (f64, f64) =
                (f[1].parse().unwrap_or(0.0), f[2].parse().unwrap_or(0.0));
            assert!(ours > 0.0 && anchor > 0.0, "not measured: {line}");
        }
    }
    let cpu = std::fs::read_to_string(results.join("reserve_cpu.tsv")).expect("reserve_cpu.tsv");
    assert!(
        cpu.contains("anchor_nginx\t") && cpu.contains("ours_acks1\t"),
        "{cpu}"
    );
    // wrk's own CPU inside its clock and the cores busy meanwhile come from the marks
    // replay.lua prints (its request-file load left out): measured on every side.
    let header: Vec<&str> = cpu.lines().next().unwrap_or_default().split('\t').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (wrk, busy) = (col("wrk"), col("busy_cores"));
    for line in cpu.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        for i in [wrk, busy] {
            let v: f64 = f[i].parse().unwrap_or(0.0);
            assert!(v > 0.0, "{} not measured in: {line}", header[i]);
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
