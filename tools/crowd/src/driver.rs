//! The crowd itself: logins before the opening, then buyers arriving at a set rate, each
//! doing what a person does: get a purchase token, reserve, retry (same request id) on
//! 429/503/transport errors, sometimes click twice, sometimes resend after a "lost"
//! response; plus a few abusive IPs hammering the reserve route and ignoring Retry-After.
//!
//! Every answer of the token and reserve routes goes into [`Stats`]; every 202 goes into
//! the holdings, from which the client-side checks come (two distinct reservations for
//! one user and item, a retry with the same request id answered with another id).
//!
//! (Over 400 lines: one buyer's behaviour, the bots and the run loop share the plan
//! and the counters; split, each part would be a fragment of one state machine.)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::http::{now_ms, Answer, Door, EdgeActivity};
use crate::stats::{Kind, Stats};

/// What the crowd does; filled from the command line.
#[derive(Debug, Clone)]
pub struct Plan {
    pub gateway: String,
    /// Arrivals per second.
    pub rate: f64,
    /// Buyers in flight at most.
    pub concurrency: usize,
    /// Retries per buyer after a retryable answer.
    pub retries: u32,
    /// Cap on one pause, ms (Retry-After is honoured up to this).
    pub retry_max_wait_ms: u64,
    /// Fraction of buyers who click twice (a second reserve, another request id).
    pub double_click: f64,
    /// Fraction of reserved buyers who resend the same request (a lost response).
    pub lost_response: f64,
    /// Requests per abusive IP.
    pub abuse_requests: u32,
    pub items: Vec<u64>,
    pub seed: u64,
    /// Keep every answer's send time, latency and kind (`Stats::each_answer`).
    pub keep_answers: bool,
}

/// Who holds a reservation, with what it takes to act as them (pay).
#[derive(Debug, Clone)]
pub struct Holder {
    pub user: String,
    pub item: u64,
    pub jwt: String,
    /// The holder's source address.
    pub door: Door,
}

/// The result of the crowd phase.
#[derive(Debug, Default)]
pub struct CrowdResult {
    pub stats: Stats,
    /// Every reservation id answered 202, with its holder.
    pub reserved: BTreeMap<String, Holder>,
    /// (user, item) pairs that got two distinct reservation ids.
    pub client_duplicates: BTreeSet<(String, u64)>,
    /// Retries with the same request id answered with a different reservation id.
    pub idempotency_violations: u64,
    /// Wall time of the crowd phase.
    pub elapsed: Duration,
    pub login_requests: u64,
    pub login_failures: u64,
    /// Buyers who had no JWT (login failed) and so never clicked.
    pub buyers_without_login: u64,
    /// What the `errors` answers were, counted.
    pub error_samples: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Shared {
    stats: Mutex<Stats>,
    holdings: Mutex<Holdings>,
    counts: [AtomicU64; Kind::ALL.len()],
    /// What the `errors` answers were: "status code" or the transport error, counted.
    errors: Mutex<BTreeMap<String, u64>>,
}

#[derive(Default)]
struct Holdings {
    reserved: BTreeMap<String, Holder>,
    by_pair: BTreeMap<(String, u64), BTreeSet<String>>,
    idempotency_violations: u64,
}

impl Shared {
    fn record(&self, a: &Answer, start: Instant) -> Kind {
        let kind = a.kind();
        let at = start.elapsed().saturating_sub(a.latency);
        self.stats
            .lock()
            .expect("stats lock")
            .record(kind, a.latency, at);
        if let Some(i) = Kind::ALL.iter().position(|k| *k == kind) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        if kind == Kind::Errors {
            let what = match (a.status, &a.error) {
                (Some(s), _) => format!("HTTP {s} {}", a.code().unwrap_or("")),
                (None, Some(e)) => format!("transport: {e}"),
                (None, None) => "transport".to_string(),
            };
            *self
                .errors
                .lock()
                .expect("errors lock")
                .entry(what)
                .or_insert(0) += 1;
        }
        kind
    }

    fn count(&self, k: Kind) -> u64 {
        Kind::ALL
            .iter()
            .position(|x| *x == k)
            .map_or(0, |i| self.counts[i].load(Ordering::Relaxed))
    }

    fn hold(&self, id: &str, holder: &Holder) {
        let mut h = self.holdings.lock().expect("holdings lock");
        h.reserved
            .entry(id.to_owned())
            .or_insert_with(|| holder.clone());
        h.by_pair
            .entry((holder.user.clone(), holder.item))
            .or_default()
            .insert(id.to_owned());
    }
}

/// Pauses before a retry; false when the buyer has no retries left.
async fn pause(
    attempts: &mut u32,
    plan: &Plan,
    retry_after: Option<u64>,
    rng: &mut StdRng,
) -> bool {
    *attempts += 1;
    if *attempts > plan.retries {
        return false;
    }
    let backoff = retry_after
        .map(|s| s * 1000)
        .unwrap_or(50u64 << (*attempts).min(6));
    let jitter = rng.random_range(0..=backoff / 4 + 1);
    let ms = (backoff + jitter).min(plan.retry_max_wait_ms);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    true
}

async fn wait_for_open(act: &EdgeActivity) {
    let left = act.start_at_ms - (now_ms() + act.skew_ms);
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left as u64)).await;
    }
}

/// Gets a JWT for every user from `POST /api/v1/dev/token`, `concurrency` at a time.
/// Failed logins leave `None`.
pub async fn login_all(
    doors: &[Door],
    gateway: &str,
    users: &[String],
    concurrency: usize,
    pb: &ProgressBar,
) -> (Vec<Option<String>>, u64, u64) {
    let sem = Arc::new(Semaphore::new(concurrency.max(1)));
    let requests = Arc::new(AtomicU64::new(0));
    let url = format!("{gateway}/api/v1/dev/token");
    let mut tasks = Vec::with_capacity(users.len());
    for (i, user) in users.iter().enumerate() {
        let permit = sem.clone().acquire_owned().await.expect("semaphore open");
        let door = doors[i % doors.len()].clone();
        let (url, user, pb, requests) = (url.clone(), user.clone(), pb.clone(), requests.clone());
        tasks.push(tokio::spawn(async move {
            let body = json!({ "user_id": user });
            let mut out = None;
            for attempt in 0..8u32 {
                requests.fetch_add(1, Ordering::Relaxed);
                let a = door.call(Method::POST, &url, None, Some(&body)).await;
                if a.status == Some(200) {
                    out = a.str_field("token").map(str::to_owned);
                    break;
                }
                if !a.kind().retryable() {
                    break;
                }
                let wait = a.retry_after.map_or(50 << attempt, |s| s * 1000).min(1_000);
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            pb.inc(1);
            drop(permit);
            out
        }));
    }
    let mut jwts = Vec::with_capacity(users.len());
    let mut failures = 0;
    for t in tasks {
        let j = t.await.ok().flatten();
        if j.is_none() {
            failures += 1;
        }
        jwts.push(j);
    }
    (jwts, requests.load(Ordering::Relaxed), failures)
}

/// One abusive IP with its user.
#[derive(Debug, Clone)]
pub struct Bot {
    pub door: Door,
    pub user: String,
    pub jwt: Option<String>,
}

struct Buyer {
    user: String,
    jwt: String,
    item: u64,
    door: Door,
    double_click: bool,
    lost_response: bool,
    seed: u64,
}

async fn reserve(
    sh: &Shared,
    start: Instant,
    b: &Buyer,
    url: &str,
    token: &str,
    request_id: &str,
) -> (Kind, Answer) {
    let body = json!({ "purchase_token": token, "request_id": request_id });
    let a = b
        .door
        .call(Method::POST, url, Some(&b.jwt), Some(&body))
        .await;
    let k = sh.record(&a, start);
    (k, a)
}

async fn buy(sh: Arc<Shared>, plan: Arc<Plan>, act: Arc<EdgeActivity>, start: Instant, b: Buyer) {
    let mut rng = StdRng::seed_from_u64(b.seed);
    let base = format!(
        "{}/api/v1/activities/{}/items/{}",
        plan.gateway, act.id, b.item
    );
    let (token_url, reserve_url) = (format!("{base}/token"), format!("{base}/reserve"));
    let holder = Holder {
        user: b.user.clone(),
        item: b.item,
        jwt: b.jwt.clone(),
        door: b.door.clone(),
    };
    let request_id = format!("{}-{}", b.user, b.item);
    let mut attempts = 0u32;
    let mut second_click = None;
    'token: loop {
        let a = b
            .door
            .call(Method::POST, &token_url, Some(&b.jwt), None)
            .await;
        match sh.record(&a, start) {
            Kind::Token => {}
            Kind::TooEarly => {
                wait_for_open(&act).await;
                if !pause(&mut attempts, &plan, Some(0), &mut rng).await {
                    break;
                }
                continue;
            }
            k if k.retryable() => {
                if !pause(&mut attempts, &plan, a.retry_after, &mut rng).await {
                    break;
                }
                continue;
            }
            _ => break,
        }
        let Some(token) = a.str_field("purchase_token").map(str::to_owned) else {
            break;
        };
        if b.double_click && second_click.is_none() {
            // The impatient second click: same token, its own request id, at once.
            let (sh2, url2, tok2) = (sh.clone(), reserve_url.clone(), token.clone());
            let (b2, holder2) = (
                Buyer {
                    door: b.door.clone(),
                    user: b.user.clone(),
                    jwt: b.jwt.clone(),
                    ..b
                },
                holder.clone(),
            );
            let rid2 = format!("{request_id}-again");
            second_click = Some(tokio::spawn(async move {
                let (k, a) = reserve(&sh2, start, &b2, &url2, &tok2, &rid2).await;
                if k == Kind::Reserved {
                    if let Some(id) = a.str_field("reservation_id") {
                        sh2.hold(id, &holder2);
                    }
                }
            }));
        }
        loop {
            let (k, a) = reserve(&sh, start, &b, &reserve_url, &token, &request_id).await;
            match k {
                Kind::Reserved => {
                    let Some(id) = a.str_field("reservation_id").map(str::to_owned) else {
                        break 'token;
                    };
                    sh.hold(&id, &holder);
                    if b.lost_response {
                        // The answer "got lost": the client resends the very same request.
                        let (k2, a2) =
                            reserve(&sh, start, &b, &reserve_url, &token, &request_id).await;
                        if k2 == Kind::Reserved && a2.str_field("reservation_id") != Some(&id) {
                            sh.holdings
                                .lock()
                                .expect("holdings lock")
                                .idempotency_violations += 1;
                            if let Some(other) = a2.str_field("reservation_id") {
                                sh.hold(other, &holder);
                            }
                        }
                    }
                    break 'token;
                }
                Kind::BadToken => {
                    // Expired or refused token: fetch a new one (counts as a retry).
                    if !pause(&mut attempts, &plan, Some(0), &mut rng).await {
                        break 'token;
                    }
                    continue 'token;
                }
                Kind::TooEarly => {
                    wait_for_open(&act).await;
                    if !pause(&mut attempts, &plan, Some(0), &mut rng).await {
                        break 'token;
                    }
                }
                k if k.retryable() => {
                    if !pause(&mut attempts, &plan, a.retry_after, &mut rng).await {
                        break 'token;
                    }
                }
                _ => break 'token,
            }
        }
    }
    if let Some(t) = second_click {
        let _ = t.await;
    }
}

/// A bot on one abusive IP: token, reserve, again, as fast as it can, ignoring
/// Retry-After and refusals, `requests` times.
async fn abuse(sh: Arc<Shared>, plan: Arc<Plan>, act: Arc<EdgeActivity>, start: Instant, bot: Bot) {
    let Bot { door, user, jwt } = bot;
    let requests = plan.abuse_requests;
    let item = plan.items[0];
    let base = format!("{}/api/v1/activities/{}/items/{item}", plan.gateway, act.id);
    let mut token = String::from("forged");
    let mut sent = 0;
    while sent < requests {
        let a = door
            .call(Method::POST, &format!("{base}/token"), jwt.as_deref(), None)
            .await;
        sh.record(&a, start);
        sent += 1;
        if let Some(t) = a.str_field("purchase_token") {
            token = t.to_owned();
        }
        let body = json!({ "purchase_token": token, "request_id": format!("bot-{sent}") });
        let a = door
            .call(
                Method::POST,
                &format!("{base}/reserve"),
                jwt.as_deref(),
                Some(&body),
            )
            .await;
        let k = sh.record(&a, start);
        sent += 1;
        if k == Kind::Reserved {
            if let Some(id) = a.str_field("reservation_id") {
                if let Some(jwt) = &jwt {
                    let holder = Holder {
                        user: user.clone(),
                        item,
                        jwt: jwt.clone(),
                        door: door.clone(),
                    };
                    sh.hold(id, &holder);
                }
            }
        }
    }
}

/// A one-line summary for the progress bar and the non-terminal progress lines.
fn summary(sh: &Shared) -> String {
    format!(
        "reserved {} · sold out {} · limited {} · busy {} · dup {} · banned {} · errors {}",
        sh.count(Kind::Reserved),
        sh.count(Kind::SoldOut),
        sh.count(Kind::Limited),
        sh.count(Kind::Busy),
        sh.count(Kind::Duplicate),
        sh.count(Kind::Banned),
        sh.count(Kind::Errors) + sh.count(Kind::Unavailable),
    )
}

/// Runs the crowd: waits for the opening, then releases buyers at `plan.rate` per second
/// (at most `plan.concurrency` in flight) while the abusers hammer. `jwts[i]` belongs
/// to `users[i]`, who comes from `doors[i % doors.len()]`.
pub async fn run(
    plan: Plan,
    act: EdgeActivity,
    doors: &[Door],
    users: &[String],
    jwts: Vec<Option<String>>,
    bots: Vec<Bot>,
    pb: ProgressBar,
) -> CrowdResult {
    let plan = Arc::new(plan);
    let act = Arc::new(act);
    let stats = if plan.keep_answers {
        Stats::keeping_answers()
    } else {
        Stats::new()
    };
    let sh = Arc::new(Shared {
        stats: Mutex::new(stats),
        ..Shared::default()
    });
    let mut rng = StdRng::seed_from_u64(plan.seed);

    wait_for_open(&act).await;
    let start = Instant::now();
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} crowd [{elapsed_precise}] {bar:30} {pos}/{len} buyers · {per_sec} · {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_length(users.len() as u64);
    pb.set_position(0);
    pb.reset_elapsed();

    // Progress: the bar on a terminal, a line every 5 s elsewhere (CI logs).
    let ticker = {
        let (sh, pb) = (sh.clone(), pb.clone());
        tokio::spawn(async move {
            let mut last_line = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                pb.set_message(summary(&sh));
                if pb.is_hidden() && last_line.elapsed() >= Duration::from_secs(5) {
                    last_line = Instant::now();
                    eprintln!(
                        "crowd: {}/{} buyers started · {}",
                        pb.position(),
                        pb.length().unwrap_or(0),
                        summary(&sh)
                    );
                }
            }
        })
    };

    let abusers: Vec<_> = bots
        .into_iter()
        .map(|bot| tokio::spawn(abuse(sh.clone(), plan.clone(), act.clone(), start, bot)))
        .collect();

    let sem = Arc::new(Semaphore::new(plan.concurrency.max(1)));
    let mut tasks = Vec::with_capacity(users.len());
    let mut without_login = 0u64;
    for (i, (user, jwt)) in users.iter().zip(jwts).enumerate() {
        let due = start + Duration::from_secs_f64(i as f64 / plan.rate.max(0.001));
        tokio::time::sleep_until(due.into()).await;
        let Some(jwt) = jwt else {
            without_login += 1;
            pb.inc(1);
            continue;
        };
        let permit = sem.clone().acquire_owned().await.expect("semaphore open");
        let b = Buyer {
            user: user.clone(),
            jwt,
            item: plan.items[rng.random_range(0..plan.items.len())],
            door: doors[i % doors.len()].clone(),
            double_click: rng.random_bool(plan.double_click.clamp(0.0, 1.0)),
            lost_response: rng.random_bool(plan.lost_response.clamp(0.0, 1.0)),
            seed: rng.random(),
        };
        let (sh, plan, act, pb) = (sh.clone(), plan.clone(), act.clone(), pb.clone());
        tasks.push(tokio::spawn(async move {
            buy(sh, plan, act, start, b).await;
            pb.inc(1);
            drop(permit);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    for a in abusers {
        let _ = a.await;
    }
    ticker.abort();
    pb.set_message(summary(&sh));
    pb.finish();
    let elapsed = start.elapsed();

    let _ = ticker.await;
    let holdings = std::mem::take(&mut *sh.holdings.lock().expect("holdings lock"));
    let stats = std::mem::take(&mut *sh.stats.lock().expect("stats lock"));
    let error_samples = std::mem::take(&mut *sh.errors.lock().expect("errors lock"));
    let client_duplicates = holdings
        .by_pair
        .into_iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|(pair, _)| pair)
        .collect();
    CrowdResult {
        stats,
        error_samples,
        reserved: holdings.reserved,
        client_duplicates,
        idempotency_violations: holdings.idempotency_violations,
        elapsed,
        login_requests: 0,
        login_failures: 0,
        buyers_without_login: without_login,
    }
}
