//! Which shard holds what.

use crate::Shard;
use xxhash_rust::xxh3::xxh3_64;

/// The shard that holds `user`'s buyer record for an activity with `shards` shards.
///
/// XXH3-64 of the user id's UTF-8 bytes with the default (zero) seed, modulo the
/// shard count: a fixed, documented function, identical across processes, releases
/// and platforms (unlike `std`'s randomly keyed `DefaultHasher`). `shards` must be at
/// least 1.
pub fn home_shard(user: &str, shards: u32) -> Shard {
    debug_assert!(shards >= 1);
    (xxh3_64(user.as_bytes()) % u64::from(shards.max(1))) as Shard
}

/// Splits `total` units over `shards` shards: `total / shards` each, the remainder
/// one unit each to the first shards. The parts add up to `total`.
pub fn split_stock(total: u64, shards: u32) -> Vec<u64> {
    let n = u64::from(shards.max(1));
    let (base, extra) = (total / n, total % n);
    (0..n).map(|i| base + u64::from(i < extra)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_adds_up_to_the_total_and_differs_by_at_most_one() {
        for total in [0, 1, 7, 8, 9, 100, 999, 1_000_003] {
            for shards in [1, 2, 3, 8, 13, 1024] {
                let parts = split_stock(total, shards);
                assert_eq!(parts.len(), shards as usize);
                assert_eq!(parts.iter().sum::<u64>(), total);
                let (min, max) = (parts.iter().min().unwrap(), parts.iter().max().unwrap());
                assert!(max - min <= 1, "{total} over {shards}: {parts:?}");
            }
        }
        assert_eq!(split_stock(10, 4), vec![3, 3, 2, 2]);
    }

    #[test]
    fn home_shard_is_a_fixed_function_of_the_user_id() {
        // Pinned values: these must never change, or buyer records written by one
        // release would be looked up on the wrong shard by the next.
        assert_eq!(xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        let pinned: Vec<u32> = ["alice", "bob", "user-1", "user-2", "42"]
            .iter()
            .map(|u| home_shard(u, 8))
            .collect();
        let again: Vec<u32> = ["alice", "bob", "user-1", "user-2", "42"]
            .iter()
            .map(|u| (xxh3_64(u.as_bytes()) % 8) as u32)
            .collect();
        assert_eq!(pinned, again);
        assert_eq!(home_shard("anyone", 1), 0);
    }

    #[test]
    fn home_shards_spread_users_over_every_shard() {
        let mut counts = [0u32; 8];
        for u in 0..8000 {
            counts[home_shard(&format!("user-{u}"), 8) as usize] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "{counts:?}");
        }
    }
}
