#![cfg(feature = "stockd")]
//! Looks at every shard of an item are shared (`stockd::looks`): a caller gets a look
//! that began after it asked, and the callers who asked while one was under way share
//! the next.
//!
//! Three shards hold one unit each of the last two: shard 0 and shard 1 one unit, shard
//! 2 none. Buyer A (home 0) takes shard 0's unit, and the check after its shard emptied
//! looks; that look is held at the fail point `stockd::look::read`, its reads made
//! (shard 1 still held a unit). Buyer B (home 1) then takes the last unit, and the check
//! after shard 1 emptied asks for a look; buyer C (home 2, empty) runs a round that finds
//! no donor and asks for one too. Once both have asked, the held look goes on.
//!
//! B's check must not take the held look's answer (a unit on shard 1, so no sold-out
//! mark: the item would stay unmarked with every unit sold). It gets the next look,
//! which finds every shard empty and marks the item sold out, and C shares that look and
//! is told sold out: two looks sent for three asked.
//!
//! A test binary of its own: a fail point is process-wide.

use std::time::{Duration, Instant};

use fred::interfaces::KeysInterface;
use seckill_lua::keys;
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::failpoint::Hold;
use seckill_tests::redis::user_on_shard;
use seckill_tests::stockd::{
    create_published_activity, reserve, set_shard_stock, spawn_stockd, StockdHandle,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 3;
const LOOK_READ: &str = "stockd::look::read";

fn asked(h: &StockdHandle, by: &str) -> u64 {
    h.metrics.sold_out_looks.with_label_values(&[by]).get()
}

/// Waits until `done` holds (panics naming `what` after 10 s).
async fn until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_asked_while_another_is_under_way_gets_the_next_one_and_callers_share_it() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(2, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    set_shard_stock(&redis, a, s, &[1, 1, 0]).await;
    let mut c = h.stock_client().await;
    let (runs_before, checks_before, rounds_before) = (
        h.metrics.sold_out_look_runs.get(),
        asked(&h, "check"),
        asked(&h, "round"),
    );

    let hold = Hold::at(LOOK_READ);
    let r = reserve(&mut c, a, s, &user_on_shard("a", 0, SHARDS), "r-a")
        .await
        .unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    // The check after shard 0 emptied: its look read shard 1's unit, and is held.
    let go = hold.reached("the first check's look, its reads made").await;

    let r = reserve(&mut c, a, s, &user_on_shard("b", 1, SHARDS), "r-b")
        .await
        .unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved, "the last unit");
    let buyer_c = {
        let mut c = c.clone();
        let user = user_on_shard("c", 2, SHARDS);
        tokio::spawn(async move { reserve(&mut c, a, s, &user, "r-c").await })
    };
    until("B's check and C's round asked for a look", || {
        asked(&h, "check") >= checks_before + 2 && asked(&h, "round") > rounds_before
    })
    .await;
    assert_eq!(
        h.metrics.sold_out_look_runs.get(),
        runs_before + 1,
        "a look began while the first was held"
    );
    go.send(()).unwrap();

    let r = buyer_c.await.unwrap().unwrap();
    assert_eq!(
        r.outcome(),
        ReserveOutcome::SoldOut,
        "C, after every unit sold"
    );
    let start = Instant::now();
    loop {
        let flagged: i64 = redis.exists(keys::sold_out(a, s)).await.unwrap();
        if flagged == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "every unit sold and the item never marked sold out: B's check took the look \
             begun before B's reservation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // C's round and B's check shared the look begun after both asked.
    assert_eq!(
        (
            asked(&h, "check") - checks_before,
            asked(&h, "round") - rounds_before
        ),
        (2, 1)
    );
    assert_eq!(
        h.metrics.sold_out_look_runs.get() - runs_before,
        2,
        "looks sent"
    );
    fail::remove(LOOK_READ);
}
