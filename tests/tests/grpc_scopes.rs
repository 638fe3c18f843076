#![cfg(all(feature = "stockd", feature = "orderd"))]
//! Internal callers and their scopes, over real gRPC: stockd and orderd configured
//! with a `gateway` caller (reserve, read, pay) and a `seckillctl` caller (admin), no
//! dev shortcut. Each caller can do what its scopes allow and nothing else
//! (PERMISSION_DENIED naming the missing scope); an unknown token is UNAUTHENTICATED.

use std::time::Duration;

use seckill_proto::auth::{is_service_token_refusal, AttachToken, CallerConfig, Scope};
use seckill_proto::pb;
use seckill_proto::pb::admin_service_client::AdminServiceClient;
use seckill_proto::pb::order_service_client::OrderServiceClient;
use seckill_proto::pb::stock_service_client::StockServiceClient;
use seckill_tests::stockd::{create_published_activity_with, spawn_stockd};
use seckill_tests::{grpc, init_tracing, orderd::spawn_orderd, Deps, RedisCluster, TestDb};

const GATEWAY: &str = "gateway-token-0123456789";
const ADMIN: &str = "admin-token-0123456789ab";
const UNKNOWN: &str = "nobody-knows-this-token";
const HOUR: Duration = Duration::from_secs(3600);

fn callers() -> Vec<CallerConfig> {
    vec![
        CallerConfig {
            name: "gateway".into(),
            token: GATEWAY.into(),
            scopes: vec![Scope::Reserve, Scope::Read, Scope::Pay],
        },
        CallerConfig {
            name: "seckillctl".into(),
            token: ADMIN.into(),
            scopes: vec![Scope::Admin],
        },
    ]
}

fn token(t: &str) -> AttachToken {
    AttachToken::new(t).unwrap()
}

fn assert_denied(err: &tonic::Status, scope: &str) {
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains(&format!("\"{scope}\"")),
        "the refusal names the missing scope {scope}: {}",
        err.message()
    );
    assert!(is_service_token_refusal(&err.clone()), "{err:?}");
}

#[tokio::test]
async fn stockd_lets_each_caller_do_what_its_scopes_allow_and_nothing_more() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&redis, &db), |c| {
        c.grpc.service_token = String::new();
        c.grpc.callers = callers();
    })
    .await;
    let ch = grpc::channel(&h.addr).await;

    // The admin token runs the AdminService: create and publish.
    let mut ctl = AdminServiceClient::with_interceptor(ch.clone(), token(ADMIN));
    let a = create_published_activity_with(&mut ctl, &[(5, 100)], 2, Duration::ZERO, HOUR).await;
    let item = a.items[0].id;

    // The gateway's token reserves and reads ...
    let mut gw_stock = StockServiceClient::with_interceptor(ch.clone(), token(GATEWAY));
    let r = gw_stock
        .reserve(pb::ReserveRequest {
            activity_id: a.id,
            item_id: item,
            user_id: "alice".into(),
            request_id: "r1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.outcome(), pb::ReserveOutcome::Reserved, "{r:?}");
    let st = gw_stock
        .get_stock(pb::GetStockRequest {
            activity_id: a.id,
            item_id: item,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.remaining, 4);

    // ... but cannot touch the AdminService, not even to read.
    let mut gw_admin = AdminServiceClient::with_interceptor(ch.clone(), token(GATEWAY));
    let err = gw_admin
        .list_activities(pb::ListActivitiesRequest::default())
        .await
        .unwrap_err();
    assert_denied(&err, "admin");
    let err = gw_admin
        .publish_activity(pb::PublishActivityRequest {
            activity_id: a.id,
            publish_at_ms: 0,
        })
        .await
        .unwrap_err();
    assert_denied(&err, "admin");

    // The admin token is not a buyer: it cannot reserve.
    let mut ctl_stock = StockServiceClient::with_interceptor(ch.clone(), token(ADMIN));
    let err = ctl_stock
        .reserve(pb::ReserveRequest {
            activity_id: a.id,
            item_id: item,
            user_id: "bob".into(),
            request_id: "r2".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_denied(&err, "reserve");

    // An unknown token, and no token, are UNAUTHENTICATED on both services.
    let mut nobody = AdminServiceClient::with_interceptor(ch.clone(), token(UNKNOWN));
    let err = nobody
        .list_activities(pb::ListActivitiesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    assert!(is_service_token_refusal(&err));
    let err = StockServiceClient::new(ch.clone())
        .get_stock(pb::GetStockRequest {
            activity_id: a.id,
            item_id: item,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");

    // Nothing refused took a unit: only alice's reservation is gone from the stock.
    let st = gw_stock
        .get_stock(pb::GetStockRequest {
            activity_id: a.id,
            item_id: item,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((st.remaining, st.reserved), (4, 1));
}

#[tokio::test]
async fn concurrent_callers_on_one_connection_each_get_their_own_verdict() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&redis, &db), |c| {
        c.grpc.service_token = String::new();
        c.grpc.callers = callers();
    })
    .await;
    let ch = grpc::channel(&h.addr).await;
    // 3 × 40 AdminService calls multiplexed on one HTTP/2 connection at once.
    let mut calls = Vec::new();
    for i in 0..120 {
        let t = [ADMIN, GATEWAY, UNKNOWN][i % 3];
        let mut c = AdminServiceClient::with_interceptor(ch.clone(), token(t));
        calls.push(tokio::spawn(async move {
            let r = c
                .list_activities(pb::ListActivitiesRequest::default())
                .await;
            (t, r.map(|_| ()).map_err(|e| e.code()))
        }));
    }
    for call in calls {
        let (t, r) = call.await.unwrap();
        let want = match t {
            ADMIN => Ok(()),
            GATEWAY => Err(tonic::Code::PermissionDenied),
            _ => Err(tonic::Code::Unauthenticated),
        };
        assert_eq!(r, want, "token {t}");
    }
}

#[tokio::test]
async fn orderd_lets_the_gateway_read_and_pay_and_only_the_admin_see_dead_letters() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_orderd(&Deps::new(&redis, &db), |c| {
        c.grpc.service_token = String::new();
        c.grpc.callers = callers();
    })
    .await;
    let ch = grpc::channel(&h.addr_str()).await;

    let mut gw = OrderServiceClient::with_interceptor(ch.clone(), token(GATEWAY));
    // Past the scope check: the order does not exist.
    let err = gw
        .get_order(pb::GetOrderRequest {
            order_id: "r-0-0-0".into(),
            user_id: "alice".into(),
        })
        .await
        .unwrap_err();
    assert!(
        !is_service_token_refusal(&err),
        "read is the gateway's: {err:?}"
    );
    let err = gw
        .list_dead_letters(pb::ListDeadLettersRequest::default())
        .await
        .unwrap_err();
    assert_denied(&err, "admin");

    let mut ctl = OrderServiceClient::with_interceptor(ch.clone(), token(ADMIN));
    let dl = ctl
        .list_dead_letters(pb::ListDeadLettersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(dl.dead_letters.is_empty(), "{dl:?}");
    let err = ctl
        .pay(pb::PayRequest {
            order_id: "r-0-0-0".into(),
            user_id: "alice".into(),
        })
        .await
        .unwrap_err();
    assert_denied(&err, "pay");

    let mut nobody = OrderServiceClient::with_interceptor(ch, token(UNKNOWN));
    let err = nobody
        .list_dead_letters(pb::ListDeadLettersRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
}
