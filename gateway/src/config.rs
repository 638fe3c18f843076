//! The gateway's TOML config (`deploy/local/gateway.toml`, env prefix `GATEWAY`).
//!
//! Sections: `[server]` listeners, threads and upgrade files; `[redis]` the cluster that
//! feeds activities, sold-out flags and bans; `[upstreams]` stockd/orderd and deadlines;
//! `[auth]` JWT and purchase tokens; `[limits]` token buckets; `[bans]` CIDR lists,
//! trusted proxies, auto-ban; `[admission]` the in-flight cap; `[protection]` header,
//! body and read-deadline limits; `[dev]` the dev-only token endpoint.
//!
//! On SIGHUP the file is read again and `[limits]`, `[bans]`, `[admission]` and
//! `[protection]` take effect without dropping connections ([`Policy`]); the other
//! sections need a restart (or a graceful upgrade).

use ipnet::IpNet;
use seckill_daemon::config::{ensure, ensure_range, FieldError, LogSection, Validate};
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

/// stockd and orderd over gRPC.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstreams {
    /// stockd gRPC URL, for example `http://127.0.0.1:50051`. Required.
    pub stockd: String,
    /// orderd gRPC URL, for example `http://127.0.0.1:50052`. Required.
    pub orderd: String,
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
}

/// JWT verification and purchase tokens.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    /// `HS256`, `RS256` or `ES256`. Default `HS256`.
    #[serde(default = "d_alg")]
    pub jwt_alg: String,
    /// HS256 shared secret (at least 16 bytes). Required for HS256; never logged.
    #[serde(default)]
    pub jwt_secret: String,
    /// PEM public key file for RS256/ES256.
    #[serde(default)]
    pub jwt_public_key_path: String,
    /// Clock skew allowed on `exp`, seconds. Default 5.
    #[serde(default = "d_leeway")]
    pub jwt_leeway_secs: u64,
    /// HMAC-SHA256 key of purchase tokens (at least 16 bytes). Required; never logged.
    pub purchase_token_secret: String,
    /// Lifetime of a purchase token, seconds. Default 60.
    #[serde(default = "d_pt_ttl")]
    pub purchase_token_ttl_secs: u64,
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
fn d_alg() -> String {
    "HS256".into()
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

fn check_bucket(b: &Bucket, field: &str) -> Result<(), FieldError> {
    ensure(
        b.rate.is_finite() && b.rate > 0.0,
        &format!("{field}.rate"),
        "must be a positive number of tokens per second",
    )?;
    ensure(
        b.burst.is_finite() && b.burst >= 1.0,
        &format!("{field}.burst"),
        "must be at least 1",
    )
}

fn check_cidrs(list: &[String], field: &str) -> Result<(), FieldError> {
    for (i, c) in list.iter().enumerate() {
        ensure(
            parse_cidr(c).is_some(),
            &format!("{field}[{i}]"),
            format!("`{c}` is not an IP address or CIDR"),
        )?;
    }
    Ok(())
}

/// An IP (as a /32 or /128) or a CIDR.
pub fn parse_cidr(s: &str) -> Option<IpNet> {
    let s = s.trim();
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(IpNet::from))
}

fn check_url(u: &str, field: &str) -> Result<(), FieldError> {
    ensure(
        (u.starts_with("http://") || u.starts_with("https://")) && u.parse::<http::Uri>().is_ok(),
        field,
        "must be an http:// or https:// URL",
    )
}

fn check_addr(a: &str, field: &str) -> Result<(), FieldError> {
    ensure(
        a.rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()),
        field,
        "must be host:port",
    )
}

fn bad_pem(field: &str, path: &str, e: &pingora::Error) -> FieldError {
    FieldError::new(
        field,
        format!("`{path}` is not valid PEM: {}", e.root_cause()),
    )
}

/// The TLS listener's certificate chain and key, loaded the way pingora's rustls acceptor
/// loads them when the listener starts (where a bad file is a panic, not an error): each
/// file readable and holding PEM of the right kind, and the key the certificate's.
fn check_tls_files(cert_path: &str, key_path: &str) -> Result<(), FieldError> {
    use pingora::tls;
    const CERT: &str = "server.tls_cert_path";
    const KEY: &str = "server.tls_key_path";
    let readable = |path: &str, field: &str| {
        std::fs::read(path)
            .map(drop)
            .map_err(|e| FieldError::new(field, format!("cannot read `{path}`: {e}")))
    };
    readable(cert_path, CERT)?;
    readable(key_path, KEY)?;
    let first_cert =
        tls::load_pem_file_ca(&cert_path.to_string()).map_err(|e| bad_pem(CERT, cert_path, &e))?;
    ensure(
        !first_cert.is_empty(),
        CERT,
        format!("`{cert_path}` holds no PEM certificate (BEGIN CERTIFICATE)"),
    )?;
    let key = tls::load_pem_file_private_key(&key_path.to_string())
        .map_err(|e| bad_pem(KEY, key_path, &e))?;
    ensure(
        !key.is_empty(),
        KEY,
        format!("`{key_path}` holds no PEM private key (PKCS#8, PKCS#1 or SEC1)"),
    )?;
    let Ok(Some((chain, key))) = tls::load_certs_and_key_files(cert_path, key_path) else {
        return Err(FieldError::new(
            KEY,
            format!("`{key_path}` holds no private key of a kind rustls loads"),
        ));
    };
    // The same provider pingora installs before it builds the listener (ring).
    tls::install_default_crypto_provider();
    tls::ServerConfig::builder_with_protocol_versions(&[&tls::version::TLS12, &tls::version::TLS13])
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map(drop)
        .map_err(|e| {
            FieldError::new(
                KEY,
                format!("`{key_path}` is not usable with the certificate in `{cert_path}`: {e}"),
            )
        })
}

impl Validate for Config {
    const RENAMED: &'static [(&'static str, &'static str)] = &[
        ("server.admin_listen", "admin.listen"),
        ("server.json_logs", "log.json"),
    ];

    fn validate(&self) -> Result<(), FieldError> {
        let s = &self.server;
        ensure(
            !s.listen.is_empty() || !s.tls_listen.is_empty(),
            "server.listen",
            "needs at least one address",
        )?;
        for (i, a) in s.listen.iter().enumerate() {
            check_addr(a, &format!("server.listen[{i}]"))?;
        }
        ensure_range(s.threads, 1..=256, "server.threads")?;
        check_addr(&self.admin.listen, "admin.listen")?;
        if !s.tls_listen.is_empty() {
            check_addr(&s.tls_listen, "server.tls_listen")?;
            ensure(
                !s.tls_cert_path.is_empty(),
                "server.tls_cert_path",
                "required with tls_listen",
            )?;
            ensure(
                !s.tls_key_path.is_empty(),
                "server.tls_key_path",
                "required with tls_listen",
            )?;
            check_tls_files(&s.tls_cert_path, &s.tls_key_path)?;
        }
        ensure(
            !s.pid_file.is_empty(),
            "server.pid_file",
            "must not be empty",
        )?;
        ensure(
            !s.upgrade_sock.is_empty(),
            "server.upgrade_sock",
            "must not be empty",
        )?;

        let r = &self.redis;
        ensure(
            !r.nodes.is_empty(),
            "redis.nodes",
            "needs at least one node",
        )?;
        for (i, n) in r.nodes.iter().enumerate() {
            check_addr(n, &format!("redis.nodes[{i}]"))?;
        }
        ensure(
            r.refresh_ms >= 50,
            "redis.refresh_ms",
            "must be at least 50",
        )?;
        ensure(
            r.stock_poll_ms >= 10,
            "redis.stock_poll_ms",
            "must be at least 10",
        )?;
        ensure(r.timeout_ms >= 1, "redis.timeout_ms", "must be at least 1")?;

        let u = &self.upstreams;
        check_url(&u.stockd, "upstreams.stockd")?;
        check_url(&u.orderd, "upstreams.orderd")?;
        ensure(
            !u.service_token.is_empty() && u.service_token.bytes().all(|b| b.is_ascii_graphic()),
            "upstreams.service_token",
            "must be non-empty printable ASCII",
        )?;
        ensure(
            u.connect_timeout_ms >= 1,
            "upstreams.connect_timeout_ms",
            "must be at least 1",
        )?;
        ensure(
            u.reserve_deadline_ms >= 1,
            "upstreams.reserve_deadline_ms",
            "must be at least 1",
        )?;
        ensure(
            u.order_deadline_ms >= 1,
            "upstreams.order_deadline_ms",
            "must be at least 1",
        )?;

        let a = &self.auth;
        match a.jwt_alg.as_str() {
            "HS256" => ensure(
                a.jwt_secret.len() >= 16,
                "auth.jwt_secret",
                "must be at least 16 bytes for HS256",
            )?,
            "RS256" | "ES256" => {
                ensure(
                    !a.jwt_public_key_path.is_empty(),
                    "auth.jwt_public_key_path",
                    "required for RS256 and ES256",
                )?;
                let pem = std::fs::read(&a.jwt_public_key_path).map_err(|e| {
                    FieldError::new("auth.jwt_public_key_path", format!("cannot read: {e}"))
                })?;
                let ok = if a.jwt_alg == "RS256" {
                    jsonwebtoken::DecodingKey::from_rsa_pem(&pem).is_ok()
                } else {
                    jsonwebtoken::DecodingKey::from_ec_pem(&pem).is_ok()
                };
                ensure(
                    ok,
                    "auth.jwt_public_key_path",
                    format!("not a PEM {} public key", a.jwt_alg),
                )?;
            }
            other => {
                return Err(FieldError::new(
                    "auth.jwt_alg",
                    format!("`{other}` is not one of HS256, RS256, ES256"),
                ))
            }
        }
        ensure(
            a.purchase_token_secret.len() >= 16,
            "auth.purchase_token_secret",
            "must be at least 16 bytes",
        )?;
        ensure_range(
            a.purchase_token_ttl_secs,
            1..=86_400,
            "auth.purchase_token_ttl_secs",
        )?;

        let l = &self.limits;
        check_bucket(&l.per_ip, "limits.per_ip")?;
        check_bucket(&l.per_user, "limits.per_user")?;
        for (name, b) in &l.routes {
            ensure(
                crate::routes::RouteClass::from_name(name).is_some(),
                &format!("limits.routes.{name}"),
                "unknown route (token, reserve, orders, activities, payments, dev)",
            )?;
            check_bucket(b, &format!("limits.routes.{name}"))?;
        }
        ensure(
            l.max_tracked >= 1024,
            "limits.max_tracked",
            "must be at least 1024",
        )?;
        ensure(
            l.idle_evict_secs >= 1,
            "limits.idle_evict_secs",
            "must be at least 1",
        )?;

        let b = &self.bans;
        check_cidrs(&b.deny, "bans.deny")?;
        check_cidrs(&b.allow, "bans.allow")?;
        check_cidrs(&b.trusted_proxies, "bans.trusted_proxies")?;
        if b.auto_ban_threshold > 0 {
            ensure(
                b.auto_ban_window_secs >= 1,
                "bans.auto_ban_window_secs",
                "must be at least 1",
            )?;
            ensure(
                b.auto_ban_ttl_secs >= 1,
                "bans.auto_ban_ttl_secs",
                "must be at least 1",
            )?;
        }

        ensure(
            self.admission.k.is_finite() && self.admission.k > 0.0,
            "admission.k",
            "must be a positive number",
        )?;

        let p = &self.protection;
        ensure_range(p.max_header_count, 1..=256, "protection.max_header_count")?;
        ensure(
            p.max_header_bytes >= 256,
            "protection.max_header_bytes",
            "must be at least 256",
        )?;
        ensure(
            p.max_body_bytes >= 64,
            "protection.max_body_bytes",
            "must be at least 64",
        )?;
        ensure(
            p.request_read_ms >= 10,
            "protection.request_read_ms",
            "must be at least 10",
        )?;

        if self.dev.enabled {
            ensure(
                a.jwt_alg == "HS256",
                "dev.enabled",
                "the dev token endpoint signs HS256 JWTs: needs auth.jwt_alg = \"HS256\"",
            )?;
            ensure(
                self.dev.token_ttl_secs >= 1,
                "dev.token_ttl_secs",
                "must be at least 1",
            )?;
        }
        Ok(())
    }
}

/// Loads and validates a file with `GATEWAY__*` overrides.
pub fn load(path: &std::path::Path) -> Result<Config, seckill_daemon::config::ConfigError> {
    seckill_daemon::config::load(path, ENV_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const MINIMAL: &str = r#"
[redis]
nodes = ["127.0.0.1:7001"]
[upstreams]
stockd = "http://127.0.0.1:50051"
orderd = "http://127.0.0.1:50052"
service_token = "t"
[auth]
jwt_secret = "0123456789abcdef0123"
purchase_token_secret = "fedcba9876543210fedc"
"#;

    fn load(text: &str) -> Result<Config, seckill_daemon::config::ConfigError> {
        seckill_daemon::config::load_str(text, "g.toml", ENV_PREFIX, Vec::new())
    }

    #[test]
    fn a_minimal_file_loads_with_defaults() {
        let c = load(MINIMAL).unwrap();
        assert_eq!(c.server.threads, 1);
        assert_eq!(c.limits.per_ip.burst, 40.0);
        assert!(!c.dev.enabled);
        assert_eq!(c.dev.token_ttl_secs, 3600);
    }

    #[test]
    fn a_bad_cidr_is_named() {
        let e = load(&format!(
            "{MINIMAL}[bans]\ndeny = [\"10.0.0.0/8\", \"nope\"]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("g.toml: bans.deny[1]:"), "{e}");
    }

    #[test]
    fn a_short_secret_and_an_unknown_route_are_refused() {
        let e = load(&MINIMAL.replace("0123456789abcdef0123", "short"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("auth.jwt_secret"), "{e}");
        let e = load(&format!(
            "{MINIMAL}[limits.routes]\nwhatever = {{ rate = 1.0, burst = 1.0 }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("limits.routes.whatever"), "{e}");
    }

    /// MINIMAL with a TLS listener on `cert` and `key`.
    fn with_tls(cert: &std::path::Path, key: &std::path::Path) -> String {
        format!(
            "[server]\ntls_listen = \"127.0.0.1:8443\"\ntls_cert_path = \"{}\"\ntls_key_path = \"{}\"\n{MINIMAL}",
            cert.display(),
            key.display()
        )
    }

    #[test]
    fn tls_files_are_loaded_by_validation_and_a_bad_one_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let one = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        let cert = write("cert.pem", &one.cert.pem());
        let key = write("key.pem", &one.signing_key.serialize_pem());
        let other_key = write("other.pem", &other.serialize_pem());
        let garbage = write("garbage.pem", "not pem at all\n");

        let c = load(&with_tls(&cert, &key)).unwrap();
        assert_eq!(c.server.tls_listen, "127.0.0.1:8443");

        for (cert, key, field, says) in [
            (
                &cert,
                &dir.join("missing.pem"),
                "server.tls_key_path",
                "cannot read",
            ),
            (
                &dir.join("missing.pem"),
                &key,
                "server.tls_cert_path",
                "cannot read",
            ),
            (&garbage, &key, "server.tls_cert_path", "no PEM certificate"),
            (&key, &key, "server.tls_cert_path", "no PEM certificate"),
            (&cert, &garbage, "server.tls_key_path", "no PEM private key"),
            (&cert, &cert, "server.tls_key_path", "no PEM private key"),
            (
                &cert,
                &other_key,
                "server.tls_key_path",
                "not usable with the certificate",
            ),
            (&cert, &dir, "server.tls_key_path", "cannot read"),
        ] {
            let e = load(&with_tls(cert, key)).unwrap_err().to_string();
            assert!(e.starts_with(&format!("g.toml: {field}: ")), "{e}");
            assert!(e.contains(says), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let e = load(&with_tls(&cert, std::path::Path::new("")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("server.tls_key_path: required with tls_listen"),
            "{e}"
        );
    }

    #[test]
    fn dev_tokens_need_hs256() {
        let e = load(&format!(
            "{}[dev]\nenabled = true\n",
            MINIMAL.replace(
                "[auth]",
                "[auth]\njwt_alg = \"RS256\"\njwt_public_key_path = \"/nonexistent\""
            )
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("auth.jwt_public_key_path"), "{e}");
    }
}
