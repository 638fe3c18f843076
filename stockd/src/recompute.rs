//! Recompute: rebuild an activity's shards from MySQL after Redis lost state (a
//! restart without data, a flush, a failover that lost writes, a fence key gone).
//!
//! Steps, per activity (every shard of every item together, since the shards share
//! one total), under the activity's rebuild lease ([`crate::lease`]: one stockd of a
//! fleet at a time, with a fencing token):
//! 1. close every shard (`REBUILD close`: its fence goes, so no reserve script can take
//!    a unit any more: they answer LOST; stockd answers UNAVAILABLE);
//! 2. read every entry of every shard stream (reservations made before the close);
//! 3. in one MySQL snapshot: each item's `stock`, its active (PENDING/PAID) orders,
//!    and which stream entries already are orders; the others are in flight;
//! 4. count what Redis lost: under the epoch each shard ran under, every sequence from
//!    1 to the highest known (this process's high-water mark, Redis, MySQL, the stream)
//!    was handed out; those neither in the stream nor in MySQL (orders, dead letters)
//!    are lost reservations, logged by id and counted by path;
//! 5. per shard: buyers = active orders + in-flight reservations of users whose
//!    record lives there, each holding its reservation's k units; stock = split of
//!    (MySQL stock − units in flight);
//! 6. `REBUILD open` under the token and a new epoch (sequence back to 0), which opens
//!    the shard again; then the sold-out flags, the meta hash and the activity set.
//!
//! A stockd that waited for the lease while a peer rebuilt finds the shards open under
//! a newer epoch and does not rebuild them again.
//!
//! Lost state is found four ways: the reserve script answers LOST (a fence or a stock
//! key is gone) or BEHIND (the shard's reservation sequence is below one this process
//! already saw handed out under the same fence epoch: Redis lost writes but kept the
//! fence, as after a failover to a lagging replica), the fence check ([`crate::fence`])
//! of shards' fences and sequences finds either even when nobody is buying, and at
//! start-up MySQL holding reservations past a shard's sequence. A failover or restart that lost
//! nothing needs no rebuild and gets none: in particular a stockd that starts while its
//! peers serve leaves their open shards alone.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seckill_lua::calls::RebuildCall;
use seckill_lua::clock::now_ms;
use seckill_lua::ids::{epoch_from_millis, epoch_millis};
use seckill_lua::messages::{buyer_record, entry};
use seckill_lua::{home_shard, keys, split_stock, ReservationId};

use crate::app::App;
use crate::catalog::ActivityEntry;
use crate::db;
use crate::error::{Error, Result};
use crate::redis::int;
use crate::shard::HighWater;
use futures::StreamExt;

/// Items whose sold-out flag a rebuild sets or clears at once.
const FLAGS_AT_ONCE: usize = 32;

/// What a recompute found and wrote, per item.
#[derive(Debug, Clone, Default)]
pub struct Rebuilt {
    pub item: u64,
    /// Units written to Redis (sum over shards).
    pub stock: i64,
    pub in_flight: i64,
    pub active_orders: i64,
}

/// Why a rebuild runs; decides how its lost reservations are counted.
/// In order of strength (`Ord`): a `Repair` rebuilds whatever it finds, a `Lost` one
/// stops when the state is back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// A fence or a stock key is gone (LOST from a script, the fence check).
    Lost,
    /// A shard's sequence fell below this process's high-water mark (the gap was
    /// counted when found).
    Behind,
    /// At start-up, MySQL holds reservations past a shard's sequence.
    Start,
    /// Asked for (Reconcile with repair): rebuilds even when nothing looks lost.
    Repair,
}

impl Cause {
    /// For the request a [`crate::gate::Gate`] holds (0 = none), in the causes' order.
    fn code(self) -> u8 {
        self as u8 + 1
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Cause::Lost),
            2 => Some(Cause::Behind),
            3 => Some(Cause::Start),
            4 => Some(Cause::Repair),
            _ => None,
        }
    }
}

// Failed moves and their rebuilds (`stock.move_repair_gap_ms`): a take or give whose
// outcome is unknown (a timeout, a cut connection), or one no replica acknowledged, may
// have moved units no give brought home (or that a failover takes away again), and only a
// rebuild counts them back; but while Redis keeps timing out, every
// failed move would start another rebuild as soon as the last one ended, each making the
// activity UNAVAILABLE while it runs. So a failed move within the gap of the last such
// rebuild waits for the gap to pass, and every failure meanwhile joins that one rebuild.
// The units held back stay off sale that long (an undersell for a few seconds, never an
// oversell).

/// The move repairs of one activity: when the last started, whether one waits.
#[derive(Debug, Default)]
pub struct MoveRepair {
    last: Option<Instant>,
    queued: bool,
}

/// What to do with a move's request for a rebuild.
#[derive(Debug, PartialEq, Eq)]
enum Repair {
    /// Start it now.
    Now,
    /// Start it after this wait (the gap since the last one is not over).
    After(Duration),
    /// One already waits; it covers this failure too.
    Joined,
}

impl MoveRepair {
    /// Decides for a request at `now`, and records it. `running`: a rebuild (for any
    /// cause) runs now; it may have read the shards before the failure, so this one
    /// waits for it to end (and is the one later failures join).
    fn ask(&mut self, now: Instant, gap: Duration, running: bool) -> Repair {
        if self.queued {
            return Repair::Joined;
        }
        if running {
            self.queued = true;
            return Repair::After(Duration::ZERO);
        }
        match self.last.map(|last| now.saturating_duration_since(last)) {
            Some(since) if since < gap => {
                self.queued = true;
                Repair::After(gap - since)
            }
            _ => {
                self.last = Some(now);
                Repair::Now
            }
        }
    }

    /// The waiting request starts at `now`.
    fn started(&mut self, now: Instant) {
        self.queued = false;
        self.last = Some(now);
    }
}

/// A reservation read from a stream.
#[derive(Debug)]
struct StreamEntry {
    shard: u32,
    rid: String,
    user: String,
    item: u64,
    request: String,
    /// Units (the entry's `q`, 1 without it).
    units: u32,
}

/// One shard's fence (epoch) and sequence, as read from Redis.
type Mark = (Option<String>, u64);

impl App {
    /// Marks the activity unavailable and starts a rebuild, or, when the entry is
    /// claimed (a rebuild runs, the start-up check or an open holds it), leaves the
    /// rebuild to the holder, which runs it before it opens or as it lets go
    /// (`crate::gate`). A rebuild that is finishing may have read the shards before
    /// what this call is for: dropping the call left the entry closed with no rebuild
    /// until the next fence check; letting the holder open over it sold on that state.
    pub fn trigger_recompute(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
        cause: Cause,
        why: &str,
    ) {
        // Claimed here: this rebuild starts after every request made so far.
        if let Some(code) = entry.gate.close_and_ask(cause.code()) {
            let cause = Cause::from_code(code).unwrap_or(cause);
            tracing::warn!(activity = entry.id(), why, ?cause, "recomputing from MySQL");
            self.spawn_rebuild(entry, cause);
        }
    }

    /// The holder of `entry` opens it and lets go; a rebuild asked for meanwhile runs
    /// first instead, under the same claim.
    pub(crate) fn open_and_release(self: &Arc<Self>, entry: &Arc<ActivityEntry>) {
        match entry.gate.open_held() {
            Ok(()) => self.release_claim(entry),
            Err(code) => self.rebuild_asked(entry, code),
        }
    }

    /// Lets go of the claim on `entry`, or, when a rebuild was asked for while it was
    /// held, keeps it and runs that rebuild.
    pub(crate) fn release_claim(self: &Arc<Self>, entry: &Arc<ActivityEntry>) {
        if let Err(code) = entry.gate.release() {
            self.rebuild_asked(entry, code);
        }
    }

    /// Runs the rebuild asked of the holder (`code`), under its claim.
    fn rebuild_asked(self: &Arc<Self>, entry: &Arc<ActivityEntry>, code: u8) {
        let cause = Cause::from_code(code).unwrap_or(Cause::Repair);
        tracing::warn!(
            activity = entry.id(),
            ?cause,
            "recomputing from MySQL: asked for while the activity was held"
        );
        self.spawn_rebuild(entry, cause);
    }

    /// A move (rebalancing take or give) ended in a way that may have left units taken
    /// and never given: start a rebuild now, or once `stock.move_repair_gap_ms` has
    /// passed since the last one a move started. The activity stays available meanwhile.
    pub fn repair_after_move(self: &Arc<Self>, entry: &Arc<ActivityEntry>, why: &'static str) {
        let decision = entry
            .move_repair
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ask(
                Instant::now(),
                Duration::from_millis(self.config.stock.move_repair_gap_ms),
                entry.is_claimed(),
            );
        let label = match decision {
            Repair::Now => "now",
            Repair::After(_) => "deferred",
            Repair::Joined => "joined",
        };
        self.metrics.move_repairs.with_label_values(&[label]).inc();
        match decision {
            Repair::Now => self.trigger_recompute(entry, Cause::Repair, why),
            Repair::Joined => {}
            Repair::After(wait) => {
                tracing::warn!(activity = entry.id(), why, wait_ms = wait.as_millis() as u64,
                    "a move may have held units back; rebuilding once the gap since the last such rebuild has passed and no rebuild runs");
                self.repair_after_rebuild(entry, wait, why)
            }
        }
    }

    /// Starts the waiting move repair after `wait` and then after any rebuild running at
    /// that moment: that one may have read the shards before the failures this one is
    /// for (`trigger_recompute` would hand it to that rebuild as a rerun, which closes
    /// the activity once more; waiting lets buyers use the rebuilt state meanwhile).
    fn repair_after_rebuild(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
        wait: Duration,
        why: &'static str,
    ) {
        let (app, entry) = (self.clone(), entry.clone());
        tokio::spawn(async move {
            let ready = async {
                tokio::time::sleep(wait).await;
                while entry.is_claimed() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            tokio::select! {
                _ = ready => {}
                _ = app.shutdown.clone().wait() => return,
            }
            entry
                .move_repair
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .started(Instant::now());
            app.trigger_recompute(&entry, Cause::Repair, why);
        });
    }

    /// After a rebuild: the items it left without units get the sold-out check a
    /// reservation that empties a shard gets (its own mark may have been refused when the
    /// change count moved; the check sees the flag set and stops at once otherwise).
    fn look_after_rebuild(self: &Arc<Self>, entry: &Arc<ActivityEntry>, report: &[Rebuilt]) {
        for r in report.iter().filter(|r| r.stock == 0) {
            self.spawn_sold_out_check(entry, r.item);
        }
    }

    /// After a rebuild, under its claim: opens the activity, or answers the rebuild
    /// asked for while it ran (`None`: opened). Most such requests under load are the
    /// rebuild's own doing (a reservation in flight met its close and answered LOST): a
    /// `Lost` one whose state is back already opens at once.
    async fn reopen(&self, entry: &ActivityEntry) -> Option<Cause> {
        loop {
            // The test suite holds the rebuild here, between its last read and its
            // open, while a reservation asks for another (`stockd_reopen`).
            fail::fail_point!("stockd::rebuild::before_open");
            let code = entry.gate.open_held().err()?;
            let again = Cause::from_code(code).unwrap_or(Cause::Repair);
            if again != Cause::Lost || !self.intact(entry).await.unwrap_or(false) {
                return Some(again);
            }
        }
    }

    /// Runs the rebuild in the background, retrying until it succeeds or the process
    /// shuts down; the caller holds the claim, and the task lets go of it.
    fn spawn_rebuild(self: &Arc<Self>, entry: &Arc<ActivityEntry>, cause: Cause) {
        let app = self.clone();
        let entry = entry.clone();
        tokio::spawn(async move {
            let mut cause = cause;
            loop {
                match app.recompute(&entry, cause).await {
                    Ok(r) => {
                        let label = if r.is_some() { "ok" } else { "skipped" };
                        app.metrics.recomputes.with_label_values(&[label]).inc();
                        app.look_after_rebuild(&entry, &r.unwrap_or_default());
                        // Asked for again while this one ran: run again, still closed.
                        match app.reopen(&entry).await {
                            None => break,
                            Some(again) => {
                                tracing::info!(activity = entry.id(), cause = ?again,
                                    "rebuilding again: asked for while the last rebuild ran");
                                cause = again;
                            }
                        }
                    }
                    Err(e) => {
                        app.metrics.recomputes.with_label_values(&["error"]).inc();
                        tracing::warn!(activity = entry.id(), error = %e, "recompute failed; retrying");
                        if app.shutdown.is_fired() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
            }
            fail::fail_point!("stockd::rebuild::before_release");
            app.release_claim(&entry);
        });
    }

    /// Runs the recompute and waits for it (used by Reconcile's repair and publish). The
    /// activity is unavailable meanwhile. The work runs in a task of its own: a caller
    /// that goes away (a cancelled gRPC call) while it holds the claim left the claim
    /// held for good, and the activity closed.
    pub async fn recompute_now(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
    ) -> Result<Vec<Rebuilt>> {
        let (app, entry) = (Arc::clone(self), Arc::clone(entry));
        tokio::spawn(async move { app.recompute_held(&entry).await })
            .await
            .map_err(|e| Error::Unavailable(format!("rebuild task failed: {e}")))?
    }

    async fn recompute_held(self: &Arc<Self>, entry: &Arc<ActivityEntry>) -> Result<Vec<Rebuilt>> {
        entry.gate.close();
        // Wait for a running background recompute to finish, then take the slot.
        while !entry.try_claim() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Closed again: the holder waited for may have opened it as it let go. A repair
        // rebuilds whatever it finds, after every request made so far.
        entry.gate.close();
        entry.gate.take_asked();
        fail::fail_point!("stockd::repair::held");
        let out = self.recompute(entry, Cause::Repair).await;
        let label = if out.is_ok() { "ok" } else { "error" };
        self.metrics.recomputes.with_label_values(&[label]).inc();
        match out {
            Ok(r) => {
                self.open_and_release(entry);
                let r = r.unwrap_or_default();
                self.look_after_rebuild(entry, &r);
                Ok(r)
            }
            Err(e) => {
                // Leave it to the background path to finish the job.
                self.spawn_rebuild(entry, Cause::Repair);
                Err(e)
            }
        }
    }

    /// One rebuild under the lease. `None`: a peer rebuilt the activity while this
    /// process waited for the lease, nothing to do.
    async fn recompute(&self, entry: &ActivityEntry, cause: Cause) -> Result<Option<Vec<Rebuilt>>> {
        let a = entry.id();
        let shards = entry.shards();
        let _slot = self
            .rebuilds
            .acquire()
            .await
            .map_err(|_| Error::Unavailable("shutting down".into()))?;
        // What this process and Redis knew before the lease: the baseline both for
        // "a peer rebuilt meanwhile" and for the lost-reservation count.
        let seen: Vec<HighWater> = (0..shards).map(|i| entry.high_water(i)).collect();
        let before = self.shard_marks(a, shards).await?;
        let lease = self.take_lease(a).await?;
        let settled = match cause {
            Cause::Repair => false,
            // Lost state is back when every fence and stock key is there again: a peer
            // rebuilt, or the fences were only closed for a peer's rebuild.
            Cause::Lost => self.intact(entry).await?,
            Cause::Behind | Cause::Start => {
                let now = self.shard_marks(a, shards).await?;
                reopened_by_peer(&before, &now, &seen).is_some()
            }
        };
        if settled {
            tracing::info!(
                activity = a,
                ?cause,
                "a peer rebuilt the activity; nothing to do"
            );
            lease.release().await;
            return Ok(None);
        }
        let token = lease.token;
        // 1. Close.
        for i in 0..shards {
            let closed = int(&self
                .redis_at(a)
                .await?
                .call(RebuildCall::close(a, i, token))
                .await?)?;
            if !RebuildCall::applied(closed) {
                return Err(Error::Unavailable(format!(
                    "activity {a} shard {i}: a newer rebuild owns it"
                )));
            }
        }
        // 2. Reservations already in the streams.
        let mut entries = Vec::new();
        for i in 0..shards {
            for (_id, fields) in self
                .redis_at(a)
                .await?
                .stream_entries(keys::orders_stream(a, i))
                .await?
            {
                let (Some(rid), Some(user), Some(item)) = (
                    fields.get(entry::RESERVATION),
                    fields.get(entry::USER),
                    fields.get(entry::ITEM).and_then(|s| s.parse::<u64>().ok()),
                ) else {
                    continue;
                };
                entries.push(StreamEntry {
                    shard: i,
                    rid: rid.clone(),
                    user: user.clone(),
                    item,
                    request: fields.get(entry::REQUEST).cloned().unwrap_or_default(),
                    // A malformed `q` (never written by the script) counts as one unit.
                    units: seckill_lua::messages::quantity(
                        fields.get(entry::QUANTITY).map(String::as_str),
                    )
                    .unwrap_or(1),
                });
            }
        }
        // 3. MySQL, one snapshot.
        let rids: Vec<String> = entries.iter().map(|e| e.rid.clone()).collect();
        let (records, known) = db::snapshot(&self.db, a, &rids).await?;
        // 4. What Redis lost. A rebuild for one shard found behind closes the others
        // too: a gap of theirs that no call or check reported yet is counted here, as
        // BEHIND (a failover rewinds every shard of the master it replaced).
        for i in 0..shards {
            let (fence, found) = &before[i as usize];
            let hw = &seen[i as usize];
            if matches!(cause, Cause::Behind)
                && fence.as_deref() == Some(hw.epoch.as_str())
                && *found < hw.seq
            {
                self.report_gap(entry, i, hw, *found);
            }
            self.account_lost(
                a,
                i,
                cause,
                &before[i as usize],
                &seen[i as usize],
                &entries,
            )
            .await?;
        }
        // 5. Plan every shard.
        let mut buyers: Vec<HashMap<u64, Vec<(String, String)>>> =
            (0..shards).map(|_| HashMap::new()).collect();
        let mut counts: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut report = Vec::new();
        for rec in &records {
            let in_flight: Vec<&StreamEntry> = entries
                .iter()
                .filter(|e| e.item == rec.item_id && !known.contains(&e.rid))
                .collect();
            let in_flight_units: i64 = in_flight.iter().map(|e| i64::from(e.units)).sum();
            let avail = (i64::from(rec.stock) - in_flight_units).max(0);
            counts.insert(rec.item_id, split_stock(avail as u64, shards));
            for (rid, user, request, units) in &rec.active {
                let shard = rid
                    .parse::<ReservationId>()
                    .ok()
                    .map(|r| r.shard)
                    .filter(|s| *s < shards)
                    .unwrap_or_else(|| home_shard(user, shards));
                buyers[shard as usize]
                    .entry(rec.item_id)
                    .or_default()
                    .push((user.clone(), buyer_record(rid, request, *units)));
            }
            for e in &in_flight {
                buyers[e.shard as usize]
                    .entry(rec.item_id)
                    .or_default()
                    .push((e.user.clone(), buyer_record(&e.rid, &e.request, e.units)));
            }
            report.push(Rebuilt {
                item: rec.item_id,
                stock: avail,
                in_flight: in_flight_units,
                active_orders: rec.active.iter().map(|o| i64::from(o.3)).sum(),
            });
        }
        // 6. Write and open each shard under a new epoch.
        // Newer than every epoch this process or Redis showed, whatever the clock says:
        // a stockd whose clock runs behind a peer's must still open under a newer epoch,
        // or the peers (and its own mark) would take the shards for ones gone back to
        // before a rebuild, and rebuild again.
        let newest = seen
            .iter()
            .map(|hw| hw.epoch.as_str())
            .chain(before.iter().filter_map(|(fence, _)| fence.as_deref()))
            .filter_map(epoch_millis)
            .max()
            .unwrap_or(0);
        let epoch = epoch_from_millis((now_ms().max(0) as u64).max(newest + 1));
        // Read while every shard is still closed: a release on a shard reopened below
        // clears the flag and raises the count, so the sold-out mark after the opens is
        // refused instead of hiding the unit it returned.
        let mut changes = Vec::with_capacity(report.len());
        for r in &report {
            changes.push(self.sold_out_changes(a, r.item).await?);
        }
        for i in 0..shards {
            let mut open = RebuildCall::open(a, i, token, &epoch);
            for rec in &records {
                let s = rec.item_id;
                let b = buyers[i as usize].remove(&s).unwrap_or_default();
                open.push(s, counts[&s][i as usize], b);
            }
            // Asked of a replica like a reservation. A failover to a replica that lacked
            // the open would bring the shard back as it was before the close, under the
            // old epoch: the mark below makes that show as lost writes (BEHIND), and the
            // activity is rebuilt again. Not acknowledged is logged, not fatal: a master
            // without a replica (between a failover and the old master's return) would
            // otherwise keep every shard of the activity closed, the healthy ones too.
            let opened = self
                .redis_at(a)
                .await?
                .call_acked(open, &keys::fence(a, i))
                .await?;
            if !RebuildCall::applied(int(&opened.value)?) {
                return Err(Error::Unavailable(format!(
                    "activity {a} shard {i}: a newer rebuild owns it"
                )));
            }
            if !opened.replicated {
                tracing::warn!(
                    activity = a,
                    shard = i,
                    "the rebuild's open is not on a replica yet; opening anyway"
                );
            }
            // The mark moves to the new epoch at once, so a shard found under an older
            // one later (that failover) is taken for lost writes, not served.
            entry.saw(i, &epoch, 0, false);
        }
        // Several items at once: each clear waits for a replica (`crate::clear`), and
        // the ack lane sends the calls ready on one master together with one `WAIT`, so
        // an activity of many items costs a few waits, not one per item. Every item is
        // tried; the first error is returned after all of them.
        let items: Vec<_> = report.iter().zip(changes).collect();
        let mut first_error = None;
        for chunk in items.chunks(FLAGS_AT_ONCE) {
            let flags = chunk.iter().map(|(r, changes)| async move {
                if r.stock == 0 {
                    // No look at the records of units in transit: the counts written
                    // come from MySQL and include them, and a give from before the
                    // rebuild is refused (the home shard's epoch changed). Refused when
                    // the change count moved since it was read (a release on a shard
                    // reopened meanwhile): the look that follows every rebuild
                    // (`Self::look_after_rebuild`) tries again.
                    if !self.mark_sold_out_settled(a, r.item, changes.clone()).await? {
                        tracing::info!(activity = a, item = r.item,
                            "rebuilt with no units left, but units came back meanwhile: sold-out flag not set yet");
                    }
                    Ok(())
                } else {
                    self.clear_sold_out(a, r.item).await
                }
            });
            for done in futures::future::join_all(flags).await {
                if let Err(e) = done {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        self.write_meta(&entry.activity).await?;
        lease.release().await;
        tracing::info!(activity = a, token, epoch, items = ?report, "recomputed from MySQL");
        Ok(Some(report))
    }

    /// Step 4 for shard `i`: every sequence from 1 to the highest known under the
    /// epoch the shard ran under was handed out; those neither in the stream nor in
    /// MySQL are reservations Redis lost. Logged by id (the item is not known for a
    /// lost one: `a-?-i-epoch-seq`) and counted by path, except a BEHIND gap, which was
    /// counted when it was found.
    async fn account_lost(
        &self,
        a: u64,
        i: u32,
        cause: Cause,
        before: &Mark,
        seen: &HighWater,
        entries: &[StreamEntry],
    ) -> Result<()> {
        let epoch = match (&before.0, seen.epoch.is_empty()) {
            (Some(e), _) => e.clone(),
            (None, false) => seen.epoch.clone(),
            (None, true) => match db::newest_order(&self.db, a, i).await? {
                Some(rid) => match rid.parse::<ReservationId>() {
                    Ok(r) => r.epoch,
                    Err(_) => return Ok(()),
                },
                None => return Ok(()),
            },
        };
        let under = |rid: &str| {
            rid.parse::<ReservationId>()
                .ok()
                .filter(|r| r.activity == a && r.shard == i && r.epoch == epoch)
                .map(|r| r.seq)
        };
        let mut present: HashSet<u64> = entries
            .iter()
            .filter(|e| e.shard == i)
            .filter_map(|e| under(&e.rid))
            .collect();
        present.extend(
            db::known_under(&self.db, a, i, &epoch)
                .await?
                .iter()
                .filter_map(|rid| under(rid)),
        );
        let mut highest = present.iter().copied().max().unwrap_or(0);
        if seen.epoch == epoch {
            highest = highest.max(seen.seq);
        }
        if before.0.as_deref() == Some(epoch.as_str()) {
            highest = highest.max(before.1);
        }
        let lost: Vec<u64> = (1..=highest).filter(|q| !present.contains(q)).collect();
        if lost.is_empty() {
            return Ok(());
        }
        let path = match (cause, &before.0) {
            (Cause::Behind, _) => None,
            (_, None) => Some("fence_missing"),
            (Cause::Start, Some(_)) => Some("start"),
            (Cause::Repair, Some(_)) => Some("repair"),
            (Cause::Lost, Some(_)) => Some("key_missing"),
        };
        // Promised: answered RESERVED by this process, or handed out by another one
        // (its answer is unknown here, so counted as promised).
        let mine = seen.epoch == epoch;
        let unconfirmed = lost
            .iter()
            .filter(|&&q| mine && q > seen.promised && q <= seen.seq)
            .count() as u64;
        if let Some(path) = path {
            self.metrics
                .count_lost(path, lost.len() as u64 - unconfirmed, unconfirmed);
        }
        let ids: Vec<String> = lost
            .iter()
            .take(100)
            .map(|q| format!("{a}-?-{i}-{epoch}-{q}"))
            .collect();
        tracing::error!(
            activity = a,
            shard = i,
            epoch = %epoch,
            lost = lost.len(),
            ids = ?ids,
            "Redis lost reservations that were handed out (neither in the stream nor in MySQL); \
             their buyers were answered RESERVED unless the call also timed out"
        );
        Ok(())
    }

    /// At start-up (`stock.recompute_at_start`): why activity `entry` must be rebuilt
    /// before it opens, if it must: a fence or stock key gone, or MySQL holding
    /// reservations past a shard's sequence (Redis lost writes while no stockd was
    /// there to notice). An activity whose shards are intact opens as it is: a stockd
    /// joining a running fleet closes nothing.
    pub async fn start_check(&self, entry: &ActivityEntry) -> Result<Option<Cause>> {
        let (a, shards) = (entry.id(), entry.shards());
        let marks = self.shard_marks(a, shards).await?;
        for (i, (fence, seq)) in marks.iter().enumerate() {
            let Some(epoch) = fence else {
                return Ok(Some(Cause::Lost));
            };
            let i = i as u32;
            let highest = db::known_under(&self.db, a, i, epoch)
                .await?
                .iter()
                .filter_map(|rid| rid.parse::<ReservationId>().ok())
                .filter(|r| r.shard == i && &r.epoch == epoch)
                .map(|r| r.seq)
                .max()
                .unwrap_or(0);
            if highest > *seq {
                tracing::error!(
                    activity = a,
                    shard = i,
                    epoch = %epoch,
                    redis_seq = seq,
                    mysql_seq = highest,
                    "MySQL holds reservations past the shard's sequence: Redis lost writes"
                );
                return Ok(Some(Cause::Start));
            }
        }
        if !self.intact(entry).await? {
            return Ok(Some(Cause::Lost));
        }
        Ok(None)
    }

    /// True when every shard of the activity has its fence and a stock key for every
    /// item.
    async fn intact(&self, entry: &ActivityEntry) -> Result<bool> {
        let (a, shards) = (entry.id(), entry.shards());
        if !self.fences_present(a, shards).await? {
            return Ok(false);
        }
        for s in entry.item_ids() {
            if !self.shard_stock_present(a, s, shards).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Runs [`Self::start_check`] on every open activity once, at start-up: an intact
    /// one opens, the others rebuild. Nothing opens an activity before it is checked:
    /// every one is claimed before the first is checked, and only then
    /// may the fence check open entries ([`crate::catalog::Catalog::may_open`]). (Claimed
    /// one at a time, the entries not reached yet were the fence check's to open, within
    /// a period, when the check of the ones before took longer than that.)
    pub async fn check_at_start(self: &Arc<Self>) {
        let now = now_ms();
        let claimed: Vec<_> = self
            .catalog
            .all()
            .into_iter()
            .filter(|entry| entry.end_ms() > now && entry.try_claim())
            .collect();
        self.catalog.set_opening();
        // Every activity stays closed until its own check: the checks run at once, a
        // few per Redis Cluster at a time (`mysql.max_connections`), each cluster in a
        // lane of its own, so a dead cluster's timeouts or a slow MySQL read do not hold
        // the others' activities closed behind them.
        let mut lanes: HashMap<&str, Vec<Arc<ActivityEntry>>> = HashMap::new();
        for entry in &claimed {
            let cluster = seckill_daemon::config::named_cluster(&entry.activity.redis_cluster)
                .unwrap_or(seckill_daemon::config::DEFAULT_CLUSTER);
            lanes.entry(cluster).or_default().push(entry.clone());
        }
        let at_once = (self.config.mysql.max_connections as usize).max(1);
        // Each check owns its `Arc`s: a future borrowing `self` is not `Send` for every
        // lifetime the stream's combinator asks of it.
        let lanes = lanes.into_values().map(|entries| {
            let checks = entries
                .into_iter()
                .map(|entry| Arc::clone(self).check_one_at_start(entry));
            futures::stream::iter(checks)
                .buffer_unordered(at_once)
                .collect::<Vec<()>>()
        });
        futures::future::join_all(lanes).await;
    }

    /// [`Self::check_at_start`] of one claimed activity: opens it, rebuilds it, or (the
    /// check failed) leaves it to the fence check.
    async fn check_one_at_start(self: Arc<Self>, entry: Arc<ActivityEntry>) {
        fail::fail_point!("stockd::start_check::before");
        match self.start_check(&entry).await {
            Ok(None) => self.open_and_release(&entry),
            Ok(Some(cause)) => {
                tracing::warn!(activity = entry.id(), ?cause, "rebuilding at start-up");
                // Closed while it rebuilds (an entry this process's own publish put in
                // the catalog before its first load is open).
                entry.gate.close();
                self.spawn_rebuild(&entry, cause);
            }
            Err(e) => {
                // The fence check opens it once Redis answers; it cannot tell a rewound
                // shard without this check's MySQL read, so say so.
                tracing::warn!(activity = entry.id(), error = %e, "start-up check failed; the fence check decides");
                self.release_claim(&entry);
            }
        }
    }

    /// True when every shard has a stock key for item `s`.
    async fn shard_stock_present(&self, a: u64, s: u64, shards: u32) -> Result<bool> {
        let redis = self.redis_at(a).await?;
        let futs = (0..shards).map(|i| redis.get_i64(keys::stock(a, i, s)));
        Ok(futures::future::try_join_all(futs)
            .await?
            .iter()
            .all(Option::is_some))
    }

    /// True when every shard of the activity has its fence.
    pub async fn fences_present(&self, a: u64, shards: u32) -> Result<bool> {
        Ok(self
            .shard_marks(a, shards)
            .await?
            .iter()
            .all(|(fence, _)| fence.is_some()))
    }

    /// Per shard: its fence (epoch) and its reservation sequence, one `MGET` each.
    pub(crate) async fn shard_marks(
        &self,
        a: u64,
        shards: u32,
    ) -> Result<Vec<(Option<String>, u64)>> {
        let redis = self.redis_at(a).await?;
        let futs = (0..shards).map(|i| redis.mget(vec![keys::fence(a, i), keys::seq(a, i)]));
        Ok(futures::future::try_join_all(futs)
            .await?
            .into_iter()
            .map(|v| {
                let mut v = v.into_iter();
                let fence = v.next().flatten();
                let seq = v.next().flatten().and_then(|s| s.parse().ok()).unwrap_or(0);
                (fence, seq)
            })
            .collect())
    }

    /// Redis answered shard `shard`'s sequence as `found`, below this process's
    /// high-water mark under the same epoch: writes were lost (a failover to a replica
    /// that had not received them, an AOF that dropped its last second). The
    /// reservations in the gap were promised and are gone from Redis; orderd may
    /// already hold some of them. Report the gap once and rebuild from MySQL.
    pub fn lost_writes(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
        shard: u32,
        seen: &HighWater,
        found: u64,
    ) {
        self.report_gap(entry, shard, seen, found);
        self.trigger_recompute(entry, Cause::Behind, "Redis lost writes");
    }

    /// Counts and logs shard `shard`'s gap (Redis at `found`, below `seen`) unless it
    /// was reported already (each gap once, whichever path finds it first).
    fn report_gap(&self, entry: &ActivityEntry, shard: u32, seen: &HighWater, found: u64) {
        let Some(gap) = entry.take_behind(shard, seen, found) else {
            return;
        };
        self.metrics.lost_writes.inc();
        self.metrics
            .count_lost("behind", gap.promised, gap.lost - gap.promised);
        tracing::error!(
            activity = entry.id(),
            shard,
            epoch = %seen.epoch,
            found,
            lost = gap.lost,
            promised = gap.promised,
            "Redis lost writes: reservation sequences {}..={} of this shard were handed out \
             and are gone from Redis (those orderd did not read yet are lost; {} of them were \
             answered RESERVED)",
            found + 1,
            found + gap.lost,
            gap.promised,
        );
    }
}

/// After waiting for the lease: the epoch every shard is open under now, when a peer
/// rebuilt the activity meanwhile: every fence present, all one epoch, newer than any
/// this process or Redis showed before the lease (a rebuild opens every shard under
/// one new epoch; nothing else writes a newer one).
fn reopened_by_peer(before: &[Mark], now: &[Mark], seen: &[HighWater]) -> Option<String> {
    let first = now.first()?.0.clone()?;
    if now
        .iter()
        .any(|(fence, _)| fence.as_deref() != Some(first.as_str()))
    {
        return None;
    }
    let older = before
        .iter()
        .filter_map(|(fence, _)| fence.as_deref())
        .chain(
            seen.iter()
                .map(|hw| hw.epoch.as_str())
                .filter(|e| !e.is_empty()),
        );
    let newer = older
        .into_iter()
        .all(|e| crate::shard::epoch_newer(&first, e));
    newer.then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(e: Option<&str>) -> Mark {
        (e.map(str::to_string), 0)
    }

    #[test]
    fn failed_moves_start_at_most_one_rebuild_per_gap_and_none_is_dropped() {
        let gap = Duration::from_secs(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut r = MoveRepair::default();
        // The first failure rebuilds at once.
        assert_eq!(r.ask(at(0), gap, false), Repair::Now);
        // One within the gap waits for the rest of it; the ones after it join that one.
        assert_eq!(
            r.ask(at(1000), gap, false),
            Repair::After(Duration::from_millis(4000))
        );
        assert_eq!(r.ask(at(1200), gap, false), Repair::Joined);
        assert_eq!(r.ask(at(4999), gap, true), Repair::Joined);
        // The waiting one starts; the gap counts from it.
        r.started(at(5000));
        assert_eq!(
            r.ask(at(6000), gap, false),
            Repair::After(Duration::from_millis(4000))
        );
        r.started(at(10_000));
        // A failure a whole gap later rebuilds at once again.
        assert_eq!(r.ask(at(15_000), gap, false), Repair::Now);
        // While a rebuild runs, a failure waits for its end however long ago the last
        // repair was, and the failures meanwhile join it.
        assert_eq!(r.ask(at(30_000), gap, true), Repair::After(Duration::ZERO));
        assert_eq!(r.ask(at(30_100), gap, true), Repair::Joined);
        assert_eq!(r.ask(at(30_200), gap, false), Repair::Joined);
        r.started(at(31_000));
        assert_eq!(
            r.ask(at(32_000), gap, false),
            Repair::After(Duration::from_millis(4000))
        );
    }

    #[test]
    fn a_rebuild_by_a_peer_shows_as_every_shard_open_under_one_newer_epoch() {
        let hw = |e: &str| HighWater {
            epoch: e.into(),
            seq: 3,
            promised: 3,
            reported: false,
        };
        // Closed before the lease, open under a new epoch after it: a peer rebuilt.
        let before = [mark(None), mark(Some("abc"))];
        let now = [mark(Some("abd")), mark(Some("abd"))];
        assert_eq!(
            reopened_by_peer(&before, &now, &[hw("abc"), hw("")]),
            Some("abd".into())
        );
        // Still closed, or open under the epoch this process saw: rebuild.
        assert_eq!(
            reopened_by_peer(&before, &before, &[hw("abc"), hw("")]),
            None
        );
        let same = [mark(Some("abc")), mark(Some("abc"))];
        assert_eq!(
            reopened_by_peer(&same, &same, &[hw("abc"), hw("abc")]),
            None
        );
        // Shards under different epochs: not one finished rebuild.
        let mixed = [mark(Some("abd")), mark(Some("abe"))];
        assert_eq!(reopened_by_peer(&before, &mixed, &[hw(""), hw("")]), None);
    }
}
