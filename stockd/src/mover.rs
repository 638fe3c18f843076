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
//! round for the whole demand gathered until then; the callers whose demand that round
//! carried do not move again but take its outcome (reserve again, or sold out). Callers
//! arriving while a round runs join the next one. So a crowd of empty-home buyers costs
//! one move per round instead of one per buyer.
//!
//! A caller that goes away while waiting leaves its demand behind: the next round may
//! bring a few more units home than are asked for. They stay on sale there (the
//! sold-out scan sums every shard), so this only shifts where the last units sit.

use std::sync::Mutex;

use tokio::sync::{Mutex as TurnLock, MutexGuard};

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
    /// Units asked for by the callers waiting for the next round.
    demand: i64,
    /// Rounds started and finished (a round runs under the turn lock, so at most one
    /// is unfinished).
    started: u64,
    finished: u64,
    /// The outcome of the last finished round.
    last: Option<Outcome>,
}

/// One item's moves to one home shard.
#[derive(Debug, Default)]
pub struct Mover {
    turn: TurnLock<()>,
    state: Mutex<State>,
}

/// A caller's turn.
pub enum Turn<'a> {
    /// A round that carried this caller's demand finished while it waited.
    Done(Outcome),
    /// This caller runs the round: move `want` units (its own and the waiters' demand)
    /// and report with [`Round::finish`].
    Run { want: i64, round: Round<'a> },
}

/// The round being run; finishing it (or dropping it: [`Outcome::Failed`]) lets the
/// next caller in.
pub struct Round<'a> {
    mover: &'a Mover,
    _turn: MutexGuard<'a, ()>,
    outcome: Option<Outcome>,
}

impl Mover {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for this caller's turn, having added `missing` units to the demand.
    pub async fn turn(&self, missing: i64) -> Turn<'_> {
        let joined = {
            let mut st = self.state();
            st.demand += missing.max(1);
            // The next round to start carries this demand.
            st.started
        };
        let guard = self.turn.lock().await;
        let mut st = self.state();
        if st.finished > joined {
            return Turn::Done(st.last.unwrap_or(Outcome::Failed));
        }
        let want = std::mem::take(&mut st.demand).max(missing.max(1));
        st.started += 1;
        Turn::Run {
            want,
            round: Round {
                mover: self,
                _turn: guard,
                outcome: None,
            },
        }
    }
}

impl Round<'_> {
    /// Records what the round found, for the callers it carried.
    pub fn finish(mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }
}

impl Drop for Round<'_> {
    fn drop(&mut self) {
        let mut st = self.mover.state();
        st.finished += 1;
        st.last = Some(self.outcome.unwrap_or(Outcome::Failed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_lone_caller_runs_a_round_for_its_own_demand() {
        let m = Mover::default();
        match m.turn(3).await {
            Turn::Run { want, round } => {
                assert_eq!(want, 3);
                round.finish(Outcome::Retry);
            }
            Turn::Done(_) => panic!("nobody ran a round for it"),
        }
        // The next caller is not carried by a round that finished before it came.
        assert!(matches!(m.turn(1).await, Turn::Run { want: 1, .. }));
    }

    #[tokio::test]
    async fn callers_waiting_behind_a_round_are_carried_by_one_round() {
        let m = Arc::new(Mover::default());
        let rounds = Arc::new(AtomicU32::new(0));
        let moved = Arc::new(AtomicU32::new(0));
        // The first caller holds its round while twenty more arrive.
        let Turn::Run { round: first, .. } = m.turn(1).await else {
            panic!("the first caller runs")
        };
        let mut callers = Vec::new();
        for _ in 0..20 {
            let (m, rounds, moved) = (m.clone(), rounds.clone(), moved.clone());
            callers.push(tokio::spawn(async move {
                match m.turn(1).await {
                    Turn::Run { want, round } => {
                        rounds.fetch_add(1, Ordering::SeqCst);
                        moved.fetch_add(want as u32, Ordering::SeqCst);
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

    /// A caller that comes `after` and must be carried by a round (not run one): its
    /// answer.
    fn carried_after(m: &Arc<Mover>, after: Duration) -> tokio::task::JoinHandle<Outcome> {
        let m = m.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            match m.turn(1).await {
                Turn::Done(o) => o,
                Turn::Run { .. } => panic!("a round waiting to run carries this caller"),
            }
        })
    }

    #[tokio::test]
    async fn the_carried_callers_read_the_round_outcome_and_a_dropped_round_is_failed() {
        let m = Arc::new(Mover::default());
        let Turn::Run { round, .. } = m.turn(1).await else {
            panic!("the first caller runs")
        };
        let waiter = {
            let m = m.clone();
            tokio::spawn(async move {
                let Turn::Run { round, .. } = m.turn(1).await else {
                    panic!("the second caller runs the next round")
                };
                round.finish(Outcome::SoldOut);
            })
        };
        let carried = carried_after(&m, Duration::from_millis(10));
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(round); // the first round's caller went away
        waiter.await.unwrap();
        assert_eq!(carried.await.unwrap(), Outcome::SoldOut);
        assert_eq!(m.state().last, Some(Outcome::SoldOut));
        // A round dropped unfinished reads as failed to whoever it carried.
        let Turn::Run { round, .. } = m.turn(1).await else {
            panic!("runs")
        };
        let runner = {
            let m = m.clone();
            tokio::spawn(async move {
                let Turn::Run { round, .. } = m.turn(1).await else {
                    panic!("runs the next round")
                };
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
}
