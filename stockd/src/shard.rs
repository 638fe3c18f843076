//! The state stockd keeps per Redis shard of an activity, behind [`ShardState`]:
//! - the high-water mark ([`HighWater`]): the highest reservation sequence this process
//!   saw handed out, which the reserve script and the fence check compare against to
//!   catch a Redis that lost writes;
//! - the group-commit queue ([`ShardQueue`]): reservations waiting for the shard's
//!   next reserve call (driven by `batch.rs`), each with the channel its answer
//!   ([`Script`]) goes back on.
//!
//! It imports nothing of the catalog or the batch driver, so both can use it.

use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::domain::{RequestId, UserId};
use crate::error::Result;

/// The highest reservation sequence this process has seen handed out in one shard,
/// with the epoch (fence value) it was handed out under. Redis never hands out a lower
/// one under the same epoch unless it lost writes; the reserve script and the fence
/// check compare against it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HighWater {
    pub epoch: String,
    pub seq: u64,
    /// The highest of those answered RESERVED (a replica held it, or no replica was
    /// asked for): the others were answered UNAVAILABLE, promised to nobody.
    pub promised: u64,
    /// Redis was found behind this mark and it was reported. The mark stays until a
    /// rebuild opens a newer epoch, so every call meanwhile is refused BEHIND too:
    /// clearing it would let the next call reserve on the rewound shard and hand a
    /// lost reservation's id out again.
    pub reported: bool,
}

/// A sequence gap: reservations handed out and gone from Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// Every lost sequence.
    pub lost: u64,
    /// Those answered RESERVED.
    pub promised: u64,
}

/// One shard's state: its high-water mark and its reservation queue.
#[derive(Debug, Default)]
pub struct ShardState {
    high_water: Mutex<HighWater>,
    queue: ShardQueue,
}

impl ShardState {
    /// The high-water mark (default when none seen yet).
    pub fn high_water(&self) -> HighWater {
        self.lock_high_water().clone()
    }

    /// Redis showed `found` as the shard's sequence, read after `seen` was taken from
    /// this mark. When the mark still holds `seen`'s epoch and `seen` is above `found`,
    /// Redis lost writes: returns the size of the gap the first time only (the mark
    /// stays, so later calls are refused too; see [`HighWater::reported`]). (Comparing with a mark taken *before* the read matters: the mark
    /// moves on with every reservation, and one taken after the read would be ahead of
    /// a healthy Redis.)
    pub fn take_behind(&self, seen: &HighWater, found: u64) -> Option<Gap> {
        let mut hw = self.lock_high_water();
        if hw.epoch == seen.epoch && seen.seq > found && !hw.reported {
            let gap = Gap {
                lost: hw.seq.max(seen.seq) - found,
                promised: hw.promised.max(seen.promised).saturating_sub(found),
            };
            hw.reported = true;
            return Some(gap);
        }
        None
    }

    /// Records that Redis handed out `seq` under `epoch`, answered RESERVED when
    /// `promised`. A newer epoch (a recompute opened the shard again) replaces the mark.
    pub fn saw(&self, epoch: &str, seq: u64, promised: bool) {
        let mut hw = self.lock_high_water();
        if hw.epoch != epoch {
            if !epoch_newer(epoch, &hw.epoch) {
                return;
            }
            *hw = HighWater {
                epoch: epoch.to_string(),
                ..HighWater::default()
            };
        }
        hw.seq = hw.seq.max(seq);
        if promised {
            hw.promised = hw.promised.max(seq);
        }
    }

    /// The reservation queue.
    pub fn queue(&self) -> &ShardQueue {
        &self.queue
    }

    fn lock_high_water(&self) -> std::sync::MutexGuard<'_, HighWater> {
        self.high_water.lock().expect("high-water lock")
    }
}

/// Epochs are base-36 millisecond times without leading zeros: longer is newer, and
/// equal lengths compare as text.
pub(crate) fn epoch_newer(a: &str, b: &str) -> bool {
    (a.len(), a) > (b.len(), b)
}

/// One answer of the reserve script for one reservation: reservation id, units left
/// in the shard, units the reservation holds.
#[derive(Debug)]
pub(crate) enum Script {
    Reserved(String, i64, u32),
    Retry(String, i64, u32),
    Duplicate(String, i64, u32),
    SoldOut,
    /// The shard holds this many units, fewer than asked for (but some).
    Short(i64),
    Lost,
    /// Redis lost writes: the shard's sequence (second) is below the high-water mark
    /// (first) the call was made with, under the same epoch.
    Behind(HighWater, u64),
}

/// A reservation waiting for its shard's next call.
pub(crate) struct Pending {
    pub item: u64,
    pub user: UserId,
    pub request: RequestId,
    /// Units asked for (>= 1).
    pub units: u32,
    /// The buyer's `traceparent`, written into the stream entry.
    pub trace: Option<std::sync::Arc<str>>,
    pub answer: oneshot::Sender<Result<Script>>,
}

/// The queue of one shard.
#[derive(Default)]
pub struct ShardQueue {
    state: Mutex<QueueState>,
}

#[derive(Default)]
pub(crate) struct QueueState {
    /// In the order the next calls decide them: those that waited for a rebalancing
    /// round first (the first `ahead`), then the others, each in arrival order.
    waiting: Vec<Pending>,
    ahead: usize,
    /// A driver task is running this shard's calls.
    pub running: bool,
}

impl QueueState {
    /// Queues `p`; `ahead` when its buyer found its home empty and waited for a
    /// rebalancing round: it goes before every buyer that has not, so the units the
    /// round moved home for it are not taken by buyers who arrived after it (they
    /// arrived later; and each lost race costs its buyer another round).
    pub fn push(&mut self, p: Pending, ahead: bool) {
        if ahead {
            self.waiting.insert(self.ahead, p);
            self.ahead += 1;
        } else {
            self.waiting.push(p);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The next call's reservations: at most `max`, in order.
    pub fn next_batch(&mut self, max: usize) -> Vec<Pending> {
        let batch = if self.waiting.len() <= max {
            std::mem::take(&mut self.waiting)
        } else {
            self.waiting.drain(..max).collect()
        };
        self.ahead = self.ahead.saturating_sub(batch.len());
        batch
    }
}

impl std::fmt::Debug for ShardQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("ShardQueue")
            .field("waiting", &st.waiting.len())
            .field("ahead", &st.ahead)
            .field("running", &st.running)
            .finish()
    }
}

impl ShardQueue {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Resets `running` if the driver unwinds, so a bug cannot wedge a shard: the
/// reservations it held are answered UNAVAILABLE (their senders drop).
pub(crate) struct Unwind<'a>(pub &'a ShardQueue);

impl Drop for Unwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().running = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_counts_as_promised_only_what_was_answered_reserved() {
        let s = ShardState::default();
        for seq in 1..=10 {
            s.saw("e1", seq, true);
        }
        // 11..=14 written but no replica acknowledged them: answered UNAVAILABLE.
        for seq in 11..=14 {
            s.saw("e1", seq, false);
        }
        let seen = s.high_water();
        assert_eq!((seen.seq, seen.promised), (14, 10));
        // A failover kept 1..=8: 9 and 10 were promised, 11..=14 were not.
        let gap = s.take_behind(&seen, 8).unwrap();
        assert_eq!(
            gap,
            Gap {
                lost: 6,
                promised: 2
            }
        );
        // Reported once.
        assert_eq!(s.take_behind(&seen, 8), None);
    }

    fn pending(user: &str) -> Pending {
        Pending {
            item: 1,
            user: UserId::parse(user).unwrap(),
            request: RequestId::parse("r").unwrap(),
            units: 1,
            trace: None,
            answer: oneshot::channel().0,
        }
    }

    fn users(batch: &[Pending]) -> Vec<&str> {
        batch.iter().map(|p| p.user.as_str()).collect()
    }

    #[test]
    fn buyers_back_from_a_rebalancing_round_go_before_newer_ones_in_arrival_order() {
        let mut q = QueueState::default();
        q.push(pending("new1"), false);
        q.push(pending("back1"), true);
        q.push(pending("new2"), false);
        q.push(pending("back2"), true);
        q.push(pending("new3"), false);
        // A call of 3 takes both that came back and the oldest newcomer.
        assert_eq!(users(&q.next_batch(3)), ["back1", "back2", "new1"]);
        // One more comes back meanwhile: it goes first again.
        q.push(pending("back3"), true);
        q.push(pending("new4"), false);
        assert_eq!(users(&q.next_batch(1)), ["back3"]);
        q.push(pending("back4"), true);
        assert_eq!(users(&q.next_batch(10)), ["back4", "new2", "new3", "new4"]);
        assert!(q.is_empty());
        // A drained queue counts none ahead: the next comer back goes first, not second.
        q.push(pending("new5"), false);
        q.push(pending("back5"), true);
        assert_eq!(users(&q.next_batch(10)), ["back5", "new5"]);
    }

    #[test]
    fn a_newer_epoch_replaces_the_mark_and_an_older_one_is_ignored() {
        let s = ShardState::default();
        s.saw("abc", 5, true);
        s.saw("abd", 2, false);
        assert_eq!(
            s.high_water(),
            HighWater {
                epoch: "abd".into(),
                seq: 2,
                promised: 0,
                reported: false,
            }
        );
        s.saw("abc", 9, true);
        assert_eq!(s.high_water().seq, 2);
    }
}
