//! Units in transit: a rebalancing round registers itself in `sk:{a}:moving:<s>`
//! before its first take and leaves after its last give, so that no look at the shards
//! taken meanwhile can set the sold-out flag (`scripts/soldout_mark.lua`).
//!
//! Why: a take is a decrement on the donor and a give an increment on the home shard,
//! two calls on two slots. Between them the units are on no shard, and a look at every
//! shard (another round's, another stockd's, the check after a reservation emptied its
//! shard) finds them nowhere. Before this, such a look set the flag: the gateway then
//! answered sold out, and buyers queued behind a round heard it, until the give landed
//! and someone cleared it. Now the mark is refused while a move is registered, and when
//! the change count (`sk:{a}:changes:<s>`, raised by every round that moved units and
//! every clear) moved during the look.
//!
//! A round's entry has a deadline, `4 × redis.timeout_ms + 1 s` from its begin and
//! pushed back as much before each further donor (per donor a fence read, a take, a
//! second take and a give, each bounded by the deadline): a stockd that dies in the
//! middle of a move, or a give whose outcome is unknown (it may land late), leaves an
//! entry that stops holding marks back after at most that. Taken units that were not
//! given are lost until a rebuild counts them back, as before.

use std::sync::atomic::{AtomicBool, Ordering};

use seckill_lua::calls::{MoveBeginCall, MoveEndCall};

use crate::error::Result;
use crate::redis::Redis;

/// One round's entry in `sk:{a}:moving:<s>`. Shared (`Arc`) by the round and each of
/// its move tasks: when the round's caller goes away, a move task still running holds
/// it until its give has answered; the last holder to let go ends it, if the round did
/// not ([`MoveMark::end`]).
pub(crate) struct MoveMark {
    redis: Redis,
    activity: u64,
    item: u64,
    id: String,
    /// A take answered units, or its outcome is unknown: the round may have put units
    /// where a look had found none.
    moved: AtomicBool,
    ended: AtomicBool,
}

impl MoveMark {
    /// Registers a round of `item`'s moves for at most `lifetime_ms`. On an error the
    /// entry may still have been written: it is removed when the mark is dropped, or
    /// expires.
    pub(crate) async fn begin(
        redis: &Redis,
        activity: u64,
        item: u64,
        lifetime_ms: u64,
    ) -> Result<Self> {
        let mark = Self {
            redis: redis.clone(),
            activity,
            item,
            id: format!("{:016x}", rand::random::<u64>()),
            moved: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        };
        mark.extend(lifetime_ms).await?;
        Ok(mark)
    }

    /// Moves the entry's deadline to `lifetime_ms` from now (the same call as the
    /// begin: the entry is re-added under its id), before each further donor.
    pub(crate) async fn extend(&self, lifetime_ms: u64) -> Result<()> {
        self.redis
            .call(MoveBeginCall::new(
                self.activity,
                self.item,
                &self.id,
                lifetime_ms,
            ))
            .await?;
        Ok(())
    }

    /// A take of this round answered units, or may have taken some.
    pub(crate) fn moved(&self) {
        self.moved.store(true, Ordering::Release);
    }

    /// A give of this round may still land (its outcome is unknown): the entry is left
    /// to its deadline rather than ended.
    pub(crate) fn abandon(&self) {
        self.ended.store(true, Ordering::Release);
    }

    fn end_call(&self) -> MoveEndCall {
        MoveEndCall::new(
            self.activity,
            self.item,
            &self.id,
            self.moved.load(Ordering::Acquire),
        )
    }

    /// Ends the round now (once): every move task has answered. A failure leaves the
    /// entry to its deadline.
    pub(crate) async fn end(&self) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(e) = self.redis.call(self.end_call()).await {
            tracing::warn!(a = self.activity, s = self.item, error = %e,
                "cannot end a rebalancing round's entry; it expires");
        }
    }
}

impl Drop for MoveMark {
    fn drop(&mut self) {
        if *self.ended.get_mut() {
            return;
        }
        // Dropped without `end` (an error, or the caller went away): every holder has
        // let go, so every give has answered. Ended in the background.
        let (redis, call) = (self.redis.clone(), self.end_call());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = redis.call(call).await {
                    tracing::warn!(error = %e, "cannot end a rebalancing round's entry; it expires");
                }
            });
        }
    }
}
