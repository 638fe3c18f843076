#![cfg(feature = "stockd")]
//! stockd's surface: health, reflection, the service token, the admin API and its
//! input checks.

use seckill_tests::Deps;
use std::time::Duration;

use seckill_proto::pb;
use seckill_tests::stockd::{create_published_activity, spawn_stockd};
use seckill_tests::{grpc, init_tracing, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn stockd_serves_health_reflection_and_refuses_calls_without_the_token() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&redis, &db), |_| {}).await;
    use tonic_health::pb::health_check_response::ServingStatus;
    assert_eq!(grpc::health(&h.addr, "").await, ServingStatus::Serving);
    for svc in ["seckill.v1.StockService", "seckill.v1.AdminService"] {
        assert_eq!(grpc::health(&h.addr, svc).await, ServingStatus::Serving);
        assert!(grpc::reflection_services_v1(&h.addr)
            .await
            .iter()
            .any(|s| s == svc));
        assert!(grpc::reflection_services_v1alpha(&h.addr)
            .await
            .iter()
            .any(|s| s == svc));
    }
    let mut bare = pb::stock_service_client::StockServiceClient::new(grpc::channel(&h.addr).await);
    let err = bare
        .get_stock(pb::GetStockRequest {
            activity_id: 1,
            item_id: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    // The refusal is marked, over the wire, as the service token's (the gateway tells
    // it from a daemon's own UNAUTHENTICATED by this mark, not by the message).
    assert!(
        seckill_proto::auth::is_service_token_refusal(&err),
        "{:?}",
        err.metadata()
    );
}

#[tokio::test]
async fn an_activity_is_created_published_and_sells_one_unit() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let h = spawn_stockd(&Deps::new(&redis, &db), |_| {}).await;
    let a = create_published_activity(&h, &[(10, 990)], 4, Duration::ZERO, HOUR).await;
    assert_eq!(a.status, pb::ActivityStatus::Published as i32);
    let item = a.items[0].id;
    let mut stock = h.stock_client().await;
    let r = stock
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
    let st = stock
        .get_stock(pb::GetStockRequest {
            activity_id: a.id,
            item_id: item,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.remaining, 9);
    assert_eq!(st.reserved, 1);
    assert_eq!(st.shard_remaining.len(), 4);
    assert!(st.available);
}
