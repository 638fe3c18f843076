//! orderd's config file (`deploy/local/orderd.toml`), loaded by
//! [`seckill_daemon::config::load`]: TOML, then `ORDERD__SECTION__FIELD` environment
//! overrides, then [`Validate`]. Unknown keys are errors. Every field is documented
//! with its meaning, unit and default; `docs/orderd.md` repeats them.
//!
//! (Over 400 lines: seven sections, every field documented (meaning, unit, default), with
//! validation and tests beside them.)

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

use seckill_daemon::config::{
    ensure, ensure_clusters, ensure_host_port, ensure_nodes, ensure_range, AdminSection,
    ConfigError, FieldError, LogSection, NamedClusters, Validate,
};

/// Environment override prefix: `ORDERD__MYSQL__URL=mysql://...`.
pub const ENV_PREFIX: &str = "ORDERD";

/// The whole file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The gRPC port (OrderService, health, reflection).
    pub grpc: GrpcConfig,
    /// The loopback admin port (`/metrics`, `/healthz`). Optional; default none.
    #[serde(default)]
    pub admin: AdminSection,
    /// Redis Cluster endpoints and timeouts.
    pub redis: RedisConfig,
    /// MySQL (MariaDB), the record of orders and stock.
    pub mysql: MysqlConfig,
    /// Stream consumers: batching, claiming, dead letters, back-off.
    #[serde(default)]
    pub consumer: ConsumerConfig,
    /// Payment: deadline, timeout sweep, provider callback check, dev path.
    pub payment: PaymentConfig,
    /// The stock-return outbox relay.
    #[serde(default)]
    pub outbox: OutboxConfig,
    /// Logging.
    #[serde(default)]
    pub log: LogSection,
}

/// `[grpc]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcConfig {
    /// Listen address, `host:port`. Default `127.0.0.1:50052`.
    #[serde(default = "default_grpc_listen")]
    pub listen: String,
    /// Dev shortcut: one bearer token with every scope (the caller `service`). Empty
    /// (the default) for none; then `callers` must name at least one caller. Never
    /// logged. Production gives each caller its own token and scopes in `callers`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_token: String,
    /// The callers of OrderService, each `{ name, token, scopes }`; `scopes` from
    /// `reserve`, `read`, `pay`, `admin` (which RPC needs which: docs/orderd.md). Tokens
    /// at least 16 bytes, unique, never logged. Default none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callers: Vec<seckill_proto::auth::CallerConfig>,
    /// How long in-flight calls and the batch in hand may finish after a shutdown
    /// signal, in ms. Default 5000.
    #[serde(default = "default_drain_ms")]
    pub drain_ms: u64,
    /// Longest life of one `WatchOrder` stream, in seconds; it ends earlier on a
    /// final state. Default 300.
    #[serde(default = "default_watch_max_secs")]
    pub watch_max_secs: u64,
    /// How often a `WatchOrder` stream re-reads the order, in ms. Default 200.
    #[serde(default = "default_watch_poll_ms")]
    pub watch_poll_ms: u64,
    /// `[grpc.tls]`: serve gRPC over TLS, mutual TLS when it names `client_ca_path`
    /// (fields: docs/orderd.md). The files are read and checked on every load, `-t`
    /// included. Absent (the default): plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<seckill_daemon::tls::ServerTls>,
}

/// `[redis]`: the default Redis Cluster and, optionally, named ones. Every cluster is
/// connected in the background (the first connection retried like any reconnection), so
/// one that is down at start neither stops orderd nor holds up the others.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// Nodes of the default cluster, `host:port`; one is enough, the rest are discovered.
    /// Required. It holds the activities whose `redis_cluster` is empty or `default`,
    /// and the dead-letter stream `sk:dlq`.
    pub nodes: Vec<String>,
    /// Named Redis Clusters (`[redis.clusters.<name>]`, each with its own `nodes`) that an
    /// activity's `redis_cluster` can place its stock on: a hot sale on Redis nodes of its
    /// own. orderd consumes that activity's streams, releases its units and reads its
    /// buyer records there. Names: 1..=32 of `a-z 0-9 _ -`, not `default`. Every other
    /// `[redis]` setting (timeouts) applies to them too. Default: none (every activity
    /// on the default cluster). An activity naming a cluster missing here is skipped
    /// with a warning and counted by `orderd_unknown_cluster_activities`.
    #[serde(default, skip_serializing_if = "NamedClusters::is_empty")]
    pub clusters: NamedClusters,
    /// Deadline of one Redis command, in ms. Default 1000.
    #[serde(default = "default_redis_timeout_ms")]
    pub timeout_ms: u64,
    /// Deadline of connecting to a node, in ms. Default 2000.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Replicas that must hold a stock return (the RELEASE script's writes) before its
    /// outbox row is marked done: `WAIT` on a connection the relay has to itself. A
    /// return without them stays pending and is released again next pass (the retry
    /// finds the record gone on the master, writes the fence, and waits again), so a
    /// failover to a replica that never received the release does not lose the unit.
    /// 0: done once the master has it, unsafe with replicas; right only for a
    /// masters-only Redis. 0..=5. Default 1.
    #[serde(default = "default_replica_acks")]
    pub replica_acks: u32,
    /// How long one release waits for `replica_acks` replicas, in ms; below
    /// `timeout_ms`. 1..=10000. Default 100.
    #[serde(default = "default_replica_ack_timeout_ms")]
    pub replica_ack_timeout_ms: u64,
}

/// `[mysql]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlConfig {
    /// `mysql://user:password@host:port/database`. Required; never logged.
    pub url: String,
    /// Largest number of pooled connections. Default 16.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// How long to wait for a pooled connection (and to connect), in ms. Default 2000.
    #[serde(default = "default_acquire_timeout_ms")]
    pub acquire_timeout_ms: u64,
}

/// `[consumer]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    /// Consumer group on every `sk:{a:i}:orders` stream. Default `orderd`.
    #[serde(default = "default_group")]
    pub group: String,
    /// This process's consumer name in the group. Default `<hostname>-<pid>`, so a
    /// restarted process is a new consumer and its predecessor's pending entries are
    /// claimed after `claim_idle_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Entries read per stream per batch (one MySQL transaction). Default 500.
    #[serde(default = "default_batch_size")]
    pub batch_size: u64,
    /// How long a consumer waits before polling an empty stream again, in ms.
    /// Default 50. (Reads do not use `BLOCK`: a blocked read would hold the shared
    /// connection to that node.)
    #[serde(default = "default_block_ms")]
    pub block_ms: u64,
    /// How long a consumer holds a batch of new entries smaller than `batch_size`
    /// before writing it, in ms: it then reads what arrived meanwhile and writes both
    /// in one MySQL transaction (Kafka's `linger.ms`). A sale's opening adds entries a
    /// few at a time to every stream; written as they come, each becomes a
    /// transaction of its own on the item's hot stock row, and MySQL's and orderd's
    /// work lands in the very second the edge and stockd answer the crowd. Orders stay
    /// `QUEUED` (served from Redis) that much longer. 0 writes at once. Default 500;
    /// at most `claim_idle_ms / 4`.
    #[serde(default = "default_linger_ms")]
    pub linger_ms: u64,
    /// Wake idle consumers on `XADD` instead of polling them: orderd adds the flags
    /// `Et` to `notify-keyspace-events` on every primary (`CONFIG SET`) and subscribes
    /// to `__keyevent@0__:xadd` there. Idle streams then cost nothing but their claim
    /// pass. False (or a node refusing `CONFIG`): poll every `block_ms`. Default true.
    #[serde(default = "default_true")]
    pub keyspace_events: bool,
    /// Entries pending (delivered, not acknowledged) longer than this, in ms, are
    /// claimed with `XAUTOCLAIM` and retried: a dead consumer's, or one that failed.
    /// Default 30000.
    #[serde(default = "default_claim_idle_ms")]
    pub claim_idle_ms: u64,
    /// The step of the clean-stream sweep, in ms (with `keyspace_events`): a stream
    /// whose group has nothing pending sleeps until an `XADD` wakes it, and the sweep
    /// wakes one such stream per step, in turn, for a claim pass and a read (the net for
    /// anything the wake-ups cannot see). An idle orderd sends about three stream
    /// commands per step whatever the number of streams; each stream is visited every
    /// `streams × clean_sweep_ms`. Default 50 (8,000 streams: every 400 s).
    #[serde(default = "default_clean_sweep_ms")]
    pub clean_sweep_ms: u64,
    /// An entry delivered more than this many times goes to the dead letters
    /// (`dead_letters` table and `sk:dlq` stream). Default 5.
    #[serde(default = "default_max_deliveries")]
    pub max_deliveries: u64,
    /// First back-off after a failed batch (MySQL or Redis down), in ms; doubled
    /// per failure up to `backoff_cap_ms`. Default 100.
    #[serde(default = "default_backoff_base_ms")]
    pub backoff_base_ms: u64,
    /// Longest back-off, in ms. Default 5000.
    #[serde(default = "default_backoff_cap_ms")]
    pub backoff_cap_ms: u64,
    /// How often published activities are re-read from MySQL to find new streams,
    /// in ms. Default 2000.
    #[serde(default = "default_discovery_ms")]
    pub discovery_interval_ms: u64,
}

/// `[payment]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentConfig {
    /// Time an order may stay unpaid before it is cancelled and its unit returned,
    /// in seconds. Default 900 (15 min).
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// How often the timeout sweep looks for expired pending orders, in ms.
    /// Default 1000.
    #[serde(default = "default_sweep_ms")]
    pub sweep_interval_ms: u64,
    /// HMAC-SHA256 secret the payment provider signs callbacks with. Required,
    /// at least 16 bytes; never logged.
    pub callback_secret: String,
    /// A callback whose `timestamp_ms` is further than this from now is refused as
    /// stale, in seconds. Default 300.
    #[serde(default = "default_freshness_secs")]
    pub freshness_window_secs: u64,
    /// Whether `Pay` (the dev payment path, no provider) is served. Default false.
    #[serde(default)]
    pub dev_pay_enabled: bool,
}

/// `[outbox]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// How often the relay returns pending stock-return rows to Redis, in ms.
    /// Default 200.
    #[serde(default = "default_relay_ms")]
    pub relay_interval_ms: u64,
    /// Rows relayed per pass. Default 200.
    #[serde(default = "default_relay_batch")]
    pub relay_batch: u32,
}

fn default_grpc_listen() -> String {
    "127.0.0.1:50052".into()
}
fn default_drain_ms() -> u64 {
    5000
}
fn default_watch_max_secs() -> u64 {
    300
}
fn default_watch_poll_ms() -> u64 {
    200
}
fn default_redis_timeout_ms() -> u64 {
    1000
}
fn default_connect_timeout_ms() -> u64 {
    2000
}
fn default_replica_acks() -> u32 {
    1
}
fn default_replica_ack_timeout_ms() -> u64 {
    100
}
fn default_max_connections() -> u32 {
    16
}
fn default_acquire_timeout_ms() -> u64 {
    2000
}
fn default_group() -> String {
    "orderd".into()
}
fn default_batch_size() -> u64 {
    500
}
fn default_block_ms() -> u64 {
    50
}
fn default_linger_ms() -> u64 {
    500
}
fn default_true() -> bool {
    true
}
fn default_claim_idle_ms() -> u64 {
    30_000
}
fn default_clean_sweep_ms() -> u64 {
    50
}
fn default_max_deliveries() -> u64 {
    5
}
fn default_backoff_base_ms() -> u64 {
    100
}
fn default_backoff_cap_ms() -> u64 {
    5000
}
fn default_discovery_ms() -> u64 {
    2000
}
fn default_timeout_secs() -> u64 {
    900
}
fn default_sweep_ms() -> u64 {
    1000
}
fn default_freshness_secs() -> u64 {
    300
}
fn default_relay_ms() -> u64 {
    200
}
fn default_relay_batch() -> u32 {
    200
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            group: default_group(),
            name: None,
            batch_size: default_batch_size(),
            block_ms: default_block_ms(),
            linger_ms: default_linger_ms(),
            keyspace_events: true,
            claim_idle_ms: default_claim_idle_ms(),
            clean_sweep_ms: default_clean_sweep_ms(),
            max_deliveries: default_max_deliveries(),
            backoff_base_ms: default_backoff_base_ms(),
            backoff_cap_ms: default_backoff_cap_ms(),
            discovery_interval_ms: default_discovery_ms(),
        }
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            relay_interval_ms: default_relay_ms(),
            relay_batch: default_relay_batch(),
        }
    }
}

impl Config {
    /// Loads `path` with `ORDERD__*` overrides from the environment, validated.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        seckill_daemon::config::load(path, ENV_PREFIX)
    }

    /// Loads from text (tests), with overrides from `env`.
    pub fn load_str(
        text: &str,
        origin: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        seckill_daemon::config::load_str(text, origin, ENV_PREFIX, env)
    }

    /// A config for tests: port 0 (the caller binds), the given Redis nodes, MySQL
    /// URL and service token; dev pay on; short claim, sweep and relay intervals.
    pub fn for_test(redis_nodes: Vec<String>, mysql_url: &str, token: &str) -> Self {
        Self {
            grpc: GrpcConfig {
                listen: "127.0.0.1:0".into(),
                service_token: token.into(),
                callers: Vec::new(),
                drain_ms: 2000,
                watch_max_secs: 60,
                watch_poll_ms: 100,
                tls: None,
            },
            admin: AdminSection::default(),
            redis: RedisConfig {
                nodes: redis_nodes,
                clusters: NamedClusters::new(),
                timeout_ms: 2000,
                connect_timeout_ms: 2000,
                // Masters-only clusters, as most tests start; a test of a replicated
                // cluster sets it.
                replica_acks: 0,
                replica_ack_timeout_ms: 1000,
            },
            mysql: MysqlConfig {
                url: mysql_url.into(),
                max_connections: 16,
                acquire_timeout_ms: 2000,
            },
            consumer: ConsumerConfig {
                name: Some(format!("test-{}", rand::random::<u32>())),
                block_ms: 20,
                // Short: tests shorten claim_idle_ms down to 100 (linger <= claim / 4).
                linger_ms: 20,
                keyspace_events: true,
                claim_idle_ms: 2000,
                backoff_base_ms: 50,
                backoff_cap_ms: 1000,
                discovery_interval_ms: 200,
                ..ConsumerConfig::default()
            },
            payment: PaymentConfig {
                timeout_secs: 900,
                sweep_interval_ms: 100,
                callback_secret: "test-callback-secret-0123456789".into(),
                freshness_window_secs: 300,
                dev_pay_enabled: true,
            },
            outbox: OutboxConfig {
                relay_interval_ms: 50,
                relay_batch: 200,
            },
            log: LogSection::default(),
        }
    }

    /// The config as a TOML file (tests write it for a child process).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the config serializes")
    }

    /// This process's consumer name: the configured one, or `<hostname>-<pid>`.
    pub fn consumer_name(&self) -> String {
        self.consumer.name.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .or_else(|| std::env::var("HOSTNAME").ok())
                .unwrap_or_else(|| "orderd".into());
            format!("{host}-{}", std::process::id())
        })
    }

    pub fn payment_timeout(&self) -> Duration {
        Duration::from_secs(self.payment.timeout_secs)
    }
}

impl Validate for Config {
    const RENAMED: &'static [(&'static str, &'static str)] =
        &[("mysql.pool_max", "mysql.max_connections")];

    fn validate(&self) -> Result<(), FieldError> {
        ensure_host_port(&self.grpc.listen, "grpc.listen")?;
        seckill_proto::auth::check_callers(&self.grpc.service_token, &self.grpc.callers)
            .map_err(|(field, why)| FieldError::new(field, why))?;
        if let Some(tls) = &self.grpc.tls {
            tls.validate("grpc.tls")?;
        }
        ensure(
            self.grpc.watch_max_secs >= 1,
            "grpc.watch_max_secs",
            "must be at least 1",
        )?;
        ensure_range(self.grpc.watch_poll_ms, 10..=60_000, "grpc.watch_poll_ms")?;
        self.admin.validate()?;
        ensure_nodes(&self.redis.nodes, "redis.nodes")?;
        ensure_clusters(&self.redis.clusters, "redis.clusters")?;
        ensure_range(self.redis.timeout_ms, 1..=60_000, "redis.timeout_ms")?;
        ensure_range(
            self.redis.connect_timeout_ms,
            1..=60_000,
            "redis.connect_timeout_ms",
        )?;
        seckill_daemon::config::ensure_replica_acks(
            self.redis.replica_acks,
            self.redis.replica_ack_timeout_ms,
            self.redis.timeout_ms,
        )?;
        ensure(
            self.mysql.url.starts_with("mysql://"),
            "mysql.url",
            "must start with mysql://",
        )?;
        ensure_range(
            self.mysql.max_connections,
            1..=1000,
            "mysql.max_connections",
        )?;
        ensure(
            self.mysql.acquire_timeout_ms >= 1,
            "mysql.acquire_timeout_ms",
            "must be at least 1",
        )?;
        let c = &self.consumer;
        ensure(!c.group.is_empty(), "consumer.group", "must not be empty")?;
        if let Some(name) = &c.name {
            ensure(!name.is_empty(), "consumer.name", "must not be empty")?;
        }
        ensure_range(c.batch_size, 1..=10_000, "consumer.batch_size")?;
        ensure_range(c.block_ms, 1..=10_000, "consumer.block_ms")?;
        ensure(
            c.linger_ms <= c.claim_idle_ms / 4,
            "consumer.linger_ms",
            format!(
                "must be at most claim_idle_ms / 4 ({}): a lingering batch is pending, \
                 and must not look abandoned",
                c.claim_idle_ms / 4
            ),
        )?;
        ensure(
            c.claim_idle_ms >= 10,
            "consumer.claim_idle_ms",
            "must be at least 10",
        )?;
        ensure_range(c.clean_sweep_ms, 1..=3_600_000, "consumer.clean_sweep_ms")?;
        ensure(
            c.max_deliveries >= 1,
            "consumer.max_deliveries",
            "must be at least 1",
        )?;
        ensure(
            c.backoff_base_ms >= 1,
            "consumer.backoff_base_ms",
            "must be at least 1",
        )?;
        ensure(
            c.backoff_cap_ms >= c.backoff_base_ms,
            "consumer.backoff_cap_ms",
            "must be at least consumer.backoff_base_ms",
        )?;
        ensure(
            c.discovery_interval_ms >= 10,
            "consumer.discovery_interval_ms",
            "must be at least 10",
        )?;
        let p = &self.payment;
        ensure(
            p.timeout_secs >= 1,
            "payment.timeout_secs",
            "must be at least 1",
        )?;
        ensure(
            p.sweep_interval_ms >= 10,
            "payment.sweep_interval_ms",
            "must be at least 10",
        )?;
        ensure(
            p.callback_secret.len() >= 16,
            "payment.callback_secret",
            "must be at least 16 bytes",
        )?;
        ensure(
            p.freshness_window_secs >= 1,
            "payment.freshness_window_secs",
            "must be at least 1",
        )?;
        ensure(
            self.outbox.relay_interval_ms >= 10,
            "outbox.relay_interval_ms",
            "must be at least 10",
        )?;
        ensure(
            (1..=10_000).contains(&self.outbox.relay_batch),
            "outbox.relay_batch",
            "must be 1..=10000",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[grpc]
service_token = "tok"
[redis]
nodes = ["127.0.0.1:7001"]
[mysql]
url = "mysql://root@127.0.0.1:3306/seckill"
[payment]
callback_secret = "0123456789abcdef"
"#;

    #[test]
    fn a_grpc_tls_section_is_read_on_load_and_a_missing_file_is_named() {
        let text = format!(
            "{GOOD}[grpc.tls]\ncert_path = \"/nonexistent/server.pem\"\nkey_path = \"/nonexistent/server.key\"\n"
        );
        let e = Config::load_str(&text, "o.toml", [])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("o.toml: grpc.tls.cert_path: cannot read `/nonexistent/server.pem`"),
            "{e}"
        );
        let plain = Config::load_str(GOOD, "o.toml", []).unwrap();
        assert!(plain.grpc.tls.is_none());
    }

    #[test]
    fn a_minimal_file_loads_with_documented_defaults() {
        let c = Config::load_str(GOOD, "o.toml", []).unwrap();
        assert_eq!(c.grpc.listen, "127.0.0.1:50052");
        assert_eq!(c.payment.timeout_secs, 900);
        assert_eq!(c.consumer.group, "orderd");
        assert!(!c.payment.dev_pay_enabled);
        assert!(c
            .consumer_name()
            .ends_with(&format!("-{}", std::process::id())));
    }

    #[test]
    fn a_short_callback_secret_is_refused_naming_the_field() {
        let text = GOOD.replace("0123456789abcdef", "short");
        let e = Config::load_str(&text, "o.toml", []).unwrap_err();
        assert_eq!(
            e.to_string(),
            "o.toml: payment.callback_secret: must be at least 16 bytes"
        );
    }

    #[test]
    fn the_old_pool_max_is_refused_naming_max_connections() {
        let text = GOOD.replace("[mysql]\n", "[mysql]\npool_max = 4\n");
        let e = Config::load_str(&text, "o.toml", []).unwrap_err();
        assert_eq!(
            e.to_string(),
            "o.toml: mysql.pool_max: renamed: write `mysql.max_connections` instead"
        );
        let text = GOOD.replace("[mysql]\n", "[mysql]\nmax_connections = 4\n");
        assert_eq!(
            Config::load_str(&text, "o.toml", [])
                .unwrap()
                .mysql
                .max_connections,
            4
        );
    }

    #[test]
    fn replica_acks_default_to_one_and_bad_values_are_refused_naming_the_field() {
        let c = Config::load_str(GOOD, "o.toml", []).unwrap();
        assert_eq!(
            (c.redis.replica_acks, c.redis.replica_ack_timeout_ms),
            (1, 100)
        );
        let load = |extra: &str| {
            let text = GOOD.replace("[mysql]\n", &format!("{extra}\n[mysql]\n"));
            Config::load_str(&text, "o.toml", []).map_err(|e| e.to_string())
        };
        assert_eq!(load("replica_acks = 0").unwrap().redis.replica_acks, 0);
        assert!(load("replica_acks = 6")
            .unwrap_err()
            .starts_with("o.toml: redis.replica_acks: "));
        assert!(load("replica_ack_timeout_ms = 0")
            .unwrap_err()
            .starts_with("o.toml: redis.replica_ack_timeout_ms: "));
        let e = load("timeout_ms = 100\nreplica_ack_timeout_ms = 100").unwrap_err();
        assert!(
            e.starts_with("o.toml: redis.replica_ack_timeout_ms: must be below redis.timeout_ms"),
            "{e}"
        );
        // Without acknowledgements the ack timeout is not used, and not checked.
        assert!(load("timeout_ms = 100\nreplica_acks = 0").is_ok());
    }

    #[test]
    fn environment_overrides_are_validated() {
        let env = [("ORDERD__CONSUMER__BATCH_SIZE".to_string(), "0".to_string())];
        let e = Config::load_str(GOOD, "o.toml", env).unwrap_err();
        assert!(e.to_string().contains("consumer.batch_size"), "{e}");
    }

    #[test]
    fn a_linger_longer_than_a_quarter_of_the_claim_idle_time_is_refused() {
        let env = |linger: &str, claim: &str| {
            [
                (
                    "ORDERD__CONSUMER__LINGER_MS".to_string(),
                    linger.to_string(),
                ),
                (
                    "ORDERD__CONSUMER__CLAIM_IDLE_MS".to_string(),
                    claim.to_string(),
                ),
            ]
        };
        let c = Config::load_str(GOOD, "o.toml", env("2500", "10000")).unwrap();
        assert_eq!(c.consumer.linger_ms, 2500);
        let e = Config::load_str(GOOD, "o.toml", env("2501", "10000"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("o.toml: consumer.linger_ms: must be at most claim_idle_ms / 4 (2500)"),
            "{e}"
        );
        // Off is always allowed; the default fits the default claim time.
        assert!(Config::load_str(GOOD, "o.toml", env("0", "10")).is_ok());
        let d = ConsumerConfig::default();
        assert!(d.linger_ms > 0 && d.linger_ms <= d.claim_idle_ms / 4);
    }

    #[test]
    fn callers_with_scopes_load_and_a_bad_one_is_refused_naming_the_field() {
        use seckill_proto::auth::Scope;
        let callers = r#"
[[grpc.callers]]
name = "gateway"
token = "gateway-token-0123456"
scopes = ["read", "pay"]
[[grpc.callers]]
name = "seckillctl"
token = "admin-token-0123456789"
scopes = ["admin"]
"#;
        let text = format!("{}{callers}", GOOD.replace("service_token = \"tok\"\n", ""));
        let c = Config::load_str(&text, "o.toml", []).unwrap();
        assert!(c.grpc.service_token.is_empty());
        assert_eq!(c.grpc.callers[0].scopes, [Scope::Read, Scope::Pay]);
        assert_eq!(c.grpc.callers[1].name, "seckillctl");
        // A round trip keeps them (the harness writes configs back as TOML).
        let back = Config::load_str(&c.to_toml(), "t.toml", []).unwrap();
        assert_eq!(back.grpc.callers, c.grpc.callers);

        let e = Config::load_str(&text.replace("\"pay\"", "\"write\""), "o.toml", [])
            .unwrap_err()
            .to_string();
        assert!(e.contains("grpc.callers") && e.contains("write"), "{e}");
        let e = Config::load_str(
            &text.replace("admin-token-0123456789", "short"),
            "o.toml",
            [],
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "o.toml: grpc.callers[1].token: must be at least 16 bytes"
        );
        let e = Config::load_str(&GOOD.replace("service_token = \"tok\"\n", ""), "o.toml", [])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("o.toml: grpc.callers: give at least one"),
            "{e}"
        );
    }

    #[test]
    fn named_clusters_load_round_trip_and_a_bad_one_is_refused_naming_the_field() {
        let text = GOOD.replace(
            "[mysql]\n",
            "[redis.clusters.hot]\nnodes = [\"127.0.0.1:7101\"]\n\
             [redis.clusters.warm-2]\nnodes = [\"127.0.0.1:7201\", \"127.0.0.1:7202\"]\n[mysql]\n",
        );
        let c = Config::load_str(&text, "o.toml", []).unwrap();
        assert_eq!(c.redis.clusters["hot"].nodes, ["127.0.0.1:7101"]);
        assert_eq!(c.redis.clusters["warm-2"].nodes.len(), 2);
        assert_eq!(c.redis.timeout_ms, 1000);
        // The harness writes configs back as TOML for child processes.
        let back = Config::load_str(&c.to_toml(), "t.toml", []).unwrap();
        assert_eq!(back.redis.clusters, c.redis.clusters);

        let bad = |from: &str, to: &str| {
            Config::load_str(&text.replace(from, to), "o.toml", [])
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            bad("\"127.0.0.1:7101\"", "\"nohost\""),
            "o.toml: redis.clusters.hot.nodes: `nohost` is not host:port"
        );
        assert!(bad("clusters.hot]", "clusters.Hot]").starts_with("o.toml: redis.clusters.Hot:"));
        assert!(bad("clusters.hot]", "clusters.default]")
            .starts_with("o.toml: redis.clusters.default:"));
        assert!(bad("nodes = [\"127.0.0.1:7101\"]", "nodes = []")
            .starts_with("o.toml: redis.clusters.hot.nodes:"));
        assert!(bad("nodes = [\"127.0.0.1:7101\"]", "nodez = []").contains("nodez"));
    }

    #[test]
    fn the_test_config_is_valid() {
        let c = Config::for_test(vec!["127.0.0.1:1".into()], "mysql://x@h/db", "t");
        c.validate().unwrap();
        let back = Config::load_str(&c.to_toml(), "t.toml", []).unwrap();
        assert_eq!(back.mysql.url, c.mysql.url);
    }
}
