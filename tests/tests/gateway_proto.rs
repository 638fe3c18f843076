#![cfg(all(feature = "gateway", feature = "stockd", feature = "orderd"))]
//! The edge's wire protocols over real sockets, in front of real stockd, orderd, Redis
//! Cluster and MariaDB (the gateway is the built binary: `cargo build -p gateway --bins`):
//! - h2c: with `server.h2c = true`, HTTP/2 with prior knowledge and HTTP/1.1 on the same
//!   plain listener give the same JSON answers; with `h2c = false` HTTP/2 is not spoken.
//! - TLS: `server.tls_listen` with a certificate generated here (rcgen) serves HTTP/1.1
//!   and, by ALPN, HTTP/2 to a client that trusts that certificate, with the same JSON
//!   answers as plain HTTP; a client that does not trust it gets no answer.
//!
//! (Over 400 lines: an integration suite: each test sets up real processes and states its
//! invariants inline, so the cases read top to bottom.)

use reqwest::{Client, Method, Version};
use seckill_proto::pb;
use seckill_tests::gateway::{set, tls, Stack};
use serde_json::{json, Value};
use std::time::Duration;

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
    // Each request has its own trace id; the rest of an answer is the same everywhere.
    let untraced = |mut v: Value| {
        assert!(v["trace_id"].is_string(), "{}: {v}", e.name);
        v.as_object_mut().unwrap().remove("trace_id");
        v
    };
    vec![list, one, untraced(anonymous.body), untraced(forged.body)]
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
    let s = Stack::start().await;
    let act = s.open_activity(&[(10, 100)]).await;
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
    let s = Stack::start().await;
    let act = s.open_activity(&[(1, 100)]).await;
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
    let s = Stack::start().await;
    let act = s.open_activity(&[(10, 100)]).await;
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

/// A hand-driven HTTP/2 connection (prior knowledge), to control which frames are sent
/// and when: enough framing and HPACK (literal fields, static-table names) for GETs and
/// POSTs, nothing more.
struct RawH2 {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

#[derive(Debug, PartialEq)]
enum Next {
    Frame {
        kind: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    },
    Closed,
    Silent,
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

impl RawH2 {
    /// Connects and sends the preface and an empty SETTINGS frame.
    async fn connect(port: u16) -> Self {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let mut h = Self {
            stream,
            buf: Vec::new(),
        };
        h.send_bytes(PREFACE).await;
        h.frame(SETTINGS, 0, 0, &[]).await;
        h
    }

    async fn send_bytes(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await.expect("write");
    }

    async fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = payload.len() as u32;
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend_from_slice(payload);
        self.send_bytes(&f).await;
    }

    /// The next frame, or the connection closing, or nothing within `within`.
    async fn next(&mut self, within: Duration) -> Next {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.buf.len() >= 9 {
                let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                if self.buf.len() >= 9 + len {
                    let f: Vec<u8> = self.buf.drain(..9 + len).collect();
                    return Next::Frame {
                        kind: f[3],
                        flags: f[4],
                        stream: u32::from_be_bytes([f[5], f[6], f[7], f[8]]) & 0x7fff_ffff,
                        payload: f[9..].to_vec(),
                    };
                }
            }
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Err(_) => return Next::Silent,
                Ok(Ok(0)) | Ok(Err(_)) => return Next::Closed,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads frames until one of `kind` on `stream` (answering nothing); panics on a close
    /// or on silence.
    async fn until(&mut self, kind: u8, stream: u32) -> (u8, Vec<u8>) {
        loop {
            match self.next(Duration::from_secs(5)).await {
                Next::Frame {
                    kind: k,
                    flags,
                    stream: s,
                    payload,
                } if k == kind && s == stream => return (flags, payload),
                Next::Frame { .. } => continue,
                other => panic!("waiting for frame {kind} on stream {stream}: {other:?}"),
            }
        }
    }

    /// HEADERS for `method path` on `stream` (END_HEADERS; END_STREAM when no body
    /// follows), with `extra` header fields as (static-table name index, value).
    async fn request(&mut self, stream: u32, method: &str, path: &str, extra: &[(u8, &str)]) {
        let mut block = vec![if method == "GET" { 0x82 } else { 0x83 }, 0x86];
        block.extend(literal(4, path));
        block.extend(literal(1, "gw"));
        for (index, value) in extra {
            block.extend(literal(*index, value));
        }
        let flags = END_HEADERS | if method == "GET" { END_STREAM } else { 0 };
        self.frame(HEADERS, flags, stream, &block).await;
    }
}

/// An HPACK literal field without indexing, its name from the static table.
fn literal(name_index: u8, value: &str) -> Vec<u8> {
    let mut out = if name_index < 15 {
        vec![name_index]
    } else {
        vec![0x0f, name_index - 15]
    };
    assert!(value.len() < 127);
    out.push(value.len() as u8);
    out.extend_from_slice(value.as_bytes());
    out
}

/// HPACK static table: `:status 200` is index 8, so the answer's first byte is 0x88.
const STATUS_200: u8 = 0x88;
/// HPACK static table index of `content-type`.
const CONTENT_TYPE: u8 = 31;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_outlives_the_read_deadline_and_its_slow_parts_do_not() {
    let s = Stack::start().await;
    let act = s.open_activity(&[(1, 100)]).await;
    let read_ms: i64 = 400;
    let gw = s
        .gateway(|c| {
            set(c, "server", "h2c", true);
            set(c, "protection", "request_read_ms", read_ms);
        })
        .await;
    gw.wait_activity(act.id).await;
    let idle = Duration::from_millis(read_ms as u64 * 3);

    // One request, then a frame that needs no answer (the SETTINGS ack), then silence
    // well past request_read_ms: the connection stays open and serves the next request.
    let mut h2 = RawH2::connect(gw.port).await;
    h2.request(1, "GET", "/api/v1/activities", &[]).await;
    let (_, block) = h2.until(HEADERS, 1).await;
    assert_eq!(block.first(), Some(&STATUS_200), "{block:?}");
    h2.frame(SETTINGS, ACK, 0, &[]).await;
    loop {
        match h2.next(idle).await {
            Next::Silent => break,
            Next::Frame { kind, .. } if kind != GOAWAY && kind != RST_STREAM => continue,
            other => panic!("the idle connection was cut: {other:?}"),
        }
    }
    h2.frame(PING, 0, 0, b"12345678").await;
    let (flags, payload) = h2.until(PING, 0).await;
    assert_eq!((flags, payload.as_slice()), (ACK, &b"12345678"[..]));
    h2.request(3, "GET", &format!("/api/v1/activities/{}", act.id), &[])
        .await;
    let (_, block) = h2.until(HEADERS, 3).await;
    assert_eq!(block.first(), Some(&STATUS_200), "{block:?}");

    // A request whose body never comes is ended at request_read_ms: the stream gets an
    // answer or a reset, and the connection goes on serving.
    let started = std::time::Instant::now();
    h2.request(
        5,
        "POST",
        "/api/v1/dev/token",
        &[(CONTENT_TYPE, "application/json")],
    )
    .await;
    loop {
        match h2.next(Duration::from_secs(5)).await {
            Next::Frame {
                kind: HEADERS | RST_STREAM,
                stream: 5,
                ..
            } => break,
            Next::Frame { kind: DATA, .. } | Next::Frame { stream: 0, .. } => continue,
            other => panic!("a body that never came held the stream: {other:?}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    h2.request(7, "GET", "/api/v1/activities", &[]).await;
    let (_, block) = h2.until(HEADERS, 7).await;
    assert_eq!(block.first(), Some(&STATUS_200), "{block:?}");

    // Half a preface, or a few bytes of an HTTP/1.1 request line, then nothing: cut at
    // request_read_ms (pingora's h2c preface check reads 24 bytes before anything else).
    for start in [&PREFACE[..16], b"GET /api".as_slice()] {
        let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
            .await
            .unwrap();
        let started = std::time::Instant::now();
        tokio::io::AsyncWriteExt::write_all(&mut raw, start)
            .await
            .unwrap();
        let mut chunk = [0u8; 256];
        let read = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::io::AsyncReadExt::read(&mut raw, &mut chunk),
        )
        .await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "{:?}: not closed: {read:?}",
            String::from_utf8_lossy(start)
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?} held {:?}",
            String::from_utf8_lossy(start),
            started.elapsed()
        );
    }
}

use seckill_lua::clock::unix_ms;
