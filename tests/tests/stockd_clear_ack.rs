#![cfg(feature = "stockd")]
//! A sold-out clear lasts through a failover (`stockd/src/clear.rs`). A release brings a
//! unit of a sold-out item back and clears the item's flag on the activity's master; a
//! clear on that master alone is lost when it dies before its replica has it, and the
//! promoted replica still says "sold out" while a shard holds the unit. Nothing else
//! repairs that: the clear moves no reservation sequence, so no fence check sees the
//! promoted replica behind, and no rebuild follows.
//!
//! Here the activity master's replica is stopped and cut off, the buyer's unit is
//! released (its home shard is on another master, whose replica acknowledges the
//! release), and the activity master is killed. The clears stockd sends again are held
//! (fail point `stockd::clear::resend`) until the test has seen the promoted replica
//! still flag the item: the failover lost the clear. (The test used to count, instead,
//! the clears sent again that found the flag back, and failed when one ran uncounted: its
//! caller timed out while it waited in the acknowledgement lane behind the failover, and
//! it ran later.) Then the flag must be gone, and the unit must sell.
//!
//! A test binary of its own: a fail point is process-wide.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seckill_lua::keys;
use seckill_proto::pb;
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::redis::{user_on_shard, Persistence};
use seckill_tests::stockd::{
    create_published_activity, replica_acked, reserve, reserve_after_failover, set_shard_stock,
    sold_out_flagged, spawn_stockd,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 8;
/// How long the replica is stopped: the release and the kill of the master happen
/// within it.
const STALL_MS: u64 = 4000;
const RESEND: &str = "stockd::clear::resend";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_clear_no_replica_acknowledged_survives_a_failover() {
    init_tracing();
    let mut cluster = RedisCluster::start_replicated(3, 1, Persistence::None);
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), replica_acked).await;
    let act = create_published_activity(&h, &[(1, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    let mut c = h.stock_client().await;

    // The activity's own keys (the flag, the change count) on one master; the buyer's
    // home shard, holding the one unit, on another.
    let central = cluster.master_of_key(&keys::changes(a, s));
    let home = (0..SHARDS)
        .find(|&i| cluster.master_of_key(&keys::stock(a, i, s)) != central)
        .expect("a shard off the activity's master");
    let mut stock = vec![0; SHARDS as usize];
    stock[home as usize] = 1;
    set_shard_stock(&redis, a, s, &stock).await;

    // The unit sells; the item is marked sold out, on the replica too.
    let buyer = user_on_shard("buyer", home, SHARDS);
    let r = reserve(&mut c, a, s, &buyer, "r").await.expect("reserve");
    assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{r:?}");
    let until = Instant::now() + Duration::from_secs(10);
    while !sold_out_flagged(&redis, a, s).await {
        assert!(
            Instant::now() < until,
            "the sold-out item was never flagged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::task::block_in_place(|| cluster.wait_replicas_caught_up(central));

    // The clears sent again wait until the test has looked at the promoted replica.
    let holding = Arc::new(AtomicBool::new(true));
    {
        let holding = holding.clone();
        fail::cfg_callback(RESEND, move || {
            tokio::task::block_in_place(|| {
                let until = Instant::now() + Duration::from_secs(60);
                while holding.load(Ordering::SeqCst) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        })
        .unwrap();
    }

    // The activity master's replica stops, and its link is cut: what the master writes
    // from now on reaches no replica before it dies.
    let replica = cluster.replicas_of(central)[0];
    let stall = cluster.stall(replica, STALL_MS);
    cluster.cli_at(central, &["CLIENT", "KILL", "TYPE", "replica"]);
    let released = c
        .release(pb::ReleaseRequest {
            reservation_id: r.reservation_id.clone(),
            user_id: buyer.clone(),
            reason: "cancelled".into(),
        })
        .await
        .expect("release (its shard's replica acknowledges it)")
        .into_inner();
    assert_eq!(released.outcome(), pb::ReleaseOutcome::Released);
    assert!(
        !sold_out_flagged(&redis, a, s).await,
        "the release cleared the flag on the master"
    );
    assert!(
        h.metrics.sold_out_clears_unacked.get() >= 1,
        "the clear was acknowledged: the replica was not cut off"
    );

    // The master dies before its replica has the clear; the replica takes over, and the
    // old master comes back as its replica.
    tokio::task::block_in_place(|| cluster.fail_over_to_stalled_replica(central, replica, stall));
    tokio::task::block_in_place(|| cluster.restart(central));

    // The promoted replica still flags the item: the failover lost the clear. Then the
    // clears sent again go, and clear it. (A client of the new topology: the harness's
    // does not reconnect.)
    let redis = cluster.client().await;
    assert!(
        sold_out_flagged(&redis, a, s).await,
        "the promoted replica had the clear: the failover lost nothing, and this test \
         would prove nothing"
    );
    holding.store(false, Ordering::SeqCst);
    let until = Instant::now() + Duration::from_secs(30);
    while sold_out_flagged(&redis, a, s).await {
        assert!(
            Instant::now() < until,
            "the item is flagged sold out while its home shard holds the released unit"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Only a clear sent again clears it here; it is not always counted in
    // `stockd_sold_out_flags_back_total` (see the module doc), so the count is not
    // asserted.
    fail::remove(RESEND);
    let next = user_on_shard("next", home, SHARDS);
    let r = reserve_after_failover(&mut c, a, s, &next, "r")
        .await
        .unwrap_or_else(|e| panic!("{next}: {e:?}"));
    assert_eq!(
        r.outcome(),
        ReserveOutcome::Reserved,
        "the released unit sells"
    );
}
