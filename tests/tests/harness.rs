//! The harness itself: its parts come up real and go away with their handles.

use seckill_tests::mysql::mariadb_client;
use seckill_tests::process::port_open;
use seckill_tests::redis::{ClusterSpec, Persistence};
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

/// `SET key value` then `WAIT 1 wait_ms` on one connection to `port` (WAIT counts the
/// replicas that acknowledged this connection's writes): the number that did.
fn set_and_wait(cluster: &RedisCluster, port: u16, key: &str, value: &str, wait_ms: u64) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    write!(
        child.stdin.take().unwrap(),
        "SET {key} {value}\nWAIT 1 {wait_ms}\n"
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("OK"),
        "SET on {port} ({:?}): {out}",
        cluster.dir()
    );
    lines.next().unwrap_or_default().to_string()
}

#[test]
fn a_replicated_cluster_starts_with_one_synced_replica_per_master_that_sees_its_writes() {
    let started = Instant::now();
    let cluster = RedisCluster::start_replicated(3, 1, Persistence::AofEverySec);
    eprintln!("3 masters + 3 replicas ready in {:?}", started.elapsed());
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{masters:?}");
    assert_eq!(cluster.nodes().len(), 6, "the seed list names every node");
    let mut replicas = Vec::new();
    for &m in &masters {
        let r = cluster.replicas_of(m);
        assert_eq!(r.len(), 1, "replicas of {m}: {r:?}");
        assert_eq!(cluster.master_of(r[0]), m);
        let info = cluster.cli_at(m, &["CONFIG", "GET", "appendonly"]);
        assert!(info.contains("yes"), "AOF on {m}: {info}");
        replicas.extend(r);
    }
    replicas.sort_unstable();
    replicas.dedup();
    assert_eq!(replicas.len(), 3, "each replica follows one master");
    // Keys of many hash tags: each is written on its master and shows up on that
    // master's replica (and only there).
    for a in 0..12u64 {
        let key = seckill_lua::keys::stock(a, 0, 1);
        let master = cluster.master_of_key(&key);
        let replica = cluster.replicas_of(master)[0];
        assert_eq!(
            set_and_wait(&cluster, master, &key, &a.to_string(), 5000),
            "1"
        );
        assert_eq!(
            cluster.get_on(replica, &key),
            Some(a.to_string()),
            "{key} on {replica}"
        );
    }
    let dbsize = |ports: &[u16]| -> i64 {
        ports
            .iter()
            .map(|&p| {
                cluster
                    .cli_at(p, &["DBSIZE"])
                    .trim()
                    .parse::<i64>()
                    .unwrap()
            })
            .sum()
    };
    assert_eq!(dbsize(&replicas), 12, "each key on exactly one replica");
    assert_eq!(dbsize(&masters), 12);
}

#[tokio::test]
async fn a_killed_master_is_replaced_by_its_replica_and_comes_back_as_its_replica() {
    use fred::prelude::*;
    let mut cluster = RedisCluster::start_replicated(3, 1, Persistence::AofEverySec);
    let key = seckill_lua::keys::stock(7, 3, 1);
    let old = cluster.master_of_key(&key);
    let replica = cluster.replicas_of(old)[0];
    assert_eq!(set_and_wait(&cluster, old, &key, "41", 5000), "1");

    cluster.kill(old);
    assert!(!port_open(old));
    let started = Instant::now();
    let new = cluster.wait_for_failover(old, Duration::from_secs(30));
    eprintln!("failover in {:?}", started.elapsed());
    assert_eq!(new, replica, "the old master's replica took over");
    assert_eq!(cluster.master_of_key(&key), new);
    assert!(cluster.masters().contains(&new) && !cluster.masters().contains(&old));
    // The acknowledged write survived, and a cluster client finds the new master.
    let client = cluster.client().await;
    let v: i64 = client.incr(&key).await.unwrap();
    assert_eq!(v, 42);

    cluster.restart(old);
    assert_eq!(
        cluster.master_of(old),
        new,
        "the old master follows its replica"
    );
    assert_eq!(cluster.replicas_of(new), vec![old]);
    assert_eq!(cluster.get_on(old, &key), Some("42".into()));
    client.quit().await.unwrap();
}

#[test]
fn a_stalled_replica_acknowledges_nothing_until_it_resumes_then_catches_up() {
    let cluster = RedisCluster::start_replicated(3, 1, Persistence::None);
    let key = seckill_lua::keys::stock(9, 1, 2);
    let master = cluster.master_of_key(&key);
    let replica = cluster.replicas_of(master)[0];
    let stall = cluster.stall(replica, 800);
    // The stall has begun when stall() returns: this write is not acknowledged.
    assert_eq!(set_and_wait(&cluster, master, &key, "v1", 300), "0");
    stall.join();
    seckill_tests::process::wait_until("the replica to catch up", Duration::from_secs(20), || {
        cluster.get_on(replica, &key).as_deref() == Some("v1")
    });
    assert_eq!(
        cluster.master_of(replica),
        master,
        "a short stall is no failover"
    );
}

#[test]
fn a_master_stalled_past_the_node_timeout_is_failed_over_and_rejoins_as_a_replica() {
    let cluster = RedisCluster::start_replicated(3, 1, Persistence::None);
    let key = seckill_lua::keys::stock(4, 6, 1);
    let old = cluster.master_of_key(&key);
    let replica = cluster.replicas_of(old)[0];
    assert_eq!(set_and_wait(&cluster, old, &key, "kept", 5000), "1");
    // Stalled long enough for a second election: a replica whose first vote request
    // fails (the masters had not all marked the node failed yet, common on a loaded
    // machine) asks again only after 2 x max(node timeout, 2 s), and a master that
    // resumes before an election wins keeps its slots (seen once in a full run: 6 s).
    let stall = cluster.stall(old, 12_000);
    let new = cluster.wait_for_failover(old, Duration::from_secs(30));
    assert_eq!(new, replica);
    stall.join();
    cluster.wait_settled(Duration::from_secs(30));
    assert_eq!(
        cluster.master_of(old),
        new,
        "the resumed master follows its replica"
    );
    assert_eq!(cluster.get_on(old, &key), Some("kept".into()));
}

#[test]
fn min_replicas_to_write_makes_a_master_refuse_writes_while_its_replica_lags() {
    let spec = ClusterSpec::replicated(3, 1, Persistence::None).min_replicas(1, 1);
    let cluster = RedisCluster::start_spec(spec);
    let key = seckill_lua::keys::stock(5, 2, 3);
    let master = cluster.master_of_key(&key);
    let replica = cluster.replicas_of(master)[0];
    assert_eq!(
        cluster.cli_at(master, &["SET", &key, "before"]).trim(),
        "OK"
    );
    let stall = cluster.stall(replica, 6000);
    seckill_tests::process::wait_until(
        "the master to refuse a write",
        Duration::from_secs(5),
        || {
            cluster
                .cli_at(master, &["SET", &key, "during"])
                .contains("NOREPLICAS")
        },
    );
    stall.join();
    seckill_tests::process::wait_until(
        "the master to take writes again",
        Duration::from_secs(20),
        || cluster.cli_at(master, &["SET", &key, "after"]).trim() == "OK",
    );
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
