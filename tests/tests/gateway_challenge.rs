#![cfg(all(feature = "gateway", feature = "stockd", feature = "orderd"))]
//! The proof-of-work challenge (issue 14, item 1) on a real stack with two gateways of
//! one fleet: the activity's `challenge_bits` travels from the admin call through MySQL
//! and `sk:{a}:meta` to both edges; a puzzle issued by one gateway is redeemed once
//! across both (two concurrent redeems of the same solution: exactly one purchase
//! token, over many rounds); the two gateways hold a rotated key set (gw2 signs with a
//! new key and still verifies gw1's); a bot that skips the challenge or sends a bad
//! one gets a clear 4xx and no purchase token, and none of its requests reaches stockd;
//! a sold-out item answers 410 before any challenge work.

use std::time::Duration;

use gateway::fair::challenge::puzzle;
use seckill_proto::pb;
use seckill_tests::gateway::http::Answer;
use seckill_tests::gateway::{metric_value, set, GatewayHandle, Stack};
use seckill_tests::init_tracing;
use seckill_tests::process::wait_until_async;
use serde_json::{json, Value};

/// Bits per sub-puzzle of the test activity (small: the test solves many puzzles).
const BITS: u32 = 6;
/// Rounds of the concurrent double redeem.
const ROUNDS: usize = 24;

fn key(id: &str, secret: &str) -> gateway::toml::Value {
    let mut t = gateway::toml::Table::new();
    t.insert("id".into(), id.into());
    t.insert("secret".into(), secret.into());
    gateway::toml::Value::Table(t)
}

const OLD: (&str, &str) = ("k2026a", "challenge-old-secret-0123456789");
const NEW: (&str, &str) = ("k2026b", "challenge-new-secret-0123456789");

async fn challenge(gw: &GatewayHandle, jwt: &str, a: u64, s: u64) -> Answer {
    gw.post(
        &format!("/api/v1/activities/{a}/items/{s}/challenge"),
        Some(jwt),
        json!({}),
    )
    .await
}

async fn token(gw: &GatewayHandle, jwt: &str, a: u64, s: u64, body: Option<Value>) -> Answer {
    seckill_tests::gateway::http::call(
        reqwest::Method::POST,
        format!("{}/api/v1/activities/{a}/items/{s}/token", gw.base_url()),
        Some(jwt),
        body,
        None,
    )
    .await
}

/// A puzzle from `gw` for `(a, s)`, solved: the redeem body.
async fn solved(gw: &GatewayHandle, jwt: &str, a: u64, s: u64) -> Value {
    let c = challenge(gw, jwt, a, s).await;
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(c.body["required"], true, "{}", c.body);
    let p = c.body["challenge"].as_str().expect("a puzzle").to_string();
    let nonce = puzzle::nonce_of(&p).expect("a nonce");
    assert_eq!(c.body["seed"], hex_of(&nonce));
    let bits = c.body["bits"].as_u64().unwrap() as u32;
    let count = c.body["count"].as_u64().unwrap() as u32;
    json!({"challenge": p, "solutions": puzzle::solve(&nonce, bits, count)})
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_solved_puzzle_buys_one_token_across_two_gateways_and_bots_get_none() {
    init_tracing();
    let s = Stack::start().await;
    let mut admin = s.stockd.admin_client().await;
    let now = seckill_lua::clock::now_ms();
    let created = admin
        .create_activity(pb::CreateActivityRequest {
            title: "challenge sale".into(),
            start_at_ms: now - 1000,
            end_at_ms: now + 3_600_000,
            shard_count: 2,
            per_user_limit: 1,
            items: [("busy", 1000), ("other", 1000), ("scarce", 1)]
                .iter()
                .map(|(t, n)| pb::ItemSpec {
                    title: (*t).into(),
                    price_cents: 200,
                    sale_price_cents: 100,
                    stock: *n,
                })
                .collect(),
            challenge_bits: BITS,
            redis_cluster: String::new(),
        })
        .await
        .expect("create")
        .into_inner();
    assert_eq!(created.challenge_bits, BITS);
    let act = admin
        .publish_activity(pb::PublishActivityRequest {
            activity_id: created.id,
            publish_at_ms: 0,
        })
        .await
        .expect("publish")
        .into_inner()
        .activity
        .expect("activity");
    assert_eq!(act.challenge_bits, BITS, "read back from MySQL");
    let (a, item, other, scarce) = (act.id, act.items[0].id, act.items[1].id, act.items[2].id);

    // gw1 knows the old key only; gw2 was rotated: it signs with the new one and still
    // verifies the old one.
    let gw1 = s
        .gateway(|c| set(c, "challenge", "keys", vec![key(OLD.0, OLD.1)]))
        .await;
    let gw2 = s
        .gateway(|c| {
            set(
                c,
                "challenge",
                "keys",
                vec![key(NEW.0, NEW.1), key(OLD.0, OLD.1)],
            )
        })
        .await;
    gw1.wait_activity(a).await;
    gw2.wait_activity(a).await;
    let alice = gw1.dev_token("alice").await;
    let bob = gw1.dev_token("bob").await;
    let stockd_before = s.reservations_seen_by_stockd();

    // The puzzle as apps see it.
    let c = challenge(&gw1, &alice, a, item).await;
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(
        c.body["bits"], BITS,
        "the activity's difficulty: {}",
        c.body
    );
    assert_eq!(c.body["count"], 32);
    assert_eq!(c.body["algorithm"], "sha256-leading-zero-bits");
    assert_eq!(c.body["expected_hashes"], 32u64 << BITS);
    assert!(c.body["challenge"]
        .as_str()
        .unwrap()
        .starts_with("v1.k2026a."));
    let c2 = challenge(&gw2, &alice, a, item).await;
    assert!(c2.body["challenge"]
        .as_str()
        .unwrap()
        .starts_with("v1.k2026b."));

    // Bots: no challenge, garbage, another user's, another item's, unsolved, a puzzle
    // signed by the rotated-in key at the gateway that does not know it yet.
    let bad = |r: &Answer, status: u16, code: &str, what: &str| {
        assert_eq!((r.status, r.code()), (status, code), "{what}: {}", r.body);
        assert!(r.body.get("purchase_token").is_none(), "{what}");
    };
    bad(
        &token(&gw1, &alice, a, item, None).await,
        403,
        "challenge_required",
        "no body",
    );
    bad(
        &token(&gw2, &alice, a, item, Some(json!({}))).await,
        403,
        "challenge_required",
        "an empty body",
    );
    bad(
        &token(
            &gw1,
            &alice,
            a,
            item,
            Some(json!({"challenge": "v1.x", "solutions": []})),
        )
        .await,
        400,
        "challenge_malformed",
        "garbage",
    );
    let bobs = solved(&gw1, &bob, a, item).await;
    bad(
        &token(&gw2, &alice, a, item, Some(bobs.clone())).await,
        403,
        "challenge_wrong_user",
        "bob's puzzle sent by alice",
    );
    let alices = solved(&gw1, &alice, a, item).await;
    bad(
        &token(&gw1, &alice, a, other, Some(alices.clone())).await,
        403,
        "challenge_wrong_item",
        "a puzzle for another item",
    );
    let mut unsolved = alices.clone();
    let p = unsolved["challenge"].as_str().unwrap().to_string();
    let nonce = puzzle::nonce_of(&p).unwrap();
    let wrong = (0u64..)
        .find(|c| puzzle::leading_zero_bits(&puzzle::sub_hash(&nonce, 3, *c)) < BITS)
        .unwrap();
    unsolved["solutions"][3] = json!(wrong);
    let r = token(&gw2, &alice, a, item, Some(unsolved)).await;
    bad(&r, 403, "challenge_unsolved", "sub-puzzle 3 wrong");
    assert_eq!(r.body["error"]["index"], 3);
    let mut easier = alices.clone();
    easier["challenge"] = json!(p.replacen(&format!(".{BITS}.32."), ".1.32.", 1));
    bad(
        &token(&gw1, &alice, a, item, Some(easier)).await,
        403,
        "challenge_tampered",
        "a lowered difficulty",
    );
    let from_gw2 = solved(&gw2, &alice, a, item).await;
    bad(
        &token(&gw1, &alice, a, item, Some(from_gw2)).await,
        403,
        "challenge_tampered",
        "a key gw1 does not hold",
    );
    // A reserve without a purchase token never reaches stockd.
    let r = gw1.reserve(&alice, a, item, "no-token").await;
    assert_eq!(r.status, 403, "{}", r.body);

    // Rotation: gw1's puzzle (old key) redeems at gw2, once.
    let r = token(&gw2, &alice, a, item, Some(alices.clone())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body["purchase_token"].is_string());
    bad(
        &token(&gw1, &alice, a, item, Some(alices)).await,
        409,
        "challenge_replayed",
        "the same solution again",
    );

    // Two concurrent redeems of one solution, one at each gateway: exactly one token.
    let mut tokens = Vec::new();
    for round in 0..ROUNDS {
        let user = format!("racer-{round}");
        let jwt = gw1.dev_token(&user).await;
        let body = solved(&gw1, &jwt, a, item).await;
        let (r1, r2) = tokio::join!(
            token(&gw1, &jwt, a, item, Some(body.clone())),
            token(&gw2, &jwt, a, item, Some(body.clone())),
        );
        let mut statuses = [
            (r1.status, r1.code().to_string()),
            (r2.status, r2.code().to_string()),
        ];
        statuses.sort();
        assert_eq!(
            statuses,
            [
                (200, String::new()),
                (409, "challenge_replayed".to_string())
            ],
            "round {round}: {} / {}",
            r1.body,
            r2.body
        );
        let t = [r1, r2]
            .into_iter()
            .find_map(|r| r.body["purchase_token"].as_str().map(str::to_string))
            .unwrap();
        tokens.push((jwt, t));
    }
    assert_eq!(
        s.reservations_seen_by_stockd(),
        stockd_before,
        "no challenge or bot request reached stockd"
    );
    // The challenge's own metrics, summed over the two gateways: every redeem above
    // counted once under its result, and a solve time for each that passed the checks.
    let mut sum = std::collections::HashMap::<&str, f64>::new();
    for gw in [&gw1, &gw2] {
        let text = gw.metrics().await;
        for result in [
            "ok",
            "replayed",
            "required",
            "malformed",
            "wrong_user",
            "wrong_item",
            "unsolved",
            "tampered",
        ] {
            let labels = format!(r#"result="{result}""#);
            *sum.entry(result).or_default() +=
                metric_value(&text, "gateway_challenge_redeems_total", &labels).unwrap_or(0.0);
        }
        *sum.entry("solved").or_default() +=
            metric_value(&text, "gateway_challenge_solve_seconds_count", "").unwrap_or(0.0);
        // Issued at any difficulty (failures from 127.0.0.1 may have raised it).
        *sum.entry("issued").or_default() += text
            .lines()
            .filter(|l| l.starts_with("gateway_challenge_issued_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    let rounds = ROUNDS as f64;
    assert_eq!(sum["ok"], rounds + 1.0, "{sum:?}");
    assert_eq!(sum["replayed"], rounds + 1.0, "{sum:?}");
    for (result, n) in [
        ("required", 2.0),
        ("malformed", 1.0),
        ("wrong_user", 1.0),
        ("wrong_item", 1.0),
        ("unsolved", 1.0),
        ("tampered", 2.0),
    ] {
        assert_eq!(sum[result], n, "{result}: {sum:?}");
    }
    assert_eq!(sum["solved"], sum["ok"] + sum["replayed"], "{sum:?}");
    // Two puzzles asked by hand, and one per `solved` call: bob, alice twice, racers.
    assert_eq!(sum["issued"], 2.0 + 3.0 + rounds, "{sum:?}");
    // The tokens bought are good ones, for that user and item.
    let (jwt, t) = &tokens[0];
    let r = gw2.reserve(jwt, a, item, t).await;
    assert_eq!(r.status, 202, "{}", r.body);
    let r = gw2.reserve(jwt, a, other, t).await;
    assert_eq!(r.status, 403, "a token of another item: {}", r.body);

    // A sold-out item answers 410 before any challenge work.
    let carol = gw1.dev_token("carol").await;
    let body = solved(&gw1, &carol, a, scarce).await;
    let r = token(&gw1, &carol, a, scarce, Some(body)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let pt = r.body["purchase_token"].as_str().unwrap().to_string();
    assert_eq!(gw1.reserve(&carol, a, scarce, &pt).await.status, 202);
    for gw in [&gw1, &gw2] {
        let path = format!("/api/v1/activities/{a}");
        wait_until_async("the sold-out flag", Duration::from_secs(10), || {
            let path = &path;
            async move { gw.get(path, None).await.body["activity"]["items"][2]["sold_out"] == true }
        })
        .await;
        let r = challenge(gw, &bob, a, scarce).await;
        assert_eq!((r.status, r.code()), (410, "sold_out"), "{}", r.body);
        let r = token(gw, &bob, a, scarce, None).await;
        assert_eq!((r.status, r.code()), (410, "sold_out"), "{}", r.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activity_without_a_challenge_keeps_the_old_flow_and_the_config_can_force_one() {
    init_tracing();
    let s = Stack::start().await;
    let act = s.open_activity(&[(10, 100)]).await;
    assert_eq!(act.challenge_bits, 0);
    let (a, item) = (act.id, act.items[0].id);
    let plain = s.gateway(|_| {}).await;
    let forced = s
        .gateway(|c| {
            set(c, "challenge", "bits_override", 4);
            set(c, "challenge", "keys", vec![key(OLD.0, OLD.1)]);
        })
        .await;
    plain.wait_activity(a).await;
    forced.wait_activity(a).await;
    let alice = plain.dev_token("alice").await;
    let r = challenge(&plain, &alice, a, item).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, json!({"required": false}));
    assert!(!plain.purchase_token(&alice, a, item).await.is_empty());
    let r = token(&forced, &alice, a, item, Some(json!({}))).await;
    assert_eq!(
        (r.status, r.code()),
        (403, "challenge_required"),
        "{}",
        r.body
    );
    let body = solved(&forced, &alice, a, item).await;
    let r = token(&forced, &alice, a, item, Some(body)).await;
    assert_eq!(r.status, 200, "{}", r.body);
}
