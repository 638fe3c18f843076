//! The `seckill.v1` wire contract and the plumbing every daemon shares to serve it.
//!
//! Layout:
//! - [`pb`]: the generated messages, clients and servers (package `seckill.v1`), and
//!   [`FILE_DESCRIPTOR_SET`], the encoded descriptors served by reflection.
//! - [`serve`]: one way for every daemon to serve `grpc.health.v1` and server
//!   reflection (v1 and v1alpha, so ghz and grpcurl need no `.proto` files).
//! - [`auth`]: the service-token interceptor for internal RPCs, and its client twin.
//! - [`config`]: TOML file, then environment overrides, then validation, with errors
//!   that name the file and the field.
//! - [`shutdown`]: SIGINT/SIGTERM as a cloneable signal for servers and loops.
//! - [`admin_http`]: the loopback admin port (`/metrics`, `/healthz`).
//! - `migrator()` (feature `db`): the MySQL schema shared by stockd and orderd, and
//!   [`daemon`] (feature `db`): the start-up of the gRPC daemons (flags, config, bind).
#![forbid(unsafe_code)]

pub mod admin_http;
pub mod auth;
pub mod config;
#[cfg(feature = "db")]
pub mod daemon;
pub mod serve;
pub mod shutdown;
pub mod telemetry;

/// Generated code for package `seckill.v1`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("seckill.v1");
}

/// Encoded `FileDescriptorSet` of every `seckill.v1` file, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/seckill_descriptor.bin"));

/// The MySQL schema (`proto/migrations`), applied by `--migrate` and by the harness.
/// Idempotent: applying it twice changes nothing.
#[cfg(feature = "db")]
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("./migrations")
}
