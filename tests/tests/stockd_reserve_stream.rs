#![cfg(feature = "stockd")]
//! `StockService.ReserveStream` (the edge's path since streams) on a real 3-master Redis
//! Cluster: three edges' streams, each sending a crowd's reservations in messages as
//! they come, sell exactly the stock, once per user, and every entry is answered once
//! under its own tag; a bad entry or an oversized message fails entry by entry and
//! changes no stock; an entry past its `timeout_ms` is answered DEADLINE_EXCEEDED and its
//! retry finds its unit; a stockd that shuts down refuses new entries at once, finishes
//! the ones it started and ends the stream, so the daemon stops.

use seckill_tests::Deps;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use seckill_proto::pb::{self, ReserveOutcome};
use seckill_tests::stockd::{
    batch_entry, create_published_activity, double_clicks, entry_outcome as outcome,
    entry_response, shard_stock, spawn_stockd, stream_len, StockClient, StockdHandle,
};
use seckill_tests::{init_tracing, RedisCluster, TestDb};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Code;

const HOUR: Duration = Duration::from_secs(3600);

fn entry(a: u64, s: u64, user: &str, req: &str, tag: u64) -> pb::ReserveBatchEntry {
    pb::ReserveBatchEntry {
        tag,
        ..batch_entry(a, s, user, req, 0)
    }
}

/// One published item of `stock` units over `shards` on a fresh stockd, Redis Cluster
/// and database.
struct Sale {
    cluster: RedisCluster,
    _db: TestDb,
    h: StockdHandle,
    a: u64,
    s: u64,
    c: StockClient,
}

async fn sale(stock: u32, shards: u32) -> Sale {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(stock, 500)], shards, Duration::ZERO, HOUR).await;
    let c = h.stock_client().await;
    Sale {
        a: act.id,
        s: act.items[0].id,
        cluster,
        _db: db,
        h,
        c,
    }
}

/// An open stream: the sending side and the answers.
struct Stream {
    out: mpsc::UnboundedSender<pb::ReserveBatchRequest>,
    answers: tonic::Streaming<pb::ReserveBatchResponse>,
}

async fn open(c: &StockClient) -> Stream {
    let (out, body) = mpsc::unbounded_channel();
    let answers = c
        .clone()
        .reserve_stream(UnboundedReceiverStream::new(body))
        .await
        .expect("the stream is accepted")
        .into_inner();
    Stream { out, answers }
}

impl Stream {
    fn send(&self, entries: Vec<pb::ReserveBatchEntry>) {
        self.out
            .send(pb::ReserveBatchRequest { entries })
            .expect("the stream is open");
    }

    /// Reads answers until `n` entries are answered: each tag's result (a tag answered
    /// twice fails).
    async fn answers(&mut self, n: usize) -> HashMap<u64, pb::ReserveResult> {
        let mut got = HashMap::new();
        while got.len() < n {
            let m = tokio::time::timeout(Duration::from_secs(10), self.answers.message())
                .await
                .expect("answers within 10 s")
                .expect("the stream holds")
                .expect("the stream is not over");
            for r in m.results {
                let tag = r.tag;
                assert!(got.insert(tag, r).is_none(), "tag {tag} answered twice");
            }
        }
        got
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_edges_streams_sell_exactly_the_stock_once_per_user_each_entry_answered_once() {
    let Sale {
        cluster,
        _db,
        h,
        a,
        s,
        c,
    } = sale(100, 8).await;
    // 300 users, each clicking twice (two request ids) on two of three edges; each
    // edge sends its 200 entries in messages of 1 to 40 as they come, all at once.
    let edges: Vec<_> = double_clicks(300, 3)
        .into_iter()
        .map(|calls| {
            let c = c.clone();
            tokio::spawn(async move {
                let mut st = open(&c).await;
                let mut sent = 0;
                let mut size = 1;
                while sent < calls.len() {
                    let end = (sent + size).min(calls.len());
                    // Tags are the edge's own: here 1000 + the entry's index.
                    let entries = (sent..end)
                        .map(|i| entry(a, s, &calls[i].0, &calls[i].1, 1000 + i as u64))
                        .collect();
                    st.send(entries);
                    sent = end;
                    size = size % 40 + 7;
                    tokio::task::yield_now().await;
                }
                let answers = st.answers(calls.len()).await;
                (calls, answers)
            })
        })
        .collect();
    let mut held: HashMap<String, HashSet<String>> = HashMap::new();
    let (mut reserved, mut sold_out) = (0, 0);
    for e in edges {
        let (calls, answers) = e.await.unwrap();
        assert_eq!(answers.len(), calls.len(), "every entry answered once");
        for (i, (user, request)) in calls.into_iter().enumerate() {
            let r = answers[&(1000 + i as u64)].clone();
            let response = entry_response(&c, a, s, (&user, &request), r).await;
            match response.outcome() {
                ReserveOutcome::Reserved | ReserveOutcome::Duplicate => {
                    if response.outcome() == ReserveOutcome::Reserved {
                        reserved += 1;
                    }
                    held.entry(user)
                        .or_default()
                        .insert(response.reservation_id);
                }
                ReserveOutcome::SoldOut => sold_out += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    eprintln!("reserved {reserved}, sold out {sold_out}");
    for (user, rids) in &held {
        assert_eq!(rids.len(), 1, "{user} holds {rids:?}");
    }
    assert_eq!(reserved, 100, "exactly the stock");
    assert_eq!(held.values().flatten().collect::<HashSet<_>>().len(), 100);
    let redis = cluster.client().await;
    let shards = shard_stock(&redis, a, s, 8).await;
    assert!(shards.iter().all(|&n| n >= 0), "{shards:?}");
    assert_eq!(shards.iter().sum::<i64>(), 0, "{shards:?}");
    assert_eq!(stream_len(&redis, a, 8).await, 100);
    // The edges' messages met in the shards' group commit.
    let b = &h.metrics.reserve_batch;
    assert!(b.get_sample_sum() > b.get_sample_count() as f64);
    assert!(h.metrics.reserve_stream_entries.get_sample_count() >= 3);
}

#[tokio::test]
async fn a_bad_entry_or_an_oversized_message_fails_entry_by_entry_and_takes_nothing() {
    let Sale {
        cluster,
        _db,
        h: _stockd,
        a,
        s,
        c,
    } = sale(10, 2).await;
    let redis = cluster.client().await;
    let before = shard_stock(&redis, a, s, 2).await;
    let mut st = open(&c).await;

    let no_request = pb::ReserveBatchEntry {
        tag: 3,
        ..Default::default()
    };
    st.send(vec![
        entry(a, s, "alice", "alice-1", 1),
        entry(a, s, "bob", "", 2), // request_id missing
        no_request,
    ]);
    st.send(vec![]); // ignored
    let oversized = (0..1025)
        .map(|i| entry(a, s, &format!("u{i}"), "r", 10 + i))
        .collect();
    st.send(oversized);
    let got = st.answers(3 + 1025).await;
    assert_eq!(outcome(&got[&1]), ReserveOutcome::Reserved);
    for (tag, field) in [(2, "request_id"), (3, "request")] {
        assert_eq!(got[&tag].code, Code::InvalidArgument as i32, "tag {tag}");
        assert!(got[&tag].message.contains(field), "{}", got[&tag].message);
    }
    for tag in 10..10 + 1025 {
        assert_eq!(got[&tag].code, Code::InvalidArgument as i32);
        assert!(
            got[&tag].message.contains("entries"),
            "{}",
            got[&tag].message
        );
    }
    // Only alice's unit is gone; her resend on the same stream answers the same
    // reservation.
    let after = shard_stock(&redis, a, s, 2).await;
    assert_eq!(before.iter().sum::<i64>() - after.iter().sum::<i64>(), 1);
    st.send(vec![entry(a, s, "alice", "alice-1", 7)]);
    let again = st.answers(1).await;
    assert_eq!(
        again[&7].response.as_ref().unwrap().reservation_id,
        got[&1].response.as_ref().unwrap().reservation_id
    );
    assert_eq!(shard_stock(&redis, a, s, 2).await, after);
}

/// Every master of `cluster` stopped (SIGSTOP) for `ms`.
fn stall_masters(cluster: &RedisCluster, ms: u64) -> Vec<seckill_tests::redis::Stall> {
    cluster
        .masters()
        .into_iter()
        .map(|p| cluster.stall(p, ms))
        .collect()
}

#[tokio::test]
async fn an_entry_past_its_timeout_is_answered_deadline_exceeded_and_its_retry_finds_its_unit() {
    let Sale {
        cluster,
        _db,
        h: _stockd,
        a,
        s,
        c,
    } = sale(10, 2).await;
    let mut st = open(&c).await;
    // Redis stops for 300 ms (under stockd's 500 ms Redis timeout): an entry the edge
    // waits 30 ms for is answered DEADLINE_EXCEEDED, one without a limit is decided.
    let stalls = stall_masters(&cluster, 300);
    let mut hasty = entry(a, s, "hasty", "hasty-1", 1);
    hasty.timeout_ms = 30;
    st.send(vec![hasty, entry(a, s, "patient", "patient-1", 2)]);
    let got = st.answers(2).await;
    assert_eq!(got[&1].code, Code::DeadlineExceeded as i32, "{:?}", got[&1]);
    assert_eq!(outcome(&got[&2]), ReserveOutcome::Reserved);
    stalls.into_iter().for_each(|s| s.join());
    // The hasty buyer's retry with the same request id gets the unit its call took (or a
    // fresh one): one reservation either way, never two.
    st.send(vec![entry(a, s, "hasty", "hasty-1", 3)]);
    st.send(vec![entry(a, s, "hasty", "hasty-2", 4)]);
    let again = st.answers(2).await;
    assert_eq!(outcome(&again[&3]), ReserveOutcome::Reserved);
    assert_eq!(outcome(&again[&4]), ReserveOutcome::Duplicate);
    let redis = cluster.client().await;
    assert_eq!(shard_stock(&redis, a, s, 2).await.iter().sum::<i64>(), 8);
}

#[tokio::test]
async fn a_stockd_shutting_down_refuses_new_entries_at_once_finishes_the_rest_and_ends_the_stream()
{
    let Sale {
        cluster,
        _db,
        h,
        a,
        s,
        c,
    } = sale(50, 4).await;
    let mut st = open(&c).await;
    st.send(
        (0..5)
            .map(|i| entry(a, s, &format!("w{i}"), "r", i))
            .collect(),
    );
    assert!(st
        .answers(5)
        .await
        .values()
        .all(|r| outcome(r) == ReserveOutcome::Reserved));

    // Ten entries stuck in a stalled Redis when the daemon begins to stop; ten more sent
    // after that: those are refused UNAVAILABLE (fail over) before Redis even resumes,
    // the stuck ten are finished, then the stream ends with OK and the daemon stops.
    let stalls = stall_masters(&cluster, 400);
    st.send(
        (10..20)
            .map(|i| entry(a, s, &format!("u{i}"), "r", i))
            .collect(),
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stop = tokio::spawn(h.stop());
    tokio::time::sleep(Duration::from_millis(50)).await;
    st.send(
        (20..30)
            .map(|i| entry(a, s, &format!("u{i}"), "r", i))
            .collect(),
    );
    let refused = st.answers(10).await;
    for tag in 20..30 {
        assert_eq!(
            refused[&tag].code,
            Code::Unavailable as i32,
            "{:?}",
            refused.get(&tag)
        );
    }
    stalls.into_iter().for_each(|s| s.join());
    let finished = st.answers(10).await;
    for tag in 10..20 {
        assert_eq!(
            outcome(&finished[&tag]),
            ReserveOutcome::Reserved,
            "tag {tag}"
        );
    }
    let end = tokio::time::timeout(Duration::from_secs(5), st.answers.message())
        .await
        .expect("the stream ends");
    assert!(matches!(end, Ok(None)), "ended with OK: {end:?}");
    tokio::time::timeout(Duration::from_secs(10), stop)
        .await
        .expect("stockd stops with an edge's stream open")
        .unwrap()
        .expect("stockd stopped cleanly");
    // Exactly the 15 answered RESERVED took units.
    let redis = cluster.client().await;
    assert_eq!(shard_stock(&redis, a, s, 4).await.iter().sum::<i64>(), 35);
}
