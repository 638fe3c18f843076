#![cfg(feature = "stockd")]
//! stockd's admin side: publish (idempotent, scheduled, ended windows refused), the
//! window checks of Reserve, bad input refused with the field named and nothing
//! changed, bans, reconciliation.
//!
//! (Over 400 lines: an integration suite: each test sets up real processes and states its
//! invariants inline, so the cases read top to bottom.)

use seckill_tests::Deps;
use std::time::Duration;

use fred::prelude::*;
use seckill_lua::keys;
use seckill_proto::pb::{self, ReserveOutcome};
use seckill_tests::process::wait_until_async;
use seckill_tests::stockd::{create_published_activity, reserve, shard_stock, spawn_stockd};
use seckill_tests::{init_tracing, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);

fn now_ms() -> i64 {
    seckill_lua::clock::now_ms()
}

/// `CreateActivity` of [`good_request`], left unpublished.
async fn create_draft(admin: &mut seckill_tests::stockd::AdminClient) -> pb::Activity {
    admin
        .create_activity(good_request())
        .await
        .expect("create activity")
        .into_inner()
}

/// `PublishActivity` of `id` now; panics on an error.
async fn publish_now(
    admin: &mut seckill_tests::stockd::AdminClient,
    id: u64,
) -> pb::PublishActivityResponse {
    admin
        .publish_activity(pb::PublishActivityRequest {
            activity_id: id,
            publish_at_ms: 0,
        })
        .await
        .unwrap_or_else(|e| panic!("publish {id}: {e:?}"))
        .into_inner()
}

fn spec(stock: u32) -> pb::ItemSpec {
    pb::ItemSpec {
        title: "thing".into(),
        price_cents: 1000,
        sale_price_cents: 500,
        stock,
    }
}

fn good_request() -> pb::CreateActivityRequest {
    pb::CreateActivityRequest {
        title: "sale".into(),
        start_at_ms: now_ms() - 1000,
        end_at_ms: now_ms() + 3_600_000,
        shard_count: 4,
        per_user_limit: 1,
        items: vec![spec(10)],
        challenge_bits: 0,
        redis_cluster: String::new(),
    }
}

#[tokio::test]
async fn publishing_twice_never_adds_stock() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let mut admin = h.admin_client().await;
    let a = create_draft(&mut admin).await;
    assert_eq!(a.status, pb::ActivityStatus::Draft as i32);
    let first = publish_now(&mut admin, a.id).await;
    assert!(first.warmed);
    let s = a.items[0].id;
    let mut c = h.stock_client().await;
    let r = reserve(&mut c, a.id, s, "u1", "r1").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    let second = publish_now(&mut admin, a.id).await;
    assert!(!second.warmed);
    let redis = cluster.client().await;
    assert_eq!(shard_stock(&redis, a.id, s, 4).await.iter().sum::<i64>(), 9);
    // Meta and the activity set are written for the gateway and orderd.
    let members: Vec<String> = redis.smembers(keys::ACTIVITIES).await.unwrap();
    assert!(members.contains(&a.id.to_string()));
    let shards: String = redis
        .hget(keys::meta(a.id), keys::meta::SHARDS)
        .await
        .unwrap();
    assert_eq!(shards, "4");
}

/// A publish whose warm-up another call claimed and never finished (that stockd died
/// after its claim in MySQL) waits for it, then takes over with a rebuild from MySQL: the
/// sale opens with all its units, and a publish that follows finds it published.
#[tokio::test]
async fn a_warm_up_claimed_and_never_finished_is_taken_over() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let mut admin = h.admin_client().await;
    let a = create_draft(&mut admin).await;
    // A claimant that died, its claim held for 3 s more.
    let started = std::time::Instant::now();
    let claimed = sqlx::query(
        "UPDATE activities SET warm_claim_until = NOW(3) + INTERVAL 3 SECOND WHERE id = ?",
    )
    .bind(a.id)
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(claimed.rows_affected(), 1);
    let taken = publish_now(&mut admin, a.id).await;
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "it waited for the claim to run out: {:?}",
        started.elapsed()
    );
    assert!(taken.warmed, "the takeover rebuilt the shards");
    let act = taken.activity.unwrap();
    assert_eq!(act.status, pb::ActivityStatus::Published as i32);
    let s = a.items[0].id;
    let redis = cluster.client().await;
    assert_eq!(
        shard_stock(&redis, a.id, s, 4).await.iter().sum::<i64>(),
        10
    );
    seckill_tests::stockd::until_available(
        &h.stock_client().await,
        a.id,
        s,
        Duration::from_secs(20),
    )
    .await;
    let mut c = h.stock_client().await;
    let r = reserve(&mut c, a.id, s, "u1", "r1").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
    let again = publish_now(&mut admin, a.id).await;
    assert!(!again.warmed);
    assert_eq!(shard_stock(&redis, a.id, s, 4).await.iter().sum::<i64>(), 9);
}

/// A publish's warm-up may land late: it read the activity unpublished, another stockd
/// published it meanwhile, sold, and a rebuild closed a shard (fence deleted, its
/// fencing token in the lease key). Unforced, WARM writes only where neither a fence nor
/// a rebuild's lease is: it never reopens a shard mid-rebuild with its stale counts and
/// no buyer records.
#[tokio::test]
async fn a_late_warm_up_leaves_a_shard_a_rebuild_closed_alone() {
    use seckill_lua::calls::{WarmCall, Warmed};
    init_tracing();
    let cluster = RedisCluster::start();
    let redis = cluster.client().await;
    let (a, s) = (77, 5);
    let warm = |shard| {
        let mut w = WarmCall::new(a, shard, "e1", false);
        w.push(s, 10);
        w
    };
    let answer = |v: fred::types::Value| v.as_i64().map(Warmed::from_reply);
    // Shard 1 closed by a rebuild (token 3).
    let _: () = redis
        .set(keys::lease(a, 1), "3", None, None, false)
        .await
        .unwrap();
    let r = seckill_tests::redis::call(&redis, warm(1)).await;
    assert_eq!(answer(r), Some(Warmed::AlreadyWarm));
    let fence: Option<String> = redis.get(keys::fence(a, 1)).await.unwrap();
    let stock: Option<i64> = redis.get(keys::stock(a, 1, s)).await.unwrap();
    assert_eq!(
        (fence, stock),
        (None, None),
        "the closed shard stays closed"
    );
    // A shard never warmed nor rebuilt is written; warmed, it is left alone.
    let r = seckill_tests::redis::call(&redis, warm(2)).await;
    assert_eq!(answer(r), Some(Warmed::Wrote));
    let _: i64 = redis.decr(keys::stock(a, 2, s)).await.unwrap();
    let r = seckill_tests::redis::call(&redis, warm(2)).await;
    assert_eq!(answer(r), Some(Warmed::AlreadyWarm));
    let fence: Option<String> = redis.get(keys::fence(a, 2)).await.unwrap();
    let stock: Option<i64> = redis.get(keys::stock(a, 2, s)).await.unwrap();
    assert_eq!((fence.as_deref(), stock), (Some("e1"), Some(9)));
}

#[tokio::test]
async fn reserve_answers_not_started_ended_and_not_found_without_taking_stock() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let later = create_published_activity(&h, &[(5, 100)], 2, HOUR, HOUR).await;
    let brief = create_published_activity(
        &h,
        &[(5, 100)],
        2,
        Duration::ZERO,
        Duration::from_millis(1500),
    )
    .await;
    let mut c = h.stock_client().await;
    let r = reserve(&mut c, later.id, later.items[0].id, "u", "r")
        .await
        .unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::NotStarted);
    assert_eq!(r.start_at_ms, later.start_at_ms);
    let r = reserve(&mut c, later.id, 999_999, "u", "r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::NotFound);
    let r = reserve(&mut c, 999_999, 1, "u", "r").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::NotFound);
    let (a, s) = (brief.id, brief.items[0].id);
    wait_until_async("the brief window to end", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            reserve(&mut c, a, s, "late", "r").await.unwrap().outcome() == ReserveOutcome::Ended
        }
    })
    .await;
    let redis = cluster.client().await;
    assert_eq!(
        shard_stock(&redis, later.id, later.items[0].id, 2)
            .await
            .iter()
            .sum::<i64>(),
        5
    );
    // An ended window cannot be published.
    let mut admin = h.admin_client().await;
    let err = admin
        .publish_activity(pb::PublishActivityRequest {
            activity_id: a,
            publish_at_ms: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("ended"), "{err:?}");
}

#[tokio::test]
async fn a_scheduled_publish_warms_redis_at_its_time() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let mut admin = h.admin_client().await;
    let a = create_draft(&mut admin).await;
    let r = admin
        .publish_activity(pb::PublishActivityRequest {
            activity_id: a.id,
            publish_at_ms: now_ms() + 800,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.warmed);
    assert_eq!(
        r.activity.unwrap().status,
        pb::ActivityStatus::Scheduled as i32
    );
    wait_until_async("the scheduled publish", Duration::from_secs(20), || {
        let mut admin = admin.clone();
        async move {
            admin
                .get_activity(pb::GetActivityRequest { activity_id: a.id })
                .await
                .unwrap()
                .into_inner()
                .status
                == pb::ActivityStatus::Published as i32
        }
    })
    .await;
    let mut c = h.stock_client().await;
    let (aid, sid) = (a.id, a.items[0].id);
    wait_until_async("reserve to open", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            matches!(reserve(&mut c, aid, sid, "u", "r").await,
                Ok(r) if r.outcome() == ReserveOutcome::Reserved)
        }
    })
    .await;
    let redis = cluster.client().await;
    assert_eq!(
        shard_stock(&redis, a.id, a.items[0].id, 4)
            .await
            .iter()
            .sum::<i64>(),
        9
    );
    let r = reserve(&mut c, a.id, a.items[0].id, "u", "r")
        .await
        .unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Reserved);
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_field_and_changes_nothing() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let mut admin = h.admin_client().await;
    type Spoil = Box<dyn Fn(&mut pb::CreateActivityRequest)>;
    let cases: Vec<(&str, Spoil)> = vec![
        ("title", Box::new(|r| r.title = String::new())),
        ("items[0].stock", Box::new(|r| r.items[0].stock = 0)),
        ("shard_count", Box::new(|r| r.shard_count = 0)),
        ("shard_count", Box::new(|r| r.shard_count = 1025)),
        ("end_at_ms", Box::new(|r| r.end_at_ms = r.start_at_ms - 1)),
        ("end_at_ms", Box::new(|r| r.end_at_ms = r.start_at_ms)),
        ("items", Box::new(|r| r.items.clear())),
        (
            "items[0].sale_price_cents",
            Box::new(|r| r.items[0].sale_price_cents = 0),
        ),
        ("per_user_limit", Box::new(|r| r.per_user_limit = 101)),
        ("challenge_bits", Box::new(|r| r.challenge_bits = 25)),
    ];
    for (field, edit) in cases {
        let mut req = good_request();
        edit(&mut req);
        let err = admin.create_activity(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{field}: {err:?}");
        assert!(
            err.message().starts_with(&format!("{field}: ")),
            "{field}: {err:?}"
        );
    }
    let list = admin
        .list_activities(pb::ListActivitiesRequest {
            current_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(list.activities.is_empty(), "nothing was created");

    let act = create_published_activity(&h, &[(10, 100)], 4, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let long = "x".repeat(65);
    let mut c = h.stock_client().await;
    for (field, user, req, aa, ss) in [
        ("user_id", "", "r", a, s),
        ("user_id", long.as_str(), "r", a, s),
        ("user_id", "a|b", "r", a, s),
        ("user_id", "a b", "r", a, s),
        ("request_id", "u", "", a, s),
        ("request_id", "u", long.as_str(), a, s),
        ("activity_id", "u", "r", 0, s),
        ("item_id", "u", "r", a, 0),
    ] {
        let err = reserve(&mut c, aa, ss, user, req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{field}: {err:?}");
        assert!(
            err.message().starts_with(&format!("{field}: ")),
            "{field}: {err:?}"
        );
    }
    for (rid, user, field) in [
        ("garbage", "u", "reservation_id"),
        ("", "u", "reservation_id"),
        ("1-2-3-abc-4", "", "user_id"),
    ] {
        let err = c
            .release(pb::ReleaseRequest {
                reservation_id: rid.into(),
                user_id: user.into(),
                reason: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().starts_with(&format!("{field}: ")), "{err:?}");
    }
    let redis = cluster.client().await;
    assert_eq!(shard_stock(&redis, a, s, 4).await.iter().sum::<i64>(), 10);
    let err = admin
        .ban_ip(pb::BanIpRequest {
            cidr: "10.0.0.300/8".into(),
            ttl_secs: 0,
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("cidr: "), "{err:?}");
    let err = admin
        .get_activity(pb::GetActivityRequest {
            activity_id: 424242,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn bans_are_stored_announced_listed_and_lifted() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let sub = cluster.client().await;
    let mut rx = sub.message_rx();
    sub.subscribe(keys::BANS_CHANNEL).await.unwrap();
    let mut admin = h.admin_client().await;
    admin
        .ban_ip(pb::BanIpRequest {
            cidr: "10.1.2.3/8".into(),
            ttl_secs: 60,
            reason: "abuse".into(),
        })
        .await
        .unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    let change = seckill_lua::messages::BanChange::parse(&msg.value.as_string().unwrap()).unwrap();
    match change {
        seckill_lua::messages::BanChange::Ban {
            cidr,
            expires_at_ms,
            reason,
        } => {
            assert_eq!(cidr, "10.0.0.0/8");
            assert!(expires_at_ms > now_ms() as u64);
            assert_eq!(reason, "abuse");
        }
        other => panic!("{other:?}"),
    }
    let redis = cluster.client().await;
    let stored: Option<String> = redis.hget(keys::BANS, "10.0.0.0/8").await.unwrap();
    assert!(stored.unwrap().ends_with("|abuse"));
    let bans = admin
        .list_bans(pb::ListBansRequest {})
        .await
        .unwrap()
        .into_inner()
        .bans;
    assert_eq!(bans.len(), 1);
    assert_eq!(bans[0].cidr, "10.0.0.0/8");
    let removed = admin
        .unban_ip(pb::UnbanIpRequest {
            cidr: "10.0.0.0/8".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .removed;
    assert!(removed);
    let msg = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(msg.value.as_string().unwrap(), "-10.0.0.0/8");
    assert!(admin
        .list_bans(pb::ListBansRequest {})
        .await
        .unwrap()
        .into_inner()
        .bans
        .is_empty());
}

#[tokio::test]
async fn reconcile_counts_reservations_in_flight_and_repairs_only_when_quiet() {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&cluster, &db), |_| {}).await;
    let act = create_published_activity(&h, &[(20, 100)], 4, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let mut c = h.stock_client().await;
    let mut rids = Vec::new();
    for u in 0..5 {
        let user = format!("u{u}");
        let r = reserve(&mut c, a, s, &user, "r").await.unwrap();
        rids.push((user, r.reservation_id));
    }
    let mut admin = h.admin_client().await;
    let rec = admin
        .reconcile(pb::ReconcileRequest {
            activity_id: a,
            item_id: 0,
            repair: true,
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(rec.len(), 1);
    assert_eq!(
        (
            rec[0].redis_remaining,
            rec[0].in_flight,
            rec[0].active_orders
        ),
        (15, 5, 0)
    );
    assert_eq!(rec[0].difference, 0);
    assert!(rec[0].consistent);
    assert!(!rec[0].repaired, "in flight: no repair");
    // orderd's part, by hand: the five become orders and MySQL stock drops.
    for (user, rid) in &rids {
        let shard: u32 = rid.parse::<seckill_lua::ReservationId>().unwrap().shard;
        sqlx::query(
            "INSERT INTO orders (id, activity_id, item_id, user_id, request_id, shard, amount_cents, status, reserved_at) \
             VALUES (?, ?, ?, ?, 'r', ?, 100, 'PENDING', NOW(3))",
        )
        .bind(rid).bind(a).bind(s).bind(user).bind(shard)
        .execute(db.pool()).await.unwrap();
    }
    sqlx::query("UPDATE activity_items SET stock = stock - 5 WHERE id = ?")
        .bind(s)
        .execute(db.pool())
        .await
        .unwrap();
    // Units lost from Redis (a crashed move): undersold, then repaired.
    let redis = cluster.client().await;
    let _: i64 = redis.decr_by(keys::stock(a, 0, s), 2).await.unwrap();
    let rec = admin
        .reconcile(pb::ReconcileRequest {
            activity_id: a,
            item_id: s,
            repair: false,
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(
        (rec[0].in_flight, rec[0].active_orders, rec[0].difference),
        (0, 5, 2)
    );
    assert!(!rec[0].consistent);
    let rec = admin
        .reconcile(pb::ReconcileRequest {
            activity_id: a,
            item_id: s,
            repair: true,
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(rec[0].repaired, "{rec:?}");
    assert!(rec[0].consistent, "{rec:?}");
    assert_eq!(rec[0].redis_remaining, 15);
    // The buyers were rebuilt from the orders: still one per user.
    let r = reserve(&mut c, a, s, "u0", "again").await.unwrap();
    assert_eq!(r.outcome(), ReserveOutcome::Duplicate);
    assert_eq!(r.reservation_id, rids[0].1);
}
