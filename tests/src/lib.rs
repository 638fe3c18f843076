//! The integration harness: real parts on free ports, torn down when the handle drops
//! (also when a test panics).
//!
//! Layout:
//! - [`process`]: child processes that die with their handle, free ports, readiness waits.
//! - [`redis`]: [`RedisCluster`] (3 masters by default, about a second to start) and
//!   [`RedisServer`] (standalone).
//! - [`mysql`]: [`MariaDb`] (a `mariadbd` of the test's own) and [`TestDb`] (a fresh
//!   migrated database, inside the suite's server or one of its own).
//! - `stockd`, `orderd`, `gateway` (features of the same names): `spawn_*` helpers
//!   that run the daemons in-process on port 0, or as child processes.
//! - [`grpc`]: reflection and health clients used to check every daemon the same way.
#![forbid(unsafe_code)]

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
