//! The hot path: Reserve (one Lua call on the user's home shard, rebalancing when
//! the home shard is empty), Release, and sold-out publication.
//!
//! Rebalancing: when the home shard answers SOLD_OUT (or SHORT: it holds fewer than
//! the k units asked for), stockd scans the other shards from a rotating offset,
//! `TAKE`s up to `max(stock.rebalance_batch, units missing)` from each donor that has
//! some until the home shard has gained what it missed, `GIVE`s them to the home shard
//! and reserves again, at most `stock.rebalance_attempts` times. Units a round brought
//! home are kept for the buyers it carried, until they have reserved them or for
//! `stock.rebalance_keep_ms` at most: other homes' rounds leave them out of what they
//! ask a donor for. When the shards hold fewer than
//! k units together, the answer is NOT_ENOUGH with that count (SOLD_OUT
//! when they hold none). A take is a decrement on the donor; a give is an
//! increment on the home shard; a crash between them loses units (undersell,
//! repaired by recompute) and never creates one. When a full scan finds every shard
//! empty, the item is sold out: `SET sk:{a}:soldout:<s>` and a message on
//! `sk:soldout`, unless units were between a take and a give meanwhile
//! ([`crate::transit`]); a release that returns a unit clears both.
//!
//! (Over 400 lines: Reserve, Release and the rebalancing they fall back to are one path (a
//! SOLD_OUT home shard leads straight into a move); the group-commit queue is in shard.rs
//! and batch.rs.)

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::Either;
use tokio::sync::oneshot;

use seckill_lua::calls::{
    GiveCall, Given, LookCall, Marked, ReleaseCall, Released, SoldOutMarkCall, TakeAt, TakeCall,
    Taken,
};
use seckill_lua::clock::now_ms;
use seckill_lua::keys;
use seckill_lua::messages::SoldOut;
use seckill_lua::{home_shard, ReservationId};

use crate::app::App;
use crate::catalog::ActivityEntry;
use crate::domain::{RequestId, UserId};
use crate::error::{invalid, Error, Result};
use crate::mover::{InFlight, Outcome, Round, Ticket, Turn};
use crate::recompute::Cause;
use crate::redis::{array, int, text};
use crate::shard::Script;
use crate::transit::{self, Look};

/// What Reserve answers. Business outcomes, not errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    /// `quantity` units are held. `retry`: the same request id had already reserved
    /// them (`quantity` is then the units of that reservation).
    Reserved {
        reservation_id: String,
        remaining_hint: i64,
        retry: bool,
        quantity: u32,
    },
    /// The user holds a reservation of `quantity` units under another request id.
    Duplicate {
        reservation_id: String,
        remaining_hint: i64,
        quantity: u32,
    },
    SoldOut,
    /// Fewer units than asked for are left in the item (`remaining`, >= 1).
    NotEnough {
        remaining: i64,
    },
    NotStarted,
    Ended,
    NotFound,
}

impl Reserve {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Reserved { retry: false, .. } => "reserved",
            Self::Reserved { retry: true, .. } => "retry",
            Self::Duplicate { .. } => "duplicate",
            Self::SoldOut => "sold_out",
            Self::NotEnough { .. } => "not_enough",
            Self::NotStarted => "not_started",
            Self::Ended => "ended",
            Self::NotFound => "not_found",
        }
    }
}

/// What Release answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    Released,
    NotHeld,
}

/// One rebalancing move: up to `want` units of `item` from shard `donor` to shard
/// `home`, whose fence read `home_epoch` before the take.
struct Move {
    item: u64,
    donor: u32,
    home: u32,
    home_epoch: Arc<str>,
    want: u32,
}

/// One rebalancing move's result.
enum Step {
    /// The donor had nothing.
    Empty,
    /// Units (this many) went from the donor to the home shard; the move's record of
    /// units in transit is being settled by this task ([`transit::settle`]), or, with
    /// none (the give on no replica yet), left to its deadline. Dropping the guard tells
    /// the rounds of other homes waiting for a landing ([`crate::mover::Landing`]): the
    /// round drops it once it has kept the units for its callers when the move brought
    /// all it needed, at once when it is still short (then nothing is kept).
    Moved(i64, Option<tokio::task::JoinHandle<()>>, Option<InFlight>),
    /// A shard's state is gone; a recompute was started.
    Lost,
}

impl App {
    /// Reserve `quantity` units (1..=the activity's `per_user_limit`) of `item` for
    /// `user`. The window (start, end) of the activity is returned with the outcome
    /// when the activity is known.
    pub async fn reserve(
        self: &Arc<Self>,
        activity: u64,
        item: u64,
        user: &UserId,
        request: &RequestId,
        quantity: u32,
    ) -> Result<(Reserve, Option<(i64, i64)>)> {
        let started = Instant::now();
        let out = self
            .reserve_inner(activity, item, user, request, quantity)
            .await;
        self.metrics
            .reserve_seconds
            .observe(started.elapsed().as_secs_f64());
        let label = match &out {
            Ok((r, _)) => r.label(),
            Err(Error::InvalidArgument { .. }) => "invalid",
            Err(_) => "unavailable",
        };
        self.metrics.count_reservation(label);
        out
    }

    async fn reserve_inner(
        self: &Arc<Self>,
        activity: u64,
        item: u64,
        user: &UserId,
        request: &RequestId,
        quantity: u32,
    ) -> Result<(Reserve, Option<(i64, i64)>)> {
        let Some(entry) = self.catalog.get(activity) else {
            if !self.catalog.is_loaded() {
                return Err(Error::Unavailable("activities not loaded yet".into()));
            }
            // Published by a peer since this process's last catalog poll: its meta is
            // in Redis. Not NOT_FOUND (a caller would not retry, and an edge would not
            // fail over): UNAVAILABLE until the poll loads it.
            if Box::pin(self.redis().exists(keys::meta(activity))).await? {
                return Err(Error::Unavailable(format!(
                    "activity {activity} is not loaded here yet; retry shortly"
                )));
            }
            return Ok((Reserve::NotFound, None));
        };
        let window = Some((entry.start_ms(), entry.end_ms()));
        let Some(item_entry) = entry.items.get(&item) else {
            return Ok((Reserve::NotFound, window));
        };
        let limit = entry.activity.per_user_limit.max(1);
        if quantity == 0 || quantity > limit {
            return Err(invalid(
                "quantity",
                format!("must be 1..={limit} (the activity's per_user_limit)"),
            ));
        }
        let now = now_ms();
        if now < entry.start_ms() {
            return Ok((Reserve::NotStarted, window));
        }
        if now >= entry.end_ms() {
            return Ok((Reserve::Ended, window));
        }
        if !entry.is_available() {
            return Err(Error::Unavailable(format!(
                "activity {activity} is being rebuilt from MySQL; retry shortly"
            )));
        }
        let shards = entry.shards();
        let home = home_shard(user.as_str(), shards);
        let attempts = self.config.stock.rebalance_attempts;
        let mut moved = false;
        // The last rebalancing round this call waited on failed (`crate::mover`).
        let mut failed = false;
        // Times the home shard answered SOLD_OUT or SHORT (each a round waited for or run).
        let mut empties = 0u32;
        // The last rebalancing round this call waited on or ran (`crate::mover::Ticket`).
        let mut ticket = None;
        for attempt in 0..=attempts {
            match self
                .reserve_script(&entry, item, home, user, request, quantity, attempt > 0)
                .await?
            {
                Script::Reserved(rid, left, units) => {
                    if empties > 0 {
                        self.metrics
                            .rebalance_waits_per_reserved
                            .observe(f64::from(empties));
                    }
                    if let Some(t) = ticket.filter(|_| self.config.stock.rebalance_keep_ms > 0) {
                        // The round that carried this buyer may keep units here for it:
                        // that many fewer to keep from the other homes' rounds.
                        entry.mover(item, home).reserved(t, i64::from(units));
                    }
                    if left == 0 {
                        self.spawn_sold_out_check(&entry, item);
                    } else if moved {
                        // Units moved here while another call may have declared the
                        // item sold out from a scan that missed them in transit.
                        if let Err(e) = Box::pin(self.clear_sold_out(activity, item)).await {
                            tracing::warn!(activity, item, error = %e, "cannot clear sold-out");
                        }
                    }
                    return Ok((
                        Reserve::Reserved {
                            reservation_id: rid,
                            remaining_hint: left,
                            retry: false,
                            quantity: units,
                        },
                        window,
                    ));
                }
                Script::Retry(rid, left, units) => {
                    return Ok((
                        Reserve::Reserved {
                            reservation_id: rid,
                            remaining_hint: left,
                            retry: true,
                            quantity: units,
                        },
                        window,
                    ))
                }
                Script::Duplicate(rid, left, units) => {
                    return Ok((
                        Reserve::Duplicate {
                            reservation_id: rid,
                            remaining_hint: left,
                            quantity: units,
                        },
                        window,
                    ))
                }
                Script::Lost => {
                    self.trigger_recompute(
                        &entry,
                        Cause::Lost,
                        "fence or stock key missing at reserve",
                    );
                    return Err(Error::Unavailable(format!(
                        "activity {activity} lost its Redis state; rebuilding from MySQL"
                    )));
                }
                Script::Behind(seen, found) => {
                    self.lost_writes(&entry, home, &seen, found);
                    return Err(Error::Unavailable(format!(
                        "activity {activity} lost Redis writes; rebuilding from MySQL"
                    )));
                }
                Script::SoldOut | Script::Short(_) if attempt == attempts => break,
                Script::SoldOut => {
                    empties += 1;
                    // The cold path is boxed: it keeps this future small, and the gRPC
                    // layer moves every Reserve future (its largest state) into a box.
                    let empty = self.home_empty(&entry, item, home, (quantity, 0), &mut ticket);
                    match Box::pin(empty).await? {
                        Empty::Retry(again) => {
                            moved |= again != Again::Failed;
                            failed = again == Again::Failed;
                            // The test suite holds a carried buyer here, between its
                            // round and its reservation (`stockd_keep`).
                            fail::fail_point!(
                                "stockd::reserve::carried",
                                again == Again::Home,
                                |_| Err(Error::Unavailable("fail point".into()))
                            );
                            continue;
                        }
                        Empty::SoldOut => return Ok((Reserve::SoldOut, window)),
                        Empty::NotEnough(remaining) => {
                            return Ok((Reserve::NotEnough { remaining }, window))
                        }
                    }
                }
                Script::Short(have) => {
                    empties += 1;
                    let empty = self.home_empty(&entry, item, home, (quantity, have), &mut ticket);
                    match Box::pin(empty).await? {
                        Empty::Retry(again) => {
                            moved |= again != Again::Failed;
                            failed = again == Again::Failed;
                            continue;
                        }
                        Empty::SoldOut => return Ok((Reserve::SoldOut, window)),
                        Empty::NotEnough(remaining) => {
                            return Ok((Reserve::NotEnough { remaining }, window))
                        }
                    }
                }
            }
        }
        if failed {
            // The round this call waited on last failed (a Redis error, or its runner went
            // away): nothing says the item is sold out, so the caller retries. (No look:
            // it would most likely meet the same trouble.)
            return Err(Error::Unavailable(format!(
                "rebalancing for item {item} failed; retry with the same request id"
            )));
        }
        // Out of attempts: other buyers took the units moved here first, or concurrent
        // multi-unit buyers took turns emptying each other's home shards. Look once more
        // and say what remains only when it is short of the quantity: a buyer is never
        // told SOLD_OUT or NOT_ENOUGH while the shards and the units in transit hold what
        // it asked for. Otherwise it retries (ABORTED: contention, not an unhealthy
        // stockd).
        match Box::pin(self.remains(&entry, item, quantity, "attempts")).await? {
            Empty::SoldOut => Ok((Reserve::SoldOut, window)),
            Empty::NotEnough(remaining) => Ok((Reserve::NotEnough { remaining }, window)),
            Empty::Retry(_) => {
                item_entry.gave_up.fetch_add(1, Ordering::Relaxed);
                self.metrics.gave_up.inc();
                Err(Error::Contended(format!(
                    "could not gather {quantity} unit(s) of item {item} on one shard \
                     under contention; retry with the same request id"
                )))
            }
        }
    }

    /// After the home shard answered SOLD_OUT (`have` 0) or SHORT (it holds `have`,
    /// fewer than the `units` asked for): sold out for good (the flag is set, or a scan
    /// and a second look found every shard empty), not enough (the shards hold fewer
    /// than `units` together), or try again (units moved home, or some are in transit
    /// between another call's take and give).
    async fn home_empty(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
        item: u64,
        home: u32,
        (units, have): (u32, i64),
        ticket: &mut Option<Ticket>,
    ) -> Result<Empty> {
        let (activity, shards) = (entry.id(), entry.shards());
        if shards == 1 {
            return Ok(if have > 0 {
                Empty::NotEnough(have)
            } else {
                Empty::SoldOut
            });
        }
        let missing = (i64::from(units) - have.max(0)).max(1);
        // One move at a time per item and home, sized for every caller waiting for it
        // (`crate::mover`): the callers a round carried take its outcome. The sold-out
        // flag is read while this caller waits for its turn, not before: a caller queued
        // behind a round hears a set flag at once (leaving its demand behind, see
        // `crate::mover`), and the caller whose turn comes first runs the round without
        // it: the round's scan and second look decide sold out from the shards
        // themselves, so a flag set from a scan that missed units in transit does not
        // hide them from it.
        let mover = entry.mover(item, home);
        let redis = self.redis_of(entry)?;
        let flag = std::pin::pin!(async {
            if have > 0 {
                return Ok(false);
            }
            redis.exists(keys::sold_out(activity, item)).await
        });
        let asked = Instant::now();
        let turn = std::pin::pin!(mover.turn(missing));
        // `None`: the sold-out flag answered first.
        let turn = match futures::future::select(turn, flag).await {
            Either::Left((turn, _)) => Some(turn),
            Either::Right((Ok(true), _)) => None,
            Either::Right((Ok(false), turn)) => Some(turn.await),
            Either::Right((Err(e), _)) => return Err(e),
        };
        // Which round carries this caller: its reservation counts that round's keep down.
        let turn = turn.map(|(t, turn)| {
            *ticket = Some(t);
            turn
        });
        self.metrics
            .rebalance_wait_seconds
            .observe(asked.elapsed().as_secs_f64());
        let mut round = match turn {
            None | Some(Turn::Done(Outcome::SoldOut)) => return Ok(Empty::SoldOut),
            Some(Turn::Done(Outcome::Retry)) => return Ok(Empty::Retry(Again::Home)),
            Some(Turn::Done(Outcome::Failed)) => return Ok(Empty::Retry(Again::Failed)),
            Some(Turn::Run(round)) => round,
        };
        self.metrics.rebalance_rounds.inc();
        // An error drops the round unfinished: the callers waiting on it read it as failed.
        let ran = Instant::now();
        let empty = self.move_round(entry, item, home, units, &mut round).await;
        self.metrics
            .rebalance_round_seconds
            .observe(ran.elapsed().as_secs_f64());
        let empty = empty.inspect_err(|_| self.metrics.count_round("failed"))?;
        let (outcome, label) = match empty {
            Empty::SoldOut => (Outcome::SoldOut, "sold_out"),
            Empty::Retry(again) => (Outcome::Retry, again.label()),
            // A caller carried by this round may want fewer units than this one.
            Empty::NotEnough(_) => (Outcome::Retry, "not_enough"),
        };
        self.metrics.count_round(label);
        if let Empty::Retry(Again::Elsewhere(found)) = empty {
            self.metrics.count_elsewhere(found.label());
        }
        round.finish(outcome);
        Ok(empty)
    }

    /// One round of [`Self::home_empty`]: moves the units `round` claims home, or, when
    /// fewer moved, looks at every shard again and answers retry, not enough (for `units`)
    /// or sold out (and marks it).
    async fn move_round(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
        item: u64,
        home: u32,
        units: u32,
        round: &mut Round<'_>,
    ) -> Result<Empty> {
        match self.rebalance(entry, item, home, round).await? {
            Moved::Units => Ok(Empty::Retry(Again::Home)),
            // Units may have moved since the round's read: look again before declaring
            // it sold out (or short).
            Moved::Some => Ok(match self.remains(entry, item, units, "round").await? {
                Empty::Retry(_) => Empty::Retry(Again::Home),
                other => other,
            }),
            Moved::Nothing => self.remains(entry, item, units, "round").await,
        }
    }

    /// What every shard of `item` holds for a buyer of `units`, from a fresh look:
    /// enough (retry), not enough (with the count), or nothing (sold out, and marked).
    /// Units in transit (between a take and a give) are on their way to a shard: they
    /// count toward what the shards hold together, and the item is not sold out.
    async fn remains(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
        item: u64,
        units: u32,
        by: &'static str,
    ) -> Result<Empty> {
        let (activity, shards) = (entry.id(), entry.shards());
        let look = self.look(activity, item, shards, by).await?;
        let total = look.left + look.in_transit;
        if total >= i64::from(units) {
            let found = if look.left >= i64::from(units) {
                Found::Shards
            } else {
                Found::Transit
            };
            return Ok(Empty::Retry(Again::Elsewhere(found)));
        }
        if total > 0 {
            return Ok(Empty::NotEnough(total));
        }
        if !self.mark_after_look(activity, item, look).await? {
            // Units are moving, or moved during the look: reserve again.
            return Ok(Empty::Retry(Again::Elsewhere(Found::Moving)));
        }
        Ok(Empty::SoldOut)
    }

    /// Moves units from donor shards to `home` until the units `round` claims (after its
    /// read of the shards) have moved: up to `max(rebalance_batch, still missing)` from
    /// each donor in turn. Units moved beyond the claim carry the callers that came
    /// since, when they fit ([`Round::claim_within`]).
    ///
    /// The donors are read first (one `GET` per shard, all at once, no replica `WAIT`)
    /// and only those that held units are asked, the richest first (ties in the
    /// rotating order that spreads concurrent moves). Why: near the end of a sale most
    /// donors are empty, and a take on each in turn (a Lua call and a `WAIT` each) made
    /// the reservations that found their home empty the slowest of the opening burst
    /// (1,218 takes for 269 units moved in one demo crowd, 28 after), holding back every
    /// reservation batched with them. A donor that gains units after the read is not
    /// lost: the caller looks at every shard again before it answers sold out.
    ///
    /// A round that found only kept units waits for them, then reads again, up to
    /// [`REBALANCE_PASSES`] reads in all: ending the round after the wait sent every
    /// caller it carried back to an empty home, each spending one of its
    /// `rebalance_attempts` on it, while the units it waited for were on offer.
    ///
    /// A round that finds no donor and nothing kept while this process's round of
    /// another home is between a take and a give waits for that move to land, then reads
    /// again, within the same [`REBALANCE_PASSES`] (`crate::mover::Landing`).
    ///
    /// A take that comes back empty (the donor's own buyers or another home's round had
    /// the units first) makes the round read the shards again and go on with the donors
    /// it has not asked yet that hold units now, richest first. Before anything moved,
    /// that read is the one at the top (one of the [`REBALANCE_PASSES`]), with its waits:
    /// what another home's round took is most often in flight, or home and kept for its
    /// callers, and the round waits for it instead of ending with its callers sent back
    /// to an empty home. Each donor is asked at most once a round, so a round whose every
    /// take comes back empty still ends, and the caller looks. (Starting the round over
    /// from every donor there made the last units go round the homes faster, and more
    /// buyers ran out of attempts; docs/load-testing.md, twenty-eighth and thirty-fourth
    /// sessions.)
    async fn rebalance(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
        item: u64,
        home: u32,
        round: &mut Round<'_>,
    ) -> Result<Moved> {
        let a = entry.id();
        let shards = entry.shards();
        // The units this round's claims asked for so far.
        let mut missing = 0i64;
        let mut reads = 0u32;
        let mut moved = 0i64;
        // Each move's units in transit are settled by a task of its own after its give:
        // in the background when the units came home; waited for otherwise, before the
        // caller's look (which would count this round's own records).
        let mut settles = Vec::new();
        // Each donor is asked once a round.
        let mut asked = vec![false; shards as usize];
        'round: loop {
            let Some(Offer {
                mut held,
                mut offered,
                mut donors,
                home_epoch,
                start,
            }) = self
                .read_offer(entry, item, home, round, &mut reads, &mut missing, &asked)
                .await?
            else {
                return Ok(Moved::Nothing);
            };
            let mut next = 0;
            while let Some(&donor) = donors.get(next) {
                next += 1;
                asked[donor as usize] = true;
                let want = u32::try_from(missing - moved)
                    .unwrap_or(u32::MAX)
                    .max(self.config.stock.rebalance_batch);
                // A take asks beyond what the read saw (units may have come since); of a donor
                // that keeps units, what it asked beyond would be the kept ones.
                let (has, offers) = (held[donor as usize], offered[donor as usize]);
                let want = if offers < has {
                    want.min(u32::try_from(offers).unwrap_or(u32::MAX))
                } else {
                    want
                };
                // The move runs in a task of its own: when the caller goes away (a client
                // deadline drops this future) between the take and the give, the give still
                // happens instead of the taken units vanishing.
                // Held while this future waits for the task: closed if it is dropped.
                let (_waiting, caller) = oneshot::channel::<()>();
                let task = tokio::spawn(Arc::clone(self).move_units(
                    Arc::clone(entry),
                    Move {
                        item,
                        donor,
                        home,
                        home_epoch: Arc::clone(&home_epoch),
                        want,
                    },
                    caller,
                ));
                let step = task
                    .await
                    .map_err(|e| Error::Unavailable(format!("rebalancing task failed: {e}")))??;
                match step {
                    Step::Empty => {
                        // The read saw units there, and another home's round or the donor's
                        // own buyers took them first: the read is stale. The shards are read
                        // again (one `GET` each, no replica `WAIT`), and the round goes on
                        // with the donors not asked yet that hold units now, richest first,
                        // instead of taking in turn from those the stale read saw: an empty
                        // take costs a Lua call and a `WAIT`, and every buyer the round
                        // carries waits for it (docs/load-testing.md, thirty-first session).
                        self.metrics.rebalance_takes_empty.inc();
                        if moved == 0 && reads < REBALANCE_PASSES {
                            // Nothing moved yet: the read from the top, which also waits
                            // when nothing is on offer but kept units or units in flight
                            // (another home's round most often took these: its give is
                            // on its way).
                            continue 'round;
                        }
                        held = Box::pin(self.shard_stock(a, item, shards)).await?;
                        offered = self.on_offer(entry, item, home, &held).0;
                        donors = donor_order(&offered, home, start);
                        donors.retain(|d| !asked[*d as usize]);
                        next = 0;
                        continue;
                    }
                    Step::Moved(n, settle, landed) => {
                        moved += n;
                        if moved >= missing {
                            let carried = missing + round.claim_within(moved - missing);
                            let keep = self.config.stock.rebalance_keep_ms;
                            if keep > 0 {
                                round.keep(carried, Instant::now() + Duration::from_millis(keep));
                            }
                            // Kept: the rounds of other homes waiting for this move may read.
                            drop(landed);
                            // The records settle in the background: the units are home,
                            // and the callers reserve them meanwhile.
                            return Ok(Moved::Units);
                        }
                        drop(landed);
                        settles.extend(settle);
                    }
                    Step::Lost => {
                        return Err(Error::Unavailable(format!(
                            "activity {a} lost its Redis state; rebuilding from MySQL"
                        )))
                    }
                }
            }
            break;
        }
        // The caller looks at the shards next and may mark the item sold out: this
        // round's own records must be gone first (those of gives on no replica yet stay
        // to their deadline, and hold the mark back).
        for settle in settles {
            let _ = settle.await;
        }
        Ok(if moved > 0 {
            Moved::Some
        } else {
            Moved::Nothing
        })
    }

    /// The read at the top of a round of [`Self::rebalance`]: reads the shards (and the
    /// home shard's fence) until a donor not in `asked` offers units, and claims the
    /// demand after each read (`missing`, what the round's callers asked for so far).
    /// Only kept units on offer: waits for them, and reads again. Nothing on offer and
    /// nothing kept while this process's round of another home is between a take and a
    /// give: waits for that move to land, and reads again. `None` when the round ends
    /// with nothing to take (after at most [`REBALANCE_PASSES`] reads in all, `reads`
    /// counting them over the round).
    #[allow(clippy::too_many_arguments)]
    async fn read_offer(
        self: &Arc<Self>,
        entry: &Arc<ActivityEntry>,
        item: u64,
        home: u32,
        round: &mut Round<'_>,
        reads: &mut u32,
        missing: &mut i64,
        asked: &[bool],
    ) -> Result<Option<Offer>> {
        let (a, shards) = (entry.id(), entry.shards());
        let redis = self.redis_of(entry)?;
        loop {
            *reads += 1;
            if *reads > 1 {
                self.metrics.rebalance_rereads.inc();
            }
            let start = entry.rotation.fetch_add(1, Ordering::Relaxed);
            // The home shard's fence, read before any take: a give adds units only to a
            // shard still under it (a rebuild in between counted them again from MySQL).
            let (held, home_fence) = futures::future::try_join(
                Box::pin(self.shard_stock(a, item, shards)),
                redis.mget(vec![keys::fence(a, home)]),
            )
            .await?;
            let Some(home_epoch) = home_fence.into_iter().next().flatten() else {
                self.trigger_recompute(entry, Cause::Lost, "fence missing at a move's read");
                return Err(Error::Unavailable(format!(
                    "activity {a} lost its Redis state; rebuilding from MySQL"
                )));
            };
            // Units another home's round just brought there for its own callers are not
            // on offer: taken before those callers reserve them, they went round the
            // homes while every home's buyers chased them.
            let (offered, kept_until, keepers) = self.on_offer(entry, item, home, &held);
            let mut donors = donor_order(&offered, home, start);
            donors.retain(|d| !asked[*d as usize]);
            // The demand is claimed now, after the read: the callers that came during it
            // ride with this round instead of waiting for the next.
            *missing += if *reads == 1 {
                round.claim()
            } else {
                round.claim_again()
            };
            if !donors.is_empty() {
                return Ok(Some(Offer {
                    held,
                    offered,
                    donors,
                    home_epoch: Arc::from(home_epoch),
                    start,
                }));
            }
            let Some(until) = kept_until else {
                // No donor, nothing kept, but this process's rounds of other homes are
                // between a take and a give: wait for the next of those moves to land
                // (its units then on a shard, kept for that home's callers or on
                // offer), and read again, instead of sending the callers this round
                // carries back to an empty home while the units are on their way
                // (`crate::mover`). Each wait is bounded by a Redis call's deadline
                // (a give most often lands well within it; a flight may last up to
                // the give budget and the give's deadline, and a wait that ends first
                // reads again), and the round's reads bound the waits.
                let landing = entry.items.get(&item).map(|i| &i.landing);
                if let Some(landing) = landing.filter(|l| l.moving() && *reads < REBALANCE_PASSES) {
                    self.metrics.rebalance_landing_waits.inc();
                    let deadline = Duration::from_millis(self.config.redis.timeout_ms);
                    let _ = tokio::time::timeout(deadline, landing.landed()).await;
                    continue;
                }
                return Ok(None);
            };
            // Only kept units: once their buyers have reserved every one (most often
            // within a group-commit call), or by the keep's end, they are gone or on
            // offer. Waiting for that spares the buyers here a spin through their attempts
            // meanwhile; then this round reads again and takes what is on offer by then
            // (after its last read, the caller looks). The callers who came during the
            // wait ride with it.
            let movers: Vec<_> = keepers.iter().map(|&d| entry.mover(item, d)).collect();
            let released = futures::future::join_all(movers.iter().map(|m| m.released()));
            tokio::select! {
                _ = tokio::time::sleep_until(until.into()) => {}
                _ = released => {}
            }
            if *reads == REBALANCE_PASSES {
                round.claim_again();
                return Ok(None);
            }
        }
    }

    /// What a round may take of the shards' units `held`: each donor's, less the units
    /// another home's round keeps there for its own callers (taken before those callers
    /// reserve them, they went round the homes while every home's buyers chased them);
    /// with the earliest end of those keeps and the shards that keep them.
    fn on_offer(
        &self,
        entry: &ActivityEntry,
        item: u64,
        home: u32,
        held: &[i64],
    ) -> (Vec<i64>, Option<Instant>, Vec<u32>) {
        let mut offered = held.to_vec();
        let mut kept_until: Option<Instant> = None;
        let mut keepers = Vec::new();
        if self.config.stock.rebalance_keep_ms > 0 {
            let kept = entry.kept(item, Instant::now());
            for (d, (n, k)) in offered.iter_mut().zip(kept).enumerate() {
                if let Some((units, until)) = k.filter(|_| *n > 0 && d != home as usize) {
                    *n -= units;
                    kept_until = Some(kept_until.map_or(until, |u| u.min(until)));
                    keepers.push(d as u32);
                }
            }
        }
        (offered, kept_until, keepers)
    }

    /// One [`Move`] of up to `want` units from `donor` to `home`: TAKE on the donor, then
    /// GIVE on the home shard. Run as a task of its own (see [`Self::rebalance`]);
    /// `caller` is closed when the caller went away meanwhile.
    ///
    /// A move errs on the side of losing units, never of creating them: units taken
    /// but not given are held back until a rebuild counts them again from MySQL, so
    /// every way a move can end without its give (the take not on a replica, a take or
    /// give whose outcome is unknown) starts one, and so does a give on no replica yet
    /// (a failover could still lose it).
    async fn move_units(
        self: Arc<Self>,
        entry: Arc<ActivityEntry>,
        m: Move,
        mut caller: oneshot::Receiver<()>,
    ) -> Result<Step> {
        let Move {
            item,
            donor,
            home,
            home_epoch,
            want,
        } = m;
        let a = entry.id();
        let redis = self.redis_of(&entry)?;
        let mut hw = entry.high_water(donor);
        if hw.epoch.is_empty() {
            // No mark yet (this process has reserved nothing there since it started): a
            // take without an epoch would be checked against no rebuild at all (see
            // take.lua). The donor's fence is the mark to start from, read once. (No
            // fence: the take answers the lost state.)
            let fence = redis.mget(vec![keys::fence(a, donor)]).await?;
            if let Some(epoch) = fence.into_iter().next().flatten() {
                entry.saw(donor, &epoch, 0, false);
                hw = entry.high_water(donor);
            }
        }
        // The test suite empties the donor here, after the round's read saw its units
        // (`stockd_take_empty`).
        fail::fail_point!("stockd::move::before_take");
        let mut adopted = false;
        // The units taken are in transit under this id until the give has landed and
        // the record is settled, or for the record's lifetime (`crate::transit`).
        let id = transit::move_id();
        let lifetime_ms = transit::lifetime_ms(self.config.redis.timeout_ms);
        let (replicated, taken, epoch, sent) = loop {
            let at = TakeAt {
                epoch: &hw.epoch,
                seq: hw.seq,
                id: &id,
                lifetime_ms,
            };
            let take = TakeCall::new(a, donor, item, want, at);
            let sent = Instant::now();
            let took = match redis.call_acked(take, &keys::fence(a, donor)).await {
                Ok(took) => took,
                Err(e) => {
                    // Timed out or cut after the write: the take may have run (its
                    // record, if any, is left to its deadline).
                    self.repair_after_move(&entry, "a rebalancing take failed");
                    return Err(e);
                }
            };
            let replicated = took.replicated;
            let parts = array(took.value)?;
            let reply =
                parts.first().map(int).transpose()?.and_then(|n| {
                    Taken::from_reply(n, &parts.get(1).map(text).unwrap_or_default())
                });
            match reply {
                Some(Taken::FenceMissing) => {
                    self.trigger_recompute(&entry, Cause::Lost, "fence missing at take");
                    return Ok(Step::Lost);
                }
                Some(Taken::Behind(found)) => {
                    self.lost_writes(&entry, donor, &hw, found);
                    return Ok(Step::Lost);
                }
                // A rebuild (another stockd's, or one this process has not heard of from
                // this shard yet) reopened the donor since this process's mark: nothing
                // was taken. Adopt its epoch and ask once more.
                Some(Taken::Newer(newer)) if !adopted => {
                    entry.saw(donor, &newer, 0, false);
                    hw = entry.high_water(donor);
                    adopted = true;
                }
                Some(Taken::Newer(newer)) => {
                    return Err(Error::Unavailable(format!(
                        "rebalancing: shard {donor} of activity {a} reopened again (epoch {newer})"
                    )))
                }
                Some(Taken::Units { units: 0, .. }) => return Ok(Step::Empty),
                Some(Taken::Units { units, epoch }) => break (replicated, units, epoch, sent),
                None => return Err(Error::Internal(format!("take answered {parts:?}"))),
            }
        };
        // In transit from here: every way out of this call ends the flight (a give that
        // did not land with it), and a give that landed hands it to the round.
        let landed = entry.items.get(&item).map(|i| i.landing.took());
        if !replicated {
            // No replica holds the take yet. Giving the units to the home shard now
            // would create them twice if the take died in a failover (oversell); not
            // giving them loses them (undersell), the side a move may err on, until
            // the rebuild started here counts them back from MySQL.
            tracing::warn!(
                a,
                item,
                donor,
                taken,
                "rebalancing: the take is not on a replica; units held back, rebuilding"
            );
            self.repair_after_move(&entry, "a rebalancing take was not replicated");
            return Err(Error::Unavailable(
                "rebalancing: the donor shard's replica did not acknowledge in time".into(),
            ));
        }
        // The record counts for `lifetime_ms` from the take, and the give must land
        // while it does, one look's spread (a deadline) before its end: a look that read
        // the home shard before the give and the donor after the record expired would
        // miss the units. The give itself is bounded by the deadline; the time before
        // it is sent is not (a stalled runtime answers a timely reply late). Past the
        // budget the units are held back (undersell) until the rebuild started here.
        // The test suite stalls the process here (`stockd_give_budget`).
        fail::fail_point!("stockd::move::before_give");
        let budget = transit::give_budget_ms(self.config.redis.timeout_ms);
        if sent.elapsed().as_millis() > u128::from(budget) {
            tracing::warn!(
                a,
                item,
                donor,
                taken,
                elapsed_ms = sent.elapsed().as_millis() as u64,
                "rebalancing: the take answered too late to give; units held back, rebuilding"
            );
            self.repair_after_move(&entry, "a rebalancing take answered too late to give");
            return Err(Error::Unavailable(
                "rebalancing: the move ran out of time; retry".into(),
            ));
        }
        // The give waits for a replica like every other write of a move: the home
        // master could die before its replica has the units, and a failover would then
        // lose them with nothing left to show it (the settle below removes the
        // record, and the shard's sequence did not move, so no fence check finds a
        // rewind).
        let give = GiveCall::new(a, home, item, taken, &home_epoch);
        let given = redis
            .call_acked(give, &keys::fence(a, home))
            .await
            .and_then(|g| Ok((int(&g.value)?, g.replicated)));
        let (given, give_replicated) = match given {
            Ok((n, replicated)) => (Given::from_reply(n), replicated),
            Err(e) => {
                // The give may not have run: the taken units would be gone for good. Or
                // it may still land (a master that queued it past the deadline): the
                // move's record stays until its deadline instead of settling now, so no
                // look marks the item sold out before it lands.
                self.repair_after_move(&entry, "a rebalancing give failed");
                return Err(e);
            }
        };
        match given {
            Given::FenceMissing => {
                // The units are lost (undersell) until the recompute restores them.
                self.trigger_recompute(&entry, Cause::Lost, "fence missing at give");
                return Ok(Step::Lost);
            }
            Given::Stale => {
                // A rebuild opened the home shard since the move read its fence. If it
                // came after the take, it counted the taken units again and dropping them
                // is exact; if before, they are lost until a rebuild counts them back:
                // one is started (rare: a rebuild in the middle of a move).
                tracing::warn!(a, item, donor, home, taken, %epoch, home_epoch = %home_epoch,
                    "rebalancing: a rebuild came between the move's read and its give; units dropped");
                self.repair_after_move(&entry, "a rebuild came during a move");
                return Ok(Step::Lost);
            }
            Given::Units(_) => {}
        }
        self.metrics.rebalance_units.inc_by(taken as u64);
        tracing::debug!(a, item, donor, home, taken, "moved units");
        if matches!(caller.try_recv(), Err(oneshot::error::TryRecvError::Closed)) {
            // Nobody will reserve from these units now, and a round that ran while
            // they were in transit may have found every shard empty and set the
            // sold-out flag, which would hide them from every buyer.
            if let Err(e) = self.clear_sold_out(a, item).await {
                tracing::warn!(a, item, error = %e, "cannot clear the sold-out flag");
            }
        }
        if !give_replicated {
            // The units are on the home master alone. The callers may reserve them (a
            // reservation waits for the replica too), but the move is not settled: its
            // record holds sold-out marks back until its deadline, and the rebuild
            // started here counts the units again from MySQL if a failover lost them.
            tracing::warn!(
                a,
                item,
                donor,
                home,
                taken,
                "rebalancing: the give is not on a replica; its record stays, rebuilding"
            );
            self.repair_after_move(&entry, "a rebalancing give was not replicated");
            return Ok(Step::Moved(taken, None, landed));
        }
        let settle = {
            let redis = redis.clone();
            tokio::spawn(async move { transit::settle(&redis, (a, item, donor), &id, taken).await })
        };
        Ok(Step::Moved(taken, Some(settle), landed))
    }

    async fn announce_sold_out(&self, a: u64, s: u64) -> Result<()> {
        tracing::info!(a, s, "sold out");
        self.redis_at(a)
            .await?
            .publish(
                keys::SOLD_OUT_CHANNEL,
                SoldOut {
                    activity: a,
                    item: s,
                    sold_out: true,
                }
                .encode(),
            )
            .await
    }

    /// The change count of item `s` (`sk:{a}:changes:<s>`), read before a look at every
    /// shard that may end in [`Self::mark_sold_out_settled`].
    pub(crate) async fn sold_out_changes(&self, a: u64, s: u64) -> Result<Option<String>> {
        let redis = self.redis_at(a).await?;
        Ok(redis
            .mget(vec![keys::changes(a, s)])
            .await?
            .into_iter()
            .next()
            .flatten())
    }

    /// A look at every shard that may end in [`Self::mark_after_look`]: the change
    /// count first, then each shard's units and live records of units in transit, read
    /// at once (`scripts/look.lua`). The order is what lets the mark refuse a look that
    /// a move or a return overlapped (`crate::transit`).
    ///
    /// `by` says who looks, for `stockd_sold_out_looks_total` (one of
    /// [`crate::metrics::LOOK_CAUSES`]).
    pub(crate) async fn look(&self, a: u64, s: u64, shards: u32, by: &'static str) -> Result<Look> {
        self.metrics.count_look(by);
        let changes = self.sold_out_changes(a, s).await?;
        let redis = self.redis_at(a).await?;
        let shards = (0..shards).map(|i| redis.call(LookCall::new(a, i, s)));
        let mut look = Look {
            changes,
            ..Look::default()
        };
        let sent = Instant::now();
        let replies = futures::future::try_join_all(shards).await?;
        look.spread = sent.elapsed();
        for reply in replies {
            let parts = array(reply)?;
            // (The second value, the count of live records, is not needed here: their
            // units say as much.)
            let (Some(units), Some(in_transit)) = (parts.first(), parts.get(2)) else {
                return Err(Error::Internal(format!("look answered {parts:?}")));
            };
            look.left += int(units)?.max(0);
            look.in_transit += int(in_transit)?;
        }
        Ok(look)
    }

    /// Marks item `s` sold out after `look` found no units on any shard: refused
    /// (false, counted) when units were in transit, when its reads spread too wide to
    /// be sure of that ([`Look::spread_ok`]), or when the change count moved
    /// ([`Self::mark_sold_out_settled`]).
    pub(crate) async fn mark_after_look(&self, a: u64, s: u64, look: Look) -> Result<bool> {
        if look.in_transit > 0 || !look.spread_ok() {
            self.metrics.sold_out_marks_refused.inc();
            return Ok(false);
        }
        self.mark_sold_out_settled(a, s, look.changes).await
    }

    /// Sets the sold-out key after a look that found every shard empty and nothing in
    /// transit, unless the look may have missed units (`scripts/soldout_mark.lua`: the
    /// change count no longer `changes`, as read before the look). True when the flag
    /// is set (by this call, announced, or before); false when refused.
    pub(crate) async fn mark_sold_out_settled(
        &self,
        a: u64,
        s: u64,
        changes: Option<String>,
    ) -> Result<bool> {
        let redis = self.redis_at(a).await?;
        let reply = int(&redis
            .call(SoldOutMarkCall::new(a, s, changes.as_deref()))
            .await?)?;
        match Marked::from_reply(reply) {
            Some(Marked::Set) => {
                self.announce_sold_out(a, s).await?;
                Ok(true)
            }
            Some(Marked::Already) => Ok(true),
            Some(Marked::Changed) => {
                self.metrics.sold_out_marks_refused.inc();
                Ok(false)
            }
            None => Err(Error::Internal(format!("sold-out mark answered {reply}"))),
        }
    }

    /// Units per shard (a missing key counts as 0).
    pub(crate) async fn shard_stock(&self, a: u64, s: u64, shards: u32) -> Result<Vec<i64>> {
        let redis = self.redis_at(a).await?;
        let futs = (0..shards).map(|i| redis.get_i64(keys::stock(a, i, s)));
        futures::future::try_join_all(futs)
            .await
            .map(|v| v.into_iter().map(|x| x.unwrap_or(0)).collect())
    }

    /// After a reservation emptied its shard: when every shard is empty, the item is
    /// sold out. Off the hot path.
    pub(crate) fn spawn_sold_out_check(self: &Arc<Self>, entry: &Arc<ActivityEntry>, item: u64) {
        let app = self.clone();
        let (a, shards) = (entry.id(), entry.shards());
        tokio::spawn(async move {
            let check = async {
                // Refused while units move (often the round that brought this buyer's
                // unit home, ending in the background): looked at again a little later,
                // a few times; after that the next buyer whose home is empty runs a
                // round, which marks it once they have landed.
                for wait_ms in [0, 20, 100, 500] {
                    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                    let look = app.look(a, item, shards, "check").await?;
                    if look.left > 0 || app.mark_after_look(a, item, look).await? {
                        break;
                    }
                }
                Ok::<_, Error>(())
            };
            if let Err(e) = check.await {
                tracing::warn!(a, item, error = %e, "sold-out check failed");
            }
        });
    }

    /// Give a reservation's units back (the k its buyer record holds), only while the
    /// buyer record still names it.
    pub async fn release(&self, reservation: &str, user: &UserId) -> Result<Release> {
        let rid: ReservationId =
            reservation
                .parse()
                .map_err(|e: seckill_lua::ids::BadReservationId| {
                    invalid("reservation_id", e.to_string())
                })?;
        if let Some(entry) = self.catalog.get(rid.activity) {
            if rid.shard >= entry.shards() {
                return Err(invalid(
                    "reservation_id",
                    "shard out of range for the activity",
                ));
            }
        }
        let (a, s) = (rid.activity, rid.item);
        // Acknowledged like a reservation: a failover to a replica without the release
        // would lose the unit. A NOT_HELD rewrites the fence, so a retry's WAIT covers
        // the first call's release too.
        let acked = self
            .redis_at(a)
            .await?
            .call_acked(
                ReleaseCall::new(&rid, user.as_str(), true),
                &keys::fence(a, rid.shard),
            )
            .await?;
        let replicated = acked.replicated;
        let parts = array(acked.value)?;
        let units = parts.get(2).map(int).transpose()?.unwrap_or(1);
        let outcome = parts
            .first()
            .map(text)
            .zip(parts.get(1).map(int).transpose()?)
            .and_then(|(outcome, left)| Released::from_reply(&outcome, left, units));
        let outcome = match outcome {
            Some(Released::Released { .. }) => Release::Released,
            Some(Released::NotHeld) => Release::NotHeld,
            // A rebuild would write its snapshot over a release made now.
            Some(Released::Closed) => {
                return Err(Error::Unavailable(format!(
                    "the shard of {reservation} is closed for a rebuild; retry"
                )))
            }
            None => return Err(Error::Internal(format!("release answered {parts:?}"))),
        };
        // A released unit is for sale on the master now: clear its flag even before a
        // replica holds it. A NOT_HELD clears it too, once acknowledged (as orderd's
        // relay does): it may be the retry of a release whose own clear failed.
        if outcome == Release::Released || replicated {
            if let Err(e) = self.clear_sold_out(a, s).await {
                tracing::warn!(a, s, error = %e, "cannot clear the sold-out flag");
            }
        }
        if !replicated {
            return Err(Error::Unavailable(format!(
                "the release of {reservation} is not yet held by a replica; retry (a \
                 retry answers NOT_HELD once a replica holds it)"
            )));
        }
        // Acknowledged outcomes only: an unacknowledged release counts when its retry
        // answers.
        self.metrics
            .releases
            .with_label_values(&[match outcome {
                Release::Released => "released",
                Release::NotHeld => "not_held",
            }])
            .inc();
        Ok(outcome)
    }
}

/// Reads of the shards one rebalancing round makes at most (`App::rebalance`): the
/// first, and the reads again after it waited for kept units (each wait bounded by
/// `stock.rebalance_keep_ms`) or for a move to land (bounded by `redis.timeout_ms`).
const REBALANCE_PASSES: u32 = 4;

/// What a round's read found on offer ([`App::read_offer`]).
struct Offer {
    /// Each shard's units as read.
    held: Vec<i64>,
    /// What the round may take of them (less the units kept for other homes' callers).
    offered: Vec<i64>,
    /// The donors to ask, in order (none asked yet this round).
    donors: Vec<u32>,
    /// The home shard's epoch, read with the shards.
    home_epoch: Arc<str>,
    /// The rotation's value at the read (ties among donors).
    start: u32,
}

enum Moved {
    /// Every missing unit moved home.
    Units,
    /// Some moved, fewer than missing.
    Some,
    Nothing,
}

/// What follows a SOLD_OUT or SHORT from the home shard.
enum Empty {
    /// Reserve again.
    Retry(Again),
    SoldOut,
    /// The shards hold this many units together, fewer than asked for.
    NotEnough(i64),
}

/// Why a caller whose home shard was empty reserves again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Again {
    /// Units moved home (for a caller carried by another's round: that round did not fail).
    Home,
    /// Nothing moved home, but the other shards (and the units in transit) hold enough:
    /// they are being bought where they are, or are on their way to another home.
    /// (Told apart from [`Self::Home`] only in `stockd_rebalance_round_outcomes_total`,
    /// and by what the look found in `stockd_rebalance_elsewhere_total`.)
    Elsewhere(Found),
    /// The round this caller waited on failed.
    Failed,
}

impl Again {
    fn label(self) -> &'static str {
        match self {
            Self::Home => "home",
            Self::Elsewhere(_) => "elsewhere",
            Self::Failed => "failed",
        }
    }
}

/// What the look found that sent the callers of a round that moved nothing home back
/// to reserve again (`stockd_rebalance_elsewhere_total{found}`, [`ELSEWHERE_FOUND`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// The shards alone hold enough: units are being bought where they are (or moved
    /// to another home, already given).
    Shards,
    /// Only with the units in transit counted is there enough: a move between its take
    /// and its settle (its give may have landed already, then counted twice).
    Transit,
    /// Every shard looked empty, but the mark was refused: units moved during the look.
    Moving,
}

impl Found {
    fn label(self) -> &'static str {
        match self {
            Self::Shards => "shards",
            Self::Transit => "transit",
            Self::Moving => "moving",
        }
    }
}

/// The donors a move asks, in order: every shard but `home` that held units in
/// `held`, the most first; equal ones in the rotating order from `start`.
fn donor_order(held: &[i64], home: u32, start: u32) -> Vec<u32> {
    let shards = held.len() as u32;
    let mut donors: Vec<u32> = (0..shards)
        .map(|k| start.wrapping_add(k) % shards)
        .filter(|&d| d != home && held[d as usize] > 0)
        .collect();
    // Stable: equal holdings keep the rotation's order.
    donors.sort_by_key(|&d| std::cmp::Reverse(held[d as usize]));
    donors
}

#[cfg(test)]
mod tests {
    use super::donor_order;

    #[test]
    fn donors_are_the_shards_with_units_but_home_richest_first_ties_in_rotation() {
        //          shard:  0  1  2  3  4  5  6  7
        let held = [0, 5, 0, 9, 5, -1, 2, 5];
        // Home 3 is never a donor, empty and negative shards are skipped; the three
        // shards holding 5 keep the rotation's order from `start`.
        assert_eq!(donor_order(&held, 3, 0), vec![1, 4, 7, 6]);
        assert_eq!(donor_order(&held, 3, 5), vec![7, 1, 4, 6]);
        assert_eq!(donor_order(&held, 1, 2), vec![3, 4, 7, 6]);
        // The rotation wraps.
        assert_eq!(donor_order(&held, 0, u32::MAX), vec![3, 7, 1, 4, 6]);
        assert!(donor_order(&[0, 0, 3], 2, 7).is_empty());
    }
}
