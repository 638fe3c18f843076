//! Live pressure on the challenge's difficulty, bounded by `challenge.max_bits`:
//!
//! - per client IP: every `raise_after_failures` refused redeems of the kinds an
//!   honest client does not make (tampered, unsolved, wrong user or item, missing)
//!   within `failure_window_secs` add one bit to that IP's next puzzles; the window
//!   restarts after it runs out, so a client that stops failing is back at the base
//!   difficulty within a window;
//! - per activity: [`Pressure::set_activity_extra`], a hook for the waiting room (or
//!   an operator) to add bits while the crowd is large.
//!
//! Neither raises a difficulty past `max_bits` (`Challenges::bits_for`): at the
//! shipped cap the expected solve time on a mid-range phone stays within seconds
//! (docs/gateway.md), so nobody is locked out silently. The IP map is bounded: past
//! [`MAX_TRACKED`] entries, the ones whose window ran out are dropped, and if that is
//! not enough, all of them (a flood forgets its raises rather than growing memory).

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use dashmap::DashMap;

use crate::config;

/// Most IPs whose failures are remembered.
pub const MAX_TRACKED: usize = 100_000;

/// Failures of one IP in its current window.
#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    since_ms: u64,
}

/// The raises (see the module doc).
///
/// Every puzzle issued asks [`Pressure::extra_bits`], so the usual case, nothing
/// raised, is answered without touching the maps: a look-up costs a shard lock and a
/// SipHash, and `DashMap::is_empty` locks every shard in turn.
#[derive(Default)]
pub struct Pressure {
    ips: DashMap<IpAddr, Failures>,
    activities: DashMap<u64, u32>,
    /// Set by the first recorded failure, never cleared (after that, a look-up).
    any_failures: AtomicBool,
    /// At least the number of entries of `activities`: counted up before an insert
    /// and down after a removal, so 0 means the map is empty.
    raised_activities: AtomicUsize,
}

impl Pressure {
    /// Records a refused redeem from `ip` at gateway ms `now_ms`.
    pub fn failed(&self, ip: IpAddr, now_ms: u64, cfg: &config::Challenge) {
        if cfg.raise_after_failures == 0 {
            return;
        }
        let window = cfg.failure_window_secs * 1000;
        self.any_failures.store(true, Ordering::Release);
        if self.ips.len() >= MAX_TRACKED {
            self.ips
                .retain(|_, f| now_ms.saturating_sub(f.since_ms) < window);
            if self.ips.len() >= MAX_TRACKED {
                self.ips.clear();
            }
        }
        let mut f = self.ips.entry(ip).or_insert(Failures {
            count: 0,
            since_ms: now_ms,
        });
        if now_ms.saturating_sub(f.since_ms) >= window {
            *f = Failures {
                count: 0,
                since_ms: now_ms,
            };
        }
        f.count = f.count.saturating_add(1);
    }

    /// Bits added for a client at `ip` of activity `a` (before the cap).
    pub fn extra_bits(&self, a: u64, ip: IpAddr, now_ms: u64, cfg: &config::Challenge) -> u32 {
        let mut extra = match self.raised_activities.load(Ordering::Acquire) {
            0 => 0,
            _ => self.activities.get(&a).map_or(0, |e| *e),
        };
        if cfg.raise_after_failures > 0 && self.any_failures.load(Ordering::Acquire) {
            if let Some(f) = self.ips.get(&ip) {
                if now_ms.saturating_sub(f.since_ms) < cfg.failure_window_secs * 1000 {
                    extra += f.count / cfg.raise_after_failures;
                }
            }
        }
        extra.min(puzzle_max())
    }

    /// The bits the waiting room's queue adds to its activity: one per doubling of
    /// `queued` beyond `per_bit` (`per_bit` 0: none).
    pub fn queue_extra(queued: u64, per_bit: u64) -> u32 {
        if per_bit == 0 {
            return 0;
        }
        (queued / per_bit)
            .saturating_add(1)
            .ilog2()
            .min(puzzle_max())
    }

    /// The hook: `extra` bits for every puzzle of activity `a` from now on (0 clears).
    /// Still bounded by `challenge.max_bits`.
    pub fn set_activity_extra(&self, a: u64, extra: u32) {
        if extra == 0 {
            if self.activities.remove(&a).is_some() {
                self.raised_activities.fetch_sub(1, Ordering::Release);
            }
        } else {
            self.raised_activities.fetch_add(1, Ordering::Release);
            if self.activities.insert(a, extra).is_some() {
                self.raised_activities.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

fn puzzle_max() -> u32 {
    super::puzzle::MAX_BITS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_adds_a_bit_per_doubling_and_nothing_when_off() {
        assert_eq!(Pressure::queue_extra(1_000_000, 0), 0);
        assert_eq!(Pressure::queue_extra(0, 1000), 0);
        assert_eq!(Pressure::queue_extra(999, 1000), 0);
        assert_eq!(Pressure::queue_extra(1000, 1000), 1);
        assert_eq!(Pressure::queue_extra(2999, 1000), 1);
        assert_eq!(Pressure::queue_extra(3000, 1000), 2);
        assert_eq!(Pressure::queue_extra(7000, 1000), 3);
        assert_eq!(Pressure::queue_extra(u64::MAX, 1), puzzle_max());
    }

    fn cfg() -> config::Challenge {
        config::Challenge {
            raise_after_failures: 3,
            failure_window_secs: 10,
            ..Default::default()
        }
    }

    #[test]
    fn failures_raise_one_ip_per_step_and_expire_with_the_window() {
        let p = Pressure::default();
        let c = cfg();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..7 {
            p.failed(ip, 1_000, &c);
        }
        assert_eq!(p.extra_bits(1, ip, 1_000, &c), 2);
        assert_eq!(p.extra_bits(1, "192.0.2.2".parse().unwrap(), 1_000, &c), 0);
        // The window ran out: back to the base.
        assert_eq!(p.extra_bits(1, ip, 11_000, &c), 0);
        p.failed(ip, 11_000, &c);
        assert_eq!(p.extra_bits(1, ip, 11_000, &c), 0);
    }

    #[test]
    fn an_activity_raise_holds_until_cleared_however_often_it_is_set() {
        let p = Pressure::default();
        let c = cfg();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(p.extra_bits(7, ip, 0, &c), 0);
        // A room tick sets every activity's raise each time, 0 included.
        p.set_activity_extra(8, 0);
        p.set_activity_extra(7, 2);
        p.set_activity_extra(7, 3);
        p.set_activity_extra(9, 1);
        assert_eq!(p.extra_bits(7, ip, 0, &c), 3);
        p.set_activity_extra(9, 0);
        p.set_activity_extra(9, 0);
        assert_eq!(p.extra_bits(7, ip, 0, &c), 3);
        assert_eq!(p.extra_bits(9, ip, 0, &c), 0);
        p.set_activity_extra(7, 0);
        assert_eq!(p.extra_bits(7, ip, 0, &c), 0);
        assert_eq!(p.raised_activities.load(Ordering::Relaxed), 0);
    }
}
