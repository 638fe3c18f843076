//! One rebalancing move at a time per item and home shard, sized for everyone waiting.
//!
//! Near the end of a sale most home shards are empty, and every reservation that finds
//! its home empty falls back to a move (read the shards, `TAKE` on a donor with a replica
//! `WAIT`, `GIVE` home, reserve again). Without coordination, the tens of buyers whose
//! home emptied in the same millisecond each ran their own move for one unit: they read
//! the same few donors, raced each other's takes (most of which then found the donor
//! empty, each a Lua call and a `WAIT`), and the sale's last units were the slowest of
//! the opening burst (a demo crowd: 135 takes for 19 gives in the last 60 ms, with no
//! reservation answered meanwhile).
//!
//! A [`Mover`] makes those callers take turns by rounds: a caller adds the units it
//! misses to the pending demand and waits for its turn; the first in line runs one
//! round. The round **claims** the demand gathered until then as late as it can: after
//! its read of the shards, just before its first take ([`Round::claim`]), so the callers
//! that arrived during the read ride with it. When its takes brought home more than it
//! claimed (a take asks for at least `stock.rebalance_batch`), it claims again after the
//! give what still fits in those spare units ([`Round::claim_within`]); and when it read
//! the shards again after waiting for kept units, it claims what came since
//! ([`Round::claim_again`]). The callers whose
//! demand a round claimed do not move again but take its outcome (reserve again, or sold
//! out); the others run or join the next round. So a crowd of empty-home buyers costs
//! one move per round instead of one per buyer, and a buyer who arrives while a round
//! runs waits for that round alone when it can, not for it and the next.
//!
//! The units a round moved home stay **kept** for the callers it claimed for a moment
//! (`stock.rebalance_keep_ms`, [`Round::keep`]): the rounds of other homes read them as
//! not on offer ([`Mover::kept`]), so they are not taken away before those callers
//! reserve them. The keep counts down as they do ([`Mover::reserved`]); a round of
//! another home that found nothing but kept units waits for them to be bought
//! ([`Mover::released`]) or for the keep's end, whichever comes first.
//!
//! A round that finds no donor and no kept units while this process's rounds of the
//! item's other homes are between a take and a give (their units on no shard) waits
//! for the next of those moves to land ([`Landing`]), then reads again: the units it
//! waited for are on a shard then, kept for that home's callers or on offer. Ending the
//! round at once sent every caller it carried back to an empty home, each spending one
//! of its `rebalance_attempts`, while the units were on their way (its look found them
//! in transit: most of the `elsewhere` rounds of the burst, docs/load-testing.md,
//! thirty-first session). Moves of other processes are not seen here; for them the
//! round ends as before and its look counts their units in transit.
//!
//! A caller that goes away while waiting leaves its demand behind: the next round may
//! bring a few more units home than are asked for. They stay on sale there (the
//! sold-out scan sums every shard), so this only shifts where the last units sit.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{Mutex as TurnLock, MutexGuard, Notify};

/// What a finished round found, as the callers it carried read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Units moved home (or the shards hold enough): reserve again.
    Retry,
    /// Every shard was empty: the item is marked sold out.
    SoldOut,
    /// The round failed (an error, or its caller went away): reserve again, and run a
    /// round of one's own if the home is still empty.
    Failed,
}

#[derive(Debug, Default)]
struct State {
    /// Units asked for by the callers whose demand no round has claimed yet.
    demand: i64,
    /// Claims made so far (a round makes one or more). A caller remembers the count when
    /// it adds its demand: the next claim carries it.
    claims: u64,
    /// `claims` as it stood when the last round finished: every caller that joined
    /// before that count has its answer (carried by a finished round, or failed with a
    /// round dropped before its claim).
    finished: u64,
    /// The outcome of the last finished round that claimed.
    last: Option<Outcome>,
    /// What the last round that moved units home keeps for the callers it claimed
    /// ([`Round::keep`], [`Mover::reserved`]).
    kept: Option<Kept>,
}

/// Units kept for the callers one round carried.
#[derive(Debug, Clone, Copy)]
struct Kept {
    /// Units moved for those callers, less those they reserved since.
    units: i64,
    /// Until when they are kept from other homes' rounds.
    until: Instant,
    /// The round's claims (first and last): a caller's [`Ticket`] in this range was
    /// carried by it.
    claims: (u64, u64),
}

/// Which claim carries a caller: the first made after it joined (the count then, plus
/// one). Given with its [`Turn`]; shown to [`Mover::reserved`] so that only the callers
/// a keep was made for count it down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// One item's moves to one home shard.
#[derive(Debug, Default)]
pub struct Mover {
    turn: TurnLock<()>,
    state: Mutex<State>,
    /// Told when the last kept unit is reserved ([`Mover::released`]).
    released: Notify,
}

/// A caller's turn.
pub enum Turn<'a> {
    /// A round that carried this caller's demand finished while it waited.
    Done(Outcome),
    /// This caller runs the next round: claim the demand with [`Round::claim`] and report
    /// with [`Round::finish`].
    Run(Round<'a>),
}

/// The round being run; finishing it (or dropping it: [`Outcome::Failed`] for the
/// callers it claimed, or for every caller waiting when it had not claimed yet) lets
/// the next caller in.
pub struct Round<'a> {
    mover: &'a Mover,
    _turn: MutexGuard<'a, ()>,
    /// The round's first claim, once made.
    claimed: Option<u64>,
    outcome: Option<Outcome>,
}

impl Mover {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The units this home keeps at `now` for the callers its last round carried that
    /// have not reserved yet, and until when (`None` once the keep ended, or all of them
    /// reserved): the rounds of other homes do not count them as a donor's.
    pub fn kept(&self, now: Instant) -> Option<(i64, Instant)> {
        self.state()
            .kept
            .filter(|k| now < k.until)
            .map(|k| (k.units, k.until))
    }

    /// The caller holding `ticket` reserved `units` on this home: when the round that
    /// keeps units here carried it, that many fewer are kept. The last one ends the
    /// keep, and the rounds waiting on it ([`Self::released`]) look at once instead of
    /// at the keep's end. (A buyer another round carried, or one that needed no round,
    /// does not count it down: the units were kept for others.)
    pub fn reserved(&self, ticket: Ticket, units: i64) {
        let mut st = self.state();
        let Some(kept) = st.kept.as_mut() else {
            return;
        };
        let (first, last) = kept.claims;
        if !(first..=last).contains(&ticket.0) {
            return;
        }
        kept.units -= units;
        if kept.units <= 0 {
            st.kept = None;
            drop(st);
            self.released.notify_waiters();
        }
    }

    /// Returns once no unit is kept here (every one reserved: [`Self::reserved`]). The
    /// keep's end is the caller's to wait for: an ended keep is not released here.
    pub async fn released(&self) {
        loop {
            let notified = self.released.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check: a release between the two is not missed.
            notified.as_mut().enable();
            if self.state().kept.is_none() {
                return;
            }
            notified.await;
        }
    }

    /// Waits for this caller's turn, having added `missing` units to the demand; with
    /// the caller's [`Ticket`] (for [`Self::reserved`]).
    pub async fn turn(&self, missing: i64) -> (Ticket, Turn<'_>) {
        let joined = {
            let mut st = self.state();
            st.demand += missing.max(1);
            st.claims
        };
        let ticket = Ticket(joined + 1);
        let guard = self.turn.lock().await;
        let st = self.state();
        if st.finished > joined {
            return (ticket, Turn::Done(st.last.unwrap_or(Outcome::Failed)));
        }
        // No claim since this caller joined (one would have carried it, and finished
        // before this turn): its round's first claim is its ticket.
        let round = Round {
            mover: self,
            _turn: guard,
            claimed: None,
            outcome: None,
        };
        (ticket, Turn::Run(round))
    }
}

impl Round<'_> {
    /// Claims every unit asked for until now (this round's caller's own among them):
    /// the callers who asked take this round's outcome. The units to move (at least 1).
    pub fn claim(&mut self) -> i64 {
        self.claim_again().max(1)
    }

    /// A later claim of the same round (after it waited for kept units, before it reads
    /// the shards again or ends): every unit asked for since its last claim (0 when
    /// none). The callers who asked ride with it.
    pub fn claim_again(&mut self) -> i64 {
        let mut st = self.mover.state();
        st.claims += 1;
        self.claimed.get_or_insert(st.claims);
        std::mem::take(&mut st.demand)
    }

    /// After units moved home, `spare` of them beyond what the round's claims asked for:
    /// claims the demand that arrived since when it fits in them (all of it or none).
    /// The units claimed (0 when none).
    pub fn claim_within(&mut self, spare: i64) -> i64 {
        let mut st = self.mover.state();
        if self.claimed.is_none() || st.demand == 0 || st.demand > spare {
            return 0;
        }
        st.claims += 1;
        std::mem::take(&mut st.demand)
    }

    /// The round moved `units` home for the callers it claimed: they are kept from
    /// other homes' rounds until `until`, the time those callers need to reserve them.
    /// The keep replaces an earlier round's: a home runs a round again once its units
    /// are gone, so what an earlier keep still counts is most often units taken by
    /// others (a buyer who needed no round, or went away), and adding it would keep
    /// units that are not there for as long as rounds follow each other.
    pub fn keep(&mut self, units: i64, until: Instant) {
        let mut st = self.mover.state();
        let first = self.claimed.unwrap_or(st.claims);
        st.kept = Some(Kept {
            units,
            until,
            claims: (first, st.claims),
        });
    }

    /// Records what the round found, for the callers it carried.
    pub fn finish(mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }
}

impl Drop for Round<'_> {
    fn drop(&mut self) {
        let mut st = self.mover.state();
        if self.claimed.is_none() {
            // Gone before its claim (an error in its read of the shards, or its caller
            // went away): the callers waiting take that failure at once rather than each
            // meeting it in a round of its own, one after another.
            st.claims += 1;
            st.demand = 0;
        }
        st.finished = st.claims;
        st.last = Some(self.outcome.unwrap_or(Outcome::Failed));
    }
}

/// One item's moves by this process between their take and their give, told when one
/// lands ([`Landing::landed`]).
#[derive(Debug, Default)]
pub struct Landing {
    moving: AtomicU32,
    landed: Notify,
}

/// One move between its take and the point its units are on a shard: dropped once its
/// round has kept them for its callers ([`Round::keep`]) when the move brought all the
/// round needed, at once after the give when the round is still short (nothing kept),
/// or when the move ends without a give.
#[derive(Debug)]
pub struct InFlight(Arc<Landing>);

impl Landing {
    /// A move took units: they are in transit until the guard is dropped.
    pub fn took(self: &Arc<Self>) -> InFlight {
        self.moving.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }

    /// Whether a move of this process is between its take and its give.
    pub fn moving(&self) -> bool {
        self.moving.load(Ordering::SeqCst) > 0
    }

    /// Returns once a move in flight lands (at once when none is in flight).
    pub async fn landed(&self) {
        let notified = self.landed.notified();
        let mut notified = std::pin::pin!(notified);
        // Registered before the check: a landing between the two is not missed.
        notified.as_mut().enable();
        if !self.moving() {
            return;
        }
        notified.await;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.moving.fetch_sub(1, Ordering::SeqCst);
        self.0.landed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn run(turn: Turn<'_>) -> Round<'_> {
        match turn {
            Turn::Run(round) => round,
            Turn::Done(o) => panic!("carried ({o:?}) instead of running a round"),
        }
    }

    #[test]
    fn units_a_round_moved_home_are_kept_until_the_keep_ends() {
        let m = Mover::default();
        let t0 = Instant::now();
        assert_eq!(m.kept(t0), None);
        let until = t0 + Duration::from_millis(50);
        let mut round = run(m.turn(2).now_or_never().expect("free turn").1);
        assert_eq!(round.claim(), 2);
        round.keep(2, until);
        round.finish(Outcome::Retry);
        assert_eq!(m.kept(t0), Some((2, until)));
        assert_eq!(m.kept(until - Duration::from_millis(1)), Some((2, until)));
        assert_eq!(m.kept(until), None);
        // The next round's keep replaces it, ended or not.
        let later = until + Duration::from_millis(10);
        let mut round = run(m.turn(1).now_or_never().expect("free turn").1);
        round.claim();
        round.keep(1, later);
        drop(round);
        assert_eq!(m.kept(until), Some((1, later)));
        let mut round = run(m.turn(3).now_or_never().expect("free turn").1);
        round.claim();
        round.keep(3, later);
        drop(round);
        assert_eq!(m.kept(t0), Some((3, later)));
    }

    #[test]
    fn the_keep_counts_down_as_the_carried_callers_reserve_and_the_last_releases_it() {
        let m = Mover::default();
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs(60);
        // Nothing kept: a reservation changes nothing, and nothing is waited for.
        m.reserved(Ticket(1), 1);
        assert_eq!(m.kept(t0), None);
        assert!(m.released().now_or_never().is_some());
        let (ticket, turn) = m.turn(3).now_or_never().expect("free turn");
        let mut round = run(turn);
        round.claim();
        round.keep(3, until);
        round.finish(Outcome::Retry);
        let mut waiting = Box::pin(m.released());
        assert!(waiting.as_mut().now_or_never().is_none(), "3 units kept");
        // A buyer the round did not carry (a later claim's) takes nothing from the keep.
        m.reserved(Ticket(ticket.0 + 1), 1);
        assert_eq!(m.kept(t0), Some((3, until)));
        m.reserved(ticket, 2);
        assert_eq!(m.kept(t0), Some((1, until)));
        assert!(waiting.as_mut().now_or_never().is_none(), "1 unit kept");
        // A multi-unit buyer may take more than is left kept: the keep ends all the same.
        m.reserved(ticket, 2);
        assert_eq!(m.kept(t0), None);
        assert!(
            waiting.now_or_never().is_some(),
            "released once all are reserved"
        );
        assert!(m.released().now_or_never().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_keep_is_counted_down_by_the_callers_its_claims_carried_only() {
        let m = Arc::new(Mover::default());
        let until = Instant::now() + Duration::from_secs(60);
        let (runner, turn) = m.turn(1).await;
        let mut round = run(turn);
        // One caller comes before the claim, one after it (carried by the claim within
        // the spare units), one after both claims (the next round's).
        let ticketed = |after: u64| ticketed_after(&m, Duration::from_millis(after));
        let early = ticketed(5);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(round.claim(), 2);
        let within = ticketed(5);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(round.claim_within(1), 1);
        let late = ticketed(5);
        tokio::time::sleep(Duration::from_millis(10)).await;
        round.keep(3, until);
        round.finish(Outcome::Retry);
        let (early, within) = (early.await.unwrap(), within.await.unwrap());
        assert_eq!(early.1, Some(Outcome::Retry));
        assert_eq!(within.1, Some(Outcome::Retry));
        let (late, ran) = late.await.unwrap();
        assert_eq!(ran, None, "the late caller ran a round of its own");
        m.reserved(late, 1);
        assert_eq!(
            m.kept(Instant::now()),
            Some((3, until)),
            "not this keep's caller"
        );
        for t in [runner, early.0, within.0] {
            m.reserved(t, 1);
        }
        assert_eq!(m.kept(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_that_reads_again_carries_the_callers_who_came_meanwhile() {
        let m = Arc::new(Mover::default());
        let until = Instant::now() + Duration::from_secs(60);
        let (runner, turn) = m.turn(1).await;
        let mut round = run(turn);
        assert_eq!(round.claim(), 1);
        // Its first read moved nothing; two callers come while it waits to read again.
        let waiting: Vec<_> = (0..2).map(|_| ticketed_after(&m, Duration::ZERO)).collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(round.claim_again(), 2, "the demand that came since");
        assert_eq!(round.claim_again(), 0, "nothing came since");
        round.keep(3, until);
        round.finish(Outcome::Retry);
        let mut tickets = vec![runner];
        for w in waiting {
            let (ticket, outcome) = w.await.unwrap();
            assert_eq!(outcome, Some(Outcome::Retry), "carried by the second claim");
            tickets.push(ticket);
        }
        // The keep spans every claim of the round: each carried caller counts it down.
        for (n, t) in tickets.into_iter().enumerate() {
            assert_eq!(m.kept(Instant::now()), Some((3 - n as i64, until)));
            m.reserved(t, 1);
        }
        assert_eq!(m.kept(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_caller_runs_a_round_for_its_own_demand() {
        let m = Mover::default();
        let mut round = run(m.turn(3).await.1);
        assert_eq!(round.claim(), 3);
        round.finish(Outcome::Retry);
        // The next caller is not carried by a round that finished before it came.
        let mut round = run(m.turn(1).await.1);
        assert_eq!(round.claim(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn callers_waiting_behind_a_round_are_carried_by_one_round() {
        let m = Arc::new(Mover::default());
        let rounds = Arc::new(AtomicU32::new(0));
        let moved = Arc::new(AtomicU32::new(0));
        // The first caller claims and holds its round while twenty more arrive.
        let mut first = run(m.turn(1).await.1);
        assert_eq!(first.claim(), 1);
        let mut callers = Vec::new();
        for _ in 0..20 {
            let (m, rounds, moved) = (m.clone(), rounds.clone(), moved.clone());
            callers.push(tokio::spawn(async move {
                match m.turn(1).await.1 {
                    Turn::Run(mut round) => {
                        rounds.fetch_add(1, Ordering::SeqCst);
                        moved.fetch_add(round.claim() as u32, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        round.finish(Outcome::Retry);
                        Outcome::Retry
                    }
                    Turn::Done(o) => o,
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        first.finish(Outcome::Retry);
        for c in callers {
            assert_eq!(c.await.unwrap(), Outcome::Retry);
        }
        // One round after the first carried all twenty, sized for all of them.
        assert_eq!(rounds.load(Ordering::SeqCst), 1);
        assert_eq!(moved.load(Ordering::SeqCst), 20);
    }

    /// A caller that comes `after`: its ticket, and the outcome of the round that carried
    /// it (`None`: it ran a round of its own, dropped at once).
    fn ticketed_after(
        m: &Arc<Mover>,
        after: Duration,
    ) -> tokio::task::JoinHandle<(Ticket, Option<Outcome>)> {
        let m = m.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let (ticket, turn) = m.turn(1).await;
            match turn {
                Turn::Done(o) => (ticket, Some(o)),
                Turn::Run(_) => (ticket, None),
            }
        })
    }

    /// A caller that comes `after` and must be carried by a round (not run one): its
    /// answer.
    fn carried_after(m: &Arc<Mover>, after: Duration) -> tokio::task::JoinHandle<Outcome> {
        let m = m.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            match m.turn(1).await.1 {
                Turn::Done(o) => o,
                Turn::Run(_) => panic!("a round that claimed its demand carries this caller"),
            }
        })
    }

    /// A caller that comes `after` and must run a round of its own: the units it claims.
    fn runs_after(m: &Arc<Mover>, after: Duration) -> tokio::task::JoinHandle<i64> {
        let m = m.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let mut round = run(m.turn(1).await.1);
            let want = round.claim();
            round.finish(Outcome::Retry);
            want
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_carries_the_callers_that_came_before_its_claim_not_after() {
        let m = Arc::new(Mover::default());
        let mut round = run(m.turn(1).await.1);
        // Two callers come while the round reads the shards (before it claims).
        let early = [
            carried_after(&m, Duration::from_millis(5)),
            carried_after(&m, Duration::from_millis(10)),
        ];
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(round.claim(), 3, "the round moves for all three");
        // One comes after the claim: it is not carried, and runs the next round.
        let late = runs_after(&m, Duration::from_millis(5));
        tokio::time::sleep(Duration::from_millis(30)).await;
        round.finish(Outcome::Retry);
        for c in early {
            assert_eq!(c.await.unwrap(), Outcome::Retry);
        }
        assert_eq!(late.await.unwrap(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn spare_units_carry_the_late_callers_only_when_all_of_them_fit() {
        let m = Arc::new(Mover::default());
        let mut round = run(m.turn(1).await.1);
        assert_eq!(round.claim_within(10), 0, "nothing to add before the claim");
        assert_eq!(round.claim(), 1);
        let late = [
            carried_after(&m, Duration::from_millis(5)),
            carried_after(&m, Duration::from_millis(10)),
        ];
        tokio::time::sleep(Duration::from_millis(30)).await;
        // The take brought 3 units home for a demand of 1: 2 spare, the two late fit.
        assert_eq!(round.claim_within(2), 2);
        assert_eq!(round.claim_within(2), 0, "claimed once");
        round.finish(Outcome::Retry);
        for c in late {
            assert_eq!(c.await.unwrap(), Outcome::Retry);
        }

        // Three late callers for 2 spare units: none is carried, all join the next round.
        let mut round = run(m.turn(1).await.1);
        assert_eq!(round.claim(), 1);
        let late: Vec<_> = (0..3)
            .map(|i| {
                let m = m.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(5 + i)).await;
                    match m.turn(1).await.1 {
                        Turn::Run(mut round) => {
                            let want = round.claim();
                            round.finish(Outcome::SoldOut);
                            Some(want)
                        }
                        Turn::Done(o) => {
                            assert_eq!(o, Outcome::SoldOut, "carried by the next round");
                            None
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(round.claim_within(2), 0);
        round.finish(Outcome::Retry);
        let mut runs = Vec::new();
        for c in late {
            runs.extend(c.await.unwrap());
        }
        assert_eq!(
            runs,
            vec![3],
            "one of them ran the next round, for all three"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_carried_callers_read_the_round_outcome_and_a_dropped_round_is_failed() {
        let m = Arc::new(Mover::default());
        let mut round = run(m.turn(1).await.1);
        round.claim();
        let waiter = {
            let m = m.clone();
            tokio::spawn(async move {
                let mut round = run(m.turn(1).await.1);
                round.claim();
                round.finish(Outcome::SoldOut);
            })
        };
        let carried = carried_after(&m, Duration::from_millis(10));
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(round); // the first round's caller went away after its claim
        waiter.await.unwrap();
        assert_eq!(carried.await.unwrap(), Outcome::SoldOut);
        assert_eq!(m.state().last, Some(Outcome::SoldOut));
        // A round dropped after its claim reads as failed to whoever it carried.
        let mut round = run(m.turn(1).await.1);
        round.claim();
        let runner = {
            let m = m.clone();
            tokio::spawn(async move {
                let mut round = run(m.turn(1).await.1);
                round.claim();
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(round);
            })
        };
        let carried = carried_after(&m, Duration::from_millis(10));
        tokio::time::sleep(Duration::from_millis(30)).await;
        round.finish(Outcome::Retry);
        runner.await.unwrap();
        assert_eq!(carried.await.unwrap(), Outcome::Failed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_dropped_before_its_claim_fails_the_callers_waiting() {
        let m = Arc::new(Mover::default());
        let round = run(m.turn(1).await.1);
        // Waits behind the round, which goes away (an error in its read) unclaimed.
        let waiting = carried_after(&m, Duration::from_millis(5));
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(round);
        assert_eq!(waiting.await.unwrap(), Outcome::Failed);
        // Their demand went with it: the next round is for its own caller alone.
        let mut round = run(m.turn(1).await.1);
        assert_eq!(round.claim(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_landing_is_told_when_a_move_in_flight_lands() {
        let landing = Arc::new(Landing::default());
        // Nothing in flight: at once.
        landing.landed().now_or_never().expect("no move in flight");
        let first = landing.took();
        let second = landing.took();
        assert!(landing.moving());
        let waiting = {
            let landing = Arc::clone(&landing);
            tokio::spawn(async move { landing.landed().await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished(), "no move has landed yet");
        drop(first);
        tokio::time::timeout(Duration::from_millis(1), waiting)
            .await
            .expect("told when the first of two lands")
            .unwrap();
        assert!(landing.moving(), "the second is still in flight");
        drop(second);
        assert!(!landing.moving());
        landing.landed().now_or_never().expect("none in flight");
    }
}
