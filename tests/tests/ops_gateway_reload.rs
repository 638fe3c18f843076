//! SIGHUP reload of a running gateway beyond the policy sections (docs/gateway.md,
//! "Reload"): `limits.max_tracked` bounds the per-IP buckets from the next new clients
//! on, `server.access_log` turns the access log off, and a field that needs a restart
//! (an upstream deadline) is named in a warning. Needs `cargo build -p gateway --bins`.
#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]

use std::time::Duration;

use seckill_tests::gateway::{set, GatewayHandle, Stack};
use seckill_tests::process::wait_until_async;

/// `GET /api/v1/activities` from `n` distinct client addresses, each named by
/// `X-Forwarded-For` (the harness is a trusted proxy), starting at `first`.
async fn from_many_clients(gw: &GatewayHandle, first: u32, n: u32) {
    let http = reqwest::Client::new();
    let url = format!("{}/api/v1/activities", gw.base_url());
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..8 {
        let (http, url) = (http.clone(), url.clone());
        tasks.spawn(async move {
            for k in (first + lane..first + n).step_by(8) {
                let ip = std::net::Ipv4Addr::from(0x0a00_0000 + k);
                let r = http
                    .get(&url)
                    .header("x-forwarded-for", ip.to_string())
                    .send()
                    .await
                    .expect("GET /api/v1/activities");
                assert_eq!(r.status(), 200, "{ip}");
            }
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
}

async fn tracked_ips(gw: &GatewayHandle) -> u64 {
    let text = gw.metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix("gateway_tracked_ips "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn access_lines(gw: &GatewayHandle) -> usize {
    access_lines_in(&gw.log())
}

fn access_lines_in(log: &str) -> usize {
    // One access line per request; `micros` is a field of those lines only.
    log.lines().filter(|l| l.contains("micros")).count()
}

/// `/32` of the harness trusted as a proxy, so `X-Forwarded-For` names the clients.
fn trust_the_harness(c: &mut gateway::toml::Table) {
    set(
        c,
        "bans",
        "trusted_proxies",
        vec!["127.0.0.1/32".to_string()],
    );
}

async fn wait_reloaded(gw: &GatewayHandle, before: usize) {
    wait_until_async(
        "the gateway to log the reload",
        Duration::from_secs(20),
        || async { gw.log().matches("config reloaded").count() > before },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_max_tracked_and_the_access_log_and_names_what_needs_a_restart() {
    let s = Stack::start().await;
    let mut gw = s
        .gateway(|c| {
            trust_the_harness(c);
            set(c, "limits", "max_tracked", 1_000_000);
        })
        .await;

    // 3000 clients are tracked under the generous cap.
    from_many_clients(&gw, 0, 3000).await;
    wait_until_async("3000 tracked clients", Duration::from_secs(20), || async {
        tracked_ips(&gw).await >= 3000
    })
    .await;
    // The log writer's thread writes the last lines a moment after their answers.
    wait_until_async("3000 access lines", Duration::from_secs(10), || async {
        access_lines(&gw) >= 3000
    })
    .await;

    // The smallest cap (1024: 16 per shard), no access log, a longer reserve deadline.
    let reloads = gw.log().matches("config reloaded").count();
    gw.reload(|c| {
        set(c, "limits", "max_tracked", 1024);
        set(c, "server", "access_log", false);
        set(c, "upstreams", "reserve_deadline_ms", 1500);
    });
    wait_reloaded(&gw, reloads).await;
    let log = gw.log();
    assert!(
        log.contains("`upstreams.reserve_deadline_ms` changed but needs a restart"),
        "{log}"
    );
    for live in ["limits.max_tracked", "server.access_log"] {
        assert!(!log.contains(&format!("`{live}` changed")), "{live}: {log}");
    }

    // New clients now push the old ones out: at most 1024 stay tracked.
    let access_before = access_lines(&gw);
    from_many_clients(&gw, 10_000, 3000).await;
    wait_until_async(
        "at most 1024 tracked clients",
        Duration::from_secs(20),
        || async { tracked_ips(&gw).await <= 1024 },
    )
    .await;
    assert_eq!(
        access_lines(&gw),
        access_before,
        "access lines were written after access_log = false"
    );
    assert!(gw.child.is_running());
}

/// Access lines are written by the log writer's thread, in batches. A clean stop writes
/// every line still queued before the process exits, down to the gateway's last line,
/// logged after pingora's services stopped (pingora's `run_forever` ends the process
/// itself, so neither that line nor anything queued after it would be written), and the
/// log file holds no colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_writes_every_access_line_still_queued() {
    let s = Stack::start().await;
    let mut gw = s.gateway(trust_the_harness).await;
    let before = access_lines(&gw);
    from_many_clients(&gw, 0, 2000).await;
    // SIGTERM at once: the last requests' lines may still be queued.
    gw.child.terminate(Duration::from_secs(20));
    assert!(!gw.child.is_running());
    let log = gw.log();
    let written = access_lines_in(&log) - before;
    assert_eq!(written, 2000, "access lines written before the exit");
    assert!(
        log.trim_end().ends_with("gateway stopped"),
        "the last line of a clean stop: {}",
        log.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    assert!(
        !log.contains('\x1b'),
        "colour codes in the gateway's log file"
    );
}
