//! The admission cap (state of the `admission` filter). At most `k × remaining` reservations of an item may be in
//! flight to stockd (never fewer than `min_in_flight`); the excess gets 429 `busy`
//! without calling stockd. "Remaining" is the last read of the item's shards (the
//! total before the first read). An [`Admitted`] guard holds the slot and frees it
//! when the call is over, whatever happens.

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

/// Takes a slot, or `None` when the cap is reached.
pub fn admit(item: &Arc<ItemLive>, k: f64, min_in_flight: u32) -> Option<Admitted> {
    let cap = cap(item, k, min_in_flight);
    let before = item.in_flight.fetch_add(1, Ordering::AcqRel);
    let guard = Admitted(item.clone());
    (before < cap).then_some(guard)
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
    fn before_the_first_read_the_total_counts_and_the_floor_holds() {
        assert_eq!(cap(&item(10, -1), 2.0, 1), 20);
        assert_eq!(cap(&item(10, 0), 2.0, 4), 4);
        assert_eq!(cap(&item(10, 1), 0.5, 0), 1);
    }
}
