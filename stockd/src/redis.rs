//! The Redis side: a pool of fred cluster clients (built by `seckill_daemon::redis`),
//! the Lua scripts (loaded on every primary at start, called by SHA, reloaded on
//! `NOSCRIPT` by `seckill_daemon::redis::Scripts`), and a deadline on every call so a
//! slow or dead node answers UNAVAILABLE instead of hanging.
//!
//! Writes a replica must hold before they are answered ([`Redis::call_acked`]) go
//! through [`seckill_daemon::ack`]: grouped per master, pipelined with one `WAIT` on a connection
//! lent to that pipeline alone.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fred::prelude::*;
use fred::types::config::ReconnectPolicy;
use fred::types::Value;
use seckill_daemon::ack::Acks;
use seckill_daemon::redis::{Retries, Scripts};
use seckill_lua::calls::Call;
use seckill_lua::scripts::Script;

use crate::config::RedisConfig;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// The Redis Cluster, as stockd uses it.
#[derive(Clone)]
pub struct Redis {
    pool: Pool,
    timeout: Duration,
    metrics: Metrics,
    /// Every script's SHA1, and the call that reloads them on `NOSCRIPT`.
    scripts: Scripts,
    /// Replica-acknowledged calls, grouped per master (none when `redis.replica_acks`
    /// is 0).
    acks: Option<std::sync::Arc<Acks>>,
    /// Raised on every reconnection and cluster-map change any pool client reports.
    topology: std::sync::Arc<AtomicU64>,
}

/// Every Redis Cluster stockd is configured with: the default one (`[redis]`'s
/// `nodes`), which holds the published-activity catalog, the meta hashes and the bans,
/// and each named one (`[redis.clusters.<name>]`), which holds only the stock, buyers,
/// streams, fences and sold-out flags of the activities placed on it. Hot-item
/// isolation: a sale on its own cluster shares no Redis node, connection or call queue
/// with the others.
#[derive(Clone)]
pub struct Clusters {
    default: Redis,
    named: BTreeMap<String, Redis>,
}

impl Clusters {
    /// Connects to every configured cluster. A cluster that is down does not stop the
    /// start: its client keeps reconnecting, and calls on it answer UNAVAILABLE.
    pub async fn connect(cfg: &RedisConfig, metrics: Metrics) -> anyhow::Result<Self> {
        let default = Redis::connect(cfg, &cfg.nodes, metrics.clone()).await?;
        let mut named = BTreeMap::new();
        for (name, cluster) in &cfg.clusters {
            let redis = Redis::connect(cfg, &cluster.nodes, metrics.clone())
                .await
                .map_err(|e| e.context(format!("redis.clusters.{name}")))?;
            named.insert(name.clone(), redis);
        }
        Ok(Self { default, named })
    }

    /// The default cluster: the catalog, the meta hashes, the bans, and the stock of
    /// every activity that names no cluster.
    pub fn default_cluster(&self) -> &Redis {
        &self.default
    }

    /// The cluster an activity's `redis_cluster` names; `None` when this stockd is not
    /// configured with it.
    pub fn get(&self, redis_cluster: &str) -> Option<&Redis> {
        match seckill_daemon::config::named_cluster(redis_cluster) {
            None => Some(&self.default),
            Some(name) => self.named.get(name),
        }
    }

    /// Whether `redis_cluster` names a configured cluster (the default included).
    pub fn knows(&self, redis_cluster: &str) -> bool {
        self.get(redis_cluster).is_some()
    }

    /// Every cluster, as (name, client), the default first under the name `default`.
    pub fn all(&self) -> impl Iterator<Item = (&str, &Redis)> {
        std::iter::once((seckill_daemon::config::DEFAULT_CLUSTER, &self.default))
            .chain(self.named.iter().map(|(n, r)| (n.as_str(), r)))
    }

    /// Closes every connection of every cluster.
    pub async fn quit(&self) {
        for (_, redis) in self.all() {
            redis.quit().await;
        }
    }
}

/// What a replica-acknowledged call got back.
#[derive(Debug)]
pub struct Acked {
    /// The script's answer.
    pub value: Value,
    /// True when `redis.replica_acks` replicas hold everything the call wrote.
    pub replicated: bool,
}

impl Redis {
    /// Builds the pool and starts connecting; waits up to the connect timeout for the
    /// first connection, and returns anyway (calls then fail with UNAVAILABLE until
    /// Redis is reachable).
    pub async fn connect(
        cfg: &RedisConfig,
        nodes: &[String],
        metrics: Metrics,
    ) -> anyhow::Result<Self> {
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let connect_timeout = Duration::from_millis(cfg.connect_timeout_ms);
        // One write per command: a GIVE written twice after a dropped connection would
        // create units. Reserve is idempotent by request id, so the caller's retry is
        // the safe retry.
        let retries = Retries {
            command_attempts: 1,
            reconnect: ReconnectPolicy::new_constant(0, 100),
        };
        let pool = seckill_daemon::redis::builder(nodes, timeout, connect_timeout, retries)
            .build_pool(cfg.pool_size)?;
        pool.connect();
        match tokio::time::timeout(connect_timeout, pool.wait_for_connect()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "redis not reachable yet"),
            Err(_) => tracing::warn!("redis not reachable yet (connect timeout)"),
        }
        let scripts = Scripts::new();
        let acks = if cfg.replica_acks > 0 {
            let mut clients = Vec::with_capacity(cfg.ack_connections);
            for _ in 0..cfg.ack_connections {
                let retries = Retries {
                    command_attempts: 1,
                    reconnect: ReconnectPolicy::new_constant(0, 100),
                };
                let c = seckill_daemon::redis::builder(nodes, timeout, connect_timeout, retries)
                    .build()?;
                // Not `init`: with the first connection retried, it would wait for a
                // Redis that may be down. Up to the connect timeout, as for the pool.
                drop(c.connect());
                let _ = tokio::time::timeout(connect_timeout, c.wait_for_connect()).await;
                clients.push(c);
            }
            Some(std::sync::Arc::new(Acks::new(
                clients,
                scripts.clone(),
                Some(metrics.redis_errors.with_label_values(&["noscript"])),
                cfg.replica_acks,
                Duration::from_millis(cfg.replica_ack_timeout_ms),
            )))
        } else {
            None
        };
        let topology = std::sync::Arc::new(AtomicU64::new(0));
        for client in pool.clients() {
            watch_topology(client, &topology);
        }
        let redis = Self {
            pool,
            timeout,
            metrics,
            scripts,
            acks,
            topology,
        };
        if let Err(e) = redis.load_scripts().await {
            tracing::warn!(error = %e, "cannot load scripts yet; will load on first NOSCRIPT");
        }
        Ok(redis)
    }

    /// `SCRIPT LOAD` of every script on every primary.
    pub async fn load_scripts(&self) -> Result<()> {
        self.deadline(self.scripts.load(self.client())).await
    }

    /// How many times a pool client reconnected to a node or saw the cluster's slot map
    /// change since start. A node that restarted (maybe empty) or a replica promoted in
    /// a failover (maybe behind its old master) shows here, with no command failing:
    /// the fence check reads every shard once when it moves ([`crate::fence`]).
    pub fn topology_changes(&self) -> u64 {
        self.topology.load(Ordering::Acquire)
    }

    /// One client of the pool (round robin).
    pub fn client(&self) -> &Client {
        self.pool.next()
    }

    /// Closes every connection.
    pub async fn quit(&self) {
        let _ = self.pool.quit().await;
        if let Some(acks) = &self.acks {
            acks.quit().await;
        }
    }

    /// Runs `fut` under the configured deadline, counting errors.
    pub async fn deadline<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, fred::error::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                let kind = if *e.kind() == fred::error::ErrorKind::Timeout {
                    "timeout"
                } else {
                    "error"
                };
                self.metrics.redis_errors.with_label_values(&[kind]).inc();
                if kind == "timeout" {
                    Err(Error::RedisTimeout(self.timeout.as_millis() as u64))
                } else {
                    Err(Error::Redis(e))
                }
            }
            Err(_) => {
                self.metrics
                    .redis_errors
                    .with_label_values(&["timeout"])
                    .inc();
                Err(Error::RedisTimeout(self.timeout.as_millis() as u64))
            }
        }
    }

    /// `EVALSHA` of `script` under the deadline, loading the scripts again when the
    /// node answers `NOSCRIPT` (a restarted node, a new primary after failover).
    pub async fn eval(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value> {
        let started = Instant::now();
        let out = self
            .deadline(self.scripts.eval(self.client(), script, keys, args))
            .await;
        if matches!(&out, Ok(e) if e.reloaded) {
            self.metrics
                .redis_errors
                .with_label_values(&["noscript"])
                .inc();
        }
        self.metrics
            .observe_lua(script.name, started.elapsed().as_secs_f64());
        out.map(|e| e.value)
    }

    /// One typed script call (`seckill_lua::calls`) through [`Self::eval`].
    pub async fn call<C: Call>(&self, call: C) -> Result<Value> {
        let (keys, args) = call.into_parts();
        self.eval(&C::SCRIPT, keys, args).await
    }

    /// One typed script call whose writes must reach `redis.replica_acks` replicas
    /// before it counts: queued on the master of `slot_key`'s slot and sent with the
    /// other calls ready for that master, `EVALSHA`s and one `WAIT` pipelined on a
    /// borrowed connection ([`seckill_daemon::ack`]). With `replica_acks` = 0 it is
    /// [`Self::call`], always `replicated`.
    ///
    /// Not `replicated` when fewer replicas answered in `replica_ack_timeout_ms`, when
    /// `WAIT` failed, or when the slot's master changed while the call ran (the script
    /// may have been redirected to the new master while `WAIT` asked the old one).
    pub async fn call_acked<C: Call>(&self, call: C, slot_key: &str) -> Result<Acked> {
        let Some(acks) = &self.acks else {
            return Ok(Acked {
                value: self.call(call).await?,
                replicated: true,
            });
        };
        let started = Instant::now();
        let script = C::SCRIPT;
        let out = self
            .deadline(acks.call_script(call, slot_key))
            .await
            .map(|(value, replicated)| Acked { value, replicated });
        let elapsed = started.elapsed().as_secs_f64();
        self.metrics.observe_lua(script.name, elapsed);
        match &out {
            Ok(a) if a.replicated => self.metrics.replica_acks(true, elapsed),
            Ok(_) => self.metrics.replica_acks(false, elapsed),
            Err(_) => {}
        }
        out
    }

    /// `GET` of an integer key; a missing key is `None`.
    pub async fn get_i64(&self, key: String) -> Result<Option<i64>> {
        self.deadline(self.client().get::<Option<i64>, _>(key))
            .await
    }

    /// `MGET` of keys in one slot; missing keys are `None`.
    pub async fn mget(&self, keys: Vec<String>) -> Result<Vec<Option<String>>> {
        self.deadline(self.client().mget::<Vec<Option<String>>, _>(keys))
            .await
    }

    /// `EXISTS` of one key.
    pub async fn exists(&self, key: String) -> Result<bool> {
        Ok(self.deadline(self.client().exists::<i64, _>(key)).await? > 0)
    }

    /// `HLEN`.
    pub async fn hlen(&self, key: String) -> Result<i64> {
        self.deadline(self.client().hlen::<i64, _>(key)).await
    }

    /// Units held by the buyer records of one buyers hash (`HVALS`; each record holds
    /// its reservation's k, one when it names none).
    pub async fn held_units(&self, key: String) -> Result<i64> {
        let records = self
            .deadline(self.client().hvals::<Vec<String>, _>(key))
            .await?;
        Ok(records
            .iter()
            .map(|r| i64::from(seckill_lua::messages::buyer_record_units(r)))
            .sum())
    }

    /// `ZREM` of one member; true when it was there.
    pub async fn zrem(&self, key: String, member: &str) -> Result<bool> {
        Ok(self
            .deadline(self.client().zrem::<i64, _, _>(key, member))
            .await?
            > 0)
    }

    /// `DEL` of one key; true when it existed.
    pub async fn del(&self, key: String) -> Result<bool> {
        Ok(self.deadline(self.client().del::<i64, _>(key)).await? > 0)
    }

    /// `SET key value NX`; true when this call set it.
    pub async fn set_nx(&self, key: String, value: &str) -> Result<bool> {
        let r: Option<String> = self
            .deadline(self.client().set::<Option<String>, _, _>(
                key,
                value,
                None,
                Some(fred::types::SetOptions::NX),
                false,
            ))
            .await?;
        Ok(r.is_some())
    }

    /// `PUBLISH`.
    pub async fn publish(&self, channel: &str, message: String) -> Result<()> {
        self.deadline(self.client().publish::<i64, _, _>(channel, message))
            .await
            .map(|_| ())
    }

    /// `HSET` of several fields.
    pub async fn hset(&self, key: String, fields: HashMap<String, String>) -> Result<()> {
        if fields.is_empty() {
            return Ok(());
        }
        self.deadline(self.client().hset::<i64, _, _>(key, fields))
            .await
            .map(|_| ())
    }

    /// `HDEL` of one field; true when it existed.
    pub async fn hdel(&self, key: &str, field: &str) -> Result<bool> {
        Ok(self
            .deadline(self.client().hdel::<i64, _, _>(key, field))
            .await?
            > 0)
    }

    /// `HGETALL`.
    pub async fn hgetall(&self, key: &str) -> Result<HashMap<String, String>> {
        self.deadline(self.client().hgetall::<HashMap<String, String>, _>(key))
            .await
    }

    /// `SADD` of one member.
    pub async fn sadd(&self, key: &str, member: String) -> Result<()> {
        self.deadline(self.client().sadd::<i64, _, _>(key, member))
            .await
            .map(|_| ())
    }

    /// Every entry of a stream, as (entry id, fields).
    pub async fn stream_entries(
        &self,
        key: String,
    ) -> Result<Vec<(String, HashMap<String, String>)>> {
        self.deadline(
            self.client()
                .xrange_values::<String, String, String, _, _, _>(key, "-", "+", None),
        )
        .await
    }
}

/// Raises `counter` on every reconnection and cluster change `client` reports, until
/// the client is dropped (its channels close).
fn watch_topology(client: &Client, counter: &std::sync::Arc<AtomicU64>) {
    use tokio::sync::broadcast::error::RecvError;
    let mut reconnects = client.reconnect_rx();
    let mut changes = client.cluster_change_rx();
    let counter = counter.clone();
    tokio::spawn(async move {
        loop {
            let got = tokio::select! {
                r = reconnects.recv() => r.map(|_| ()),
                r = changes.recv() => r.map(|_| ()),
            };
            match got {
                // Lagged: events were missed, which is an event too.
                Ok(()) | Err(RecvError::Lagged(_)) => {
                    counter.fetch_add(1, Ordering::AcqRel);
                }
                Err(RecvError::Closed) => return,
            }
        }
    });
}

/// The parts of a script's array answer.
pub fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(Error::Internal(format!(
            "script answered {other:?}, expected an array"
        ))),
    }
}

/// A script answer element as text.
pub fn text(v: &Value) -> String {
    v.as_str().map(|s| s.to_string()).unwrap_or_default()
}

/// A script answer element as an integer.
pub fn int(v: &Value) -> Result<i64> {
    v.as_i64()
        .ok_or_else(|| Error::Internal(format!("script answered {v:?}, expected an integer")))
}
