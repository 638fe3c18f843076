//! Units in transit: a rebalancing take records the units it took in
//! `sk:{a:i}:transit:<s>` on the donor shard, in the take's own atomic call
//! (`scripts/take.lua`), and the mover settles the record after its give. A look at the
//! shards for a sold-out decision reads each shard's units and its live records at once
//! (`scripts/look.lua`), and finds no item empty while units are between a take and a
//! give.
//!
//! Why: a take is a decrement on the donor and a give an increment on the home shard,
//! two calls on two slots. Between them the units are on no shard, and a look at every
//! shard (another round's, another stockd's, the check after a reservation emptied its
//! shard) finds them nowhere. Such a look used to set the flag: the gateway then
//! answered sold out, and buyers queued behind a round heard it, until the give landed
//! and someone cleared it.
//!
//! The settle is two calls, in this order ([`settle`]): `INCR sk:{a}:changes:<s>`, then
//! `ZREM` of the move's record. A look reads the change count first, then every shard;
//! the mark (`scripts/soldout_mark.lua`) is refused when the count moved. A look that
//! read the donor after the take saw the record unless it read after the settle, and
//! then the count was raised either during the look (refused) or before it began (the
//! give had landed, and the look saw the units at home).
//!
//! A record has a deadline, `3 × redis.timeout_ms + 2 s` after the take ran. What it
//! must cover: the give has to land before the record stops counting, by more than
//! one look's spread (a look's reads of the shards run at once; one that read the home
//! shard before the give and the donor after the record expired would miss the units).
//! So the take's answer (with its replica `WAIT`) may take a deadline and a second
//! ([`give_budget_ms`]; a later answer, from a stalled runtime, holds the units back
//! instead of giving them), the give a deadline, and what is left, the slack, is a
//! deadline and a second more. A look whose reads spread over more than
//! [`LOOK_SPREAD_MAX_MS`] (one second) marks nothing ([`Look::spread_ok`]): so no look
//! that marks can outspread any mover's slack, whatever `redis.timeout_ms` either
//! runs with. (The first version left the slack at one deadline and asked every
//! stockd of a fleet to run the same `redis.timeout_ms`: a looker with a longer one,
//! its reads bounded by that, could spread them wider than a mover's records allowed
//! for.) The settle's timing does not matter: a record outliving its give only holds
//! marks back. A stockd that dies in the middle of a move, or a give whose outcome is
//! unknown (it may land late), leaves a record that stops holding marks back after at
//! most its deadline. Taken units that were not given are lost until a rebuild counts
//! them back, as always.
//!
//! (The first version registered each round on the activity's slot before its first
//! take: one more round trip before every move, which widened the window in which
//! concurrent multi-unit buyers took each other's gathered units. The record now rides
//! on the take.)

use seckill_lua::calls::{transit_record, ChangesRaiseCall};
use seckill_lua::keys;

use crate::redis::Redis;

/// The widest a look's reads of the shards may spread (from sending the first to the
/// last answer) and still mark an item sold out: every record outlives its give by
/// more than this, whatever `redis.timeout_ms` its mover runs with.
pub(crate) const LOOK_SPREAD_MAX_MS: u64 = 1000;

/// A record's lifetime for a deadline of `timeout_ms` per Redis call: the mover's give
/// budget, the give's deadline, and the slack a look's spread must stay within.
pub(crate) fn lifetime_ms(timeout_ms: u64) -> u64 {
    give_budget_ms(timeout_ms) + timeout_ms + slack_ms(timeout_ms)
}

/// The longest a mover may take from sending its take to sending its give: the take's
/// deadline (its replica `WAIT` included) and a second.
pub(crate) fn give_budget_ms(timeout_ms: u64) -> u64 {
    timeout_ms + 1000
}

/// How long a record outlives its give at least: a deadline, and more than the widest
/// spread of a look that may mark.
fn slack_ms(timeout_ms: u64) -> u64 {
    timeout_ms + LOOK_SPREAD_MAX_MS + 1
}

/// A fresh move id (unique per move).
pub(crate) fn move_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Settles move `id`'s record of `units` on `donor` after its give landed: raises the
/// change count of item `s`, then removes the record. The raise must come first, and
/// must last: without it the record may not go. So with `redis.replica_acks` > 0 the
/// raise is sent with its replica `WAIT`, and a raise no replica acknowledged in time
/// leaves the record to its deadline, as a failed raise does (a failover could lose
/// the raise and keep the removal, and a look begun before the settle would then see
/// neither the record nor a changed count).
pub(crate) async fn settle(redis: &Redis, (a, s, donor): (u64, u64, u32), id: &str, units: i64) {
    match redis
        .call_acked(ChangesRaiseCall::new(a, s), &keys::changes(a, s))
        .await
    {
        Ok(acked) if acked.replicated => {}
        Ok(_) => {
            tracing::warn!(a, s, donor,
                "a move's change count is on no replica yet; its record of units in transit expires");
            return;
        }
        Err(e) => {
            tracing::warn!(a, s, donor, error = %e,
                "cannot raise a move's change count; its record of units in transit expires");
            return;
        }
    }
    if let Err(e) = redis
        .zrem(keys::transit(a, donor, s), &transit_record(id, units))
        .await
    {
        tracing::warn!(a, s, donor, error = %e,
            "cannot remove a move's record of units in transit; it expires");
    }
}

/// A look at every shard of an item for a sold-out decision.
#[derive(Debug, Clone, Default)]
pub(crate) struct Look {
    /// The change count, read before the shards.
    pub changes: Option<String>,
    /// Units the shards hold (a negative count as 0).
    pub left: i64,
    /// The units of the moves that took units out of a shard and have not settled: on
    /// no shard, but not sold either. (Every record holds at least one unit, so none in
    /// transit means no move under way.)
    pub in_transit: i64,
    /// From sending the first shard read to the last answer.
    pub spread: std::time::Duration,
}

impl Look {
    /// Whether the look's reads were close enough together to mark the item sold out
    /// ([`LOOK_SPREAD_MAX_MS`]): a wider look (a stalled process, a paused master) may
    /// have read the home shard before a give and the donor after its record expired.
    pub fn spread_ok(&self) -> bool {
        self.spread.as_millis() <= u128::from(LOOK_SPREAD_MAX_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Whatever deadlines a mover and a looker run with (the whole range
    /// `redis.timeout_ms` takes), a give that lands as late as the mover allows is
    /// still more than the widest marking look's spread before the record expires.
    #[test]
    fn a_record_outlives_its_latest_give_by_more_than_any_marking_look_spreads() {
        for t in [1, 50, 500, 1000, 1500, 5000, 60_000] {
            let latest_give = give_budget_ms(t) + t;
            let left = lifetime_ms(t) - latest_give;
            assert!(left > LOOK_SPREAD_MAX_MS, "timeout {t}: {left} ms left");
            assert!(left > t, "timeout {t}: {left} ms left");
        }
        // The defaults (500 ms): 3.5 s in all, 1.5 s to give, 0.5 s for the give.
        assert_eq!(lifetime_ms(500), 3501);
        assert_eq!(give_budget_ms(500), 1500);
    }

    #[test]
    fn a_look_spread_wider_than_the_bound_may_not_mark() {
        let look = |ms| Look {
            spread: Duration::from_millis(ms),
            ..Look::default()
        };
        assert!(look(0).spread_ok());
        assert!(look(LOOK_SPREAD_MAX_MS).spread_ok());
        assert!(!look(LOOK_SPREAD_MAX_MS + 1).spread_ok());
    }
}
