#![cfg(all(feature = "gateway", feature = "stockd", feature = "orderd"))]
//! The edge's wire protocols over real sockets, in front of real stockd, orderd, Redis
//! Cluster and MariaDB (the gateway is the built binary: `cargo build -p gateway --bins`):
//! - h2c: with `server.h2c = true`, HTTP/2 with prior knowledge and HTTP/1.1 on the same
//!   plain listener give the same JSON answers; with `h2c = false` HTTP/2 is not spoken.
//! - TLS: `server.tls_listen` with a certificate generated here (rcgen) serves HTTP/1.1
//!   and, by ALPN, HTTP/2 to a client that trusts that certificate, with the same JSON
//!   answers as plain HTTP; a client that does not trust it gets no answer.

use reqwest::{Client, Method, Version};
use seckill_proto::pb;
use seckill_tests::gateway::{set, spawn_gateway, tls, GatewayHandle};
use seckill_tests::orderd::{spawn_orderd, OrderdHandle};
use seckill_tests::stockd::{create_published_activity, spawn_stockd, StockdHandle};
use seckill_tests::{init_tracing, RedisCluster, TestDb};
use serde_json::{json, Value};
use std::time::Duration;

struct Stack {
    redis: RedisCluster,
    _db: TestDb,
    stockd: StockdHandle,
    orderd: OrderdHandle,
}

async fn stack() -> Stack {
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let stockd = spawn_stockd(&redis, &db).await;
    let orderd = spawn_orderd(&redis, &db).await;
    Stack {
        redis,
        _db: db,
        stockd,
        orderd,
    }
}

impl Stack {
    async fn gateway(&self, tweak: impl FnOnce(&mut gateway::toml::Table)) -> GatewayHandle {
        spawn_gateway(
            &self.redis,
            &self.stockd.addr,
            &self.orderd.addr_str(),
            tweak,
        )
        .await
    }

    /// An open activity (started a second ago, an hour long) with one item of `units`.
    async fn open_activity(&self, units: u32) -> pb::Activity {
        create_published_activity(
            &self.stockd,
            &[(units, 100)],
            2,
            Duration::ZERO,
            Duration::from_secs(3600),
        )
        .await
    }
}

/// One client speaking one protocol to one base URL.
struct Edge {
    name: &'static str,
    client: Client,
    base: String,
    version: Version,
}

impl Edge {
    fn new(name: &'static str, client: Client, base: String, version: Version) -> Self {
        Self {
            name,
            client,
            base,
            version,
        }
    }

    /// Sends one request and checks it was answered in this edge's HTTP version.
    async fn call(
        &self,
        method: Method,
        path: &str,
        jwt: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = jwt {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{}: {path}: {e:?}", self.name));
        assert_eq!(r.version(), self.version, "{}: {path}", self.name);
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let text = r.text().await.unwrap_or_default();
        Answer {
            status,
            content_type,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.call(Method::GET, path, None, None).await
    }

    async fn post(&self, path: &str, jwt: Option<&str>, body: Value) -> Answer {
        self.call(Method::POST, path, jwt, Some(body)).await
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    body: Value,
}

impl Answer {
    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// The activity list without the clock (`server_time_ms`), which differs per call.
fn listing(a: &Answer) -> Value {
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.content_type.starts_with("application/json"), "{a:?}");
    let mut body = a.body.clone();
    body.as_object_mut()
        .expect("a JSON object")
        .remove("server_time_ms");
    body
}

/// The read-only answers every edge must give alike: the activity list, one activity,
/// and two refused reserves (no JWT: 401; a forged purchase token: 403). `jwt` is a
/// valid token of a user who does not buy.
async fn read_and_refusals(e: &Edge, act: &pb::Activity, jwt: &str) -> Vec<Value> {
    let (a, item) = (act.id, act.items[0].id);
    let list = listing(&e.get("/api/v1/activities").await);
    assert!(
        list["activities"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["id"] == a),
        "{}: {list}",
        e.name
    );
    let one = listing(&e.get(&format!("/api/v1/activities/{a}")).await);
    assert_eq!(one["activity"]["state"], "open", "{}", e.name);

    let reserve = format!("/api/v1/activities/{a}/items/{item}/reserve");
    let anonymous = e
        .post(&reserve, None, json!({"purchase_token": "x.y"}))
        .await;
    assert_eq!(
        (anonymous.status, anonymous.code()),
        (401, "unauthenticated"),
        "{}: {:?}",
        e.name,
        anonymous
    );
    assert!(anonymous.content_type.starts_with("application/json"));
    let forged = e
        .post(
            &reserve,
            Some(jwt),
            json!({"purchase_token": "9999999999999.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}),
        )
        .await;
    assert_eq!(
        (forged.status, forged.code()),
        (403, "bad_purchase_token"),
        "{}: {:?}",
        e.name,
        forged
    );
    vec![list, one, anonymous.body, forged.body]
}

/// A whole purchase through this edge: dev JWT, purchase token, reserve (202 QUEUED),
/// then the same reserve again (idempotent: the same order).
async fn buy(e: &Edge, act: &pb::Activity, user: &str) {
    let (a, item) = (act.id, act.items[0].id);
    let dev = e
        .post("/api/v1/dev/token", None, json!({"user_id": user}))
        .await;
    assert_eq!(dev.status, 200, "{}: {}", e.name, dev.body);
    let jwt = dev.body["token"].as_str().expect("token").to_string();
    let t = e
        .post(
            &format!("/api/v1/activities/{a}/items/{item}/token"),
            Some(&jwt),
            json!({}),
        )
        .await;
    assert_eq!(t.status, 200, "{}: {}", e.name, t.body);
    let token = t.body["purchase_token"].as_str().expect("purchase_token");
    let reserve = format!("/api/v1/activities/{a}/items/{item}/reserve");
    let body = json!({"purchase_token": token, "request_id": format!("{user}-1")});
    let r = e.post(&reserve, Some(&jwt), body.clone()).await;
    assert_eq!(r.status, 202, "{}: {}", e.name, r.body);
    assert_eq!(r.body["state"], "QUEUED", "{}", e.name);
    let order = r.body["order_id"].as_str().expect("order_id").to_string();
    let again = e.post(&reserve, Some(&jwt), body).await;
    assert_eq!(again.status, 202, "{}: {}", e.name, again.body);
    assert_eq!(again.body["order_id"], order.as_str(), "{}", e.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_and_http1_share_the_plain_listener_with_the_same_answers() {
    let s = stack().await;
    let act = s.open_activity(10).await;
    let gw = s.gateway(|c| set(c, "server", "h2c", true)).await;
    gw.wait_activity(act.id).await;
    let jwt = gw.jwt("watcher", 600, unix_ms());

    let h1 = Edge::new(
        "HTTP/1.1",
        Client::builder().http1_only().build().unwrap(),
        gw.base_url(),
        Version::HTTP_11,
    );
    let h2 = Edge::new(
        "h2c",
        Client::builder().http2_prior_knowledge().build().unwrap(),
        gw.base_url(),
        Version::HTTP_2,
    );
    let over_h1 = read_and_refusals(&h1, &act, &jwt).await;
    let over_h2 = read_and_refusals(&h2, &act, &jwt).await;
    assert_eq!(over_h1, over_h2);
    buy(&h2, &act, "h2c-buyer").await;
    buy(&h1, &act, "h1-buyer").await;
    // Several requests in flight on the one HTTP/2 connection at once.
    let path = format!("/api/v1/activities/{}", act.id);
    for a in futures::future::join_all((0..20).map(|_| h2.get(&path))).await {
        assert_eq!(a.status, 200, "{}", a.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_h2c_the_plain_listener_speaks_only_http1() {
    let s = stack().await;
    let act = s.open_activity(1).await;
    let gw = s.gateway(|c| set(c, "server", "h2c", false)).await;
    gw.wait_activity(act.id).await;
    let h1 = Edge::new(
        "HTTP/1.1",
        Client::builder().http1_only().build().unwrap(),
        gw.base_url(),
        Version::HTTP_11,
    );
    assert_eq!(h1.get("/api/v1/activities").await.status, 200);
    let h2 = Client::builder().http2_prior_knowledge().build().unwrap();
    let r = h2
        .get(format!("{}/api/v1/activities", gw.base_url()))
        .send()
        .await;
    assert!(r.is_err(), "HTTP/2 answered without h2c: {r:?}");
}

/// A self-signed certificate for 127.0.0.1 and localhost: (cert PEM path, key PEM path,
/// cert PEM).
fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("rcgen");
    let pem = ck.cert.pem();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, &pem).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (cert, key, pem)
}

/// A client that trusts only `cert_pem` (no built-in roots).
fn trusting(cert_pem: &str) -> reqwest::ClientBuilder {
    Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(cert_pem.as_bytes()).unwrap())
        .https_only(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_http1_and_alpn_h2_with_the_same_answers_as_plain_http() {
    let s = stack().await;
    let act = s.open_activity(10).await;
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(certs.path());
    let gw = s.gateway(|c| tls(c, &cert, &key)).await;
    gw.wait_activity(act.id).await;
    assert_ne!(gw.tls_port, Some(gw.port));
    let jwt = gw.jwt("watcher", 600, unix_ms());

    let plain = Edge::new(
        "plain HTTP/1.1",
        Client::builder().http1_only().build().unwrap(),
        gw.base_url(),
        Version::HTTP_11,
    );
    let tls_h1 = Edge::new(
        "TLS HTTP/1.1",
        trusting(&pem).http1_only().build().unwrap(),
        gw.tls_base_url(),
        Version::HTTP_11,
    );
    // reqwest offers h2 and http/1.1 by ALPN; the gateway picks h2.
    let tls_h2 = Edge::new(
        "TLS ALPN h2",
        trusting(&pem).build().unwrap(),
        gw.tls_base_url(),
        Version::HTTP_2,
    );
    let over_plain = read_and_refusals(&plain, &act, &jwt).await;
    assert_eq!(over_plain, read_and_refusals(&tls_h1, &act, &jwt).await);
    assert_eq!(over_plain, read_and_refusals(&tls_h2, &act, &jwt).await);
    buy(&tls_h1, &act, "tls-h1-buyer").await;
    buy(&tls_h2, &act, "tls-h2-buyer").await;

    // The certificate names localhost too (rustls checks the name the client asked for).
    let by_name = trusting(&pem)
        .build()
        .unwrap()
        .get(format!(
            "https://localhost:{}/api/v1/activities",
            gw.tls_port.unwrap()
        ))
        .send()
        .await;
    // localhost may resolve to ::1 first; the gateway listens on 127.0.0.1 only, and
    // reqwest tries every address.
    assert_eq!(by_name.expect("https://localhost").status(), 200);
    let untrusting = Client::builder()
        .build()
        .unwrap()
        .get(format!("{}/api/v1/activities", gw.tls_base_url()))
        .send()
        .await;
    // A client with only the web's roots refuses the handshake.
    let err = untrusting.expect_err("a certificate nobody vouches for was accepted");
    assert!(format!("{err:?}").contains("UnknownIssuer"), "{err:?}");
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
