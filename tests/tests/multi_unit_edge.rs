#![cfg(all(feature = "gateway", feature = "stockd", feature = "orderd"))]
//! Multi-unit purchase through the edge (issue 15 item 3): the reserve body's
//! `quantity`, its refusals (400 naming the field, 409 not_enough_stock), and the
//! order carrying its units. The gateway is the built binary
//! (`cargo build -p gateway --bins`).

use std::time::Duration;

use seckill_tests::gateway::Stack;
use seckill_tests::process::wait_until_async;
use seckill_tests::stockd::{create_published_activity_limited, shard_stock};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_reserves_k_units_and_refuses_bad_quantities_without_touching_stock() {
    let s = Stack::start().await;
    let mut admin = s.stockd.admin_client().await;
    let act = create_published_activity_limited(
        &mut admin,
        &[(5, 1500)],
        2,
        Duration::ZERO,
        Duration::from_secs(3600),
        3,
    )
    .await;
    let gw = s.gateway(|_| {}).await;
    gw.wait_activity(act.id).await;
    let (a, item) = (act.id, act.items[0].id);
    let redis = s.redis.client().await;
    let units = || async { shard_stock(&redis, a, item, 2).await.iter().sum::<i64>() };

    let one = gw.get(&format!("/api/v1/activities/{a}"), None).await;
    assert_eq!(one.body["activity"]["per_user_limit"], 3, "{}", one.body);

    let path = format!("/api/v1/activities/{a}/items/{item}/reserve");
    let jwt = gw.dev_token("alice").await;
    // Bad quantities: 400 naming the field, from the edge (not a number, 0, a
    // fraction, > 100) or from stockd (above the activity's limit of 3).
    for bad in [
        json!("2"),
        json!(0),
        json!(1.5),
        json!(-1),
        json!(101),
        json!(4),
    ] {
        let token = gw.purchase_token(&jwt, a, item).await;
        let r = gw
            .post(
                &path,
                Some(&jwt),
                json!({"purchase_token": token, "quantity": bad}),
            )
            .await;
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert_eq!(r.code(), "bad_request");
        let msg = r.body["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("quantity"), "{bad}: {msg}");
    }
    assert_eq!(units().await, 5, "no bad request took a unit");

    // Three units: 202 with the quantity; the order carries it at 3 x the price.
    let token = gw.purchase_token(&jwt, a, item).await;
    let body = json!({"purchase_token": token, "quantity": 3});
    let r = gw.post(&path, Some(&jwt), body.clone()).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["quantity"], 3);
    let order_id = r.body["order_id"].as_str().unwrap().to_string();
    assert_eq!(units().await, 2);
    // The same body again (same request id): the same reservation, no more units.
    let again = gw.post(&path, Some(&jwt), body).await;
    assert_eq!(
        (again.status, &again.body["order_id"]),
        (202, &Value::from(order_id.as_str()))
    );
    assert_eq!(units().await, 2);

    // Bob asks for 3 of the 2 left: 409 not_enough_stock naming how many remain.
    let bob = gw.dev_token("bob").await;
    let token = gw.purchase_token(&bob, a, item).await;
    let r = gw
        .post(
            &path,
            Some(&bob),
            json!({"purchase_token": token, "quantity": 3}),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.code(), "not_enough_stock");
    assert_eq!(r.body["remaining"], 2);
    assert_eq!(units().await, 2);
    // Two fit.
    let token = gw.purchase_token(&bob, a, item).await;
    let r = gw
        .post(
            &path,
            Some(&bob),
            json!({"purchase_token": token, "quantity": 2}),
        )
        .await;
    assert_eq!(
        (r.status, &r.body["quantity"]),
        (202, &json!(2)),
        "{}",
        r.body
    );
    assert_eq!(units().await, 0);

    let order = format!("/api/v1/orders/{order_id}");
    wait_until_async("alice's order in MySQL", Duration::from_secs(20), || {
        let (gw, jwt, order) = (&gw, &jwt, &order);
        async move { gw.get(order, Some(jwt)).await.body["state"] == "PENDING_PAYMENT" }
    })
    .await;
    let o = gw.get(&order, Some(&jwt)).await;
    assert_eq!(o.body["quantity"], 3, "{}", o.body);
    assert_eq!(o.body["amount_cents"], 4500);
}
