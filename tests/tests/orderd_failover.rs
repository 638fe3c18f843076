#![cfg(feature = "orderd")]
//! A stock return survives a failover to a replica that never received it.
//!
//! orderd's relay marks an outbox row done only once `redis.replica_acks` replicas hold
//! the release. Here the replica of the shard's master stalls and loses its link, a
//! cancel's release lands on the master alone, the master dies, and the lagging replica
//! is promoted without the release: the unit is missing from Redis and the buyer's old
//! record is back. The row is still pending, so the relay releases again on the new
//! master; with no replica there yet that release is not acknowledged either, and once
//! the old master rejoins as a replica the next pass answers NOT_HELD, rewrites the
//! fence, and its `WAIT` covers the release. Without the acknowledgement the row was done
//! after the first release, and the unit stayed lost.

use std::time::{Duration, Instant};

use seckill_lua::keys;
use seckill_proto::pb::ChangeOutcome;
use seckill_tests::orderd::{
    mysql_stock, reserve_direct, seed_activity, spawn_orderd, wait_orders, OrderdHandle,
};
use seckill_tests::process::{wait_until, wait_until_async};
use seckill_tests::redis::{user_on_shard, Persistence};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

/// How long the replica is stopped: the cancel, the relay's release and the kill of the
/// master happen within it.
const STALL_MS: u64 = 6000;

fn acked(c: &mut orderd::config::Config) {
    c.redis.replica_acks = 1;
    c.redis.replica_ack_timeout_ms = 100;
    c.redis.timeout_ms = 1000;
}

/// Waits until `orderd`'s relay has left a return pending for want of a replica's
/// acknowledgement at least once.
async fn unacknowledged(orderd: &OrderdHandle, what: &str, within: Duration) {
    wait_until_async(what, within, || async {
        orderd
            .metrics
            .stock_return_retries
            .with_label_values(&["unreplicated"])
            .get()
            >= 1
    })
    .await;
}

/// Returns `orderd` marked done after finding the record gone (NOT_HELD).
fn not_held(orderd: &OrderdHandle) -> u64 {
    orderd
        .metrics
        .stock_returns
        .with_label_values(&["not_held"])
        .get()
}

/// One unit of a one-shard sale held by bob's pending order, on a replicated cluster
/// whose replica of the shard's master holds it too; orderd runs with `replica_acks`.
struct Sold {
    cluster: RedisCluster,
    db: TestDb,
    orderd: OrderdHandle,
    /// bob's reservation (and order) id.
    rid: String,
    s: u64,
    stock_key: String,
    buyers_key: String,
    master: u16,
    replica: u16,
}

async fn sold_to_bob(persistence: Persistence) -> Sold {
    init_tracing();
    let cluster = RedisCluster::start_replicated(3, 1, persistence);
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, 1, &[(5, 100)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let stock_key = keys::stock(a, 0, s);
    let master = cluster.master_of_key(&keys::fence(a, 0));
    let replica = cluster.replicas_of(master)[0];
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), acked).await;
    let r = reserve_direct(&redis, a, s, 1, "bob", "req").await;
    assert_eq!(r.outcome, "RESERVED");
    wait_orders(&db, 1, Duration::from_secs(30)).await;
    // The replica holds the reservation (the script's writes replicate together).
    tokio::task::block_in_place(|| {
        wait_until(
            "the replica holds the reservation",
            Duration::from_secs(10),
            || cluster.get_on(replica, &stock_key).as_deref() == Some("4"),
        )
    });
    Sold {
        orderd,
        rid: r.rid,
        s,
        buyers_key: keys::buyers(a, 0, s),
        stock_key,
        master,
        replica,
        cluster,
        db,
    }
}

/// bob cancels: the order's unit goes back through the relay.
async fn cancel(orderd: &OrderdHandle, rid: &str) {
    let done = orderd.cancel(rid, "bob").await.unwrap();
    assert_eq!(done.outcome(), ChangeOutcome::Applied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_return_no_replica_acknowledged_is_released_again_after_a_failover_loses_it() {
    let Sold {
        mut cluster,
        db,
        orderd,
        rid,
        s,
        stock_key,
        buyers_key,
        master,
        replica,
    } = sold_to_bob(Persistence::AofEverySec).await;

    // The replica stalls and loses its link; bob cancels; the release reaches the master
    // only, and the relay's WAIT times out.
    let stall = cluster.stall(replica, STALL_MS);
    cluster.cli_at(master, &["CLIENT", "KILL", "TYPE", "replica"]);
    cancel(&orderd, &rid).await;
    unacknowledged(
        &orderd,
        "the relay released on the master and no replica acknowledged it",
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(cluster.get_on(master, &stock_key).as_deref(), Some("5"));
    // orderd stops, so nothing releases again before the failover is looked at.
    orderd.stop().await.unwrap();

    // The master dies; the lagging replica takes over without the release.
    tokio::task::block_in_place(|| cluster.fail_over_to_stalled_replica(master, replica, stall));
    let promoted = replica;
    assert_eq!(
        cluster.get_on(promoted, &stock_key).as_deref(),
        Some("4"),
        "the failover lost the release (else this test proves nothing)"
    );
    assert_eq!(
        pending_returns(&db).await,
        1,
        "the unacknowledged return is still pending"
    );

    // orderd again: it releases on the new master, which has no replica yet.
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), acked).await;
    unacknowledged(
        &orderd,
        "the relay released on the new master, which has no replica",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(cluster.get_on(promoted, &stock_key).as_deref(), Some("5"));
    // The old master rejoins as the new one's replica; the row is done once it holds
    // the release.
    tokio::task::block_in_place(|| cluster.restart(master));
    wait_until_async("the return is done", Duration::from_secs(30), || async {
        pending_returns(&db).await == 0
    })
    .await;
    assert_eq!(
        not_held(&orderd),
        1,
        "the acknowledged pass found the record gone (released by the pass before it)"
    );
    // Done means a replica holds it: read it there, without waiting.
    assert_eq!(cluster.master_of(master), promoted);
    assert_eq!(cluster.get_on(master, &stock_key).as_deref(), Some("5"));
    assert_eq!(cluster.get_on(promoted, &stock_key).as_deref(), Some("5"));
    // (redis-cli, not the test's client: that one still knows the killed master.)
    let held = cluster.cli_at(promoted, &["HGET", &buyers_key, "bob"]);
    assert_eq!(held.trim(), "", "bob's record is gone: he may buy again");
    assert_eq!(mysql_stock(&db, s).await, 5);
}

/// The retry of an unacknowledged return comes from a new connection (here a new orderd)
/// and finds the record gone (NOT_HELD). It must still wait for a replica: a `WAIT` on a
/// connection that has sent nothing counts every connected replica at once (checked by
/// hand on Redis 7.0: a stalled replica is counted), so a retry that skipped the wait,
/// or a `WAIT` before any command, would mark the row done while the stalled replica
/// still lacks the release. The script's NOT_HELD also rewrites the fence, for servers
/// that move a connection's offset on writes only (7.0 moves it on reads too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_return_on_a_new_connection_waits_for_the_replica_too() {
    let Sold {
        cluster,
        db,
        orderd,
        rid,
        stock_key,
        replica,
        ..
    } = sold_to_bob(Persistence::None).await;

    // The replica stalls (its link stays up: it is still counted as connected).
    let stalled_at = Instant::now();
    let stall = cluster.stall(replica, STALL_MS);
    cancel(&orderd, &rid).await;
    unacknowledged(
        &orderd,
        "the first release, unacknowledged",
        Duration::from_secs(3),
    )
    .await;
    orderd.stop().await.unwrap();

    // A new orderd retries on connections of its own.
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), acked).await;
    unacknowledged(
        &orderd,
        "the retry (NOT_HELD), unacknowledged while the replica is stalled",
        Duration::from_secs(3),
    )
    .await;
    assert!(
        stalled_at.elapsed() < Duration::from_millis(STALL_MS - 500),
        "the replica was stalled all along"
    );
    assert_eq!(
        pending_returns(&db).await,
        1,
        "not done while no replica holds it"
    );
    assert_eq!(not_held(&orderd), 0);
    // The operators see it: one return waiting (the gauges are read from MySQL at start
    // and every 5 s), since the cancel.
    wait_until_async(
        "the pending-return gauges",
        Duration::from_secs(6),
        || async {
            orderd.metrics.stock_returns_pending.get() == 1
                && orderd.metrics.stock_return_oldest_pending_seconds.get() > 0.0
        },
    )
    .await;

    // The replica runs again: the next pass is acknowledged, and the replica holds it.
    stall.join();
    wait_until_async("the return is done", Duration::from_secs(30), || async {
        pending_returns(&db).await == 0
    })
    .await;
    assert_eq!(cluster.get_on(replica, &stock_key).as_deref(), Some("5"));
    assert_eq!(not_held(&orderd), 1);
    wait_until_async("the gauges drop to 0", Duration::from_secs(12), || async {
        orderd.metrics.stock_returns_pending.get() == 0
            && orderd.metrics.stock_return_oldest_pending_seconds.get() == 0.0
    })
    .await;
}

/// The relay's sold-out clear waits for a replica too. A cancelled unit of a sold-out
/// item comes back with two writes on two masters: the release on its shard's master,
/// and the clear of the flag (and a raise of the change count) on the activity's own.
/// Here the activity master's replica stalls and loses its link, the release is
/// acknowledged by its own shard's replica, and the clear lands on the activity master
/// alone, which dies. The promoted replica still has the flag, hiding the unit from the
/// buyers of every other home shard. The row stays pending until a pass's clear is
/// acknowledged: the next pass answers NOT_HELD and clears again on the new master. With
/// the clear unacknowledged the row was done after the first pass, and the flag stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_clear_no_replica_acknowledged_is_made_again_after_a_failover_loses_it() {
    const SHARDS: u32 = 8;
    init_tracing();
    let mut cluster = RedisCluster::start_replicated(3, 1, Persistence::None);
    let db = TestDb::create().await;
    let redis = cluster.client().await;
    let seeded = seed_activity(&redis, &db, SHARDS, &[(SHARDS, 100)]).await;
    let (a, s) = (seeded.activity, seeded.items[0]);
    let flag = keys::sold_out(a, s);
    let central = cluster.master_of_key(&keys::changes(a, s));
    let home = (0..SHARDS)
        .find(|&i| cluster.master_of_key(&keys::stock(a, i, s)) != central)
        .expect("a shard off the activity's master");
    let user = user_on_shard("carol", home, SHARDS);
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), acked).await;
    let r = reserve_direct(&redis, a, s, SHARDS, &user, "req").await;
    assert_eq!(r.outcome, "RESERVED");
    wait_orders(&db, 1, Duration::from_secs(30)).await;
    // The item is marked sold out (as stockd would mark it), on the replica too.
    assert_eq!(cluster.cli_at(central, &["SET", &flag, "1"]).trim(), "OK");
    tokio::task::block_in_place(|| cluster.wait_replicas_caught_up(central));

    // The activity master's replica stalls and loses its link; the buyer cancels.
    let replica = cluster.replicas_of(central)[0];
    let stall = cluster.stall(replica, STALL_MS);
    cluster.cli_at(central, &["CLIENT", "KILL", "TYPE", "replica"]);
    let done = orderd.cancel(&r.rid, &user).await.unwrap();
    assert_eq!(done.outcome(), ChangeOutcome::Applied);
    unacknowledged(
        &orderd,
        "the relay cleared the flag on the master and no replica acknowledged it",
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(
        cluster.get_on(central, &flag),
        None,
        "the clear reached the master"
    );
    // orderd stops, so nothing clears again before the failover is looked at.
    orderd.stop().await.unwrap();

    // The master dies; the lagging replica takes over with the flag still set.
    tokio::task::block_in_place(|| cluster.fail_over_to_stalled_replica(central, replica, stall));
    let promoted = replica;
    assert_eq!(
        cluster.get_on(promoted, &flag).as_deref(),
        Some("1"),
        "the failover lost the clear (else this test proves nothing)"
    );
    assert_eq!(
        pending_returns(&db).await,
        1,
        "the return whose clear no replica acknowledged is still pending"
    );

    // orderd again, and the old master back as the new one's replica: the row is done
    // once a replica holds a clear, and the flag is gone from the new master.
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), acked).await;
    tokio::task::block_in_place(|| cluster.restart(central));
    wait_until_async("the return is done", Duration::from_secs(30), || async {
        pending_returns(&db).await == 0
    })
    .await;
    assert_eq!(cluster.master_of(central), promoted);
    for node in [promoted, central] {
        assert_eq!(
            cluster.get_on(node, &flag),
            None,
            "the flag is cleared on {node}, master and replica"
        );
    }
    assert_eq!(
        not_held(&orderd),
        1,
        "the second pass found the release done"
    );
    assert_eq!(mysql_stock(&db, s).await, i64::from(SHARDS));
}

async fn pending_returns(db: &TestDb) -> i64 {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM stock_return_outbox WHERE done_at IS NULL")
            .fetch_one(db.pool())
            .await
            .unwrap();
    n
}
