//! The background loops besides the consumers, each stopping on shutdown:
//!
//! - [`timeout_sweep`]: pending orders past their deadline → `CANCELLED`, the unit
//!   back in MySQL (same transaction) and an outbox row for Redis.
//! - [`outbox_relay`]: outbox rows → the RELEASE script, straight against Redis (no
//!   dependency on stockd being up), then the row is marked done. Exactly once: a
//!   crash between release and mark repeats the release, which then finds no buyer
//!   record naming the reservation (`NOT_HELD`) and changes nothing (but clears the
//!   sold-out flag again, which the dead pass may not have reached). A shard closed
//!   for a rebuild answers `CLOSED` and the row waits for the next pass, since the
//!   rebuild would write its snapshot over a release made meanwhile. With
//!   `redis.replica_acks`, a release no replica acknowledged in time also waits for the
//!   next pass: a failover to a replica without it would lose the unit (and bring the
//!   buyer record back), and the next call either releases again on the new master or
//!   finds the record gone and waits for a replica to hold that. One relay per
//!   Redis cluster, each taking only the rows of the activities placed on it, so a
//!   cluster that is down holds up only its own returns.
//! - [`stats`]: orders-by-state, dead-letter and pending-return gauges, every 5 s.

use std::time::Duration;

use seckill_daemon::shutdown::Shutdown;
use seckill_lua::ReservationId;

use crate::clusters::Cluster;
use crate::db::{Db, OutboxRow};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::model::{ReturnReason, Status};
use crate::redis::{Redis, Release};

async fn pause(d: Duration, shutdown: &Shutdown) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => !shutdown.is_fired(),
        _ = shutdown.clone().wait() => false,
    }
}

/// Cancels expired pending orders every `every` until shutdown.
pub async fn timeout_sweep(db: Db, metrics: Metrics, every: Duration, shutdown: Shutdown) {
    loop {
        loop {
            match db.expire_due(500).await {
                Ok(rows) if rows.is_empty() => break,
                Ok(rows) => {
                    metrics.timeouts.inc_by(rows.len() as u64);
                    tracing::info!(orders = rows.len(), "payment deadline passed; cancelled");
                    if shutdown.is_fired() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "timeout sweep failed");
                    break;
                }
            }
        }
        if !pause(every, &shutdown).await {
            return;
        }
    }
}

/// Relays the stock-return outbox rows of `cluster`'s activities every `every` until
/// shutdown.
pub async fn outbox_relay(
    db: Db,
    cluster: Cluster,
    metrics: Metrics,
    every: Duration,
    batch: u32,
    shutdown: Shutdown,
) {
    cluster.redis.releases_ready().await;
    loop {
        match relay_once(&db, &cluster, &metrics, batch).await {
            // A full batch all relayed: more may be waiting. A pass with failures pauses
            // (a shard closed for a rebuild would otherwise be asked again at once).
            Ok((n, 0)) if n as u32 == batch && !shutdown.is_fired() => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(cluster = %cluster.name, error = %e, "outbox relay pass failed")
            }
        }
        if !pause(every, &shutdown).await {
            return;
        }
    }
}

/// One pass over the pending outbox rows of `cluster`'s activities; returns how many it
/// handled and how many of those failed (left pending). A Redis failure ends the pass
/// with that error (the cluster is likely down: the other rows would each wait out the
/// command deadline); a return no replica acknowledged ends it too (its master has no
/// caught-up replica); the rest are tried next pass.
pub async fn relay_once(
    db: &Db,
    cluster: &Cluster,
    metrics: &Metrics,
    batch: u32,
) -> Result<(usize, usize)> {
    let rows = db.pending_returns(&cluster.outbox(), batch).await?;
    let n = rows.len();
    let mut failed = 0;
    for row in rows {
        match relay_row(&cluster.redis, &row).await {
            Ok(outcome) => {
                metrics.stock_returns.with_label_values(&[outcome]).inc();
                db.mark_returned(row.id).await?;
            }
            Err(e) => {
                failed += 1;
                let reason = match e {
                    Error::ShardClosed(_) => "shard_closed",
                    Error::Unreplicated(_) => "unreplicated",
                    _ => "error",
                };
                metrics
                    .stock_return_retries
                    .with_label_values(&[reason])
                    .inc();
                db.mark_return_failed(row.id, &e.to_string()).await?;
                match e {
                    Error::Redis(_) => return Err(e),
                    // A master without a (caught-up) replica: each of its rows would wait
                    // out the `WAIT` in turn. The pass ends here; the rows tried fewer
                    // times go first next pass, so the other masters' returns are not held
                    // up behind this one's.
                    Error::Unreplicated(_) => {
                        tracing::warn!(order = %row.order_id, cluster = %cluster.name, error = %e,
                            "stock return not acknowledged by a replica; this pass ends, will retry");
                        return Ok((n, failed));
                    }
                    _ => tracing::warn!(order = %row.order_id, cluster = %cluster.name, error = %e,
                        "stock return to Redis failed; will retry"),
                }
            }
        }
    }
    Ok((n, failed))
}

async fn relay_row(redis: &Redis, row: &OutboxRow) -> Result<&'static str> {
    let rid: ReservationId = row
        .order_id
        .parse()
        .map_err(|_| Error::Internal(format!("outbox order id {:?}", row.order_id)))?;
    let reason = ReturnReason::parse(&row.reason)
        .ok_or_else(|| Error::Internal(format!("outbox reason {:?}", row.reason)))?;
    let (outcome, mut replicated) = redis
        .release(&rid, &row.user_id, reason.returns_unit())
        .await?;
    let done = match outcome {
        Release::Released { .. } if reason.returns_unit() => {
            replicated &= redis.clear_sold_out(row.activity_id, row.item_id).await?;
            Ok("released")
        }
        Release::Released { .. } => Ok("buyer_dropped"),
        // Either released by an earlier pass that died (or failed to clear the flag)
        // before it marked the row, or the record is gone for another reason. Clearing
        // the flag is idempotent and, when the item is sold out after all, costs one
        // reserve that sets it again; a flag left set after a unit came back would hide
        // that unit from every buyer but those homed on its shard.
        // Only once a replica holds the state it read: while the shard's master has no
        // replica every pass would clear the flag again and send buyers of a sold-out
        // item on to stockd. (While the activity's master has none, the clear itself is
        // unacknowledged and the row stays pending: each pass clears again until a
        // replica holds a clear. That errs toward "not sold out", never hides a unit.)
        Release::NotHeld if reason.returns_unit() && replicated => {
            replicated &= redis.clear_sold_out(row.activity_id, row.item_id).await?;
            Ok("not_held")
        }
        Release::NotHeld => Ok("not_held"),
        // The sale is over, and nothing rebuilds an ended activity's shards (Redis lost
        // them): there is nobody left to sell the unit to, and MySQL holds it.
        Release::Closed if row.ended() => Ok("closed_sale_over"),
        // A rebuild holds the shard; releasing now would be undone when it writes its
        // MySQL snapshot back. The row stays pending and is tried again next pass.
        Release::Closed => Err(Error::ShardClosed(rid.to_string())),
    }?;
    // A released unit's flag is cleared already (the unit is for sale on the master
    // now); the row is done only once a replica holds the release and the clear (a
    // clear on the master alone comes undone in a failover, and with it the flag is
    // back: the next pass's release answers NOT_HELD and clears again). `CLOSED` wrote
    // nothing.
    if !replicated && !matches!(outcome, Release::Closed) {
        return Err(Error::Unreplicated(rid.to_string()));
    }
    Ok(done)
}

/// Refreshes the orders-by-state, dead-letter and pending-return gauges every 5 s.
///
/// A gauge whose read fails keeps its value, except the age of the oldest pending
/// return: it is computed on every pass from the oldest pending row as last read. While
/// MySQL cannot be read, no row can be marked done (marking one needs MySQL), so that
/// age goes on growing, as the page `SeckillStockReturnsStuck` needs: a return stuck
/// before an outage would otherwise read a frozen age below the threshold for as long
/// as the outage lasts. The approximation: a row the relay marked done in the seconds
/// between the last read and the outage still counts until the next read (it errs
/// toward paging); a read that fails with MySQL up is corrected by the next one, 5 s
/// later (the alert waits minutes).
///
/// `orderd_stats_refreshed_timestamp_seconds` is set when a pass's three reads all
/// succeeded, so a dashboard or an alert (`SeckillOrderStatsStale`) can tell frozen
/// gauges from quiet ones.
pub async fn stats(db: Db, metrics: Metrics, shutdown: Shutdown) {
    let mut oldest_pending = None;
    loop {
        let counted = db.count_by_state().await;
        let dead = db.unreplayed_dead_letters().await;
        let pending = db.pending_return_stats().await;
        if counted.is_ok() && dead.is_ok() && pending.is_ok() {
            let unix = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
            metrics.stats_refreshed.set(unix);
        }
        if let Ok(rows) = counted {
            for s in Status::ALL {
                let n = rows
                    .iter()
                    .find(|(k, _)| k == s.as_str())
                    .map(|(_, n)| *n)
                    .unwrap_or(0);
                metrics
                    .orders_by_state
                    .with_label_values(&[s.as_str()])
                    .set(n);
            }
        }
        if let Ok(n) = dead {
            metrics.dead_letters.set(n as i64);
        }
        if let Ok((n, oldest)) = pending {
            metrics.stock_returns_pending.set(n as i64);
            oldest_pending = oldest;
        }
        let age = oldest_pending.map_or(0.0, |t| {
            (crate::model::now() - t).num_milliseconds().max(0) as f64 / 1000.0
        });
        metrics.stock_return_oldest_pending_seconds.set(age);
        if !pause(Duration::from_secs(5), &shutdown).await {
            return;
        }
    }
}
