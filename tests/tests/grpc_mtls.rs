#![cfg(all(feature = "gateway", feature = "stockd", feature = "orderd"))]
//! Mutual TLS between the edge and the daemons: stockd and orderd (the built binaries)
//! with `[grpc.tls]` and `client_ca_path`, a gateway with `[upstreams.tls]` and
//! `https://` URLs. The certificates (a CA, a server certificate for 127.0.0.1 and
//! localhost, a client certificate for the gateway) are made at test time with rcgen;
//! no key is checked in. seckillctl's `--tls-*` flags are checked on the same stockd.
//! Needs `cargo build --bins -p stockd -p orderd -p gateway`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use seckill_daemon::tls::{ClientTls, ServerTls};
use seckill_proto::auth::AttachToken;
use seckill_proto::pb::admin_service_client::AdminServiceClient;
use seckill_tests::gateway::{set, spawn_gateway, EdgeDeps};
use seckill_tests::grpc::{tls_channel, try_tls_channel};
use seckill_tests::process::{wait_until_async, workspace_bin};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb, SERVICE_TOKEN};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// PEM files of one test's certificates, in a directory of its own.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA; `server.pem`/`.key` for 127.0.0.1 and localhost and `gateway.pem`/`.key`
    /// signed by it; `rogue.pem`/`.key`, a client certificate signed by another CA.
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("seckill-mtls-")
            .tempdir()
            .expect("tempdir");
        let (ca_pem, ca) = authority();
        std::fs::write(dir.path().join("ca.pem"), ca_pem).expect("write ca");
        let (_, other) = authority();
        for (name, sans, issuer) in [
            ("server", vec!["127.0.0.1", "localhost"], &ca),
            ("gateway", vec!["gateway"], &ca),
            ("rogue", vec!["gateway"], &other),
        ] {
            let key = KeyPair::generate().expect("key");
            let cert =
                CertificateParams::new(sans.into_iter().map(String::from).collect::<Vec<_>>())
                    .expect("params")
                    .signed_by(&key, issuer)
                    .expect("sign");
            std::fs::write(dir.path().join(format!("{name}.pem")), cert.pem()).expect("write");
            std::fs::write(dir.path().join(format!("{name}.key")), key.serialize_pem())
                .expect("write");
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn text(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).expect("read pem")
    }

    /// `[grpc.tls]` requiring client certificates signed by the CA.
    fn server(&self) -> ServerTls {
        ServerTls {
            cert_path: self.text("server.pem"),
            key_path: self.text("server.key"),
            client_ca_path: self.text("ca.pem"),
        }
    }

    /// A client trusting the CA, presenting `name`'s certificate if given.
    fn client(&self, name: Option<&str>) -> ClientTlsConfig {
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(self.read("ca.pem")));
        match name {
            Some(n) => tls.identity(Identity::from_pem(
                self.read(&format!("{n}.pem")),
                self.read(&format!("{n}.key")),
            )),
            None => tls,
        }
    }
}

/// A self-signed CA: its PEM and its issuer.
fn authority() -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("ca key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).expect("self-signed");
    (cert.pem(), Issuer::new(params, key))
}

/// The health of the whole server over `channel`, or the call's error.
async fn health(channel: Channel) -> Result<ServingStatus, tonic::Status> {
    let mut h = HealthClient::new(channel);
    let r = h
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    Ok(r.into_inner().status())
}

/// Until `service` answers SERVING over a TLS channel with the gateway's certificate.
async fn wait_serving_tls(addr: &str, pki: &Pki, service: &str) {
    let channel = tls_channel(addr, pki.client(Some("gateway"))).await;
    wait_until_async(
        &format!("{service} SERVING over mTLS"),
        Duration::from_secs(30),
        || {
            let mut h = HealthClient::new(channel.clone());
            async move {
                h.check(HealthCheckRequest {
                    service: service.to_string(),
                })
                .await
                .is_ok_and(|r| r.into_inner().status() == ServingStatus::Serving)
            }
        },
    )
    .await;
}

/// What a client that must be refused gets: the handshake fails, or (TLS 1.3: the
/// server checks the client's certificate after the client considers the handshake
/// done) the first call on the connection fails. Never an answer.
async fn refused(connect: Result<Channel, tonic::transport::Error>) -> String {
    match connect {
        Err(e) => format!("connect: {e:?}"),
        Ok(channel) => match health(channel).await {
            Err(status) => format!("call: {status:?}"),
            Ok(s) => panic!("a client that must be refused got an answer: {s:?}"),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_goes_through_the_edge_over_mutual_tls_and_strangers_are_refused() {
    init_tracing();
    let pki = Pki::new();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&redis, &db);
    let stockd =
        seckill_tests::stockd::spawn_stockd_process(&deps, |c| c.grpc.tls = Some(pki.server()))
            .await;
    let orderd =
        seckill_tests::orderd::spawn_orderd_process(&deps, |c| c.grpc.tls = Some(pki.server()))
            .await;
    wait_serving_tls(&stockd.addr, &pki, "seckill.v1.StockService").await;
    wait_serving_tls(&orderd.addr, &pki, "seckill.v1.OrderService").await;

    // Refused: no client certificate, a certificate of another CA, plaintext. The same
    // port serves health, so each is asked for it.
    for addr in [&stockd.addr, &orderd.addr] {
        let why = refused(try_tls_channel(addr, pki.client(None)).await).await;
        eprintln!("{addr} without a client certificate: {why}");
        let why = refused(try_tls_channel(addr, pki.client(Some("rogue"))).await).await;
        eprintln!("{addr} with a stranger's certificate: {why}");
        let plain = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect()
            .await;
        let why = refused(plain).await;
        eprintln!("{addr} in plaintext: {why}");
    }

    // An activity, created over mTLS with the harness' admin client.
    let channel = tls_channel(&stockd.addr, pki.client(Some("gateway"))).await;
    let mut admin =
        AdminServiceClient::with_interceptor(channel, AttachToken::new(SERVICE_TOKEN).unwrap());
    let act = seckill_tests::stockd::create_published_activity_with(
        &mut admin,
        &[(3, 1000)],
        2,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;

    // seckillctl with the --tls-* flags reads it back; without them it names the flag.
    let ctl = |tls: &[String]| {
        let out = std::process::Command::new(workspace_bin("seckillctl"))
            .args(["--stockd", &format!("https://{}", stockd.addr)])
            .args(["--token", SERVICE_TOKEN, "--json"])
            .args(tls)
            .args(["activity", "get", &act.id.to_string()])
            .output()
            .expect("run seckillctl");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), said)
    };
    let flags = [
        ("--tls-ca", "ca.pem"),
        ("--tls-cert", "gateway.pem"),
        ("--tls-key", "gateway.key"),
    ]
    .iter()
    .flat_map(|(f, file)| [f.to_string(), pki.text(file)])
    .collect::<Vec<_>>();
    let (ok, said) = ctl(&flags);
    assert!(
        ok && said.contains("test sale"),
        "seckillctl over mTLS: {said}"
    );
    let (ok, said) = ctl(&[]);
    assert!(
        !ok && said.contains("--tls-ca"),
        "seckillctl without --tls-ca: {said}"
    );

    // The edge dials both daemons over mTLS; /readyz (waited for) needs their health
    // checks, which go over the same TLS channel, to answer SERVING.
    let edge = EdgeDeps {
        redis: &redis,
        stockd: &stockd.addr,
        orderd: &orderd.addr,
    };
    let gw = spawn_gateway(&edge, |c| {
        set(c, "upstreams", "stockd", format!("https://{}", stockd.addr));
        set(c, "upstreams", "orderd", format!("https://{}", orderd.addr));
        let tls = ClientTls {
            ca_path: pki.text("ca.pem"),
            cert_path: pki.text("gateway.pem"),
            key_path: pki.text("gateway.key"),
            domain: String::new(),
        };
        set(
            c,
            "upstreams",
            "tls",
            gateway::toml::Value::try_from(tls).expect("tls as TOML"),
        );
    })
    .await;
    gw.wait_activity(act.id).await;
    let (a, item) = (act.id, act.items[0].id);
    let jwt = gw.dev_token("alice").await;
    let token = gw.purchase_token(&jwt, a, item).await;
    let r = gw.reserve(&jwt, a, item, &token).await;
    assert_eq!(r.status, 202, "{}", r.body);
    let order_id = r.body["order_id"].as_str().expect("order id").to_string();

    // orderd takes the reservation from its stream and writes the order.
    wait_until_async("the order in MySQL", Duration::from_secs(30), || {
        let (db, id) = (&db, &order_id);
        async move {
            sqlx::query_scalar::<_, String>("SELECT user_id FROM orders WHERE id = ?")
                .bind(id)
                .fetch_optional(db.pool())
                .await
                .expect("query orders")
                .is_some_and(|u| u == "alice")
        }
    })
    .await;
    // And the edge reads it back from orderd over mTLS.
    let got = gw
        .get(&format!("/api/v1/orders/{order_id}"), Some(&jwt))
        .await;
    assert_eq!(got.status, 200, "{}", got.body);
}

/// Runs `bin -t -c <file with text>`; returns (success, stderr + stdout).
fn check_config(bin: &str, dir: &Path, text: &str) -> (bool, String) {
    let path = dir.join(format!("{bin}.toml"));
    std::fs::write(&path, text).expect("write config");
    seckill_tests::process::config_test(bin, &path)
}

#[test]
fn daemons_t_refuse_a_missing_certificate_file_naming_the_field() {
    let pki = Pki::new();
    // The shipped local configs, with a [grpc.tls] section added.
    let shipped = |bin: &str| {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../deploy/local/{bin}.toml"));
        std::fs::read_to_string(path).expect("shipped config")
    };
    for bin in ["stockd", "orderd"] {
        let good = format!(
            "{}[grpc.tls]\ncert_path = \"{}\"\nkey_path = \"{}\"\nclient_ca_path = \"{}\"\n",
            shipped(bin),
            pki.text("server.pem"),
            pki.text("server.key"),
            pki.text("ca.pem")
        );
        let (ok, said) = check_config(bin, pki.dir.path(), &good);
        assert!(ok, "{bin} -t refused good TLS files: {said}");

        let missing = good.replace(&pki.text("server.pem"), &pki.text("nowhere.pem"));
        let (ok, said) = check_config(bin, pki.dir.path(), &missing);
        assert!(!ok, "{bin} -t accepted a missing cert file");
        assert!(
            said.contains("grpc.tls.cert_path") && said.contains("nowhere.pem"),
            "{bin}: {said}"
        );

        let wrong_key = good.replace(&pki.text("server.key"), &pki.text("gateway.key"));
        let (ok, said) = check_config(bin, pki.dir.path(), &wrong_key);
        assert!(!ok, "{bin} -t accepted a key that is not the certificate's");
        assert!(said.contains("grpc.tls.key_path"), "{bin}: {said}");
    }
}

#[test]
fn gateway_t_refuses_an_https_upstream_it_cannot_speak_to() {
    let pki = Pki::new();
    let base = format!(
        r#"
[redis]
nodes = ["127.0.0.1:7001"]
[upstreams]
stockd = "https://127.0.0.1:50051"
orderd = "http://127.0.0.1:50052"
service_token = "{SERVICE_TOKEN}"
[auth]
jwt_secret = "0123456789abcdef0123"
purchase_token_secret = "fedcba9876543210fedc"
"#
    );
    let (ok, said) = check_config("gateway", pki.dir.path(), &base);
    assert!(!ok, "gateway -t accepted https:// without [upstreams.tls]");
    assert!(
        said.contains("upstreams.stockd") && said.contains("[upstreams.tls]"),
        "{said}"
    );

    let with = |tls: &str| format!("{base}[upstreams.tls]\n{tls}\n");
    let good = with(&format!(
        "ca_path = \"{}\"\ncert_path = \"{}\"\nkey_path = \"{}\"",
        pki.text("ca.pem"),
        pki.text("gateway.pem"),
        pki.text("gateway.key")
    ));
    let (ok, said) = check_config("gateway", pki.dir.path(), &good);
    assert!(ok, "gateway -t refused good TLS files: {said}");

    let bad_ca = good.replace(&pki.text("ca.pem"), &pki.text("gateway.key"));
    let (ok, said) = check_config("gateway", pki.dir.path(), &bad_ca);
    assert!(!ok, "gateway -t accepted a key as the CA");
    assert!(said.contains("upstreams.tls.ca_path"), "{said}");
}
