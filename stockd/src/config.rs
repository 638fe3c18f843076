//! stockd's config file (`deploy/local/stockd.toml`), loaded by
//! [`seckill_daemon::config::load`]: TOML, then `STOCKD__SECTION__FIELD` environment
//! overrides, then [`Validate`]. Unknown keys are errors.
//!
//! (Over 400 lines: every field documented (meaning, unit, default) and its validation and
//! tests beside it.)

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

use seckill_daemon::config::{
    ensure, ensure_clusters, ensure_host_port, ensure_nodes, ensure_range, AdminSection,
    ConfigError, FieldError, LogSection, NamedClusters, Validate,
};

/// Environment override prefix: `STOCKD__REDIS__TIMEOUT_MS=500`.
pub const ENV_PREFIX: &str = "STOCKD";

/// The whole file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The gRPC port (StockService, AdminService, health, reflection).
    pub grpc: GrpcConfig,
    /// The loopback admin port (`/metrics`, `/healthz`). Optional; default none.
    #[serde(default)]
    pub admin: AdminSection,
    /// Redis Cluster endpoints and timeouts.
    pub redis: RedisConfig,
    /// MySQL (MariaDB), the record of activities, stock and orders.
    pub mysql: MysqlConfig,
    /// Sharding, rebalancing and background loops.
    #[serde(default)]
    pub stock: StockConfig,
    /// Logging.
    #[serde(default)]
    pub log: LogSection,
}

/// `[grpc]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcConfig {
    /// Listen address, `host:port`. Default `127.0.0.1:50051`.
    #[serde(default = "default_grpc_listen")]
    pub listen: String,
    /// Dev shortcut: one bearer token with every scope (the caller `service`). Empty
    /// (the default) for none; then `callers` must name at least one caller. Never
    /// logged. Production gives each caller its own token and scopes in `callers`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_token: String,
    /// The callers of StockService/AdminService, each `{ name, token, scopes }`; `scopes` from
    /// `reserve`, `read`, `pay`, `admin` (which RPC needs which: docs/stockd.md). Tokens
    /// at least 16 bytes, unique, never logged. Default none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callers: Vec<seckill_proto::auth::CallerConfig>,
    /// How long in-flight calls may finish after a shutdown signal, in ms. Default 5000.
    #[serde(default = "default_drain_ms")]
    pub drain_ms: u64,
    /// Threads that serve calls and drive Redis I/O (0..=256); 0 = half the cores
    /// seen by the process, at least 1 (or `TOKIO_WORKER_THREADS` when set). Half,
    /// because stockd shares its host with what it waits on: on a 2-core box with
    /// Redis and the callers, one thread took 18 µs of CPU per reservation against 23
    /// µs with two (fewer thread wake-ups and context switches, larger group commits)
    /// and served more reservations/s (docs/stockd.md, benchmark). One thread runs
    /// tokio's current-thread scheduler, which writes the answers of one Redis reply
    /// in one HTTP/2 write. Set it on a host of its own, and under a CPU quota smaller
    /// than the host. Default 0.
    #[serde(default)]
    pub worker_threads: usize,
    /// `[grpc.tls]`: serve gRPC over TLS, mutual TLS when it names `client_ca_path`
    /// (fields: docs/stockd.md). The files are read and checked on every load, `-t`
    /// included. Absent (the default): plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<seckill_daemon::tls::ServerTls>,
}

impl GrpcConfig {
    /// The runtime's worker threads: `worker_threads`, or for 0 half the cores seen
    /// by the process (at least 1); 0 (the runtime decides) when `worker_threads` is 0
    /// and `TOKIO_WORKER_THREADS` is set.
    pub fn runtime_threads(&self) -> usize {
        if self.worker_threads > 0 {
            return self.worker_threads;
        }
        if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
            return 0;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / 2).max(1)
    }
}

/// `[redis]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// Cluster nodes, `host:port`; one is enough, the rest are discovered. Required.
    pub nodes: Vec<String>,
    /// Named Redis Clusters (`[redis.clusters.<name>]`, each with its own `nodes`) that an
    /// activity's `redis_cluster` can place its stock on: a hot sale on Redis nodes of its
    /// own. Every other `[redis]` setting applies to them too. Default: none (every
    /// activity on the cluster of `nodes`).
    #[serde(default, skip_serializing_if = "NamedClusters::is_empty")]
    pub clusters: NamedClusters,
    /// Deadline of one Redis command (a Lua call included), in ms. A call that takes
    /// longer answers UNAVAILABLE. Default 500.
    #[serde(default = "default_redis_timeout_ms")]
    pub timeout_ms: u64,
    /// Deadline of connecting to a node, in ms. Default 2000.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Connections per node (a round-robin pool of clients). Default 1: one connection
    /// per node batches the most concurrent commands into each write, which is what
    /// Redis's CPU (the bottleneck of a sale) pays for; raise it only when one client's
    /// router task is the bottleneck (many cores).
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// Replicas that must hold a reservation before stockd answers RESERVED (Redis
    /// `WAIT` on the connection that carried the write, one per pipeline of a master's
    /// ready calls, never one per reservation). 0 answers as soon as the master has it: UNSAFE with replicas,
    /// since a failover to a replica that lagged loses reservations already promised
    /// (stockd counts them and rebuilds the shard, but the buyer's unit is gone); right
    /// only for a masters-only Redis (a laptop). 0..=5. Default 1.
    #[serde(default = "default_replica_acks")]
    pub replica_acks: u32,
    /// How long one reserve call waits for `replica_acks` replicas, in ms. Past it the
    /// caller gets UNAVAILABLE (the edge: 503 + `Retry-After`); a retry with the same
    /// request id answers the same reservation once a replica holds it, or a fresh
    /// outcome if the write died with its master. Below `timeout_ms`. 1..=10000.
    /// Default 100.
    #[serde(default = "default_replica_ack_timeout_ms")]
    pub replica_ack_timeout_ms: u64,
    /// Connections (clients, one connection to every master each) kept for calls that
    /// wait for replicas: `WAIT` blocks its connection, so each pipeline (one master's
    /// ready calls and one `WAIT`) borrows one for itself and no other command queues
    /// behind it. One pipeline per master is in flight. 1..=256. Default 16.
    #[serde(default = "default_ack_connections")]
    pub ack_connections: usize,
}

/// `[mysql]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlConfig {
    /// `mysql://user:password@host:port/database`. Required. Never logged.
    pub url: String,
    /// Pool size. Default 8.
    #[serde(default = "default_mysql_connections")]
    pub max_connections: u32,
    /// Deadline of acquiring a connection, in ms. Default 3000.
    #[serde(default = "default_mysql_acquire_ms")]
    pub acquire_timeout_ms: u64,
}

/// `[stock]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StockConfig {
    /// Units moved per rebalancing step from a donor shard to an empty home shard
    /// (1..=1000). Small keeps stock spread; large saves round trips. Default 4.
    #[serde(default = "default_rebalance_batch")]
    pub rebalance_batch: u32,
    /// Rebalancing rounds tried per reservation; then a last look at every shard
    /// answers SOLD_OUT, NOT_ENOUGH or ABORTED (units remain: retry) (1..=1024).
    /// Default 8.
    #[serde(default = "default_rebalance_attempts")]
    pub rebalance_attempts: u32,
    /// How long at most units a rebalancing round moved home stay kept for the buyers
    /// it carried, in ms (0..=1000; 0: not kept; the keep ends sooner once they have all
    /// reserved): other homes' rounds do not take them meanwhile, and a round that finds
    /// no other units waits for them to be bought, or for the keep to end, before it
    /// reads the shards again. Default 50 (the carried buyers' reservation, one
    /// group-commit call, takes a few ms even in a saturated burst).
    #[serde(default = "default_rebalance_keep_ms")]
    pub rebalance_keep_ms: u64,
    /// Period of the fence check, which finds lost Redis state (a fence gone, a shard
    /// behind this process's high-water mark) while nobody buys, in ms (50..=600000).
    /// Each period it reads the shards of activities waiting to open, and at most
    /// `fence_check_shards` others in turn; a node that reconnected, a cluster map
    /// change, or a loss found makes the next period read every shard. Default 1000.
    #[serde(default = "default_fence_check_ms")]
    pub fence_check_ms: u64,
    /// Shards (one `MGET` each) the fence check reads per period in its round over the
    /// open activities (whole activities, in id order, until this many are read), so an
    /// idle stockd's Redis traffic does not grow with the number of activities. A loss
    /// confined to one shard (a key deleted or evicted) is found within
    /// ceil(open shards / fence_check_shards) periods, or at its next reservation.
    /// 1..=1000000. Default 64.
    #[serde(default = "default_fence_check_shards")]
    pub fence_check_shards: u32,
    /// Most reservations of one shard sent in one reserve call (1..=1024). Per shard
    /// one call is in flight; reservations arriving meanwhile go together in the next
    /// call (group commit, no timer: a lone reservation goes at once). 1 turns
    /// batching off. Default 64.
    #[serde(default = "default_reserve_batch_max")]
    pub reserve_batch_max: u32,
    /// How often scheduled publications and activity changes are polled from MySQL,
    /// in ms (50..=600000). A poll is two one-row queries (the published activities'
    /// mark and the due schedules); the activities themselves are read only when the
    /// mark moved. Default 1000.
    #[serde(default = "default_schedule_poll_ms")]
    pub schedule_poll_ms: u64,
    /// At start-up, check every open activity against MySQL before it opens (true):
    /// a missing fence or stock key, or MySQL holding reservations past a shard's
    /// sequence (Redis lost writes while no stockd was there to notice), rebuilds it;
    /// an intact one opens as it is, so a stockd that joins a running fleet closes no
    /// peer's shards. False: only the fence check (missing fences) decides. Default true.
    #[serde(default = "default_true")]
    pub recompute_at_start: bool,
    /// Shortest time between two rebuilds of one activity that failed rebalancing moves
    /// start, in ms (0..=600000; 0: no gap). A take or give whose outcome is unknown (a
    /// timeout, a cut connection), or a take or give no replica acknowledged, may hold units back
    /// that only a rebuild counts again; while Redis keeps failing, each failed move would
    /// otherwise start a rebuild as soon as the last ended, each making the activity
    /// UNAVAILABLE while it runs. A failure within the gap waits for its end, and the
    /// failures meanwhile join that one rebuild; the units held back stay off sale until
    /// it runs. Default 5000.
    #[serde(default = "default_move_repair_gap_ms")]
    pub move_repair_gap_ms: u64,
}

fn default_grpc_listen() -> String {
    "127.0.0.1:50051".into()
}
fn default_drain_ms() -> u64 {
    5000
}
fn default_redis_timeout_ms() -> u64 {
    500
}
fn default_connect_timeout_ms() -> u64 {
    2000
}
fn default_pool_size() -> usize {
    1
}
fn default_replica_acks() -> u32 {
    1
}
fn default_replica_ack_timeout_ms() -> u64 {
    100
}
fn default_ack_connections() -> usize {
    16
}
fn default_mysql_connections() -> u32 {
    8
}
fn default_mysql_acquire_ms() -> u64 {
    3000
}
fn default_true() -> bool {
    true
}
fn default_rebalance_batch() -> u32 {
    4
}
fn default_rebalance_attempts() -> u32 {
    8
}
fn default_rebalance_keep_ms() -> u64 {
    50
}
fn default_fence_check_ms() -> u64 {
    1000
}
fn default_fence_check_shards() -> u32 {
    64
}
fn default_reserve_batch_max() -> u32 {
    64
}
fn default_move_repair_gap_ms() -> u64 {
    5000
}
fn default_schedule_poll_ms() -> u64 {
    1000
}

impl Default for StockConfig {
    fn default() -> Self {
        Self {
            rebalance_batch: default_rebalance_batch(),
            rebalance_attempts: default_rebalance_attempts(),
            rebalance_keep_ms: default_rebalance_keep_ms(),
            fence_check_ms: default_fence_check_ms(),
            fence_check_shards: default_fence_check_shards(),
            reserve_batch_max: default_reserve_batch_max(),
            schedule_poll_ms: default_schedule_poll_ms(),
            recompute_at_start: true,
            move_repair_gap_ms: default_move_repair_gap_ms(),
        }
    }
}

impl Config {
    /// The config as TOML (a file `load` reads back to the same config; tests write the
    /// config of a child process with it).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the config serializes")
    }

    /// Reads, overrides from `STOCKD__*` variables, and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        seckill_daemon::config::load(path, ENV_PREFIX)
    }

    /// Parses `text` (named `origin` in errors) with overrides from `env`; for tests.
    pub fn load_str(
        text: &str,
        origin: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        seckill_daemon::config::load_str(text, origin, ENV_PREFIX, env)
    }

    /// A valid config for tests: listeners are passed to [`crate::run`], so the listen
    /// addresses are only informative; background loops run fast; the Redis timeout
    /// is 3 s; no replica acknowledgement (the harness's default cluster has masters
    /// only: a test of a replicated cluster sets `redis.replica_acks`).
    pub fn for_test(redis_nodes: Vec<String>, mysql_url: String, token: &str) -> Config {
        Config {
            grpc: GrpcConfig {
                listen: "127.0.0.1:0".into(),
                service_token: token.into(),
                callers: Vec::new(),
                drain_ms: 2000,
                worker_threads: 0,
                tls: None,
            },
            admin: AdminSection::default(),
            redis: RedisConfig {
                nodes: redis_nodes,
                clusters: NamedClusters::new(),
                // Generous: debug builds on a shared 2-core machine under thousands
                // of concurrent calls.
                timeout_ms: 3000,
                connect_timeout_ms: default_connect_timeout_ms(),
                pool_size: 2,
                replica_acks: 0,
                replica_ack_timeout_ms: 1000,
                ack_connections: 8,
            },
            mysql: MysqlConfig {
                url: mysql_url,
                max_connections: 4,
                acquire_timeout_ms: default_mysql_acquire_ms(),
            },
            stock: StockConfig {
                fence_check_ms: 200,
                schedule_poll_ms: 200,
                ..StockConfig::default()
            },
            log: LogSection::default(),
        }
    }

    pub fn redis_timeout(&self) -> Duration {
        Duration::from_millis(self.redis.timeout_ms)
    }
}

impl Validate for Config {
    fn validate(&self) -> Result<(), FieldError> {
        ensure_host_port(&self.grpc.listen, "grpc.listen")?;
        seckill_proto::auth::check_callers(&self.grpc.service_token, &self.grpc.callers)
            .map_err(|(field, why)| FieldError::new(field, why))?;
        if let Some(tls) = &self.grpc.tls {
            tls.validate("grpc.tls")?;
        }
        ensure(
            self.grpc.drain_ms <= 600_000,
            "grpc.drain_ms",
            "must be at most 600000",
        )?;
        ensure_range(self.grpc.worker_threads, 0..=256, "grpc.worker_threads")?;
        self.admin.validate()?;
        ensure_nodes(&self.redis.nodes, "redis.nodes")?;
        ensure_clusters(&self.redis.clusters, "redis.clusters")?;
        ensure_range(self.redis.timeout_ms, 1..=60_000, "redis.timeout_ms")?;
        ensure_range(
            self.redis.connect_timeout_ms,
            1..=60_000,
            "redis.connect_timeout_ms",
        )?;
        ensure_range(self.redis.pool_size, 1..=64, "redis.pool_size")?;
        seckill_daemon::config::ensure_replica_acks(
            self.redis.replica_acks,
            self.redis.replica_ack_timeout_ms,
            self.redis.timeout_ms,
        )?;
        ensure_range(self.redis.ack_connections, 1..=256, "redis.ack_connections")?;
        ensure(
            self.mysql.url.starts_with("mysql://") || self.mysql.url.starts_with("mariadb://"),
            "mysql.url",
            "must start with mysql://",
        )?;
        ensure_range(self.mysql.max_connections, 1..=256, "mysql.max_connections")?;
        ensure_range(
            self.mysql.acquire_timeout_ms,
            1..=60_000,
            "mysql.acquire_timeout_ms",
        )?;
        let s = &self.stock;
        ensure_range(s.rebalance_batch, 1..=1000, "stock.rebalance_batch")?;
        ensure_range(s.rebalance_attempts, 1..=1024, "stock.rebalance_attempts")?;
        ensure_range(s.rebalance_keep_ms, 0..=1000, "stock.rebalance_keep_ms")?;
        ensure_range(s.fence_check_ms, 50..=600_000, "stock.fence_check_ms")?;
        ensure_range(
            s.fence_check_shards,
            1..=1_000_000,
            "stock.fence_check_shards",
        )?;
        ensure_range(s.reserve_batch_max, 1..=1024, "stock.reserve_batch_max")?;
        ensure_range(
            s.move_repair_gap_ms,
            0..=600_000,
            "stock.move_repair_gap_ms",
        )?;
        ensure_range(s.schedule_poll_ms, 50..=600_000, "stock.schedule_poll_ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[grpc]
listen = "127.0.0.1:50051"
service_token = "t"
[redis]
nodes = ["127.0.0.1:7001"]
[mysql]
url = "mysql://root@127.0.0.1:3306/seckill"
"#;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::load_str(text, "stockd.toml", env)
    }

    #[test]
    fn a_grpc_tls_section_is_read_on_load_and_a_missing_file_is_named() {
        let text = format!(
            "{GOOD}[grpc.tls]\ncert_path = \"/nonexistent/server.pem\"\nkey_path = \"/nonexistent/server.key\"\n"
        );
        let e = load(&text, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("stockd.toml: grpc.tls.cert_path: cannot read `/nonexistent/server.pem`"),
            "{e}"
        );
        let plain = load(GOOD, &[]).unwrap();
        assert!(plain.grpc.tls.is_none());
    }

    #[test]
    fn a_minimal_file_loads_with_defaults() {
        let c = load(GOOD, &[]).unwrap();
        assert_eq!(c.stock.rebalance_batch, 4);
        assert_eq!(c.stock.rebalance_keep_ms, 50);
        assert_eq!(c.stock.reserve_batch_max, 64);
        assert_eq!(c.redis.timeout_ms, 500);
        assert_eq!(c.stock.move_repair_gap_ms, 5000);
        assert!(c.admin.listen.is_none());
    }

    #[test]
    fn worker_threads_zero_means_half_the_cores_and_a_number_is_taken_as_is() {
        let mut c = load(GOOD, &[]).unwrap();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
            assert_eq!(c.grpc.runtime_threads(), (cores / 2).max(1));
        }
        c.grpc.worker_threads = 3;
        assert_eq!(c.grpc.runtime_threads(), 3);
    }

    #[test]
    fn the_shipped_local_config_is_valid() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/local/stockd.toml");
        let c = Config::load_str(&std::fs::read_to_string(path).unwrap(), path, []).unwrap();
        assert_eq!(c.grpc.listen, "127.0.0.1:50051");
        assert_eq!(c.admin.listen.as_deref(), Some("127.0.0.1:9092"));
    }

    #[test]
    fn an_unknown_key_is_refused_naming_it() {
        let e = load(&format!("{GOOD}\n[stock]\nshards = 3\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("stock") && e.contains("unknown field `shards`"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        for (env, field) in [
            (
                ("STOCKD__GRPC__SERVICE_TOKEN", "\"a b\""),
                "grpc.service_token",
            ),
            (("STOCKD__REDIS__NODES", "[]"), "redis.nodes"),
            (("STOCKD__REDIS__TIMEOUT_MS", "0"), "redis.timeout_ms"),
            (
                ("STOCKD__STOCK__REBALANCE_BATCH", "0"),
                "stock.rebalance_batch",
            ),
            (
                ("STOCKD__STOCK__REBALANCE_KEEP_MS", "1001"),
                "stock.rebalance_keep_ms",
            ),
            (
                ("STOCKD__STOCK__FENCE_CHECK_MS", "1"),
                "stock.fence_check_ms",
            ),
            (
                ("STOCKD__STOCK__FENCE_CHECK_SHARDS", "0"),
                "stock.fence_check_shards",
            ),
            (
                ("STOCKD__STOCK__FENCE_CHECK_SHARDS", "1000001"),
                "stock.fence_check_shards",
            ),
            (
                ("STOCKD__GRPC__WORKER_THREADS", "257"),
                "grpc.worker_threads",
            ),
            (
                ("STOCKD__STOCK__RESERVE_BATCH_MAX", "0"),
                "stock.reserve_batch_max",
            ),
            (
                ("STOCKD__STOCK__RESERVE_BATCH_MAX", "1025"),
                "stock.reserve_batch_max",
            ),
            (
                ("STOCKD__STOCK__MOVE_REPAIR_GAP_MS", "600001"),
                "stock.move_repair_gap_ms",
            ),
            (("STOCKD__MYSQL__URL", "postgres://x"), "mysql.url"),
            (("STOCKD__GRPC__LISTEN", "nowhere"), "grpc.listen"),
        ] {
            let e = load(GOOD, &[env]).unwrap_err().to_string();
            assert!(e.starts_with(&format!("stockd.toml: {field}: ")), "{e}");
        }
    }

    #[test]
    fn named_clusters_load_and_bad_ones_are_refused_naming_the_field() {
        let text = format!("{GOOD}[redis.clusters.hot]\nnodes = [\"127.0.0.1:7101\"]\n");
        let c = load(&text, &[]).unwrap();
        assert_eq!(c.redis.clusters["hot"].nodes, ["127.0.0.1:7101"]);
        assert!(load(GOOD, &[]).unwrap().redis.clusters.is_empty());
        for (extra, field) in [
            (
                "[redis.clusters.hot]\nnodes = []\n",
                "redis.clusters.hot.nodes",
            ),
            (
                "[redis.clusters.hot]\nnodes = [\"nowhere\"]\n",
                "redis.clusters.hot.nodes",
            ),
            (
                "[redis.clusters.Hot]\nnodes = [\"h:1\"]\n",
                "redis.clusters.Hot",
            ),
            (
                "[redis.clusters.default]\nnodes = [\"h:1\"]\n",
                "redis.clusters.default",
            ),
        ] {
            let e = load(&format!("{GOOD}{extra}"), &[])
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("stockd.toml: {field}: ")), "{e}");
        }
        let e = load(
            &format!("{GOOD}[redis.clusters.hot]\nnodes = [\"h:1\"]\ntimeout_ms = 5\n"),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("timeout_ms"),
            "a named cluster takes only nodes: {e}"
        );
    }

    #[test]
    fn environment_overrides_the_file() {
        let c = load(GOOD, &[("STOCKD__REDIS__TIMEOUT_MS", "250")]).unwrap();
        assert_eq!(c.redis.timeout_ms, 250);
    }

    #[test]
    fn the_test_config_is_valid() {
        let c = Config::for_test(vec!["127.0.0.1:1".into()], "mysql://r@h/d".into(), "t");
        c.validate().unwrap();
        let back = Config::load_str(&c.to_toml(), "t.toml", []).unwrap();
        assert_eq!(back.to_toml(), c.to_toml());
    }
}
