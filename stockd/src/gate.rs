//! One activity's gate: whether Reserve may sell (open), who holds the activity (the
//! claim: a rebuild, the start-up check, an open), and the rebuild asked of the holder
//! meanwhile, in one atomic word.
//!
//! Kept apart, the three let a request to close pass an open: a holder that had found
//! no rebuild asked and was about to open could be overtaken by a request that closed
//! the activity and left the rebuild to that holder, whose open then sold on the state
//! the request was about until the holder let go. In one word, the holder's open and
//! the request are each one read-modify-write: whichever comes second sees the other.
//!
//! The rules: a request closes the activity; a request to a held activity is left to
//! the holder (the strongest cause asked is kept), one to a free activity claims it for
//! the caller. The holder opens only when nothing is asked, and lets go only when
//! nothing is asked; otherwise it keeps the claim, takes the request and runs it.

use std::sync::atomic::{AtomicU32, Ordering};

/// Bit 0: open. Bit 1: claimed. Bits 8..16: the cause code asked of the holder (0 =
/// none; `crate::recompute::Cause::code`).
#[derive(Debug)]
pub struct Gate(AtomicU32);

const OPEN: u32 = 1;
const CLAIMED: u32 = 1 << 1;
const ASKED_SHIFT: u32 = 8;
const FLAGS: u32 = (1 << ASKED_SHIFT) - 1;

fn asked(word: u32) -> u8 {
    (word >> ASKED_SHIFT) as u8
}

fn with_asked(word: u32, code: u8) -> u32 {
    (word & FLAGS) | u32::from(code) << ASKED_SHIFT
}

/// `AcqRel`/`Acquire` everywhere: every change is one read-modify-write of one word,
/// so the word's modification order alone orders opens, requests and releases.
const RMW: Ordering = Ordering::AcqRel;

impl Gate {
    pub fn new(open: bool) -> Self {
        Self(AtomicU32::new(if open { OPEN } else { 0 }))
    }

    /// One read-modify-write; returns the word before it.
    fn update(&self, f: impl Fn(u32) -> u32) -> u32 {
        match self.0.fetch_update(RMW, Ordering::Acquire, |w| Some(f(w))) {
            Ok(w) | Err(w) => w,
        }
    }

    pub fn is_open(&self) -> bool {
        self.0.load(Ordering::Acquire) & OPEN != 0
    }

    pub fn is_claimed(&self) -> bool {
        self.0.load(Ordering::Acquire) & CLAIMED != 0
    }

    /// Takes the claim when nobody holds it.
    pub fn try_claim(&self) -> bool {
        self.0.fetch_or(CLAIMED, RMW) & CLAIMED == 0
    }

    /// Closes, asking for nothing (the holder, or before a claim it waits for).
    pub fn close(&self) {
        self.0.fetch_and(!OPEN, RMW);
    }

    /// Closes and asks for a rebuild of cause `code` (non-zero). Held: the request is
    /// the holder's (`None`). Free: the caller now holds it and runs the rebuild of the
    /// returned cause.
    pub fn close_and_ask(&self, code: u8) -> Option<u8> {
        debug_assert!(code != 0);
        let before = self.update(|w| {
            let w = w & !OPEN;
            if w & CLAIMED != 0 {
                with_asked(w, asked(w).max(code))
            } else {
                with_asked(w | CLAIMED, 0)
            }
        });
        (before & CLAIMED == 0).then(|| asked(before).max(code))
    }

    /// The holder opens, unless a rebuild was asked meanwhile: then it stays closed and
    /// held, and the request is taken (`Err(code)`) for the holder to run.
    pub fn open_held(&self) -> Result<(), u8> {
        debug_assert!(self.is_claimed());
        let before = self.update(|w| {
            if asked(w) != 0 {
                with_asked(w, 0)
            } else {
                w | OPEN
            }
        });
        match asked(before) {
            0 => Ok(()),
            code => Err(code),
        }
    }

    /// The holder takes what was asked so far (0 = nothing) and keeps the claim: a
    /// rebuild starting now answers those requests too.
    pub fn take_asked(&self) -> u8 {
        asked(self.update(|w| with_asked(w, 0)))
    }

    /// The holder lets go, unless a rebuild was asked meanwhile: then it keeps the
    /// claim, closed, and the request is taken (`Err(code)`) for it to run.
    pub fn release(&self) -> Result<(), u8> {
        debug_assert!(self.is_claimed());
        let before = self.update(|w| {
            if asked(w) != 0 {
                with_asked(w & !OPEN, 0)
            } else {
                w & !CLAIMED
            }
        });
        match asked(before) {
            0 => Ok(()),
            code => Err(code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn a_request_to_a_free_gate_closes_it_and_claims_it_for_the_caller() {
        let g = Gate::new(true);
        assert_eq!(g.close_and_ask(2), Some(2));
        assert!(!g.is_open() && g.is_claimed());
        // A second request is the holder's now.
        assert_eq!(g.close_and_ask(1), None);
        assert_eq!(g.take_asked(), 1);
        assert_eq!(g.release(), Ok(()));
        assert!(!g.is_claimed() && !g.is_open());
    }

    #[test]
    fn a_request_before_the_holders_open_keeps_it_closed_and_goes_to_the_holder() {
        let g = Gate::new(false);
        assert!(g.try_claim());
        assert!(!g.try_claim(), "one holder");
        assert_eq!(g.close_and_ask(1), None);
        assert_eq!(g.close_and_ask(3), None);
        assert_eq!(g.close_and_ask(2), None);
        assert_eq!(g.open_held(), Err(3), "the strongest cause asked");
        assert!(!g.is_open() && g.is_claimed());
        assert_eq!(g.open_held(), Ok(()));
        assert!(g.is_open());
        assert_eq!(g.release(), Ok(()));
        assert!(g.is_open() && !g.is_claimed());
    }

    #[test]
    fn a_request_after_the_holders_open_closes_at_once_and_the_release_hands_it_back() {
        let g = Gate::new(false);
        assert!(g.try_claim());
        assert_eq!(g.open_held(), Ok(()));
        assert_eq!(g.close_and_ask(4), None);
        assert!(!g.is_open(), "closed before the holder lets go");
        assert_eq!(g.release(), Err(4));
        assert!(g.is_claimed() && !g.is_open(), "kept for the rebuild asked");
        assert_eq!(g.release(), Ok(()));
    }

    #[test]
    fn close_leaves_the_claim_and_the_request_alone() {
        let g = Gate::new(true);
        assert!(g.try_claim());
        assert_eq!(g.close_and_ask(2), None);
        g.close();
        assert!(g.is_claimed() && !g.is_open());
        assert_eq!(g.take_asked(), 2);
        assert_eq!(g.take_asked(), 0);
    }

    /// Holders open and let go while other threads ask for rebuilds, on two cores,
    /// and a watcher reads the word throughout: a request waits only on a held, closed
    /// gate (never on a free one, where nobody would run it, nor on an open one); at
    /// the end nothing is held or asked.
    #[test]
    fn under_contention_no_request_is_lost_and_the_gate_never_opens_over_one() {
        const ROUNDS: usize = 20_000;
        let g = Arc::new(Gate::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        // A holder opens (running what was asked first, as a rebuild does), then lets
        // go, running what was asked meanwhile.
        fn hold(g: &Gate) {
            // Each turn runs at least one request; two askers cannot keep a holder
            // for long.
            for _ in 0..1_000_000 {
                if g.open_held().is_ok() && g.release().is_ok() {
                    return;
                }
            }
            panic!(
                "the holder never let go: {:#x}",
                g.0.load(Ordering::Acquire)
            );
        }
        let askers: Vec<_> = (0..2)
            .map(|_| {
                let g = g.clone();
                std::thread::spawn(move || {
                    for i in 0..ROUNDS {
                        if g.close_and_ask(1 + (i % 4) as u8).is_some() {
                            hold(&g);
                        }
                    }
                })
            })
            .collect();
        let claimer = {
            let (g, stop) = (g.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    if g.try_claim() {
                        hold(&g);
                    }
                }
            })
        };
        let watcher = {
            let (g, stop) = (g.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let w = g.0.load(Ordering::Acquire);
                    if asked(w) != 0 {
                        seen += 1;
                        assert!(w & CLAIMED != 0, "a request left on a free gate: {w:#x}");
                        assert!(w & OPEN == 0, "open with a request waiting: {w:#x}");
                    }
                }
                seen
            })
        };
        for t in askers {
            t.join().unwrap();
        }
        stop.store(true, Ordering::Release);
        claimer.join().unwrap();
        let seen = watcher.join().unwrap();
        let w = g.0.load(Ordering::Acquire);
        assert_eq!((w & CLAIMED, asked(w)), (0, 0), "all let go, nothing asked");
        assert!(w & OPEN != 0, "the last holder opened it");
        println!("the watcher saw a waiting request {seen} times");
    }
}
