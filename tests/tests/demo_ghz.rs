#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]
//! The ghz configs in `deploy/ghz/` are valid JSON, name calls that the running servers'
//! reflection (v1, as ghz uses it) describes, send only fields the request message has,
//! carry the local service token, and their rendered data is accepted by the servers.

use seckill_tests::Deps;
use std::collections::BTreeMap;
use std::path::PathBuf;

use prost::Message as _;
use prost_types::FileDescriptorProto;
use seckill_proto::pb;
use seckill_tests::orderd::spawn_orderd;
use seckill_tests::stockd::spawn_stockd;
use seckill_tests::{grpc, init_tracing, RedisCluster, TestDb};
use serde_json::Value;
use tokio_stream::StreamExt as _;

fn config(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/ghz")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

/// `package.Service.Method` → (`package.Service`, `Method`).
fn split_call(call: &str) -> (String, String) {
    let call = call.replace('/', ".");
    let (svc, method) = call.rsplit_once('.').expect("call has a method");
    (svc.to_owned(), method.to_owned())
}

/// Every file descriptor reflection v1 returns for `symbol` (with its dependencies).
async fn files_for(addr: &str, symbol: &str) -> Vec<FileDescriptorProto> {
    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ServerReflectionRequest,
    };
    let mut client = ServerReflectionClient::new(grpc::channel(addr).await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(symbol.to_owned())),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::once(req))
        .await
        .expect("reflection v1")
        .into_inner();
    let mut out = Vec::new();
    while let Some(msg) = stream.next().await {
        match msg.expect("reflection answer").message_response {
            Some(MessageResponse::FileDescriptorResponse(f)) => {
                for bytes in f.file_descriptor_proto {
                    out.push(FileDescriptorProto::decode(bytes.as_slice()).expect("descriptor"));
                }
            }
            other => panic!("reflection has no {symbol}: {other:?}"),
        }
    }
    out
}

/// Checks `call` against the server at `addr` and returns the input message's field
/// names (JSON names and proto names).
async fn check_call(addr: &str, call: &str) -> Vec<String> {
    let (svc, method) = split_call(call);
    assert!(
        grpc::reflection_services_v1(addr).await.contains(&svc),
        "{svc} is not listed by reflection v1"
    );
    assert!(
        grpc::reflection_services_v1alpha(addr).await.contains(&svc),
        "{svc} is not listed by reflection v1alpha"
    );
    let files = files_for(addr, &svc).await;
    let (pkg, svc_name) = svc.rsplit_once('.').expect("package");
    let m = files
        .iter()
        .filter(|f| f.package() == pkg)
        .flat_map(|f| f.service.iter())
        .filter(|s| s.name() == svc_name)
        .flat_map(|s| s.method.iter())
        .find(|m| m.name() == method)
        .unwrap_or_else(|| panic!("{svc} has no method {method}"));
    let input = m.input_type().trim_start_matches('.');
    let (ipkg, iname) = input.rsplit_once('.').expect("input package");
    let msg = files
        .iter()
        .filter(|f| f.package() == ipkg)
        .flat_map(|f| f.message_type.iter())
        .find(|d| d.name() == iname)
        .unwrap_or_else(|| panic!("no descriptor for {input}"));
    msg.field
        .iter()
        .flat_map(|f| [f.name().to_owned(), f.json_name().to_owned()])
        .collect()
}

/// ghz's templates rendered for request number `n`, worker `w`.
fn render(data: &Value, n: u64) -> BTreeMap<String, Value> {
    data.as_object()
        .expect("data is an object")
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => Value::String(
                    s.replace("{{.RequestNumber}}", &n.to_string())
                        .replace("{{.WorkerID}}", "g0")
                        .replace("{{.UUID}}", &format!("00000000-0000-4000-8000-{n:012}")),
                ),
                other => other.clone(),
            };
            (k.clone(), v)
        })
        .collect()
}

fn common_shape(c: &Value) {
    for k in ["call", "host", "data", "metadata"] {
        assert!(c.get(k).is_some(), "ghz config misses `{k}`");
    }
    assert_eq!(c["insecure"], true, "the local servers speak plaintext");
    assert!(
        c.get("proto").is_none() && c.get("protoset").is_none(),
        "reflection, not proto files"
    );
    assert_eq!(
        c["metadata"]["authorization"], "Bearer local-dev-service-token",
        "the local stack's service token"
    );
    let local = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/stockd.toml"),
    )
    .expect("deploy/local/stockd.toml");
    assert!(
        local.contains("local-dev-service-token"),
        "deploy/local/stockd.toml uses another service token than the ghz configs"
    );
}

#[tokio::test]
async fn the_ghz_configs_are_valid_json_and_their_calls_exist_in_the_servers_reflection() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = spawn_stockd(&Deps::new(&redis, &db), |_| {}).await;
    let orderd = spawn_orderd(&Deps::new(&redis, &db), |_| {}).await;

    let reserve = config("reserve.json");
    common_shape(&reserve);
    assert_eq!(reserve["call"], "seckill.v1.StockService.Reserve");
    assert!(reserve["host"].as_str().unwrap().ends_with(":50051"));
    let fields = check_call(&stockd.addr, reserve["call"].as_str().unwrap()).await;
    for key in reserve["data"].as_object().unwrap().keys() {
        assert!(fields.contains(key), "Reserve has no field `{key}`");
    }
    let data = reserve["data"].to_string();
    assert!(
        data.contains("{{.RequestNumber}}"),
        "user ids are templated per request"
    );
    assert!(
        data.contains("{{.UUID}}"),
        "request ids are templated per request"
    );

    let get = config("get_order.json");
    common_shape(&get);
    assert_eq!(get["call"], "seckill.v1.OrderService.GetOrder");
    assert!(get["host"].as_str().unwrap().ends_with(":50052"));
    let fields = check_call(&orderd.addr_str(), get["call"].as_str().unwrap()).await;
    for key in get["data"].as_object().unwrap().keys() {
        assert!(fields.contains(key), "GetOrder has no field `{key}`");
    }

    // The rendered data of two requests: accepted (no INVALID_ARGUMENT), distinct users.
    let mut stock = stockd.stock_client().await;
    let mut users = Vec::new();
    for n in [1, 2] {
        let d = render(&reserve["data"], n);
        let req = pb::ReserveRequest {
            activity_id: d["activity_id"].as_u64().unwrap(),
            item_id: d["item_id"].as_u64().unwrap(),
            user_id: d["user_id"].as_str().unwrap().to_owned(),
            request_id: d["request_id"].as_str().unwrap().to_owned(),
            ..Default::default()
        };
        users.push(req.user_id.clone());
        let r = stock
            .reserve(req)
            .await
            .expect("Reserve accepts the ghz data");
        // No activity 1 in this fresh database: a business outcome, not an error.
        assert_eq!(
            r.into_inner().outcome(),
            pb::ReserveOutcome::NotFound,
            "ghz data against an empty stack"
        );
    }
    assert_ne!(users[0], users[1]);

    let mut orders = orderd.order_client().await;
    let d = render(&get["data"], 7);
    let err = orders
        .get_order(pb::GetOrderRequest {
            order_id: d["order_id"].as_str().unwrap().to_owned(),
            user_id: d["user_id"].as_str().unwrap().to_owned(),
        })
        .await
        .expect_err("no such order in a fresh database");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
}

/// Each daemon advertises exactly what it serves: grpcurl and ghz users who list the
/// services of :50051 must not be sent to an `OrderService` that answers UNIMPLEMENTED
/// there (and the other way round on :50052).
#[tokio::test]
async fn reflection_lists_exactly_the_services_each_daemon_serves() {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = spawn_stockd(&Deps::new(&redis, &db), |_| {}).await;
    let orderd = spawn_orderd(&Deps::new(&redis, &db), |_| {}).await;

    let common = [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];
    let expect = |own: &[&str]| {
        let mut v: Vec<String> = own.iter().chain(&common).map(|s| s.to_string()).collect();
        v.sort();
        v
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let stock_set = expect(&["seckill.v1.StockService", "seckill.v1.AdminService"]);
    let order_set = expect(&["seckill.v1.OrderService"]);
    let orderd_addr = orderd.addr_str();
    for (daemon, addr, want) in [
        ("stockd", stockd.addr.as_str(), &stock_set),
        ("orderd", orderd_addr.as_str(), &order_set),
    ] {
        let v1 = sorted(grpc::reflection_services_v1(addr).await);
        assert_eq!(&v1, want, "{daemon}: reflection v1 ListServices");
        let v1alpha = sorted(grpc::reflection_services_v1alpha(addr).await);
        assert_eq!(&v1alpha, want, "{daemon}: reflection v1alpha ListServices");
        // Every listed service resolves: grpcurl `describe` works for each of them.
        for svc in want {
            assert!(
                !files_for(addr, svc).await.is_empty(),
                "{daemon}: reflection v1 cannot describe {svc}"
            );
        }
    }
}
