//! Recompute: rebuild an activity's shards from MySQL after Redis lost state (a
//! restart without data, a flush, a failover that lost writes, a fence key gone).
//!
//! Steps, per activity (every shard of every item together, since the shards share
//! one total):
//! 1. close every shard: `DEL` its fence, so no reserve script can take a unit any
//!    more (they answer LOST; stockd answers UNAVAILABLE);
//! 2. read every entry of every shard stream (reservations made before the close);
//! 3. in one MySQL snapshot: each item's `stock`, its active (PENDING/PAID) orders,
//!    and which stream entries already are orders; the others are in flight;
//! 4. per shard: buyers = active orders + in-flight reservations of users whose
//!    record lives there; stock = split of (MySQL stock − in flight);
//! 5. `WARM` with force under a new epoch, which opens the shard again; then the
//!    sold-out flags, the meta hash and the activity set.
//!
//! Lost state is found three ways: the reserve script answers LOST (a fence is gone)
//! or BEHIND (the shard's reservation sequence is below one this process already saw
//! handed out under the same fence epoch: Redis lost writes but kept the fence, as
//! after a failover to a lagging replica), and a periodic check of every shard's fence
//! and sequence finds either even when nobody is buying. A failover or restart that
//! lost nothing needs no rebuild and gets none.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use seckill_lua::calls::WarmCall;
use seckill_lua::clock::now_ms;
use seckill_lua::ids::epoch_from_millis;
use seckill_lua::messages::entry;
use seckill_lua::{home_shard, keys, split_stock, ReservationId};

use crate::app::App;
use crate::catalog::ActivityEntry;
use crate::db;
use crate::error::Result;
use crate::shard::HighWater;

/// What a recompute found and wrote, per item.
#[derive(Debug, Clone, Default)]
pub struct Rebuilt {
    pub item: u64,
    /// Units written to Redis (sum over shards).
    pub stock: i64,
    pub in_flight: i64,
    pub active_orders: i64,
}

/// A reservation read from a stream.
#[derive(Debug)]
struct StreamEntry {
    shard: u32,
    rid: String,
    user: String,
    item: u64,
    request: String,
}

impl App {
    /// Marks the activity unavailable and starts a recompute unless one is running.
    /// The task retries until it succeeds or the process shuts down.
    pub fn trigger_recompute(self: &Arc<Self>, entry: &Arc<ActivityEntry>, why: &str) {
        entry.available.store(false, Ordering::Release);
        if entry
            .recomputing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        tracing::warn!(activity = entry.id(), why, "recomputing from MySQL");
        let app = self.clone();
        let entry = entry.clone();
        tokio::spawn(async move {
            loop {
                match app.recompute(&entry).await {
                    Ok(_) => {
                        app.metrics.recomputes.with_label_values(&["ok"]).inc();
                        entry.available.store(true, Ordering::Release);
                        break;
                    }
                    Err(e) => {
                        app.metrics.recomputes.with_label_values(&["error"]).inc();
                        tracing::warn!(activity = entry.id(), error = %e, "recompute failed; retrying");
                        if app.shutdown.is_fired() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
            }
            entry.recomputing.store(false, Ordering::Release);
        });
    }

    /// Runs the recompute and waits for it (used by Reconcile's repair). The
    /// activity is unavailable meanwhile.
    pub async fn recompute_now(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
    ) -> Result<Vec<Rebuilt>> {
        entry.available.store(false, Ordering::Release);
        // Wait for a running background recompute to finish, then take the slot.
        while entry
            .recomputing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let out = self.recompute(entry).await;
        let label = if out.is_ok() { "ok" } else { "error" };
        self.metrics.recomputes.with_label_values(&[label]).inc();
        entry.recomputing.store(false, Ordering::Release);
        match out {
            Ok(r) => {
                entry.available.store(true, Ordering::Release);
                Ok(r)
            }
            Err(e) => {
                // Leave it to the background path to finish the job.
                self.trigger_recompute(entry, "repair failed");
                Err(e)
            }
        }
    }

    async fn recompute(&self, entry: &ActivityEntry) -> Result<Vec<Rebuilt>> {
        let a = entry.id();
        let shards = entry.shards();
        // 1. Close.
        for i in 0..shards {
            self.redis.del(keys::fence(a, i)).await?;
        }
        // 2. Reservations already in the streams.
        let mut entries = Vec::new();
        for i in 0..shards {
            for (_id, fields) in self.redis.stream_entries(keys::orders_stream(a, i)).await? {
                let (Some(rid), Some(user), Some(item)) = (
                    fields.get(entry::RESERVATION),
                    fields.get(entry::USER),
                    fields.get(entry::ITEM).and_then(|s| s.parse::<u64>().ok()),
                ) else {
                    continue;
                };
                entries.push(StreamEntry {
                    shard: i,
                    rid: rid.clone(),
                    user: user.clone(),
                    item,
                    request: fields.get(entry::REQUEST).cloned().unwrap_or_default(),
                });
            }
        }
        // 3. MySQL, one snapshot.
        let rids: Vec<String> = entries.iter().map(|e| e.rid.clone()).collect();
        let (records, known) = db::snapshot(&self.db, a, &rids).await?;
        // 4. Plan every shard.
        let mut buyers: Vec<HashMap<u64, HashMap<String, String>>> =
            (0..shards).map(|_| HashMap::new()).collect();
        let mut counts: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut report = Vec::new();
        for rec in &records {
            let in_flight: Vec<&StreamEntry> = entries
                .iter()
                .filter(|e| e.item == rec.item_id && !known.contains(&e.rid))
                .collect();
            let avail = (i64::from(rec.stock) - in_flight.len() as i64).max(0);
            counts.insert(rec.item_id, split_stock(avail as u64, shards));
            for (rid, user, request) in &rec.active {
                let shard = rid
                    .parse::<ReservationId>()
                    .ok()
                    .map(|r| r.shard)
                    .filter(|s| *s < shards)
                    .unwrap_or_else(|| home_shard(user, shards));
                buyers[shard as usize]
                    .entry(rec.item_id)
                    .or_default()
                    .insert(user.clone(), format!("{rid}|{request}"));
            }
            for e in &in_flight {
                buyers[e.shard as usize]
                    .entry(rec.item_id)
                    .or_default()
                    .insert(e.user.clone(), format!("{}|{}", e.rid, e.request));
            }
            report.push(Rebuilt {
                item: rec.item_id,
                stock: avail,
                in_flight: in_flight.len() as i64,
                active_orders: rec.active.len() as i64,
            });
        }
        // 5. Write and open each shard under a new epoch.
        let epoch = epoch_from_millis(now_ms().max(0) as u64);
        for i in 0..shards {
            let mut warm = WarmCall::new(a, i, &epoch, true);
            for rec in &records {
                let s = rec.item_id;
                self.redis.del(keys::buyers(a, i, s)).await?;
                if let Some(b) = buyers[i as usize].remove(&s) {
                    self.redis.hset(keys::buyers(a, i, s), b).await?;
                }
                warm.push(s, counts[&s][i as usize]);
            }
            self.redis.call(warm).await?;
        }
        for r in &report {
            if r.stock == 0 {
                self.mark_sold_out(a, r.item).await?;
            } else {
                self.clear_sold_out(a, r.item).await?;
            }
        }
        self.write_meta(&entry.activity).await?;
        tracing::info!(activity = a, items = ?report, "recomputed from MySQL");
        Ok(report)
    }

    /// True when every shard of the activity has its fence.
    pub async fn fences_present(&self, a: u64, shards: u32) -> Result<bool> {
        Ok(self
            .shard_marks(a, shards)
            .await?
            .iter()
            .all(|(fence, _)| fence.is_some()))
    }

    /// Per shard: its fence (epoch) and its reservation sequence, one `MGET` each.
    async fn shard_marks(&self, a: u64, shards: u32) -> Result<Vec<(Option<String>, u64)>> {
        let futs = (0..shards).map(|i| self.redis.mget(vec![keys::fence(a, i), keys::seq(a, i)]));
        Ok(futures::future::try_join_all(futs)
            .await?
            .into_iter()
            .map(|v| {
                let mut v = v.into_iter();
                let fence = v.next().flatten();
                let seq = v.next().flatten().and_then(|s| s.parse().ok()).unwrap_or(0);
                (fence, seq)
            })
            .collect())
    }

    /// Redis answered shard `shard`'s sequence as `found`, below this process's
    /// high-water mark under the same epoch: writes were lost (a failover to a replica
    /// that had not received them, an AOF that dropped its last second). The
    /// reservations in the gap were promised and are gone from Redis; orderd may
    /// already hold some of them. Report the gap once and rebuild from MySQL.
    pub fn lost_writes(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
        shard: u32,
        seen: &HighWater,
        found: u64,
    ) {
        let Some(gap) = entry.take_behind(shard, seen, found) else {
            // Another call reported this gap already; the recompute is under way.
            self.trigger_recompute(entry, "Redis lost writes");
            return;
        };
        self.metrics.lost_writes.inc();
        self.metrics.lost_reservations.inc_by(gap);
        tracing::error!(
            activity = entry.id(),
            shard,
            epoch = %seen.epoch,
            found,
            gap,
            "Redis lost writes: reservation sequences {}..={} of this shard were handed out \
             and are gone from Redis (those orderd did not read yet are lost)",
            found + 1,
            found + gap,
        );
        self.trigger_recompute(entry, "Redis lost writes");
    }

    /// One pass of the fence check over every activity whose window has not ended:
    /// a missing fence starts a recompute; an activity whose fences are all there
    /// (at start-up) opens.
    pub async fn check_fences(self: &Arc<Self>) {
        let now = now_ms();
        for entry in self.catalog.all() {
            if entry.end_ms() <= now || entry.recomputing.load(Ordering::Acquire) {
                continue;
            }
            // Marks first, Redis second: whatever this process saw before the read,
            // a Redis that lost nothing has at least reached.
            let seen: Vec<HighWater> = (0..entry.shards()).map(|i| entry.high_water(i)).collect();
            let marks = match self.shard_marks(entry.id(), entry.shards()).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(activity = entry.id(), error = %e, "fence check failed");
                    continue;
                }
            };
            if marks.iter().any(|(fence, _)| fence.is_none()) {
                self.trigger_recompute(&entry, "fence missing");
                continue;
            }
            let behind = marks
                .iter()
                .zip(&seen)
                .enumerate()
                .find(|(_, ((fence, seq), hw))| {
                    fence.as_deref() == Some(hw.epoch.as_str()) && *seq < hw.seq
                });
            if let Some((i, ((_, seq), hw))) = behind {
                self.lost_writes(&entry, i as u32, hw, *seq);
                continue;
            }
            if !entry.is_available() && !entry.recomputing.load(Ordering::Acquire) {
                entry.available.store(true, Ordering::Release);
            }
        }
    }

    /// Fence check every `stock.fence_check_ms` until shutdown.
    pub async fn fence_loop(self: Arc<Self>) {
        let period = Duration::from_millis(self.config.stock.fence_check_ms);
        loop {
            self.check_fences().await;
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = self.shutdown.clone().wait() => return,
            }
        }
    }
}
