#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]
//! User identity at the edge, end to end through the built gateway: RS256 and ES256
//! JWTs (keys generated at test time, none checked in) chosen by `kid`, two kids valid
//! at once, `iss`/`aud` checks, the 401 reasons, and a key rotation through the JWKS
//! file and SIGHUP. Needs `cargo build -p gateway --bins`.

use std::path::Path;
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use seckill_lua::clock::unix_ms;
use seckill_tests::gateway::{GatewayHandle, Stack};
use seckill_tests::process::wait_until_async;
use serde_json::{json, Value};

const ISSUER: &str = "https://id.test";
const AUDIENCE: &str = "seckill";

/// rand's thread CSPRNG behind the rand_core 0.6 traits the `rsa` crate takes.
struct ThreadRng;

impl rsa::rand_core::RngCore for ThreadRng {
    fn next_u32(&mut self) -> u32 {
        rand::random()
    }
    fn next_u64(&mut self) -> u64 {
        rand::random()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        rand::fill(dest)
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rsa::rand_core::Error> {
        rand::fill(dest);
        Ok(())
    }
}

impl rsa::rand_core::CryptoRng for ThreadRng {}

/// A signing key and where its public half was written.
struct Signer {
    kid: &'static str,
    alg: Algorithm,
    key: EncodingKey,
}

impl Signer {
    fn token(&self, claims: &Value) -> String {
        let mut h = Header::new(self.alg);
        h.kid = Some(self.kid.into());
        jsonwebtoken::encode(&h, claims, &self.key).unwrap()
    }
}

/// A fresh RSA-2048 key: its signer, and its public PEM written to `dir`.
fn rsa_key(dir: &Path, kid: &'static str) -> (Signer, String) {
    use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
    let private = rsa::RsaPrivateKey::new(&mut ThreadRng, 2048).unwrap();
    let pem = private.to_pkcs8_pem(LineEnding::LF).unwrap();
    let public = private
        .to_public_key()
        .to_public_key_pem(LineEnding::LF)
        .unwrap();
    let path = dir.join(format!("{kid}.pem"));
    std::fs::write(&path, public).unwrap();
    let key = EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap();
    let signer = Signer {
        kid,
        alg: Algorithm::RS256,
        key,
    };
    (signer, path.display().to_string())
}

/// A fresh P-256 key (rcgen): its signer, and its public PEM written to `dir`.
fn ec_key(dir: &Path, kid: &'static str) -> (Signer, String) {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let path = dir.join(format!("{kid}.pem"));
    std::fs::write(&path, pair.public_key_pem()).unwrap();
    let key = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
    let signer = Signer {
        kid,
        alg: Algorithm::ES256,
        key,
    };
    (signer, path.display().to_string())
}

/// An HS256 signer for a symmetric JWKS key.
fn hs_signer(kid: &'static str, secret: &str) -> Signer {
    Signer {
        kid,
        alg: Algorithm::HS256,
        key: EncodingKey::from_secret(secret.as_bytes()),
    }
}

/// Claims for `user`, valid a minute, for this issuer and audience.
fn claims(user: &str) -> Value {
    json!({"sub": user, "exp": unix_ms() / 1000 + 60, "iss": ISSUER, "aud": AUDIENCE})
}

/// Symmetric JWKS keys (`oct`): kid and base64url secret.
fn write_jwks(path: &Path, keys: &[(&str, &str)]) {
    let keys: Vec<Value> = keys
        .iter()
        .map(|(kid, k)| json!({"kty": "oct", "kid": kid, "alg": "HS256", "k": k}))
        .collect();
    std::fs::write(path, json!({ "keys": keys }).to_string()).unwrap();
}

/// "jwks-old-secret-0123456789" and "jwks-new-secret-0123456789", base64url.
const OLD_SECRET: &str = "jwks-old-secret-0123456789";
const OLD_K: &str = "andrcy1vbGQtc2VjcmV0LTAxMjM0NTY3ODk";
const NEW_SECRET: &str = "jwks-new-secret-0123456789";
const NEW_K: &str = "andrcy1uZXctc2VjcmV0LTAxMjM0NTY3ODk";

/// `[auth]` with `keys` as (kid, alg, public PEM path), the JWKS file, issuer and
/// audience (no single key, so no dev endpoint).
fn auth_section(config: &mut gateway::toml::Table, keys: &[(&str, &str, &str)], jwks: &Path) {
    let mut text = format!(
        "jwt_leeway_secs = 0\npurchase_token_secret = \"{}\"\nissuer = \"{ISSUER}\"\n\
         audience = \"{AUDIENCE}\"\njwks_path = \"{}\"\n",
        seckill_tests::gateway::PURCHASE_SECRET,
        jwks.display()
    );
    for (kid, alg, pem) in keys {
        text +=
            &format!("[[keys]]\nkid = \"{kid}\"\nalg = \"{alg}\"\npublic_key_path = \"{pem}\"\n");
    }
    let auth: gateway::toml::Table = text.parse().unwrap();
    config.insert("auth".into(), gateway::toml::Value::Table(auth));
    seckill_tests::gateway::set(config, "dev", "enabled", false);
}

async fn token_route(gw: &GatewayHandle, jwt: &str, a: u64, s: u64) -> (u16, String) {
    let r = gw
        .post(
            &format!("/api/v1/activities/{a}/items/{s}/token"),
            Some(jwt),
            json!({}),
        )
        .await;
    let reason = r.body["error"]["reason"].as_str().unwrap_or("").to_string();
    (r.status, reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rs256_and_es256_tokens_buy_through_the_edge_and_bad_ones_get_401_with_the_reason() {
    let s = Stack::start().await;
    let act = s.open_activity(&[(5, 100)]).await;
    let (a, item) = (act.id, act.items[0].id);
    let dir = tempfile::tempdir().unwrap();
    let (rsa1, rsa_pem) = rsa_key(dir.path(), "rsa-1");
    let (ec1, ec_pem) = ec_key(dir.path(), "ec-1");
    let jwks = dir.path().join("jwks.json");
    write_jwks(&jwks, &[("hs-old", OLD_K)]);
    let gw = s
        .gateway(|c| {
            auth_section(
                c,
                &[("rsa-1", "RS256", &rsa_pem), ("ec-1", "ES256", &ec_pem)],
                &jwks,
            )
        })
        .await;
    gw.wait_activity(a).await;

    // Two kids of two algorithms are valid at once: each buyer reserves, end to end.
    for (signer, user) in [(&rsa1, "rita"), (&ec1, "eric")] {
        let jwt = signer.token(&claims(user));
        let pt = gw.purchase_token(&jwt, a, item).await;
        let r = gw.reserve(&jwt, a, item, &pt).await;
        assert_eq!(r.status, 202, "{} {}: {}", signer.kid, user, r.body);
        assert!(r.body["reservation_id"].is_string(), "{}", r.body);
    }
    assert_eq!(s.reservations_seen_by_stockd(), 2);

    // Refusals: 401 `unauthenticated`, with the reason.
    let mut wrong_kid = Signer {
        kid: "rsa-2",
        ..rsa1
    };
    let mut c = claims("mallory");
    let cases: Vec<(&str, String)> = vec![
        ("unknown_kid", wrong_kid.token(&c)),
        ("wrong_issuer", {
            c["iss"] = json!("https://evil.test");
            ec1.token(&c)
        }),
        ("wrong_audience", {
            c = claims("mallory");
            c["aud"] = json!("another-service");
            ec1.token(&c)
        }),
        ("token_expired", {
            c = claims("mallory");
            c["exp"] = json!(unix_ms() / 1000 - 3600);
            ec1.token(&c)
        }),
        ("missing_kid", {
            let mut h = Header::new(Algorithm::ES256);
            h.kid = None;
            jsonwebtoken::encode(&h, &claims("mallory"), &ec1.key).unwrap()
        }),
        ("bad_signature", {
            // The ES256 key's kid on a token signed by the RSA key.
            wrong_kid.kid = "ec-1";
            wrong_kid.token(&claims("mallory"))
        }),
    ];
    for (reason, jwt) in cases {
        let r = gw
            .post(
                &format!("/api/v1/activities/{a}/items/{item}/token"),
                Some(&jwt),
                json!({}),
            )
            .await;
        assert_eq!((r.status, r.code()), (401, "unauthenticated"), "{reason}");
        assert_eq!(r.body["error"]["reason"], reason, "{}", r.body);
        assert!(r.body["error"]["message"].is_string(), "{}", r.body);
    }
    // Nothing refused reached stockd.
    assert_eq!(s.reservations_seen_by_stockd(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_key_rotates_by_sighup_with_both_kids_valid_in_between() {
    let s = Stack::start().await;
    let act = s.open_activity(&[(5, 100)]).await;
    let (a, item) = (act.id, act.items[0].id);
    let dir = tempfile::tempdir().unwrap();
    // A PEM key next to the JWKS file, so the set never holds a single key.
    let (_, ec_pem) = ec_key(dir.path(), "ec-1");
    let jwks = dir.path().join("jwks.json");
    write_jwks(&jwks, &[("hs-old", OLD_K)]);
    let mut gw = s
        .gateway(|c| auth_section(c, &[("ec-1", "ES256", &ec_pem)], &jwks))
        .await;
    gw.wait_activity(a).await;
    let old = hs_signer("hs-old", OLD_SECRET);
    let new = hs_signer("hs-new", NEW_SECRET);
    let old_jwt = old.token(&claims("olga"));
    let new_jwt = new.token(&claims("nina"));
    assert_eq!(token_route(&gw, &old_jwt, a, item).await.0, 200);
    assert_eq!(
        token_route(&gw, &new_jwt, a, item).await,
        (401, "unknown_kid".into())
    );

    // The new key joins the set: both verify.
    write_jwks(&jwks, &[("hs-old", OLD_K), ("hs-new", NEW_K)]);
    gw.reload(|_| {});
    wait_until_async("the new kid verifies", Duration::from_secs(10), || async {
        token_route(&gw, &new_jwt, a, item).await.0 == 200
    })
    .await;
    assert_eq!(token_route(&gw, &old_jwt, a, item).await.0, 200);

    // A broken file on SIGHUP keeps the running set.
    std::fs::write(&jwks, "{not json").unwrap();
    gw.reload(|_| {});
    wait_until_async(
        "the refused reload is logged",
        Duration::from_secs(10),
        || async { gw.log().contains("auth.jwks_path") },
    )
    .await;
    assert_eq!(token_route(&gw, &new_jwt, a, item).await.0, 200);

    // The old key leaves: its tokens are refused, the new ones still pass.
    write_jwks(&jwks, &[("hs-new", NEW_K)]);
    gw.reload(|_| {});
    wait_until_async("the old kid is gone", Duration::from_secs(10), || async {
        token_route(&gw, &old_jwt, a, item).await == (401, "unknown_kid".into())
    })
    .await;
    assert_eq!(token_route(&gw, &new_jwt, a, item).await.0, 200);
}

/// The gateway's own gRPC token, scoped as docs/stockd.md advises.
const GATEWAY_TOKEN: &str = "edge-token-0123456789abc";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_sells_with_a_least_privilege_token_and_a_missing_scope_is_its_own_503() {
    use seckill_proto::auth::{CallerConfig, Scope};
    use seckill_tests::gateway::{set, spawn_gateway, EdgeDeps};
    use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};
    init_tracing();
    let redis = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&redis, &db);
    // The harness keeps its dev shortcut (it creates the activity); the edge is a
    // caller of its own.
    let edge = |scopes: Vec<Scope>| CallerConfig {
        name: "gateway".into(),
        token: GATEWAY_TOKEN.into(),
        scopes,
    };
    let stockd = seckill_tests::stockd::spawn_stockd(&deps, |c| {
        c.grpc.callers = vec![edge(vec![Scope::Reserve, Scope::Read, Scope::Pay])];
    })
    .await;
    // orderd knows the edge's token only for reading and paying: no reserve there.
    let orderd = seckill_tests::orderd::spawn_orderd(&deps, |c| {
        c.grpc.callers = vec![edge(vec![Scope::Read])];
    })
    .await;
    let act = seckill_tests::stockd::create_published_activity(
        &stockd,
        &[(3, 100)],
        2,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let (a, item) = (act.id, act.items[0].id);
    let orderd_addr = orderd.addr_str();
    let gw = spawn_gateway(
        &EdgeDeps {
            redis: &redis,
            stockd: &stockd.addr,
            orderd: &orderd_addr,
        },
        |c| set(c, "upstreams", "service_token", GATEWAY_TOKEN),
    )
    .await;
    gw.wait_activity(a).await;

    // Reserve (stockd: scope reserve) works end to end with the scoped token.
    let jwt = gw.dev_token("alice").await;
    let pt = gw.purchase_token(&jwt, a, item).await;
    let r = gw.reserve(&jwt, a, item, &pt).await;
    assert_eq!(r.status, 202, "{}", r.body);
    let order = r.body["order_id"].as_str().unwrap().to_string();
    // Reading the order (orderd: scope read) works too: QUEUED or PENDING, not refused.
    let got = gw.get(&format!("/api/v1/orders/{order}"), Some(&jwt)).await;
    assert_eq!(got.status, 200, "{}", got.body);
    // Paying needs `pay`, which orderd did not grant this token: the edge's own
    // credentials are wrong, so the buyer gets 503, not 403 "not your order".
    let paid = gw
        .post(
            &format!("/api/v1/orders/{order}/pay"),
            Some(&jwt),
            json!({}),
        )
        .await;
    assert_eq!(
        (paid.status, paid.code()),
        (503, "backend_unavailable"),
        "{}",
        paid.body
    );
}
