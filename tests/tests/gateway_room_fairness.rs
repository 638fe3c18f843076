#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]
//! Fairness of the waiting room, on the real stack. A crowd of 100 clients wants 20
//! units: 10 % are bots that re-request as fast as the limits allow (per user 25
//! requests/s), 90 % are patient humans who arrive spread over the minute before the
//! opening and then follow the page (a heartbeat every 500 ms, one purchase once
//! admitted, after a reaction time).
//!
//! Time is compressed 20×: the minute before the opening lasts 3 s, the humans'
//! reaction 0.3–0.8 s (6–16 s real), the room admits 10 buyers/s (200/s real).
//!
//! - Room on (`fifo`: the pre-queue shuffled at the opening): the humans' share of the
//!   units must be at least their share of the crowd (90 %).
//! - Room off (`passthrough`), same crowd on another activity: the bots, firing from
//!   the opening instant, take visibly more than their 10 % (asserted: more than with the
//!   room on, and more than their share of the crowd), which shows the test can fail.
//!
//! The bots of this test re-roll: each of their requests is a fresh join (a script
//! that drops the cookie, hoping for a better draw) followed by a token request. A join
//! replaces the user's ticket, so their place after the opening is always the back
//! of the line. (A bot that joins once and behaves like a human gets a human's odds:
//! the room makes hammering useless, not bots impossible.)
//!
//! Needs `cargo build -p gateway --bins`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use seckill_tests::gateway::{bucket, set, GatewayHandle, Stack};
use seckill_tests::stockd::create_published_activity;
use serde_json::json;

const UNITS: u32 = 20;
const HUMANS: usize = 90;
const BOTS: usize = 10;
/// The compressed minute before the opening.
const PRE_OPEN_MS: u64 = 3000;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Human,
    Bot,
}

/// Who got a unit (a 202), by kind.
#[derive(Debug, Default)]
struct Won {
    humans: usize,
    bots: usize,
}

impl Won {
    fn human_share(&self) -> f64 {
        self.humans as f64 / (self.humans + self.bots).max(1) as f64
    }
    fn bot_share(&self) -> f64 {
        self.bots as f64 / (self.humans + self.bots).max(1) as f64
    }
}

/// A purchase with an optional admission token: token, then reserve. True on a 202.
async fn buy(gw: &GatewayHandle, jwt: &str, a: u64, s: u64, admission: Option<&str>) -> bool {
    let r = gw.token_admitted(jwt, a, s, admission).await;
    if r.status != 200 {
        return false;
    }
    let pt = r.body["purchase_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    gw.reserve(jwt, a, s, &pt).await.status == 202
}

/// A human: arrives at `arrive_ms` (ms since the run started), joins the room (when
/// `room`), beats until admitted, waits its reaction time, buys once. Without the room,
/// it waits for the opening, then reacts and buys.
async fn human(
    gw: Arc<GatewayHandle>,
    jwt: String,
    (a, s): (u64, u64),
    room: bool,
    (arrive_ms, react_ms): (u64, u64),
    open_at: tokio::time::Instant,
    run_start: tokio::time::Instant,
) -> bool {
    tokio::time::sleep_until(run_start + Duration::from_millis(arrive_ms)).await;
    if !room {
        tokio::time::sleep_until(open_at + Duration::from_millis(react_ms)).await;
        return buy(&gw, &jwt, a, s, None).await;
    }
    let r = gw.room_join(&jwt, a, None).await;
    let mut place = r.body["position_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let deadline = open_at + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = gw.room_beat(&jwt, a, &place).await;
        match r.body["state"].as_str() {
            Some("admitted") => {
                let adm = r.body["admission_token"].as_str().unwrap().to_string();
                tokio::time::sleep(Duration::from_millis(react_ms)).await;
                return buy(&gw, &jwt, a, s, Some(&adm)).await;
            }
            Some(_) => {
                if let Some(p) = r.body["position_token"].as_str() {
                    place = p.to_string();
                }
            }
            None if r.code() == "rate_limited" => {}
            None => return false,
        }
    }
    false
}

/// A bot: from the start of the run until the sale is over, as fast as the limits
/// allow. Until it holds a purchase token: (room) a fresh join, then a token request
/// with whatever admission that join gave (none while queued); (no room) a token
/// request. Once it holds one, it fires reserves with it. (A bot that asked a new token
/// before each reserve would spend each refill of its per-user bucket on the token and
/// be limited on the reserve: it could lose to the humans with the room off, and the
/// test could not show what the room changes.)
async fn bot(
    gw: Arc<GatewayHandle>,
    jwt: String,
    (a, s): (u64, u64),
    room: bool,
    over: Arc<AtomicBool>,
) -> bool {
    let mut purchase: Option<String> = None;
    while !over.load(Ordering::Relaxed) {
        match &purchase {
            None => {
                let adm = if room {
                    let r = gw.room_join(&jwt, a, None).await;
                    r.body["admission_token"].as_str().map(str::to_string)
                } else {
                    None
                };
                let r = gw.token_admitted(&jwt, a, s, adm.as_deref()).await;
                if r.status == 200 {
                    purchase = r.body["purchase_token"].as_str().map(str::to_string);
                }
            }
            Some(pt) => {
                if gw.reserve(&jwt, a, s, pt).await.status == 202 {
                    return true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// One crowd against activity `(a, s)`, opening `PRE_OPEN_MS` after the run starts.
async fn crowd(
    gw: &Arc<GatewayHandle>,
    (a, s): (u64, u64),
    room: bool,
    open_at: tokio::time::Instant,
) -> Won {
    let run_start = open_at - Duration::from_millis(PRE_OPEN_MS);
    let now = seckill_lua::clock::now_ms() as u64;
    let over = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..HUMANS {
        let jwt = gw.jwt(&format!("human-{room}-{a}-{i}"), 3600, now);
        // Spread evenly over the pre-open window, reaction 300..800 ms.
        let arrive = (i as u64 * PRE_OPEN_MS) / HUMANS as u64;
        let react = 300 + (i as u64 * 37) % 500;
        let gw = gw.clone();
        tasks.spawn(async move {
            (
                Kind::Human,
                human(gw, jwt, (a, s), room, (arrive, react), open_at, run_start).await,
            )
        });
    }
    for i in 0..BOTS {
        let jwt = gw.jwt(&format!("bot-{room}-{a}-{i}"), 3600, now);
        let (gw, over) = (gw.clone(), over.clone());
        // With the room, the bots re-roll from the start; without it, there is nothing to
        // gain before the opening (425), so they fire from just before it (on a loaded
        // machine, hammering for seconds would only slow this test process down).
        let start = if room {
            run_start
        } else {
            open_at - Duration::from_millis(200)
        };
        tasks.spawn(async move {
            tokio::time::sleep_until(start).await;
            (Kind::Bot, bot(gw, jwt, (a, s), room, over).await)
        });
    }
    let mut won = Won::default();
    let mut humans_done = 0;
    while let Some(r) = tasks.join_next().await {
        let (kind, got) = r.expect("client task");
        match (kind, got) {
            (Kind::Human, true) => won.humans += 1,
            (Kind::Bot, true) => won.bots += 1,
            _ => {}
        }
        if kind == Kind::Human {
            humans_done += 1;
        }
        // Once every human is done (bought, or saw the item gone), the bots stop.
        if humans_done == HUMANS || won.humans + won.bots >= UNITS as usize {
            over.store(true, Ordering::Relaxed);
        }
    }
    won
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_room_humans_get_at_least_their_share_and_without_it_bots_get_more() {
    let stack = Stack::start().await;
    let gw = stack
        .gateway(|c| {
            set(c, "limits", "per_user", bucket(25.0, 5.0));
            set(c, "room", "admit_per_sec", 10.0);
            set(c, "room", "tick_ms", 100);
            set(c, "room", "heartbeat_secs", 1);
            set(c, "room", "hold_secs", 10);
        })
        .await;
    let gw = Arc::new(gw);
    let lead = Duration::from_millis(PRE_OPEN_MS + 3000);
    let mut results = Vec::new();
    for room in [true, false] {
        let sale = create_published_activity(
            &stack.stockd,
            &[(UNITS, 100)],
            2,
            lead,
            Duration::from_secs(3600),
        )
        .await;
        let open_at = tokio::time::Instant::now() + lead;
        let (a, s) = (sale.id, sale.items[0].id);
        gw.wait_activity(a).await;
        if room {
            let r = gw.room_knobs(a, json!({"method": "fifo"})).await;
            assert_eq!(r.status, 200, "{}", r.body);
        }
        let won = crowd(&gw, (a, s), room, open_at).await;
        println!(
            "fairness (room {}): humans {} units, bots {} units; humans' share of the units \
             {:.0} % (of the crowd {:.0} %), bots' share {:.0} % (of the crowd {:.0} %)",
            if room { "on, fifo" } else { "off" },
            won.humans,
            won.bots,
            won.human_share() * 100.0,
            HUMANS as f64 * 100.0 / (HUMANS + BOTS) as f64,
            won.bot_share() * 100.0,
            BOTS as f64 * 100.0 / (HUMANS + BOTS) as f64,
        );
        assert_eq!(won.humans + won.bots, UNITS as usize, "every unit sold");
        results.push(won);
    }
    let crowd_human_share = HUMANS as f64 / (HUMANS + BOTS) as f64;
    let crowd_bot_share = BOTS as f64 / (HUMANS + BOTS) as f64;
    let (on, off) = (&results[0], &results[1]);
    assert!(
        on.human_share() >= crowd_human_share,
        "room on: humans got {:.2} of the units, {:.2} of the crowd",
        on.human_share(),
        crowd_human_share
    );
    assert!(
        off.bot_share() > crowd_bot_share && off.bot_share() > on.bot_share(),
        "room off: bots got {:.2} of the units (room on {:.2}, crowd {:.2}): the test could not fail",
        off.bot_share(),
        on.bot_share(),
        crowd_bot_share
    );
}
