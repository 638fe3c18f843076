#![cfg(feature = "stockd")]
//! A rebalancing take that finds its donor empty: the round's read saw a unit on the
//! donor shard, and the donor's own buyer reserved it before the take came. The unit
//! sold once; the take moved nothing (`stockd_rebalance_takes_empty_total`), so the
//! round's look decides, and with every shard empty and nothing in transit the
//! empty-home buyer hears SOLD_OUT (not a retry, and no unit is created).
//!
//! The fail point `stockd::move::before_take` holds the mover between the round's read
//! and its take while the donor's buyer reserves through a second stockd of the fleet
//! (a child process: the fail point holds a thread of this process's runtime). Needs
//! `cargo build -p stockd --bins`.
//!
//! A test binary of its own: a fail point is process-wide.

use std::sync::{mpsc, Mutex};
use std::time::Duration;

use seckill_proto::pb::ReserveOutcome;
use seckill_tests::redis::user_on_shard;
use seckill_tests::stockd::{
    create_published_activity, look_at, reserve, set_shard_stock, sold_out_flagged, spawn_stockd,
    spawn_stockd_process, stock_client, takes,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 4;
const BEFORE_TAKE: &str = "stockd::move::before_take";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_that_lost_its_unit_to_the_donors_own_buyer_ends_in_sold_out_with_one_sale() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    let h = spawn_stockd(&deps, |_| {}).await;
    let act = create_published_activity(&h, &[(1, 100)], SHARDS, Duration::ZERO, HOUR).await;
    // The rest of the fleet: where the donor's own buyer reserves.
    let peer = spawn_stockd_process(&deps, |_| {}).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    let mut c = h.stock_client().await;
    // The one unit on the last shard; the buyer's home (shard 0) is empty.
    let donor = SHARDS - 1;
    set_shard_stock(&redis, a, s, &[0, 0, 0, 1]).await;

    // The mover stops before its take until the donor's buyer has reserved.
    let (reached_tx, reached_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (reached_tx, go_rx) = (Mutex::new(reached_tx), Mutex::new(go_rx));
    fail::cfg_callback(BEFORE_TAKE, move || {
        let _ = reached_tx.lock().unwrap().send(());
        let _ = go_rx.lock().unwrap().recv_timeout(Duration::from_secs(20));
    })
    .unwrap();
    let local = {
        let addr = peer.addr.clone();
        std::thread::spawn(move || {
            reached_rx
                .recv_timeout(Duration::from_secs(20))
                .expect("the round's read saw the unit and its take was about to run");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let outcome = rt.block_on(async move {
                let mut c = stock_client(&addr).await;
                let user = user_on_shard("local", donor, SHARDS);
                reserve(&mut c, a, s, &user, "r").await.map(|r| r.outcome())
            });
            let _ = go_tx.send(());
            outcome
        })
    };
    let takes_before = takes(&h);
    let empty_before = h.metrics.rebalance_takes_empty.get();
    let sold_out_rounds = || {
        h.metrics
            .rebalance_round_outcomes
            .with_label_values(&["sold_out"])
            .get()
    };
    let sold_out_before = sold_out_rounds();
    let away = user_on_shard("away", 0, SHARDS);
    let r = tokio::time::timeout(Duration::from_secs(30), reserve(&mut c, a, s, &away, "r"))
        .await
        .expect("an answer once the take ran");
    fail::remove(BEFORE_TAKE);
    let local = local.join().unwrap();

    assert_eq!(
        local.expect("the donor's buyer reserves"),
        ReserveOutcome::Reserved,
        "the donor's own buyer took the unit"
    );
    assert_eq!(
        r.expect("an answer, not an error").outcome(),
        ReserveOutcome::SoldOut,
        "every shard empty and nothing in transit after the lost take"
    );
    assert_eq!(takes(&h) - takes_before, 1, "one take, on the donor");
    assert_eq!(
        h.metrics.rebalance_takes_empty.get() - empty_before,
        1,
        "the take found the donor empty"
    );
    assert_eq!(sold_out_rounds() - sold_out_before, 1);
    // One sale: no unit left, none in transit, none created by the lost move.
    for i in 0..SHARDS {
        assert_eq!(look_at(&redis, a, i, s).await, (0, 0, 0), "shard {i}");
    }
    assert!(sold_out_flagged(&redis, a, s).await);
}
