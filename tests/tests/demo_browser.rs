#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]
//! The sale page in a real headless Chromium: sign in, see the buy button greyed until
//! the server's opening time, buy, watch the order arrive over SSE, pay, and find the
//! order PAID in MySQL.
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

/// chromedriver on a free port; killed on drop.
struct Driver {
    child: Child,
    url: String,
    http: reqwest::Client,
    session: String,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    async fn start(chromedriver: &Path, chromium: &Path) -> Self {
        let port = free_port(None);
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
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

    async fn quit(&self) {
        let _ = self
            .http
            .delete(format!("{}{}", self.url, self.s("")))
            .send()
            .await;
    }
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
    d.goto(&format!("{}/", gw.base_url())).await;
    d.wait_text("#title", 20, |t| t.contains("test sale")).await;
    d.type_into("#user", "browser-alice").await;
    d.click("#login").await;
    d.wait_text("#status", 20, |t| t.contains("Signed in as browser-alice"))
        .await;

    // Before the opening: a countdown and a greyed button.
    let countdown = d.text("#countdown").await;
    assert!(
        countdown.contains(':'),
        "a countdown before the opening, got {countdown:?}"
    );
    assert!(!d.enabled("#buy").await, "buy is greyed before the opening");

    // The server's opening time arrives: the button wakes up.
    let mut open = false;
    for _ in 0..300 {
        if d.enabled("#buy").await {
            open = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        open,
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
