//! The harness itself: its parts come up real and go away with their handles.

use seckill_tests::mysql::mariadb_client;
use seckill_tests::process::port_open;
use seckill_tests::{MariaDb, RedisCluster, TestDb};
use std::time::{Duration, Instant};

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

#[tokio::test]
async fn a_three_master_cluster_comes_up_serves_every_slot_and_goes_away() {
    use fred::prelude::*;
    let started = Instant::now();
    let cluster = RedisCluster::start();
    let took = started.elapsed();
    eprintln!("3-master cluster ready in {took:?}");
    let ports = cluster.ports();
    assert_eq!(ports.len(), 3);
    for p in &ports {
        let info = cluster.cli(
            ports.iter().position(|q| q == p).unwrap(),
            &["CLUSTER", "INFO"],
        );
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    }
    let client = cluster.client().await;
    // Keys of many hash tags land on every master.
    for a in 0..64u64 {
        let key = seckill_lua::keys::stock(a, 0, 1);
        let _: () = client.set(&key, a as i64, None, None, false).await.unwrap();
        let back: i64 = client.get(&key).await.unwrap();
        assert_eq!(back, a as i64);
    }
    let mut used = 0;
    for i in 0..3 {
        let n: i64 = cluster.cli(i, &["DBSIZE"]).trim().parse().unwrap();
        used += usize::from(n > 0);
    }
    assert_eq!(used, 3, "keys spread over every master");
    client.quit().await.unwrap();
    drop(cluster);
    for p in ports {
        assert!(!port_open(p), "node on {p} still running after drop");
    }
}

#[tokio::test]
async fn migrations_apply_on_an_empty_database_and_again_as_a_no_op() {
    let db = TestDb::create().await;
    // A second run is a no-op.
    seckill_daemon::migrator().run(db.pool()).await.unwrap();
    let tables: Vec<(String,)> = sqlx::query_as(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() ORDER BY table_name",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    let names: Vec<&str> = tables.iter().map(|t| t.0.as_str()).collect();
    for want in [
        "activities",
        "activity_items",
        "dead_letters",
        "orders",
        "payment_callbacks",
        "stock_log",
        "stock_return_outbox",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
}

#[tokio::test]
async fn one_active_order_per_user_and_item_but_a_rebuy_after_a_cancel() {
    let db = TestDb::create().await;
    let pool = db.pool();
    sqlx::query("INSERT INTO activities (title, start_at, end_at, shard_count) VALUES ('t', NOW(), NOW() + INTERVAL 1 HOUR, 8)")
        .execute(pool)
        .await
        .unwrap();
    let insert = |id: &'static str, status: &'static str| {
        sqlx::query(
            "INSERT INTO orders (id, activity_id, item_id, user_id, request_id, shard, amount_cents, status, reserved_at) \
             VALUES (?, 1, 1, 'u1', ?, 0, 100, ?, NOW())",
        )
        .bind(id)
        .bind(id)
        .bind(status)
    };
    insert("1-1-0-a-1", "PENDING").execute(pool).await.unwrap();
    let dup = insert("1-1-0-a-2", "PENDING").execute(pool).await;
    assert!(
        dup.is_err(),
        "a second active order for the same user and item"
    );
    sqlx::query("UPDATE orders SET status = 'CANCELLED' WHERE id = '1-1-0-a-1'")
        .execute(pool)
        .await
        .unwrap();
    insert("1-1-0-a-2", "PAID").execute(pool).await.unwrap();
    insert("1-1-0-a-3", "FAILED").execute(pool).await.unwrap();
    let unsigned = sqlx::query("UPDATE activity_items SET stock = stock - 1 WHERE stock = 0")
        .execute(pool)
        .await;
    assert!(unsigned.is_ok());
}

/// The deadlock this guards against hung CI for an hour: a test's daemon in-process,
/// on the test's one runtime thread, holds a transaction open (the timeout sweep's
/// `SELECT .. FOR UPDATE`) when the test ends and its `TestDb` drops. Had the drop
/// waited for `DROP DATABASE`, it would wait on that transaction's metadata lock,
/// and only this thread, blocked in the drop, could ever end the transaction.
#[tokio::test]
async fn dropping_a_test_db_never_waits_for_a_transaction_of_its_own_runtime() {
    let server = MariaDb::start();
    let db = TestDb::create_on(&server.server_url()).await;
    let name = db.name.clone();
    let mut tx = db.pool().begin().await.unwrap();
    let (conn_id,): (u64,) = sqlx::query_as("SELECT CONNECTION_ID()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT * FROM orders FOR UPDATE")
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    // A watchdog: if the drop still blocks after 20 s, it kills the transaction's
    // connection from outside, so this test fails instead of hanging.
    let (dropped, watch) = std::sync::mpsc::channel::<()>();
    let port = server.port();
    let watchdog = std::thread::spawn(move || {
        if watch.recv_timeout(Duration::from_secs(20)).is_ok() {
            return true;
        }
        let _ = mariadb_client("127.0.0.1", port)
            .arg("-e")
            .arg(format!("KILL {conn_id}"))
            .output();
        false
    });
    drop(db);
    let _ = dropped.send(());
    assert!(
        watchdog.join().unwrap(),
        "TestDb's drop blocked on a transaction held by the test's own runtime"
    );
    // Once the transaction ends, the database goes.
    tx.rollback().await.unwrap();
    let admin = sqlx::MySqlPool::connect(&server.server_url())
        .await
        .unwrap();
    seckill_tests::process::wait_until_async(
        "the dropped database to go",
        Duration::from_secs(30),
        || async {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?",
            )
            .bind(&name)
            .fetch_one(&admin)
            .await
            .unwrap();
            n == 0
        },
    )
    .await;
}

#[test]
fn an_owned_mariadb_stops_restarts_and_leaves_nothing_behind() {
    let mut db = MariaDb::start();
    let port = db.port();
    assert!(port_open(port));
    db.stop();
    assert!(!port_open(port));
    db.restart();
    assert!(port_open(port));
    let pid_file = db.dir().join("mysqld.pid");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    drop(db);
    assert!(!pid_alive(pid), "mariadbd {pid} still alive after drop");
    assert!(!port_open(port));
}
