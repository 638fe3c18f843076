//! The plumbing every seckill daemon shares, so stockd, orderd and the gateway load,
//! serve, log and stop the same way.
//!
//! Layout:
//! - [`config`]: TOML file, then environment overrides, then validation, with errors
//!   that name the file and the field; the common sections (`[grpc] [admin] [redis]
//!   [mysql] [log]`) spelled once.
//! - [`serve`]: one way for every gRPC daemon to serve `grpc.health.v1` and server
//!   reflection (v1 and v1alpha, so ghz and grpcurl need no `.proto` files), in
//!   plaintext or over TLS.
//! - [`tls`]: `[grpc.tls]` (the daemons' TLS and mutual TLS) and its client side (the
//!   gateway's `[upstreams.tls]`), loaded and checked by `validate()`.
//! - [`shutdown`]: SIGINT/SIGTERM as a cloneable signal for servers and loops.
//! - [`reload`]: SIGHUP: read the config again, apply the live fields, name the rest.
//! - [`telemetry`]: tracing set-up (text or JSON lines, a filter swappable live).
//! - [`admin_http`]: the loopback admin port (`/metrics`, `/healthz`).
//! - [`start`] (feature `db`): the start-up of the gRPC daemons (flags, config, bind),
//!   and [`migrator`] (feature `db`): the MySQL schema shared by stockd and orderd.
//! - [`redis`] (feature `redis`): the one Redis Cluster client builder and the one
//!   `EVALSHA`-with-reload every daemon calls its scripts through.
//! - [`ack`] (feature `redis`): script calls a replica must hold before they count
//!   (`EVALSHA`s and one `WAIT` per master's pipeline).
#![forbid(unsafe_code)]

#[cfg(feature = "redis")]
pub mod ack;
pub mod admin_http;
pub mod config;
pub mod log_writer;
#[cfg(feature = "redis")]
pub mod redis;
pub mod reload;
pub mod serve;
pub mod shutdown;
#[cfg(feature = "db")]
pub mod start;
pub mod telemetry;
pub mod tls;

/// The MySQL schema (`daemon/migrations`), applied by `--migrate` and by the harness.
/// Idempotent: applying it twice changes nothing.
#[cfg(feature = "db")]
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("./migrations")
}
