#![cfg(feature = "stockd")]
//! A rebalancing round that finds no donor while another home's round of the same
//! process is between its take and its give waits for that move to land and reads the
//! shards again, instead of sending its buyer back to an empty home. Shard 2 holds the
//! item's four units; buyer X (home 0) starts a round that takes all four, and its give
//! is held at the fail point `stockd::move::before_give`: the units are on no shard.
//! Buyer Y (home 1) then finds its home empty and runs a round of its own, whose read
//! finds every shard empty. The hold is let go once Y's round waits (or after
//! `RELEASE_AFTER` whatever happened): X's give lands four units at home 0, one kept for
//! X, and Y's round takes the other three home and Y reserves, in one round of Y's and
//! with no round ended `elsewhere`.
//!
//! (Before, Y's round ended at once: its look found the units in transit, `elsewhere`,
//! and Y went back to its empty home, round after round, through its
//! `rebalance_attempts` while the give was held, and was told ABORTED.)
//!
//! The same wait follows a take that came back empty because another home's round took
//! the units first and holds them in flight (`a_round_whose_take_came_back_empty_...`): before, the
//! round read the shards again, found no donor, and ended `elsewhere` the same way.
//!
//! And the bounds of the wait: it ends at a Redis call's deadline when the give does not
//! land by then (and the round reads again), and a move whose caller went away still
//! ends its flight when its task gives the units home.
//!
//! A test binary of its own: a fail point is process-wide (and its tests take turns,
//! [`SERIAL`]).

use std::time::{Duration, Instant};

use seckill_proto::pb;
use seckill_proto::pb::ReserveOutcome;
use seckill_tests::failpoint::Hold;
use seckill_tests::redis::user_on_shard;
use seckill_tests::stockd::{
    create_published_activity, look_at, reserve, set_shard_stock, spawn_stockd, StockClient,
    StockdHandle,
};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

const HOUR: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 4;
/// The give is let go this long after Y's reservation was sent, if Y's round has not
/// been seen waiting by then: long enough for the old code to spend every attempt.
const RELEASE_AFTER: Duration = Duration::from_secs(3);
const BEFORE_TAKE: &str = "stockd::move::before_take";
const BEFORE_GIVE: &str = "stockd::move::before_give";

/// The tests of this binary take turns: they hold the same fail points.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A stockd whose per-call Redis deadline (which bounds each wait for a landing) is
/// longer than a hold lasts at worst, so a round does not give up on a held move.
const LONG_MS: u64 = 5000;

/// A stockd with this per-call Redis deadline, and an activity whose one item holds
/// four units, all on shard 2.
async fn stack(
    timeout_ms: u64,
) -> (
    RedisCluster,
    TestDb,
    StockdHandle,
    fred::clients::Client,
    (u64, u64),
) {
    init_tracing();
    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    let h = spawn_stockd(&deps, |c| c.redis.timeout_ms = timeout_ms).await;
    let act = create_published_activity(&h, &[(4, 100)], SHARDS, Duration::ZERO, HOUR).await;
    let (a, s) = (act.id, act.items[0].id);
    let redis = cluster.client().await;
    set_shard_stock(&redis, a, s, &[0, 0, 4, 0]).await;
    (cluster, db, h, redis, (a, s))
}

/// A stack (see [`stack`]) in which buyer X (home 0) has taken all four units in a
/// round of its own and is held before its give: the units are in flight.
struct XHeld {
    _cluster: RedisCluster,
    _db: TestDb,
    h: StockdHandle,
    redis: fred::clients::Client,
    item: (u64, u64),
    c: StockClient,
    /// X's reservation.
    x: Answer,
    /// Lets X's give go on.
    go: std::sync::mpsc::Sender<()>,
    /// `stockd_rebalance_landing_waits_total` before X came.
    waits_before: u64,
}

async fn x_held_at_its_give(timeout_ms: u64) -> XHeld {
    fail::remove(BEFORE_TAKE);
    let (_cluster, _db, h, redis, item) = stack(timeout_ms).await;
    let c = h.stock_client().await;
    let hold = Hold::at(BEFORE_GIVE);
    let waits_before = h.metrics.rebalance_landing_waits.get();
    let x = buyer(&c, item, "x", 0);
    let go = hold.reached("X's give").await;
    assert_eq!(
        look_at(&redis, item.0, 2, item.1).await.0,
        0,
        "X's take emptied the donor"
    );
    XHeld {
        _cluster,
        _db,
        h,
        redis,
        item,
        c,
        x,
        go,
        waits_before,
    }
}

type Answer = tokio::task::JoinHandle<Result<pb::ReserveResponse, tonic::Status>>;

/// A buyer whose home is `home`, reserving in a task of its own.
fn buyer(c: &StockClient, (a, s): (u64, u64), name: &str, home: u32) -> Answer {
    let mut c = c.clone();
    let user = user_on_shard(name, home, SHARDS);
    let request = format!("r-{name}");
    tokio::spawn(async move { reserve(&mut c, a, s, &user, &request).await })
}

/// Rounds ended `elsewhere` (their buyers sent back to an empty home), whatever the
/// look found.
fn elsewhere(h: &StockdHandle) -> u64 {
    ["shards", "transit", "moving"]
        .iter()
        .map(|f| h.metrics.rebalance_elsewhere.with_label_values(&[f]).get())
        .sum()
}

/// The counters the tests read before the buyers come.
struct Before {
    elsewhere: u64,
    waits: u64,
    rounds: u64,
}

impl Before {
    fn of(h: &StockdHandle) -> Self {
        Self {
            elsewhere: elsewhere(h),
            waits: h.metrics.rebalance_landing_waits.get(),
            rounds: h.metrics.rebalance_rounds.get(),
        }
    }

    /// Once the buyers are answered: a round waited for a move to land (`waited`, from
    /// [`release_once_waiting`]), none ended `elsewhere`, and `rounds` rounds ran.
    fn no_round_spun(&self, h: &StockdHandle, waited: u64, rounds: u64) {
        assert!(waited >= 1, "a round waited for the move in flight to land");
        assert_eq!(
            elsewhere(h) - self.elsewhere,
            0,
            "no round ended `elsewhere` (sending its buyers back to an empty home)"
        );
        assert_eq!(
            h.metrics.rebalance_rounds.get() - self.rounds,
            rounds,
            "one round per buyer brought its unit home"
        );
    }
}

/// Waits until a round has waited for a landing since `before` (or `RELEASE_AFTER`
/// passed, or `waiter` was answered), then lets the held move go on. How many waits
/// there were by then.
async fn release_once_waiting(
    h: &StockdHandle,
    before: u64,
    waiter: &Answer,
    go: std::sync::mpsc::Sender<()>,
) -> u64 {
    let sent = Instant::now();
    while h.metrics.rebalance_landing_waits.get() == before
        && sent.elapsed() < RELEASE_AFTER
        && !waiter.is_finished()
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waited = h.metrics.rebalance_landing_waits.get() - before;
    let _ = go.send(());
    waited
}

/// The answer `who` had, which must be RESERVED.
async fn reserved(answer: Answer, who: &str) {
    let r = tokio::time::timeout(Duration::from_secs(30), answer)
        .await
        .unwrap_or_else(|_| panic!("{who} was never answered"))
        .unwrap_or_else(|e| panic!("{who}'s task: {e}"))
        .unwrap_or_else(|e| panic!("{who} was answered {e:?}"));
    assert_eq!(r.outcome(), ReserveOutcome::Reserved, "{who}");
}

/// Four units, two sold: two left on the shards once the moves have settled (in the
/// background), and nothing in transit.
async fn two_left(redis: &fred::clients::Client, (a, s): (u64, u64)) {
    left_once_settled(redis, (a, s), 2, "four units, two sold").await
}

/// What the shards hold once the moves have settled (nothing in transit): `left`.
async fn left_once_settled(
    redis: &fred::clients::Client,
    (a, s): (u64, u64),
    expected: i64,
    why: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (mut left, mut in_transit) = (0, 0);
        for i in 0..SHARDS {
            let (units, _, transit) = look_at(redis, a, i, s).await;
            left += units;
            in_transit += transit;
        }
        if in_transit == 0 {
            assert_eq!(left, expected, "{why}");
            return;
        }
        assert!(Instant::now() < deadline, "moves never settled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_that_finds_units_only_in_flight_waits_for_them_to_land() {
    let _serial = SERIAL.lock().await;
    let t = x_held_at_its_give(LONG_MS).await;
    let (h, redis, item, c) = (&t.h, &t.redis, t.item, &t.c);
    let (x, go, waits_before) = (t.x, t.go, t.waits_before);
    // X's round is counted already.
    let before = Before::of(h);
    let y = buyer(c, item, "y", 1);
    let waited = release_once_waiting(h, waits_before, &y, go).await;
    reserved(x, "X").await;
    reserved(y, "Y (a unit of those X's move brought)").await;

    before.no_round_spun(h, waited, 1);
    two_left(redis, item).await;
}

/// X's round reads the four units on shard 2 and is held before its take; Y's round
/// reads them too, takes all four and is held before its give. X's take then comes back
/// empty with the units in flight: X's round waits for Y's give, and takes the three
/// units Y's round does not keep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_whose_take_came_back_empty_waits_for_the_units_in_flight() {
    let _serial = SERIAL.lock().await;
    let (_cluster, _db, h, redis, (a, s)) = stack(LONG_MS).await;
    let c = h.stock_client().await;
    let take = Hold::at(BEFORE_TAKE);
    let give = Hold::at(BEFORE_GIVE);
    let before = Before::of(&h);
    let empty_before = h.metrics.rebalance_takes_empty.get();

    let x = buyer(&c, (a, s), "x", 0);
    let take_x = take.reached("X's take").await;
    let y = buyer(&c, (a, s), "y", 1);
    let give_y = give.reached("Y's give").await;
    assert_eq!(
        look_at(&redis, a, 2, s).await.0,
        0,
        "Y's take emptied the donor"
    );
    let _ = take_x.send(());
    let waited = release_once_waiting(&h, before.waits, &x, give_y).await;
    reserved(y, "Y").await;
    reserved(x, "X (a unit of those Y's move brought)").await;

    assert_eq!(
        h.metrics.rebalance_takes_empty.get() - empty_before,
        1,
        "X's take found the donor empty"
    );
    before.no_round_spun(&h, waited, 2);
    two_left(&redis, (a, s)).await;
}

/// A wait for a landing is bounded: with a deadline of 300 ms per Redis call and X's
/// give held for 900 ms (inside the move's give budget of a deadline and a second), Y's
/// round waits, the wait ends unanswered, and the round reads again and waits once more,
/// before the give lands; then Y reserves. (An unbounded wait would have counted one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_landing_ends_at_a_redis_deadline_and_the_round_reads_again() {
    const SHORT_MS: u64 = 300;
    let _serial = SERIAL.lock().await;
    let t = x_held_at_its_give(SHORT_MS).await;
    let (h, redis, item, c) = (&t.h, &t.redis, t.item, &t.c);
    let (x, go, waits_before) = (t.x, t.go, t.waits_before);
    let y = buyer(c, item, "y", 1);
    tokio::time::sleep(Duration::from_millis(3 * SHORT_MS)).await;
    let waited = h.metrics.rebalance_landing_waits.get() - waits_before;
    let _ = go.send(());
    reserved(x, "X").await;
    reserved(y, "Y").await;

    assert!(
        waited >= 2,
        "Y's round waited, its wait ended at the deadline, and it waited again ({waited})"
    );
    two_left(redis, item).await;
}

/// A move whose caller went away still lands, and its flight ends with it: X's call is
/// cancelled while its give is held, Y's round waits for that give, and wakes when the
/// move's task gives the units home (not at the per-call deadline, 5 s). Nobody keeps
/// them, so Y's round takes all four and Y reserves one: three left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_whose_caller_went_away_still_ends_its_flight() {
    let _serial = SERIAL.lock().await;
    let t = x_held_at_its_give(LONG_MS).await;
    let (h, redis, item, c) = (&t.h, &t.redis, t.item, &t.c);
    let (x, go, waits_before) = (t.x, t.go, t.waits_before);
    // X goes away: the client drops its call, and stockd drops X's round.
    x.abort();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let y = buyer(c, item, "y", 1);
    let waited = release_once_waiting(h, waits_before, &y, go).await;
    let released = Instant::now();
    reserved(y, "Y").await;

    assert!(waited >= 1, "Y's round waited for the move in flight");
    assert!(
        released.elapsed() < Duration::from_millis(LONG_MS / 2),
        "Y's round woke when the move landed, {:?} after the give went on",
        released.elapsed()
    );
    left_once_settled(redis, item, 3, "four units, Y's one sold, X's call gone").await;
}
