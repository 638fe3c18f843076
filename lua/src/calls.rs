//! Typed calls of every script: each call type builds the KEYS and ARGV its script
//! reads (in the order the script's header documents), and each outcome type reads
//! its answer. Nothing outside this crate builds a key list or an argument list.
//!
//! A daemon sends a call with [`Call::into_parts`] through its `EVALSHA` (see
//! `seckill_daemon::redis::Scripts`) and reads the answer with the outcome's
//! `from_*` function: this crate does not depend on a Redis client, so answers come
//! in as plain integers and strings.

use crate::ids::ReservationId;
use crate::keys;
use crate::scripts::{
    Script, CHANGES_RAISE, GIVE, LOOK, REBUILD, RELEASE, RESERVE, SOLDOUT_CLEAR, SOLDOUT_MARK,
    TAKE, WARM,
};
use crate::user::{RequestId, UserId};
use crate::{ActivityId, ItemId, Shard};

/// One call of one script.
pub trait Call {
    /// The script this call runs.
    const SCRIPT: Script;
    /// KEYS and ARGV, moved out.
    fn into_parts(self) -> (Vec<String>, Vec<String>);
}

/// The KEYS and ARGV of one call of the reserve script: one shard, one or more
/// reservations (see `scripts/reserve.lua`; the answer has [`RESERVE_FIELDS`] fields
/// per reservation, in the order they were pushed).
#[derive(Debug, Clone)]
pub struct ReserveCall {
    activity: ActivityId,
    shard: Shard,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

impl ReserveCall {
    /// A call on shard `shard` of activity `activity` at `now_ms`. `epoch` and
    /// `high_water` arm the lost-write check (the script answers BEHIND when the
    /// shard's sequence is below `high_water` under `epoch`); an empty `epoch` skips it.
    pub fn new(
        activity: ActivityId,
        shard: Shard,
        now_ms: i64,
        epoch: &str,
        high_water: u64,
        capacity: usize,
    ) -> Self {
        let mut keys = Vec::with_capacity(3 + 2 * capacity);
        keys.extend([
            keys::fence(activity, shard),
            keys::seq(activity, shard),
            keys::orders_stream(activity, shard),
        ]);
        let mut args = Vec::with_capacity(5 + 5 * capacity);
        args.extend([
            activity.to_string(),
            shard.to_string(),
            now_ms.to_string(),
            epoch.to_string(),
            high_water.to_string(),
        ]);
        Self {
            activity,
            shard,
            keys,
            args,
        }
    }

    /// Adds one reservation of one unit of `item` for `user` under `request` (their
    /// strings are moved in, not copied).
    pub fn push(&mut self, item: ItemId, user: UserId, request: RequestId) {
        self.push_traced(item, user, request, None, 1);
    }

    /// [`Self::push`] of `units` units (>= 1; the caller has checked it against the
    /// activity's limit) with the buyer's W3C `traceparent`, written into the stream
    /// entry as [`entry::TRACE_PARENT`](crate::messages::entry::TRACE_PARENT). The
    /// caller has validated it (`seckill_proto::trace`).
    pub fn push_traced(
        &mut self,
        item: ItemId,
        user: UserId,
        request: RequestId,
        traceparent: Option<&str>,
        units: u32,
    ) {
        self.keys.extend([
            keys::stock(self.activity, self.shard, item),
            keys::buyers(self.activity, self.shard, item),
        ]);
        self.args.extend([
            item.to_string(),
            user.into_string(),
            request.into_string(),
            traceparent.unwrap_or_default().to_string(),
            units.max(1).to_string(),
        ]);
    }

    /// Reservations in the call.
    pub fn len(&self) -> usize {
        (self.keys.len() - 3) / 2
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Call for ReserveCall {
    const SCRIPT: Script = RESERVE;
    fn into_parts(self) -> (Vec<String>, Vec<String>) {
        (self.keys, self.args)
    }
}

/// Fields per reservation in the reserve script's answer: outcome, reservation id,
/// units left in the shard, units the reservation holds.
pub const RESERVE_FIELDS: usize = 4;

/// Outcomes the reserve script returns as its first element.
pub mod reserve_outcome {
    pub const RESERVED: &str = "RESERVED";
    pub const RETRY: &str = "RETRY";
    pub const DUPLICATE: &str = "DUPLICATE";
    pub const SOLD_OUT: &str = "SOLD_OUT";
    /// The shard holds fewer units than asked for (but some; the third field says
    /// how many): nothing was taken.
    pub const SHORT: &str = "SHORT";
    pub const LOST: &str = "LOST";
    /// The fence is there but the shard's sequence is below one already handed out
    /// under the same epoch: Redis lost writes (a failover to a lagging replica, an
    /// AOF that lost its last second). The third field is the sequence found.
    pub const BEHIND: &str = "BEHIND";
}

/// RELEASE (`scripts/release.lua`): drop the buyer record of a reservation while it
/// still names it, and give its units (the k the record holds) back to the shard
/// unless told not to.
#[derive(Debug, Clone)]
pub struct ReleaseCall {
    keys: Vec<String>,
    args: Vec<String>,
}

impl ReleaseCall {
    /// Releases `reservation`, held by `user` as recorded with it (a [`UserId`] when it
    /// was reserved; orderd reads it back from the order row). `return_unit` false only
    /// drops the buyer record (a FAILED order, whose unit MySQL never had).
    pub fn new(reservation: &ReservationId, user: &str, return_unit: bool) -> Self {
        let (a, i, s) = (reservation.activity, reservation.shard, reservation.item);
        Self {
            keys: vec![
                keys::stock(a, i, s),
                keys::buyers(a, i, s),
                keys::fence(a, i),
            ],
            args: vec![
                user.to_string(),
                reservation.to_string(),
                if return_unit { "1" } else { "0" }.to_string(),
            ],
        }
    }
}

impl Call for ReleaseCall {
    const SCRIPT: Script = RELEASE;
    fn into_parts(self) -> (Vec<String>, Vec<String>) {
        (self.keys, self.args)
    }
}

/// What RELEASE answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The buyer record named the reservation and is gone; `left` units in the shard,
    /// `units` given back (0 when only the record was dropped).
    Released { left: i64, units: i64 },
    /// No buyer record names the reservation (already released, or re-bought).
    NotHeld,
    /// The shard is closed (no fence: a rebuild is under way, or Redis lost it);
    /// nothing was written. Retry after the reopen: a release now would be undone by
    /// the rebuild writing its snapshot back.
    Closed,
}

impl Released {
    /// Reads the answer `{outcome, left, units}`; `None` for an answer the script
    /// never gives.
    pub fn from_reply(outcome: &str, left: i64, units: i64) -> Option<Self> {
        match outcome {
            "RELEASED" => Some(Released::Released { left, units }),
            "NOT_HELD" => Some(Released::NotHeld),
            "CLOSED" => Some(Released::Closed),
            _ => None,
        }
    }
}

/// TAKE (`scripts/take.lua`): the donor side of a rebalancing move.
#[derive(Debug, Clone)]
pub struct TakeCall {
    keys: Vec<String>,
    args: Vec<String>,
}

impl TakeCall {
    /// Takes up to `units` of `item` out of shard `donor`, unless the shard is behind
    /// `seq`, the highest sequence the caller saw handed out there under `epoch`
    /// (`""`, 0 for none), or under another epoch than `epoch` (when one is given).
    /// Units taken are in transit under move `id` (unique per move) for at most
    /// `lifetime_ms` (at least 1), or until the mover settles them: `ZREM` of
    /// [`transit_record`] from [`keys::transit`], after its give and an `INCR` of
    /// [`keys::changes`].
    pub fn new(activity: ActivityId, donor: Shard, item: ItemId, units: u32, at: TakeAt) -> Self {
        Self {
            keys: vec![
                keys::fence(activity, donor),
                keys::stock(activity, donor, item),
                keys::seq(activity, donor),
                keys::transit(activity, donor, item),
            ],
            args: vec![
                units.to_string(),
                at.epoch.to_string(),
                at.seq.to_string(),
                at.id.to_string(),
                at.lifetime_ms.max(1).to_string(),
            ],
        }
    }
}

/// The record of move `id`'s `units` in transit, as the take writes it.
pub fn transit_record(id: &str, units: i64) -> String {
    format!("{id}:{units}")
}

/// What a [`TakeCall`] checks the donor against, and the transit entry it writes.
#[derive(Debug, Clone, Copy)]
pub struct TakeAt<'a> {
    /// The donor's epoch as the caller saw it (`""` for none).
    pub epoch: &'a str,
    /// The highest sequence the caller saw handed out there under `epoch` (0 for none).
    pub seq: u64,
    /// The move's id, unique per move.
    pub id: &'a str,
    /// How long the units taken count as in transit at most.
    pub lifetime_ms: u64,
}

impl Call for TakeCall {
    const SCRIPT: Script = TAKE;
    fn into_parts(self) -> (Vec<String>, Vec<String>) {
        (self.keys, self.args)
    }
}

/// What TAKE answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The shard's fence is gone: its state was lost (recompute).
    FenceMissing,
    /// The shard's sequence (this) is below the caller's mark under the same epoch:
    /// Redis lost writes; nothing was taken.
    Behind(u64),
    /// `units` taken (0 when the shard was empty); `epoch` is the donor's fence, for
    /// the logs (the give checks the home shard's own fence).
    Units { units: i64, epoch: String },
    /// The shard is under this epoch, newer than the caller's: a rebuild reopened it
    /// since the caller's mark; nothing was taken.
    Newer(String),
}

impl Taken {
    /// Reads the answer `{n, epoch or sequence}`; `None` for one the script never gives.
    pub fn from_reply(n: i64, second: &str) -> Option<Self> {
        match n {
            -1 => Some(Taken::FenceMissing),
            -2 => second.parse().ok().map(Taken::Behind),
            -3 if !second.is_empty() => Some(Taken::Newer(second.to_string())),
            n if n >= 0 => Some(Taken::Units {
                units: n,
                epoch: second.to_string(),
            }),
            _ => None,
        }
    }
}

/// GIVE (`scripts/give.lua`): the receiving side of a rebalancing move.
#[derive(Debug, Clone)]
pub struct GiveCall {
    keys: Vec<String>,
    args: Vec<String>,
}

impl GiveCall {
    /// Adds `units` of `item`, taken from another shard, to shard `home` while its
    /// fence is still `epoch`, as the mover read it before the take.
    pub fn new(activity: ActivityId, home: Shard, item: ItemId, units: i64, epoch: &str) -> Self {
        Self {
            keys: vec![
                keys::fence(activity, home),
                keys::stock(activity, home, item),
            ],
            args: vec![units.to_string(), epoch.to_string()],
        }
    }
}

impl Call for GiveCall {
    const SCRIPT: Script = GIVE;
    fn into_parts(self) -> (Vec<String>, Vec<String>) {
        (self.keys, self.args)
    }
}

/// What GIVE answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Given {
    /// The shard's fence is gone: its state was lost (recompute); the units dropped.
    FenceMissing,
    /// The shard's fence is no longer the epoch the mover read before its take (a
    /// rebuild reopened it since): the units dropped.
    Stale,
    /// The shard's new count.
    Units(i64),
}

impl Given {
    /// Reads the integer answer.
    pub fn from_reply(n: i64) -> Self {
        match n {
            -2 => Given::Stale,
            n if n < 0 => Given::FenceMissing,
            n => Given::Units(n),
        }
    }
}

/// WARM (`scripts/warm.lua`): set every item's stock in one shard, then its fence.
#[derive(Debug, Clone)]
pub struct WarmCall {
    activity: ActivityId,
    shard: Shard,
    keys: Vec<String>,
    args: Vec<String>,
}

impl WarmCall {
    /// Warms shard `shard` under `epoch`. `force` false leaves a shard whose fence is
    /// already there alone (publishing twice never adds stock), and one a rebuild has
    /// touched (its lease key is there: a missing fence is a rebuild's close).
    pub fn new(activity: ActivityId, shard: Shard, epoch: &str, force: bool) -> Self {
        Self {
            activity,
            shard,
            keys: vec![keys::fence(activity, shard), keys::lease(activity, shard)],
            args: vec![epoch.to_string(), if force { "1" } else { "0" }.to_string()],
        }
    }

    /// Sets `item`'s stock in this shard to `units`.
    pub fn push(&mut self, item: ItemId, units: u64) {
        self.keys.push(keys::stock(self.activity, self.shard, item));
        self.args.push(units.to_string());
    }
}

impl Call for WarmCall {
    const SCRIPT: Script = WARM;
    fn into_parts(self) -> (Vec<String>, Vec<String>) {
        (self.keys, self.args)
    }
}

/// What WARM answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warmed {
    /// The shard's stock and fence were written.
    Wrote,
    /// The fence was already there, or a rebuild's lease, and the call was not forced:
    /// nothing changed.
    AlreadyWarm,
}

impl Warmed {
    pub fn from_reply(n: i64) -> Self {
        if n == 1 {
            Warmed::Wrote
        } else {
            Warmed::AlreadyWarm
        }
    }
}

/// REBUILD (`scripts/rebuild.lua`): close a shard before a rebuild, or open it
/// again with the rebuilt counts and buyer records, under the rebuild's fencing token.
#[derive(Debug, Clone)]
pub struct RebuildCall {
    activity: ActivityId,
    shard: Shard,
    keys: Vec<String>,
    args: Vec<String>,
}

impl RebuildCall {
    /// Close shard `shard` under `token`: the fence goes, unless a newer token
    /// already touched the shard.
    pub fn close(activity: ActivityId, shard: Shard, token: u64) -> Self {
        Self::new(activity, shard, "close", token, "")
    }

    /// Open shard `shard` under `token` and `epoch` with the items [`Self::push`]ed,
    /// unless a newer token touched the shard since it was closed.
    pub fn open(activity: ActivityId, shard: Shard, token: u64, epoch: &str) -> Self {
        Self::new(activity, shard, "open", token, epoch)
    }

    fn new(activity: ActivityId, shard: Shard, mode: &str, token: u64, epoch: &str) -> Self {
        Self {
            activity,
            shard,
            keys: vec![
                keys::fence(activity, shard),
                keys::lease(activity, shard),
                keys::seq(activity, shard),
            ],
            args: vec![mode.to_string(), token.to_string(), epoch.to_string()],
        }
    }

    /// `item` gets `units` and exactly these buyer records (`uid` → `"<rid>|<req>"`).
    pub fn push(&mut self, item: ItemId, units: u64, buyers: Vec<(String, String)>) {
        self.keys.extend([
            keys::stock(self.activity, self.shard, item),
            keys::buyers(self.activity, self.shard, item),
        ]);
        self.args.reserve(2 + 2 * buyers.len());
        self.args.push(units.to_string());
        self.args.push(buyers.len().to_string());
        for (user, record) in buyers {
            self.args.push(user);
            self.args.push(record);
        }
    }

    /// Reads the answer: true when the script wrote (the token was the newest).
    pub fn applied(reply: i64) -> bool {
        reply == 1
    }
}

impl Call for RebuildCall {
    const SCRIPT: Script = REBUILD;
    fn into_parts(self) -> (Vec<String>, Vec<String>) {
        (self.keys, self.args)
    }
}

/// LOOK (`scripts/look.lua`): the units shard `shard` of `item` holds and its live
/// records of units in transit, read at once; answers `{units, records, units in
/// transit}`.
#[derive(Debug, Clone)]
pub struct LookCall {
    keys: Vec<String>,
}

impl LookCall {
    pub fn new(activity: ActivityId, shard: Shard, item: ItemId) -> Self {
        Self {
            keys: vec![
                keys::stock(activity, shard, item),
                keys::transit(activity, shard, item),
            ],
        }
    }
}

impl Call for LookCall {
    const SCRIPT: Script = LOOK;
    fn into_parts(self) -> (Vec<String>, Vec<String>) {
        (self.keys, Vec::new())
    }
}

/// SOLDOUT_MARK (`scripts/soldout_mark.lua`): set the sold-out flag of `item` unless
/// the change count is no longer `changes` (as read before the look at the shards;
/// `None` when the key was missing).
#[derive(Debug, Clone)]
pub struct SoldOutMarkCall {
    keys: Vec<String>,
    args: Vec<String>,
}

impl SoldOutMarkCall {
    pub fn new(activity: ActivityId, item: ItemId, changes: Option<&str>) -> Self {
        Self {
            keys: vec![
                keys::changes(activity, item),
                keys::sold_out(activity, item),
            ],
            args: vec![changes.unwrap_or_default().to_string()],
        }
    }
}

impl Call for SoldOutMarkCall {
    const SCRIPT: Script = SOLDOUT_MARK;
    fn into_parts(self) -> (Vec<String>, Vec<String>) {
        (self.keys, self.args)
    }
}

/// What SOLDOUT_MARK answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    /// This call set the flag (announce it).
    Set,
    /// The flag was set already.
    Already,
    /// A move ended or units came back during the caller's look: look again.
    Changed,
}

impl Marked {
    /// Reads the integer answer (`None` for an answer the script never gives).
    pub fn from_reply(n: i64) -> Option<Self> {
        match n {
            1 => Some(Marked::Set),
            0 => Some(Marked::Already),
            -2 => Some(Marked::Changed),
            _ => None,
        }
    }
}

/// SOLDOUT_CLEAR (`scripts/soldout_clear.lua`): clear the sold-out flag of `item` and
/// count the change; answers 1 when the flag was set.
#[derive(Debug, Clone)]
pub struct SoldOutClearCall {
    keys: Vec<String>,
}

impl SoldOutClearCall {
    pub fn new(activity: ActivityId, item: ItemId) -> Self {
        Self {
            keys: vec![
                keys::sold_out(activity, item),
                keys::changes(activity, item),
            ],
        }
    }
}

impl Call for SoldOutClearCall {
    const SCRIPT: Script = SOLDOUT_CLEAR;
    fn into_parts(self) -> (Vec<String>, Vec<String>) {
        (self.keys, Vec::new())
    }
}

/// CHANGES_RAISE (`scripts/changes_raise.lua`): count a change of `item` (a move
/// settling); answers the new count.
#[derive(Debug, Clone)]
pub struct ChangesRaiseCall {
    key: String,
}

impl ChangesRaiseCall {
    pub fn new(activity: ActivityId, item: ItemId) -> Self {
        Self {
            key: keys::changes(activity, item),
        }
    }
}

impl Call for ChangesRaiseCall {
    const SCRIPT: Script = CHANGES_RAISE;
    fn into_parts(self) -> (Vec<String>, Vec<String>) {
        (vec![self.key], Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_call_lists_the_shard_keys_once_and_two_keys_four_args_per_reservation() {
        let mut c = ReserveCall::new(7, 3, 1000, "e1", 42, 2);
        assert!(c.is_empty());
        let id = |s: &str| (UserId::parse(s).unwrap(), RequestId::parse(s).unwrap());
        let ((alice, r1), (bob, r2)) = (id("alice"), id("bob"));
        c.push(11, alice, r1);
        c.push_traced(12, bob, r2, Some("00-tp"), 3);
        assert_eq!(c.len(), 2);
        assert_eq!(
            c.keys,
            [
                keys::fence(7, 3),
                keys::seq(7, 3),
                keys::orders_stream(7, 3),
                keys::stock(7, 3, 11),
                keys::buyers(7, 3, 11),
                keys::stock(7, 3, 12),
                keys::buyers(7, 3, 12),
            ]
        );
        assert_eq!(
            c.args,
            [
                "7", "3", "1000", "e1", "42", "11", "alice", "alice", "", "1", "12", "bob", "bob",
                "00-tp", "3"
            ]
        );
    }

    #[test]
    fn a_release_call_names_the_reservation_shard_and_the_holder() {
        let rid: ReservationId = "7-11-3-e1-5".parse().unwrap();
        let (k, a) = ReleaseCall::new(&rid, "alice", true).into_parts();
        assert_eq!(
            k,
            [
                keys::stock(7, 3, 11),
                keys::buyers(7, 3, 11),
                keys::fence(7, 3)
            ]
        );
        assert_eq!(a, ["alice", "7-11-3-e1-5", "1"]);
        let (_, a) = ReleaseCall::new(&rid, "alice", false).into_parts();
        assert_eq!(a[2], "0");
        assert_eq!(
            Released::from_reply("RELEASED", 4, 2),
            Some(Released::Released { left: 4, units: 2 })
        );
        assert_eq!(
            Released::from_reply("NOT_HELD", -1, 0),
            Some(Released::NotHeld)
        );
        assert_eq!(
            Released::from_reply("CLOSED", -1, 0),
            Some(Released::Closed)
        );
        assert_eq!(Released::from_reply("WHAT", 0, 0), None);
    }

    #[test]
    fn take_give_and_warm_calls_follow_their_scripts_headers() {
        let at = TakeAt {
            epoch: "e1",
            seq: 9,
            id: "m1",
            lifetime_ms: 0,
        };
        let (k, a) = TakeCall::new(7, 2, 11, 4, at).into_parts();
        assert_eq!(
            k,
            [
                keys::fence(7, 2),
                keys::stock(7, 2, 11),
                keys::seq(7, 2),
                keys::transit(7, 2, 11)
            ]
        );
        assert_eq!(a, ["4", "e1", "9", "m1", "1"]);
        let (k, a) = GiveCall::new(7, 5, 11, 3, "e1").into_parts();
        assert_eq!(k, [keys::fence(7, 5), keys::stock(7, 5, 11)]);
        assert_eq!(a, ["3", "e1"]);
        assert_eq!(Taken::from_reply(-1, ""), Some(Taken::FenceMissing));
        assert_eq!(Taken::from_reply(-2, "12"), Some(Taken::Behind(12)));
        assert_eq!(
            Taken::from_reply(0, "e1"),
            Some(Taken::Units {
                units: 0,
                epoch: "e1".into()
            })
        );
        assert_eq!(Taken::from_reply(-3, "e2"), Some(Taken::Newer("e2".into())));
        assert_eq!(Taken::from_reply(-3, ""), None);
        assert_eq!(Taken::from_reply(-4, "e2"), None);
        assert_eq!(Given::from_reply(-1), Given::FenceMissing);
        assert_eq!(Given::from_reply(-2), Given::Stale);
        assert_eq!(Given::from_reply(5), Given::Units(5));
        let (k, a) = LookCall::new(7, 2, 11).into_parts();
        assert_eq!(k, [keys::stock(7, 2, 11), keys::transit(7, 2, 11)]);
        assert!(a.is_empty());
        let (k, a) = SoldOutMarkCall::new(7, 11, None).into_parts();
        assert_eq!(k, [keys::changes(7, 11), keys::sold_out(7, 11)]);
        assert_eq!(a, [""]);
        let (k, a) = SoldOutClearCall::new(7, 11).into_parts();
        assert_eq!(k, [keys::sold_out(7, 11), keys::changes(7, 11)]);
        assert!(a.is_empty());
        for (n, m) in [
            (1, Marked::Set),
            (0, Marked::Already),
            (-2, Marked::Changed),
        ] {
            assert_eq!(Marked::from_reply(n), Some(m));
        }
        assert_eq!(Marked::from_reply(2), None);
        assert_eq!(Marked::from_reply(-1), None);
        let mut w = WarmCall::new(7, 1, "e9", false);
        w.push(11, 10);
        w.push(12, 0);
        let (k, a) = w.into_parts();
        assert_eq!(
            k,
            [
                keys::fence(7, 1),
                keys::lease(7, 1),
                keys::stock(7, 1, 11),
                keys::stock(7, 1, 12)
            ]
        );
        assert_eq!(a, ["e9", "0", "10", "0"]);
        let (_, a) = WarmCall::new(7, 1, "e9", true).into_parts();
        assert_eq!(a, ["e9", "1"]);
        assert_eq!(Warmed::from_reply(1), Warmed::Wrote);
        assert_eq!(Warmed::from_reply(0), Warmed::AlreadyWarm);
    }

    #[test]
    fn every_call_runs_its_own_script() {
        assert_eq!(ReserveCall::SCRIPT.name, "reserve");
        assert_eq!(ReleaseCall::SCRIPT.name, "release");
        assert_eq!(TakeCall::SCRIPT.name, "take");
        assert_eq!(GiveCall::SCRIPT.name, "give");
        assert_eq!(WarmCall::SCRIPT.name, "warm");
    }
}
