//! One item's looks at every shard, shared: a caller who asks for a look gets the
//! result of one that began after it asked, and at most one runs at a time per item.
//!
//! Why: near the end of a sale every empty home's rounds, the check after each shard
//! that emptied and the buyers out of attempts each looked at every shard on their own
//! (a `GET` and one `look` call per shard each time). In the demo's burst the `look`
//! calls outnumbered the reserve calls 1.8 to 3.4 times, all in the sell-out, where
//! the last buyers' reservations queue behind them on the same connections and masters
//! (docs/load-testing.md, thirty-sixth session). Those callers ask within milliseconds
//! of each other for the same snapshot.
//!
//! What a shared look keeps: a caller's look is one that began after it asked (the
//! driver takes the callers waiting, then begins the look for them; whoever asks while
//! it runs waits for the next), so it sees every write made before the ask, exactly as
//! a look of its own begun at that moment would. What each caller does with the look
//! (the sold-out mark, guarded by the change count read at the look's start; a retry)
//! is unchanged.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::error::Error;
use crate::transit::Look;

/// A look as every caller who shared it gets it (an error as
/// [`Error::replicate`] copies it).
pub(crate) type SharedLook = Result<Look, Arc<Error>>;

/// Runs of one computation, each shared by every caller who asked before it began.
#[derive(Debug)]
pub struct Coalesce<T> {
    st: Mutex<State<T>>,
}

#[derive(Debug)]
struct State<T> {
    /// A driver task runs (or is about to take the waiting callers).
    driving: bool,
    /// The callers waiting for the next run to begin.
    waiting: Vec<oneshot::Sender<T>>,
}

impl<T> Default for Coalesce<T> {
    fn default() -> Self {
        Self {
            st: Mutex::new(State {
                driving: false,
                waiting: Vec::new(),
            }),
        }
    }
}

impl<T: Clone + Send + 'static> Coalesce<T> {
    /// The result of a run of `run` that began after this call: the one under way is
    /// left to its own callers. `run` is used when this caller starts the driver (no
    /// run under way or waiting to begin); the callers' `run`s must be the same
    /// computation. `None` when the driver went away without an answer (it panicked,
    /// or the runtime is shutting down).
    pub async fn ask<F, Fut>(self: &Arc<Self>, run: F) -> Option<T>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut st = self.lock();
            st.waiting.push(tx);
            !std::mem::replace(&mut st.driving, true)
        };
        if start {
            // A task of its own: a caller that goes away (a client deadline) does not
            // take the run from the others waiting for it.
            let me = Arc::clone(self);
            tokio::spawn(async move { me.drive(run).await });
        }
        rx.await.ok()
    }

    /// Takes the callers waiting, runs for them, answers them; again while callers came
    /// meanwhile.
    async fn drive<F, Fut>(self: Arc<Self>, run: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = T>,
    {
        // When the task ends any other way than with no caller left (a panic in `run`,
        // the runtime dropping it), the next caller starts a driver again, and callers
        // left waiting hear `None` instead of waiting forever.
        let mut stop = Stop {
            coalesce: &self,
            armed: true,
        };
        loop {
            let waiting = {
                let mut st = self.lock();
                if st.waiting.is_empty() {
                    st.driving = false;
                    // Disarmed under the lock: a caller who comes next starts a driver
                    // of its own, which this one's end must not stop.
                    stop.armed = false;
                    return;
                }
                std::mem::take(&mut st.waiting)
            };
            let out = run().await;
            for tx in waiting {
                // A caller that went away has dropped its receiver.
                let _ = tx.send(out.clone());
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Ends a driver that did not end with no caller left: no driver runs any more, and
/// the callers it would have answered are dropped (they hear `None`).
struct Stop<'a, T> {
    coalesce: &'a Coalesce<T>,
    armed: bool,
}

impl<T> Drop for Stop<'_, T> {
    fn drop(&mut self) {
        if self.armed {
            let mut st = self.coalesce.st.lock().unwrap_or_else(|p| p.into_inner());
            st.driving = false;
            st.waiting.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// A run that reads the write counter when it begins, then takes a while.
    fn reader(
        writes: &Arc<AtomicU64>,
        runs: &Arc<AtomicU64>,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = u64> + Send>> + Send + 'static {
        let (writes, runs) = (Arc::clone(writes), Arc::clone(runs));
        move || {
            let (writes, runs) = (Arc::clone(&writes), Arc::clone(&runs));
            Box::pin(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let seen = writes.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                seen
            })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_caller_gets_a_run_begun_after_its_own_write_and_runs_are_shared() {
        let c = Arc::new(Coalesce::<u64>::default());
        let (writes, runs) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let callers: Vec<_> = (0..200)
            .map(|i| {
                let (c, writes, run) =
                    (Arc::clone(&c), Arc::clone(&writes), reader(&writes, &runs));
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_micros(100 * (i % 50))).await;
                    // A write, then a look: the look must see it.
                    let mine = writes.fetch_add(1, Ordering::SeqCst) + 1;
                    let seen = c.ask(run).await.expect("answered");
                    (mine, seen)
                })
            })
            .collect();
        for h in callers {
            let (mine, seen) = h.await.unwrap();
            assert!(
                seen >= mine,
                "a caller whose write was {mine} got a run that saw {seen}"
            );
        }
        let runs = runs.load(Ordering::SeqCst);
        assert!((1..200).contains(&runs), "{runs} runs for 200 callers");
    }

    #[tokio::test]
    async fn a_caller_that_asks_while_a_run_is_under_way_waits_for_the_next() {
        let c = Arc::new(Coalesce::<u64>::default());
        let (writes, runs) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let first = tokio::spawn({
            let (c, run) = (Arc::clone(&c), reader(&writes, &runs));
            async move { c.ask(run).await }
        });
        // The first run has begun (it read 0) and sleeps.
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        writes.store(7, Ordering::SeqCst);
        let second = c.ask(reader(&writes, &runs)).await;
        assert_eq!(first.await.unwrap(), Some(0));
        assert_eq!(
            second,
            Some(7),
            "the second caller got the run begun before it asked"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_leaves_the_run_to_the_others() {
        let c = Arc::new(Coalesce::<u64>::default());
        let (writes, runs) = (Arc::new(AtomicU64::new(3)), Arc::new(AtomicU64::new(0)));
        let gone = tokio::spawn({
            let (c, run) = (Arc::clone(&c), reader(&writes, &runs));
            async move { c.ask(run).await }
        });
        tokio::task::yield_now().await;
        let stays = tokio::spawn({
            let (c, run) = (Arc::clone(&c), reader(&writes, &runs));
            async move { c.ask(run).await }
        });
        gone.abort();
        assert_eq!(stays.await.unwrap(), Some(3));
        // And the next caller starts a run again.
        writes.store(4, Ordering::SeqCst);
        assert_eq!(c.ask(reader(&writes, &runs)).await, Some(4));
    }

    #[tokio::test]
    async fn a_run_that_panics_answers_none_and_the_next_caller_runs_again() {
        let c = Arc::new(Coalesce::<u64>::default());
        let boom = || async {
            if true {
                panic!("the run failed");
            }
            0
        };
        assert_eq!(c.ask(boom).await, None);
        assert_eq!(c.ask(|| async { 5 }).await, Some(5));
    }
}
