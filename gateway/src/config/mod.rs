//! The gateway's TOML config (`deploy/local/gateway.toml`, env prefix `GATEWAY`).
//!
//! Sections: `[server]` listeners, threads and upgrade files; `[redis]` the cluster that
//! feeds activities, sold-out flags and bans, and `[redis.clusters.<name>]` the named
//! clusters holding the stock of the activities placed on them; `[upstreams]`
//! stockd/orderd and deadlines;
//! `[auth]` JWT and purchase tokens; `[limits]` token buckets; `[bans]` CIDR lists,
//! trusted proxies, auto-ban; `[admission]` the in-flight cap; `[protection]` header,
//! body and read-deadline limits; `[dev]` the dev-only token endpoint.
//!
//! On SIGHUP the file is read again and `[limits]`, `[bans]`, `[admission]` and
//! `[protection]` take effect without dropping connections ([`Policy`]), and so do the
//! JWT keys of `[auth]` (the JWKS file is read again); the other sections (and
//! `[auth]`'s purchase-token fields) need a restart (or a graceful upgrade).
//!
//! Files: [`model`] (the sections, their fields and defaults), `validate` (the
//! checks `-t` and every load run, naming the field), `tls` (the certificate and key
//! files of `server.tls_listen`).

mod model;
mod tls;
mod validate;

pub use model::*;
pub use validate::parse_cidr;

/// Loads and validates a file with `GATEWAY__*` overrides.
pub fn load(path: &std::path::Path) -> Result<Config, seckill_daemon::config::ConfigError> {
    seckill_daemon::config::load(path, ENV_PREFIX)
}

/// The smallest valid file (unit tests of the config and of the filters).
#[cfg(test)]
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
