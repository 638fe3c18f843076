//! Key and channel names. Every key of one activity shard shares the hash tag
//! `{a:i}`, so a shard is one Redis Cluster slot and one Lua call can touch all of it.
//! Activity-wide keys use the tag `{a}`.

use crate::{ActivityId, ItemId, Shard};

/// Hash tag of one activity shard: `{a:i}`.
pub fn shard_tag(a: ActivityId, i: Shard) -> String {
    format!("{{{a}:{i}}}")
}

/// `sk:{a:i}:stock:<s>`: units of item `s` left in shard `i` (string int).
pub fn stock(a: ActivityId, i: Shard, s: ItemId) -> String {
    format!("sk:{{{a}:{i}}}:stock:{s}")
}

/// `sk:{a:i}:buyers:<s>`: hash uid → `"<reservation id>|<request id>"` for users whose
/// home shard is `i`.
pub fn buyers(a: ActivityId, i: Shard, s: ItemId) -> String {
    format!("sk:{{{a}:{i}}}:buyers:{s}")
}

/// `sk:{a:i}:orders`: stream of reservations waiting for orderd (one per shard).
pub fn orders_stream(a: ActivityId, i: Shard) -> String {
    format!("sk:{{{a}:{i}}}:orders")
}

/// `sk:{a:i}:fence`: the epoch of the shard's last warm-up or recompute. Its absence
/// means Redis lost the shard's state; the scripts then refuse to reserve.
pub fn fence(a: ActivityId, i: Shard) -> String {
    format!("sk:{{{a}:{i}}}:fence")
}

/// `sk:{a:i}:lease`: the highest rebuild lease token that has touched the shard. A
/// rebuild closes and reopens a shard only with a token at least this high, so a
/// stockd whose lease expired while it still wrote cannot undo a newer rebuild
/// (the fencing token of `scripts/rebuild.lua`).
pub fn lease(a: ActivityId, i: Shard) -> String {
    format!("sk:{{{a}:{i}}}:lease")
}

/// `sk:{a:i}:seq`: sequence of reservation ids in the shard.
pub fn seq(a: ActivityId, i: Shard) -> String {
    format!("sk:{{{a}:{i}}}:seq")
}

/// `sk:{a}:meta`: hash describing a published activity (fields in [`meta`]).
pub fn meta(a: ActivityId) -> String {
    format!("sk:{{{a}}}:meta")
}

/// `sk:{a}:soldout:<s>`: set while every shard of item `s` is empty.
pub fn sold_out(a: ActivityId, s: ItemId) -> String {
    format!("sk:{{{a}}}:soldout:{s}")
}

/// `sk:{a:i}:transit:<s>`: sorted set of the rebalancing moves that took units of item
/// `s` out of shard `i` and have not settled (move id -> deadline, Redis time in ms):
/// units between a take and a give, on no shard. Written by the take itself.
pub fn transit(a: ActivityId, i: Shard, s: ItemId) -> String {
    format!("sk:{{{a}:{i}}}:transit:{s}")
}

/// `sk:{a}:changes:<s>`: count of the events that may put units of item `s` where a
/// look at the shards had found none (a move that moved units settled, the flag was
/// cleared); the sold-out mark is refused when it changed during the caller's look.
pub fn changes(a: ActivityId, s: ItemId) -> String {
    format!("sk:{{{a}}}:changes:{s}")
}

/// `sk:fleet:{u<g>}:<key>`: the fleet-wide per-user bucket of the user whose 64-bit
/// key (xxh3 of the user id, hex) is `key`, in one of 16 groups `g` (the key's low
/// bits) so that one Lua call covers a group and the groups spread over the cluster.
pub fn fleet_user(key: u64) -> String {
    format!("sk:fleet:{{u{}}}:{key:016x}", key % FLEET_USER_GROUPS)
}

/// Number of hash-tag groups of [`fleet_user`] keys.
pub const FLEET_USER_GROUPS: u64 = 16;

/// `sk:fleet:{r}:<route>`: the fleet-wide bucket of a route (`limits.routes`).
pub fn fleet_route(route: &str) -> String {
    format!("sk:fleet:{{r}}:{route}")
}

/// `sk:fleet:{a}:slots:<s>`: hash gateway id → `"<slots held> <expires at ms>"`, the
/// admission cap's in-flight slots of item `s` leased by each gateway.
pub fn fleet_slots(a: ActivityId, s: ItemId) -> String {
    format!("sk:fleet:{{{a}}}:slots:{s}")
}

/// `sk:{a}:room`: the waiting room of activity `a`, a hash of its live knobs (method,
/// paused, rates: set on any gateway's admin port, read by every gateway's tick) and its
/// admission state (tickets handed out, the pre-queue, the admitted watermark, the rate
/// bucket, the shuffle seed). Only the gateway touches the room's keys; the scripts and
/// the full table are in `gateway/src/fair/room/store.rs`.
pub fn room_hash(a: ActivityId) -> String {
    format!("sk:{{{a}}}:room")
}

/// `sk:{a}:room:users`: hash user → the user's latest ticket (a join replaces it).
pub fn room_users(a: ActivityId) -> String {
    format!("sk:{{{a}}}:room:users")
}

/// `sk:{a}:room:blocks`: list of the closed `random` blocks, `"first:last"` tickets.
pub fn room_blocks(a: ActivityId) -> String {
    format!("sk:{{{a}}}:room:blocks")
}

/// `sk:{a}:room:adm`: sorted set of `"<ms>:<watermark>"` scored by ms, the admission
/// watermark's history over one session, to count the active buyers.
pub fn room_admissions(a: ActivityId) -> String {
    format!("sk:{{{a}}}:room:adm")
}

/// A redeemed proof-of-work puzzle (the gateway's challenge): `SET NX PX` until the
/// puzzle's expiry makes each puzzle buy one purchase token across every gateway. No
/// hash tag: the 32 hex digits of the puzzle's MAC spread these keys over every slot.
pub fn pow_spent(digest_hex: &str) -> String {
    format!("sk:pow:{digest_hex}")
}

/// Channel announcing sold-out changes; message format in [`crate::messages::SoldOut`].
pub const SOLD_OUT_CHANNEL: &str = "sk:soldout";

/// Set of published activity ids (decimal strings): how the gateway and orderd find
/// activities and streams.
pub const ACTIVITIES: &str = "sk:activities";
/// Channel on which stockd announces a published or changed activity (payload: id).
pub const ACTIVITIES_CHANNEL: &str = "sk:activities";

/// Hash of banned IPs or CIDRs → `"<expires unix ms, 0 = never>|<reason>"`, shared by
/// every edge.
pub const BANS: &str = "sk:bans";
/// Channel announcing ban changes; message format in [`crate::messages::BanChange`].
pub const BANS_CHANNEL: &str = "sk:bans";
/// Stream of dead letters (orderd appends one entry per dead-lettered reservation
/// entry, next to the `dead_letters` table): fields `stream`, `entry`, `rid`, `error`,
/// `deliveries`.
pub const DLQ_STREAM: &str = "sk:dlq";

/// Field names of the [`meta`] hash.
pub mod meta {
    /// Activity title.
    pub const TITLE: &str = "title";
    /// Window start, unix ms.
    pub const START_MS: &str = "start_ms";
    /// Window end, unix ms.
    pub const END_MS: &str = "end_ms";
    /// Shard count.
    pub const SHARDS: &str = "shards";
    /// Units one user may hold of one item (the largest reserve quantity); a hash
    /// without it means 1.
    pub const PER_USER_LIMIT: &str = "per_user_limit";
    /// Item ids, comma-separated.
    pub const ITEMS: &str = "items";
    /// Activity version (bumped on every change).
    pub const VERSION: &str = "version";
    /// Prefix of per-item fields: `stock:<s>` total units, `title:<s>`, `price:<s>`
    /// (sale price, cents), `list_price:<s>` (list price, cents).
    pub const ITEM_STOCK: &str = "stock:";
    pub const ITEM_TITLE: &str = "title:";
    pub const ITEM_PRICE: &str = "price:";
    pub const ITEM_LIST_PRICE: &str = "list_price:";
    /// Leading zero bits of each proof-of-work sub-puzzle the gateway asks before a
    /// purchase token; 0 (or absent) = no challenge.
    pub const CHALLENGE_BITS: &str = "challenge_bits";
    /// The named Redis Cluster holding the activity's shards, sold-out flags and
    /// streams (`[redis.clusters.<name>]` in every daemon's config); absent or empty =
    /// the default cluster, which always holds this hash and the catalog.
    pub const CLUSTER: &str = "cluster";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The part of a key Redis Cluster hashes: the text between the first `{` and the
    /// next `}`, when non-empty (cluster spec, "hash tags").
    fn hashed_part(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    #[test]
    fn all_keys_of_one_shard_share_one_hash_tag() {
        for (a, i, s) in [(1, 0, 7), (42, 7, 9_000_000_001), (u64::MAX, 1023, 1)] {
            let tag = hashed_part(&stock(a, i, s)).to_string();
            assert_eq!(tag, format!("{a}:{i}"));
            for key in [
                buyers(a, i, s),
                orders_stream(a, i),
                fence(a, i),
                seq(a, i),
                stock(a, i, s + 1),
            ] {
                assert_eq!(hashed_part(&key), tag, "{key}");
            }
            assert_eq!(shard_tag(a, i), format!("{{{tag}}}"));
        }
    }

    #[test]
    fn shards_of_one_item_use_different_tags() {
        let tags: std::collections::HashSet<String> = (0..8)
            .map(|i| hashed_part(&stock(5, i, 1)).to_string())
            .collect();
        assert_eq!(tags.len(), 8);
    }

    #[test]
    fn activity_wide_keys_share_the_activity_tag() {
        assert_eq!(hashed_part(&meta(9)), "9");
        assert_eq!(hashed_part(&sold_out(9, 3)), "9");
        // The mark reads the count in one script with the flag.
        assert_eq!(hashed_part(&changes(9, 3)), "9");
    }

    #[test]
    fn units_in_transit_share_their_donor_shard_tag() {
        // The take writes them in its own call, and a look reads them with the stock.
        assert_eq!(hashed_part(&transit(9, 2, 3)), hashed_part(&stock(9, 2, 3)));
        assert_eq!(hashed_part(&transit(9, 2, 3)), hashed_part(&fence(9, 2)));
    }
}
