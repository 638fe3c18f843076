//! The admission cap (state of the `admission` filter). At most `k × remaining` reservations of an item may be in
//! flight to stockd (never fewer than `min_in_flight`); the excess gets 429 `busy`
//! without calling stockd. "Remaining" is the last read of the item's shards (the
//! total before the first read). An [`Admitted`] guard holds the slot and frees it
//! when the call is over, whatever happens.
//!
//! With `limits.fleet` the cap is the item's lease ([`ItemLive::fleet_cap`]): the slots
//! this gateway holds of the fleet-wide cap, renewed by `crate::fleet` every
//! `limits.sync_ms`. The request still only does the one atomic add.

use crate::sold_out::ItemLive;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A held in-flight slot.
#[derive(Debug)]
pub struct Admitted(Arc<ItemLive>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The cap for an item.
pub fn cap(item: &ItemLive, k: f64, min_in_flight: u32) -> u32 {
    let remaining = match item.remaining.load(Ordering::Relaxed) {
        r if r < 0 => i64::from(item.total),
        r => r,
    };
    ((remaining as f64 * k).ceil() as u32).max(min_in_flight)
}

/// Takes a slot, or `None` when the cap (or this gateway's lease of the fleet-wide
/// cap) is reached.
pub fn admit(item: &Arc<ItemLive>, k: f64, min_in_flight: u32) -> Option<Admitted> {
    let cap = match item.fleet_cap.load(Ordering::Relaxed) {
        leased if leased >= 0 => leased.min(i64::from(u32::MAX)) as u32,
        _ => cap(item, k, min_in_flight),
    };
    let before = item.in_flight.fetch_add(1, Ordering::AcqRel);
    let guard = Admitted(item.clone());
    if before < cap {
        return Some(guard);
    }
    item.busy.fetch_add(1, Ordering::Relaxed);
    None
}

/// How many slots to ask the fleet for at the next lease: what is in flight plus a
/// slice, more after refusals (`busy` since the last lease, at least `slice` more
/// than held), at most the full cap. An idle gateway keeps at most
/// min(`slice`, cap / `fleet_size`) spare, so it never starves the others.
pub fn want(
    full_cap: u32,
    held: u32,
    in_flight: u32,
    busy: u32,
    slice: u32,
    fleet_size: u32,
) -> u32 {
    let w = if busy > 0 {
        held.max(in_flight).saturating_add(slice.max(busy))
    } else {
        in_flight.saturating_add(slice.min(full_cap / fleet_size.max(1)))
    };
    w.min(full_cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(total: u32, remaining: i64) -> Arc<ItemLive> {
        let it = ItemLive::new(1, String::new(), 0, 0, total);
        it.remaining.store(remaining, Ordering::Relaxed);
        Arc::new(it)
    }

    #[test]
    fn at_most_k_times_remaining_are_admitted_and_slots_come_back() {
        let it = item(100, 3);
        let held: Vec<_> = (0..6).map(|_| admit(&it, 2.0, 1).unwrap()).collect();
        assert!(admit(&it, 2.0, 1).is_none());
        assert_eq!(it.in_flight.load(Ordering::Relaxed), 6);
        drop(held);
        assert_eq!(it.in_flight.load(Ordering::Relaxed), 0);
        assert!(admit(&it, 2.0, 1).is_some());
    }

    #[test]
    fn a_lease_replaces_the_local_cap_and_refusals_are_counted() {
        let it = item(100, 50);
        it.fleet_cap.store(2, Ordering::Relaxed);
        let held: Vec<_> = (0..2).map(|_| admit(&it, 2.0, 1).unwrap()).collect();
        assert!(admit(&it, 2.0, 1).is_none());
        assert!(admit(&it, 2.0, 1).is_none());
        assert_eq!(it.busy.load(Ordering::Relaxed), 2);
        drop(held);
        // A lease of 0 admits nothing; -1 is the local cap again.
        it.fleet_cap.store(0, Ordering::Relaxed);
        assert!(admit(&it, 2.0, 1).is_none());
        it.fleet_cap.store(-1, Ordering::Relaxed);
        assert!(admit(&it, 2.0, 1).is_some());
    }

    #[test]
    fn a_gateway_asks_for_more_after_refusals_and_gives_back_when_idle() {
        // Refusals: held + max(slice, busy), at most the cap.
        assert_eq!(want(100, 10, 10, 3, 8, 2), 18);
        assert_eq!(want(100, 10, 10, 30, 8, 2), 40);
        assert_eq!(want(30, 10, 10, 30, 8, 2), 30);
        // Idle: in flight + min(slice, cap / fleet): a small cap is not hoarded.
        assert_eq!(want(100, 40, 3, 0, 8, 2), 11);
        assert_eq!(want(4, 4, 0, 0, 8, 2), 2);
        assert_eq!(want(1, 1, 0, 0, 8, 2), 0);
    }

    #[test]
    fn before_the_first_read_the_total_counts_and_the_floor_holds() {
        assert_eq!(cap(&item(10, -1), 2.0, 1), 20);
        assert_eq!(cap(&item(10, 0), 2.0, 4), 4);
        assert_eq!(cap(&item(10, 1), 0.5, 0), 1);
    }
}
