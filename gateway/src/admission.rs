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
///
/// The slot is added before the cap is read, both `SeqCst`, and [`ask`] lowers the
/// lease before it reads the calls in flight: so a call admitted on a lease that was
/// being lowered is counted in what [`ask`] reports to Redis (no call slips between
/// the two). On x86 neither costs more than before: the add is a locked instruction
/// either way, and a `SeqCst` load is a plain load.
pub fn admit(item: &Arc<ItemLive>, k: f64, min_in_flight: u32) -> Option<Admitted> {
    let before = item.in_flight.fetch_add(1, Ordering::SeqCst);
    let guard = Admitted(item.clone());
    let cap = match item.fleet_cap.load(Ordering::SeqCst) {
        leased if leased >= 0 => leased.min(i64::from(u32::MAX)) as u32,
        _ => cap(item, k, min_in_flight),
    };
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

/// What a fleet round asks Redis for `item` (whose full cap is `full_cap`): the slots it
/// wants ([`want`]) and the calls in flight to record as its holding at least. When it
/// asks for fewer slots than it holds (an idle gateway giving slots back), the lease is
/// lowered to the ask first and the calls in flight are read after that: every call
/// admitted on the old lease is then in the count (see [`admit`]), and none is
/// admitted beyond the ask while Redis may grant the slots given back to another
/// gateway. (Lowering it only when the answer came back let a gateway admit up to its
/// old lease for one round trip while another was granted the same slots.)
pub fn ask(item: &ItemLive, full_cap: u32, slice: u32, fleet_size: u32) -> (u32, u32) {
    let busy = item.busy.swap(0, Ordering::Relaxed);
    let lease = item.fleet_cap.load(Ordering::SeqCst);
    let in_flight = item.in_flight.load(Ordering::SeqCst);
    let held = lease.max(0) as u32;
    let w = want(full_cap, held, in_flight, busy, slice, fleet_size);
    if lease >= 0 && i64::from(w) < lease {
        item.fleet_cap.store(i64::from(w), Ordering::SeqCst);
        return (w, item.in_flight.load(Ordering::SeqCst));
    }
    (w, in_flight)
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
    fn a_gateway_giving_slots_back_lowers_its_lease_before_it_asks() {
        let it = item(1000, 1000);
        it.fleet_cap.store(8, Ordering::Relaxed);
        let mut held: Vec<_> = (0..5).map(|_| admit(&it, 0.01, 1).unwrap()).collect();
        // Idle (no refusal): in flight 5 + min(slice 2, cap 10 / 2) = 7, fewer than 8.
        assert_eq!(ask(&it, 10, 2, 2), (7, 5));
        assert_eq!(
            it.fleet_cap.load(Ordering::Relaxed),
            7,
            "lowered before the ask"
        );
        held.extend((0..2).map(|_| admit(&it, 0.01, 1).unwrap()));
        assert!(
            admit(&it, 0.01, 1).is_none(),
            "the eighth slot is given back"
        );
        // Asking for more changes nothing before the answer.
        assert_eq!(ask(&it, 10, 2, 2), (9, 7));
        assert_eq!(it.fleet_cap.load(Ordering::Relaxed), 7);
        drop(held);
    }

    #[test]
    fn no_call_admitted_while_the_lease_is_lowered_escapes_the_count() {
        // A thread admits one call after another, keeping every slot, while the round
        // lowers the lease at a random moment: whatever the interleaving, what is
        // admitted in the end is at most the ask or the calls in flight the ask
        // reports (the holding Redis records).
        for round in 0..3000u64 {
            let it = item(1000, 1000);
            it.fleet_cap.store(1000, Ordering::SeqCst);
            let start = Arc::new(std::sync::Barrier::new(2));
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let admitter = {
                let (it, start, stop) = (it.clone(), start.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(g) = admit(&it, 0.01, 1) {
                            held.push(g);
                        }
                    }
                    held
                })
            };
            start.wait();
            for _ in 0..round % 200 {
                std::hint::spin_loop();
            }
            let (want, reported) = ask(&it, 1000, 1, 1000);
            for _ in 0..200 {
                std::hint::spin_loop();
            }
            stop.store(true, Ordering::Relaxed);
            let held = admitter.join().unwrap();
            assert!(
                held.len() as u32 <= want.max(reported),
                "{} admitted; asked {want}, reported {reported} in flight",
                held.len()
            );
        }
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
