#![cfg(all(feature = "gateway", feature = "stockd", feature = "orderd"))]
//! Many items and many live activities (issue 15, item 5): the edge's catalog lists
//! every one of 1,000 live activities, an activity of 100 items shows them all, and the
//! sold-out flags follow the sales exactly (the sold-out items and only those), also
//! answered 410 at the edge; every sale becomes one order in MySQL.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::gateway::stack::Stack;
use seckill_tests::orderd::wait_orders;
use seckill_tests::process::wait_until_async;
use seckill_tests::stockd::{create_published_activity_with, reserve};
use serde_json::Value;

const ACTIVITIES: usize = 1000;
const ITEMS: usize = 100;

async fn get_json(http: &reqwest::Client, url: &str) -> Option<Value> {
    let r = http.get(url).send().await.ok()?;
    if r.status() != 200 {
        return None;
    }
    r.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_catalog_and_sold_out_flags_hold_with_100_items_and_1000_live_activities() {
    let stack = Stack::start().await;
    let admin = stack.stockd.admin_client().await;
    // One activity of 100 items (one unit each, 2 shards) and 999 of one item.
    let mut big_admin = admin.clone();
    let big = create_published_activity_with(
        &mut big_admin,
        &vec![(1, 100); ITEMS],
        2,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    assert_eq!(big.items.len(), ITEMS);
    let small: Vec<(u64, u64)> = futures::stream::iter(1..ACTIVITIES)
        .map(|_| {
            let mut admin = admin.clone();
            async move {
                let a = create_published_activity_with(
                    &mut admin,
                    &[(1, 100)],
                    1,
                    Duration::ZERO,
                    Duration::from_secs(3600),
                )
                .await;
                (a.id, a.items[0].id)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let gw = stack.gateway(|_| {}).await;
    let http = reqwest::Client::new();
    let base = gw.base_url();

    // The catalog lists every live activity.
    let mut want: HashSet<u64> = small.iter().map(|(a, _)| *a).collect();
    want.insert(big.id);
    wait_until_async(
        "the edge lists all 1,000 activities",
        Duration::from_secs(60),
        || {
            let (http, url, want) = (http.clone(), format!("{base}/api/v1/activities"), &want);
            async move {
                let Some(v) = get_json(&http, &url).await else {
                    return false;
                };
                let listed: HashSet<u64> = v["activities"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|x| x["id"].as_u64()).collect())
                    .unwrap_or_default();
                want.is_subset(&listed)
            }
        },
    )
    .await;

    // Sell every third item of the big activity and every tenth small activity.
    let sold_big: HashSet<u64> = big.items.iter().step_by(3).map(|i| i.id).collect();
    let sold_small: HashSet<u64> = small.iter().step_by(10).map(|(a, _)| *a).collect();
    let mut sales: Vec<(u64, u64)> = sold_big.iter().map(|s| (big.id, *s)).collect();
    sales.extend(
        small
            .iter()
            .filter(|(a, _)| sold_small.contains(a))
            .copied(),
    );
    let stock = stack.stockd.stock_client().await;
    let outcomes: Vec<ReserveOutcome> = futures::stream::iter(sales.clone())
        .map(|(a, s)| {
            let mut c = stock.clone();
            async move {
                reserve(&mut c, a, s, &format!("buyer-{a}-{s}"), "q")
                    .await
                    .expect("reserve")
                    .outcome()
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(outcomes.iter().all(|o| *o == ReserveOutcome::Reserved));

    // The flags: exactly the sold items, in the big activity and across the small ones.
    let sold_out_of = |v: &Value| -> HashSet<u64> {
        v["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|i| i["sold_out"].as_bool() == Some(true))
                    .filter_map(|i| i["id"].as_u64())
                    .collect()
            })
            .unwrap_or_default()
    };
    let big_url = format!("{base}/api/v1/activities/{}", big.id);
    wait_until_async(
        "the sold-out flags of the 100-item activity",
        Duration::from_secs(30),
        || {
            let (http, url, sold) = (http.clone(), big_url.clone(), &sold_big);
            async move {
                match get_json(&http, &url).await {
                    Some(v) => {
                        v["activity"]["items"].as_array().map(Vec::len) == Some(ITEMS)
                            && sold_out_of(&v["activity"]) == *sold
                    }
                    None => false,
                }
            }
        },
    )
    .await;
    wait_until_async(
        "the sold-out flags across 1,000 activities",
        Duration::from_secs(30),
        || {
            let (http, url) = (http.clone(), format!("{base}/api/v1/activities"));
            let (sold, big_id) = (&sold_small, big.id);
            async move {
                let Some(v) = get_json(&http, &url).await else {
                    return false;
                };
                let flagged: HashSet<u64> = v["activities"]
                    .as_array()
                    .map(|acts| {
                        acts.iter()
                            .filter(|a| a["id"].as_u64() != Some(big_id))
                            .filter(|a| !sold_out_of(a).is_empty())
                            .filter_map(|a| a["id"].as_u64())
                            .collect()
                    })
                    .unwrap_or_default();
                flagged == *sold
            }
        },
    )
    .await;

    // A sold-out item is refused at the edge, before authentication.
    let jwt = gw.dev_token("late-fan").await;
    let s_sold = *sold_big.iter().next().expect("a sold item");
    let reserve_via_edge = |s: u64| {
        let (http, base, jwt) = (http.clone(), base.clone(), jwt.clone());
        async move {
            http.post(format!(
                "{base}/api/v1/activities/{}/items/{s}/reserve",
                big.id
            ))
            .bearer_auth(jwt)
            .json(&serde_json::json!({}))
            .send()
            .await
            .expect("reserve through the edge")
            .status()
            .as_u16()
        }
    };
    assert_eq!(reserve_via_edge(s_sold).await, 410, "sold out at the edge");

    // Every sale is one order.
    wait_orders(&stack.db, sales.len() as i64, Duration::from_secs(60)).await;
}
