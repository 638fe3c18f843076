//! orderd's Redis side: a cluster client, the consumer-group stream commands, and
//! the release script the stock-return relay calls.
//!
//! Reads never use `BLOCK`: fred multiplexes every command to a node over one
//! connection, and a blocked `XREADGROUP` would stall the other streams of that node.
//! Consumers poll instead (see `consumer.block_ms`).
//!
//! One [`Redis`] per configured cluster ([`crate::clusters`]); a handle knows nothing of
//! placement, its caller picks the cluster. Dead letters are appended to the stream
//! [`DLQ_STREAM`] (`sk:dlq`) on the default cluster, next to the `dead_letters` table, so
//! operators can tail them without MySQL.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::streams::{XPendingArgs, XID};
use fred::types::Value;
use seckill_daemon::ack::Acks;
use seckill_daemon::redis::{Retries, Scripts};
use seckill_lua::calls::{Call, ReleaseCall, SoldOutClearCall};
use seckill_lua::keys;
use seckill_lua::messages::SoldOut;
use seckill_lua::{ActivityId, ItemId, ReservationId, Shard};

use crate::config::RedisConfig;
use crate::error::{Error, Result};

/// Stream of dead letters: the contract's [`keys::DLQ_STREAM`].
pub use seckill_lua::keys::DLQ_STREAM;

/// One stream entry: its id and its fields.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: String,
    pub fields: HashMap<String, String>,
}

/// What the release script said (`Released { left }` or `NotHeld`).
pub use seckill_lua::calls::Released as Release;

/// A cheap, cloneable handle on the cluster.
#[derive(Clone)]
pub struct Redis {
    client: Client,
    scripts: Scripts,
    /// Releases a replica must hold (`redis.replica_acks`), on a client of their own:
    /// `WAIT` blocks its connection, and the consumers' reads must not queue behind it.
    acks: Option<Arc<Acks>>,
    /// Deadline of one acknowledged release: the command's and the `WAIT`'s.
    ack_deadline: Duration,
    connect_timeout: Duration,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Redis(..)")
    }
}

impl Redis {
    /// A client for the cluster reached through `nodes`, with `cfg`'s deadlines, that
    /// connects in the background: this returns at once, the first connection is tried
    /// (and retried forever, exponential back-off capped at 2 s) like every later
    /// reconnection, and commands sent before it exists fail after `cfg.timeout_ms`. So
    /// a cluster that is down when orderd starts neither stops it nor delays the other
    /// clusters ([`crate::clusters`]). Scripts are called by SHA, loaded on this
    /// cluster on `NOSCRIPT`. Needs a Tokio runtime (it spawns the connection task).
    pub fn start(nodes: &[String], cfg: &RedisConfig) -> Result<Self> {
        // The reconnect policy applies to the first connection too (the builder's
        // `fail_fast = false`); the task drives the connections until `quit`.
        let connect = |command_attempts| -> Result<Client> {
            let retries = Retries {
                command_attempts,
                reconnect: ReconnectPolicy::new_exponential(0, 100, 2000, 2),
            };
            let c = seckill_daemon::redis::builder(
                nodes,
                Duration::from_millis(cfg.timeout_ms),
                Duration::from_millis(cfg.connect_timeout_ms),
                retries,
            )
            .build()?;
            drop(c.connect());
            Ok(c)
        };
        // Stream reads, acks and claims are idempotent; a lost connection retries them.
        let client = connect(3)?;
        let scripts = Scripts::new();
        let acks = if cfg.replica_acks > 0 {
            // One client: the relay of a cluster sends one release at a time. A release
            // is idempotent too, but its retry is the relay's next pass.
            let c = connect(1)?;
            // orderd does not count script reloads (neither does its other client).
            Some(Arc::new(Acks::new(
                vec![c],
                scripts.clone(),
                None,
                cfg.replica_acks,
                Duration::from_millis(cfg.replica_ack_timeout_ms),
            )))
        } else {
            None
        };
        Ok(Self {
            client,
            scripts,
            acks,
            ack_deadline: Duration::from_millis(cfg.timeout_ms + cfg.replica_ack_timeout_ms),
            connect_timeout: Duration::from_millis(cfg.connect_timeout_ms),
        })
    }

    /// Waits up to `redis.connect_timeout_ms` for the release client's first connection,
    /// so the relay's first pass does not fail for want of a routing table. Returns at
    /// once without `redis.replica_acks`.
    pub async fn releases_ready(&self) {
        if let Some(acks) = &self.acks {
            acks.wait_for_connect(self.connect_timeout).await;
        }
    }

    /// The underlying client (tests and tools).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// One typed script call (`seckill_lua::calls`), by SHA, reloaded on `NOSCRIPT`.
    async fn call<C: Call>(&self, call: C) -> Result<Value> {
        let (keys, args) = call.into_parts();
        Ok(self
            .scripts
            .eval(&self.client, &C::SCRIPT, keys, args)
            .await?
            .value)
    }

    /// The RELEASE script for `rid` held by `user`: drop the buyer record if it still
    /// names `rid`, and give its units (the k the record holds) back to the shard when
    /// `return_unit`. Also whether `redis.replica_acks` replicas hold what it wrote
    /// (always true with `replica_acks` = 0); a `NOT_HELD` rewrites the shard's fence,
    /// so its acknowledgement covers an earlier call's release too.
    pub async fn release(
        &self,
        rid: &ReservationId,
        user: &str,
        return_unit: bool,
    ) -> Result<(Release, bool)> {
        let call = ReleaseCall::new(rid, user, return_unit);
        let fence = keys::fence(rid.activity, rid.shard);
        let (value, replicated) = self.call_acked(call, &fence, "release").await?;
        let reply = value.into_array();
        let outcome = reply
            .first()
            .and_then(|v| v.as_string())
            .unwrap_or_default();
        let left = reply.get(1).and_then(|v| v.as_i64()).unwrap_or(-1);
        let units = reply.get(2).and_then(|v| v.as_i64()).unwrap_or(0);
        Release::from_reply(&outcome, left, units)
            .map(|r| (r, replicated))
            .ok_or_else(|| Error::Internal(format!("release answered {outcome:?}")))
    }

    /// `call` and, with `redis.replica_acks` > 0, its `WAIT` on the connection that
    /// carried it (`slot_key` names the slot), within the ack deadline: the script's
    /// answer and whether the replicas hold it (always true without acks).
    async fn call_acked<C: Call>(
        &self,
        call: C,
        slot_key: &str,
        what: &'static str,
    ) -> Result<(Value, bool)> {
        let Some(acks) = &self.acks else {
            return Ok((self.call(call).await?, true));
        };
        Ok(
            tokio::time::timeout(self.ack_deadline, acks.call_script(call, slot_key))
                .await
                .map_err(|_| {
                    fred::error::Error::new(
                        fred::error::ErrorKind::Timeout,
                        format!("{what} and WAIT timed out"),
                    )
                })??,
        )
    }

    /// Units came back: clear the sold-out flag of `(a, s)` and announce it. The clear
    /// counts a change (`scripts/soldout_clear.lua`), so a stockd's sold-out mark decided
    /// from a look taken before this unit came back is refused. Answers whether
    /// `redis.replica_acks` replicas hold the clear: one on the master alone is lost to a
    /// failover (the flag back, the change count back), so the relay keeps its row
    /// until a pass's clear is acknowledged.
    pub async fn clear_sold_out(&self, a: ActivityId, s: ItemId) -> Result<bool> {
        let (_, replicated) = self
            .call_acked(
                SoldOutClearCall::new(a, s),
                &keys::changes(a, s),
                "sold-out clear",
            )
            .await?;
        let msg = SoldOut {
            activity: a,
            item: s,
            sold_out: false,
        };
        let _: i64 = self
            .client
            .publish(keys::SOLD_OUT_CHANNEL, msg.encode())
            .await?;
        Ok(replicated)
    }

    /// The reservation id the buyer record of `user` names and the units it holds,
    /// if any.
    pub async fn buyer_reservation(
        &self,
        a: ActivityId,
        shard: Shard,
        s: ItemId,
        user: &str,
    ) -> Result<Option<(String, u32)>> {
        let held: Option<String> = self.client.hget(keys::buyers(a, shard, s), user).await?;
        Ok(held.map(|h| {
            let units = seckill_lua::messages::buyer_record_units(&h);
            (h.split('|').next().unwrap_or_default().to_string(), units)
        }))
    }

    /// `XGROUP CREATE stream group 0 MKSTREAM`; an existing group is fine.
    pub async fn ensure_group(&self, stream: &str, group: &str) -> Result<()> {
        match self
            .client
            .xgroup_create::<Value, _, _, _>(stream, group, "0", true)
            .await
        {
            Err(e) if e.details().contains("BUSYGROUP") => Ok(()),
            other => other.map(|_| ()).map_err(Error::from),
        }
    }

    /// `XREADGROUP GROUP g c COUNT n STREAMS stream >`: new entries, no blocking.
    pub async fn read_new(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        count: u64,
    ) -> Result<Vec<Entry>> {
        let reply: Value = self
            .client
            .xreadgroup(group, consumer, Some(count), None, false, stream, ">")
            .await?;
        // [[stream, [[id, [f, v, ...]], ...]]] or nil.
        let mut out = Vec::new();
        for per_stream in reply.into_array() {
            let mut parts = per_stream.into_array().into_iter();
            let _name = parts.next();
            if let Some(entries) = parts.next() {
                out.extend(parse_entries(entries));
            }
        }
        Ok(out)
    }

    /// `XAUTOCLAIM stream g c min_idle 0-0 COUNT n`: entries pending longer than
    /// `min_idle_ms` on any consumer (this one included) move to this consumer, and
    /// their delivery counts go up. Scans the whole pending list in one pass.
    pub async fn autoclaim(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
        count: u64,
    ) -> Result<Vec<Entry>> {
        let mut start = "0-0".to_string();
        let mut out = Vec::new();
        loop {
            let reply: Value = self
                .client
                .xautoclaim(
                    stream,
                    group,
                    consumer,
                    min_idle_ms,
                    XID::Manual(start.clone().into()),
                    Some(count),
                    false,
                )
                .await?;
            let mut parts = reply.into_array().into_iter();
            let next = parts
                .next()
                .and_then(|v| v.as_string())
                .unwrap_or_else(|| "0-0".into());
            if let Some(entries) = parts.next() {
                out.extend(parse_entries(entries));
            }
            if next == "0-0" || out.len() as u64 >= count {
                return Ok(out);
            }
            start = next;
        }
    }

    /// Delivery counts of this consumer's pending entries with ids in `[min, max]`.
    pub async fn deliveries(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        min: &str,
        max: &str,
        count: u64,
    ) -> Result<HashMap<String, u64>> {
        let args = XPendingArgs {
            idle: None,
            start: Some(XID::Manual(min.to_string().into())),
            end: Some(XID::Manual(max.to_string().into())),
            count: Some(count),
            consumer: Some(consumer.to_string().into()),
        };
        let reply: Value = self.client.xpending(stream, group, args).await?;
        let mut out = HashMap::new();
        for row in reply.into_array() {
            let row = row.into_array();
            if let (Some(id), Some(n)) = (
                row.first().and_then(|v| v.as_string()),
                row.get(3).and_then(|v| v.as_u64()),
            ) {
                out.insert(id, n);
            }
        }
        Ok(out)
    }

    /// `XACK` and `XDEL` in one `MULTI`/`EXEC` (one key, so one slot): a written entry
    /// leaves the pending list and the stream together, so the stream's length is the
    /// backlog. Two separate calls left, after a kill between them, an entry that was
    /// acknowledged (no consumer would ever claim it) but still in the stream.
    pub async fn ack_and_delete(&self, stream: &str, group: &str, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let trx = self.client.multi();
        let _: () = trx.xack(stream, group, ids.to_vec()).await?;
        let _: () = trx.xdel(stream, ids.to_vec()).await?;
        let _: Value = trx.exec(true).await?;
        Ok(())
    }

    /// How many entries of `stream` are delivered to some consumer of `group` and not
    /// acknowledged (the `XPENDING` summary's count).
    pub async fn pending_count(&self, stream: &str, group: &str) -> Result<u64> {
        let reply: Value = self.client.xpending(stream, group, ()).await?;
        Ok(reply
            .into_array()
            .first()
            .and_then(|v| v.as_u64())
            .unwrap_or(0))
    }

    /// Entries in the stream (the backlog: written entries are deleted).
    pub async fn stream_len(&self, stream: &str) -> Result<u64> {
        Ok(self.client.xlen(stream).await?)
    }

    /// Appends a dead letter to [`DLQ_STREAM`].
    pub async fn push_dead_letter(
        &self,
        stream: &str,
        entry_id: &str,
        rid: &str,
        error: &str,
        deliveries: u64,
    ) -> Result<()> {
        let _: Value = self
            .client
            .xadd(
                DLQ_STREAM,
                false,
                None,
                "*",
                vec![
                    ("stream", stream.to_string()),
                    ("entry", entry_id.to_string()),
                    ("rid", rid.to_string()),
                    ("error", error.to_string()),
                    ("deliveries", deliveries.to_string()),
                ],
            )
            .await?;
        Ok(())
    }

    /// Closes the connections.
    pub async fn quit(&self) {
        if let Some(acks) = &self.acks {
            acks.quit().await;
        }
        let _ = self.client.quit().await;
    }
}

/// `[[id, [f, v, ...]], ...]` → entries; deleted entries (`[id, nil]`) get no fields.
fn parse_entries(v: Value) -> Vec<Entry> {
    v.into_array()
        .into_iter()
        .filter_map(|e| {
            let mut parts = e.into_array().into_iter();
            let id = parts.next()?.as_string()?;
            let mut fields = HashMap::new();
            let flat = parts.next().map(Value::into_array).unwrap_or_default();
            let mut it = flat.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                if let (Some(k), Some(v)) = (k.as_string(), v.as_string()) {
                    fields.insert(k, v);
                }
            }
            Some(Entry { id, fields })
        })
        .collect()
}
