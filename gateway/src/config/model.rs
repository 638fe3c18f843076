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
    #[serde(default)]
    pub challenge: Challenge,
    /// `[room]`: the waiting room (`fair/room/config.rs`).
    #[serde(default)]
    pub room: crate::fair::room::RoomConfig,
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
    /// bucket empty, item sold out) and the challenge issue (while the activity's room
    /// needs no admission token) straight from the socket, before pingora builds a
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

/// The Redis Cluster that feeds activities, sold-out flags and bans, and the named
/// clusters that hold the stock of the activities placed on them. The gateway never
/// touches Redis on the request path.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redis {
    /// Seed nodes `host:port` (any subset of the cluster) of the default cluster: the
    /// fleet's control plane (catalog, bans, rooms, challenges, fleet budgets) and the
    /// stock of every activity not placed elsewhere. Required.
    pub nodes: Vec<String>,
    /// Named clusters (`[redis.clusters.<name>]`, each with its own `nodes`) an
    /// activity's `redis_cluster` can place its stock on (shard stock, buyers, sold-out
    /// flags and messages): the gateway reads that stock there. Every other `[redis]`
    /// setting applies to them too. An activity naming a cluster missing here gets no
    /// sold-out short-circuit (stockd answers its requests). Default: none.
    #[serde(default)]
    pub clusters: seckill_daemon::config::NamedClusters,
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
    /// Shard stock keys read per poll, per cluster, for the items nobody asked this
    /// gateway about in the last `sold_out::HOT_MS` (10 s): they are read in turn, this
    /// many keys a poll, so an idle gateway's Redis reads do not grow with the number of
    /// live activities. Items with recent requests, items never read, and items a
    /// sold-out message named are read in full on every poll. Default 256.
    #[serde(default = "d_stock_poll_idle_keys")]
    pub stock_poll_idle_keys: u32,
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
    /// Reservations to stockd on one long-lived `StockService.ReserveStream` per
    /// gateway thread and stockd endpoint (true): what queued goes out as one message
    /// as soon as the thread gets to it, and each reservation is answered when its own
    /// Redis call is done. False: `ReserveBatch` calls, `reserve_batch_inflight` at a
    /// time, each answered when its slowest entry is (the path before streams; also
    /// taken by itself with a stockd that does not serve streams). Default true.
    #[serde(default = "yes")]
    pub reserve_stream: bool,
    /// Most reservations in one message of the stream, or one `ReserveBatch` call, to
    /// one stockd endpoint (1..=1024). A lone reservation goes at once, alone (no
    /// timer). 1 turns batching off: one unary `Reserve` per reservation. Default 256.
    #[serde(default = "d_reserve_batch_max")]
    pub reserve_batch_max: usize,
    /// `ReserveBatch` calls one gateway thread keeps in flight to one stockd endpoint
    /// (1..=64), when not on a stream: what arrives while they are out queues and goes
    /// together in the next call. Fewer means larger batches (less CPU per reservation
    /// on both ends) and more queueing; more means smaller batches. Default 2.
    #[serde(default = "d_reserve_batch_inflight")]
    pub reserve_batch_inflight: usize,
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
    /// Share the per-user and per-route buckets and the admission cap with the other
    /// gateways through Redis, so that they hold for the fleet together rather than
    /// once per gateway (docs/gateway.md, "Budgets shared by the fleet"). Requests
    /// still decide on local state only; a background task reconciles every
    /// `sync_ms`. Default false (each gateway enforces the numbers on its own).
    pub fleet: bool,
    /// Gateways in the fleet (>= 1). While Redis cannot be reached, each gateway falls
    /// back to rate / `fleet_size` and burst / `fleet_size` (and the admission cap /
    /// `fleet_size`). Default 1.
    pub fleet_size: u32,
    /// Milliseconds between two reconciliations with Redis (10..=10000): the bound of
    /// the fleet's overshoot is about `fleet_size` × rate × `sync_ms`. Default 100.
    pub sync_ms: u64,
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
            fleet: false,
            fleet_size: 1,
            sync_ms: 100,
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
    /// With `limits.fleet`: slots a gateway asks for beyond its calls in flight at each
    /// lease (1..=100000); an idle gateway keeps at most min(`lease_slice`, cap /
    /// `limits.fleet_size`). Default 8.
    pub lease_slice: u32,
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            k: 2.0,
            min_in_flight: 4,
            lease_slice: 8,
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

/// `[challenge]`: the proof-of-work puzzle before a purchase token (`fair/challenge.rs`,
/// docs/gateway.md "Proof-of-work challenge"). Read at start and on SIGHUP.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Challenge {
    /// Master switch: false turns the challenge off for every activity, whatever its
    /// `challenge_bits`. Default true.
    pub enabled: bool,
    /// Leading zero bits per sub-puzzle for EVERY activity instead of its own
    /// `challenge_bits` (0 turns it off everywhere); unset: each activity decides.
    /// 0..=`max_bits`. Default unset.
    pub bits_override: Option<u32>,
    /// Bits for an activity whose Redis meta hash has no `challenge_bits` field
    /// (published before the field existed). Default 0 (off).
    pub default_bits: u32,
    /// Sub-puzzles per puzzle (1..=256): many small ones make the solve time vary
    /// little. Expected work: `sub_puzzles × 2^bits` SHA-256 hashes. Default 32.
    pub sub_puzzles: u32,
    /// Lifetime of a puzzle, seconds (10..=3600): issue to redeem. Default 120.
    pub ttl_secs: u64,
    /// Ceiling of the live raises (failures per IP, the activity hook), in bits per
    /// sub-puzzle (1..=24); an activity set higher keeps its own setting, never more.
    /// Default 16 (32 × 2^16 ≈ 2.1 M hashes: a few seconds on a mid-range phone).
    pub max_bits: u32,
    /// Refused redeems (tampered, unsolved, wrong user or item, missing) from one IP
    /// within `failure_window_secs` that add one bit to that IP's puzzles; 0 disables
    /// the raise. Default 5.
    pub raise_after_failures: u32,
    /// The window of `raise_after_failures`, seconds (>= 1). Default 60.
    pub failure_window_secs: u64,
    /// The waiting room's queue raises its activity's puzzles: one bit more once
    /// `queued_per_bit` buyers queue, two at 3×, three at 7× (a bit per doubling),
    /// still bounded by `max_bits`; 0 disables it. Default 0.
    pub queued_per_bit: u64,
    /// Signing keys, `{ id, secret }` or `{ id, secret_file }`: the first signs, every
    /// one verifies (rotation: put the new key first, drop the old one a `ttl_secs`
    /// later). Every gateway of a fleet must list the same keys. Empty: a random key
    /// per process (a single gateway only; a warning is logged). Default empty.
    pub keys: Vec<ChallengeKey>,
}

impl Default for Challenge {
    fn default() -> Self {
        Self {
            enabled: true,
            bits_override: None,
            default_bits: 0,
            sub_puzzles: 32,
            ttl_secs: 120,
            max_bits: 16,
            raise_after_failures: 5,
            failure_window_secs: 60,
            queued_per_bit: 0,
            keys: Vec::new(),
        }
    }
}

/// One key of `challenge.keys`.
#[derive(Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChallengeKey {
    /// Key id written into each puzzle: 1..=32 of `A-Z a-z 0-9 _ -`, unique. Required.
    pub id: String,
    /// HMAC-SHA256 secret, at least 16 bytes. Never logged. Give this or `secret_file`.
    #[serde(default)]
    pub secret: String,
    /// A file holding the secret (trailing newline ignored), at least 16 bytes; read
    /// at start and on SIGHUP. Give this or `secret`.
    #[serde(default)]
    pub secret_file: String,
}

impl ChallengeKey {
    /// The secret, from `secret` or `secret_file`.
    pub fn secret_bytes(&self) -> Result<Vec<u8>, String> {
        let bytes = match (self.secret.is_empty(), self.secret_file.is_empty()) {
            (false, true) => self.secret.as_bytes().to_vec(),
            (true, false) => {
                let mut b = std::fs::read(&self.secret_file)
                    .map_err(|e| format!("secret_file `{}`: {e}", self.secret_file))?;
                while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
                    b.pop();
                }
                b
            }
            _ => return Err("give exactly one of secret and secret_file".into()),
        };
        if bytes.len() < 16 {
            return Err("the secret must be at least 16 bytes".into());
        }
        Ok(bytes)
    }
}

impl std::fmt::Debug for ChallengeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChallengeKey")
            .field("id", &self.id)
            .field("secret_file", &self.secret_file)
            .finish_non_exhaustive()
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
fn d_stock_poll_idle_keys() -> u32 {
    256
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
fn d_reserve_batch_max() -> usize {
    256
}
fn d_reserve_batch_inflight() -> usize {
    2
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
