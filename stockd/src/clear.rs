//! The sold-out clear, made to outlast a failover.
//!
//! Units came back (a release, a rebuild that left units, a move whose buyers left):
//! [`App::clear_sold_out`] deletes the item's sold-out flag and raises its change count
//! (`scripts/soldout_clear.lua`) on the activity's master. Both writes matter after a
//! failover: a flag that comes back makes every caller queued behind a rebalancing round
//! hear SOLD_OUT while units remain (and the admin status say sold out), and a change
//! count that falls back lets a mark decided from a look taken before the units came
//! back pass (`transit`), setting a false flag of its own. Nothing else would repair
//! either: the clear moves no reservation sequence, so no fence check sees the promoted
//! replica behind, and no rebuild follows.
//!
//! So with `redis.replica_acks` > 0 the clear is sent with its replica `WAIT`, like every
//! other write stockd answers on. A clear no replica acknowledged in time is on the master
//! alone: its effect stands there at once (the caller goes on; the clear is never a reason
//! to refuse a release), and a background task sends it again, with a growing pause,
//! until a replica holds one (a clear that failed too: the ack lane may still have sent
//! it). A clear sent again after a failover lands on the promoted replica, whose flag it
//! clears. The task stops early when a look finds the item without units (sold out
//! again: the flag, if set, is right), at shutdown, and after ten minutes. One task per
//! item at a time, which counts the clears made meanwhile so none is dropped.
//!
//! Approximation: between a look that finds units and the clear sent after it, the last
//! units may sell and a rightful mark be set; the clear then removes it. That errs toward
//! "not sold out", which costs a look: the next buyer whose home shard is empty runs a
//! round, which marks the item again. It never hides units.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seckill_lua::calls::{LookCall, SoldOutClearCall};
use seckill_lua::keys;
use seckill_lua::messages::SoldOut;

use crate::app::App;
use crate::error::Result;
use crate::metrics::Metrics;
use crate::redis::{array, int, Redis};

/// The first pause before a clear is sent again, and the longest.
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);
/// How long a clear is sent again at most: past a sale's end nobody reads the flag, and
/// a master without a replica for that long has paged already.
const GIVE_UP_AFTER: Duration = Duration::from_secs(600);

/// The items whose clear a task is sending again, each with the number of
/// unacknowledged clears made since the task started: a clear that lands while the task
/// is finishing is not dropped (the task sees the count move and goes on).
#[derive(Clone, Default)]
pub struct Pending(Arc<Mutex<HashMap<(u64, u64), u64>>>);

impl Pending {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64), u64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts an unacknowledged clear of `item`; true when no task sends it again yet
    /// (the caller starts one).
    fn add(&self, item: (u64, u64)) -> bool {
        match self.map().entry(item) {
            Entry::Occupied(mut e) => {
                *e.get_mut() += 1;
                false
            }
            Entry::Vacant(v) => {
                v.insert(0);
                true
            }
        }
    }

    /// The count of `item` now, read before a look and a send.
    fn seen(&self, item: (u64, u64)) -> u64 {
        self.map().get(&item).copied().unwrap_or_default()
    }

    /// Ends `item`'s task unless clears came since it read `seen`; true when ended.
    fn finish(&self, item: (u64, u64), seen: u64) -> bool {
        let mut map = self.map();
        if map.get(&item).copied().unwrap_or_default() != seen {
            return false;
        }
        map.remove(&item);
        true
    }
}

impl App {
    /// Clears the sold-out key (and counts the change: a mark decided from a look
    /// before it is refused) and announces it when this call cleared it. A clear no
    /// replica acknowledged, or one that failed (the lane may still have sent it), is
    /// sent again in the background (see the module doc).
    pub(crate) async fn clear_sold_out(&self, a: u64, s: u64) -> Result<()> {
        let redis = self.redis_at(a).await?;
        let acked = redis
            .call_acked(SoldOutClearCall::new(a, s), &keys::changes(a, s))
            .await;
        if !acked.as_ref().is_ok_and(|acked| acked.replicated) {
            self.send_clear_again(redis, a, s);
        }
        if int(&acked?.value)? > 0 {
            tracing::info!(a, s, "back in stock");
            announce_on_sale(redis, a, s).await?;
        }
        Ok(())
    }

    /// Starts the task that sends the clear of `(a, s)` again, unless one runs.
    fn send_clear_again(&self, redis: &Redis, a: u64, s: u64) {
        self.metrics.sold_out_clears_unacked.inc();
        let Some(shards) = self.catalog.get(a).map(|e| e.shards()) else {
            tracing::warn!(
                a,
                s,
                "a sold-out clear may be on no replica, for an activity not loaded here"
            );
            return;
        };
        if !self.clears.add((a, s)) {
            return;
        }
        tracing::warn!(
            a,
            s,
            "a sold-out clear may be on no replica; sending it again until one holds it"
        );
        let (redis, pending, metrics) = (redis.clone(), self.clears.clone(), self.metrics.clone());
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = clear_until_replicated(&redis, (a, s, shards), &pending, &metrics) => {}
                () = shutdown.wait() => {}
            }
        });
    }
}

/// Sends the clear of `(a, s)` again, pausing longer each time, until a replica
/// acknowledges one or a look finds no units on the item's `shards` (nor in transit),
/// with no clear made meanwhile; or until [`GIVE_UP_AFTER`].
async fn clear_until_replicated(
    redis: &Redis,
    (a, s, shards): (u64, u64, u32),
    pending: &Pending,
    metrics: &Metrics,
) {
    let item = (a, s);
    let started = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        tokio::time::sleep(pause).await;
        // The test suite holds the clears sent again here while it looks at what a
        // failover left (`stockd_clear_ack`).
        fail::fail_point!("stockd::clear::resend");
        pause = (pause * 2).min(LONGEST_PAUSE);
        if started.elapsed() > GIVE_UP_AFTER {
            tracing::warn!(
                a,
                s,
                "the sold-out clear is still on no replica; no longer sent again"
            );
            pending.map().remove(&item);
            return;
        }
        let seen = pending.seen(item);
        match units_left(redis, a, s, shards).await {
            Ok(0) if pending.finish(item, seen) => {
                tracing::info!(a, s, "no units left: the sold-out clear is not sent again");
                return;
            }
            Ok(0) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(a, s, error = %e, "cannot look at the shards; the clear waits");
                continue;
            }
        }
        match redis
            .call_acked(SoldOutClearCall::new(a, s), &keys::changes(a, s))
            .await
        {
            Ok(acked) => {
                if int(&acked.value).is_ok_and(|n| n > 0) {
                    // A failover lost the first clear, or a mark raced the look above
                    // (see the module doc).
                    metrics.sold_out_flags_back.inc();
                    tracing::info!(
                        a,
                        s,
                        "the sold-out flag was set while units remain; cleared"
                    );
                    if let Err(e) = announce_on_sale(redis, a, s).await {
                        tracing::warn!(a, s, error = %e, "cannot announce the item on sale");
                    }
                }
                if acked.replicated && pending.finish(item, seen) {
                    tracing::info!(a, s, "a replica holds the sold-out clear");
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(a, s, error = %e, "the sold-out clear failed; sent again later")
            }
        }
    }
}

/// Tells every gateway that `(a, s)` is on sale again.
async fn announce_on_sale(redis: &Redis, a: u64, s: u64) -> Result<()> {
    let msg = SoldOut {
        activity: a,
        item: s,
        sold_out: false,
    };
    redis.publish(keys::SOLD_OUT_CHANNEL, msg.encode()).await
}

/// Units on the item's shards and in transit between them.
async fn units_left(redis: &Redis, a: u64, s: u64, shards: u32) -> Result<i64> {
    let looks = (0..shards).map(|i| redis.call(LookCall::new(a, i, s)));
    let mut units = 0;
    for reply in futures::future::try_join_all(looks).await? {
        let parts = array(reply)?;
        for k in [0, 2] {
            if let Some(v) = parts.get(k) {
                units += int(v)?.max(0);
            }
        }
    }
    Ok(units)
}
