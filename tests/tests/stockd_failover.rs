#![cfg(all(feature = "stockd", feature = "orderd"))]
//! A real failover under load: a Redis Cluster of 3 masters with a replica each; the
//! replica of the master that owns the most shards stalls and loses its link, that
//! master is killed -9 while its replica lags, the cluster promotes the replica by itself, the old master
//! comes back as a replica, and orderd drains. With `redis.replica_acks = 1` every
//! reservation answered RESERVED has exactly one order; with 0 the same scenario loses
//! reservations that were answered RESERVED (the check can fail), and stockd counts them.
//!
//! Each run prints a line `failover report (replica_acks=N): ...` with the time from the
//! kill to the next RESERVED on the failed master's shards and the UNAVAILABLE count.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use seckill_lua::{keys, ReservationId};
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::orderd::{count_all_orders, spawn_orderd};
use seckill_tests::redis::Persistence;
use seckill_tests::stockd::{
    create_published_activity, reserve, spawn_stockd, stock_status, StockClient, StockdHandle,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);
const STOCK: i64 = 400;
const SHARDS: u32 = 8;
const BUYERS: usize = 1000;

/// What the crowd was told and what happened around the failover.
#[derive(Default)]
struct Seen {
    /// user → reservation id, for every RESERVED answer.
    reserved: HashMap<String, String>,
    /// Users with a final answer (RESERVED, DUPLICATE, SOLD_OUT).
    done: HashSet<String>,
    unavailable: u64,
    /// ABORTED answers: contention over the last units (the recompute after a loss
    /// moves them); like UNAVAILABLE, the buyer retries with the same request id.
    busy: u64,
    /// RESERVED answers on the failed master's shards after the kill, ms after it.
    after_kill_ms: Vec<u128>,
}

struct Outcome {
    seen: Seen,
    /// Reservation ids answered RESERVED that are no order in MySQL after the drain.
    lost_202s: Vec<String>,
    /// stockd's count of promised reservations Redis lost.
    lost_metric: u64,
    active_orders: i64,
    remaining: i64,
}

/// One pass of buyers `users`: each sends Reserve with request id "r" (a retry is the
/// same request), 32 at a time; a final answer marks the user done.
async fn buy(
    c: &StockClient,
    a: u64,
    s: u64,
    users: Vec<String>,
    seen: &Arc<Mutex<Seen>>,
    failed_shards: &HashSet<u32>,
    killed_at: &Arc<Mutex<Option<Instant>>>,
) {
    futures::stream::iter(users)
        .for_each_concurrent(32, |user| {
            let mut c = c.clone();
            let seen = seen.clone();
            let killed_at = killed_at.clone();
            async move {
                let r =
                    tokio::time::timeout(Duration::from_secs(5), reserve(&mut c, a, s, &user, "r"))
                        .await;
                let mut seen = seen.lock().unwrap();
                match r {
                    Ok(Ok(r)) => {
                        if r.outcome() == ReserveOutcome::Reserved {
                            let shard = r.reservation_id.parse::<ReservationId>().unwrap().shard;
                            if let Some(k) = *killed_at.lock().unwrap() {
                                if failed_shards.contains(&shard) {
                                    seen.after_kill_ms.push(k.elapsed().as_millis());
                                }
                            }
                            let old = seen.reserved.insert(user.clone(), r.reservation_id.clone());
                            assert!(
                                old.is_none() || old.as_ref() == Some(&r.reservation_id),
                                "{user}: RESERVED twice with different ids: {old:?} then {}",
                                r.reservation_id
                            );
                        }
                        seen.done.insert(user);
                    }
                    Ok(Err(e)) if e.code() == tonic::Code::Aborted => seen.busy += 1,
                    Ok(Err(e)) => {
                        assert_eq!(e.code(), tonic::Code::Unavailable, "{user}: {e:?}");
                        seen.unavailable += 1;
                    }
                    Err(_) => seen.unavailable += 1,
                }
            }
        })
        .await;
}

async fn failover_under_load(replica_acks: u32) -> Outcome {
    init_tracing();
    let mut cluster = RedisCluster::start_replicated(3, 1, Persistence::AofEverySec);
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |c| {
        c.redis.replica_acks = replica_acks;
        c.redis.replica_ack_timeout_ms = 100;
        c.redis.timeout_ms = 1000;
    })
    .await;
    let act =
        create_published_activity(&h, &[(STOCK as u32, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let c = h.stock_client().await;

    // The master that owns the most shards, and its replica.
    let mut owned: HashMap<u16, Vec<u32>> = HashMap::new();
    for i in 0..SHARDS {
        owned
            .entry(cluster.master_of_key(&keys::fence(a, i)))
            .or_default()
            .push(i);
    }
    let (&master, shards) = owned.iter().max_by_key(|(_, v)| v.len()).unwrap();
    let failed_shards: HashSet<u32> = shards.iter().copied().collect();
    let replica = cluster.replicas_of(master)[0];

    let users: Vec<String> = (0..BUYERS).map(|u| format!("buyer-{u}")).collect();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let killed_at = Arc::new(Mutex::new(None));

    // 1. A healthy start.
    buy(
        &c,
        a,
        s,
        users[..100].to_vec(),
        &seen,
        &failed_shards,
        &killed_at,
    )
    .await;
    // 2. The replica stalls; buyers keep coming; its master dies while it lags.
    let stall = cluster.stall(replica, 2500);
    // The stopped replica's socket still takes what the master sends (the kernel
    // buffers it, and the replica reads it when it runs again): cut the link, so what
    // the master writes from now on reaches no replica before it dies.
    cluster.cli_at(master, &["CLIENT", "KILL", "TYPE", "replica"]);
    buy(
        &c,
        a,
        s,
        users[100..200].to_vec(),
        &seen,
        &failed_shards,
        &killed_at,
    )
    .await;
    tokio::task::block_in_place(|| cluster.kill(master));
    *killed_at.lock().unwrap() = Some(Instant::now());
    // 3. Everyone else, and everyone without a final answer, until all have one, while
    //    the cluster promotes the replica and the old master comes back.
    let crowd = {
        let (c, seen, failed, killed_at) = (
            c.clone(),
            seen.clone(),
            failed_shards.clone(),
            killed_at.clone(),
        );
        let users = users.clone();
        tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(90);
            loop {
                let todo: Vec<String> = {
                    let seen = seen.lock().unwrap();
                    users
                        .iter()
                        .filter(|u| !seen.done.contains(*u))
                        .cloned()
                        .collect()
                };
                if todo.is_empty() || Instant::now() > until {
                    break;
                }
                buy(&c, a, s, todo, &seen, &failed, &killed_at).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let promoted =
        tokio::task::block_in_place(|| cluster.wait_for_failover(master, Duration::from_secs(40)));
    assert_eq!(promoted, replica, "the lagging replica took over");
    stall.join();
    tokio::task::block_in_place(|| cluster.restart(master));
    crowd.await.unwrap();

    // orderd drains the streams of the surviving masters.
    let orderd = spawn_orderd(&Deps::new(&cluster, &db), |_| {}).await;
    let (mut last, deadline) = (-1, Instant::now() + Duration::from_secs(60));
    loop {
        let n = count_all_orders(&db).await;
        if n == last && n > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "orderd did not drain: {n} orders"
        );
        last = n;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    drop(orderd);

    let seen = Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap();
    let mut lost_202s = Vec::new();
    for (user, rid) in &seen.reserved {
        let owner: Option<(String,)> = sqlx::query_as("SELECT user_id FROM orders WHERE id = ?")
            .bind(rid)
            .fetch_optional(db.pool())
            .await
            .unwrap();
        match owner {
            Some((u,)) => assert_eq!(&u, user, "{rid} is another buyer's order"),
            None => lost_202s.push(rid.clone()),
        }
    }
    let (active,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM orders WHERE item_id = ? AND status IN ('PENDING', 'PAID')",
    )
    .bind(s)
    .fetch_one(db.pool())
    .await
    .unwrap();
    let (doubles,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE item_id = ? \
         AND status IN ('PENDING', 'PAID') GROUP BY user_id HAVING COUNT(*) > 1) d",
    )
    .bind(s)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(doubles, 0, "one active order per user");
    let remaining = stock_status(&mut c.clone(), a, s)
        .await
        .map(|st| st.remaining)
        .unwrap_or(-1);
    let first_202 = seen.after_kill_ms.iter().min().copied();
    eprintln!(
        "failover report (replica_acks={replica_acks}): kill -> next RESERVED on the failed \
         master's shards {first_202:?} ms; UNAVAILABLE answers {}; ABORTED (busy) {}; RESERVED {}; \
         lost 202s {}; orders active {active}; Redis remaining {remaining}; stockd lost (promised) {}, \
         unconfirmed {}, replica ack timeouts {}; scripts reloaded after NOSCRIPT {} time(s)",
        seen.unavailable,
        seen.busy,
        seen.reserved.len(),
        lost_202s.len(),
        h.metrics.lost_reservations_total(),
        h.metrics.lost_unconfirmed.get(),
        h.metrics.replica_ack_timeouts.get(),
        h.metrics
            .redis_errors
            .with_label_values(&["noscript"])
            .get(),
    );
    Outcome {
        lost_metric: h.metrics.lost_reservations_total(),
        seen,
        lost_202s,
        active_orders: active,
        remaining,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_replica_acks_every_reserved_survives_a_failover_to_a_lagging_replica() {
    let out = failover_under_load(1).await;
    assert!(
        out.lost_202s.is_empty(),
        "answered RESERVED and gone: {:?}",
        out.lost_202s
    );
    assert_eq!(out.lost_metric, 0, "no promised reservation was lost");
    assert!(
        out.active_orders <= STOCK,
        "oversold: {}",
        out.active_orders
    );
    assert_eq!(
        out.active_orders + out.remaining,
        STOCK,
        "every unit is sold or back on sale (no unit vanished, none made up)"
    );
    assert_eq!(out.seen.done.len(), BUYERS, "everyone got a final answer");
    assert_eq!(out.seen.reserved.len() as i64, out.active_orders);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_replica_acks_the_same_failover_loses_reservations_that_were_answered_reserved() {
    let out = failover_under_load(0).await;
    assert!(
        !out.lost_202s.is_empty(),
        "replica_acks = 0 lost nothing: the scenario did not make the replica lag"
    );
    assert!(
        out.lost_metric >= out.lost_202s.len() as u64,
        "stockd counted {} of {} lost RESERVED answers",
        out.lost_metric,
        out.lost_202s.len()
    );
    assert!(
        out.active_orders <= STOCK,
        "oversold: {}",
        out.active_orders
    );
}

/// A one-shard sale of 5 units on a replicated cluster, its stockd waiting for one
/// replica (100 ms) per call; the shard's master and that master's replica.
struct AckedSale {
    cluster: RedisCluster,
    _db: TestDb,
    _h: StockdHandle,
    c: StockClient,
    a: u64,
    s: u64,
    master: u16,
    replica: u16,
}

/// A stockd that waits for one replica, briefly (100 ms), within 1 s per Redis call.
fn acked(c: &mut stockd::Config) {
    c.redis.replica_acks = 1;
    c.redis.replica_ack_timeout_ms = 100;
    c.redis.timeout_ms = 1000;
}

impl AckedSale {
    async fn start() -> Self {
        init_tracing();
        let cluster = RedisCluster::start_replicated(3, 1, Persistence::None);
        let db = TestDb::create().await;
        let h = spawn_stockd(&Deps::new(&cluster, &db), acked).await;
        let act = create_published_activity(&h, &[(5, 100)], 1, Duration::ZERO, HOUR).await;
        let (a, s) = (act.id, act.items[0].id);
        let master = cluster.master_of_key(&keys::fence(a, 0));
        let replica = cluster.replicas_of(master)[0];
        Self {
            c: h.stock_client().await,
            cluster,
            _db: db,
            _h: h,
            a,
            s,
            master,
            replica,
        }
    }
}

/// Calls `call` until it answers something else than UNAVAILABLE (a replica caught up),
/// for at most 10 s; that answer.
async fn once_acknowledged<T, F, Fut>(mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match call().await {
            Err(e) if e.code() == tonic::Code::Unavailable && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => return other.unwrap(),
        }
    }
}

/// `Release` is acknowledged like a reservation: while the shard's replica is stalled it
/// answers UNAVAILABLE (the master has the release, no replica does), and a retry answers
/// NOT_HELD only once the replica holds the first call's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_no_replica_acknowledged_answers_unavailable_until_one_does() {
    let AckedSale {
        cluster,
        mut c,
        a,
        s,
        master,
        replica,
        // Bound, not `..`: the daemon and the database live until the test ends.
        _h: _stockd,
        _db: _database,
        ..
    } = AckedSale::start().await;
    let r = reserve(&mut c, a, s, "bob", "req").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    let stock_key = keys::stock(a, 0, s);
    assert_eq!(cluster.get_on(replica, &stock_key).as_deref(), Some("4"));

    let release = || seckill_proto::pb::ReleaseRequest {
        reservation_id: r.reservation_id.clone(),
        user_id: "bob".into(),
        reason: "cancelled".into(),
    };
    let stall = cluster.stall(replica, 3000);
    let err = c.release(release()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("replica"), "{err:?}");
    assert_eq!(cluster.get_on(master, &stock_key).as_deref(), Some("5"));
    let err = c.release(release()).await.unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::Unavailable,
        "the retry is not acknowledged either while the replica is stalled: {err:?}"
    );

    tokio::task::block_in_place(|| stall.join());
    // The replica catches up on what piled up; retry as a caller would.
    let done = once_acknowledged(|| {
        let mut c = c.clone();
        async move { c.release(release()).await }
    })
    .await
    .into_inner();
    assert_eq!(
        done.outcome(),
        seckill_proto::pb::ReleaseOutcome::NotHeld,
        "released once, by the first call"
    );
    assert_eq!(cluster.get_on(replica, &stock_key).as_deref(), Some("5"));
    assert_eq!(cluster.get_on(master, &stock_key).as_deref(), Some("5"));
}

/// A DUPLICATE (the buyer clicks again under a new request id) names the reservation
/// the buyer holds, so it is a promise like RESERVED: while the shard's replica is
/// stalled, a first click's reservation is on the master alone (answered UNAVAILABLE),
/// and the second click is answered UNAVAILABLE too rather than "you hold it". Once the
/// replica holds the reservation, the second click is a DUPLICATE naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_is_answered_only_once_a_replica_holds_the_reservation_it_names() {
    let AckedSale {
        cluster,
        mut c,
        a,
        s,
        replica,
        // Bound, not `..`: the daemon and the database live until the test ends.
        _h: _stockd,
        _db: _database,
        ..
    } = AckedSale::start().await;

    let stall = cluster.stall(replica, 3000);
    let first = reserve(&mut c, a, s, "bob", "click-1").await.unwrap_err();
    assert_eq!(first.code(), tonic::Code::Unavailable, "{first:?}");
    let second = reserve(&mut c, a, s, "bob", "click-2").await;
    assert!(
        matches!(&second, Err(e) if e.code() == tonic::Code::Unavailable),
        "no replica holds bob's reservation yet: {second:?}"
    );

    tokio::task::block_in_place(|| stall.join());
    let dup = once_acknowledged(|| {
        let mut c = c.clone();
        async move { reserve(&mut c, a, s, "bob", "click-2").await }
    })
    .await;
    assert_eq!(dup.outcome(), ReserveOutcome::Duplicate);
    // The replica holds the reservation's unit (taken by the same script).
    assert_eq!(
        tokio::task::block_in_place(|| cluster.get_on(replica, &keys::stock(a, 0, s))),
        Some("4".to_string())
    );
    // The first click's retry answers the same reservation.
    let again = reserve(&mut c, a, s, "bob", "click-1").await.unwrap();
    assert_eq!(again.reservation_id, dup.reservation_id);
}

/// A move settles by raising the item's change count and then removing its record of
/// units in transit (`stockd::transit`). With `redis.replica_acks = 1` the raise is
/// acknowledged first: while no replica of the count's master answers, the record is
/// left to its deadline instead of removed. (Before, the raise went without its `WAIT`:
/// a failover could lose it and keep the removal, and a sold-out look begun before the
/// settle would then see neither the record nor a changed count, and mark while the
/// moved units were on their home shard.) With the replica answering, the record goes
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moves_record_stays_until_a_replica_holds_its_raised_change_count() {
    use fred::prelude::*;
    use seckill_tests::redis::user_on_shard;
    use seckill_tests::stockd::{set_shard_stock, takes};
    const SHARDS: u32 = 8;
    init_tracing();
    let cluster = RedisCluster::start_replicated(3, 1, Persistence::None);
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), acked).await;
    let act = create_published_activity(&h, &[(40, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let mut c = h.stock_client().await;
    let redis = cluster.client().await;
    // The count's master, and a home and a donor shard on the other masters (their own
    // replicas answer: the reservation and the move are acknowledged).
    let counted = cluster.master_of_key(&keys::changes(a, s));
    let elsewhere: Vec<u32> = (0..SHARDS)
        .filter(|&i| cluster.master_of_key(&keys::stock(a, i, s)) != counted)
        .collect();
    let (home, donor) = (elsewhere[0], elsewhere[1]);
    let records = || {
        let redis = redis.clone();
        async move {
            let n: i64 = redis.zcard(keys::transit(a, donor, s)).await.unwrap();
            n
        }
    };
    let only_donor = |n: i64| {
        let mut stock = vec![0; SHARDS as usize];
        stock[donor as usize] = n;
        stock
    };

    // The replica answers: the move settles, its record goes.
    set_shard_stock(&redis, a, s, &only_donor(2)).await;
    let user = user_on_shard("healthy", home, SHARDS);
    let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    assert!(takes(&h) >= 1, "no move");
    seckill_tests::process::wait_until_async(
        "the record removed",
        Duration::from_secs(5),
        || async { records().await == 0 },
    )
    .await;

    // The count's replica stops: the next move's raise is on no replica, so its record
    // stays.
    set_shard_stock(&redis, a, s, &only_donor(2)).await;
    let before = takes(&h);
    let stall = cluster.stall(cluster.replicas_of(counted)[0], 3000);
    let user = user_on_shard("stalled", home, SHARDS);
    let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    assert!(takes(&h) > before, "no move");
    // The settle's WAIT gives up after 100 ms; well past it, the record is there.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        records().await,
        1,
        "the record went with its raise on no replica"
    );
    tokio::task::block_in_place(|| stall.join());
}
