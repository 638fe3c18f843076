#![cfg(feature = "stockd")]
//! A starting stockd opens no activity before its start-up check (`stock.recompute_at_start`)
//! has looked at it. A fresh process has no high-water marks, so its fence check cannot
//! tell a shard that came back rewound (MySQL holds reservations past its sequence): only
//! the start-up check's MySQL read can. The start-up check used to claim the activities
//! one at a time, so while it checked the first ones the fence check (every
//! `stock.fence_check_ms`) opened the others unchecked, and a rewound shard sold again
//! under reservation ids already taken (orderd dead-letters those promised buyers).
//!
//! The fail point `stockd::start_check::before` holds the start-up check before its first
//! activity for many fence periods; meanwhile no activity of the starting stockd may be
//! available. (Checked: with the old one-at-a-time claim, the second activity opened
//! during the hold.)
//!
//! A test binary of its own: a fail point is process-wide.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use seckill_proto::pb::ReserveOutcome;
use seckill_tests::stockd::{
    create_published_activity, reserve, spawn_stockd, spawn_stockd_starting, stock_status,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const BEFORE: &str = "stockd::start_check::before";
const HOUR: Duration = Duration::from_secs(3600);
/// The starting stockd's fence period, and how long the fail point holds its check.
const FENCE_MS: u64 = 50;
const HOLD: Duration = Duration::from_millis(30 * FENCE_MS);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_stockd_opens_no_activity_before_its_start_up_check_reached_it() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    // Three live sales, published by a first stockd (its own start-up found none).
    let first = spawn_stockd(&deps, |_| {}).await;
    let mut sales = Vec::new();
    for _ in 0..3 {
        let act = create_published_activity(&first, &[(4, 100)], 2, Duration::ZERO, HOUR).await;
        sales.push((act.id, act.items[0].id));
    }

    // The second stockd's start-up check stops before its first activity, once. The
    // wait hands its runtime worker over (`block_in_place`): the fence loop and the
    // gRPC server of that stockd run on this runtime too.
    let (entered, released) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    {
        let (entered, released) = (entered.clone(), released.clone());
        fail::cfg_callback(BEFORE, move || {
            if !entered.swap(true, Ordering::SeqCst) {
                tokio::task::block_in_place(|| std::thread::sleep(HOLD));
                released.store(true, Ordering::SeqCst);
            }
        })
        .unwrap();
    }
    let second = spawn_stockd_starting(&deps, |c| c.stock.fence_check_ms = FENCE_MS).await;
    let mut c = second.stock_client().await;
    let mut polls = 0;
    let mut opened = BTreeSet::new();
    while !released.load(Ordering::SeqCst) {
        if entered.load(Ordering::SeqCst) {
            for &(a, s) in &sales {
                if stock_status(&mut c, a, s)
                    .await
                    .is_some_and(|st| st.available)
                    && !released.load(Ordering::SeqCst)
                {
                    opened.insert(a);
                }
            }
            polls += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fail::remove(BEFORE);
    assert!(polls >= 5, "the hold was watched ({polls} polls)");
    assert!(
        opened.is_empty(),
        "activities {opened:?} opened before the start-up check reached them"
    );

    // Once checked, every sale opens and sells.
    for (k, &(a, s)) in sales.iter().enumerate() {
        let mut waits = 0;
        let r = loop {
            match reserve(&mut c, a, s, &format!("buyer-{k}"), "r").await {
                Err(e) if e.code() == tonic::Code::Unavailable && waits < 1000 => {
                    waits += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                other => break other.expect("reserve"),
            }
        };
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    }
}
