#![cfg(feature = "stockd")]
//! A rebuild asked for while another rebuild of the same activity is finishing (it has
//! opened the activity and not yet let go of it) runs once that one lets go. It used to
//! be dropped: the activity stayed closed, with the loss still there and no rebuild
//! running, until the next fence check (ten minutes for this test's stockd).
//!
//! The fail point `stockd::rebuild::before_release` holds the first rebuild between its
//! open and its release while shard 0 loses its fence a second time and a buyer finds
//! that out. (Checked: with the request dropped, the sale stays closed.)
//!
//! A test binary of its own: a fail point is process-wide.

use std::time::Duration;

use fred::prelude::*;
use seckill_lua::keys;
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::failpoint::Hold;
use seckill_tests::redis::user_on_shard;
use seckill_tests::stockd::{create_published_activity, reserve, spawn_stockd, until_available};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const BEFORE_RELEASE: &str = "stockd::rebuild::before_release";
const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_asked_for_as_another_finishes_runs_after_it() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    // No fence check for ten minutes: only the rebuilds can open the sale.
    let h = spawn_stockd(&deps, |c| c.stock.fence_check_ms = 600_000).await;
    let act = create_published_activity(&h, &[(8, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    let mut c = h.stock_client().await;
    let ok = || h.metrics.recomputes.with_label_values(&["ok"]).get();

    // The first rebuild, once, waits after its open until the test lets it go.
    let hold = Hold::at(BEFORE_RELEASE);

    // Shard 0 loses its fence; a buyer homed there finds it out: the first rebuild.
    let _: i64 = redis.del(keys::fence(a, 0)).await.unwrap();
    let first = reserve(&mut c, a, s, &user_on_shard("first", 0, SHARDS), "r").await;
    assert_eq!(first.unwrap_err().code(), tonic::Code::Unavailable);
    let go = hold
        .reached("the first rebuild opened the sale and waits before letting go")
        .await;
    assert_eq!(ok(), 1);

    // While it holds the activity: shard 0 loses its fence again, and a buyer finds it.
    let _: i64 = redis.del(keys::fence(a, 0)).await.unwrap();
    let second = reserve(&mut c, a, s, &user_on_shard("second", 0, SHARDS), "r").await;
    assert_eq!(second.unwrap_err().code(), tonic::Code::Unavailable);

    // Let go: the rebuild asked for meanwhile runs, and the sale opens with its fence.
    go.send(()).unwrap();
    until_available(&c, a, s, Duration::from_secs(20)).await;
    fail::remove(BEFORE_RELEASE);
    assert_eq!(ok(), 2, "the second rebuild ran");
    let fence: Option<String> = redis.get(keys::fence(a, 0)).await.unwrap();
    assert!(fence.is_some(), "shard 0 reopened");
    let r = reserve(&mut c, a, s, &user_on_shard("third", 0, SHARDS), "r")
        .await
        .expect("reserve");
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
}
