//! SIGHUP reload of stockd and orderd as real processes (docs/operations.md, "Reload"):
//! a daemon that gets SIGHUP keeps serving; a good file's live field (`log.level`)
//! takes effect and every other changed field is named in a restart-needed warning; a
//! file that does not parse or does not validate is refused, logged, and the daemon
//! runs on. Needs `cargo build -p stockd -p orderd --bins` first.
#![cfg(any(feature = "stockd", feature = "orderd"))]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use seckill_tests::process::wait_until;
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

fn sighup(pid: u32) {
    let ok = Command::new("kill")
        .arg("-HUP")
        .arg(pid.to_string())
        .status()
        .expect("kill -HUP");
    assert!(ok.success(), "kill -HUP {pid}");
}

/// Edits the TOML file at `path` in place.
fn edit(path: &Path, tweak: impl FnOnce(&mut toml::Table)) {
    let mut table: toml::Table = std::fs::read_to_string(path)
        .expect("read config")
        .parse()
        .expect("config is TOML");
    tweak(&mut table);
    std::fs::write(path, table.to_string()).expect("write config");
}

fn set(table: &mut toml::Table, section: &str, key: &str, value: impl Into<toml::Value>) {
    table
        .entry(section)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .expect("a section")
        .insert(key.into(), value.into());
}

/// Sends SIGHUP and waits until the log holds one more line containing `marker`
/// than before; returns the log.
fn reload_and_wait(pid: u32, log: &dyn Fn() -> String, marker: &str) -> String {
    let before = log().matches(marker).count();
    sighup(pid);
    let mut text = String::new();
    wait_until(
        &format!("`{marker}` in the log after SIGHUP"),
        Duration::from_secs(20),
        || {
            text = log();
            text.matches(marker).count() > before
        },
    );
    text
}

/// The reload scenario both daemons pass: `serves` checks the daemon still answers.
async fn reload_scenario<F, Fut>(
    name: &str,
    pid: u32,
    config: &Path,
    log: &dyn Fn() -> String,
    mut running: impl FnMut() -> bool,
    mut serves: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let good = std::fs::read_to_string(config).unwrap();

    // A file that is not TOML: refused, logged, still serving.
    std::fs::write(config, "[grpc\n").unwrap();
    let text = reload_and_wait(pid, log, "reload refused");
    assert!(text.contains("not valid TOML"), "{name}: {text}");
    assert!(running(), "{name} died on a broken file:\n{text}");
    serves().await;

    // A file that parses but fails validation: refused naming the field.
    std::fs::write(config, &good).unwrap();
    edit(config, |t| set(t, "redis", "timeout_ms", 0));
    let text = reload_and_wait(pid, log, "reload refused");
    assert!(text.contains("redis.timeout_ms"), "{name}: {text}");
    assert!(running(), "{name} died on an invalid file:\n{text}");
    serves().await;

    // A good file: the log level applies live, a restart-needed field is named.
    std::fs::write(config, &good).unwrap();
    edit(config, |t| {
        set(t, "log", "level", "debug");
        set(t, "mysql", "max_connections", 3);
    });
    let before = log();
    assert!(
        !before.contains("DEBUG"),
        "{name} logged DEBUG lines at level info:\n{before}"
    );
    let text = reload_and_wait(pid, log, "config reloaded");
    assert!(
        text.contains("`mysql.max_connections` changed but needs a restart"),
        "{name}: {text}"
    );
    assert!(
        !text[before.len()..].contains("`log.level` changed"),
        "{text}"
    );
    // Debug events now pass the filter (the background loops' MySQL queries log at debug).
    let mut after = String::new();
    wait_until(
        &format!("{name} to log at debug after the reload"),
        Duration::from_secs(20),
        || {
            after = log();
            after[before.len()..].contains("DEBUG")
        },
    );
    assert!(running(), "{name} died on a good reload");
    serves().await;

    // The restart-needed field still differs from what runs: named again next time.
    let text = reload_and_wait(pid, log, "config reloaded");
    assert_eq!(
        text.matches("`mysql.max_connections` changed but needs a restart")
            .count(),
        2,
        "{name}: {text}"
    );
}

#[cfg(feature = "stockd")]
#[tokio::test]
async fn stockd_reloads_on_sighup_applies_the_log_level_and_survives_a_bad_file() {
    use seckill_proto::pb::ReserveOutcome;
    use seckill_tests::stockd::{create_published_activity_with, reserve, spawn_stockd_process};

    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let mut p = spawn_stockd_process(&Deps::new(&cluster, &db), |c| {
        c.log.level = Some("info".into());
    })
    .await;
    let mut admin = p.admin_client().await;
    let act = create_published_activity_with(
        &mut admin,
        &[(100, 100)],
        2,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let (a, s) = (act.id, act.items[0].id);
    let client = p.stock_client().await;
    let pid = p.child.id().expect("running");
    let config = p.dir.path().join("stockd.toml");
    let log_path = p.dir.path().join("stockd.log");
    let log = move || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut user = 0;
    let serves = || {
        user += 1;
        let (mut c, u) = (client.clone(), format!("u{user}"));
        async move {
            let r = reserve(&mut c, a, s, &u, "r").await.expect("reserve");
            assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{u}");
        }
    };
    let child = std::sync::Mutex::new(&mut p.child);
    reload_scenario(
        "stockd",
        pid,
        &config,
        &log,
        || child.lock().unwrap().is_running(),
        serves,
    )
    .await;
}

#[cfg(feature = "orderd")]
#[tokio::test]
async fn orderd_reloads_on_sighup_applies_the_log_level_and_survives_a_bad_file() {
    use seckill_proto::pb;
    use seckill_tests::orderd::{order_client, spawn_orderd_process};

    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let mut p = spawn_orderd_process(&Deps::new(&cluster, &db), |c| {
        c.log.level = Some("info".into());
    })
    .await;
    let pid = p.child.id().expect("running");
    let config = p.config_path();
    let log_path = p.log_path();
    let log = move || std::fs::read_to_string(&log_path).unwrap_or_default();
    let client = order_client(&p.addr).await;
    // Serving: a user's orders, read from MySQL (none).
    let serves = || {
        let mut c = client.clone();
        async move {
            let r = c
                .list_orders(pb::ListOrdersRequest {
                    user_id: "nobody".into(),
                    ..Default::default()
                })
                .await
                .expect("list orders");
            assert!(r.into_inner().orders.is_empty());
        }
    };
    let child = std::sync::Mutex::new(&mut p.child);
    reload_scenario(
        "orderd",
        pid,
        &config,
        &log,
        || child.lock().unwrap().is_running(),
        serves,
    )
    .await;
}
