//! Group commit of reservations. Per shard, at most one reserve call is in flight;
//! the reservations that arrive meanwhile queue, and go together in the next call
//! (up to `stock.reserve_batch_max`). A lone reservation goes at once, alone: nothing
//! waits on a timer, so batching adds no latency when the sale is quiet, and under a
//! stampede it divides Redis's per-call work (command parsing, script set-up, one
//! read and one write syscall) and stockd's client-side work by the batch size.
//!
//! The script decides every reservation of a call in order, exactly as if each had
//! been called alone (`lua/scripts/reserve.lua`), so the contract is unchanged: one
//! reservation is still one atomic check-decrement-record-append on one slot.
//!
//! With `redis.replica_acks` > 0 the call goes through `Redis::call_acked`: grouped
//! with the other calls ready for the same master and pipelined with one `WAIT`
//! (`seckill_daemon::ack`); a reservation is answered RESERVED only once a replica holds it, and
//! UNAVAILABLE (retry with the same request id) when none acknowledged in
//! `redis.replica_ack_timeout_ms`.
//!
//! A caller that goes away (a client deadline) does not take its reservation out of
//! a call already queued: the unit is then held under its request id, and the
//! client's retry with the same request id gets it back (RETRY), as before batching.

use std::sync::Arc;

use seckill_lua::calls::{reserve_outcome, ReserveCall, RESERVE_FIELDS};
use seckill_lua::clock::now_ms;
use seckill_lua::{keys, ReservationId};
use tokio::sync::oneshot;

use crate::app::App;
use crate::catalog::ActivityEntry;
use crate::domain::{RequestId, UserId};
use crate::error::{Error, Result};
use crate::redis::{array, int, text};
use crate::shard::{HighWater, Pending, Script, Unwind};

impl App {
    /// Reserves `units` of `item` for `user` on `shard` through the shard's queue,
    /// before the buyers that did not wait for a rebalancing round when `ahead`
    /// ([`crate::shard::QueueState::push`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn reserve_script(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
        item: u64,
        shard: u32,
        user: &UserId,
        request: &RequestId,
        units: u32,
        ahead: bool,
    ) -> Result<Script> {
        let queue = entry
            .queue(shard)
            .ok_or_else(|| Error::Internal(format!("no queue for shard {shard}")))?;
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut st = queue.lock();
            st.push(
                Pending {
                    item,
                    user: user.clone(),
                    request: request.clone(),
                    units,
                    trace: crate::domain::current_trace_parent(),
                    answer: tx,
                },
                ahead,
            );
            !std::mem::replace(&mut st.running, true)
        };
        if start {
            tokio::spawn(Arc::clone(self).drive(Arc::clone(entry), shard));
        }
        rx.await
            .map_err(|_| Error::Unavailable("the reservation's Redis call was dropped".into()))?
    }

    /// Runs `shard`'s calls back to back until its queue is empty.
    async fn drive(self: Arc<Self>, entry: Arc<ActivityEntry>, shard: u32) {
        let Some(queue) = entry.queue(shard) else {
            return;
        };
        let _unwind = Unwind(queue);
        let max = self.config.stock.reserve_batch_max as usize;
        loop {
            // Let the tasks already runnable go first: the requests that one read of
            // an HTTP/2 connection decoded are queued behind this task, and join this
            // call instead of the next one (no timer: the yield costs one reschedule).
            // More rounds were measured and gave no larger calls.
            tokio::task::yield_now().await;
            let batch = {
                let mut st = queue.lock();
                if st.is_empty() {
                    st.running = false;
                    return;
                }
                st.next_batch(max)
            };
            self.call(&entry, shard, batch).await;
        }
    }

    /// One reserve call for `batch`; every reservation gets its answer.
    async fn call(&self, entry: &ActivityEntry, shard: u32, batch: Vec<Pending>) {
        let hw = entry.high_water(shard);
        let mut call =
            ReserveCall::new(entry.id(), shard, now_ms(), &hw.epoch, hw.seq, batch.len());
        self.metrics.reserve_batch.observe(batch.len() as f64);
        let answers: Vec<_> = batch
            .into_iter()
            .map(|p| {
                call.push_traced(p.item, p.user, p.request, p.trace.as_deref(), p.units);
                p.answer
            })
            .collect();
        // With `redis.replica_acks`, one WAIT per master's pipeline of ready calls.
        let answer = match self.redis_of(entry) {
            Ok(redis) => {
                redis
                    .call_acked(call, &keys::fence(entry.id(), shard))
                    .await
            }
            Err(e) => Err(e),
        }
        .and_then(|a| Ok((array(a.value)?, a.replicated)));
        let (parts, replicated) = match answer {
            Ok((parts, replicated)) if parts.len() == RESERVE_FIELDS * answers.len() => {
                (parts, replicated)
            }
            Ok((parts, _)) => {
                let e = Error::Internal(format!(
                    "reserve answered {} fields for {} reservations",
                    parts.len(),
                    answers.len()
                ));
                return answer_all(answers, &e);
            }
            Err(e) => return answer_all(answers, &e),
        };
        for (answer, f) in answers.into_iter().zip(parts.chunks_exact(RESERVE_FIELDS)) {
            let out = match parse(entry, shard, &hw, f, replicated) {
                // A DUPLICATE tells the buyer it holds the reservation it names: only
                // once a replica holds that too.
                Ok(Script::Reserved(..) | Script::Retry(..) | Script::Duplicate(..))
                    if !replicated =>
                {
                    Err(unreplicated())
                }
                out => out,
            };
            let _ = answer.send(out);
        }
    }
}

/// The answer for one reservation: `f` is its [`RESERVE_FIELDS`] fields.
fn parse(
    entry: &ActivityEntry,
    shard: u32,
    hw: &HighWater,
    f: &[fred::types::Value],
    replicated: bool,
) -> Result<Script> {
    let rid = text(&f[1]);
    let left = int(&f[2])?;
    let units = u32::try_from(int(&f[3])?.max(1)).unwrap_or(1);
    Ok(match f[0].as_str().as_deref().unwrap_or_default() {
        reserve_outcome::RESERVED => {
            if let Ok(id) = rid.parse::<ReservationId>() {
                // Marked also when not replicated: a failover that loses it must still be
                // found (BEHIND), or its sequence would be handed out again.
                entry.saw(shard, &id.epoch, id.seq, replicated);
            }
            Script::Reserved(rid, left, units)
        }
        reserve_outcome::RETRY => Script::Retry(rid, left, units),
        reserve_outcome::DUPLICATE => Script::Duplicate(rid, left, units),
        reserve_outcome::SOLD_OUT => Script::SoldOut,
        reserve_outcome::SHORT => Script::Short(left),
        reserve_outcome::LOST => Script::Lost,
        reserve_outcome::BEHIND => Script::Behind(hw.clone(), left.max(0) as u64),
        other => return Err(Error::Internal(format!("reserve answered {other}"))),
    })
}

/// A reservation Redis made but no replica acknowledged in time: not promised yet.
/// It stays held under its request id, so the caller's retry with the same request id
/// answers it once a replica has it (or a fresh outcome if it died with its master).
fn unreplicated() -> Error {
    Error::Unavailable(
        "the reservation is not on a Redis replica yet; retry with the same request id".into(),
    )
}

/// Gives every reservation of a failed call the same error.
fn answer_all(answers: Vec<oneshot::Sender<Result<Script>>>, e: &Error) {
    for answer in answers {
        let _ = answer.send(Err(e.replicate()));
    }
}
