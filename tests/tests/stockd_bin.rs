#![cfg(feature = "stockd")]
//! The `stockd` and `seckillctl` binaries as an operator runs them. Needs
//! `cargo build -p stockd --bins` first.

use seckill_tests::Deps;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use seckill_proto::pb::{self, ReserveOutcome};
use seckill_tests::process::workspace_bin;
use seckill_tests::stockd::{
    create_published_activity_with, reserve, spawn_stockd, spawn_stockd_process,
};
use seckill_tests::{init_tracing, RedisCluster, TestDb, SERVICE_TOKEN};

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

#[test]
fn stockd_dash_t_accepts_the_shipped_config_and_names_the_field_of_a_bad_one() {
    let out = Command::new(workspace_bin("stockd"))
        .args(["-t", "-c"])
        .arg(repo("deploy/local/stockd.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    for (text, field) in [
        (
            "[grpc]\nservice_token = \"t\"\n[redis]\nnodes = []\n[mysql]\nurl = \"mysql://r@h/d\"\n",
            "redis.nodes",
        ),
        (
            "[grpc]\nservice_token = \"t\"\nport = 1\n[redis]\nnodes = [\"h:1\"]\n[mysql]\nurl = \"mysql://r@h/d\"\n",
            "grpc",
        ),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = Command::new(workspace_bin("stockd"))
            .args(["-t", "-c"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("bad.toml: {field}")), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    // An environment override is validated too.
    let out = Command::new(workspace_bin("stockd"))
        .args(["-t", "-c"])
        .arg(repo("deploy/local/stockd.toml"))
        .env("STOCKD__REDIS__TIMEOUT_MS", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("redis.timeout_ms"));
}

fn ctl(addr: &str, args: &[&str]) -> std::process::Output {
    Command::new(workspace_bin("seckillctl"))
        .args(["--stockd", addr, "--token", SERVICE_TOKEN])
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test]
async fn seckillctl_creates_publishes_and_reports_an_activity_from_the_example_file() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let addr = h.addr.clone();
    let example = repo("deploy/local/activity.toml");
    let out = tokio::task::spawn_blocking(move || {
        ctl(
            &addr,
            &[
                "activity",
                "create",
                "--file",
                example.to_str().unwrap(),
                "--json",
            ],
        )
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(created["status"], "DRAFT");
    assert_eq!(created["items"].as_array().unwrap().len(), 2);
    let id = created["id"].as_u64().unwrap().to_string();
    let addr = h.addr.clone();
    let outs = tokio::task::spawn_blocking(move || {
        vec![
            ctl(&addr, &["activity", "publish", &id, "--json"]),
            ctl(&addr, &["activity", "status", &id, "--json"]),
            ctl(&addr, &["activity", "list", "--json"]),
            ctl(&addr, &["reconcile", &id, "--json"]),
            ctl(
                &addr,
                &[
                    "ban",
                    "192.168.0.0/16",
                    "--ttl-secs",
                    "60",
                    "--reason",
                    "test",
                    "--json",
                ],
            ),
            ctl(&addr, &["bans", "--json"]),
            ctl(&addr, &["unban", "192.168.0.0/16", "--json"]),
        ]
    })
    .await
    .unwrap();
    for o in &outs {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let json = |k: usize| -> serde_json::Value { serde_json::from_slice(&outs[k].stdout).unwrap() };
    assert_eq!(json(0)["warmed"], true);
    assert_eq!(json(0)["status"], "PUBLISHED");
    let status = json(1);
    assert_eq!(status["items"][0]["total"], 100);
    assert_eq!(status["items"][0]["remaining"], 100);
    assert_eq!(
        status["items"][0]["shard_remaining"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
    assert_eq!(json(2).as_array().unwrap().len(), 1);
    assert_eq!(json(3)[0]["consistent"], true);
    assert_eq!(json(5)[0]["cidr"], "192.168.0.0/16");
    assert_eq!(json(6)["removed"], true);
}

#[tokio::test]
async fn seckillctl_refuses_bad_input_with_a_clear_message_and_a_non_zero_exit() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(repo("deploy/local/activity.toml")).unwrap();
    let cases = [
        (
            base.replace("per_user_limit = 1", "per_user_limit = 1\ncolour = \"red\""),
            "colour",
        ),
        (
            base.replace("shard_count = 8", "shard_count = 0"),
            "shard_count",
        ),
        (
            base.replace("shard_count = 8", "shard_count = 2000"),
            "shard_count",
        ),
        (base.replace("stock = 100", "stock = 0"), "items[0].stock"),
        (base.replace("stock = 100", "stock = -3"), "items[0].stock"),
        (
            base.replace("end_at = \"now+2h\"", "end_at = \"now\""),
            "end_at",
        ),
        (
            base.replace("start_at = \"now+1m\"", "start_at = \"yesterday\""),
            "start_at",
        ),
    ];
    let addr = h.addr.clone();
    let paths: Vec<(PathBuf, &str)> = cases
        .iter()
        .enumerate()
        .map(|(k, (text, field))| {
            let p = dir.path().join(format!("bad-{k}.toml"));
            std::fs::write(&p, text).unwrap();
            (p, *field)
        })
        .collect();
    let results = tokio::task::spawn_blocking(move || {
        let mut v: Vec<(String, std::process::Output)> = paths
            .iter()
            .map(|(p, f)| {
                (
                    f.to_string(),
                    ctl(
                        &addr,
                        &["activity", "create", "--file", p.to_str().unwrap()],
                    ),
                )
            })
            .collect();
        v.push(("activity_id".into(), ctl(&addr, &["activity", "get", "0"])));
        v.push(("cidr".into(), ctl(&addr, &["ban", "not-an-ip"])));
        v.push(("<ID>".into(), ctl(&addr, &["activity", "publish", "abc"])));
        v.push(("list".into(), ctl(&addr, &["activity", "list", "--json"])));
        v
    })
    .await
    .unwrap();
    let (last, rest) = results.split_last().unwrap();
    for (field, out) in rest {
        assert!(!out.status.success(), "{field}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(field.as_str()), "{field}: {err}");
    }
    let list: serde_json::Value = serde_json::from_slice(&last.1.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 0, "nothing was created");
}

#[tokio::test]
async fn a_killed_stockd_process_restarts_and_the_sale_goes_on_without_oversell() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let mut p = spawn_stockd_process(&Deps::new(&cluster, &db), |_| {}).await;
    let mut admin = p.admin_client().await;
    let act = create_published_activity_with(
        &mut admin,
        &[(50, 100)],
        4,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let (a, s) = (act.id, act.items[0].id);
    let mut c = p.stock_client().await;
    let mut won = 0;
    for u in 0..20 {
        if reserve(&mut c, a, s, &format!("k{u}"), "r")
            .await
            .unwrap()
            .outcome()
            == ReserveOutcome::Reserved
        {
            won += 1;
        }
    }
    p.kill();
    let p2 = spawn_stockd_process(&Deps::new(&cluster, &db), |_| {}).await;
    let mut c = p2.stock_client().await;
    for u in 0..20 {
        let r = reserve(&mut c, a, s, &format!("k{u}"), "other")
            .await
            .unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Duplicate);
    }
    for u in 0..100 {
        if reserve(&mut c, a, s, &format!("n{u}"), "r")
            .await
            .unwrap()
            .outcome()
            == ReserveOutcome::Reserved
        {
            won += 1;
        }
    }
    assert_eq!(won, 50);
    let st = c
        .get_stock(pb::GetStockRequest {
            activity_id: a,
            item_id: s,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((st.remaining, st.reserved), (0, 50));
}

/// A start that fails after the log is up (here `grpc.listen` is taken) exits non-zero,
/// and its log ends with one plain line naming the daemon and the cause, after the same
/// error as a log line (which the log writer thread wrote before it, not after: the old
/// exit path wrote the queued copy last whenever the writer lost its race with
/// `eprintln`, every time in the runs that checked it).
#[test]
fn a_start_that_cannot_bind_exits_non_zero_and_its_last_line_says_why() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(workspace_bin("stockd"))
        .arg("-c")
        .arg(repo("deploy/local/stockd.toml"))
        .env("STOCKD__GRPC__LISTEN", &addr)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{log}");
    let lines: Vec<&str> = log.trim_end().lines().collect();
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last.starts_with(&format!("stockd: bind grpc.listen {addr}")),
        "the last line names the daemon and the cause: {last:?}\n{log}"
    );
    let logged = lines
        .iter()
        .position(|l| l.contains("ERROR") && l.contains("bind grpc.listen"))
        .unwrap_or_else(|| panic!("the error as a log line:\n{log}"));
    assert_eq!(logged, lines.len() - 2, "right before the last:\n{log}");
}
