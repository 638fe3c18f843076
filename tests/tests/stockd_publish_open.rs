#![cfg(feature = "stockd")]
//! The stockd that publishes a sale serves it at once, even when its catalog already
//! holds the activity closed: between publish's `UPDATE` in MySQL and its own entry in
//! the catalog, the refresh loop (every `stock.schedule_poll_ms`) or a stock read can
//! load the activity from MySQL as one "new to this process", which opens only after a
//! fence check. Publish used to keep that closed entry, and its buyers heard
//! UNAVAILABLE until the next fence check (seen as a rare failure of `stockd_fleet`,
//! whose first stockd checks fences every ten minutes).
//!
//! The fail point `stockd::publish::before_catalog` holds publish after the `UPDATE`
//! until this stockd's catalog holds the activity closed; then publish goes on.
//! (Checked: without publish's fence check of that entry, the first buyer hears
//! UNAVAILABLE "being rebuilt".)
//!
//! A test binary of its own: a fail point is process-wide.

use std::time::Duration;

use seckill_proto::pb::{self, ReserveOutcome};
use seckill_tests::stockd::{reserve, sale_request, spawn_stockd, stock_client, stock_status};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const BEFORE_CATALOG: &str = "stockd::publish::before_catalog";
/// The refresh loop's period here (`stock.schedule_poll_ms`).
const POLL_MS: u64 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_published_while_the_catalog_loaded_it_closed_opens_at_once_on_that_stockd() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    // No fence check of its own for ten minutes: only publish can open the entry.
    let h = spawn_stockd(&deps, |c| {
        c.stock.fence_check_ms = 600_000;
        c.stock.schedule_poll_ms = POLL_MS;
    })
    .await;
    let mut admin = h.admin_client().await;
    let req = sale_request(&[(4, 100)], 2, Duration::ZERO, Duration::from_secs(3600), 1);
    let act = admin
        .create_activity(req)
        .await
        .expect("create")
        .into_inner();
    let (a, s) = (act.id, act.items[0].id);

    // Publish stops after MySQL says published until the refresh loop has loaded the
    // activity, closed (GetStock answers `available: false`). The wait hands its worker
    // of this runtime over (`block_in_place`): a fail point blocks the thread it runs
    // on, and the tasks queued on that worker (this stockd's refresh loop among them)
    // would wait behind it.
    let addr = h.addr.clone();
    fail::cfg_callback(BEFORE_CATALOG, move || {
        let addr = addr.clone();
        let staged = tokio::task::block_in_place(|| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let mut c = stock_client(&addr).await;
                    for _ in 0..400 {
                        if stock_status(&mut c, a, s)
                            .await
                            .is_some_and(|st| !st.available)
                        {
                            return true;
                        }
                        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
                    }
                    false
                })
            })
            .join()
            .unwrap()
        });
        assert!(staged, "the catalog never held the activity closed");
    })
    .unwrap();
    let published = admin
        .publish_activity(pb::PublishActivityRequest {
            activity_id: a,
            publish_at_ms: 0,
        })
        .await;
    fail::remove(BEFORE_CATALOG);
    published.expect("publish");

    // The first buyer after publish returned is served, not told to retry.
    let mut c = h.stock_client().await;
    let r = reserve(&mut c, a, s, "first-buyer", "r").await;
    match r {
        Ok(r) => assert_eq!(r.outcome(), ReserveOutcome::Reserved),
        Err(e) => panic!("the publishing stockd refused its first buyer: {e:?}"),
    }
    let st = stock_status(&mut c, a, s).await.expect("stock");
    assert!(st.available);
}
