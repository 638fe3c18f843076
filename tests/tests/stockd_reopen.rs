#![cfg(feature = "stockd")]
//! A rebuild asked for just before a finishing rebuild opens the activity keeps it
//! closed: the finishing rebuild runs again before it opens. It used to open first (it
//! had read "nothing asked" and then set the open flag, two steps), and sold on the
//! state the request was about until it let go of the activity.
//!
//! The request comes from a real reservation in flight: buyer `x`, homed on an empty
//! shard, is carried home by a rebalancing round and held (fail point
//! `stockd::reserve::carried`) while the test deletes shard 1's fence and another buyer
//! finds it (the first rebuild). That rebuild is held between its last read and its open
//! (`stockd::rebuild::before_open`) while shard 0 loses its fence; `x` then goes on, finds
//! it gone and asks for a rebuild. When the activity opens (held once more at
//! `stockd::rebuild::before_release`), shard 0 must have its fence back. (Checked: with the
//! open and the request in two steps, as before, the activity opened with shard 0's
//! fence gone.)
//!
//! A test binary of its own: a fail point is process-wide.

use std::time::Duration;

use fred::prelude::*;
use seckill_lua::keys;
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::failpoint::Hold;
use seckill_tests::redis::user_on_shard;
use seckill_tests::stockd::{
    create_published_activity, reserve, set_shard_stock, spawn_stockd, stock_client,
    until_available,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const CARRIED: &str = "stockd::reserve::carried";
const BEFORE_OPEN: &str = "stockd::rebuild::before_open";
const BEFORE_RELEASE: &str = "stockd::rebuild::before_release";
const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_asked_for_just_before_another_opens_keeps_the_sale_closed() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    // No fence check for ten minutes: only reservations ask for rebuilds.
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| {
        c.stock.fence_check_ms = 600_000
    })
    .await;
    let act = create_published_activity(&h, &[(4, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    let mut c = h.stock_client().await;
    let buyer = |name: &str, home: u32| user_on_shard(name, home, SHARDS);
    let ok = || h.metrics.recomputes.with_label_values(&["ok"]).get();

    // x's home (shard 0) is empty: a round brings units from shard 1, and x is held
    // before its reservation there.
    set_shard_stock(&redis, a, s, &[0, 4]).await;
    let carried = Hold::at(CARRIED);
    let before_open = Hold::at(BEFORE_OPEN);
    let addr = h.addr.clone();
    let x = tokio::spawn(async move {
        let mut c = stock_client(&addr).await;
        reserve(&mut c, a, s, &user_on_shard("x", 0, SHARDS), "r").await
    });
    let go_x = carried.reached("a round carried x home").await;

    // Shard 1 loses its fence; y, homed there, finds it: the first rebuild, held before
    // it opens.
    let _: i64 = redis.del(keys::fence(a, 1)).await.unwrap();
    let y = reserve(&mut c, a, s, &buyer("y", 1), "r").await;
    assert_eq!(y.unwrap_err().code(), tonic::Code::Unavailable);
    let go_open = before_open
        .reached("the first rebuild finished and is about to open")
        .await;
    assert_eq!(ok(), 1);
    let fence0: Option<String> = redis.get(keys::fence(a, 0)).await.unwrap();
    assert!(fence0.is_some(), "the first rebuild wrote shard 0");

    // Now shard 0 loses its fence, and x, going on, finds it and asks for a rebuild.
    let _: i64 = redis.del(keys::fence(a, 0)).await.unwrap();
    let before_release = Hold::at(BEFORE_RELEASE);
    go_x.send(()).unwrap();
    let x = x.await.unwrap();
    assert_eq!(x.unwrap_err().code(), tonic::Code::Unavailable);

    // The first rebuild goes on. When the sale opens, it is on a rebuild made after x's
    // request: shard 0 has its fence back.
    go_open.send(()).unwrap();
    let go_release = before_release.reached("the sale opened").await;
    let fence0: Option<String> = redis.get(keys::fence(a, 0)).await.unwrap();
    assert!(
        fence0.is_some(),
        "the sale opened with shard 0's fence gone: the rebuild x asked for did not run first"
    );
    assert_eq!(ok(), 2, "the rebuild ran again before it opened");
    go_release.send(()).unwrap();
    for name in [CARRIED, BEFORE_OPEN, BEFORE_RELEASE] {
        fail::remove(name);
    }

    until_available(&c, a, s, Duration::from_secs(20)).await;
    let r = reserve(&mut c, a, s, &buyer("z", 0), "r")
        .await
        .expect("reserve");
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
}
