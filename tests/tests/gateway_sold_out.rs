#![cfg(all(feature = "gateway", feature = "stockd", feature = "orderd"))]
//! The sold-out short-circuit against the resend contract ("a retry with the same
//! `request_id` returns the same reservation"), on two gateways of one fleet and on
//! both of each gateway's paths: the fast lane (plain HTTP/1.1) and pingora (h2c).
//!
//! A buyer who holds a unit of a sold-out item gets their reservation back (202, same
//! id) or 409 `duplicate` for another request id; everyone else still gets 410
//! `sold_out` from memory, and stockd sees none of their calls.

use reqwest::Client;
use seckill_tests::gateway::{GatewayHandle, Stack};
use seckill_tests::init_tracing;
use seckill_tests::process::wait_until_async;
use serde_json::{json, Value};
use std::time::Duration;

/// One way into one gateway.
struct Lane<'a> {
    name: String,
    gw: &'a GatewayHandle,
    http: Client,
}

impl Lane<'_> {
    /// `POST .../reserve` with this body; (status, JSON body).
    async fn reserve(&self, jwt: &str, (a, s): (u64, u64), body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!(
                "{}/api/v1/activities/{a}/items/{s}/reserve",
                self.gw.base_url()
            ))
            .bearer_auth(jwt)
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{}: reserve: {e}", self.name));
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// The fast lane (plain HTTP/1.1, kept alive) and pingora (HTTP/2 with prior
/// knowledge, which the fast lane never answers) of each gateway.
fn lanes<'a>(gateways: &[(&'static str, &'a GatewayHandle)]) -> Vec<Lane<'a>> {
    gateways
        .iter()
        .flat_map(|(name, gw)| {
            [
                Lane {
                    name: format!("{name} fast lane (HTTP/1.1)"),
                    gw,
                    http: Client::new(),
                },
                Lane {
                    name: format!("{name} pingora (h2c)"),
                    gw,
                    http: Client::builder().http2_prior_knowledge().build().unwrap(),
                },
            ]
        })
        .collect()
}

/// `jwt` with its signature changed: the same `sub`, not signed by the edge's key.
fn forged(jwt: &str) -> String {
    let (head, sig) = jwt.rsplit_once('.').expect("a JWT");
    let flipped = if sig.starts_with('A') { 'B' } else { 'A' };
    format!("{head}.{flipped}{}", &sig[1..])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_resending_after_the_sell_out_gets_the_same_reservation_and_losers_stay_at_the_edge(
) {
    init_tracing();
    let s = Stack::start().await;
    let act = s.open_activity(&[(2, 100)]).await;
    let gw1 = s.gateway(|_| {}).await;
    let gw2 = s.gateway(|_| {}).await;
    gw1.wait_activity(act.id).await;
    gw2.wait_activity(act.id).await;
    let (a, item) = (act.id, act.items[0].id);

    // Carol gets a valid purchase token while the item is on sale, then loses the race.
    let carol = gw1.dev_token("carol").await;
    let carol_token = gw1.purchase_token(&carol, a, item).await;
    let alice = gw1.dev_token("alice").await;
    let alice_token = gw1.purchase_token(&alice, a, item).await;
    let resend = json!({"purchase_token": alice_token, "request_id": "alice-51-a"});
    let first = Lane {
        name: "gw1 first reserve".into(),
        gw: &gw1,
        http: Client::new(),
    }
    .reserve(&alice, (a, item), &resend)
    .await;
    assert_eq!(first.0, 202, "{}", first.1);
    let rid = first.1["reservation_id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let bob = gw2.dev_token("bob").await;
    let bob_token = gw2.purchase_token(&bob, a, item).await;
    assert_eq!(gw2.reserve(&bob, a, item, &bob_token).await.status, 202);

    let path = format!("/api/v1/activities/{a}");
    for gw in [&gw1, &gw2] {
        wait_until_async("the sold-out flag at the edge", Duration::from_secs(10), || {
            let path = &path;
            async move { gw.get(path, None).await.body["activity"]["items"][0]["sold_out"] == true }
        })
        .await;
    }

    let lanes = lanes(&[("gw1", &gw1), ("gw2", &gw2)]);

    // The holder (the reported defect: this was 410 `sold_out`): the identical request is the same reservation on every path of every
    // edge; another request id is a duplicate naming it.
    let before = s.reservations_seen_by_stockd();
    for (k, lane) in lanes.iter().enumerate() {
        let (status, body) = lane.reserve(&alice, (a, item), &resend).await;
        assert_eq!(status, 202, "{}: the resend: {body}", lane.name);
        assert_eq!(body["reservation_id"], rid.as_str(), "{}", lane.name);
        let other = json!({"purchase_token": alice_token, "request_id": format!("alice-51-b{k}")});
        let (status, body) = lane.reserve(&alice, (a, item), &other).await;
        assert_eq!(status, 409, "{}: another request id: {body}", lane.name);
        assert_eq!(body["error"]["code"], "duplicate", "{}", lane.name);
        assert_eq!(body["reservation_id"], rid.as_str(), "{}", lane.name);
    }
    // (Those went to stockd: the counter below can see a call.)
    assert_eq!(
        s.reservations_seen_by_stockd(),
        before + 2 * lanes.len() as u64
    );

    // Losers: 410 from memory, none of them reaches stockd.
    let seen = s.reservations_seen_by_stockd();
    let loser = json!({"purchase_token": carol_token, "request_id": "carol-1"});
    let nobody = json!({"purchase_token": "whatever", "request_id": "x-1"});
    for lane in &lanes {
        let (status, body) = lane.reserve(&carol, (a, item), &loser).await;
        assert_eq!(status, 410, "{}: carol: {body}", lane.name);
        assert_eq!(body["error"]["code"], "sold_out", "{}", lane.name);
        let (status, body) = lane.reserve(&carol, (a, item), &nobody).await;
        assert_eq!(status, 410, "{}: carol without a token: {body}", lane.name);
        // A token naming a holder but not signed by the edge does not pass as them.
        let (status, body) = lane.reserve(&forged(&alice), (a, item), &resend).await;
        assert_eq!(status, 401, "{}: forged alice: {body}", lane.name);
    }
    assert_eq!(
        s.reservations_seen_by_stockd(),
        seen,
        "stockd was called for a request whose user holds nothing"
    );
}

/// `sold_out` of the only item of activity `a`, as `gw`'s catalog says.
async fn sold_out_at(gw: &GatewayHandle, a: u64) -> bool {
    gw.get(&format!("/api/v1/activities/{a}"), None).await.body["activity"]["items"][0]["sold_out"]
        == true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holders_follow_a_returned_unit_and_its_new_buyer_on_every_edge() {
    init_tracing();
    let s = Stack::start().await;
    let act = s.open_activity(&[(1, 100)]).await;
    let gw1 = s.gateway(|_| {}).await;
    let gw2 = s.gateway(|_| {}).await;
    gw1.wait_activity(act.id).await;
    gw2.wait_activity(act.id).await;
    let (a, item) = (act.id, act.items[0].id);
    let fast = |gw| Lane {
        name: "fast lane".into(),
        gw,
        http: Client::new(),
    };

    let alice = gw1.dev_token("alice").await;
    let alice_req = json!({
        "purchase_token": gw1.purchase_token(&alice, a, item).await,
        "request_id": "alice-1",
    });
    let dave = gw2.dev_token("dave").await;
    let dave_req = json!({
        "purchase_token": gw2.purchase_token(&dave, a, item).await,
        "request_id": "dave-1",
    });
    let (status, body) = fast(&gw1).reserve(&alice, (a, item), &alice_req).await;
    assert_eq!(status, 202, "{body}");
    let alice_rid = body["reservation_id"].as_str().unwrap().to_owned();
    for gw in [&gw1, &gw2] {
        wait_until_async("sold out", Duration::from_secs(10), || sold_out_at(gw, a)).await;
    }

    // Alice's order is cancelled: the unit goes back to Redis and the item on sale.
    let order = format!("/api/v1/orders/{alice_rid}");
    wait_until_async("alice's order in MySQL", Duration::from_secs(20), || {
        let (gw1, alice, order) = (&gw1, &alice, &order);
        async move { gw1.get(order, Some(alice)).await.body["state"] == "PENDING_PAYMENT" }
    })
    .await;
    let cancel = gw1
        .post(&format!("{order}/cancel"), Some(&alice), json!({}))
        .await;
    assert_eq!(cancel.status, 200, "{}", cancel.body);
    for gw in [&gw1, &gw2] {
        wait_until_async("back on sale", Duration::from_secs(20), || async move {
            !sold_out_at(gw, a).await
        })
        .await;
    }

    // Dave takes it: sold out again, now held by dave alone, on both edges.
    let (status, body) = fast(&gw2).reserve(&dave, (a, item), &dave_req).await;
    assert_eq!(status, 202, "{body}");
    let dave_rid = body["reservation_id"].as_str().unwrap().to_owned();
    for gw in [&gw1, &gw2] {
        wait_until_async("sold out again", Duration::from_secs(10), || {
            sold_out_at(gw, a)
        })
        .await;
    }
    let lanes = lanes(&[("gw1", &gw1), ("gw2", &gw2)]);
    for lane in &lanes {
        let (status, body) = lane.reserve(&dave, (a, item), &dave_req).await;
        assert_eq!(status, 202, "{}: dave's resend: {body}", lane.name);
        assert_eq!(body["reservation_id"], dave_rid.as_str(), "{}", lane.name);
    }
    // Alice holds nothing any more: her old resend is a loser's, answered at the edge.
    let seen = s.reservations_seen_by_stockd();
    for lane in &lanes {
        let (status, body) = lane.reserve(&alice, (a, item), &alice_req).await;
        assert_eq!(status, 410, "{}: alice after her cancel: {body}", lane.name);
    }
    assert_eq!(s.reservations_seen_by_stockd(), seen, "stockd was called");
}

/// An item whose shards are all empty while units are in transit (a peer stockd took
/// them from a shard and has not given them yet: they are on no shard) is not sold out
/// at the edge: the edge's read counts the take's record (`sk:{a:i}:transit:<s>`). Once
/// the move has settled (here its units were sold meanwhile, so the shards stay empty),
/// it is. Before, the first read after the take answered 410 to every buyer until a
/// read found the units again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_whose_units_are_moving_is_not_sold_out_at_the_edge() {
    use seckill_tests::stockd::{set_shard_stock, settle_by_hand, take_in_transit};
    init_tracing();
    let s = Stack::start().await;
    let act = s.open_activity(&[(2, 100)]).await;
    let gw = s.gateway(|_| {}).await;
    gw.wait_activity(act.id).await;
    let (a, item) = (act.id, act.items[0].id);
    let redis = s.redis.client().await;
    // Taken from the last shard (the edge reads every shard's records).
    set_shard_stock(&redis, a, item, &[0, 2]).await;
    assert_eq!(
        take_in_transit(&redis, (a, 1, item), 2, "peer", 60_000).await,
        2
    );
    // Ten of the edge's reads (one every 100 ms): still on sale.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(!sold_out_at(&gw, a).await, "sold out while its units move");

    settle_by_hand(&redis, (a, 1, item), "peer", 2).await;
    wait_until_async(
        "sold out once the move has settled",
        Duration::from_secs(10),
        || sold_out_at(&gw, a),
    )
    .await;
}
