#![cfg(feature = "stockd")]
//! The mover's give budget (`stockd/src/transit.rs`): a take whose answer reaches the
//! mover later than `redis.timeout_ms` + 1 s (a stalled process) is not given. Its units
//! left their donor, and their record of units in transit may have expired, so a look
//! in that gap saw them nowhere and may have set the sold-out flag; a late give would
//! leave them on a shard behind that flag. They are held back and a rebuild counts them
//! back from MySQL, which clears the flag.
//!
//! The stall is real: the fail point `stockd::move::before_give` blocks the runtime
//! thread of the in-process stockd between the take's answer and the give, longer than
//! the record lives. Meanwhile another thread, with a runtime and a Redis client of its
//! own, makes the sold-out check's look and mark as any stockd of the fleet would.
//!
//! A test binary of its own: a fail point is process-wide.

use std::time::{Duration, Instant};

use seckill_lua::calls::SoldOutMarkCall;
use seckill_lua::keys;
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::redis::{call, connect, user_on_shard};
use seckill_tests::stockd::{
    create_published_activity, look_at, reserve, set_shard_stock, sold_out_flagged, spawn_stockd,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 4;
const UNITS: u32 = 4;
/// Longer than a record's lifetime at `redis.timeout_ms` = 500 (3,501 ms).
const STALL_MS: u64 = 5_000;

/// The other stockd's sold-out check, once the mover's record has expired: the change
/// count, a look at every shard, and the mark when every shard is empty with nothing
/// in transit. Returns the mark's answer (1: set).
fn mark_once_the_record_expired(url: String, a: u64, s: u64, donor: u32) -> i64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        use fred::interfaces::KeysInterface;
        let redis = connect(&url).await;
        let until = Instant::now() + Duration::from_secs(20);
        while look_at(&redis, a, donor, s).await.1 == 0 {
            assert!(Instant::now() < until, "the take never recorded its units");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        while look_at(&redis, a, donor, s).await.1 > 0 {
            assert!(Instant::now() < until, "the record never expired");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let changes: Option<String> = redis.get(keys::changes(a, s)).await.unwrap();
        for i in 0..SHARDS {
            assert_eq!(
                look_at(&redis, a, i, s).await,
                (0, 0, 0),
                "shard {i}: units are seen"
            );
        }
        call(&redis, SoldOutMarkCall::new(a, s, changes.as_deref()))
            .await
            .as_i64()
            .unwrap()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_answered_after_the_give_budget_is_not_given_and_every_unit_still_sells() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| {
        c.redis.timeout_ms = 500;
        c.stock.rebalance_batch = UNITS;
    })
    .await;
    let act = create_published_activity(&h, &[(UNITS, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    let mut c = h.stock_client().await;
    // Every unit on the last shard: the first buyer of shard 0 moves them all.
    let donor = SHARDS - 1;
    set_shard_stock(&redis, a, s, &[0, 0, 0, UNITS as i64]).await;
    let repairs = || {
        ["now", "deferred", "joined"]
            .iter()
            .map(|w| h.metrics.move_repairs.with_label_values(&[w]).get())
            .sum::<u64>()
    };
    let repairs_before = repairs();
    let rebuilt = || h.metrics.recomputes.with_label_values(&["ok"]).get();
    let rebuilt_before = rebuilt();

    fail::cfg("stockd::move::before_give", &format!("1*sleep({STALL_MS})")).unwrap();
    let marker = {
        let url = cluster.url();
        std::thread::spawn(move || mark_once_the_record_expired(url, a, s, donor))
    };
    let first = user_on_shard("first", 0, SHARDS);
    let r = tokio::time::timeout(Duration::from_secs(30), reserve(&mut c, a, s, &first, "r"))
        .await
        .expect("an answer after the stall");
    fail::remove("stockd::move::before_give");
    assert_eq!(
        marker.join().unwrap(),
        1,
        "the look in the gap saw the units nowhere and set the flag"
    );
    let e = r.expect_err("the move ran out of time");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("ran out of time"), "{e:?}");
    assert_eq!(repairs(), repairs_before + 1, "a rebuild was asked for");

    // Once the rebuild is done (or, with no rebuild, 20 s on), the flag does not stand
    // over units: the harm of a late give, which would have put them on shard 0 behind
    // it, where the edge turns every buyer away from units on sale. The rebuild counted
    // them back from MySQL and cleared it.
    let until = Instant::now() + Duration::from_secs(20);
    while rebuilt() == rebuilt_before && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let flagged = sold_out_flagged(&redis, a, s).await;
    let mut units = 0;
    for i in 0..SHARDS {
        units += look_at(&redis, a, i, s).await.0;
    }
    assert!(
        !(flagged && units > 0),
        "the sold-out flag is set over {units} unit(s)"
    );
    assert_eq!((flagged, units), (false, i64::from(UNITS)));

    // Then buyers whose homes are not the mover's buy every unit, once each.
    let buyers: Vec<String> = (0..2 * UNITS)
        .map(|n| user_on_shard(&format!("later{n}"), 1 + n % (SHARDS - 1), SHARDS))
        .collect();
    let mut reserved = 0;
    let mut sold_out = 0;
    for user in &buyers {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            match reserve(&mut c, a, s, user, "r").await {
                Ok(r) if r.outcome() == ReserveOutcome::Reserved => {
                    reserved += 1;
                    break;
                }
                Ok(r) if r.outcome() == ReserveOutcome::SoldOut && reserved == UNITS => {
                    sold_out += 1;
                    break;
                }
                // A round's contention, or the activity reopening: retry.
                Err(e)
                    if matches!(e.code(), tonic::Code::Aborted | tonic::Code::Unavailable)
                        && Instant::now() < until =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                other => panic!("{user}: {other:?} with {reserved} of {UNITS} units sold"),
            }
        }
    }
    assert_eq!((reserved, sold_out), (UNITS, UNITS));
    assert!(sold_out_flagged(&redis, a, s).await, "sold out at the end");
}
