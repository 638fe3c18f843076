#![cfg(feature = "stockd")]
//! A rebalancing take that finds its donor empty reads the shards again before its next
//! take. The round's read saw one unit on each of two donors; before its first take
//! the donors' own buyers reserve both (through a second stockd of the fleet) and a
//! unit arrives on a third shard, which the read saw empty. The round then takes from
//! the third shard, not from the second donor the stale read named: one round, two
//! takes (one empty), and the empty-home buyer reserves in it. (Taking in turn from the
//! stale read's donors spent a second empty take, ended the round with nothing moved,
//! and sent the buyer round again: three takes, two rounds.)
//!
//! The fail point `stockd::move::before_take` holds the mover before its first take;
//! the peer is a child process (the fail point holds a thread of this process's
//! runtime). Needs `cargo build -p stockd --bins`.
//!
//! A test binary of its own: a fail point is process-wide.

use std::time::Duration;

use seckill_proto::pb::ReserveOutcome;
use seckill_tests::failpoint::Hold;
use seckill_tests::redis::user_on_shard;
use seckill_tests::stockd::{
    create_published_activity, look_at, reserve, set_shard_stock, spawn_stockd,
    spawn_stockd_process, stock_client, takes,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_that_found_its_donor_empty_reads_the_shards_again_and_takes_where_units_are() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    let h = spawn_stockd(&deps, |_| {}).await;
    let act = create_published_activity(&h, &[(3, 100)], SHARDS, Duration::ZERO, HOUR).await;
    // The rest of the fleet: where the donors' own buyers reserve.
    let peer = spawn_stockd_process(&deps, |_| {}).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    let c = h.stock_client().await;
    // The buyer's home (shard 0) is empty; shards 1 and 2 hold one unit each.
    set_shard_stock(&redis, a, s, &[0, 1, 1, 0]).await;

    let hold = Hold::at("stockd::move::before_take");
    let empty_before = h.metrics.rebalance_takes_empty.get();
    let (takes_before, rounds_before) = (takes(&h), h.metrics.rebalance_rounds.get());
    let away = user_on_shard("away", 0, SHARDS);
    let buyer = {
        let mut c = c.clone();
        tokio::spawn(async move { reserve(&mut c, a, s, &away, "r").await })
    };
    let go = hold.reached("the round's first take").await;
    // While the take waits: a unit arrives on shard 3 (as another round's give would
    // bring it), then the donors' own buyers reserve the units the round's read saw.
    set_shard_stock(&redis, a, s, &[0, 1, 1, 1]).await;
    let mut p = stock_client(&peer.addr).await;
    for donor in [1, 2] {
        let user = user_on_shard("local", donor, SHARDS);
        let r = reserve(&mut p, a, s, &user, "r")
            .await
            .expect("a donor's buyer");
        assert_eq!(
            r.outcome(),
            ReserveOutcome::Reserved,
            "shard {donor}'s buyer"
        );
    }
    let _ = go.send(());
    let r = tokio::time::timeout(Duration::from_secs(30), buyer)
        .await
        .expect("an answer once the take ran")
        .unwrap();

    assert_eq!(
        r.expect("an answer, not an error").outcome(),
        ReserveOutcome::Reserved,
        "the unit on shard 3 moved home for the empty-home buyer"
    );
    assert_eq!(
        h.metrics.rebalance_takes_empty.get() - empty_before,
        1,
        "one take found its donor empty"
    );
    assert_eq!(
        takes(&h) - takes_before,
        2,
        "after the empty take, the next one went to shard 3"
    );
    assert_eq!(
        h.metrics.rebalance_rounds.get() - rounds_before,
        1,
        "one round moved the unit home"
    );
    // Three units, three sales: nothing left anywhere, nothing in transit.
    for i in 0..SHARDS {
        assert_eq!(look_at(&redis, a, i, s).await, (0, 0, 0), "shard {i}");
    }
}
