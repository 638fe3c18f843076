//! The Lua scripts, embedded at build time. Callers load them once (`SCRIPT LOAD` on
//! every primary) and call them by SHA (`EVALSHA`), loading again on `NOSCRIPT`.

use crate::{ActivityId, ItemId, Shard};

/// One embedded script.
#[derive(Debug, Clone, Copy)]
pub struct Script {
    pub name: &'static str,
    pub body: &'static str,
}

impl Script {
    /// Lower-case hex SHA1 of the body: the name Redis knows the script by.
    pub fn sha1(&self) -> String {
        sha1_smol::Sha1::from(self.body).digest().to_string()
    }
}

/// Reserve units on one shard, one or more reservations per call: see
/// `scripts/reserve.lua` and [`ReserveCall`].
pub const RESERVE: Script = Script {
    name: "reserve",
    body: include_str!("../scripts/reserve.lua"),
};
/// Release a unit: see `scripts/release.lua`.
pub const RELEASE: Script = Script {
    name: "release",
    body: include_str!("../scripts/release.lua"),
};
/// Rebalancing, donor side: see `scripts/take.lua`.
pub const TAKE: Script = Script {
    name: "take",
    body: include_str!("../scripts/take.lua"),
};
/// Rebalancing, receiving side: see `scripts/give.lua`.
pub const GIVE: Script = Script {
    name: "give",
    body: include_str!("../scripts/give.lua"),
};
/// Warm or recompute a shard: see `scripts/warm.lua`.
pub const WARM: Script = Script {
    name: "warm",
    body: include_str!("../scripts/warm.lua"),
};

/// The KEYS and ARGV of one call of the reserve script: one shard, one or more
/// reservations (see `scripts/reserve.lua`; the answer has three fields per
/// reservation, in the order they were pushed).
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
            crate::keys::fence(activity, shard),
            crate::keys::seq(activity, shard),
            crate::keys::orders_stream(activity, shard),
        ]);
        let mut args = Vec::with_capacity(5 + 3 * capacity);
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

    /// Adds one reservation of `item` for `user` under `request` (owned strings are
    /// moved in, not copied).
    pub fn push(&mut self, item: ItemId, user: impl Into<String>, request: impl Into<String>) {
        self.keys.extend([
            crate::keys::stock(self.activity, self.shard, item),
            crate::keys::buyers(self.activity, self.shard, item),
        ]);
        self.args
            .extend([item.to_string(), user.into(), request.into()]);
    }

    /// Reservations in the call.
    pub fn len(&self) -> usize {
        (self.keys.len() - 3) / 2
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every script, for loading at start-up.
pub const ALL: [Script; 5] = [RESERVE, RELEASE, TAKE, GIVE, WARM];

/// Outcomes the reserve script returns as its first element.
pub mod reserve_outcome {
    pub const RESERVED: &str = "RESERVED";
    pub const RETRY: &str = "RETRY";
    pub const DUPLICATE: &str = "DUPLICATE";
    pub const SOLD_OUT: &str = "SOLD_OUT";
    pub const LOST: &str = "LOST";
    /// The fence is there but the shard's sequence is below one already handed out
    /// under the same epoch: Redis lost writes (a failover to a lagging replica, an
    /// AOF that lost its last second). The third field is the sequence found.
    pub const BEHIND: &str = "BEHIND";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_is_embedded_with_a_distinct_sha() {
        let shas: std::collections::HashSet<String> = ALL.iter().map(|s| s.sha1()).collect();
        assert_eq!(shas.len(), ALL.len());
        for s in ALL {
            assert!(s.body.contains("redis.call"), "{}", s.name);
            assert_eq!(s.sha1().len(), 40);
        }
        // SHA1 of the empty string, to pin the hex format Redis uses.
        let empty = Script {
            name: "e",
            body: "",
        };
        assert_eq!(empty.sha1(), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    }

    #[test]
    fn a_reserve_call_lists_the_shard_keys_once_and_two_keys_three_args_per_reservation() {
        let mut c = ReserveCall::new(7, 3, 1000, "e1", 42, 2);
        assert!(c.is_empty());
        c.push(11, "alice", "r1");
        c.push(12, "bob", "r2");
        assert_eq!(c.len(), 2);
        assert_eq!(
            c.keys,
            [
                crate::keys::fence(7, 3),
                crate::keys::seq(7, 3),
                crate::keys::orders_stream(7, 3),
                crate::keys::stock(7, 3, 11),
                crate::keys::buyers(7, 3, 11),
                crate::keys::stock(7, 3, 12),
                crate::keys::buyers(7, 3, 12),
            ]
        );
        assert_eq!(
            c.args,
            ["7", "3", "1000", "e1", "42", "11", "alice", "r1", "12", "bob", "r2"]
        );
    }
}
