#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]
//! One buyer's trace across the hops: a W3C `traceparent` sent to the edge comes back
//! in the answers (`trace_id`, and a `traceparent` header with the edge's span) and is
//! written by stockd into the reservation's stream entry (`tp`); a request without
//! one, or with a malformed one, gets a fresh valid trace; the edge's access line and
//! orderd's line for the order name the same trace id. Needs
//! `cargo build -p gateway -p orderd --bins`.

use std::collections::HashMap;

use fred::interfaces::StreamsInterface;
use seckill_lua::{keys, ReservationId};
use seckill_proto::trace::TraceParent;
use seckill_tests::gateway::{spawn_gateway, EdgeDeps, GatewayHandle};
use seckill_tests::orderd::spawn_orderd;
use seckill_tests::stockd::{create_published_activity, spawn_stockd};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};
use serde_json::{json, Value};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const INCOMING: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A reserve through the edge with `traceparent` (when given): status, body and the
/// answer's `traceparent` header.
async fn reserve(
    gw: &GatewayHandle,
    jwt: &str,
    a: u64,
    s: u64,
    traceparent: Option<&str>,
) -> (u16, Value, Option<String>) {
    let pt = gw.purchase_token(jwt, a, s).await;
    let mut req = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/activities/{a}/items/{s}/reserve",
            gw.base_url()
        ))
        .bearer_auth(jwt)
        .json(&json!({ "purchase_token": pt }));
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let r = req.send().await.unwrap();
    let header = r
        .headers()
        .get("traceparent")
        .map(|v| v.to_str().unwrap().to_string());
    (r.status().as_u16(), r.json().await.unwrap(), header)
}

/// The fields of the stream entry of reservation `rid`.
async fn stream_entry(redis: &fred::clients::Client, rid: &str) -> HashMap<String, String> {
    let id: ReservationId = rid.parse().unwrap();
    let entries: Vec<(String, HashMap<String, String>)> = redis
        .xrange_values(keys::orders_stream(id.activity, id.shard), "-", "+", None)
        .await
        .unwrap();
    entries
        .into_iter()
        .map(|(_, f)| f)
        .find(|f| f.get("rid").map(String::as_str) == Some(rid))
        .unwrap_or_else(|| panic!("no stream entry for {rid}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyers_traceparent_reaches_the_stream_entry_and_comes_back_in_every_answer() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&redis, &db);
    let stockd = spawn_stockd(&deps, |_| {}).await;
    // orderd serves (the edge's readiness needs it) but finds no stream to consume: it
    // looked for activities before this one existed and looks again in an hour, so
    // the entries stay in Redis for this test to read.
    let orderd = spawn_orderd(&deps, |c| c.consumer.discovery_interval_ms = 3_600_000).await;
    let act = create_published_activity(
        &stockd,
        &[(10, 100)],
        2,
        std::time::Duration::ZERO,
        std::time::Duration::from_secs(3600),
    )
    .await;
    let (a, s) = (act.id, act.items[0].id);
    let orderd_addr = orderd.addr_str();
    let gw = spawn_gateway(
        &EdgeDeps {
            redis: &redis,
            stockd: &stockd.addr,
            orderd: &orderd_addr,
        },
        |_| {},
    )
    .await;
    gw.wait_activity(a).await;
    let client = redis.client().await;

    // With a traceparent: the same trace id in the 202, in the header (with the
    // edge's own span as parent) and in the stream entry stockd wrote.
    let alice = gw.dev_token("alice").await;
    let (status, body, header) = reserve(&gw, &alice, a, s, Some(INCOMING)).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["trace_id"], TRACE, "{body}");
    let header = TraceParent::parse(&header.expect("traceparent header")).unwrap();
    assert_eq!(header.trace_id(), TRACE);
    assert_ne!(
        header.parent_id(),
        "00f067aa0ba902b7",
        "the edge's own span"
    );
    let rid = body["reservation_id"].as_str().unwrap();
    let entry = stream_entry(&client, rid).await;
    let tp = TraceParent::parse(&entry["tp"]).expect("a valid tp in the entry");
    assert_eq!(tp.trace_id(), TRACE);
    assert_eq!(tp, header, "stockd stored what the edge sent");
    // The entry's other fields are as before.
    for f in ["rid", "uid", "a", "s", "req", "ts"] {
        assert!(entry.contains_key(f), "{f} in {entry:?}");
    }
    assert_eq!(entry["uid"], "alice");

    // An error answer after the backend call carries it too (409 duplicate).
    let (status, body, _) = reserve(&gw, &alice, a, s, Some(INCOMING)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("duplicate"))
    );
    assert_eq!(body["trace_id"], TRACE, "{body}");
    // And one refused at the door (401).
    let r = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/activities/{a}/items/{s}/token",
            gw.base_url()
        ))
        .header("traceparent", INCOMING)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["trace_id"], TRACE, "{body}");

    // Without one, and with a malformed one: a fresh valid trace, not an error; each
    // request its own.
    let mut seen = Vec::new();
    for (user, tp) in [("bob", None), ("carol", Some("00-not-a-trace-01"))] {
        let jwt = gw.dev_token(user).await;
        let (status, body, header) = reserve(&gw, &jwt, a, s, tp).await;
        assert_eq!(status, 202, "{body}");
        let header = TraceParent::parse(&header.expect("traceparent header")).unwrap();
        let trace_id = body["trace_id"].as_str().unwrap().to_string();
        assert_eq!(header.trace_id(), trace_id);
        assert_ne!(trace_id, TRACE);
        let entry = stream_entry(&client, body["reservation_id"].as_str().unwrap()).await;
        assert_eq!(
            TraceParent::parse(&entry["tp"]).unwrap().trace_id(),
            trace_id
        );
        seen.push(trace_id);
    }
    assert_ne!(seen[0], seen[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_id_is_in_the_edge_access_log_and_in_orderds_line_for_the_order() {
    // Needs `cargo build -p orderd --bins` too: orderd runs as a process, so its log
    // is a file to read, as an operator would.
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&redis, &db);
    let stockd = spawn_stockd(&deps, |_| {}).await;
    let orderd = seckill_tests::orderd::spawn_orderd_process(&deps, |_| {}).await;
    let act = create_published_activity(
        &stockd,
        &[(10, 100)],
        2,
        std::time::Duration::ZERO,
        std::time::Duration::from_secs(3600),
    )
    .await;
    let (a, s) = (act.id, act.items[0].id);
    let gw = spawn_gateway(
        &EdgeDeps {
            redis: &redis,
            stockd: &stockd.addr,
            orderd: &orderd.addr,
        },
        |_| {},
    )
    .await;
    gw.wait_activity(a).await;
    let jwt = gw.dev_token("dora").await;
    let (status, body, _) = reserve(&gw, &jwt, a, s, Some(INCOMING)).await;
    assert_eq!(status, 202, "{body}");
    let order = body["order_id"].as_str().unwrap().to_string();

    // orderd: the order's line names the order and the buyer's trace id.
    seckill_tests::process::wait_until_async(
        "orderd's line for the order",
        std::time::Duration::from_secs(20),
        || async {
            orderd
                .log()
                .lines()
                .any(|l| l.contains("order written") && l.contains(&order) && l.contains(TRACE))
        },
    )
    .await;
    // The edge: the access line of the reserve carries the same trace id.
    seckill_tests::process::wait_until_async(
        "the edge's access line",
        std::time::Duration::from_secs(10),
        || async {
            gw.log()
                .lines()
                .any(|l| l.contains("access") && l.contains("/reserve") && l.contains(TRACE))
        },
    )
    .await;
}
