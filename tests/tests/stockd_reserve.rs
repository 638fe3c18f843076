#![cfg(feature = "stockd")]
//! Reserve and Release under real concurrency on a real 3-master Redis Cluster:
//! no oversell, one unit per user, every unit sells, retries and releases are
//! idempotent.
//!
//! (Over 400 lines: an integration suite: each test sets up real processes and states its
//! invariants inline, so the cases read top to bottom.)

use seckill_tests::Deps;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use fred::prelude::*;
use seckill_lua::calls::{Call, ReserveCall, SoldOutClearCall, SoldOutMarkCall};
use seckill_lua::scripts;
use seckill_lua::{home_shard, keys};
use seckill_proto::pb::{self, ReserveOutcome};
use seckill_tests::process::wait_until_async;
use seckill_tests::redis::{request_id, user_id, user_on_shard};
use seckill_tests::stockd::{
    create_published_activity, look_at, reserve, reserve_retrying_busy, set_shard_stock,
    set_sold_out_flag, settle_by_hand, shard_stock, sold_out_flagged, spawn_stockd, stream_len,
    take_in_transit, takes, StockClient, StockdHandle,
};
use seckill_tests::{init_tracing, RedisCluster, TestDb};
use stockd::metrics::ROUND_OUTCOMES;

const HOUR: Duration = Duration::from_secs(3600);

async fn release(c: &mut StockClient, rid: &str, user: &str) -> pb::ReleaseOutcome {
    c.release(pb::ReleaseRequest {
        reservation_id: rid.into(),
        user_id: user.into(),
        reason: "cancelled".into(),
    })
    .await
    .unwrap()
    .into_inner()
    .outcome()
}

/// Fires every call at once and collects (user, answer). A call answered ABORTED
/// (contention: the units gathered for it went to other buyers while some remain) is
/// sent again with the same request id, as the contract asks of a client, up to 5 times.
async fn crowd(
    c: &StockClient,
    a: u64,
    s: u64,
    calls: Vec<(String, String)>,
) -> Vec<(String, Result<pb::ReserveResponse, tonic::Status>)> {
    let tasks: Vec<_> = calls
        .into_iter()
        .map(|(user, req)| {
            let mut c = c.clone();
            tokio::spawn(async move {
                let r = reserve_retrying_busy(&mut c, a, s, &user, &req).await;
                (user, r)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn two_thousand_concurrent_reservations_from_a_thousand_users_sell_exactly_the_stock() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(100, 500)], 8, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let c = h.stock_client().await;
    let mut calls = Vec::new();
    for round in 0..2 {
        for u in 0..1000 {
            calls.push((format!("user-{u}"), format!("req-{u}-{round}")));
        }
    }
    let answers = crowd(&c, a, s, calls).await;
    // The crowd queued behind in-flight calls: some calls carried several
    // reservations, so what is checked below is the group-commit path.
    let batches = &h.metrics.reserve_batch;
    assert!(
        batches.get_sample_sum() > batches.get_sample_count() as f64,
        "no reserve call carried more than one reservation"
    );
    let mut reserved_users = HashSet::new();
    let mut rids = HashSet::new();
    let mut reserved = 0;
    for (user, r) in &answers {
        let r = r.as_ref().expect("no errors without faults");
        match r.outcome() {
            ReserveOutcome::Reserved => {
                reserved += 1;
                reserved_users.insert(user.clone());
                rids.insert(r.reservation_id.clone());
            }
            ReserveOutcome::Duplicate | ReserveOutcome::SoldOut => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(reserved, 100);
    assert_eq!(reserved_users.len(), 100);
    assert_eq!(rids.len(), 100);
    let redis = cluster.client().await;
    let shards = shard_stock(&redis, a, s, 8).await;
    assert!(shards.iter().all(|&n| n >= 0), "{shards:?}");
    assert_eq!(shards.iter().sum::<i64>(), 0, "{shards:?}");
    assert_eq!(stream_len(&redis, a, 8).await, 100);
    // Sold out: flag set and answered at once.
    let sold: bool = redis.exists::<i64, _>(keys::sold_out(a, s)).await.unwrap() == 1;
    assert!(sold);
    let mut c2 = c.clone();
    let r = reserve(&mut c2, a, s, "late-comer", "x").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::SoldOut);
}

#[tokio::test]
async fn users_skewed_onto_two_home_shards_still_buy_every_unit() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(100, 500)], 8, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    // 300 users whose home shard is 0 or 1: the other 6 shards (75 units) must move.
    let users: Vec<String> = (0..)
        .map(|u| format!("skewed-{u}"))
        .filter(|u| home_shard(u, 8) <= 1)
        .take(300)
        .collect();
    let c = h.stock_client().await;
    let calls = users
        .iter()
        .map(|u| (u.clone(), format!("{u}-r")))
        .collect();
    let answers = crowd(&c, a, s, calls).await;
    let reserved = answers
        .iter()
        .filter(|(_, r)| r.as_ref().unwrap().outcome() == ReserveOutcome::Reserved)
        .count();
    let redis = cluster.client().await;
    let shards = shard_stock(&redis, a, s, 8).await;
    assert!(shards.iter().all(|&n| n >= 0), "{shards:?}");
    assert_eq!(reserved, 100, "left per shard: {shards:?}");
    assert_eq!(shards.iter().sum::<i64>(), 0);
    // The count of buyers out of attempts is reported (whatever it is).
    let mut admin = h.admin_client().await;
    let st = admin
        .get_activity_status(pb::GetActivityStatusRequest { activity_id: a })
        .await
        .unwrap()
        .into_inner();
    eprintln!("out of attempts, told to retry: {}", st.items[0].gave_up);
    assert_eq!(st.items[0].remaining, 0);
    assert_eq!(st.items[0].reserved, 100);
}

#[tokio::test]
async fn a_move_asks_only_the_donor_that_holds_units() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(80, 500)], 8, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    // The end of a sale: every shard empty but the last one, which holds 3 units.
    set_shard_stock(&redis, a, s, &[0, 0, 0, 0, 0, 0, 0, 3]).await;
    let mut c = h.stock_client().await;
    // One buyer per empty home shard, one after the other: each move is one take, on
    // shard 7, never a walk over the six empty donors.
    let mut sold = 0;
    for home in 0..3u32 {
        let user = user_on_shard(&format!("late-{home}"), home, 8);
        let before = takes(&h);
        let r = reserve(&mut c, a, s, &user, &format!("{user}-r"))
            .await
            .unwrap();
        assert_eq!(
            r.outcome(),
            ReserveOutcome::Reserved,
            "{user} on shard {home}"
        );
        assert_eq!(takes(&h) - before, 1, "takes for {user} on shard {home}");
        sold += 1;
    }
    let shards = shard_stock(&redis, a, s, 8).await;
    assert_eq!(shards.iter().sum::<i64>(), 3 - sold, "{shards:?}");
    assert!(shards.iter().all(|&n| n >= 0), "{shards:?}");
    // Nothing left anywhere: a fourth buyer is told sold out without a single take.
    let before = takes(&h);
    let user = user_on_shard("later", 4, 8);
    let r = reserve(&mut c, a, s, &user, "later-r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::SoldOut);
    assert_eq!(takes(&h) - before, 0);
}

#[tokio::test]
async fn a_sold_out_flag_left_over_units_does_not_hide_them_from_a_buyer_whose_home_is_empty() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(80, 500)], 8, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    // The flag says sold out, but shard 5 still holds 2 units (a flag set from a scan that
    // missed units in transit, before the move that carried them cleared it).
    set_shard_stock(&redis, a, s, &[0, 0, 0, 0, 0, 2, 0, 0]).await;
    set_sold_out_flag(&redis, a, s).await;
    let mut c = h.stock_client().await;
    // A buyer whose turn comes at once runs the round without the flag, and finds them.
    let user = user_on_shard("stale-flag", 0, 8);
    let r = reserve(&mut c, a, s, &user, "stale-flag-r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    // The unit left is on sale again: the flag is cleared.
    let flag: Option<String> = redis.get(keys::sold_out(a, s)).await.unwrap();
    assert_eq!(flag, None);
    assert_eq!(shard_stock(&redis, a, s, 8).await.iter().sum::<i64>(), 1);
    // Sold out for real (flag set, every shard empty): the next buyer of an empty home is
    // told so without a take.
    set_shard_stock(&redis, a, s, &[0; 8]).await;
    set_sold_out_flag(&redis, a, s).await;
    let before = takes(&h);
    let user = user_on_shard("after-the-sale", 3, 8);
    let r = reserve(&mut c, a, s, &user, "after-r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::SoldOut);
    assert_eq!(takes(&h) - before, 0);
}

#[tokio::test]
async fn buyers_whose_home_emptied_together_share_the_moves_and_sell_every_unit_once() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(80, 500)], 8, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    // The end of a sale: home shard 0 empty, 6 units on each of the seven others.
    set_shard_stock(&redis, a, s, &[0, 6, 6, 6, 6, 6, 6, 6]).await;
    let (takes_before, rounds_before) = (takes(&h), h.metrics.rebalance_rounds.get());
    let (timed_before, waits_before) = (
        h.metrics.rebalance_round_seconds.get_sample_count(),
        h.metrics.rebalance_wait_seconds.get_sample_count(),
    );
    let per_reserved = &h.metrics.rebalance_waits_per_reserved;
    let (counted_before, empties_before) = (
        per_reserved.get_sample_count(),
        per_reserved.get_sample_sum(),
    );
    // 50 buyers of shard 0 at once, for the 42 units: every one of them finds its home
    // empty at least once.
    let c = h.stock_client().await;
    let buyers: Vec<String> = (0..50)
        .map(|i| user_on_shard(&format!("herd{i}"), 0, 8))
        .collect();
    let started = std::time::Instant::now();
    let calls = buyers.iter().map(|user| {
        let (mut c, user) = (c.clone(), user.clone());
        tokio::spawn(async move {
            let r = reserve_retrying_busy(&mut c, a, s, &user, &format!("{user}-r")).await;
            (user, r.map(|r| r.outcome()), started.elapsed())
        })
    });
    let mut reserved = HashSet::new();
    let mut sold_out = 0;
    let mut waited = Vec::new();
    for call in futures::future::join_all(calls).await {
        let (user, outcome, took) = call.unwrap();
        waited.push(took);
        match outcome.unwrap() {
            ReserveOutcome::Reserved => assert!(reserved.insert(user)),
            ReserveOutcome::SoldOut => sold_out += 1,
            other => panic!("{user}: {other:?}"),
        }
    }
    // Every unit sold, once, to distinct buyers; nothing left, nothing below zero.
    assert_eq!(reserved.len(), 42, "sold out answers: {sold_out}");
    assert_eq!(sold_out, 8);
    let shards = shard_stock(&redis, a, s, 8).await;
    assert_eq!(shards, vec![0; 8]);
    assert_eq!(stream_len(&redis, a, 8).await, 42);
    // The moves were shared: without the mover each of the 50 ran its own (and most
    // of their takes found the donor emptied by another's).
    let rounds = h.metrics.rebalance_rounds.get() - rounds_before;
    let took = takes(&h) - takes_before;
    waited.sort();
    eprintln!(
        "50 buyers on one empty home: {rounds} rounds, {took} takes; answered in {:?} \
         (median), {:?} (slowest)",
        waited[waited.len() / 2],
        waited[waited.len() - 1]
    );
    assert!(rounds <= 12, "{rounds} rebalancing rounds for 50 buyers");
    assert!(took <= 7 * rounds, "{took} takes in {rounds} rounds");
    // Each round is timed once; each buyer that found its home empty timed its wait (the
    // rounds' runners among them).
    let timed = h.metrics.rebalance_round_seconds.get_sample_count() - timed_before;
    let waits = h.metrics.rebalance_wait_seconds.get_sample_count() - waits_before;
    assert_eq!(timed, rounds, "round timings");
    assert!(
        waits >= rounds && waits > 0,
        "{waits} waits for {rounds} rounds"
    );
    assert!(h.metrics.rebalance_round_seconds.get_sample_sum() > 0.0);
    // Every buyer found its home empty on its first try: each one reserved counts its
    // empties (a buyer told to retry whose next try found units home counts none), and
    // no sold-out buyer counts.
    let counted = per_reserved.get_sample_count() - counted_before;
    let empties = per_reserved.get_sample_sum() - empties_before;
    eprintln!("reserved after an empty home: {counted}, {empties} empties in all");
    assert!(
        (1..=42).contains(&counted),
        "{counted} reservations counted"
    );
    assert!(empties >= counted as f64, "{empties} empties for {counted}");
}

/// Rebalancing rounds that ended finding `outcome` (`stockd::metrics::ROUND_OUTCOMES`).
fn round_outcomes(h: &StockdHandle, outcome: &str) -> u64 {
    h.metrics
        .rebalance_round_outcomes
        .with_label_values(&[outcome])
        .get()
}

/// The end of a sale as a crowd meets it: the last units sit on three shards, bought
/// there by their own buyers while buyers of two empty homes run rounds against them,
/// exactly as many buyers as units. Every buyer gets one (a buyer told sold out while a
/// shard or a move holds a unit fails the test), once; the next buyer is told sold out;
/// every round that ran is counted by what it found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buyers_of_the_last_units_shards_and_of_empty_homes_at_once_sell_every_unit_once() {
    init_tracing();
    const SHARDS: u32 = 8;
    const UNITS: usize = 3 * 9;
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(80, 500)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    set_shard_stock(&redis, a, s, &[0, 9, 0, 9, 0, 9, 0, 0]).await;
    let rounds_before = h.metrics.rebalance_rounds.get();
    let ended_before: u64 = ROUND_OUTCOMES.iter().map(|o| round_outcomes(&h, o)).sum();
    // 5 buyers on each of the three shards with units, 6 on each of two empty homes: the
    // empty homes' 12 need every unit the shards' own buyers leave.
    let calls: Vec<(String, String)> = [(1, 5), (3, 5), (5, 5), (0, 6), (2, 6)]
        .into_iter()
        .flat_map(|(home, n)| {
            (0..n).map(move |i| user_on_shard(&format!("p{home}-{i}"), home, SHARDS))
        })
        .map(|u| (u.clone(), format!("{u}-r")))
        .collect();
    assert_eq!(calls.len(), UNITS);
    let mut reserved = HashSet::new();
    for (user, r) in crowd(&h.stock_client().await, a, s, calls).await {
        match r.unwrap().outcome() {
            ReserveOutcome::Reserved => assert!(reserved.insert(user)),
            other => panic!("{user}: {other:?} while units remained"),
        }
    }
    assert_eq!(reserved.len(), UNITS);
    assert_eq!(
        shard_stock(&redis, a, s, SHARDS).await,
        vec![0; SHARDS as usize]
    );
    assert_eq!(stream_len(&redis, a, SHARDS).await, UNITS as i64);
    let late = user_on_shard("late", 4, SHARDS);
    let r = reserve(&mut h.stock_client().await, a, s, &late, "r").await;
    assert_eq!(r.unwrap().outcome(), ReserveOutcome::SoldOut);
    // Every round that ran ended with one outcome counted.
    let rounds = h.metrics.rebalance_rounds.get() - rounds_before;
    let ended: u64 = ROUND_OUTCOMES.iter().map(|o| round_outcomes(&h, o)).sum();
    eprintln!(
        "{rounds} rounds: {:?}",
        ROUND_OUTCOMES.map(|o| (o, round_outcomes(&h, o)))
    );
    assert!(rounds > 0, "no buyer of an empty home ran a round");
    assert_eq!(ended - ended_before, rounds);
}

/// One call of a typed script (`seckill_lua::calls`), as the daemons send it; its
/// integer answer.
async fn eval_int<C: Call>(redis: &Client, c: C) -> i64 {
    let name = C::SCRIPT.name;
    seckill_tests::redis::call(redis, c)
        .await
        .as_i64()
        .unwrap_or_else(|| panic!("{name}: not an integer"))
}

async fn changes(redis: &Client, a: u64, s: u64) -> Option<String> {
    redis.get(keys::changes(a, s)).await.unwrap()
}

/// The sold-out look's and mark's contract (`take.lua`, `look.lua`, `soldout_mark.lua`),
/// on a real cluster: a take records the units it took as in transit on its donor, in
/// its own call, and a look at that shard counts the record until the mover settles it
/// or its deadline passes; a take that found nothing records nothing; a shorter record
/// never cuts the key's life; expired records are swept. The mark is refused when the
/// change count moved since the caller read it (a settle, every clear).
#[tokio::test]
async fn units_in_transit_are_seen_by_a_look_and_a_changed_count_refuses_the_mark() {
    init_tracing();
    let cluster = RedisCluster::start();
    let redis = cluster.client().await;
    let (a, s) = (77, 5);
    for i in 0..2 {
        let _: () = redis
            .set(keys::fence(a, i), "e1", None, None, false)
            .await
            .unwrap();
    }
    set_shard_stock(&redis, a, s, &[5, 0]).await;
    let mark = |c: Option<String>| SoldOutMarkCall::new(a, s, c.as_deref());
    let read = changes(&redis, a, s).await;
    assert_eq!(read, None);

    // Three units leave shard 0: on no shard, but in transit there.
    assert_eq!(take_in_transit(&redis, (a, 0, s), 3, "m1", 60_000).await, 3);
    assert_eq!(look_at(&redis, a, 0, s).await, (2, 1, 3));
    assert_eq!(look_at(&redis, a, 1, s).await, (0, 0, 0));
    // A take from an empty shard records nothing.
    assert_eq!(take_in_transit(&redis, (a, 1, s), 2, "m0", 60_000).await, 0);
    let none: i64 = redis.zcard(keys::transit(a, 1, s)).await.unwrap();
    assert_eq!(none, 0, "a take of nothing is not in transit");
    // A missing stock key looks like an empty shard.
    assert_eq!(look_at(&redis, a, 1, 99).await, (0, 0, 0));

    // The give lands on shard 1 and the move settles: the count moves first, so a mark
    // decided from a look that began before the settle is refused.
    let _: i64 = redis.incr_by(keys::stock(a, 1, s), 3).await.unwrap();
    settle_by_hand(&redis, (a, 0, s), "m1", 3).await;
    assert_eq!(look_at(&redis, a, 0, s).await, (2, 0, 0));
    assert_eq!(
        eval_int(&redis, mark(read)).await,
        -2,
        "units moved during the look"
    );
    assert!(!sold_out_flagged(&redis, a, s).await);
    let read = changes(&redis, a, s).await;
    assert_eq!(read.as_deref(), Some("1"));
    assert_eq!(
        eval_int(&redis, mark(read.clone())).await,
        1,
        "set by this call"
    );
    assert_eq!(eval_int(&redis, mark(read.clone())).await, 0, "set already");
    assert!(sold_out_flagged(&redis, a, s).await);

    // A unit comes back (a release): the clear counts a change.
    assert_eq!(eval_int(&redis, SoldOutClearCall::new(a, s)).await, 1);
    assert!(!sold_out_flagged(&redis, a, s).await);
    assert_eq!(eval_int(&redis, mark(read)).await, -2, "a unit came back");
    assert_eq!(eval_int(&redis, SoldOutClearCall::new(a, s)).await, 0);

    // A mover that died: its record counts until its deadline only. A move with a
    // longer life taken before it keeps the key alive (a shorter record never cuts the
    // key's TTL) and counts for its own life.
    assert_eq!(
        take_in_transit(&redis, (a, 0, s), 1, "long", 60_000).await,
        1
    );
    assert_eq!(
        take_in_transit(&redis, (a, 0, s), 1, "dead", 1_500).await,
        1
    );
    assert_eq!(look_at(&redis, a, 0, s).await, (0, 2, 2));
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    assert_eq!(
        look_at(&redis, a, 0, s).await,
        (0, 1, 1),
        "the long move is live"
    );
    let ttl: i64 = redis.pttl(keys::transit(a, 0, s)).await.unwrap();
    assert!(
        ttl > 50_000,
        "a shorter record cut the key's life: {ttl} ms"
    );
    // The next take sweeps the dead record.
    set_shard_stock(&redis, a, s, &[1, 3]).await;
    assert_eq!(
        take_in_transit(&redis, (a, 0, s), 1, "next", 60_000).await,
        1
    );
    let left: Vec<String> = redis
        .zrange(keys::transit(a, 0, s), 0, -1, None, false, None, false)
        .await
        .unwrap();
    assert_eq!(left, ["long:1", "next:1"], "expired records are swept");
}

/// Units between a take and a give are on no shard: a look at every shard then finds
/// none. While a move is under way (another stockd's take: its units on no shard, in
/// transit on the donor), neither the check after a reservation emptied its shard nor a
/// round of a buyer whose home is empty sets the sold-out flag. Once the give has landed
/// and the move settled, the units sell, and the flag is set when they are gone.
/// (Before, both looks set the flag, which buyers queued behind a round then heard as
/// sold out, and which stockd's status reported, until somebody cleared it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_while_units_move_sets_no_sold_out_flag() {
    init_tracing();
    const SHARDS: u32 = 8;
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    // A long deadline (records live 3 × 5 s + 2 s): see the move's settle below.
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| c.redis.timeout_ms = 5_000).await;
    let act = create_published_activity(&h, &[(80, 500)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    let mut c = h.stock_client().await;
    // The last unit on shard 5; two more taken from shard 2 by another stockd's move,
    // not given yet.
    set_shard_stock(&redis, a, s, &[0, 0, 2, 0, 0, 1, 0, 0]).await;
    assert_eq!(
        take_in_transit(&redis, (a, 2, s), 2, "peer", 60_000).await,
        2
    );
    let refused = || h.metrics.sold_out_marks_refused.get();

    // The last unit of shard 5 sells; the check that follows finds every shard empty.
    let user = user_on_shard("last-of-5", 5, SHARDS);
    let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    wait_until_async(
        "the check after the sale",
        Duration::from_secs(10),
        || async { refused() >= 1 || sold_out_flagged(&redis, a, s).await },
    )
    .await;
    assert!(
        !sold_out_flagged(&redis, a, s).await,
        "flagged while units move"
    );
    // (The check looks again after 20, 100 and 500 ms; its refusals are not counted
    // below.)
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !sold_out_flagged(&redis, a, s).await,
        "flagged while units move"
    );
    let looks = |by: &str| h.metrics.sold_out_looks.with_label_values(&[by]).get();
    wait_until_async(
        "the check's four looks",
        Duration::from_secs(10),
        || async { looks("check") == 4 },
    )
    .await;

    // A buyer whose home is empty: its rounds find no unit on the shards, but two in
    // transit, and do not mark either. Out of attempts, it is told to retry (ABORTED:
    // contention, this stockd is healthy), not sold out: the units are on their way to a
    // shard. (It used to be told SOLD_OUT, a false sold-out.)
    // Each of its rounds ended finding the units elsewhere (`elsewhere`: in transit).
    let user = user_on_shard("during", 0, SHARDS);
    let elsewhere = round_outcomes(&h, "elsewhere");
    let found = |f: &str| h.metrics.rebalance_elsewhere.with_label_values(&[f]).get();
    let in_transit = found("transit");
    let e = reserve(&mut c, a, s, &user, "r").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
    assert!(e.message().contains("retry"), "{e:?}");
    let attempts = stockd::config::StockConfig::default().rebalance_attempts;
    assert_eq!(
        round_outcomes(&h, "elsewhere") - elsewhere,
        u64::from(attempts),
        "one round per attempt, each finding the units in transit"
    );
    // And the split says so: enough only with the units in transit counted.
    assert_eq!(found("transit") - in_transit, u64::from(attempts));
    assert_eq!((found("shards"), found("moving")), (0, 0));
    // A look in each round (none moved units home), and one more out of attempts.
    assert_eq!(
        (looks("round"), looks("attempts"), looks("check")),
        (u64::from(attempts), 1, 4)
    );
    assert!(
        !sold_out_flagged(&redis, a, s).await,
        "flagged while units move"
    );
    assert_eq!(h.metrics.gave_up.get(), 1);

    // The give lands on shard 3 and the move settles: the two units sell, then the flag.
    set_shard_stock(&redis, a, s, &[0, 0, 0, 2, 0, 0, 0, 0]).await;
    settle_by_hand(&redis, (a, 2, s), "peer", 2).await;
    for k in 0..2 {
        let user = user_on_shard(&format!("after{k}"), 0, SHARDS);
        let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{user}");
    }
    // Those two came by this stockd's own move from shard 3: its take recorded them in
    // transit there, and it settled after its give. (The records' life is 3 × 5 s + 2 s
    // here: gone within 10 s means removed, not expired.)
    assert!(takes(&h) >= 1);
    wait_until_async(
        "this stockd's move settled",
        Duration::from_secs(10),
        || async {
            let left: i64 = redis.zcard(keys::transit(a, 3, s)).await.unwrap();
            left == 0
        },
    )
    .await;
    let user = user_on_shard("too-late", 1, SHARDS);
    let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::SoldOut);
    wait_until_async(
        "the flag once every unit sold",
        Duration::from_secs(10),
        || async { sold_out_flagged(&redis, a, s).await },
    )
    .await;
    assert_eq!(stream_len(&redis, a, SHARDS).await, 3);
}

/// A look whose shard reads spread over more than a second (a stalled process, a
/// paused master) sets no sold-out flag, even when every shard it read was empty and
/// nothing was in transit: a give may have landed on a shard it read early while the
/// donor's record expired before it read that one (`stockd::transit`). The bound is
/// what lets a fleet run different `redis.timeout_ms`: no marking look outspreads a
/// record's slack. (Before, such a look marked.)
///
/// The look is the check after a reservation emptied its shard, which looks up to four
/// times (after 0, 20, 100 and 500 ms). Moves under way (another stockd's takes, never
/// given) refuse the first three; then the moves settle and one master stops for 2.5 s,
/// so the fourth look's reads spread over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_whose_reads_spread_over_a_second_sets_no_sold_out_flag() {
    use seckill_tests::redis::ClusterSpec;
    init_tracing();
    const SHARDS: u32 = 4;
    // No node is suspected over the stall; no read times out in it.
    let cluster = RedisCluster::start_spec(ClusterSpec::masters(3).node_timeout_ms(30_000));
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| c.redis.timeout_ms = 10_000).await;
    let act = create_published_activity(&h, &[(4, 500)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    let mut c = h.stock_client().await;
    // A master serving one of the shards but neither shard 0 (the buyers' home) nor the
    // activity's slot (the change count the look reads first).
    let spared = [
        cluster.master_of_key(&keys::changes(a, s)),
        cluster.master_of_key(&keys::stock(a, 0, s)),
    ];
    let stalled = (1..SHARDS)
        .map(|i| cluster.master_of_key(&keys::stock(a, i, s)))
        .find(|p| !spared.contains(p))
        .expect("some shard on a third master");
    set_shard_stock(&redis, a, s, &[1, 1, 1, 1]).await;
    for i in 1..SHARDS {
        let id = format!("peer{i}");
        assert_eq!(take_in_transit(&redis, (a, i, s), 1, &id, 60_000).await, 1);
    }
    let refused = || h.metrics.sold_out_marks_refused.get();
    let before = refused();

    // The last unit on a shard sells; the check's first three looks see the moves.
    let user = user_on_shard("last", 0, SHARDS);
    let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    wait_until_async("three looks refused", Duration::from_secs(10), || async {
        refused() >= before + 3
    })
    .await;
    // Within the 500 ms before the fourth: the moves settle (as a dead mover's records
    // would expire), and a master stops.
    for i in 1..SHARDS {
        settle_by_hand(&redis, (a, i, s), &format!("peer{i}"), 1).await;
    }
    let _stall = cluster.stall(stalled, 2_500);
    assert_eq!(
        refused(),
        before + 3,
        "the fourth look came before the stall"
    );
    // The fourth look read every shard empty, nothing in transit and the count
    // unmoved, but over the stall: refused.
    wait_until_async(
        "the fourth look refused",
        Duration::from_secs(10),
        || async { refused() >= before + 4 },
    )
    .await;
    assert!(
        !sold_out_flagged(&redis, a, s).await,
        "a look spread over 2.5 s marked"
    );

    // A buyer whose home is empty then runs a round, whose look is quick: sold out.
    let user = user_on_shard("after", 0, SHARDS);
    let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::SoldOut);
    assert!(sold_out_flagged(&redis, a, s).await);
}

/// A buyer whose home is empty and whose last rebalancing round failed (the round's
/// read of a donor timed out) is told UNAVAILABLE, to retry, not sold out: nothing said
/// the item was sold out, and the donor still holds units. With one attempt a buyer
/// queued behind the failed round reads its home once more, finds it empty, and has no
/// attempt left: the case where a false sold-out used to be answered.
///
/// The donor shards' master is paused for every command (`CLIENT PAUSE … ALL`: the
/// cluster bus goes on, so no failover), longer than stockd's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buyers_behind_a_failed_round_are_told_to_retry_not_sold_out() {
    init_tracing();
    const SHARDS: u32 = 8;
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| {
        c.redis.timeout_ms = 600;
        c.redis.replica_ack_timeout_ms = 100;
        c.stock.rebalance_attempts = 1;
    })
    .await;
    let act = create_published_activity(&h, &[(80, 500)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    // The donor: a master that does not hold the sold-out flag (a waiter reads the flag
    // while it waits; it must answer) but holds some shards; the home: a shard elsewhere.
    let flag_master = cluster.master_of_key(&keys::sold_out(a, s));
    let master_of = |i: u32| cluster.master_of_key(&keys::fence(a, i));
    let donor = (0..SHARDS)
        .map(master_of)
        .find(|&m| m != flag_master)
        .expect("the shards span more than one master");
    let home = (0..SHARDS)
        .find(|&i| master_of(i) != donor)
        .expect("a shard off the donor");
    let units: Vec<i64> = (0..SHARDS)
        .map(|i| if master_of(i) == donor { 3 } else { 0 })
        .collect();
    let total: i64 = units.iter().sum();
    set_shard_stock(&redis, a, s, &units).await;
    let buyers: Vec<String> = (0..20)
        .map(|i| user_on_shard(&format!("behind{i}"), home, SHARDS))
        .collect();
    let c = h.stock_client().await;

    cluster.cli_at(donor, &["CLIENT", "PAUSE", "2500", "ALL"]);
    let paused_at = Instant::now();
    let calls = buyers.iter().map(|user| {
        let (mut c, user) = (c.clone(), user.clone());
        tokio::spawn(async move { reserve(&mut c, a, s, &user, "r").await })
    });
    let answers = futures::future::join_all(calls).await;
    assert!(
        paused_at.elapsed() < Duration::from_millis(2500),
        "every buyer answered during the pause"
    );
    let mut told_round_failed = 0;
    for (user, answer) in buyers.iter().zip(answers) {
        match answer.unwrap() {
            Err(e) if e.code() == tonic::Code::Unavailable => {
                told_round_failed += usize::from(e.message().contains("rebalancing for item"));
            }
            other => panic!("{user}: {other:?} while the donor holds {total} units"),
        }
    }
    // Some buyers waited on the round that failed (the rest ran rounds of their own,
    // whose reads timed out): the path this test is about ran.
    assert!(told_round_failed > 0, "no buyer waited on the failed round");
    assert_eq!(h.metrics.gave_up.get(), 0);

    // The pause ends; the same requests again buy every unit, once.
    tokio::time::sleep(Duration::from_millis(2600).saturating_sub(paused_at.elapsed())).await;
    let mut c = c.clone();
    let mut reserved = HashSet::new();
    for user in &buyers {
        let r = reserve(&mut c, a, s, user, "r").await.unwrap();
        match r.outcome() {
            ReserveOutcome::Reserved => assert!(reserved.insert(user.clone())),
            ReserveOutcome::SoldOut => {}
            other => panic!("{user}: {other:?}"),
        }
    }
    assert_eq!(reserved.len() as i64, total.min(20));
    assert_eq!(
        shard_stock(&redis, a, s, SHARDS).await.iter().sum::<i64>(),
        total - reserved.len() as i64
    );
    assert_eq!(stream_len(&redis, a, SHARDS).await, reserved.len() as i64);
}

#[tokio::test]
async fn a_retry_with_the_same_request_id_returns_the_same_reservation() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(5, 500)], 2, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let mut c = h.stock_client().await;
    let first = reserve(&mut c, a, s, "bob", "req-1").await.unwrap();
    assert_eq!(first.outcome(), ReserveOutcome::Reserved);
    let again = reserve(&mut c, a, s, "bob", "req-1").await.unwrap();
    assert_eq!(again.outcome(), ReserveOutcome::Reserved);
    assert_eq!(again.reservation_id, first.reservation_id);
    let other = reserve(&mut c, a, s, "bob", "req-2").await.unwrap();
    assert_eq!(other.outcome(), ReserveOutcome::Duplicate);
    assert_eq!(other.reservation_id, first.reservation_id);
    let redis = cluster.client().await;
    assert_eq!(shard_stock(&redis, a, s, 2).await.iter().sum::<i64>(), 4);
    assert_eq!(stream_len(&redis, a, 2).await, 1);
}

#[tokio::test]
async fn releasing_twice_returns_one_unit_and_a_late_release_leaves_a_rebuy_alone() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(3, 500)], 2, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    let mut c = h.stock_client().await;
    let r1 = reserve(&mut c, a, s, "carol", "c-1").await.unwrap();
    assert_eq!(r1.outcome(), ReserveOutcome::Reserved);
    assert_eq!(shard_stock(&redis, a, s, 2).await.iter().sum::<i64>(), 2);
    assert_eq!(
        release(&mut c, &r1.reservation_id, "carol").await,
        pb::ReleaseOutcome::Released
    );
    assert_eq!(
        release(&mut c, &r1.reservation_id, "carol").await,
        pb::ReleaseOutcome::NotHeld
    );
    assert_eq!(shard_stock(&redis, a, s, 2).await.iter().sum::<i64>(), 3);
    // Re-buy, then the old reservation's release arrives late.
    let r2 = reserve(&mut c, a, s, "carol", "c-2").await.unwrap();
    assert_eq!(r2.outcome(), ReserveOutcome::Reserved);
    assert_ne!(r2.reservation_id, r1.reservation_id);
    assert_eq!(
        release(&mut c, &r1.reservation_id, "carol").await,
        pb::ReleaseOutcome::NotHeld
    );
    assert_eq!(shard_stock(&redis, a, s, 2).await.iter().sum::<i64>(), 2);
    let dup = reserve(&mut c, a, s, "carol", "c-3").await.unwrap();
    assert_eq!(dup.outcome(), ReserveOutcome::Duplicate);
    assert_eq!(dup.reservation_id, r2.reservation_id);
    // Someone else's user id cannot release it.
    assert_eq!(
        release(&mut c, &r2.reservation_id, "mallory").await,
        pb::ReleaseOutcome::NotHeld
    );
    assert_eq!(shard_stock(&redis, a, s, 2).await.iter().sum::<i64>(), 2);
}

#[tokio::test]
async fn selling_out_sets_the_flag_and_a_release_clears_it_with_messages() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(2, 500)], 2, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let sub = cluster.client().await;
    let mut rx = sub.message_rx();
    sub.subscribe(keys::SOLD_OUT_CHANNEL).await.unwrap();
    let redis = cluster.client().await;
    let mut c = h.stock_client().await;
    let mut rids = Vec::new();
    for u in 0..4 {
        let r = reserve(&mut c, a, s, &format!("u{u}"), "r").await.unwrap();
        if r.outcome() == ReserveOutcome::Reserved {
            rids.push((format!("u{u}"), r.reservation_id));
        }
    }
    assert_eq!(rids.len(), 2);
    let msg = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    let m = seckill_lua::messages::SoldOut::parse(&msg.value.as_string().unwrap()).unwrap();
    assert_eq!((m.activity, m.item, m.sold_out), (a, s, true));
    assert_eq!(
        redis.exists::<i64, _>(keys::sold_out(a, s)).await.unwrap(),
        1
    );
    assert_eq!(
        release(&mut c, &rids[0].1, &rids[0].0).await,
        pb::ReleaseOutcome::Released
    );
    let msg = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    let m = seckill_lua::messages::SoldOut::parse(&msg.value.as_string().unwrap()).unwrap();
    assert_eq!((m.activity, m.item, m.sold_out), (a, s, false));
    assert_eq!(
        redis.exists::<i64, _>(keys::sold_out(a, s)).await.unwrap(),
        0
    );
    let r = reserve(&mut c, a, s, "u9", "r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
}

/// One reserve call as stockd sends it when reservations queue behind an in-flight
/// call: a flat answer of (outcome, reservation id, units left, units held) per
/// reservation (the last is not read here).
async fn reserve_call(redis: &Client, call: ReserveCall) -> Vec<(String, String, i64)> {
    let v: Value = redis
        .eval(scripts::RESERVE.body, call.keys, call.args)
        .await
        .expect("reserve script");
    v.into_array()
        .chunks_exact(seckill_lua::calls::RESERVE_FIELDS)
        .map(|f| {
            (
                f[0].as_string().unwrap_or_default(),
                f[1].as_string().unwrap_or_default(),
                f[2].as_i64().unwrap_or(i64::MIN),
            )
        })
        .collect()
}

#[tokio::test]
async fn one_reserve_call_decides_each_of_its_reservations_in_order_as_if_alone() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(3, 500), (5, 700)], 1, Duration::ZERO, HOUR).await;
    let (a, s, t) = (act.id, act.items[0].id, act.items[1].id);
    let redis = cluster.client().await;
    let epoch: String = redis.get(keys::fence(a, 0)).await.unwrap();
    let now = 1_700_000_000_000;

    let mut call = ReserveCall::new(a, 0, now, &epoch, 0, 7);
    for (item, user, req) in [
        (s, "alice", "r1"),
        (s, "alice", "r1"), // the same request again: its reservation
        (s, "alice", "r2"), // another request of hers: she holds one
        (s, "bob", "r3"),
        (t, "alice", "r4"), // another item: a buyer record of its own
        (s, "carol", "r5"), // the last unit of s
        (s, "dave", "r6"),  // none left
    ] {
        call.push(item, user_id(user), request_id(req));
    }
    let got = reserve_call(&redis, call).await;
    let outcomes: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(
        outcomes,
        [
            "RESERVED",
            "RETRY",
            "DUPLICATE",
            "RESERVED",
            "RESERVED",
            "RESERVED",
            "SOLD_OUT"
        ]
    );
    assert_eq!(got[1].1, got[0].1, "a retry names the first reservation");
    assert_eq!(got[2].1, got[0].1, "a duplicate names the held reservation");
    let lefts: Vec<i64> = got.iter().map(|g| g.2).collect();
    assert_eq!(lefts, [2, 2, 2, 1, 4, 0, 0]);
    let rids: HashSet<&str> = [0, 3, 4, 5].iter().map(|&i| got[i].1.as_str()).collect();
    assert_eq!(rids.len(), 4, "every reservation has its own id: {got:?}");
    for i in [0, 3, 5] {
        let id: seckill_lua::ReservationId = got[i].1.parse().unwrap();
        assert_eq!((id.activity, id.item, id.shard), (a, s, 0));
        assert_eq!(id.epoch, epoch);
    }
    assert_eq!(
        got[4].1.parse::<seckill_lua::ReservationId>().unwrap().item,
        t
    );
    assert_eq!(shard_stock(&redis, a, s, 1).await, [0]);
    assert_eq!(shard_stock(&redis, a, t, 1).await, [4]);
    assert_eq!(stream_len(&redis, a, 1).await, 4);
    let seq: u64 = redis.get(keys::seq(a, 0)).await.unwrap();
    assert_eq!(seq, 4, "one sequence number per reservation made");

    // What the call wrote is what four separate calls would have written: one buyer
    // record per user and item, and one stream entry per reservation, in order.
    let buyers: HashMap<String, String> = redis.hgetall(keys::buyers(a, 0, s)).await.unwrap();
    assert_eq!(
        buyers,
        HashMap::from([
            ("alice".to_string(), format!("{}|r1", got[0].1)),
            ("bob".to_string(), format!("{}|r3", got[3].1)),
            ("carol".to_string(), format!("{}|r5", got[5].1)),
        ])
    );
    let entries: Vec<(String, HashMap<String, String>)> = redis
        .xrange_values(keys::orders_stream(a, 0), "-", "+", None)
        .await
        .unwrap();
    let made: Vec<(&str, &str, String, &str)> = [
        (0, "alice", s, "r1"),
        (3, "bob", s, "r3"),
        (4, "alice", t, "r4"),
        (5, "carol", s, "r5"),
    ]
    .iter()
    .map(|&(i, user, item, req)| (got[i].1.as_str(), user, item.to_string(), req))
    .collect();
    assert_eq!(entries.len(), made.len());
    for ((_, fields), (rid, user, item, req)) in entries.iter().zip(&made) {
        let want = HashMap::from([
            ("rid".to_string(), rid.to_string()),
            ("uid".to_string(), user.to_string()),
            ("a".to_string(), a.to_string()),
            ("s".to_string(), item.clone()),
            ("req".to_string(), req.to_string()),
            ("ts".to_string(), now.to_string()),
        ]);
        assert_eq!(fields, &want);
    }

    // A later call sees them: the retry gets its reservation, the sequence goes on, and
    // an item whose stock key is gone answers LOST for its reservation alone.
    let _: i64 = redis.del(keys::stock(a, 0, s)).await.unwrap();
    let mut call = ReserveCall::new(a, 0, now, &epoch, seq, 3);
    call.push(s, user_id("alice"), request_id("r1"));
    call.push(s, user_id("erin"), request_id("r9"));
    call.push(t, user_id("erin"), request_id("r10"));
    let got2 = reserve_call(&redis, call).await;
    assert_eq!(got2[0], ("RETRY".into(), got[0].1.clone(), 0));
    assert_eq!(got2[1], ("LOST".into(), String::new(), -1));
    assert_eq!(got2[2].0, "RESERVED");
    assert_eq!(got2[2].2, 3);
    let id: seckill_lua::ReservationId = got2[2].1.parse().unwrap();
    assert_eq!(id.seq, seq + 1);
    let seq = seq + 1;

    // A high-water mark above the shard's sequence: BEHIND for all, nothing written.
    let mut call = ReserveCall::new(a, 0, now, &epoch, seq + 5, 2);
    call.push(t, user_id("erin"), request_id("r7"));
    call.push(t, user_id("frank"), request_id("r8"));
    let got = reserve_call(&redis, call).await;
    assert_eq!(
        got,
        [
            ("BEHIND".into(), String::new(), seq as i64),
            ("BEHIND".into(), String::new(), seq as i64)
        ]
    );
    // The fence gone: LOST for all, nothing written.
    let _: i64 = redis.del(keys::fence(a, 0)).await.unwrap();
    let mut call = ReserveCall::new(a, 0, now, "", 0, 2);
    call.push(t, user_id("erin"), request_id("r7"));
    call.push(t, user_id("frank"), request_id("r8"));
    let got = reserve_call(&redis, call).await;
    assert!(got.iter().all(|g| g.0 == "LOST"), "{got:?}");
    assert_eq!(shard_stock(&redis, a, t, 1).await, [3]);
    assert_eq!(stream_len(&redis, a, 1).await, 5);
}

/// One item of `units` on two shards, with stockd's fence check out of the way: the
/// tests using it move the fences by hand.
struct FencesByHand {
    stockd: StockdHandle,
    redis: Client,
    a: u64,
    s: u64,
    _db: TestDb,
    _cluster: RedisCluster,
}

impl FencesByHand {
    async fn start(units: u32) -> Self {
        init_tracing();
        let cluster = RedisCluster::start();
        let db = TestDb::create().await;
        let stockd = spawn_stockd(&Deps::new(&cluster, &db), |c| {
            c.stock.fence_check_ms = 600_000;
        })
        .await;
        let act =
            create_published_activity(&stockd, &[(units, 500)], 2, Duration::ZERO, HOUR).await;
        let redis = cluster.client().await;
        Self {
            a: act.id,
            s: act.items[0].id,
            stockd,
            redis,
            _db: db,
            _cluster: cluster,
        }
    }
}

/// The moves' and the release's guards against a rebuild, on the scripts themselves:
/// units taken before a rebuild are never given to a shard the rebuild counted them
/// into (that would create them), a take refuses a shard behind the caller's mark, and
/// a release refuses a shard the rebuild holds closed (the reopen would undo it).
#[tokio::test]
async fn moves_and_releases_never_cross_a_rebuild() {
    use seckill_lua::calls::{GiveCall, ReleaseCall};
    use seckill_tests::redis::call;
    use seckill_tests::stockd::take_call;
    let sale = FencesByHand::start(40).await;
    let (h, redis, a, s) = (&sale.stockd, &sale.redis, sale.a, sale.s);
    let epoch: String = redis.get(keys::fence(a, 0)).await.unwrap();
    assert_eq!(shard_stock(redis, a, s, 2).await, [20, 20]);

    // A take answers the epoch it took under; the give carries it.
    let took = call(redis, take_call((a, 0, s), 3, &epoch, 0))
        .await
        .into_array();
    assert_eq!(took[0].as_i64(), Some(3));
    assert_eq!(took[1].as_string().as_deref(), Some(epoch.as_str()));
    let given: i64 = call(redis, GiveCall::new(a, 1, s, 3, &epoch))
        .await
        .as_i64()
        .unwrap();
    assert_eq!(given, 23);
    assert_eq!(shard_stock(redis, a, s, 2).await, [17, 23]);

    // A take, then a rebuild reopens the home shard under a new epoch (with its own
    // count from MySQL): the give is refused and nothing is added.
    let took = call(redis, take_call((a, 0, s), 2, &epoch, 0))
        .await
        .into_array();
    assert_eq!(took[0].as_i64(), Some(2));
    let newer = format!("{epoch}0");
    let _: () = redis
        .set(keys::fence(a, 1), &newer, None, None, false)
        .await
        .unwrap();
    let given = call(redis, GiveCall::new(a, 1, s, 2, &epoch)).await;
    assert_eq!(given.as_i64(), Some(-2), "stale give: {given:?}");
    assert_eq!(shard_stock(redis, a, s, 2).await, [15, 23]);
    // The stock key gone (fence in place): lost for the give and the take alike,
    // never a key made of the moved units alone.
    let _: () = redis
        .set(keys::fence(a, 1), &epoch, None, None, false)
        .await
        .unwrap();
    let _: i64 = redis.del(keys::stock(a, 1, s)).await.unwrap();
    let given = call(redis, GiveCall::new(a, 1, s, 2, &epoch)).await;
    assert_eq!(given.as_i64(), Some(-1));
    let took = call(redis, take_call((a, 1, s), 2, &epoch, 0))
        .await
        .into_array();
    assert_eq!(took[0].as_i64(), Some(-1));
    let gone: Option<i64> = redis.get(keys::stock(a, 1, s)).await.unwrap();
    assert_eq!(gone, None);
    let _: () = redis
        .set(keys::stock(a, 1, s), 23, None, None, false)
        .await
        .unwrap();
    // The fence gone: lost, nothing added either.
    let _: i64 = redis.del(keys::fence(a, 1)).await.unwrap();
    let given = call(redis, GiveCall::new(a, 1, s, 2, &epoch)).await;
    assert_eq!(given.as_i64(), Some(-1));
    assert_eq!(shard_stock(redis, a, s, 2).await, [15, 23]);

    // A take below the caller's high-water mark under the same epoch (Redis lost
    // writes): nothing taken, the sequence found answered.
    let seq: Option<i64> = redis.get(keys::seq(a, 0)).await.unwrap();
    let seq = seq.unwrap_or(0);
    let took = call(redis, take_call((a, 0, s), 2, &epoch, seq as u64 + 4))
        .await
        .into_array();
    assert_eq!(took[0].as_i64(), Some(-2));
    assert_eq!(took[1].as_i64(), Some(seq));
    assert_eq!(shard_stock(redis, a, s, 2).await[0], 15);

    // The shard under an older epoch than the caller saw open (Redis went back to
    // before a rebuild): the reserve and the take answer BEHIND with 0, nothing written.
    let ahead = format!("{epoch}0");
    let mut call1 = ReserveCall::new(a, 0, 1_700_000_000_000, &ahead, 0, 1);
    call1.push(s, user_id("zoe"), request_id("r1"));
    let got = reserve_call(redis, call1).await;
    assert_eq!(got, [("BEHIND".into(), String::new(), 0)]);
    let took = call(redis, take_call((a, 0, s), 2, &ahead, 0))
        .await
        .into_array();
    assert_eq!(took[0].as_i64(), Some(-2));
    assert_eq!(took[1].as_i64(), Some(0));
    assert_eq!(shard_stock(redis, a, s, 2).await[0], 15);
    let zoe: Option<String> = redis.hget(keys::buyers(a, 0, s), "zoe").await.unwrap();
    assert_eq!(zoe, None);

    // A release while the shard is closed: refused, the record and count untouched.
    let mut c = h.stock_client().await;
    let user = user_on_shard("holder", 0, 2);
    let r = reserve(&mut c, a, s, &user, "r1").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    let rid: seckill_lua::ReservationId = r.reservation_id.parse().unwrap();
    let _: i64 = redis.del(keys::fence(a, 0)).await.unwrap();
    let v = call(redis, ReleaseCall::new(&rid, &user, true))
        .await
        .into_array();
    assert_eq!(v[0].as_string().as_deref(), Some("CLOSED"), "{v:?}");
    assert_eq!(shard_stock(redis, a, s, 2).await[0], 14);
    let held: Option<String> = redis.hget(keys::buyers(a, 0, s), &user).await.unwrap();
    assert!(held.is_some_and(|h| h.starts_with(&r.reservation_id)));
    // Open again: the release goes through, once.
    let _: () = redis
        .set(keys::fence(a, 0), &epoch, None, None, false)
        .await
        .unwrap();
    let v = call(redis, ReleaseCall::new(&rid, &user, true))
        .await
        .into_array();
    assert_eq!(v[0].as_string().as_deref(), Some("RELEASED"));
    assert_eq!(shard_stock(redis, a, s, 2).await[0], 15);
    let v = call(redis, ReleaseCall::new(&rid, &user, true))
        .await
        .into_array();
    assert_eq!(v[0].as_string().as_deref(), Some("NOT_HELD"));
    assert_eq!(shard_stock(redis, a, s, 2).await[0], 15);
}

/// Shards of one activity under different epochs (a publish that warmed some shards,
/// failed, and warmed the rest on its retry under a new epoch): moves between them
/// still carry units, and every unit sells once.
#[tokio::test]
async fn moves_work_between_shards_warmed_under_different_epochs() {
    let sale = FencesByHand::start(20).await;
    let (h, redis, a, s) = (&sale.stockd, &sale.redis, sale.a, sale.s);
    let epoch: String = redis.get(keys::fence(a, 1)).await.unwrap();
    let _: () = redis
        .set(keys::fence(a, 1), format!("{epoch}1"), None, None, false)
        .await
        .unwrap();
    let mut c = h.stock_client().await;
    let mut won = 0;
    for k in 0..25 {
        let user = user_on_shard(&format!("mixed-{k}"), 0, 2);
        let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
        match r.outcome() {
            ReserveOutcome::Reserved => won += 1,
            ReserveOutcome::SoldOut => {}
            other => panic!("{user}: {other:?}"),
        }
    }
    assert_eq!(
        won, 20,
        "the 10 units of shard 1 moved to the buyers of shard 0"
    );
    assert_eq!(shard_stock(redis, a, s, 2).await, [0, 0]);
}

/// A sale of 16 units over 8 shards on a 3-master cluster, split by master: the donors
/// are the shards of shard 0's master, the homes every other shard. Once the homes are
/// bought out, a buyer homed on one can only be served by a move from that master,
/// which the tests then pause for writes.
struct OneMasterDonates {
    cluster: RedisCluster,
    _db: TestDb,
    h: StockdHandle,
    c: StockClient,
    redis: fred::clients::Client,
    a: u64,
    s: u64,
    donor_master: u16,
    homes: Vec<u32>,
}

impl OneMasterDonates {
    const SHARDS: u32 = 8;
    const UNITS: i64 = 16;

    async fn start(tweak: impl FnOnce(&mut stockd::Config)) -> Self {
        init_tracing();
        let cluster = RedisCluster::start();
        let db = TestDb::create().await;
        let h = spawn_stockd(&Deps::new(&cluster, &db), tweak).await;
        let act = create_published_activity(
            &h,
            &[(Self::UNITS as u32, 500)],
            Self::SHARDS,
            Duration::ZERO,
            HOUR,
        )
        .await;
        let (a, s) = (act.id, act.items[0].id);
        let master_of = |i: u32| cluster.master_of_key(&keys::fence(a, i));
        let donor_master = master_of(0);
        let homes: Vec<u32> = (0..Self::SHARDS)
            .filter(|&i| master_of(i) != donor_master)
            .collect();
        assert!(!homes.is_empty(), "the shards span more than one master");
        Self {
            redis: cluster.client().await,
            c: h.stock_client().await,
            cluster,
            _db: db,
            h,
            a,
            s,
            donor_master,
            homes,
        }
    }

    async fn shards(&self) -> Vec<i64> {
        shard_stock(&self.redis, self.a, self.s, Self::SHARDS).await
    }

    /// Every home shard's units reserved by buyers homed there (no move); how many.
    async fn buy_out_homes(&self, prefix: &str) -> i64 {
        let mut c = self.c.clone();
        let mut bought = 0;
        for &i in &self.homes {
            let n = self.shards().await[i as usize];
            for k in 0..n {
                let user = user_on_shard(&format!("{prefix}-{k}"), i, Self::SHARDS);
                let r = reserve(&mut c, self.a, self.s, &user, "r").await.unwrap();
                assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{user}");
                bought += 1;
            }
        }
        bought
    }

    /// Pauses the donors' master for writes for `ms`.
    fn pause_donors(&self, ms: u64) -> Instant {
        let at = Instant::now();
        self.cluster.cli_at(
            self.donor_master,
            &["CLIENT", "PAUSE", &ms.to_string(), "WRITE"],
        );
        at
    }
}

/// A rebalancing take whose outcome stockd cannot know (it timed out, and Redis ran it
/// later) takes units from the donor that no give brings home. stockd starts a rebuild
/// for that case, which counts the units back from MySQL: after it, every unit is either
/// reserved or in a shard, none lost and none made up. A second such failure within
/// `stock.move_repair_gap_ms` of the first rebuild waits for the gap to end instead of
/// rebuilding at once (a Redis that keeps timing out must not keep the activity
/// rebuilding), and its units are counted back all the same.
///
/// The donors' master is paused for writes (`CLIENT PAUSE … WRITE`, 2.5 s): a round's
/// scan (a read) goes through, its `TAKE` waits in the master's queue past stockd's
/// deadline (1 s) and runs when the pause ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_that_timed_out_and_ran_later_lose_no_unit_and_rebuild_once_per_gap() {
    const GAP: Duration = Duration::from_secs(6);
    let sale = OneMasterDonates::start(|c| {
        c.redis.timeout_ms = 1000;
        c.stock.move_repair_gap_ms = GAP.as_millis() as u64;
    })
    .await;
    let (a, s, h) = (sale.a, sale.s, &sale.h);
    let mut c = sale.c.clone();
    const UNITS: i64 = OneMasterDonates::UNITS;
    // (Shard 0 is a donor, and a rebuild's split gives shard 0 a unit first: the second
    // round finds one there.)
    let mut reserved = 0i64;
    let ok = || h.metrics.recomputes.with_label_values(&["ok"]).get();
    let repairs = |when: &str| h.metrics.move_repairs.with_label_values(&[when]).get();
    let mut first_failure = None;
    for (round, want) in [("now", 1), ("deferred", 1)] {
        let bought = sale.buy_out_homes(&format!("{round}-early")).await;
        reserved += bought;
        let (takes_before, ok_before) = (takes(h), ok());

        // A buyer of an empty home: its take waits out stockd's deadline.
        let paused_at = sale.pause_donors(2500);
        let user = user_on_shard(
            &format!("{round}-late"),
            sale.homes[0],
            OneMasterDonates::SHARDS,
        );
        match reserve(&mut c, a, s, &user, "r").await {
            Ok(r) if r.outcome() == ReserveOutcome::Reserved => reserved += 1,
            other => tracing::info!(?other, "the late buyer's answer"),
        }
        first_failure.get_or_insert_with(Instant::now);
        assert!(
            takes(h) > takes_before,
            "{round}: the late buyer's home was empty"
        );
        assert_eq!(repairs(round), want, "{round}");

        // The pause ends and the take runs; then a rebuild counts the units back.
        tokio::time::sleep(Duration::from_millis(2500).saturating_sub(paused_at.elapsed())).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let after = sale.shards().await;
            let whole = after.iter().sum::<i64>() + reserved == UNITS;
            if (whole && ok() > ok_before) || Instant::now() > deadline {
                // Read again once settled (one read is one GET after another).
                let after = sale.shards().await;
                assert_eq!(
                    after.iter().sum::<i64>() + reserved,
                    UNITS,
                    "{round}: every unit reserved or on sale: shards {after:?}, {reserved} reserved"
                );
                assert!(ok() > ok_before, "{round}: rebuilt");
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The second rebuild started a gap after the first one did (at the first failure).
    let since = first_failure.expect("set").elapsed();
    assert!(
        since >= GAP,
        "the deferred rebuild came {since:?} after the first failure"
    );
    assert_eq!(
        stream_len(&sale.redis, a, OneMasterDonates::SHARDS).await,
        reserved
    );
}

/// A move's failure that asks for a rebuild while another rebuild runs is not dropped:
/// the running one may have read the shards before the failed take ran, so a rebuild of
/// the move's own follows once it ends. (Before, `trigger_recompute` ignored the request
/// while a rebuild ran.)
///
/// The donors' master is paused for writes (4.5 s). A buyer of an empty home sends a
/// `TAKE` there, which waits past stockd's deadline (2 s). Meanwhile another shard's fence
/// is deleted and a buyer homed there starts a rebuild for the lost state; its writes to
/// the paused master wait too, so it is still running when the take times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_repair_asked_during_a_rebuild_runs_after_it() {
    const DEADLINE: Duration = Duration::from_secs(2);
    let sale = OneMasterDonates::start(|c| c.redis.timeout_ms = DEADLINE.as_millis() as u64).await;
    let (a, s, h) = (sale.a, sale.s, &sale.h);
    let mut reserved = sale.buy_out_homes("early").await;
    let (late_home, lost_home) = (sale.homes[0], *sale.homes.last().unwrap());
    assert_ne!(late_home, lost_home, "two masters hold homes");
    let ok = || h.metrics.recomputes.with_label_values(&["ok"]).get();
    let (takes_before, ok_before) = (takes(h), ok());
    let rounds_before = h.metrics.rebalance_rounds.get();

    let paused_at = sale.pause_donors(4500);
    let late = {
        let mut c = sale.c.clone();
        let user = user_on_shard("late", late_home, OneMasterDonates::SHARDS);
        tokio::spawn(async move { reserve(&mut c, a, s, &user, "r").await })
    };
    // Its round starts; the round's scan (a read) goes through and its take waits in the
    // paused master. (A buyer that came after the rebuild started would get UNAVAILABLE
    // without a move, and no repair would be counted below.)
    wait_until_async("the late buyer's round", DEADLINE, || async {
        h.metrics.rebalance_rounds.get() > rounds_before
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Another shard loses its state; its next buyer starts a rebuild.
    let _: i64 = sale.redis.del(keys::fence(a, lost_home)).await.unwrap();
    let user = user_on_shard("lost", lost_home, OneMasterDonates::SHARDS);
    let answer = reserve(&mut sale.c.clone(), a, s, &user, "r").await;
    assert!(
        paused_at.elapsed() < DEADLINE - Duration::from_millis(100) && takes(h) == takes_before,
        "the rebuild started before the take timed out"
    );
    tracing::info!(?answer, "the buyer of the lost shard");
    match late.await.unwrap() {
        Ok(r) if r.outcome() == ReserveOutcome::Reserved => reserved += 1,
        other => tracing::info!(?other, "the late buyer's answer"),
    }
    let repairs = |when: &str| h.metrics.move_repairs.with_label_values(&[when]).get();
    assert_eq!(
        (repairs("now"), repairs("deferred")),
        (0, 1),
        "the failed take asked for a rebuild after the running one"
    );

    // The running rebuild ends after the pause; the move's own follows it.
    wait_until_async("two rebuilds", Duration::from_secs(20), || async {
        ok() >= ok_before + 2
    })
    .await;
    wait_until_async(
        "every unit reserved or on sale",
        Duration::from_secs(10),
        || async { sale.shards().await.iter().sum::<i64>() + reserved == OneMasterDonates::UNITS },
    )
    .await;
}

/// A move whose buyer went away before its units came home (a client deadline) clears
/// the sold-out flag when the give lands: a round that ran while the units were in
/// transit may have found every shard empty and set it, and nobody would reserve from
/// those units to clear it, so they would stay hidden behind the flag.
///
/// The donors' master is paused for writes, so the take waits past the buyer's
/// deadline (stockd's own Redis deadline is longer: the take succeeds); the flag is set
/// meanwhile, as the racing round would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_that_came_home_after_their_buyer_left_are_not_hidden_by_the_sold_out_flag() {
    let sale = OneMasterDonates::start(|c| c.redis.timeout_ms = 5000).await;
    let (a, s, redis) = (sale.a, sale.s, &sale.redis);
    let mut c = sale.c.clone();
    let reserved = sale.buy_out_homes("early").await;
    let flagged = || sold_out_flagged(redis, a, s);
    assert!(!flagged().await);

    // The buyer gives up after 300 ms; the take runs when the pause ends, at 1500 ms.
    let paused_at = sale.pause_donors(1500);
    let home = sale.homes[0];
    let user = user_on_shard("late", home, OneMasterDonates::SHARDS);
    let mut request = tonic::Request::new(pb::ReserveRequest {
        activity_id: a,
        item_id: s,
        user_id: user,
        request_id: "r".into(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(300));
    let gone = c.reserve(request).await.unwrap_err();
    assert!(
        matches!(
            gone.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{gone:?}"
    );
    // A round that saw every shard empty sets the flag (sent during the pause: it lands
    // before the give's clear whichever master holds it).
    assert!(
        paused_at.elapsed() < Duration::from_millis(1200),
        "set during the pause"
    );
    set_sold_out_flag(redis, a, s).await;

    // The give lands with nobody waiting: the units are on sale, and not hidden.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let shards = sale.shards().await;
        let home_units = shards[home as usize];
        let flag_set = flagged().await;
        if (home_units > 0 && !flag_set) || Instant::now() > deadline {
            assert!(home_units > 0, "the units came home: {shards:?}");
            assert!(
                !flag_set,
                "units on sale at {shards:?} behind a sold-out flag"
            );
            // Read again: one read of the shards is one GET after another, and may have
            // seen the donor before the take and the home after the give.
            let shards = sale.shards().await;
            assert_eq!(
                shards.iter().sum::<i64>() + reserved,
                OneMasterDonates::UNITS,
                "{shards:?}"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
