//! The Lua scripts, embedded at build time. Callers load them once (`SCRIPT LOAD` on
//! every primary) and call them by SHA (`EVALSHA`), loading again on `NOSCRIPT`.
//! What each call sends and how its answer reads is in [`crate::calls`].

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
/// `scripts/reserve.lua` and [`crate::calls::ReserveCall`].
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

/// Close or reopen a shard for a rebuild, under a fencing token: see
/// `scripts/rebuild.lua`.
pub const REBUILD: Script = Script {
    name: "rebuild",
    body: include_str!("../scripts/rebuild.lua"),
};

/// A shard's units and its units in transit, for a sold-out decision: see
/// `scripts/look.lua`.
pub const LOOK: Script = Script {
    name: "look",
    body: include_str!("../scripts/look.lua"),
};
/// Set the sold-out flag unless a move or a return may have been missed: see
/// `scripts/soldout_mark.lua`.
pub const SOLDOUT_MARK: Script = Script {
    name: "soldout_mark",
    body: include_str!("../scripts/soldout_mark.lua"),
};
/// Clear the sold-out flag and count the change: see `scripts/soldout_clear.lua`.
pub const SOLDOUT_CLEAR: Script = Script {
    name: "soldout_clear",
    body: include_str!("../scripts/soldout_clear.lua"),
};

/// Count a change of an item as a move settles: see `scripts/changes_raise.lua`.
pub const CHANGES_RAISE: Script = Script {
    name: "changes_raise",
    body: include_str!("../scripts/changes_raise.lua"),
};

/// The gateway's fleet-wide token buckets: see `scripts/fleet_bucket.lua` (called by
/// the gateway with EVAL, not loaded by stockd).
pub const FLEET_BUCKET: Script = Script {
    name: "fleet_bucket",
    body: include_str!("../scripts/fleet_bucket.lua"),
};

/// The gateway's fleet-wide admission cap (in-flight slots leased per gateway): see
/// `scripts/fleet_slots.lua` (called by the gateway with EVAL, not loaded by stockd).
pub const FLEET_SLOTS: Script = Script {
    name: "fleet_slots",
    body: include_str!("../scripts/fleet_slots.lua"),
};

/// Every script, for loading at start-up.
pub const ALL: [Script; 10] = [
    RESERVE,
    RELEASE,
    TAKE,
    GIVE,
    WARM,
    REBUILD,
    LOOK,
    SOLDOUT_MARK,
    SOLDOUT_CLEAR,
    CHANGES_RAISE,
];

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
}
