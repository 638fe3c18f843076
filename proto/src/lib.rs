//! The `seckill.v1` wire contract.
//!
//! Layout:
//! - [`pb`]: the generated messages, clients and servers (package `seckill.v1`), and
//!   [`FILE_DESCRIPTOR_SET`], the encoded descriptors served by reflection.
//! - [`auth`]: callers, tokens and scopes of internal RPCs, and the client twin.
//! - [`trace`]: the W3C `traceparent` carried from the edge to stockd and orderd.
//!
//! The plumbing that serves this contract (config, health and reflection, shutdown,
//! telemetry, the admin port, the MySQL schema) lives in `seckill-daemon` (`daemon/`).
#![forbid(unsafe_code)]

pub mod auth;
pub mod trace;

/// Generated code for package `seckill.v1`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("seckill.v1");
}

/// Encoded `FileDescriptorSet` of every `seckill.v1` file, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/seckill_descriptor.bin"));
