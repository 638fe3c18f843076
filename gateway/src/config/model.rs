//! The sections of the gateway's config: serde structs with defaults and a `///` on
//! every field. Checks beyond types are in `validate.rs`. (A little over 400 lines:
//! eleven sections, each field with its meaning, unit and default; splitting them
//! would scatter one reference.)

use seckill_daemon::config::LogSection;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Environment override prefix: `GATEWAY__LIMITS__PER_IP_RATE=10`.
pub const ENV_PREFIX: &str = "GATEWAY";

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: Server,
    #[serde(default)]
    pub admin: Admin,
    #[serde(default)]
    pub log: LogSection,
    pub redis: Redis,
    pub upstreams: Upstreams,
    pub auth: Auth,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub bans: Bans,
    #[serde(default)]
    pub admission: Admission,
    #[serde(default)]
    pub protection: Protection,
    #[serde(default)]
    pub dev: Dev,
}

/// `[admin]`: the loopback admin listener (`/metrics`, `/healthz`, `/readyz`). The same
/// spelling as stockd's and orderd's `[admin]`, but always on.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    /// `host:port` of the admin listener. Default `127.0.0.1:9091`.
    pub listen: String,
}

impl Default for Admin {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9091".into(),
        }
    }
}

/// Listeners and process settings (handed to pingora's `ServerConf`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Server {
    /// Plain-text HTTP listen addresses (`host:port`). Default `["127.0.0.1:8080"]`.
    pub listen: Vec<String>,
    /// Worker threads of the HTTP service. Default 1.
    pub threads: usize,
    /// One tokio runtime whose workers steal each other's tasks (true), or one
    /// single-threaded runtime per thread (false: cheaper per request, no balancing).
    /// Default false.
    pub work_stealing: bool,
    /// Accept HTTP/2 with prior knowledge (h2c) on the plain listeners. Default false.
    pub h2c: bool,
    /// Answer the hot refusals of plain HTTP/1.1 requests (banned IP, per-IP or route
    /// bucket empty, item sold out) straight from the socket, before pingora builds a
    /// session: the same answers and side effects, at about half the CPU. Every other
    /// request, and the rest of its connection, goes to pingora (`fast_lane.rs`).
    /// Default true.
    pub fast_lane: bool,
    /// TLS listen address (`host:port`); empty disables TLS. Needs `tls_cert_path` and
    /// `tls_key_path`. Served by rustls (TLS 1.2 and 1.3), offering `h2` and `http/1.1`
    /// by ALPN. Default empty.
    pub tls_listen: String,
    /// PEM certificate chain for `tls_listen`, leaf first. Read at start (and by `-t`),
    /// not on SIGHUP. Default empty.
    pub tls_cert_path: String,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the leaf certificate. Default empty.
    pub tls_key_path: String,
    /// Pingora pid file (used by graceful upgrade). Default `/tmp/seckill-gateway.pid`.
    pub pid_file: String,
    /// Unix socket the old process hands its listeners over on during a graceful upgrade
    /// (SIGQUIT to the old process, `-u` on the new one). Default
    /// `/tmp/seckill-gateway-upgrade.sock`.
    pub upgrade_sock: String,
    /// After the listeners stop accepting (SIGTERM, or the end of a graceful upgrade's
    /// hand-over), seconds the requests already accepted get to finish before the runtime
    /// stops. 0 drops a request accepted in the last instant. Default 1.
    pub grace_period_secs: u64,
    /// Then, at most this many seconds for the runtimes to wind down. Default 5.
    pub graceful_shutdown_timeout_secs: u64,
    /// One structured (tracing) line per request. Default true.
    pub access_log: bool,
}

impl Default for Server {
    fn default() -> Self {
        Self {
            listen: vec!["127.0.0.1:8080".into()],
            threads: 1,
            work_stealing: false,
            h2c: false,
            fast_lane: true,
            tls_listen: String::new(),
            tls_cert_path: String::new(),
            tls_key_path: String::new(),
            pid_file: "/tmp/seckill-gateway.pid".into(),
            upgrade_sock: "/tmp/seckill-gateway-upgrade.sock".into(),
            grace_period_secs: 1,
            graceful_shutdown_timeout_secs: 5,
            access_log: true,
        }
    }
}

/// The Redis Cluster that feeds activities, sold-out flags and bans. The gateway never
/// touches Redis on the request path.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redis {
    /// Seed nodes `host:port` (any subset of the cluster). Required.
    pub nodes: Vec<String>,
    /// True for Redis Cluster, false for a single server (first node). Default true.
    #[serde(default = "yes")]
    pub cluster: bool,
    /// Milliseconds between full reloads of activities and bans (pub/sub makes most
    /// changes visible at once; this catches missed messages). Default 2000.
    #[serde(default = "d_refresh")]
    pub refresh_ms: u64,
    /// Milliseconds between pipelined reads of every shard stock key of every item
    /// (sold-out flags and the admission cap's "remaining"). Default 250.
    #[serde(default = "d_stock_poll")]
    pub stock_poll_ms: u64,
    /// Command timeout, milliseconds. Default 1000.
    #[serde(default = "d_redis_timeout")]
    pub timeout_ms: u64,
}

/// stockd and orderd over gRPC: one endpoint or a fleet of each (`upstream/` spreads
/// the calls over the healthy ones and fails over within the deadline).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstreams {
    /// stockd gRPC URL, or a list of them (a fleet), for example
    /// `"http://127.0.0.1:50051"` or `["http://10.0.0.1:50051", "http://10.0.0.2:50051"]`.
    /// At most 64, no duplicates. Required.
    pub stockd: Urls,
    /// orderd gRPC URL or list of URLs, as `stockd`, for example
    /// `"http://127.0.0.1:50052"`. Required.
    pub orderd: Urls,
    /// Service token sent as `authorization: Bearer <token>`. Required, never logged.
    pub service_token: String,
    /// TCP connect timeout, milliseconds. Default 300.
    #[serde(default = "d_connect")]
    pub connect_timeout_ms: u64,
    /// Deadline of a `Reserve` call, milliseconds; past it the client gets 503. Default 1000.
    #[serde(default = "d_reserve_deadline")]
    pub reserve_deadline_ms: u64,
    /// Deadline of an orderd call, milliseconds. Default 2000.
    #[serde(default = "d_order_deadline")]
    pub order_deadline_ms: u64,
    /// `Retry-After` seconds on 503. Default 1.
    #[serde(default = "one")]
    pub retry_after_secs: u64,
    /// Milliseconds between two gRPC health checks (`grpc.health.v1` `Check`, service
    /// "") of each endpoint; a check marks the endpoint healthy (SERVING) or not. A call
    /// failing with a transport error or `UNAVAILABLE` marks it down at once. Default 500.
    #[serde(default = "d_health_interval")]
    pub health_interval_ms: u64,
    /// Timeout of one health check, milliseconds (connect included); no answer in time
    /// marks the endpoint down. Default 1000.
    #[serde(default = "d_health_timeout")]
    pub health_timeout_ms: u64,
    /// `[upstreams.tls]`: how `https://` URLs are dialled: `ca_path` (PEM roots that
    /// verify the daemons; no system roots), `cert_path` + `key_path` (the gateway's
    /// client certificate, for daemons with `[grpc.tls] client_ca_path`: mutual TLS),
    /// `domain` (the name verified; default each URL's host). Required when a URL is
    /// `https://`; `http://` URLs stay plaintext, so a fleet may mix both while its
    /// daemons move to TLS one by one. Default: absent. Files read and checked on every
    /// load, `-t` included.
    #[serde(default)]
    pub tls: Option<seckill_daemon::tls::ClientTls>,
}

/// The most endpoints of one service (the failover loop tracks the endpoints a call
/// has tried in one `u64`).
pub const MAX_ENDPOINTS: usize = 64;

/// One URL or a list of them: `stockd = "http://a:50051"` is `stockd = ["http://a:50051"]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Urls(pub Vec<String>);

impl std::ops::Deref for Urls {
    type Target = [String];
    fn deref(&self) -> &[String] {
        &self.0
    }
}

impl From<&str> for Urls {
    fn from(url: &str) -> Self {
        Self(vec![url.to_string()])
    }
}

impl<'de> Deserialize<'de> for Urls {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Urls;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a URL or a list of URLs")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Urls, E> {
                Ok(Urls::from(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Urls, A::Error> {
                let mut urls = Vec::new();
                while let Some(u) = seq.next_element::<String>()? {
                    urls.push(u);
                }
                Ok(Urls(urls))
            }
        }
        d.deserialize_any(V)
    }
}

/// The JWT signature algorithm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum JwtAlg {
    /// HMAC-SHA256 with `auth.jwt_secret` (the gateway can also sign: dev tokens).
    #[default]
    HS256,
    /// RSA PKCS#1 v1.5 SHA-256, verified with `auth.jwt_public_key_path`.
    RS256,
    /// ECDSA P-256 SHA-256, verified with `auth.jwt_public_key_path`.
    ES256,
}

impl std::fmt::Display for JwtAlg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JwtAlg::HS256 => "HS256",
            JwtAlg::RS256 => "RS256",
            JwtAlg::ES256 => "ES256",
        })
    }
}

/// JWT verification and purchase tokens.
///
/// The verification keys are the single key of `jwt_alg` + `jwt_secret` /
/// `jwt_public_key_path` (the first spelling, still valid), the entries of `keys`, and
/// the keys of the JWKS file `jwks_path`. A token's `kid` header picks its key; a token
/// without `kid` is verified only when exactly one key is configured in all.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    /// Algorithm of the single key: `HS256`, `RS256` or `ES256`. Default `HS256`.
    #[serde(default)]
    pub jwt_alg: JwtAlg,
    /// HS256 shared secret of the single key (at least 16 bytes). Empty: no single
    /// HS256 key (then `keys` or `jwks_path` must give one). Never logged.
    #[serde(default)]
    pub jwt_secret: String,
    /// PEM public key file of the single key for RS256/ES256. Default empty.
    #[serde(default)]
    pub jwt_public_key_path: String,
    /// Verification keys chosen by the token's `kid`: `[[auth.keys]]` with `kid`, `alg`
    /// and `secret` (HS256) or `public_key_path` (RS256, ES256). Two kids valid at once
    /// is a key rotation without downtime. Read at start and on SIGHUP. Default none.
    #[serde(default)]
    pub keys: Vec<JwtKey>,
    /// A JSON Web Key Set file (RFC 7517: `{"keys": [...]}`, each key with a `kid`;
    /// RSA, EC P-256 or symmetric `oct` keys), added to `keys`; read at start and again
    /// on SIGHUP (a file that fails to load keeps the running keys). Default empty
    /// (none).
    #[serde(default)]
    pub jwks_path: String,
    /// Required `iss` claim of user JWTs; empty accepts any issuer. The dev endpoint
    /// writes it into its tokens. Default empty.
    #[serde(default)]
    pub issuer: String,
    /// Required `aud` claim (one of the token's audiences); empty accepts tokens with
    /// or without `aud`. The dev endpoint writes it into its tokens. Default empty.
    #[serde(default)]
    pub audience: String,
    /// Clock skew allowed on `exp`, seconds. Default 5.
    #[serde(default = "d_leeway")]
    pub jwt_leeway_secs: u64,
    /// HMAC-SHA256 key of purchase tokens (at least 16 bytes). Required; never logged.
    pub purchase_token_secret: String,
    /// Lifetime of a purchase token, seconds. Default 60.
    #[serde(default = "d_pt_ttl")]
    pub purchase_token_ttl_secs: u64,
}

/// One JWT verification key of `[[auth.keys]]`.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtKey {
    /// The key id tokens name in their `kid` header. Required, unique among all keys.
    pub kid: String,
    /// `HS256`, `RS256` or `ES256`. Default `HS256`.
    #[serde(default)]
    pub alg: JwtAlg,
    /// HS256 shared secret, at least 16 bytes. Never logged. Default empty.
    #[serde(default)]
    pub secret: String,
    /// RS256/ES256 PEM public key file. Default empty.
    #[serde(default)]
    pub public_key_path: String,
}

impl std::fmt::Debug for JwtKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .field("public_key_path", &self.public_key_path)
            .finish_non_exhaustive()
    }
}

/// One token bucket: `rate` tokens per second, at most `burst` stored.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    /// Tokens added per second (> 0).
    pub rate: f64,
    /// Bucket size: requests allowed in a burst (>= 1).
    pub burst: f64,
}

/// Token buckets per client IP, per user and per route.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Per client IP (IPv6 clients are counted per /64). Default 20/s, burst 40.
    pub per_ip: Bucket,
    /// Per authenticated user. Default 5/s, burst 10.
    pub per_user: Bucket,
    /// Per route, shared by every client: keys `token`, `reserve`, `orders`, `activities`,
    /// `payments`, `dev`. Default none (only the per-IP and per-user buckets apply).
    pub routes: BTreeMap<String, Bucket>,
    /// Most client IPs tracked at once. Full buckets are dropped first (dropping a full
    /// bucket changes nothing); beyond that the oldest are dropped. About 17 bytes per
    /// entry. Default 1000000.
    pub max_tracked: usize,
    /// Seconds after which an idle bucket is evicted by the sweeper. Default 60.
    pub idle_evict_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_ip: Bucket {
                rate: 20.0,
                burst: 40.0,
            },
            per_user: Bucket {
                rate: 5.0,
                burst: 10.0,
            },
            routes: BTreeMap::new(),
            max_tracked: 1_000_000,
            idle_evict_secs: 60,
        }
    }
}

/// Static CIDR lists, trusted proxies and the auto-ban.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Bans {
    /// Refused CIDRs (or single IPs). Default empty.
    pub deny: Vec<String>,
    /// CIDRs never refused, not even by the shared or automatic bans. Default empty.
    pub allow: Vec<String>,
    /// Peers whose `X-Forwarded-For` is believed: the client is the right-most address
    /// that is not a trusted proxy. Default empty (the TCP peer is the client).
    pub trusted_proxies: Vec<String>,
    /// Refusals (403/429) within `auto_ban_window_secs` that ban an IP; 0 disables.
    /// Default 200.
    pub auto_ban_threshold: u32,
    /// Window of the auto-ban counter, seconds. Default 10.
    pub auto_ban_window_secs: u64,
    /// How long an auto-ban lasts, seconds (shared through Redis). Default 300.
    pub auto_ban_ttl_secs: u64,
    /// Close connections of banned TCP peers right after accept, before any HTTP.
    /// Default false (banned clients get a 403 JSON answer).
    pub refuse_at_connection: bool,
}

impl Default for Bans {
    fn default() -> Self {
        Self {
            deny: Vec::new(),
            allow: Vec::new(),
            trusted_proxies: Vec::new(),
            auto_ban_threshold: 200,
            auto_ban_window_secs: 10,
            auto_ban_ttl_secs: 300,
            refuse_at_connection: false,
        }
    }
}

/// The admission cap.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Admission {
    /// At most `k` × remaining units of reservations in flight per item; the excess gets
    /// 429 `busy` without calling stockd. Default 2.0.
    pub k: f64,
    /// Floor of the cap, so that an item with a few units left still admits a few
    /// requests. Default 4.
    pub min_in_flight: u32,
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            k: 2.0,
            min_in_flight: 4,
        }
    }
}

/// Request size limits and the read deadline.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Protection {
    /// Most request headers (431 beyond). Default 64.
    pub max_header_count: usize,
    /// Most bytes of all header names and values together (431 beyond). Default 16384.
    pub max_header_bytes: usize,
    /// Largest request body, bytes (413 beyond). Default 4096.
    pub max_body_bytes: usize,
    /// Total time allowed to read one request (headers and body), milliseconds, counted
    /// from its first byte (or from accept); a slower client is disconnected. On HTTP/2 it
    /// bounds the connection's start and each request's body (see `deadline.rs`).
    /// Default 5000.
    pub request_read_ms: u64,
}

impl Default for Protection {
    fn default() -> Self {
        Self {
            max_header_count: 64,
            max_header_bytes: 16 * 1024,
            max_body_bytes: 4096,
            request_read_ms: 5000,
        }
    }
}

/// Dev-only helpers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dev {
    /// Enables `POST /api/v1/dev/token` (a JWT for any user id). Never in production.
    /// Needs `auth.jwt_alg = "HS256"`. Default false.
    pub enabled: bool,
    /// Lifetime of dev JWTs, seconds. Default 3600.
    pub token_ttl_secs: u64,
}

impl Default for Dev {
    fn default() -> Self {
        Self {
            enabled: false,
            token_ttl_secs: 3600,
        }
    }
}

fn yes() -> bool {
    true
}
fn one() -> u64 {
    1
}
fn d_refresh() -> u64 {
    2000
}
fn d_stock_poll() -> u64 {
    250
}
fn d_redis_timeout() -> u64 {
    1000
}
fn d_connect() -> u64 {
    300
}
fn d_reserve_deadline() -> u64 {
    1000
}
fn d_order_deadline() -> u64 {
    2000
}
fn d_health_interval() -> u64 {
    500
}
fn d_health_timeout() -> u64 {
    1000
}
fn d_leeway() -> u64 {
    5
}
fn d_pt_ttl() -> u64 {
    60
}

/// The part of the config a SIGHUP swaps in.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub limits: Limits,
    pub bans: Bans,
    pub admission: Admission,
    pub protection: Protection,
}

impl Config {
    pub fn policy(&self) -> Policy {
        Policy {
            limits: self.limits.clone(),
            bans: self.bans.clone(),
            admission: self.admission.clone(),
            protection: self.protection.clone(),
        }
    }
}
