//! The fence check: finds lost Redis state while nobody buys, and opens activities new
//! to this process (once the start-up check has claimed the ones it checks:
//! [`crate::catalog::Catalog::may_open`]). Reading one shard is one `MGET` of its fence (epoch) and its
//! reservation sequence: a missing fence (a node back empty, a flush, a key evicted or
//! deleted) starts a rebuild; a sequence below this process's high-water mark under the
//! same epoch (a failover to a replica that lagged) is reported and rebuilt.
//!
//! Reading every shard of every open activity each period made an idle stockd's Redis
//! traffic grow with the number of activities (issue 15, item 5: 8 `MGET`s per activity
//! per `stock.fence_check_ms`). Now each period reads:
//! - every shard of the activities waiting to open (new to this process, or a check that
//!   failed): few, and none once they are open;
//! - then whole activities in id order from where the last period stopped, until
//!   `stock.fence_check_shards` shards are read (the round);
//! - every shard of every open activity instead (a full pass) when a Redis client
//!   reconnected to a node or saw the slot map change since the last period (a node that
//!   restarted, maybe empty; a replica promoted, maybe behind), or when the last period
//!   found a loss (a flush of a node shows in the first shards of it the round reads;
//!   the pass finds the others at once, not one round later).
//!
//! Bounds, with `T` = `stock.fence_check_ms`, `B` = `stock.fence_check_shards` and `S` the
//! open shards: an idle stockd sends at most `B` (plus one activity's shards) `MGET`s per
//! `T`, whatever `S`. A node restarted or failed over is read in full within about `T` of
//! fred's reconnection; a flushed node within `2T` (the round reads every node each
//! period once `B` covers a few activities); a loss confined to one shard within
//! `ceil(S / B)` periods, or at its next reservation: the scripts answer LOST for a
//! missing key on every call, and BEHIND for a rewound shard in the stockd that holds
//! its high-water mark. A peer without that mark may still reserve on a rewound shard
//! until a check finds it (docs/stockd.md, Known limits): the reason a failover, the
//! usual cause of a rewind, makes the next period a full pass.

use std::sync::Arc;
use std::time::Duration;

use seckill_lua::clock::now_ms;

use crate::app::App;
use crate::catalog::ActivityEntry;
use crate::recompute::Cause;
use crate::shard::HighWater;

impl App {
    /// Reads every shard of `entry` and acts on what it finds: a missing fence starts a
    /// rebuild, a shard behind its high-water mark is reported and rebuilt, an activity
    /// whose shards are all fine opens. True when a loss was found.
    pub(crate) async fn check_activity(self: &Arc<Self>, entry: &Arc<ActivityEntry>) -> bool {
        // Marks first, Redis second: whatever this process saw before the read, a Redis
        // that lost nothing has at least reached.
        let seen: Vec<HighWater> = (0..entry.shards()).map(|i| entry.high_water(i)).collect();
        let marks = match self.shard_marks(entry.id(), entry.shards()).await {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(activity = entry.id(), error = %e, "fence check failed");
                return false;
            }
        };
        if marks.iter().any(|(fence, _)| fence.is_none()) {
            self.trigger_recompute(entry, Cause::Lost, "fence missing");
            return true;
        }
        // Every shard behind, not only the first: a failover rewinds all the shards of
        // the master it replaced, and each gap is counted when it is reported.
        let mut behind = false;
        for (i, ((fence, seq), hw)) in marks.iter().zip(&seen).enumerate() {
            if fence.as_deref() == Some(hw.epoch.as_str()) && *seq < hw.seq {
                self.lost_writes(entry, i as u32, hw, *seq);
                behind = true;
            } else if fence
                .as_deref()
                .is_some_and(|f| crate::shard::epoch_newer(&hw.epoch, f))
            {
                // Under an older epoch than one this process saw open: Redis went back
                // to before a rebuild (a failover to a replica that lacked it), and
                // every sequence of the newer epoch is gone.
                self.lost_writes(entry, i as u32, hw, 0);
                behind = true;
            }
        }
        if behind {
            return true;
        }
        // Opened under a claim: a rebuild asked for meanwhile keeps the entry closed, and
        // this check starts it under the same claim (`open_and_release`).
        if self.catalog.may_open() && !entry.is_available() && entry.try_claim() {
            self.open_and_release(entry);
        }
        false
    }

    /// A full pass on every cluster at once (each cluster's activities in turn, so a
    /// dead cluster's timeouts do not hold up another's). True when a loss was found.
    pub async fn check_fences(self: &Arc<Self>) -> bool {
        let names: Vec<String> = self.clusters.all().map(|(n, _)| n.to_string()).collect();
        let passes = names.iter().map(|name| self.check_fences_on(name));
        futures::future::join_all(passes)
            .await
            .into_iter()
            .any(|found| found)
    }

    /// A full pass over one cluster: every shard of every activity on it whose window
    /// has not ended (and that is not being rebuilt). True when a loss was found.
    async fn check_fences_on(self: &Arc<Self>, cluster: &str) -> bool {
        let now = now_ms();
        let mut found = false;
        for entry in self.catalog.all() {
            if !on_cluster(&entry, cluster) || entry.end_ms() <= now || entry.is_claimed() {
                continue;
            }
            found |= self.check_activity(&entry).await;
        }
        self.count_unavailable(now);
        found
    }

    /// One period of the round: the activities waiting to open, then whole activities
    /// after `cursor` (an activity id) in id order, wrapping, until
    /// `stock.fence_check_shards` shards are read or every one was. Moves `cursor` to the
    /// last activity read. True when a loss was found.
    async fn fence_step(self: &Arc<Self>, cluster: &str, cursor: &mut u64) -> bool {
        let now = now_ms();
        let mut open: Vec<Arc<ActivityEntry>> = Vec::new();
        let mut found = false;
        for entry in self.catalog.all() {
            if !on_cluster(&entry, cluster) || entry.end_ms() <= now || entry.is_claimed() {
                continue;
            }
            if entry.is_available() {
                open.push(entry);
            } else {
                found |= self.check_activity(&entry).await;
            }
        }
        open.sort_unstable_by_key(|e| e.id());
        let split = open.partition_point(|e| e.id() <= *cursor);
        let budget = u64::from(self.config.stock.fence_check_shards);
        let mut read = 0u64;
        for entry in open[split..].iter().chain(&open[..split]) {
            if read >= budget {
                break;
            }
            found |= self.check_activity(entry).await;
            read += u64::from(entry.shards());
            *cursor = entry.id();
        }
        self.count_unavailable(now);
        found
    }

    /// `stockd_unavailable_activities`: open windows answered UNAVAILABLE now.
    fn count_unavailable(&self, now: i64) {
        let closed = self
            .catalog
            .all()
            .iter()
            .filter(|e| e.end_ms() > now && e.start_ms() <= now && !e.is_available())
            .count();
        self.metrics.unavailable_activities.set(closed as i64);
    }

    /// The fence check every `stock.fence_check_ms` until shutdown, one loop per Redis
    /// Cluster over the activities placed on it: a period of the round, or a full pass
    /// after a reconnection or a slot-map change of that cluster, or a loss. A cluster
    /// that is down (every read waits out `redis.timeout_ms`) delays only its own loop.
    pub async fn fence_loop(self: Arc<Self>) {
        let names: Vec<String> = self.clusters.all().map(|(n, _)| n.to_string()).collect();
        let loops = names.iter().map(|name| self.clone().fence_loop_on(name));
        futures::future::join_all(loops).await;
    }

    async fn fence_loop_on(self: Arc<Self>, cluster: &str) {
        let Some(redis) = self.clusters.get(cluster).cloned() else {
            return;
        };
        let period = Duration::from_millis(self.config.stock.fence_check_ms);
        let mut cursor = 0u64;
        let mut seen = redis.topology_changes();
        let mut full = false;
        loop {
            let changes = redis.topology_changes();
            full |= changes != seen;
            seen = changes;
            full = if full {
                self.check_fences_on(cluster).await
            } else {
                self.fence_step(cluster, &mut cursor).await
            };
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = self.shutdown.clone().wait() => return,
            }
        }
    }
}

/// Whether `entry`'s stock lives on the cluster named `cluster` (`default` for the
/// `[redis]` section's own).
fn on_cluster(entry: &ActivityEntry, cluster: &str) -> bool {
    seckill_daemon::config::named_cluster(&entry.activity.redis_cluster)
        .unwrap_or(seckill_daemon::config::DEFAULT_CLUSTER)
        == cluster
}
