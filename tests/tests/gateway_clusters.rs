#![cfg(feature = "gateway")]
//! Hot-item isolation at the edge: an activity placed on a named Redis Cluster
//! (`[redis.clusters.hot]`) has its stock read there, and its sold-out flags follow that
//! cluster whatever happens to the default one, and the other way round.
//!
//! Two clusters: A (the default: catalog, meta hashes) and B (`hot`). stockd is not
//! needed (nor running: both upstreams point at a closed port), so a reserve that the
//! edge does not answer from memory cannot come back 410; the keys are written here as
//! stockd writes them. Every item has a decoy on the other cluster that says the
//! opposite, so reading the wrong cluster fails the test.

use fred::prelude::*;
use seckill_lua::keys;
use seckill_lua::messages::SoldOut;
use seckill_tests::gateway::{call, named_cluster, set, spawn_gateway_unready, EdgeDeps};
use seckill_tests::gateway::{Answer, GatewayHandle};
use seckill_tests::init_tracing;
use seckill_tests::process::{free_port, wait_until_async};
use seckill_tests::redis::ClusterSpec;
use seckill_tests::RedisCluster;
use std::time::{Duration, Instant};

/// On B: item 7 sold out, item 77 on sale.
const HOT: u64 = 101;
/// On A (the default cluster): item 8 on sale, item 88 sold out.
const HOME: u64 = 102;
/// On `cold`, a cluster the gateway is not configured with: item 9.
const LOST: u64 = 103;
const SHARDS: u32 = 2;

/// Writes `sk:{a}:meta` on the default cluster as stockd's publish does (an hour-long
/// open window, `cluster` naming where the stock lives) and adds `a` to the catalog.
async fn publish(default: &Client, a: u64, cluster: &str, items: &[u64]) {
    use keys::meta as f;
    let now = seckill_lua::clock::unix_ms() as i64;
    let mut meta: Vec<(String, String)> = vec![
        (f::TITLE.into(), format!("sale {a}")),
        (f::START_MS.into(), (now - 60_000).to_string()),
        (f::END_MS.into(), (now + 3_600_000).to_string()),
        (f::SHARDS.into(), SHARDS.to_string()),
        (f::VERSION.into(), "1".into()),
        (f::CLUSTER.into(), cluster.into()),
        (
            f::ITEMS.into(),
            items
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
    ];
    for s in items {
        meta.push((format!("{}{s}", f::ITEM_STOCK), "10".into()));
        meta.push((format!("{}{s}", f::ITEM_PRICE), "100".into()));
        meta.push((format!("{}{s}", f::ITEM_TITLE), format!("item {s}")));
    }
    let _: () = default.hset(keys::meta(a), meta).await.expect("meta");
    let _: () = default
        .sadd(keys::ACTIVITIES, a.to_string())
        .await
        .expect("catalog");
}

/// Sets every shard stock key of `(a, s)` on `c`: shard 0 to `first`, the others to 0.
async fn set_stock(c: &Client, (a, s): (u64, u64), first: i64) {
    for i in 0..SHARDS {
        let n = if i == 0 { first } else { 0 };
        let _: () = c
            .set(keys::stock(a, i, s), n, None, None, false)
            .await
            .expect("stock");
    }
}

/// Announces on `c`'s `sk:soldout`, as stockd does on the activity's cluster.
async fn announce(c: &Client, (a, s): (u64, u64), sold_out: bool) {
    let msg = SoldOut {
        activity: a,
        item: s,
        sold_out,
    };
    let _: () = c
        .publish(keys::SOLD_OUT_CHANNEL, msg.encode())
        .await
        .expect("publish");
}

/// `sold_out` of item `s` of activity `a`, as `gw`'s catalog says.
async fn sold_out(gw: &GatewayHandle, (a, s): (u64, u64)) -> bool {
    let body = gw.get(&format!("/api/v1/activities/{a}"), None).await.body;
    let items = body["activity"]["items"].as_array().cloned();
    let item = items
        .unwrap_or_default()
        .into_iter()
        .find(|i| i["id"] == s)
        .unwrap_or_else(|| panic!("item {s} of activity {a}: {body}"));
    item["sold_out"] == true
}

/// Waits until every gateway says `(a, s)` is sold out (`want`) or on sale.
async fn wait_flag(gws: &[&GatewayHandle], item: (u64, u64), want: bool, timeout: Duration) {
    for gw in gws {
        let what = format!("{item:?} sold_out = {want} at {}", gw.base_url());
        wait_until_async(&what, timeout, || async move {
            sold_out(gw, item).await == want
        })
        .await;
    }
}

/// A reserve with no token at all: 410 only from the edge's memory; anything it lets
/// through stops at authentication (401), and stockd is not there anyway.
async fn anonymous_reserve(gw: &GatewayHandle, (a, s): (u64, u64)) -> Answer {
    call(
        reqwest::Method::POST,
        format!("{}/api/v1/activities/{a}/items/{s}/reserve", gw.base_url()),
        None,
        Some(serde_json::json!({})),
        None,
    )
    .await
}

async fn assert_answers(gws: &[&GatewayHandle], item: (u64, u64), status: u16) {
    for gw in gws {
        let r = anonymous_reserve(gw, item).await;
        assert_eq!(
            r.status,
            status,
            "{item:?} at {}: {}",
            gw.base_url(),
            r.body
        );
    }
}

const WARNING: &str = "missing from [redis.clusters]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_activity_follows_its_own_cluster_and_each_cluster_outlives_the_other() {
    init_tracing();
    let mut a = RedisCluster::start_with(2, seckill_tests::redis::Persistence::None);
    // A node timeout far above the stall below: B's nodes, stopped together, must not
    // flag each other failing.
    let b = RedisCluster::start_spec(ClusterSpec::masters(2).node_timeout_ms(60_000));
    let (ca, cb) = (a.client().await, b.client().await);

    publish(&ca, HOT, "hot", &[7, 77]).await;
    set_stock(&cb, (HOT, 7), 0).await;
    set_stock(&cb, (HOT, 77), 3).await;
    set_stock(&ca, (HOT, 7), 5).await; // decoys
    set_stock(&ca, (HOT, 77), 0).await;
    publish(&ca, HOME, "", &[8, 88]).await;
    set_stock(&ca, (HOME, 8), 1).await;
    set_stock(&ca, (HOME, 88), 0).await;
    set_stock(&cb, (HOME, 8), 0).await; // decoys
    set_stock(&cb, (HOME, 88), 5).await;
    publish(&ca, LOST, "cold", &[9]).await;
    set_stock(&ca, (LOST, 9), 0).await;
    set_stock(&cb, (LOST, 9), 0).await;

    // Nothing listens upstream: whatever the edge does not answer itself fails.
    let dead = format!("127.0.0.1:{}", free_port(None));
    let deps = EdgeDeps {
        redis: &a,
        stockd: &dead,
        orderd: &dead,
    };
    // One gateway polling often; one that (after its first read) reads on the
    // refresh of the catalog and on sold-out messages only. A command to a hung node
    // waits `timeout_ms`: long, so that a read of one cluster waiting on another's
    // shows as a delay past the stall window below.
    let polling = spawn_gateway_unready(&deps, |c| {
        named_cluster(c, "hot", &b);
        set(c, "redis", "timeout_ms", 8_000);
    })
    .await;
    let listening = spawn_gateway_unready(&deps, |c| {
        named_cluster(c, "hot", &b);
        set(c, "redis", "timeout_ms", 8_000);
        set(c, "redis", "stock_poll_ms", 600_000);
    })
    .await;
    let gws = [&polling, &listening];
    for gw in gws {
        for act in [HOT, HOME, LOST] {
            gw.wait_activity(act).await;
        }
    }
    let t = Duration::from_secs(10);

    // Each activity's stock is read on its own cluster.
    wait_flag(&gws, (HOT, 7), true, t).await;
    wait_flag(&gws, (HOME, 88), true, t).await;
    for gw in gws {
        assert!(!sold_out(gw, (HOT, 77)).await, "HOT 77 read on A");
        assert!(!sold_out(gw, (HOME, 8)).await, "HOME 8 read on B");
        assert!(!sold_out(gw, (LOST, 9)).await, "LOST read somewhere");
    }
    assert_answers(&gws, (HOT, 7), 410).await;
    assert_answers(&gws, (HOME, 88), 410).await;
    for on_sale in [(HOT, 77), (HOME, 8), (LOST, 9)] {
        assert_answers(&gws, on_sale, 401).await;
    }
    for gw in gws {
        let unknown = gw.metric("gateway_activities_on_unknown_cluster", "").await;
        assert_eq!(unknown, Some(1.0), "{}", gw.base_url());
    }

    // B hangs (every node stopped): A's activities are followed all the same.
    let stalled = Instant::now();
    let stalls: Vec<_> = b.ports().into_iter().map(|p| b.stall(p, 12_000)).collect();
    // Long enough for a read of B to be hanging (it does for `timeout_ms`): a read of A
    // queued behind it would come too late for the wait below.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    set_stock(&ca, (HOME, 8), 0).await;
    wait_flag(&gws, (HOME, 8), true, Duration::from_secs(4)).await;
    assert!(
        stalled.elapsed() < Duration::from_secs(11),
        "seen only once B was back"
    );
    assert_answers(&gws, (HOME, 8), 410).await;
    // HOT keeps what B said last.
    for gw in gws {
        assert!(sold_out(gw, (HOT, 7)).await && !sold_out(gw, (HOT, 77)).await);
    }
    for s in stalls {
        s.join();
    }
    b.wait_settled(Duration::from_secs(30));
    let hot_errors = polling
        .metric("gateway_stock_poll_errors_total", "cluster=\"hot\"")
        .await;
    assert!(hot_errors.is_some_and(|n| n >= 1.0), "{hot_errors:?}");

    // A dies (every node killed): B's changes are still followed, by polling and by
    // B's sold-out channel (the listening gateway's only way: its catalog refresh fails).
    for p in a.ports() {
        a.kill(p);
    }
    set_stock(&cb, (HOT, 77), 0).await;
    announce(&cb, (HOT, 77), true).await;
    wait_flag(&gws, (HOT, 77), true, t).await;
    set_stock(&cb, (HOT, 7), 1).await;
    announce(&cb, (HOT, 7), false).await;
    wait_flag(&gws, (HOT, 7), false, t).await;
    assert_answers(&gws, (HOT, 77), 410).await;
    assert_answers(&gws, (HOT, 7), 401).await;
    // The polling gateway reads B's stock, not only messages: a sell-out nobody
    // announced.
    set_stock(&cb, (HOT, 7), 0).await;
    wait_flag(&[&polling], (HOT, 7), true, t).await;
    wait_until_async("default-cluster poll errors", 2 * t, || async {
        polling
            .metric("gateway_stock_poll_errors_total", "cluster=\"default\"")
            .await
            .is_some_and(|n| n >= 1.0)
    })
    .await;

    // The misplaced activity was warned about once, however many refreshes ran.
    for gw in gws {
        let log = gw.log();
        assert_eq!(log.matches(WARNING).count(), 1, "{log}");
        let line = log.lines().find(|l| l.contains(WARNING)).unwrap();
        assert!(line.contains("103") && line.contains("cold"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_cluster_hung_when_the_gateway_starts_is_read_once_it_answers() {
    init_tracing();
    let a = RedisCluster::start_with(2, seckill_tests::redis::Persistence::None);
    let b = RedisCluster::start_spec(ClusterSpec::masters(2).node_timeout_ms(60_000));
    let (ca, cb) = (a.client().await, b.client().await);
    publish(&ca, HOT, "hot", &[7]).await;
    set_stock(&cb, (HOT, 7), 0).await;
    set_stock(&ca, (HOT, 7), 5).await; // decoy
                                       // B answers nothing while the gateway starts: its first connections fail.
    let stalls: Vec<_> = b.ports().into_iter().map(|p| b.stall(p, 6_000)).collect();
    let dead = format!("127.0.0.1:{}", free_port(None));
    let deps = EdgeDeps {
        redis: &a,
        stockd: &dead,
        orderd: &dead,
    };
    let gw = spawn_gateway_unready(&deps, |c| named_cluster(c, "hot", &b)).await;
    gw.wait_activity(HOT).await;
    for s in stalls {
        s.join();
    }
    wait_flag(&[&gw], (HOT, 7), true, Duration::from_secs(20)).await;
}

/// `gateway -t -c <path>`: (success, stdout and stderr).
fn config_test(path: &std::path::Path) -> (bool, String) {
    seckill_tests::process::config_test("gateway", path)
}

#[test]
fn gateway_t_takes_the_shipped_named_cluster_and_refuses_a_bad_one_naming_the_field() {
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/gateway.toml"),
    )
    .unwrap();
    let example = "# [redis.clusters.hot]\n# nodes = [\"127.0.0.1:7101\"]\n";
    assert!(shipped.contains(example), "the shipped example moved");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let with = |section: &str| {
        std::fs::write(&path, shipped.replace(example, section)).unwrap();
        config_test(&path)
    };
    let (ok, text) = with("[redis.clusters.hot]\nnodes = [\"127.0.0.1:7101\"]\n");
    assert!(ok, "{text}");
    for (section, field) in [
        (
            "[redis.clusters.hot]\nnodes = [\"127.0.0.1\"]\n",
            "redis.clusters.hot.nodes",
        ),
        (
            "[redis.clusters.hot]\nnodes = []\n",
            "redis.clusters.hot.nodes",
        ),
        (
            "[redis.clusters.Hot]\nnodes = [\"127.0.0.1:7101\"]\n",
            "redis.clusters.Hot",
        ),
        (
            "[redis.clusters.default]\nnodes = [\"127.0.0.1:7101\"]\n",
            "redis.clusters.default",
        ),
        (
            "[redis.clusters.hot]\nnodes = [\"127.0.0.1:7101\"]\ntimeout_ms = 5\n",
            "redis.clusters.hot",
        ),
    ] {
        let (ok, text) = with(section);
        assert!(!ok, "accepted {section}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
        assert!(text.contains("gateway.toml"), "{text}");
        assert!(text.contains(field), "{field}: {text}");
    }
}

/// Live activities at this size are more idle stock keys than one poll reads.
const IDLE_ACTIVITIES: u64 = 300;
/// `redis.stock_poll_idle_keys` of the test: a full turn over the 600 idle keys takes
/// 100 polls (10 s at 100 ms).
const IDLE_KEYS: i64 = 6;

/// The idle cost does not grow with the live activities: items nobody asks this gateway
/// about are read in turn, `redis.stock_poll_idle_keys` keys a poll, not every one every
/// poll (600 keys × 10 polls a second here). A silent sell-out of an idle item is still
/// found by the turn; a sold-out message, or a request for the item, brings it back to
/// every poll at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_items_are_read_in_turn_and_a_request_or_a_message_brings_one_back_at_once() {
    init_tracing();
    let a = RedisCluster::start_with(2, seckill_tests::redis::Persistence::None);
    let ca = a.client().await;
    let first = 1_000;
    for k in 0..IDLE_ACTIVITIES {
        publish(&ca, first + k, "", &[1]).await;
        set_stock(&ca, (first + k, 1), 5).await;
    }
    let dead = format!("127.0.0.1:{}", free_port(None));
    let deps = EdgeDeps {
        redis: &a,
        stockd: &dead,
        orderd: &dead,
    };
    let gw = spawn_gateway_unready(&deps, |c| {
        set(c, "redis", "stock_poll_ms", 100);
        set(c, "redis", "stock_poll_idle_keys", IDLE_KEYS);
    })
    .await;
    gw.wait_activity(first + IDLE_ACTIVITIES - 1).await;
    // Every item is read once in full (never read: hot), then goes idle.
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let gets = || a.command_counts().get("get").copied().unwrap_or(0);
    let (before, started) = (gets(), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let per_sec = (gets() - before) as f64 / started.elapsed().as_secs_f64();
    // At most IDLE_KEYS + one item's shards per poll: 80 GETs/s. Reading every item on
    // every poll would be 6,000/s.
    println!("idle stock reads: {per_sec:.0} GETs/s over {IDLE_ACTIVITIES} activities");
    assert!(
        per_sec < 300.0,
        "{per_sec:.0} GETs/s: idle items are read on every poll"
    );

    // A silent sell-out (no message) of an idle item: found by the turn.
    set_stock(&ca, (first + 100, 1), 0).await;
    wait_flag(&[&gw], (first + 100, 1), true, Duration::from_secs(20)).await;

    // Announced: at once, not at its turn (up to 10 s away).
    set_stock(&ca, (first + 200, 1), 0).await;
    announce(&ca, (first + 200, 1), true).await;
    wait_flag(&[&gw], (first + 200, 1), true, Duration::from_secs(2)).await;

    // A request for an idle item reads it at once. The item is one the turn read just
    // before it found item 100 (in id order), so its next turn is about a full turn
    // (10 s) away: the flag within 2 s is the request's doing. The answer to the request
    // itself is most often still the old state (on sale: past the short-circuit to
    // authentication, 401), but the read it asks for runs on the feed's own thread and
    // may land before the request's own sold-out check has answered (its thread
    // descheduled after it asked, as on a loaded CI machine, where CI saw 410 twice).
    let behind = (first + 90, 1);
    set_stock(&ca, behind, 0).await;
    let r = anonymous_reserve(&gw, behind).await;
    assert!(matches!(r.status, 401 | 410), "{} {}", r.status, r.body);
    wait_flag(&[&gw], behind, true, Duration::from_secs(2)).await;
    assert_eq!(anonymous_reserve(&gw, behind).await.status, 410);
}
