#![cfg(all(feature = "stockd", feature = "orderd"))]
//! A publish that read the activity unpublished warms no shard after another publish of
//! it opened the sale there. Every stockd of a fleet runs a scheduled publish, so several
//! publishes of one activity run at once; each used to warm every shard from its own
//! snapshot, and `WARM` skipped only a shard that had a fence or a rebuild's lease. A
//! shard whose node came back empty after it sold (fence and lease gone, no rebuild yet)
//! was warmed again with the snapshot's counts: the units it had sold were on sale twice.
//! Now only the publish that claims the warm-up in MySQL warms from a snapshot; the others
//! wait for it to publish and then go the way of an already published activity (a
//! rebuild from MySQL where a fence is missing).
//!
//! The fail point `stockd::publish::before_warm` holds the first publish after its read
//! of the activity while a second publish opens the sale, a buyer homed on shard 0 buys
//! a unit and orderd writes the order, and shard 0's keys are all deleted (its node came
//! back empty). (Checked: with every publish warming from its snapshot, as before, shard 0
//! came back with its first share and four units were on the shards after one was sold.)
//!
//! A second test holds the publish that claimed the warm-up right after its claim
//! (`stockd::publish::claimed`): another publish waits for it and writes nothing.
//!
//! A test binary of its own: a fail point is process-wide (and its tests take turns).

use std::time::Duration;

use seckill_lua::keys;
use seckill_proto::pb;
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::failpoint::Hold;
use seckill_tests::orderd::{count_all_orders, spawn_orderd, wait_orders};
use seckill_tests::redis::user_on_shard;
use seckill_tests::stockd::{
    reserve, sale_request, shard_stock, spawn_stockd, until_available, AdminClient,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const BEFORE_WARM: &str = "stockd::publish::before_warm";
const CLAIMED: &str = "stockd::publish::claimed";
const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 2;
const STOCK: u32 = 4;
const WITHIN: Duration = Duration::from_secs(30);

/// The tests of this binary take turns: every publish passes both fail points.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `PublishActivity` of `a` through `admin`.
async fn publish(
    mut admin: AdminClient,
    a: u64,
) -> Result<pb::PublishActivityResponse, tonic::Status> {
    admin
        .publish_activity(pb::PublishActivityRequest {
            activity_id: a,
            publish_at_ms: 0,
        })
        .await
        .map(|r| r.into_inner())
}

/// A sale of `STOCK` units over `SHARDS` shards, open now, created and not published.
async fn created(admin: &mut AdminClient) -> u64 {
    admin
        .create_activity(sale_request(
            &[(STOCK, 100)],
            SHARDS,
            Duration::ZERO,
            HOUR,
            1,
        ))
        .await
        .expect("create activity")
        .into_inner()
        .id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_publish_does_not_warm_a_shard_that_sold_and_came_back_empty() {
    let _turn = SERIAL.lock().await;
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    // No fence check for ten minutes: nothing but the publishes touches the shards.
    let h = spawn_stockd(&deps, |c| c.stock.fence_check_ms = 600_000).await;
    let _orderd = spawn_orderd(&deps, |_| {}).await;
    let mut admin = h.admin_client().await;
    let a = created(&mut admin).await;

    // The first publish, once, waits after its read until the test lets it go.
    let hold = Hold::at(BEFORE_WARM);
    let late = tokio::spawn(publish(admin.clone(), a));
    let go = hold
        .reached("the first publish read the activity unpublished")
        .await;

    // A second publish opens the sale; a buyer homed on shard 0 buys, and orderd writes
    // the order.
    let act = publish(admin.clone(), a)
        .await
        .expect("the second publish")
        .activity
        .expect("activity");
    let s = act.items[0].id;
    let mut c = h.stock_client().await;
    let r = reserve(&mut c, a, s, &user_on_shard("first", 0, SHARDS), "r")
        .await
        .expect("reserve");
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    wait_orders(&db, 1, WITHIN).await;

    // Shard 0's node comes back empty: every key of the shard is gone.
    let port = cluster.master_of_key(&keys::fence(a, 0));
    let listed = cluster.cli_at(port, &["KEYS", &format!("sk:{{{a}:0}}:*")]);
    let gone: Vec<&str> = listed.lines().filter(|k| !k.is_empty()).collect();
    assert!(gone.contains(&keys::fence(a, 0).as_str()), "{listed}");
    for k in &gone {
        cluster.cli_at(port, &["DEL", k]);
    }

    // The first publish goes on. The shards then hold what MySQL has not sold.
    go.send(()).unwrap();
    late.await.unwrap().expect("the first publish");
    fail::remove(BEFORE_WARM);
    let redis = cluster.client().await;
    let on_shards: i64 = shard_stock(&redis, a, s, SHARDS).await.iter().sum();
    assert_eq!(
        on_shards,
        i64::from(STOCK) - 1,
        "units on the shards after one was sold and shard 0 came back empty"
    );

    // And the sale sells each unit once.
    until_available(&c, a, s, WITHIN).await;
    let mut sold = 1;
    for k in 0..(2 * STOCK) {
        let buyer = user_on_shard(&format!("b{k}"), k % SHARDS, SHARDS);
        let r = reserve(&mut c, a, s, &buyer, "r").await.expect("reserve");
        if r.outcome() == ReserveOutcome::Reserved {
            sold += 1;
        }
    }
    assert_eq!(sold, STOCK, "every unit sold once");
    wait_orders(&db, i64::from(STOCK), WITHIN).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count_all_orders(&db).await, i64::from(STOCK));
}

/// Two publishes of an activity not yet published: the one that claimed the warm-up is
/// held right after its claim, and the other waits for it instead of warming from its
/// own snapshot; once the claimant goes on, both answer, the other one having written
/// nothing, and the shards hold the stock once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_waits_for_the_one_that_claimed_the_warm_up() {
    let _turn = SERIAL.lock().await;
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let mut admin = h.admin_client().await;
    let a = created(&mut admin).await;

    let hold = Hold::at(CLAIMED);
    let claimant = tokio::spawn(publish(admin.clone(), a));
    let go = hold.reached("a publish claimed the warm-up").await;
    let other = tokio::spawn(publish(admin.clone(), a));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !other.is_finished(),
        "the other publish answered while the claimant had warmed nothing"
    );
    let redis = cluster.client().await;
    let fence: Option<String> = fred::interfaces::KeysInterface::get(&redis, keys::fence(a, 0))
        .await
        .unwrap();
    assert_eq!(fence, None, "nobody warmed a shard meanwhile");

    go.send(()).unwrap();
    let first = claimant.await.unwrap().expect("the claimant's publish");
    let second = other.await.unwrap().expect("the other publish");
    fail::remove(CLAIMED);
    assert!(first.warmed, "the claimant warmed the shards");
    assert!(!second.warmed, "the other publish wrote nothing");
    let act = second.activity.expect("activity");
    assert_eq!(act.status, pb::ActivityStatus::Published as i32);
    let s = act.items[0].id;
    let on_shards: i64 = shard_stock(&redis, a, s, SHARDS).await.iter().sum();
    assert_eq!(on_shards, i64::from(STOCK));
}
