//! The one way every daemon builds its Redis Cluster client and calls a script.
//!
//! - [`builder`]: a fred [`Builder`] for the `[redis]` section's nodes and deadlines,
//!   with the daemon's own retry policy ([`Retries`]): stockd never writes a command
//!   twice (a GIVE written twice would create units), orderd retries its idempotent
//!   stream commands.
//! - [`Scripts`]: the SHA1 of every script of `seckill-lua`, computed once, and
//!   [`Scripts::eval`]: `EVALSHA`, and on `NOSCRIPT` (a restarted node, a replica
//!   promoted after failover) `SCRIPT LOAD` of every script on every primary, then the
//!   same `EVALSHA` once more. A `NOSCRIPT` answer means the script did not run, so
//!   the second call cannot double a write. The reload is single-flight: after a
//!   failover every call in flight meets `NOSCRIPT` at once, one of them loads, the
//!   others wait for that load and call again (no storm of `SCRIPT LOAD`s).
//!
//! Why scripts and not Redis functions (which replicas inherit): Redis 7.0 keeps the
//! script cache per node and does not replicate `SCRIPT LOAD`, so a promoted replica
//! answers `NOSCRIPT` once; the reload costs one round of `SCRIPT LOAD` on every
//! primary (measured in the failover test), and `EVALSHA` keeps the scripts callable
//! by the reference setups and by `redis-cli` without a library to install.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::{ConnectionConfig, PerformanceConfig, ReconnectPolicy, TcpConfig};
use fred::types::Value;
use seckill_lua::scripts::{Script, ALL};

/// How a daemon's client retries.
#[derive(Debug, Clone)]
pub struct Retries {
    /// fred's `max_command_attempts`: 1 writes every command at most once.
    pub command_attempts: u32,
    /// Reconnection after a lost connection.
    pub reconnect: ReconnectPolicy,
}

/// A client builder for a cluster reached through `nodes` (`host:port`, validated by
/// the config), with `timeout` on every command and `connect_timeout` on connecting.
pub fn builder(
    nodes: &[String],
    timeout: Duration,
    connect_timeout: Duration,
    retries: Retries,
) -> Builder {
    let hosts = nodes
        .iter()
        .filter_map(|n| {
            let (h, p) = n.rsplit_once(':')?;
            Some((h.to_string(), p.parse::<u16>().ok()?))
        })
        .collect::<Vec<_>>();
    let config = Config {
        server: ServerConfig::new_clustered(hosts),
        // fred gives up on a first connection that failed unless told otherwise: a
        // daemon started while its Redis is down would never connect. The reconnect
        // policy applies to the first connection too.
        fail_fast: false,
        ..Config::default()
    };
    let mut builder = Builder::from_config(config);
    builder
        .with_performance_config(|p: &mut PerformanceConfig| {
            p.default_command_timeout = timeout;
        })
        .with_connection_config(|c: &mut ConnectionConfig| {
            c.connection_timeout = connect_timeout;
            c.internal_command_timeout = connect_timeout;
            c.max_command_attempts = retries.command_attempts;
            c.tcp = TcpConfig {
                nodelay: Some(true),
                ..Default::default()
            };
        })
        .set_policy(retries.reconnect);
    builder
}

/// What [`Scripts::eval`] got back.
#[derive(Debug)]
pub struct Evaluated {
    /// The script's answer.
    pub value: Value,
    /// True when the first call met `NOSCRIPT` and the scripts were loaded again.
    pub reloaded: bool,
}

/// Every script's SHA1, computed once (not per call: this is the reservation path),
/// and the single-flight reload.
#[derive(Debug, Clone)]
pub struct Scripts {
    shas: Vec<(&'static str, String)>,
    /// Held while a reload runs.
    loading: Arc<tokio::sync::Mutex<()>>,
    /// Completed reloads: a caller that met `NOSCRIPT` reloads only when none
    /// completed since it sent its call.
    loads: Arc<AtomicU64>,
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            shas: ALL.iter().map(|s| (s.name, s.sha1())).collect(),
            loading: Arc::default(),
            loads: Arc::default(),
        }
    }

    /// A mark to take before sending a call, for [`Self::reload_after`].
    pub fn mark(&self) -> u64 {
        self.loads.load(Ordering::Acquire)
    }

    /// After a call sent at `mark` met `NOSCRIPT`: loads every script on every primary
    /// unless a reload completed since `mark` (then the scripts are there already).
    /// Returns true when this call loaded.
    pub async fn reload_after(
        &self,
        client: &Client,
        mark: u64,
    ) -> Result<bool, fred::error::Error> {
        let _one = self.loading.lock().await;
        if self.loads.load(Ordering::Acquire) != mark {
            return Ok(false);
        }
        self.load(client).await?;
        self.loads.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    /// The SHA1 Redis knows `script` by.
    pub fn sha(&self, script: &Script) -> &str {
        self.shas
            .iter()
            .find(|(name, _)| *name == script.name)
            .map(|(_, sha)| sha.as_str())
            .expect("every script of seckill-lua is in ALL")
    }

    /// `SCRIPT LOAD` of every script on every primary.
    pub async fn load(&self, client: &Client) -> Result<(), fred::error::Error> {
        for s in ALL {
            client.script_load_cluster::<(), _>(s.body).await?;
        }
        Ok(())
    }

    /// `EVALSHA` of `script`, loading the scripts again on `NOSCRIPT`.
    pub async fn eval(
        &self,
        client: &Client,
        script: &Script,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Evaluated, fred::error::Error> {
        let sha = self.sha(script);
        let mark = self.mark();
        match client
            .evalsha::<Value, _, _, _>(sha, keys.clone(), args.clone())
            .await
        {
            Err(e) if is_noscript(&e) => {
                tracing::info!(script = script.name, "NOSCRIPT: loading scripts again");
                let reloaded = self.reload_after(client, mark).await?;
                let value = client.evalsha::<Value, _, _, _>(sha, keys, args).await?;
                Ok(Evaluated { value, reloaded })
            }
            Ok(value) => Ok(Evaluated {
                value,
                reloaded: false,
            }),
            Err(e) => Err(e),
        }
    }
}

/// True for Redis's `NOSCRIPT` answer (the node does not know the SHA).
pub fn is_noscript(e: &fred::error::Error) -> bool {
    e.details().starts_with("NOSCRIPT") || e.to_string().contains("NOSCRIPT")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_has_its_sha_once() {
        let scripts = Scripts::new();
        for s in ALL {
            assert_eq!(scripts.sha(&s), s.sha1());
        }
    }
}
