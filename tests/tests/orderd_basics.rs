#![cfg(feature = "orderd")]
//! orderd starts like every daemon: health, reflection, the service token, and its
//! shipped config validates with `-t`.

use seckill_proto::pb::order_service_client::OrderServiceClient;
use seckill_proto::pb::GetOrderRequest;
use seckill_tests::grpc;
use seckill_tests::orderd::spawn_orderd;
use seckill_tests::process::workspace_bin;
use seckill_tests::Deps;
use seckill_tests::{init_tracing, RedisCluster, TestDb};

fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[tokio::test]
async fn orderd_serves_health_and_reflection_and_refuses_calls_without_the_token() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let orderd = spawn_orderd(&Deps::new(&redis, &db), |_| {}).await;
    let addr = orderd.addr_str();
    use tonic_health::pb::health_check_response::ServingStatus;
    assert_eq!(grpc::health(&addr, "").await, ServingStatus::Serving);
    assert_eq!(
        grpc::health(&addr, "seckill.v1.OrderService").await,
        ServingStatus::Serving
    );
    for services in [
        grpc::reflection_services_v1(&addr).await,
        grpc::reflection_services_v1alpha(&addr).await,
    ] {
        assert!(
            services.iter().any(|s| s == "seckill.v1.OrderService"),
            "{services:?}"
        );
    }
    let mut bare = OrderServiceClient::new(grpc::channel(&addr).await);
    let err = bare
        .get_order(GetOrderRequest {
            order_id: "1-1-0-a-1".into(),
            user_id: "u".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    // With the token, a well-formed unknown id is NOT_FOUND and garbage is INVALID_ARGUMENT.
    let mut client = orderd.order_client().await;
    let err = client
        .get_order(GetOrderRequest {
            order_id: "1-1-0-a-1".into(),
            user_id: "u".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = client
        .get_order(GetOrderRequest {
            order_id: "not an id".into(),
            user_id: "u".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("order_id:"), "{}", err.message());
    orderd.stop().await.unwrap();
}

#[test]
fn the_shipped_config_validates_and_a_bad_one_fails_naming_the_field() {
    let root = workspace_root();
    let out = std::process::Command::new(workspace_bin("orderd"))
        .current_dir(&root)
        .args(["-t", "-c", "deploy/local/orderd.toml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let text = std::fs::read_to_string(root.join("deploy/local/orderd.toml"))
        .unwrap()
        .replace("batch_size = 500", "batch_size = 0");
    std::fs::write(&bad, text).unwrap();
    let out = std::process::Command::new(workspace_bin("orderd"))
        .arg("-t")
        .arg("-c")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("consumer.batch_size"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let text = std::fs::read_to_string(root.join("deploy/local/orderd.toml"))
        .unwrap()
        .replace("clean_sweep_ms = 50", "clean_sweep_ms = 0");
    std::fs::write(&bad, text).unwrap();
    let out = std::process::Command::new(workspace_bin("orderd"))
        .args(["-t", "-c"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("consumer.clean_sweep_ms"), "{err}");
    // An unknown key names itself.
    std::fs::write(&bad, "[grpc]\nservice_token = \"t\"\nlisten_on = \"x\"\n").unwrap();
    let out = std::process::Command::new(workspace_bin("orderd"))
        .arg("-t")
        .arg("-c")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("listen_on"));
}
