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
//! until a replica holds one. A clear sent again after a failover lands on the promoted
//! replica, whose flag it clears. The task stops early when a look finds the item without
//! units (sold out again: the flag, if set, is right) and at shutdown. One task per item
//! at a time.
//!
//! Approximation: between a look that finds units and the clear sent after it, the last
//! units may sell and a rightful mark be set; the clear then removes it. That errs toward
//! "not sold out", which costs a look: the next buyer whose home shard is empty runs a
//! round, which marks the item again. It never hides units.

use std::sync::Arc;
use std::time::Duration;

use seckill_lua::calls::{LookCall, SoldOutClearCall};
use seckill_lua::keys;
use seckill_lua::messages::SoldOut;

use crate::app::App;
use crate::error::Result;
use crate::redis::{array, int, Redis};

/// The first pause before a clear is sent again, and the longest.
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

impl App {
    /// Clears the sold-out key (and counts the change: a mark decided from a look
    /// before it is refused) and announces it when this call cleared it. A clear no
    /// replica acknowledged is sent again in the background (see the module doc).
    pub(crate) async fn clear_sold_out(&self, a: u64, s: u64) -> Result<()> {
        let redis = self.redis_at(a).await?;
        let acked = redis
            .call_acked(SoldOutClearCall::new(a, s), &keys::changes(a, s))
            .await?;
        if int(&acked.value)? > 0 {
            tracing::info!(a, s, "back in stock");
            announce_on_sale(redis, a, s).await?;
        }
        if !acked.replicated {
            self.metrics.sold_out_clears_unacked.inc();
            let Some(shards) = self.catalog.get(a).map(|e| e.shards()) else {
                tracing::warn!(
                    a,
                    s,
                    "a sold-out clear is on no replica yet, for an activity not loaded here"
                );
                return Ok(());
            };
            let first = self
                .clears
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((a, s));
            if first {
                tracing::warn!(
                    a,
                    s,
                    "a sold-out clear is on no replica yet; sending it again until one holds it"
                );
                let (redis, clears) = (redis.clone(), Arc::clone(&self.clears));
                let shutdown = self.shutdown.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = clear_until_replicated(&redis, (a, s, shards)) => {}
                        () = shutdown.wait() => {}
                    }
                    clears
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&(a, s));
                });
            }
        }
        Ok(())
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

/// Sends the clear of `(a, s)` again, pausing longer each time, until a replica
/// acknowledges one or a look finds no units on the item's `shards` (nor in transit).
async fn clear_until_replicated(redis: &Redis, (a, s, shards): (u64, u64, u32)) {
    let mut pause = FIRST_PAUSE;
    loop {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
        match units_left(redis, a, s, shards).await {
            Ok(0) => {
                tracing::info!(
                    a,
                    s,
                    "no units left: the unacknowledged sold-out clear is not sent again"
                );
                return;
            }
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
                    // The flag was back: a failover lost the first clear (or a mark
                    // raced the look above; see the module doc).
                    tracing::warn!(
                        a,
                        s,
                        "the sold-out flag was set again while units remain; cleared"
                    );
                    if let Err(e) = announce_on_sale(redis, a, s).await {
                        tracing::warn!(a, s, error = %e, "cannot announce the item on sale");
                    }
                }
                if acked.replicated {
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
