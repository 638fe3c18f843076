//! The integration harness: real parts on free ports, torn down when the handle drops
//! (also when a test panics).
//!
//! Layout:
//! - [`process`]: child processes that die with their handle, free ports, readiness waits.
//! - [`redis`]: [`RedisCluster`] (3 masters by default, about a second to start; with
//!   replicas, `RedisCluster::start_replicated`, about 2-3 s, and the failover tools:
//!   kill, restart, stall, wait_for_failover, who serves a key) and
//!   [`RedisServer`] (standalone).
//! - [`mysql`]: [`MariaDb`] (a `mariadbd` of the test's own) and [`TestDb`] (a fresh
//!   migrated database, inside the suite's server or one of its own).
//! - `stockd`, `orderd`, `gateway` (features of the same names): one spawn style for
//!   every daemon, `spawn_<daemon>(&deps, |config| ..)`: [`Deps`] (Redis Cluster and
//!   database) for stockd and orderd, `gateway::EdgeDeps` (Redis and the two upstreams)
//!   for the edge, and a tweak of the daemon's own config. In-process on port 0
//!   (`spawn_stockd`, `spawn_orderd`) or as child processes (`spawn_*_process`,
//!   `spawn_gateway`); every handle has its address and typed clients and helpers, and
//!   stops its daemon when dropped.
//! - [`grpc`]: reflection and health clients used to check every daemon the same way.
#![forbid(unsafe_code)]

pub mod failpoint;
pub mod grpc;
pub mod mysql;
pub mod process;
pub mod redis;

#[cfg(feature = "gateway")]
pub mod gateway;
#[cfg(feature = "orderd")]
pub mod orderd;
#[cfg(feature = "stockd")]
pub mod stockd;

pub use mysql::{MariaDb, TestDb};
pub use redis::{RedisCluster, RedisServer};

/// Service token the harness configures on every daemon it starts.
pub const SERVICE_TOKEN: &str = "test-service-token";

/// What a back-end daemon runs against: the test's Redis Cluster and database. Every
/// `spawn_<daemon>(&deps, |config| ..)` takes one, with a tweak of the daemon's typed
/// config.
#[derive(Debug, Clone, Copy)]
pub struct Deps<'a> {
    pub redis: &'a RedisCluster,
    pub db: &'a TestDb,
}

impl<'a> Deps<'a> {
    pub fn new(redis: &'a RedisCluster, db: &'a TestDb) -> Self {
        Self { redis, db }
    }
}

/// Logs from the code under test, filtered by `RUST_LOG` (default `warn`), captured
/// per test by the test runner.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}
