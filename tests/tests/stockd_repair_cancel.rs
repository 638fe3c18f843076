#![cfg(feature = "stockd")]
//! A caller that goes away while its rebuild holds the activity (a Reconcile repair or a
//! publish whose gRPC call timed out or was cancelled) does not leave the activity closed:
//! the rebuild runs in a task of its own and lets go when it is done. It used to run in
//! the call's own future, and a dropped call left the claim held for good: the activity
//! closed, and every rebuild asked for later handed to a holder that no longer existed.
//!
//! The fail point `stockd::repair::held` holds the rebuild right after its claim, past the
//! caller's deadline. (Checked: with the rebuild in the call's future, the sale stays
//! closed.)
//!
//! A test binary of its own: a fail point is process-wide.

use std::time::Duration;

use fred::prelude::*;
use seckill_lua::keys;
use seckill_proto::pb::{self, ReserveOutcome};
use seckill_tests::stockd::{create_published_activity, reserve, spawn_stockd, until_available};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const HELD: &str = "stockd::repair::held";
const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_call_cancelled_during_its_rebuild_leaves_the_sale_open_after_it() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    // No fence check for ten minutes: only the rebuild can open the sale again.
    let h = spawn_stockd(&deps, |c| c.stock.fence_check_ms = 600_000).await;
    let act = create_published_activity(&h, &[(4, 100)], 2, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;

    // Every fence gone: publishing the published activity again rebuilds it, and the
    // call waits for that rebuild, which the fail point holds past the call's deadline.
    for i in 0..2 {
        let _: i64 = redis.del(keys::fence(a, i)).await.unwrap();
    }
    fail::cfg_callback(HELD, || {
        tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(1500)))
    })
    .unwrap();
    let mut admin = h.admin_client().await;
    let mut req = tonic::Request::new(pb::PublishActivityRequest {
        activity_id: a,
        publish_at_ms: 0,
    });
    req.set_timeout(Duration::from_millis(300));
    let published = admin.publish_activity(req).await;
    assert!(
        published.is_err(),
        "the call gave up before the rebuild ended"
    );

    // The rebuild goes on without its caller and opens the sale.
    let mut c = h.stock_client().await;
    until_available(&c, a, s, Duration::from_secs(20)).await;
    fail::remove(HELD);
    let r = reserve(&mut c, a, s, "buyer", "r").await.expect("reserve");
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
}
