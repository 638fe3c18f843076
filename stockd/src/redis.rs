//! The Redis side: a pool of fred cluster clients (built by `seckill_daemon::redis`),
//! the Lua scripts (loaded on every primary at start, called by SHA, reloaded on
//! `NOSCRIPT` by `seckill_daemon::redis::Scripts`), and a deadline on every call so a
//! slow or dead node answers UNAVAILABLE instead of hanging.
//!
//! Writes a replica must hold before they are answered ([`Redis::call_acked`]) go on
//! clients of their own ([`AckClients`]): the script and a `WAIT` are pipelined on the
//! connection to the slot's master, and that connection is lent to the one call until
//! `WAIT` answers. `WAIT` counts the replicas that acknowledged everything the
//! connection wrote, and it blocks the connection meanwhile: on a shared connection it
//! would hold up every other command behind it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fred::prelude::*;
use fred::types::config::{Options, ReconnectPolicy};
use fred::types::{ClusterHash, CustomCommand, Value};
use seckill_daemon::redis::{Retries, Scripts};
use seckill_lua::calls::Call;
use seckill_lua::scripts::Script;
use tokio::sync::Semaphore;

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
    /// Clients lent to one replica-acknowledged call at a time (none when
    /// `redis.replica_acks` is 0).
    acks: Option<std::sync::Arc<AckClients>>,
    /// `WAIT`'s arguments.
    replica_acks: u32,
    ack_timeout: Duration,
}

/// Clients for [`Redis::call_acked`], each lent to one call at a time.
pub struct AckClients {
    free: Mutex<Vec<Client>>,
    permits: Semaphore,
}

impl AckClients {
    async fn borrow(&self) -> Option<Borrowed<'_>> {
        let permit = self.permits.acquire().await.ok()?;
        let client = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        permit.forget();
        Some(Borrowed {
            owner: self,
            client: Some(client),
        })
    }

    async fn quit(&self) {
        let clients: Vec<Client> = self.free.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for c in clients {
            let _ = c.quit().await;
        }
    }
}

/// A borrowed ack client; goes back on drop (also when the caller's future is dropped
/// while `WAIT` runs: the next borrower's `WAIT` then also covers the earlier write,
/// which only makes it wait for more).
struct Borrowed<'a> {
    owner: &'a AckClients,
    client: Option<Client>,
}

impl Borrowed<'_> {
    fn client(&self) -> &Client {
        self.client.as_ref().expect("held until drop")
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            self.owner
                .free
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(c);
            self.owner.permits.add_permits(1);
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
    pub async fn connect(cfg: &RedisConfig, metrics: Metrics) -> anyhow::Result<Self> {
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let connect_timeout = Duration::from_millis(cfg.connect_timeout_ms);
        // One write per command: a GIVE written twice after a dropped connection would
        // create units. Reserve is idempotent by request id, so the caller's retry is
        // the safe retry.
        let retries = Retries {
            command_attempts: 1,
            reconnect: ReconnectPolicy::new_constant(0, 100),
        };
        let pool = seckill_daemon::redis::builder(&cfg.nodes, timeout, connect_timeout, retries)
            .build_pool(cfg.pool_size)?;
        pool.connect();
        match tokio::time::timeout(connect_timeout, pool.wait_for_connect()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "redis not reachable yet"),
            Err(_) => tracing::warn!("redis not reachable yet (connect timeout)"),
        }
        let acks = if cfg.replica_acks > 0 {
            let mut clients = Vec::with_capacity(cfg.ack_connections);
            for _ in 0..cfg.ack_connections {
                let retries = Retries {
                    command_attempts: 1,
                    reconnect: ReconnectPolicy::new_constant(0, 100),
                };
                let c =
                    seckill_daemon::redis::builder(&cfg.nodes, timeout, connect_timeout, retries)
                        .build()?;
                c.init().await.ok();
                clients.push(c);
            }
            Some(std::sync::Arc::new(AckClients {
                permits: Semaphore::new(clients.len()),
                free: Mutex::new(clients),
            }))
        } else {
            None
        };
        let redis = Self {
            pool,
            timeout,
            metrics,
            scripts: Scripts::new(),
            acks,
            replica_acks: cfg.replica_acks,
            ack_timeout: Duration::from_millis(cfg.replica_ack_timeout_ms),
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

    /// True when writes wait for replicas (`redis.replica_acks` > 0).
    pub fn waits_for_replicas(&self) -> bool {
        self.acks.is_some()
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
    /// before it counts: `EVALSHA` and `WAIT` pipelined on a borrowed client's
    /// connection to the master of `slot_key`'s slot (one round trip; the call and
    /// its wait on one connection, as `WAIT` requires). With `replica_acks` = 0 it is
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
        let (keys, args) = call.into_parts();
        let script = C::SCRIPT;
        // EVALSHA's arguments, built once (the strings move in; a resend after NOSCRIPT
        // clones reference-counted values, not the bytes).
        let mut eval: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
        eval.push(self.scripts.sha(&script).into());
        eval.push((keys.len() as i64).into());
        eval.extend(keys.into_iter().map(Value::from));
        eval.extend(args.into_iter().map(Value::from));
        let slot = fred::util::redis_keyslot(slot_key.as_bytes());
        let out = self
            .deadline(async {
                let Some(lent) = acks.borrow().await else {
                    return Err(fred::error::Error::new(
                        fred::error::ErrorKind::Canceled,
                        "ack clients closed",
                    ));
                };
                let client = lent.client();
                let mut reloaded = false;
                loop {
                    let master = master_of(client, slot);
                    let mark = self.scripts.mark();
                    let (value, waited) = self.pipeline_wait(client, eval.clone(), slot).await;
                    match value {
                        Err(e) if seckill_daemon::redis::is_noscript(&e) && !reloaded => {
                            tracing::info!(script = script.name, "NOSCRIPT: loading scripts again");
                            if self.scripts.reload_after(client, mark).await? {
                                self.metrics
                                    .redis_errors
                                    .with_label_values(&["noscript"])
                                    .inc();
                            }
                            reloaded = true;
                        }
                        Err(e) => return Err(e),
                        Ok(value) => {
                            let moved = master.is_none() || master != master_of(client, slot);
                            let replicated = match waited {
                                Ok(n) => !moved && n >= i64::from(self.replica_acks),
                                Err(e) => {
                                    tracing::debug!(error = %e, "WAIT failed");
                                    false
                                }
                            };
                            return Ok(Acked { value, replicated });
                        }
                    }
                }
            })
            .await;
        let elapsed = started.elapsed().as_secs_f64();
        self.metrics.observe_lua(script.name, elapsed);
        match &out {
            Ok(a) if a.replicated => self.metrics.replica_acks(true, elapsed),
            Ok(_) => self.metrics.replica_acks(false, elapsed),
            Err(_) => {}
        }
        out
    }

    /// `EVALSHA` (`eval`: sha, key count, keys, args) then `WAIT`, one pipeline on
    /// `client`; the two answers.
    async fn pipeline_wait(
        &self,
        client: &Client,
        eval: Vec<Value>,
        slot: u16,
    ) -> (
        Result<Value, fred::error::Error>,
        Result<i64, fred::error::Error>,
    ) {
        let p = client.pipeline();
        let on_slot = Options {
            cluster_hash: Some(ClusterHash::Custom(slot)),
            ..Default::default()
        };
        // A pipeline has no EVALSHA of its own (fred routes scripts by their keys):
        // the command is spelled out, routed to the slot like the WAIT after it.
        let queued: Result<(), fred::error::Error> = async {
            p.custom::<(), _>(
                CustomCommand::new_static("EVALSHA", ClusterHash::Custom(slot), false),
                eval,
            )
            .await?;
            p.with_options(&on_slot)
                .wait::<()>(
                    i64::from(self.replica_acks),
                    self.ack_timeout.as_millis() as i64,
                )
                .await?;
            Ok(())
        }
        .await;
        if let Err(e) = queued {
            return (Err(e.clone()), Err(e));
        }
        let mut answers = p.try_all::<Value>().await.into_iter();
        let value = answers.next().unwrap_or_else(|| {
            Err(fred::error::Error::new(
                fred::error::ErrorKind::Unknown,
                "pipeline lost its first answer",
            ))
        });
        let waited = answers
            .next()
            .unwrap_or_else(|| {
                Err(fred::error::Error::new(
                    fred::error::ErrorKind::Unknown,
                    "pipeline lost its WAIT answer",
                ))
            })
            .and_then(|v| {
                v.as_i64().ok_or_else(|| {
                    fred::error::Error::new(
                        fred::error::ErrorKind::Parse,
                        "WAIT answered no integer",
                    )
                })
            });
        (value, waited)
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

/// The master the client's routing table names for `slot`.
fn master_of(client: &Client, slot: u16) -> Option<fred::types::config::Server> {
    client
        .cached_cluster_state()
        .and_then(|s| s.get_server(slot).cloned())
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
