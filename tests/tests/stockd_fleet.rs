#![cfg(feature = "stockd")]
//! Several stockd on one Redis Cluster and one MySQL: at most one rebuilds an activity
//! at a time (the lease), a stockd that starts while a peer serves closes nothing, a
//! stockd that starts after Redis lost writes rebuilds before it opens, and a master
//! that comes back empty has its lost reservations counted.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use fred::prelude::*;
use seckill_lua::calls::{Call, TakeCall};
use seckill_lua::{keys, ReservationId};
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::process::wait_until_async;
use seckill_tests::redis::user_on_shard;
use seckill_tests::stockd::{
    create_published_activity, crowd, make_order, reserve, shard_stock, spawn_stockd, stock_status,
    take_call, until_available, StockdHandle,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

/// How long a test waits for an activity to open.
const OPEN_WITHIN: Duration = Duration::from_secs(40);

const HOUR: Duration = Duration::from_secs(3600);

fn recomputes(h: &StockdHandle, result: &str) -> u64 {
    h.metrics.recomputes.with_label_values(&[result]).get()
}

async fn fences(redis: &Client, a: u64, shards: u32) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for i in 0..shards {
        out.push(redis.get(keys::fence(a, i)).await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stockd_that_find_the_state_lost_at_once_run_one_rebuild_and_the_stock_is_right() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    // Both find the loss at about the same moment (a reserve each, and their fence
    // checks every 200 ms).
    let (h1, h2) = (
        spawn_stockd(&deps, |_| {}).await,
        spawn_stockd(&deps, |_| {}).await,
    );
    let act = create_published_activity(&h1, &[(100, 100)], 8, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let (c1, c2) = (h1.stock_client().await, h2.stock_client().await);
    until_available(&c2, a, s, OPEN_WITHIN).await;
    for u in 0..30 {
        let mut c = if u % 2 == 0 { c1.clone() } else { c2.clone() };
        let (user, req) = (format!("u{u}"), "r".to_string());
        let r = reserve(&mut c, a, s, &user, &req).await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
        if u < 10 {
            make_order(&db, a, s, &user, &req, &r.reservation_id).await;
        }
    }
    let redis = cluster.client().await;
    for i in 0..8 {
        let _: i64 = redis.del(keys::fence(a, i)).await.unwrap();
    }
    let (mut d1, mut d2) = (c1.clone(), c2.clone());
    let (r1, r2) = tokio::join!(
        reserve(&mut d1, a, s, "late-1", "r"),
        reserve(&mut d2, a, s, "late-2", "r")
    );
    for r in [r1, r2] {
        assert_eq!(r.unwrap_err().code(), tonic::Code::Unavailable);
    }
    until_available(&c1, a, s, OPEN_WITHIN).await;
    until_available(&c2, a, s, OPEN_WITHIN).await;
    wait_until_async("both rebuild tasks ended", Duration::from_secs(30), || {
        let n = recomputes(&h1, "ok") + recomputes(&h1, "skipped");
        let m = recomputes(&h2, "ok") + recomputes(&h2, "skipped");
        async move { n + m == 2 }
    })
    .await;
    assert_eq!(
        recomputes(&h1, "ok") + recomputes(&h2, "ok"),
        1,
        "exactly one rebuild ran; the other stockd found it done"
    );
    // 100 units − 10 orders − 20 reservations in flight in the streams = 70 to sell.
    let calls = (0..200).map(|u| (format!("n{u}"), "r".to_string()));
    let (half1, half2): (Vec<_>, Vec<_>) = calls.enumerate().partition(|(k, _)| k % 2 == 0);
    let strip = |v: Vec<(usize, (String, String))>| v.into_iter().map(|(_, c)| c).collect();
    let (w1, w2) = tokio::join!(
        crowd(&c1, a, s, strip(half1)),
        crowd(&c2, a, s, strip(half2))
    );
    let won: HashSet<String> = w1
        .iter()
        .chain(&w2)
        .filter(|(_, r)| r.outcome() == ReserveOutcome::Reserved)
        .map(|(_, r)| r.reservation_id.clone())
        .collect();
    let left = shard_stock(&redis, a, s, 8).await;
    let mut answers: HashMap<&str, usize> = HashMap::new();
    for (_, r) in w1.iter().chain(&w2) {
        *answers.entry(r.outcome().as_str_name()).or_default() += 1;
    }
    let gave_up = h1.metrics.gave_up.get() + h2.metrics.gave_up.get();
    assert_eq!(
        won.len(),
        70,
        "exactly what MySQL and the streams left; answers {answers:?} (the rest UNAVAILABLE), \
         left per shard {left:?}, out of attempts {gave_up}"
    );
    assert!(left.iter().all(|&n| n == 0), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stockd_that_starts_while_its_peer_serves_closes_no_shard() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    let h1 = spawn_stockd(&deps, |_| {}).await;
    let act = create_published_activity(&h1, &[(100_000, 100)], 8, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    let before = fences(&redis, a, 8).await;
    let c1 = h1.stock_client().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let buyers: Vec<_> = (0..8)
        .map(|w| {
            let (mut c, stop) = (c1.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = reserve(&mut c, a, s, &format!("b{w}-{n}"), "r").await;
                    let r = r.unwrap_or_else(|e| panic!("the serving peer refused: {e:?}"));
                    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
                    n += 1;
                }
                n
            })
        })
        .collect();
    // recompute_at_start is on by default: the newcomer checks and opens.
    let h2 = spawn_stockd(&deps, |c| assert!(c.stock.recompute_at_start)).await;
    let c2 = h2.stock_client().await;
    until_available(&c2, a, s, OPEN_WITHIN).await;
    let r = reserve(&mut c2.clone(), a, s, "newcomer", "r")
        .await
        .unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut sold = 0;
    for b in buyers {
        sold += b.await.unwrap();
    }
    assert!(sold > 0);
    assert_eq!(
        fences(&redis, a, 8).await,
        before,
        "no shard was closed or reopened"
    );
    assert_eq!(recomputes(&h2, "ok") + recomputes(&h1, "ok"), 0);
}

#[tokio::test]
async fn a_stockd_that_starts_after_redis_lost_writes_rebuilds_before_it_opens() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    let h1 = spawn_stockd(&deps, |_| {}).await;
    let act = create_published_activity(&h1, &[(50, 100)], 2, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let mut c1 = h1.stock_client().await;
    let mut rids = HashSet::new();
    for u in 0..12 {
        let user = format!("w{u}");
        let r = reserve(&mut c1, a, s, &user, "r").await.unwrap();
        make_order(&db, a, s, &user, "r", &r.reservation_id).await;
        rids.insert(r.reservation_id);
    }
    h1.stop().await.unwrap();
    // A failover to a replica that missed the last writes, with no stockd running to
    // notice: shard 0's sequence goes back while its fence stays.
    let redis = cluster.client().await;
    let old = fences(&redis, a, 2).await;
    let _: () = redis
        .set(keys::seq(a, 0), 1, None, None, false)
        .await
        .unwrap();
    let h2 = spawn_stockd(&deps, |_| {}).await;
    let mut c2 = h2.stock_client().await;
    until_available(&c2, a, s, OPEN_WITHIN).await;
    assert_eq!(
        recomputes(&h2, "ok"),
        1,
        "rebuilt from MySQL before opening"
    );
    assert_ne!(
        fences(&redis, a, 2).await,
        old,
        "reopened under a new epoch"
    );
    for u in 0..60 {
        let r = reserve(&mut c2, a, s, &format!("after{u}"), "r")
            .await
            .unwrap();
        assert!(
            !rids.contains(&r.reservation_id),
            "a promised id was handed out again"
        );
    }
    let st = stock_status(&mut c2, a, s).await.unwrap();
    assert_eq!(
        st.remaining, 0,
        "50 − 12 orders sold to the newcomers: {st:?}"
    );
}

#[tokio::test]
async fn a_master_that_comes_back_empty_has_its_lost_reservations_counted_and_rebuilt() {
    init_tracing();
    let mut cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let shards = 8;
    let act = create_published_activity(&h, &[(100, 100)], shards, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let c = h.stock_client().await;
    let calls = (0..40)
        .map(|u| (format!("e{u}"), "r".to_string()))
        .collect();
    let won = crowd(&c, a, s, calls).await;
    assert_eq!(won.len(), 40);
    // orderd has written the first 15 as orders; the rest wait in the streams.
    for (user, r) in &won[..15] {
        make_order(&db, a, s, user, "r", &r.reservation_id).await;
    }
    let redis = cluster.client().await;
    let node0 = cluster.nodes()[0].clone();
    let routing = redis.cached_cluster_state().expect("cluster routing");
    let on_node0 = |shard: u32| {
        let slot = fred::util::redis_keyslot(keys::fence(a, shard).as_bytes());
        routing.get_server(slot).map(|srv| srv.to_string()) == Some(node0.clone())
    };
    let expected_lost = won[15..]
        .iter()
        .filter(|(_, r)| on_node0(r.reservation_id.parse::<ReservationId>().unwrap().shard))
        .count() as u64;
    assert!(expected_lost > 0, "some reservations live on node 0");
    cluster.kill_node(0);
    cluster.restart_node(0);
    // Nothing is RESERVED from the empty node's shards before they are rebuilt: the
    // scripts find no fence there and stockd answers UNAVAILABLE.
    until_available(&c, a, s, OPEN_WITHIN).await;
    assert_eq!(
        h.metrics
            .lost_reservations
            .with_label_values(&["fence_missing"])
            .get(),
        expected_lost,
        "every reservation the node took with it that MySQL did not have"
    );
    // The lost reservations' units were never taken in MySQL: they are for sale again.
    let st = stock_status(&mut c.clone(), a, s).await.unwrap();
    let in_flight = 25 - expected_lost as i64;
    assert_eq!(st.remaining, 100 - 15 - in_flight, "{st:?}");
}

/// A peer's rebuild reopens every shard under a new epoch, and a stockd that has not
/// reserved on a donor since still holds the old one. Its rebalancing takes must still
/// move the units (the first is refused as older than the shard, the stockd adopts the
/// shard's epoch and asks again): every unit sells, through one home shard. And a take
/// sent under the old epoch that runs after the rebuild (one that waited in Redis's
/// queue past its caller's deadline, so no give follows) takes nothing: the rebuild has
/// just counted those units, and taking them would keep them off sale until the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_under_an_epoch_before_a_peers_rebuild_takes_nothing_and_moves_still_sell_every_unit(
) {
    const SHARDS: u32 = 4;
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    // stockd 1 does not look at the fences by itself: the rebuild is stockd 2's, and
    // stockd 1's marks stay the old epoch's until Redis tells it otherwise.
    let (h1, h2) = (
        spawn_stockd(&deps, |c| c.stock.fence_check_ms = 600_000).await,
        spawn_stockd(&deps, |_| {}).await,
    );
    let act = create_published_activity(&h1, &[(24, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let (mut c1, c2) = (h1.stock_client().await, h2.stock_client().await);
    until_available(&c2, a, s, OPEN_WITHIN).await;
    let redis = cluster.client().await;
    // stockd 1 reserves on every shard: its mark of each is the warm-up's epoch.
    let mut sold = 0;
    for i in 0..SHARDS {
        let user = user_on_shard(&format!("first-{i}"), i, SHARDS);
        let r = reserve(&mut c1, a, s, &user, "r").await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
        sold += 1;
    }
    let old = fences(&redis, a, SHARDS).await[0].clone().expect("fence");

    // stockd 2 finds shard 3's state lost and rebuilds the activity: a new epoch on
    // every shard.
    let _: i64 = redis.del(keys::fence(a, 3)).await.unwrap();
    let lost = user_on_shard("lost", 3, SHARDS);
    let r = reserve(&mut c2.clone(), a, s, &lost, "r").await;
    assert_eq!(r.unwrap_err().code(), tonic::Code::Unavailable);
    until_available(&c2, a, s, OPEN_WITHIN).await;
    assert_eq!(recomputes(&h1, "ok"), 0, "stockd 1 rebuilt nothing");
    let new = fences(&redis, a, SHARDS).await;
    assert!(
        new.iter().all(|f| f.as_deref().is_some_and(|f| f != old)),
        "every shard reopened under a new epoch: {new:?} (was {old})"
    );

    // A take sent under the old epoch, run now: refused, nothing taken.
    let before = shard_stock(&redis, a, s, SHARDS).await;
    assert!(before[1] > 0, "{before:?}");
    let (k, args) = take_call((a, 1, s), 1, &old, 1).into_parts();
    let answer: Vec<fred::types::Value> = redis.eval(TakeCall::SCRIPT.body, k, args).await.unwrap();
    let (n, epoch) = (answer[0].as_i64(), answer[1].as_string());
    assert_eq!(n, Some(-3), "{answer:?}");
    assert_eq!(epoch.as_deref(), new[1].as_deref());
    assert_eq!(shard_stock(&redis, a, s, SHARDS).await, before);

    // Every unit left sells through stockd 1 to buyers homed on shard 0: once its own
    // units are gone, every sale is a move from a shard stockd 1 knows by the old epoch.
    let left: i64 = before.iter().sum();
    let calls = (0..left + 5)
        .map(|k| {
            (
                user_on_shard(&format!("late-{k}"), 0, SHARDS),
                "r".to_string(),
            )
        })
        .collect();
    let answers = crowd(&c1, a, s, calls).await;
    let won: HashSet<&str> = answers
        .iter()
        .filter(|(_, r)| r.outcome() == ReserveOutcome::Reserved)
        .map(|(_, r)| r.reservation_id.as_str())
        .collect();
    assert_eq!(won.len() as i64, left, "every unit left, once each");
    assert!(
        answers.iter().all(|(_, r)| matches!(
            r.outcome(),
            ReserveOutcome::Reserved | ReserveOutcome::SoldOut
        )),
        "{answers:?}"
    );
    sold += left;
    assert_eq!(sold, 24);
    assert_eq!(
        shard_stock(&redis, a, s, SHARDS).await,
        vec![0; SHARDS as usize]
    );
}

/// A stockd that has reserved nothing on a donor since it started holds no mark of it,
/// and a take without an epoch is checked against no rebuild (take.lua): one that ran
/// late, after a rebuild, would take units the rebuild had just counted. So the first
/// take on such a donor carries the donor's fence, read before it. Seen on the donor's
/// master with `MONITOR`: the take's epoch argument is the shard's fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stockds_first_take_on_a_donor_it_never_served_carries_the_donors_epoch() {
    const SHARDS: u32 = 2;
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    // stockd 1 warms the activity (its rebuild marks every shard); stockd 2 starts after
    // and finds the shards open: it has no mark of any.
    let h1 = spawn_stockd(&deps, |_| {}).await;
    let act = create_published_activity(&h1, &[(4, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let h2 = spawn_stockd(&deps, |c| c.stock.fence_check_ms = 600_000).await;
    let mut c2 = h2.stock_client().await;
    until_available(&c2, a, s, OPEN_WITHIN).await;
    let redis = cluster.client().await;
    let epochs = fences(&redis, a, SHARDS).await;
    let donor_epoch = epochs[1].clone().expect("shard 1 open");
    assert_eq!(shard_stock(&redis, a, s, SHARDS).await, vec![2, 2]);

    // Shard 0's buyers empty it through stockd 2; the next one needs a move from shard 1.
    for k in 0..2 {
        let user = user_on_shard(&format!("home-{k}"), 0, SHARDS);
        let r = reserve(&mut c2, a, s, &user, "r").await.unwrap();
        assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    }
    let monitor = cluster.monitor(cluster.master_of_key(&keys::fence(a, 1)));
    let user = user_on_shard("moved", 0, SHARDS);
    let r = reserve(&mut c2, a, s, &user, "r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    let seen = monitor.stop();

    let take = TakeCall::SCRIPT.sha1();
    let takes: Vec<&str> = seen
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains(&take))
        .collect();
    assert!(!takes.is_empty(), "no take on the donor's master:\n{seen}");
    for line in takes {
        // ... "EVALSHA" "<sha>" "4" "<fence>" "<stock>" "<seq>" "<transit>" "<units>"
        // "<epoch>" "<seq>" "<move id>" "<lifetime>"
        let args: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
        assert_eq!(args.len(), 12, "{line}");
        assert_eq!(args[2], "4", "{line}");
        assert_eq!(args[8], donor_epoch, "the take's epoch: {line}");
    }
}
