//! The admission order, computed the same way by every gateway from what Redis gives
//! them (no per-ticket state anywhere):
//!
//! - tickets `1..=P` are the pre-queue (joined before the opening; `P` is frozen in
//!   Redis by the first join or tick at or after the opening); their order is a keyed
//!   random permutation of `1..=P` ([`permute`], seeded by the activity's random seed);
//! - later tickets keep arrival order (`fifo`), or (`random`) each closed block
//!   `start..=end` of arrivals is permuted the same way;
//! - the queue position of ticket `t` is [`Layout::position`]; a ticket is admitted once
//!   its position is at most the activity's watermark (`admitted` in Redis).
//!
//! Positions tile `1..=next` exactly: a permutation inside each block moves tickets,
//! never across blocks, so the watermark counts admitted people whatever the shuffle.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A keyed pseudo-random permutation of `0..n`: `i ↦ permute(seed, n, i)` is a
/// bijection for every `seed` and `n ≥ 1`. A 4-round Feistel network on the smallest
/// even number of bits covering `n`, with cycle walking (re-encrypt until the value
/// falls inside `0..n`; at most 4× the domain, so 4 rounds expected at worst).
pub fn permute(seed: u64, n: u64, i: u64) -> u64 {
    debug_assert!(i < n);
    if n <= 1 {
        return 0;
    }
    let bits = 64 - (n - 1).leading_zeros();
    let half = bits.div_ceil(2).max(1);
    let mask = (1u64 << half) - 1;
    let mut x = i;
    loop {
        let (mut l, mut r) = (x >> half, x & mask);
        for round in 0..4u64 {
            let f =
                xxh3_64_with_seed(&[r.to_le_bytes(), round.to_le_bytes()].concat(), seed) & mask;
            (l, r) = (r, l ^ f);
        }
        x = (l << half) | r;
        if x < n {
            return x;
        }
    }
}

/// What a gateway knows of an activity's queue shape (from the last tick).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layout {
    /// Pre-queue size `P`, once the activity opened.
    pub pre: Option<u64>,
    /// Closed `random` blocks after the pre-queue: `(first ticket, last ticket)`,
    /// ascending and disjoint.
    pub blocks: Vec<(u64, u64)>,
    /// The activity's shuffle seed.
    pub seed: u64,
}

impl Layout {
    /// Queue position (1-based) of `ticket`, `None` before the opening (the pre-queue is
    /// not drawn yet).
    pub fn position(&self, ticket: u64) -> Option<u64> {
        let pre = self.pre?;
        if ticket == 0 {
            return None;
        }
        if ticket <= pre {
            return Some(1 + permute(self.seed, pre, ticket - 1));
        }
        let i = self.blocks.partition_point(|&(_, end)| end < ticket);
        match self.blocks.get(i) {
            Some(&(start, end)) if start <= ticket => {
                let block_seed = self.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                Some(start + permute(block_seed, end - start + 1, ticket - start))
            }
            _ => Some(ticket),
        }
    }
}

/// People ahead of position `pos` when positions up to `admitted` are through.
pub fn ahead(pos: u64, admitted: u64) -> u64 {
    pos.saturating_sub(admitted + 1)
}

/// Estimated wait, seconds: people ahead ÷ admissions per second, rounded up (`None`
/// when nobody is admitted: paused, or a rate of zero).
pub fn eta_secs(ahead: u64, per_sec: f64) -> Option<u64> {
    if !(per_sec.is_finite() && per_sec > 0.0) {
        return None;
    }
    Some((ahead as f64 / per_sec).ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shuffle_is_a_permutation_for_every_size() {
        for n in [1u64, 2, 3, 5, 16, 17, 100, 1000, 4097] {
            for seed in [0u64, 1, 0xdead_beef] {
                let mut seen = vec![false; n as usize];
                for i in 0..n {
                    let j = permute(seed, n, i);
                    assert!(j < n, "n={n} i={i} → {j}");
                    assert!(!seen[j as usize], "n={n} seed={seed}: {j} twice");
                    seen[j as usize] = true;
                }
            }
        }
    }

    #[test]
    fn the_shuffle_moves_people_and_depends_on_the_seed() {
        let n = 1000;
        let fixed = (0..n).filter(|&i| permute(7, n, i) == i).count();
        assert!(fixed < 20, "{fixed} of {n} kept their place");
        let a: Vec<u64> = (0..n).map(|i| permute(1, n, i)).collect();
        let b: Vec<u64> = (0..n).map(|i| permute(2, n, i)).collect();
        assert_ne!(a, b);
        // Early arrivals are spread over the whole queue, not kept in front.
        let first_tenth_in_front = (0..n / 10).filter(|&i| permute(3, n, i) < n / 10).count();
        assert!(first_tenth_in_front < 30, "{first_tenth_in_front}");
    }

    #[test]
    fn positions_tile_the_tickets_pre_queue_blocks_and_fifo_tail() {
        let l = Layout {
            pre: Some(10),
            blocks: vec![(11, 14), (20, 29)],
            seed: 99,
        };
        let mut pos: Vec<u64> = (1..=35).map(|t| l.position(t).unwrap()).collect();
        // Tickets 15..=19 and 30.. are FIFO: their own number.
        for t in (15..=19).chain(30..=35) {
            assert_eq!(pos[t as usize - 1], t);
        }
        // Each block maps onto itself.
        for (lo, hi) in [(1u64, 10u64), (11, 14), (20, 29)] {
            for t in lo..=hi {
                let p = pos[t as usize - 1];
                assert!((lo..=hi).contains(&p), "ticket {t} at {p}");
            }
        }
        pos.sort_unstable();
        assert_eq!(pos, (1..=35).collect::<Vec<_>>());
        assert_eq!(
            Layout {
                pre: None,
                ..l.clone()
            }
            .position(3),
            None
        );
    }

    #[test]
    fn the_estimated_wait_is_people_ahead_over_the_admission_rate() {
        assert_eq!(ahead(11, 10), 0);
        assert_eq!(ahead(15, 10), 4);
        assert_eq!(ahead(3, 10), 0);
        assert_eq!(eta_secs(0, 5.0), Some(0));
        assert_eq!(eta_secs(100, 50.0), Some(2));
        assert_eq!(eta_secs(101, 50.0), Some(3));
        assert_eq!(eta_secs(7, 0.5), Some(14));
        assert_eq!(eta_secs(7, 0.0), None);
        assert_eq!(eta_secs(7, f64::NAN), None);
    }
}
