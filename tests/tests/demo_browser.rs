#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]
//! The sale page in a real headless Chromium: sign in, see the buy button greyed until
//! the server's opening time, buy, watch the order arrive over SSE, pay, and find the
//! order PAID in MySQL; solve the challenge in Web Workers; wait in the queue; and the
//! whole fair entry in one page (queue, then challenge, then buy).
//!
//! WebDriver is spoken directly over HTTP/JSON with reqwest (a dozen W3C endpoints)
//! rather than through `fantoccini`: its TLS features would add either OpenSSL or a second
//! rustls crypto backend (aws-lc, a C build) to the test crate, for a protocol that is
//! plain JSON to a local chromedriver.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`deploy/local/test.sh` installs them).
//! In CI (`CI` set to anything but `false` or `0`, as every CI service sets it) a browser
//! that is missing or cannot be started FAILS the test: a skipped browser test would be a
//! green run that checked nothing. Outside CI a missing browser only skips, loudly.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use seckill_tests::gateway::{set, GatewayHandle, Stack};
use seckill_tests::init_tracing;
use seckill_tests::process::free_port;
use seckill_tests::stockd::create_published_activity;
use serde_json::{json, Value};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn find_binary(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/lib/chromium")]) {
        for n in names {
            let p = dir.join(n);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// True when the test runs in CI (`CI=true`, as CI services and `.ci/run` set it): there
/// a browser that is missing or does not start is a failure, not a skip.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        let v = v.trim();
        !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false")
    })
}

/// chromedriver on a free port; killed on drop, with the Chromium it started.
struct Driver {
    child: Child,
    url: String,
    http: reqwest::Client,
    session: String,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The whole process group: Chromium outlives a killed chromedriver, and a test
        // that fails before `quit` would leave it running (with the page polling).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    async fn start(chromedriver: &Path, chromium: &Path) -> Self {
        let port = free_port(None);
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            // A group of its own, which the browser it starts joins (see `Drop`).
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let profile = tempfile::Builder::new()
            .prefix("seckill-chromium-")
            .tempdir()
            .expect("profile dir");
        let mut d = Driver {
            child,
            url,
            http,
            session: String::new(),
            _profile: profile,
        };
        let mut ready = false;
        for _ in 0..200 {
            if let Ok(r) = d.http.get(format!("{}/status", d.url)).send().await {
                if let Ok(v) = r.json::<Value>().await {
                    if v["value"]["ready"] == true {
                        ready = true;
                        break;
                    }
                }
            }
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!(
                    "chromedriver {} exited at start: {status}",
                    chromedriver.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            ready,
            "chromedriver {} never reported ready on {}",
            chromedriver.display(),
            d.url
        );
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                         "--no-first-run", "--disable-background-networking",
                         "--disable-component-update", "--disable-sync",
                         "--disable-dev-shm-usage",
                         format!("--user-data-dir={}", d._profile.path().display())]
            }
        }}});
        let v = d.post("/session", caps).await;
        d.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_owned();
        d
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let r = self
            .http
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send()
            .await
            .expect("webdriver call");
        let v: Value = r.json().await.expect("webdriver json");
        if v["value"].get("error").is_some() {
            panic!("webdriver {path}: {}", v["value"]);
        }
        v["value"].clone()
    }

    async fn get(&self, path: &str) -> Value {
        let v: Value = self
            .http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .expect("webdriver call")
            .json()
            .await
            .expect("webdriver json");
        v["value"].clone()
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    async fn goto(&self, url: &str) {
        self.post(&self.s("/url"), json!({ "url": url })).await;
    }

    async fn element(&self, css: &str) -> String {
        let v = self
            .post(
                &self.s("/element"),
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_owned()
    }

    async fn click(&self, css: &str) {
        let e = self.element(css).await;
        self.post(&self.s(&format!("/element/{e}/click")), json!({}))
            .await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        self.post(
            &self.s(&format!("/element/{e}/value")),
            json!({ "text": text }),
        )
        .await;
    }

    async fn text(&self, css: &str) -> String {
        let e = self.element(css).await;
        self.get(&self.s(&format!("/element/{e}/text")))
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    async fn enabled(&self, css: &str) -> bool {
        let e = self.element(css).await;
        self.get(&self.s(&format!("/element/{e}/enabled")))
            .await
            .as_bool()
            .unwrap_or(false)
    }

    async fn displayed(&self, css: &str) -> bool {
        let e = self.element(css).await;
        self.get(&self.s(&format!("/element/{e}/displayed")))
            .await
            .as_bool()
            .unwrap_or(false)
    }

    /// Runs `script` in the page (WebDriver "execute script", synchronous).
    async fn execute(&self, script: &str) {
        self.post(
            &self.s("/execute/sync"),
            json!({ "script": script, "args": [] }),
        )
        .await;
    }

    /// Puts the page's clock `ms` behind the real one from now on, as a late estimate
    /// of the server's clock would (the page takes the midpoint of a round trip, which
    /// a slow answer makes late by up to half of it). The room's places carry the
    /// server's time and must pull the estimate forward again: a place drawn at the
    /// opening never shows beside a countdown that still runs.
    async fn lag_clock(&self, ms: u64) {
        self.execute(&format!(
            "const now = Date.now.bind(Date); Date.now = () => now() - {ms};"
        ))
        .await;
    }

    /// Polls `css`'s text until `pred` holds, at most `secs`.
    async fn wait_text(&self, css: &str, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        for _ in 0..secs * 10 {
            last = self.text(css).await;
            if pred(&last) {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css} never matched; last text: {last:?}");
    }

    /// Opens `gw`'s sale page, waits for the activity titled `title` and signs in as
    /// `user`.
    async fn sign_in(&self, gw: &GatewayHandle, title: &str, user: &str) {
        self.goto(&format!("{}/", gw.base_url())).await;
        self.wait_text("#title", 20, |t| t.contains(title)).await;
        self.type_into("#user", user).await;
        self.click("#login").await;
        self.wait_text("#status", 20, |t| {
            t.contains(&format!("Signed in as {user}"))
        })
        .await;
    }

    /// Polls until `css` is enabled, at most `secs`; false when it never was.
    async fn wait_enabled(&self, css: &str, secs: u64) -> bool {
        for _ in 0..secs * 10 {
            if self.enabled(css).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// The progress indicator of the challenge: (value, max) of `#pow-bar`.
    async fn pow_progress(&self) -> (Value, Value) {
        let bar = self.element("#pow-bar").await;
        let value = self
            .get(&self.s(&format!("/element/{bar}/property/value")))
            .await;
        let max = self
            .get(&self.s(&format!("/element/{bar}/property/max")))
            .await;
        (value, max)
    }

    /// Resizes the window (the default headless one cuts the page below the room).
    async fn window_size(&self, width: u32, height: u32) {
        self.post(
            &self.s("/window/rect"),
            json!({"width": width, "height": height}),
        )
        .await;
    }

    /// Saves a PNG screenshot of the page to `path`.
    async fn screenshot(&self, path: &Path) {
        use base64::Engine as _;
        let v = self.get(&self.s("/screenshot")).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("screenshot is base64"))
            .expect("screenshot base64");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("artefact dir");
        }
        std::fs::write(path, png).expect("write screenshot");
        eprintln!("screenshot: {}", path.display());
    }

    async fn quit(&self) {
        let _ = self
            .http
            .delete(format!("{}{}", self.url, self.s("")))
            .send()
            .await;
    }
}

/// chromium and chromedriver, or `None` when one is missing outside CI (the caller then
/// skips, loudly); in CI a missing browser fails the test.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let (Some(chromium), Some(chromedriver)) = (
        find_binary(&["chromium", "chromium-browser"]),
        find_binary(&["chromedriver"]),
    ) else {
        let why = "chromium and chromium-driver are not installed \
                   (apt-get install chromium chromium-driver; deploy/local/test.sh does it)";
        assert!(
            !in_ci(),
            "CI is set, so the browser test may not skip: {why}"
        );
        eprintln!("\n*** SKIPPED the browser test: {why} ***\n");
        return None;
    };
    Some((chromium, chromedriver))
}

async fn wait_ready(gw: &GatewayHandle) {
    let url = format!("{}/readyz", gw.admin_url());
    for _ in 0..300 {
        if matches!(reqwest::get(&url).await, Ok(r) if r.status() == 200) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("gateway never ready; its log:\n{}", gw.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_in_headless_chromium_waits_for_the_opening_buys_pays_and_the_order_is_paid_in_mysql(
) {
    init_tracing();
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };

    let stack = Stack::start().await;
    let gw = stack
        .gateway_unready(|c| {
            set(c, "dev", "token_ttl_secs", 3600);
        })
        .await;
    let Stack {
        redis: _redis,
        db,
        stockd,
        orderd: _orderd,
    } = stack;
    wait_ready(&gw).await;
    // Opens in 8 s: long enough to see the greyed button and the countdown.
    let sale = create_published_activity(
        &stockd,
        &[(5, 4900)],
        2,
        Duration::from_secs(8),
        Duration::from_secs(3600),
    )
    .await;
    gw.wait_activity(sale.id).await;

    let d = Driver::start(&chromedriver, &chromium).await;
    d.sign_in(&gw, "test sale", "browser-alice").await;

    // Before the opening: a countdown and a greyed button.
    let countdown = d.text("#countdown").await;
    assert!(
        countdown.contains(':'),
        "a countdown before the opening, got {countdown:?}"
    );
    assert!(!d.enabled("#buy").await, "buy is greyed before the opening");

    // The server's opening time arrives: the button wakes up.
    assert!(
        d.wait_enabled("#buy", 30).await,
        "buy never enabled; countdown {:?}",
        d.text("#countdown").await
    );
    assert_eq!(d.text("#countdown").await, "OPEN");

    d.click("#buy").await;
    // Reserved, then the order arrives in MySQL and is pushed over SSE.
    let status = d
        .wait_text("#status", 30, |t| {
            t.contains("waiting for payment") || t.contains("Sold out") || t.contains("HTTP")
        })
        .await;
    assert!(
        status.contains("waiting for payment"),
        "the order should be pending payment: {status:?}"
    );
    assert!(d.displayed("#pay").await, "the pay button shows");
    d.click("#pay").await;
    d.wait_text("#status", 30, |t| t.contains("Paid")).await;
    let order_line = d.text("#order").await;
    assert!(order_line.contains("PAID"), "{order_line:?}");
    d.quit().await;

    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT id, status FROM orders WHERE user_id = ? AND activity_id = ?")
            .bind("browser-alice")
            .bind(sale.id)
            .fetch_all(db.pool())
            .await
            .expect("orders");
    assert_eq!(rows.len(), 1, "one order for the browser's user: {rows:?}");
    assert_eq!(rows[0].1, "PAID");
    assert!(
        order_line.contains(&rows[0].0),
        "the page shows the MySQL order id"
    );
}

/// Bits per sub-puzzle of the browser's challenge: the shipped recommendation
/// (docs/gateway.md), so this run also shows the page copes with it in a debug stack.
const BROWSER_CHALLENGE_BITS: u32 = 14;

/// Creates and publishes an activity titled `title` (one item, 5 units at 49.00, one
/// per user) whose buyers solve a challenge of `challenge_bits` per sub-puzzle; it opens
/// `opens_in_ms` from now (negative: already open) and lasts an hour. Returns its id.
async fn create_challenge_activity(
    stack: &Stack,
    title: &str,
    opens_in_ms: i64,
    challenge_bits: u32,
) -> u64 {
    let mut admin = stack.stockd.admin_client().await;
    let now = seckill_lua::clock::now_ms();
    let created = admin
        .create_activity(seckill_proto::pb::CreateActivityRequest {
            title: title.into(),
            start_at_ms: now + opens_in_ms,
            end_at_ms: now + 3_600_000,
            shard_count: 2,
            per_user_limit: 1,
            items: vec![seckill_proto::pb::ItemSpec {
                title: "phone".into(),
                price_cents: 9800,
                sale_price_cents: 4900,
                stock: 5,
            }],
            challenge_bits,
            redis_cluster: String::new(),
        })
        .await
        .expect("create")
        .into_inner();
    admin
        .publish_activity(seckill_proto::pb::PublishActivityRequest {
            activity_id: created.id,
            publish_at_ms: 0,
        })
        .await
        .expect("publish");
    created.id
}

/// The challenge's progress indicator shows and ran to the end: all `sub_puzzles`.
async fn assert_challenge_solved(d: &Driver, sub_puzzles: u32) {
    assert!(d.displayed("#pow").await, "the progress shows");
    assert_eq!(d.text("#pow-text").await, "Challenge solved.");
    let (value, max) = d.pow_progress().await;
    assert_eq!(
        (value.clone(), max),
        (json!(sub_puzzles), json!(sub_puzzles)),
        "{value}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_in_headless_chromium_solves_the_challenge_in_a_worker_and_buys() {
    init_tracing();
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let stack = Stack::start().await;
    let gw = stack.gateway_unready(|_| {}).await;
    wait_ready(&gw).await;
    let created_id = create_challenge_activity(
        &stack,
        "test sale with a challenge",
        -1000,
        BROWSER_CHALLENGE_BITS,
    )
    .await;
    gw.wait_activity(created_id).await;

    let d = Driver::start(&chromedriver, &chromium).await;
    d.sign_in(&gw, "with a challenge", "browser-pow").await;
    assert!(d.wait_enabled("#buy", 10).await, "buy opens");
    d.click("#buy").await;
    let status = d
        .wait_text("#status", 120, |t| {
            t.contains("waiting for payment")
                || t.contains("refused")
                || t.contains("failed")
                || t.contains("HTTP")
        })
        .await;
    assert!(
        status.contains("waiting for payment"),
        "the order should be pending payment: {status:?}"
    );
    // The progress indicator ran to the end (the default `challenge.sub_puzzles`).
    assert_challenge_solved(&d, 32).await;
    // A screenshot as the test's artefact.
    let png = d.get(&d.s("/screenshot")).await;
    if let Some(b64) = png.as_str() {
        use base64::Engine as _;
        if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(b64) {
            let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("challenge-browser.png");
            let _ = std::fs::write(&path, bytes);
            eprintln!("screenshot: {}", path.display());
        }
    }
    d.quit().await;
    // The token route refuses this activity without a solved puzzle: an order means the
    // page's solution was accepted.
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT id FROM orders WHERE user_id = ? AND activity_id = ?")
            .bind("browser-pow")
            .bind(created_id)
            .fetch_all(stack.db.pool())
            .await
            .expect("orders");
    assert_eq!(rows.len(), 1, "one order for the browser's user: {rows:?}");
}

/// Pauses `gw`'s room of activity `a` (nobody is admitted until the test unpauses it)
/// and has `ahead` other buyers join it through the API.
async fn pause_room_with_buyers_in_it(gw: &GatewayHandle, a: u64, ahead: usize) {
    gw.room_pause(a, true).await;
    let now = seckill_lua::clock::now_ms() as u64;
    for i in 0..ahead {
        let jwt = gw.jwt(&format!("ahead-{i}"), 3600, now);
        assert_eq!(gw.room_join(&jwt, a, None).await.status, 200);
    }
}

/// Screenshots of this suite go here (`target/test-artefacts/`).
fn artefact(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/test-artefacts")
        .join(name)
}

/// The waiting room in the page: a buyer who signs in before the opening is in the
/// pre-queue with the countdown running; at the opening the page shows the drawn
/// position live (SSE) with Buy greyed; once the room admits them, Buy opens and the
/// purchase goes through. Screenshots: `room_prequeue.png`, `room_queue.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_in_headless_chromium_waits_in_the_queue_then_buys_once_admitted() {
    init_tracing();
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let stack = Stack::start().await;
    let gw = stack
        .gateway_unready(|c| {
            set(c, "room", "method", "fifo");
            set(c, "room", "admit_per_sec", 5.0);
            set(c, "room", "tick_ms", 100);
        })
        .await;
    wait_ready(&gw).await;
    let sale = create_published_activity(
        &stack.stockd,
        &[(5, 4900)],
        2,
        Duration::from_secs(12),
        Duration::from_secs(3600),
    )
    .await;
    let a = sale.id;
    gw.wait_activity(a).await;
    // Nobody is admitted until the test says so; three buyers join before the browser.
    pause_room_with_buyers_in_it(&gw, a, 3).await;

    let d = Driver::start(&chromedriver, &chromium).await;
    d.sign_in(&gw, "test sale", "queue-bob").await;
    d.wait_text("#room-position", 20, |t| t.contains("In line"))
        .await;
    assert!(d.displayed("#room").await);
    assert!(
        d.text("#countdown").await.contains(':'),
        "the countdown runs"
    );
    assert!(!d.enabled("#buy").await);
    d.screenshot(&artefact("room_prequeue.png")).await;
    d.lag_clock(1500).await;

    // The opening: the pre-queue is drawn, the page shows the place.
    let pos = d
        .wait_text("#room-position", 40, |t| t.contains("Position in queue"))
        .await;
    let n: u64 = pos.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((1..=4).contains(&n), "{pos}");
    assert_eq!(d.text("#countdown").await, "OPEN");
    assert!(!d.enabled("#buy").await, "buy stays greyed while queued");
    d.screenshot(&artefact("room_queue.png")).await;

    gw.room_pause(a, false).await;
    d.wait_text("#room-position", 40, |t| t.contains("Your turn"))
        .await;
    assert!(d.wait_enabled("#buy", 5).await, "buy opens once admitted");
    d.click("#buy").await;
    let status = d
        .wait_text("#status", 30, |t| {
            t.contains("waiting for payment") || t.contains("queue") || t.contains("HTTP")
        })
        .await;
    assert!(status.contains("waiting for payment"), "{status:?}");
    d.quit().await;
    assert_eq!(stack.reservations_seen_by_stockd(), 1);
}

/// Bits per sub-puzzle of the fair-entry test: the default ceiling `challenge.max_bits`.
const FAIR_ENTRY_CHALLENGE_BITS: u32 = 16;
/// Sub-puzzles of the fair-entry test (`challenge.sub_puzzles`): 128 × 2^16 ≈ 8.4 M
/// hashes, so that even a fast machine's solve lasts long enough to be caught
/// part-way (the default 32 took about 0.5 s in headless Chromium on 2 shared cores).
const FAIR_ENTRY_SUB_PUZZLES: u32 = 128;

/// The whole fair entry in one page: the activity asks a challenge AND its room queues
/// (fifo). A buyer who signs in before the opening is in the pre-queue with the
/// countdown running; at the opening the page shows the drawn position, Buy greyed and
/// no puzzle (the room comes before the challenge); once the room admits them, Buy
/// solves the challenge in Web Workers (the progress bar caught part-way), gets the
/// purchase token with the admission and the solution, and reserves: one order in
/// MySQL, one reservation at stockd. Screenshots: `fair_entry_prequeue.png`,
/// `fair_entry_queue.png`, `fair_entry_solving.png`, `fair_entry_bought.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_in_headless_chromium_queues_then_solves_the_challenge_then_buys() {
    init_tracing();
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let stack = Stack::start().await;
    let gw = stack
        .gateway_unready(|c| {
            set(c, "room", "method", "fifo");
            set(c, "room", "admit_per_sec", 5.0);
            set(c, "room", "tick_ms", 100);
            set(c, "challenge", "sub_puzzles", FAIR_ENTRY_SUB_PUZZLES as i64);
        })
        .await;
    wait_ready(&gw).await;
    let a = create_challenge_activity(&stack, "fair entry sale", 12_000, FAIR_ENTRY_CHALLENGE_BITS)
        .await;
    gw.wait_activity(a).await;
    pause_room_with_buyers_in_it(&gw, a, 2).await;

    let d = Driver::start(&chromedriver, &chromium).await;
    // Tall enough for the room and the challenge's progress in one screenshot.
    d.window_size(800, 1000).await;
    d.sign_in(&gw, "fair entry sale", "fair-carol").await;
    d.wait_text("#room-position", 20, |t| t.contains("In line"))
        .await;
    assert!(
        d.text("#countdown").await.contains(':'),
        "the countdown runs"
    );
    assert!(!d.enabled("#buy").await);
    d.screenshot(&artefact("fair_entry_prequeue.png")).await;
    d.lag_clock(1500).await;

    // The opening: the place is drawn and shown; still no way to buy, no puzzle.
    let pos = d
        .wait_text("#room-position", 40, |t| t.contains("Position in queue"))
        .await;
    let n: u64 = pos.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((1..=3).contains(&n), "{pos}");
    assert_eq!(d.text("#countdown").await, "OPEN");
    assert!(!d.enabled("#buy").await, "buy stays greyed while queued");
    assert!(!d.displayed("#pow").await, "no puzzle before admission");
    d.screenshot(&artefact("fair_entry_queue.png")).await;

    gw.room_pause(a, false).await;
    d.wait_text("#room-position", 40, |t| t.contains("Your turn"))
        .await;
    assert!(d.wait_enabled("#buy", 5).await, "buy opens once admitted");
    d.click("#buy").await;

    // The workers at work: the progress text reads "… N %" (WebDriver gives no text for
    // a hidden element, so this also says the indicator is on screen).
    let mut solving = None;
    for _ in 0..1200 {
        let t = d.text("#pow-text").await;
        if t.starts_with("Checking you are not a bot") {
            d.screenshot(&artefact("fair_entry_solving.png")).await;
            solving = Some(t);
            break;
        }
        if t == "Challenge solved." {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let solving = solving.expect("the challenge was never seen being solved");
    let percent: u32 = solving
        .trim_end_matches(" %")
        .rsplit(' ')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no percentage in {solving:?}"));
    assert!(percent < 100, "caught part-way: {solving:?}");

    let status = d
        .wait_text("#status", 120, |t| {
            t.contains("waiting for payment")
                || t.contains("refused")
                || t.contains("failed")
                || t.contains("queue")
                || t.contains("HTTP")
        })
        .await;
    assert!(
        status.contains("waiting for payment"),
        "the order should be pending payment: {status:?}"
    );
    assert_challenge_solved(&d, FAIR_ENTRY_SUB_PUZZLES).await;
    let order_line = d.text("#order").await;
    d.screenshot(&artefact("fair_entry_bought.png")).await;
    d.quit().await;

    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT id, status FROM orders WHERE user_id = ? AND activity_id = ?")
            .bind("fair-carol")
            .bind(a)
            .fetch_all(stack.db.pool())
            .await
            .expect("orders");
    assert_eq!(rows.len(), 1, "one order for the browser's user: {rows:?}");
    assert_eq!(rows[0].1, "PENDING", "the order waits for payment");
    assert!(
        order_line.contains(&rows[0].0),
        "the page shows the MySQL order id: {order_line:?}"
    );
    assert_eq!(stack.reservations_seen_by_stockd(), 1);
}
