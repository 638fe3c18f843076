#![cfg(feature = "stockd")]
//! `StockService.ReserveBatch` (the edge's path) on a real 3-master Redis Cluster:
//! concurrent batches from a crowd sell exactly the stock, once per user; each entry is
//! answered as its own `Reserve` would be (retry, duplicate, not found, a refused
//! field), in order; a bad entry fails alone and changes no stock.

use seckill_tests::Deps;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use fred::prelude::*;
use seckill_lua::keys;
use seckill_proto::pb::{self, ReserveOutcome};
use seckill_proto::trace::TraceParent;
use seckill_tests::stockd::{
    batch_entry as entry, create_published_activity, create_published_activity_limited,
    double_clicks, entry_outcome as outcome, entry_response, shard_stock, spawn_stockd, stream_len,
    StockClient,
};
use seckill_tests::{init_tracing, RedisCluster, TestDb};
use tonic::Code;

const HOUR: Duration = Duration::from_secs(3600);

async fn batch(c: &StockClient, entries: Vec<pb::ReserveBatchEntry>) -> Vec<pb::ReserveResult> {
    let n = entries.len();
    let results = c
        .clone()
        .reserve_batch(pb::ReserveBatchRequest { entries })
        .await
        .expect("the call is accepted")
        .into_inner()
        .results;
    assert_eq!(results.len(), n, "one result per entry");
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_from_a_crowd_sell_exactly_the_stock_once_per_user() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(100, 500)], 8, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let c = h.stock_client().await;
    // 300 users, each in two of six batches of 100 under two request ids (a double
    // click landing on two edges), every batch sent at once.
    let tasks: Vec<_> = double_clicks(300, 6)
        .into_iter()
        .map(|calls| {
            let c = c.clone();
            tokio::spawn(async move {
                let entries = calls.iter().map(|(u, r)| entry(a, s, u, r, 0)).collect();
                let results = batch(&c, entries).await;
                calls.into_iter().zip(results).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut held: HashMap<String, HashSet<String>> = HashMap::new();
    let (mut reserved, mut sold_out, mut duplicate) = (0, 0, 0);
    for t in tasks {
        for ((user, request), r) in t.await.unwrap() {
            let response = entry_response(&c, a, s, (&user, &request), r).await;
            match response.outcome() {
                ReserveOutcome::Reserved => {
                    reserved += 1;
                    held.entry(user)
                        .or_default()
                        .insert(response.reservation_id);
                }
                ReserveOutcome::Duplicate => {
                    duplicate += 1;
                    held.entry(user)
                        .or_default()
                        .insert(response.reservation_id);
                }
                ReserveOutcome::SoldOut => sold_out += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    eprintln!("reserved {reserved}, duplicate {duplicate}, sold out {sold_out}");
    // Never two to one person: every answer a user got names one reservation.
    for (user, rids) in &held {
        assert_eq!(rids.len(), 1, "{user} holds {rids:?}");
    }
    // Exactly the stock, no unit twice.
    assert_eq!(reserved, 100);
    let rids: HashSet<_> = held.values().flatten().collect();
    assert_eq!(rids.len(), 100);
    let redis = cluster.client().await;
    let shards = shard_stock(&redis, a, s, 8).await;
    assert!(shards.iter().all(|&n| n >= 0), "{shards:?}");
    assert_eq!(shards.iter().sum::<i64>(), 0, "{shards:?}");
    assert_eq!(
        stream_len(&redis, a, 8).await,
        100,
        "one stream entry per reservation"
    );
    // The batches met in the shards' group commit.
    let b = &h.metrics.reserve_batch;
    assert!(
        b.get_sample_sum() > b.get_sample_count() as f64,
        "no Redis call carried more than one reservation"
    );
    // Each of the six calls is timed once, as a whole.
    assert_eq!(h.metrics.reserve_batch_rpc_seconds.get_sample_count(), 6);
}

#[tokio::test]
async fn each_entry_is_answered_as_its_own_reserve_in_order_and_a_bad_one_fails_alone() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let mut admin = h.admin_client().await;
    let act =
        create_published_activity_limited(&mut admin, &[(10, 500)], 2, Duration::ZERO, HOUR, 3)
            .await;
    let (a, s) = (act.id, act.items[0].id);
    let c = h.stock_client().await;
    let redis = cluster.client().await;
    let before = shard_stock(&redis, a, s, 2).await;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut traced = entry(a, s, "alice", "alice-1", 2);
    traced.traceparent = TP.into();
    let mut garbled = entry(a, s, "dave", "dave-1", 0);
    garbled.traceparent = "not a traceparent".into();
    let results = batch(
        &c,
        vec![
            traced,
            entry(a, s, "bob", "", 0),               // request_id missing
            entry(a, s, "carol", "carol-1", 4),      // above the limit of 3
            entry(a, s + 1000, "erin", "erin-1", 0), // no such item
            garbled,                                 // dropped, not refused
            pb::ReserveBatchEntry::default(),        // no request at all
        ],
    )
    .await;
    assert_eq!(outcome(&results[0]), ReserveOutcome::Reserved);
    let alice = results[0].response.clone().unwrap();
    assert_eq!(alice.quantity, 2);
    for (i, field) in [(1, "request_id"), (2, "quantity"), (5, "request")] {
        assert_eq!(results[i].code, Code::InvalidArgument as i32, "entry {i}");
        assert!(results[i].message.contains(field), "{}", results[i].message);
        assert!(results[i].response.is_none());
    }
    assert_eq!(outcome(&results[3]), ReserveOutcome::NotFound);
    assert_eq!(outcome(&results[4]), ReserveOutcome::Reserved);

    // The refused entries changed no stock: only alice's 2 and dave's 1 are gone.
    let after = shard_stock(&redis, a, s, 2).await;
    assert_eq!(before.iter().sum::<i64>() - after.iter().sum::<i64>(), 3);

    // The buyer's trace reached alice's stream entry.
    let rid: seckill_lua::ReservationId = alice.reservation_id.parse().unwrap();
    let entries: Vec<(String, HashMap<String, String>)> = redis
        .xrange_values(keys::orders_stream(a, rid.shard), "-", "+", None)
        .await
        .unwrap();
    let fields = entries
        .into_iter()
        .map(|(_, f)| f)
        .find(|f| f.get("rid") == Some(&alice.reservation_id))
        .expect("alice's stream entry");
    assert_eq!(
        TraceParent::parse(&fields["tp"]).unwrap().trace_id(),
        &TP[3..35]
    );

    // A resend answers the same reservation; another request id is a duplicate.
    let again = batch(
        &c,
        vec![
            entry(a, s, "alice", "alice-1", 2),
            entry(a, s, "alice", "alice-2", 1),
        ],
    )
    .await;
    assert_eq!(outcome(&again[0]), ReserveOutcome::Reserved);
    assert_eq!(
        again[0].response.as_ref().unwrap().reservation_id,
        alice.reservation_id
    );
    assert_eq!(outcome(&again[1]), ReserveOutcome::Duplicate);
    assert_eq!(
        again[1].response.as_ref().unwrap().reservation_id,
        alice.reservation_id
    );
    let last = shard_stock(&redis, a, s, 2).await;
    assert_eq!(last, after, "a resend and a duplicate take nothing");

    // The call itself: empty or too large is INVALID_ARGUMENT naming `entries`.
    for n in [0, 1025] {
        let entries = (0..n)
            .map(|i| entry(a, s, &format!("u{i}"), "r", 0))
            .collect();
        let err = c
            .clone()
            .reserve_batch(pb::ReserveBatchRequest { entries })
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("entries"), "{}", err.message());
    }
    assert_eq!(shard_stock(&redis, a, s, 2).await, last);
}
