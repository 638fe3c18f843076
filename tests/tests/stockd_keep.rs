#![cfg(feature = "stockd")]
//! Units a rebalancing round moved home are kept for the buyers it carried
//! (`stock.rebalance_keep_ms`, `stockd/src/mover.rs`), on a real cluster: another home's
//! round takes only what the donor holds beyond them, and the keep counts down as those
//! buyers reserve, so a round that found nothing but kept units reads the shards again as
//! soon as they are bought instead of at the keep's end; once the keep ends, it takes
//! what is on offer within the same round.
//!
//! The carried buyer is held between its round and its reservation for real: the fail
//! point `stockd::reserve::carried` blocks the runtime thread of the in-process stockd for
//! `HOLD_MS`. Another buyer's round runs meanwhile on the other thread.
//!
//! A test binary of its own: a fail point is process-wide (and its tests take turns,
//! [`SERIAL`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use seckill_proto::pb;
use seckill_tests::redis::user_on_shard;
use seckill_tests::stockd::{
    create_published_activity, reserve, set_shard_stock, shard_stock, spawn_stockd, stream_len,
    StockdHandle,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 4;
const KEEP_MS: u64 = 1000;
/// How long the carried buyer is held: well inside the keep.
const HOLD_MS: u64 = 400;
const CARRIED: &str = "stockd::reserve::carried";

/// The tests of this binary take turns: they hold the same fail point.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Holds the next buyer a round carries home for `hold_ms`, once; the receiver hears
/// when (the round's keep is set by then).
fn hold_the_next_carried_buyer(hold_ms: u64) -> mpsc::Receiver<Instant> {
    let (tx, rx) = mpsc::channel();
    let held = AtomicBool::new(false);
    fail::cfg_callback(CARRIED, move || {
        if !held.swap(true, Ordering::SeqCst) {
            let _ = tx.send(Instant::now());
            std::thread::sleep(Duration::from_millis(hold_ms));
        }
    })
    .unwrap();
    rx
}

/// When the carried buyer was held.
async fn held(rx: mpsc::Receiver<Instant>) -> Instant {
    tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("no buyer was carried home by a round")
}

fn outcome(r: Result<pb::ReserveResponse, tonic::Status>) -> String {
    match r {
        Ok(r) => format!("{:?}", r.outcome()),
        Err(e) => format!("{:?}", e.code()),
    }
}

/// `buyer`'s reservation of `(a, s)`, in a task of its own.
fn reserve_in_task(
    h: &StockdHandle,
    (a, s): (u64, u64),
    buyer: String,
) -> tokio::task::JoinHandle<String> {
    let addr = h.addr.clone();
    tokio::spawn(async move {
        let mut c = seckill_tests::stockd::stock_client(&addr).await;
        outcome(reserve(&mut c, a, s, &buyer, "r").await)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_units_stay_for_the_carried_buyers_and_their_reservations_end_the_keep() {
    let _turn = SERIAL.lock().await;
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| {
        c.stock.rebalance_batch = 4;
        c.stock.rebalance_keep_ms = KEEP_MS;
    })
    .await;
    let redis = cluster.client().await;
    let buyer = |home: u32, name: &str| user_on_shard(name, home, SHARDS);
    let rounds = || h.metrics.rebalance_rounds.get();

    // 1. Another home's round takes what the donor holds beyond the kept units. x's round
    // brings the batch (4) home to shard 0 and keeps 1 for x, who is held before it
    // reserves. y's round (home 1) is offered 3 of shard 0's 4 and takes them; x then
    // finds its unit at home. Without the keep, y's round takes all 4 and x needs a
    // round of its own again: 3 rounds instead of 2.
    let act = create_published_activity(&h, &[(4, 500)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    set_shard_stock(&redis, a, s, &[0, 0, 4, 0]).await;
    let before = rounds();
    let hold = hold_the_next_carried_buyer(HOLD_MS);
    let x = reserve_in_task(&h, (a, s), buyer(0, "x"));
    held(hold).await;
    let mut c = h.stock_client().await;
    let r = reserve(&mut c, a, s, &buyer(1, "y"), "r").await;
    assert_eq!(outcome(r), "Reserved");
    assert_eq!(x.await.unwrap(), "Reserved");
    fail::remove(CARRIED);
    assert_eq!(shard_stock(&redis, a, s, SHARDS).await, vec![0, 2, 0, 0]);
    assert_eq!(
        rounds() - before,
        2,
        "x's kept unit was taken: x ran a second round"
    );

    // 2. The keep counts down. x's round brings the last unit home and keeps it for x,
    // who is held. y's round (home 1) finds only that kept unit and waits: for x to
    // reserve it (at HOLD_MS), not for the keep's end (at KEEP_MS). Then it reads the
    // shards again, finds nothing, looks, and y is told sold out.
    let act = create_published_activity(&h, &[(1, 500)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    set_shard_stock(&redis, a, s, &[0, 0, 1, 0]).await;
    let hold = hold_the_next_carried_buyer(HOLD_MS);
    let x = reserve_in_task(&h, (a, s), buyer(0, "x"));
    let held_at = held(hold).await;
    let round_secs = || h.metrics.rebalance_round_seconds.get_sample_sum();
    let before = round_secs();
    let r = reserve(&mut c, a, s, &buyer(1, "y"), "r").await;
    let answered = held_at.elapsed();
    // Only y's round ran meanwhile (x's ended before x was held).
    let waited = Duration::from_secs_f64(round_secs() - before);
    assert_eq!(outcome(r), "SoldOut");
    assert_eq!(x.await.unwrap(), "Reserved");
    fail::remove(CARRIED);
    assert_eq!(shard_stock(&redis, a, s, SHARDS).await, vec![0; 4]);
    assert_eq!(stream_len(&redis, a, SHARDS).await, 1);
    eprintln!("y's round took {waited:?}; y was answered {answered:?} after x was held");
    // A round that met the keep waits for x: most of HOLD_MS. One that read the shards
    // after x had reserved (a machine too slow to get y's call there within HOLD_MS)
    // found nothing kept and looked at once: then the rest is not checked. (Had it met
    // no keep while x was held, it would have taken x's unit: y reserved, not told sold
    // out, above.)
    if waited < Duration::from_millis(HOLD_MS / 4) {
        eprintln!("y's round did not meet the keep");
        return;
    }
    assert!(
        answered < Duration::from_millis(KEEP_MS - 200),
        "y was answered {answered:?} after x was held: its round waited for the keep's end \
         ({KEEP_MS} ms), not for x's reservation ({HOLD_MS} ms)"
    );
}

/// A round that waited for kept units reads the shards again and takes what is on offer
/// by then, within the same round: its callers do not spend an attempt on an empty home
/// for it. With one attempt, y's round meets x's kept unit, waits for the keep's end (x is
/// held past it) and then takes the unit: y is answered RESERVED. When the round ended at
/// the wait instead, y's one attempt went to its empty home and y was told to retry
/// (ABORTED) while the unit sat on offer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_that_waited_for_kept_units_takes_them_once_the_keep_ends() {
    const KEEP_MS: u64 = 300;
    const HOLD_MS: u64 = 1500;
    let _turn = SERIAL.lock().await;
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| {
        c.stock.rebalance_batch = 4;
        c.stock.rebalance_keep_ms = KEEP_MS;
        c.stock.rebalance_attempts = 1;
    })
    .await;
    let redis = cluster.client().await;
    let buyer = |home: u32, name: &str| user_on_shard(name, home, SHARDS);
    let act = create_published_activity(&h, &[(1, 500)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    set_shard_stock(&redis, a, s, &[0, 0, 1, 0]).await;

    // x's round brings the last unit home to shard 0 and keeps it for x, who is held
    // past the keep's end.
    let hold = hold_the_next_carried_buyer(HOLD_MS);
    let x = reserve_in_task(&h, (a, s), buyer(0, "x"));
    let held_at = held(hold).await;
    let rereads = || h.metrics.rebalance_rereads.get();
    let before = rereads();
    let mut c = h.stock_client().await;
    let y = outcome(reserve(&mut c, a, s, &buyer(1, "y"), "r").await);
    let answered = held_at.elapsed();
    let again = rereads() - before;
    let x = x.await.unwrap();
    fail::remove(CARRIED);
    eprintln!("y: {y} after {answered:?}, its round read again {again} time(s); x: {x}");
    assert_eq!(
        y, "Reserved",
        "y's round waited for the kept unit and ended there: y spent its one attempt on \
         its empty home while the unit was on offer"
    );
    assert_eq!(
        x, "SoldOut",
        "the keep ended before x came back for its unit"
    );
    assert_eq!(shard_stock(&redis, a, s, SHARDS).await, vec![0; 4]);
    assert_eq!(
        stream_len(&redis, a, SHARDS).await,
        1,
        "one unit, one order"
    );
    if again == 0 {
        // y reached stockd after the keep's end (a machine too slow to call within
        // KEEP_MS): its round found the unit on offer at once, and read nothing again.
        // (The keep began a little before x was held: some slack.)
        assert!(
            answered >= Duration::from_millis(KEEP_MS - 50),
            "y's round neither met the keep nor came after it"
        );
        eprintln!("y's round did not meet the keep");
        return;
    }
    assert!(
        answered >= Duration::from_millis(KEEP_MS / 2),
        "y was answered {answered:?} after x was held: before the keep could end"
    );
}
