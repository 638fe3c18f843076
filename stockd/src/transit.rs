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
//! A record has a deadline, `3 × redis.timeout_ms + 1 s` after the take ran. What it
//! must cover: the give has to land before the record stops counting, by at least one
//! look's spread (a look's reads of the shards run at once, each within a deadline;
//! one that read the home shard before the give and the donor after the record
//! expired would miss the units). So the take's answer (with its replica `WAIT`) may
//! take a deadline and a second ([`give_budget_ms`]; a later answer, from a stalled
//! runtime, holds the units back instead of giving them), the give a deadline, and the
//! look's spread a deadline. The settle's timing does not matter: a record outliving
//! its give only holds marks back. A stockd that dies in the middle of a move, or a
//! give whose outcome is unknown (it may land late), leaves a record that stops holding
//! marks back after at most that. Taken units that were not given are lost until a
//! rebuild counts them back, as always. Every stockd and gateway of a fleet is
//! expected to run the same `redis.timeout_ms` (a looker with a longer one spreads its
//! reads wider than a mover's records allow for).
//!
//! (The first version registered each round on the activity's slot before its first
//! take: one more round trip before every move, which widened the window in which
//! concurrent multi-unit buyers took each other's gathered units. The record now rides
//! on the take.)

use seckill_lua::calls::transit_record;
use seckill_lua::keys;

use crate::redis::Redis;

/// A record's lifetime for a deadline of `timeout_ms` per Redis call.
pub(crate) fn lifetime_ms(timeout_ms: u64) -> u64 {
    3 * timeout_ms + 1000
}

/// The longest a mover may take from sending its take to sending its give: the
/// record's life less the give's deadline and one look's spread.
pub(crate) fn give_budget_ms(timeout_ms: u64) -> u64 {
    lifetime_ms(timeout_ms) - 2 * timeout_ms
}

/// A fresh move id (unique per move).
pub(crate) fn move_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Settles move `id`'s record of `units` on `donor` after its give landed: raises the
/// change count of item `s`, then removes the record. A failure leaves the record to
/// its deadline (the raise must come first: without it, the record may not go).
pub(crate) async fn settle(redis: &Redis, (a, s, donor): (u64, u64, u32), id: &str, units: i64) {
    let settled = async {
        redis.incr(keys::changes(a, s)).await?;
        redis
            .zrem(keys::transit(a, donor, s), &transit_record(id, units))
            .await
    };
    if let Err(e) = settled.await {
        tracing::warn!(a, s, donor, error = %e,
            "cannot settle a move's units in transit; the record expires");
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
}
